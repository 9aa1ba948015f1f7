/*
 * decode_loop.h - what the SIMD decode kernels of every ISA share: the
 * per-item fold info their chunk steps read, the NHD key order and the
 * spread prefetch of the chunk ahead, the chunk-step tables each ISA's
 * format instantiations export, and the ISA descriptor through which the
 * one item loop (decode_loop.c) runs them. Included by decode_loop.c and by
 * each ISA's vector header (decode_avx2.h, decode_avx512.h).
 */
#ifndef KVA_DECODE_LOOP_H
#define KVA_DECODE_LOOP_H

#include "cpu_attn.h"
#include "cpu_fold.h"

#include <stddef.h>
#include <stdint.h>
#include <xmmintrin.h>

#define AI static inline __attribute__((always_inline))

/* What the chunk steps need besides the rows, set per item (item_open in
 * decode_loop.c) and per chunk (load_chunk). */
typedef struct fold_info {
    int kf, vf;                   /* row formats of K and V (FMT_*, cpu_fold.h) */
    const float *koff;            /* [D] key offsets of the item's kv head (FMT_I8 keys) */
    const float *voff;            /* [Dv] value offsets (FMT_I8 values) */
    float tok[KVA_CPU_KEY_CHUNK]; /* per-token key scales of the chunk (FMT_I8T) */
    /* The chunk PF_DIST ahead, prefetched key by key inside the loops of the
     * current chunk (pf_key_k / pf_key_v); NULL once done. */
    const kva__cpu_chunk_rows *pf;
    int32_t pf_n;
    size_t pf_kbytes, pf_vbytes;
    size_t kesz; /* bytes of a K element as stored (key_at's L1 prefetch) */
    int kq;      /* int8 keys scored by VNNI dot products against s->qi */
    /* int8 values (FMT_I8, FMT_I8S; Dv % 16 == 0) multiplied by VNNI dot
     * products with P as 24-bit integers (decode_avx512_pv_i8.inc), set
     * where kq is */
    int vq;
    /* Key order of the loops (key_at): 1 where a kv head's rows are strided
     * inside a block (NHD cache with Hkv > 1, rows read in place). */
    int ko;
} fold_info;

/*
 * The key the loops visit at step i of keys [ta, te): i itself, or where ko
 * is set, the keys of each group of 4 (aligned, inside [ta, te)) in the order
 * 0, 2, 1, 3, with the row two steps ahead prefetched into L1 (pf_l1). In an
 * NHD cache a kv head's rows are Hkv * D elements apart; read in order, the
 * core's stride prefetcher locks on that stride and (the explanation that
 * fits the measurements; the VM has no counters to show it) at the end of
 * each block (16 rows at B 16) goes on fetching at that stride, lines of
 * other blocks that nobody reads: DRAM traffic and miss buffers spent for
 * nothing. No two consecutive steps of 0, 2, 1, 3, 4, 6, 5, 7 have the same
 * stride, so the prefetcher does not lock on; the L1 prefetch of the row two
 * steps ahead (from L2, where pf_key_k/v put it) does what it did for the
 * current chunk. Measured: bench/results/2026-11-22_performance-journal.md ("NHD key order").
 */
AI int32_t key_at(int32_t i, int ko, int32_t ta, int32_t te)
{
    const int32_t g = i & ~3;
    if (!ko || g < ta || g + 4 > te)
        return i;
    return i ^ (((i ^ (i >> 1)) & 1) * 3);
}

/* L1 prefetch of `bytes` bytes from p (a row of the current chunk). */
AI void pf_l1(const void *p, size_t bytes)
{
    for (size_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

/* Prefetches (into L2) the K row (pf_key_k) or the V row (pf_key_v) of key
 * `key` of the chunk fi->pf; fi NULL: nothing. The K rows are requested from
 * the scores loop and the V rows from the P.V loop of the chunk PF_DIST
 * before: spread over the compute, a few lines per key keep the misses of
 * later chunks in flight while this one computes, whereas a burst of a whole
 * chunk's lines fills the miss buffers and stalls the core until they drain
 * (measured: bench/results/2026-11-22_performance-journal.md). */
AI void pf_key_k(const fold_info *fi, int32_t key)
{
    if (!fi || !fi->pf || key >= fi->pf_n)
        return;
    const char *k = (const char *)fi->pf->k[key];
    for (size_t b = 0; b < fi->pf_kbytes; b += 64)
        _mm_prefetch(k + b, _MM_HINT_T2);
}

AI void pf_key_v(const fold_info *fi, int32_t key)
{
    if (!fi || !fi->pf || key >= fi->pf_n)
        return;
    const char *v = (const char *)fi->pf->v[key];
    for (size_t b = 0; b < fi->pf_vbytes; b += 64)
        _mm_prefetch(v + b, _MM_HINT_T2);
}

/* Whether row(p, bytes) holds for any of the n K rows (kbytes each) or V rows
 * (vbytes) of chunk cr: the loop of an ISA's fp8_nan (below) around its
 * vector row scan, inlined into it. */
AI int chunk_any_row(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes,
                     int (*row)(const unsigned char *p, size_t bytes))
{
    int any = 0;
    for (int32_t t = 0; t < n; t++)
        any |= row(cr->k[t], kbytes) | row(cr->v[t], vbytes);
    return any;
}

/* One chunk [c0, c1) of an item for every query row: an ISA's chunk step
 * (decode_<isa>_step.inc) with the item's row formats (and head sizes, key
 * order) constant. */
typedef void (*kva__cpu_step_fn)(const kva__cpu_run *run, const kva__work_item *it,
                                 kva__cpu_scratch *s, const kva__cpu_item_geom *g, int32_t c0,
                                 int32_t c1, fold_info *fi);

/* The chunk steps of one (K, V) format pair: d[i][ko] for D = Dv = 64, 128,
 * 256 (i = 0, 1, 2) and key order ko (key_at), any for every other shape;
 * NULL where an ISA has no such copy (the loop then takes any, or where any
 * is NULL too, the table does not serve the shape). */
typedef struct kva__cpu_steps {
    kva__cpu_step_fn d[3][2];
    kva__cpu_step_fn any;
} kva__cpu_steps;

/* What the item loop needs of an ISA: its step tables and the few vector
 * helpers outside the chunk steps. */
typedef struct kva__cpu_decode_isa {
    const kva__cpu_steps *const *pairs; /* [PAIR_COUNT] (cpu_fold.h) */
    const kva__cpu_steps *bf16dot;      /* vdpbf16ps steps for bf16 q and K, or NULL */
    int key_order;                      /* the NHD key order (key_at) is in the steps */
    /* The query digits of the VNNI int8 key scores (run where the CPU has
     * AVX512_VNNI), kva__cpu_kq_prepare_avx512's contract (cpu_attn.h); NULL:
     * the level scores int8 keys in fp32. */
    int (*kq_prepare)(const float *q, int32_t M, int32_t D, const float *koff, int8_t *qi,
                      float *qk, int32_t *qc);
    /* Whether the n K rows (kbytes each) or V rows (vbytes) of a chunk of an
     * fp8 cache hold a NaN code (0x7f, 0xff). */
    int (*fp8_nan)(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes);
    /* Restores the dim order of the accumulator rows [M, Dv] after P.V over
     * bf16 values (the steps' pair layout of each full vector block). */
    void (*acc_unpair)(float *acc, int32_t M, int32_t Dv);
} kva__cpu_decode_isa;

/* One work item (kva__cpu_attn_fn), or the n items of a decode group
 * (kva__cpu_group_fn), on the decode kernel of isa. */
void kva__cpu_decode_item(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                          const kva__cpu_decode_isa *isa);
void kva__cpu_decode_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                           kva__cpu_scratch *s, const kva__cpu_decode_isa *isa);

#endif /* KVA_DECODE_LOOP_H */
