/*
 * decode_avx2.c - CPU attention kernel decode_avx2: AVX2 + FMA + F16C,
 * GQA-packed online softmax for decode-shaped items.
 *
 * The 8-lane twin of v3 (attn_v3_avx512.c, which explains the scheme) for
 * x86-64 machines without AVX-512. Rows are read in place from the cache
 * (prefetched two chunks ahead, key by key from the compute loops) and
 * converted in registers (bf16: widen + shift, or in P.V the even/odd split
 * of a 32-byte load; f16: vcvtph2ps; int8: vpmovsxbd + vcvtdq2ps; fp8 e4m3
 * rebuilt as f16 bits), with the quantization scales folded out of the
 * loops as in v3 (cpu_fold.h: row formats, kva__cpu_fold_begin / _end). Scores
 * are computed keys-outer (each K row converted once, 16 dims at a time, for
 * up to 4 heads of the GQA group) as 8-lane partial dot products reduced 8
 * keys at a time by an 8x8 transpose-and-add (hsum8), the softmax update
 * runs on score vectors with a polynomial exp (exp8), and P.V keeps 4 heads
 * x 16 output dims in registers while the keys stream through. Non-finite
 * semantics are v1's (see attn_portable.c).
 *
 * What this layout gained over converting chunks to fp32 in scratch, and
 * over one head at a time, is measured in bench/results/2026-11-22_performance-journal.md.
 */
#include "cpu_attn.h"

#if defined(__x86_64__)

#include "decode_avx2.h"

/* Whether an fp8 row of `bytes` bytes (a multiple of 8) holds a NaN code
 * (0x7f, 0xff). */
static int row_has_nan_fp8(const unsigned char *src, size_t bytes)
{
    const __m256i lo7 = _mm256_set1_epi8(0x7f);
    int nan = 0;
    size_t b = 0;
    for (; b + 32 <= bytes; b += 32) {
        const __m256i x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + b)), lo7);
        nan |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(x, lo7));
    }
    for (; b < bytes; b += 8) {
        const __m128i x =
            _mm_and_si128(_mm_loadl_epi64((const __m128i *)(src + b)), _mm256_castsi256_si128(lo7));
        nan |= _mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm256_castsi256_si128(lo7))) & 0xff;
    }
    return nan != 0;
}

/* Rows of a chunk: s->kp/vp [KEY_CHUNK] point at the cache rows themselves,
 * in their storage format (converted in registers by the loops; rows n..
 * repeat row 0), fi->tok gets the chunk's per-token key scales (FMT_I8T),
 * and an fp8 chunk is scanned for NaN codes (FMT_FP8N if it holds one). */
static void load_chunk(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                       kva__cpu_scratch *s, fold_info *fi)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    const int fp8 = fi->kf >= FMT_FP8;
    int nan = 0;
    for (int32_t t = 0; t < n; t++) {
        if (fp8)
            nan |= row_has_nan_fp8(cr->k[t], (size_t)D) | row_has_nan_fp8(cr->v[t], (size_t)Dv);
        s->kp[t] = (const float *)cr->k[t];
        s->vp[t] = (const float *)cr->v[t];
    }
    for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++) {
        s->kp[t] = s->kp[0];
        s->vp[t] = s->vp[0];
    }
    if (fi->kf == FMT_I8T) {
        for (int32_t t = 0; t < n; t++)
            fi->tok[t] = *cr->ks[t];
        for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++)
            fi->tok[t] = 0.0f;
    }
    if (fp8) /* NaN codes are rare: only such a chunk pays for mapping them */
        fi->kf = fi->vf = nan ? FMT_FP8N : FMT_FP8;
}

/* Restores the dim order of the accumulator rows [M, Dv] after P.V over bf16
 * values (pv_block's pair layout of each full 16-dim block). */
static void bf16_acc_unpair(float *acc, int32_t M, int32_t Dv)
{
    for (int32_t m = 0; m < M; m++)
        for (int32_t d = 0; d + 16 <= Dv; d += 16) {
            float *a = acc + (size_t)m * Dv + d;
            const __m256 ev = _mm256_loadu_ps(a), od = _mm256_loadu_ps(a + 8);
            const __m256 lo = _mm256_unpacklo_ps(ev, od), hi = _mm256_unpackhi_ps(ev, od);
            _mm256_storeu_ps(a, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(a + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
}

/* The chunk steps of each format pair (cpu_fold.h). */
static const kva__avx2_steps *const pair_steps[PAIR_COUNT] = {
    [PAIR_F32] = &kva__avx2_steps_f32,           [PAIR_F16] = &kva__avx2_steps_f16,
    [PAIR_BF16] = &kva__avx2_steps_bf16,         [PAIR_I8] = &kva__avx2_steps_i8,
    [PAIR_I8S] = &kva__avx2_steps_i8s,           [PAIR_I8T_I8] = &kva__avx2_steps_i8t_i8,
    [PAIR_I8T_I8S] = &kva__avx2_steps_i8t_i8s,   [PAIR_I8T_F16] = &kva__avx2_steps_i8t_f16,
    [PAIR_I8T_BF16] = &kva__avx2_steps_i8t_bf16, [PAIR_FP8] = &kva__avx2_steps_fp8,
    [PAIR_FP8N] = &kva__avx2_steps_fp8n,
};

/* The item's row formats and the static key scales folded into q (cpu_fold.h). */
static void fold_begin(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                       const kva__cpu_item_geom *g, fold_info *fi)
{
    kva__cpu_fold f;
    kva__cpu_fold_begin(run, it, s->q, g->M, &f);
    fi->kf = f.kf, fi->vf = f.vf, fi->koff = f.koff, fi->voff = f.voff;
}

/* Chunks in flight per item: chunk c is computed while chunk c + PF_DIST is
 * prefetched (a ring of PF_DIST + 1 located chunks). */
enum { PF_DIST = 2 };

/* One item while it runs, alone (kva__cpu_decode_avx2) or interleaved with the
 * other members of its decode group (kva__cpu_decode_avx2_group). */
typedef struct item_run {
    const kva__work_item *it;
    kva__cpu_scratch s; /* the thread's scratch, per-item state moved for group members */
    kva__cpu_item_geom g;
    fold_info fi;
    pf_info pf;
    kva__cpu_chunk_rows rows[PF_DIST + 1];
    int32_t nchunks;
} item_run;

/* Starts item it (query tile, row formats) and prefetches its
 * first PF_DIST chunks. ir->s must be set. */
static void item_open(const kva__cpu_run *run, const kva__work_item *it, item_run *ir)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    ir->it = it;
    kva__cpu_item_begin(run, it, &ir->s, &ir->g);
    fold_begin(run, it, &ir->s, &ir->g, &ir->fi);
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t v_esz = run->cache ? run->cache->v_elem : kv_esz;
    ir->pf.rows = NULL;
    ir->pf.n = 0;
    ir->pf.kbytes = (size_t)D * kv_esz;
    ir->pf.vbytes = (size_t)Dv * v_esz;
    const int32_t C = KVA_CPU_KEY_CHUNK;
    ir->nchunks = (it->k1 - it->k0 + C - 1) / C;
    for (int32_t c = 0; c < PF_DIST && c < ir->nchunks; c++) {
        const int32_t a = it->k0 + c * C, n = it->k1 - a < C ? it->k1 - a : C;
        kva__cpu_locate_chunk(run, it->req, it->kv_head, a, n, &ir->rows[c]);
        kva__cpu_prefetch_chunk(&ir->rows[c], n, ir->pf.kbytes, ir->pf.vbytes);
    }
}

/* Computes chunk c of the item; its loops prefetch chunk c + PF_DIST. */
static void item_chunk(const kva__cpu_run *run, item_run *ir, int32_t c)
{
    const kva__work_item *it = ir->it;
    const int32_t C = KVA_CPU_KEY_CHUNK;
    const int32_t c0 = it->k0 + c * C;
    const int32_t c1 = c0 + C < it->k1 ? c0 + C : it->k1;
    if (c + PF_DIST < ir->nchunks) {
        const int32_t a = c0 + PF_DIST * C, n = it->k1 - a < C ? it->k1 - a : C;
        kva__cpu_chunk_rows *nr = &ir->rows[(c + PF_DIST) % (PF_DIST + 1)];
        kva__cpu_locate_chunk(run, it->req, it->kv_head, a, n, nr);
        ir->pf.rows = nr;
        ir->pf.n = n;
    }
    load_chunk(run, &ir->rows[c % (PF_DIST + 1)], c1 - c0, &ir->s, &ir->fi);
    /* The step of the chunk's row formats (an fp8 chunk with NaN codes reads
     * as FMT_FP8N) and the item's head size. */
    const kva__avx2_steps *t = pair_steps[kva__cpu_fmt_pair(ir->fi.kf, ir->fi.vf)];
    (run->plan->d.head_dim == 128 ? t->d128 : t->any)(run, it, &ir->s, &ir->g, c0, c1, &ir->pf,
                                                      &ir->fi);
}

/* Ends the item: value scales, normalization, the result rows. */
static void item_close(const kva__cpu_run *run, item_run *ir)
{
    if (ir->fi.vf == FMT_BF16)
        bf16_acc_unpair(ir->s.acc, ir->g.M, run->plan->d.head_dim_v);
    kva__cpu_fold_end(run, ir->it, ir->s.acc, ir->g.M, ir->fi.vf);
    kva__cpu_item_finish(run, ir->it, &ir->s, &ir->g);
}

void kva__cpu_decode_avx2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    item_run ir;
    ir.s = *s;
    item_open(run, it, &ir);
    for (int32_t c = 0; c < ir.nchunks; c++)
        item_chunk(run, &ir, c);
    item_close(run, &ir);
}

/* The n items of a decode group (cpu_attn.h, "Groups"), interleaved chunk by
 * chunk as v3's run_group: each member keeps its state in its part of the
 * group area, the result is bitwise that of the items run one by one. */
void kva__cpu_decode_avx2_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                kva__cpu_scratch *s)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    item_run ir[KVA_CPU_GROUP_MAX];
    int32_t nchunks = 0;
    for (int32_t i = 0; i < n; i++) {
        kva__cpu_scratch_member(s, i, D, Dv, &ir[i].s);
        item_open(run, &items[i], &ir[i]);
        nchunks = ir[i].nchunks > nchunks ? ir[i].nchunks : nchunks;
    }
    for (int32_t c = 0; c < nchunks; c++)
        for (int32_t i = 0; i < n; i++)
            if (c < ir[i].nchunks)
                item_chunk(run, &ir[i], c);
    for (int32_t i = 0; i < n; i++)
        item_close(run, &ir[i]);
}

#endif /* __x86_64__ */
