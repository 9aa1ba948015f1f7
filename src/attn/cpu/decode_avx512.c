/*
 * decode_avx512.c - CPU attention kernels decode_avx512 and decode_avx512bf16:
 * AVX-512
 * (F/BW/VL/DQ), GQA-packed online softmax for decode-shaped items; decode_avx512bf16
 * adds AVX512_BF16 scores for bf16 q and cache, and on CPUs with
 * AVX512_VNNI int8 dot-product scores for int8 keys.
 *
 * Same work item and semantics as v1 (attn_portable.c); what changes:
 *   - The loops read the K and V rows in place, in their storage format
 *     (f32/f16/bf16, and the int8/fp8 rows of a quantized cache: 1 byte per
 *     element); load_chunk only points s->kp/vp at them (fp8 rows are
 *     scanned for NaN codes there) and converts any other storage dtype to
 *     fp32 through kva__cpu_load_row. The rows of the chunk two ahead are
 *     prefetched into L2 key by key from the compute loops (K rows from the
 *     scores loop, V rows from the P.V loop): spread like this the misses
 *     stay in flight while the chunk computes. (An earlier version copied
 *     each chunk into scratch after prefetching it in one burst: the burst
 *     filled the miss buffers and stalled the core, the copy cost about 40
 *     cycles per key in L2. In place + spread: 1 thread, bf16, H=32 Hkv=8,
 *     8 x 4096 keys, 17.2 -> 12 ms.)
 *   - Quantized rows are converted in registers like f16/bf16 (ld16: int8
 *     vpmovsxbd + vcvtdq2ps; fp8 e4m3 rebuilt as f16 bits + vcvtph2ps) and
 *     the scales are folded out of the inner loops: per-channel key scales
 *     into the query tile once per item (score = sum_d (q_d s_d)(k_d - o_d),
 *     one vsubps per vector, none for symmetric int8), per-token key scales
 *     as one multiply per score, per-channel value scales into the
 *     accumulators once at the end of the item (acc += p (v - o), then
 *     acc *= s: P.V, the partials and their merge are linear in V).
 *   - Scores: keys are the outer loop; each K row is converted once into
 *     registers (ld16: bf16 widen + shift, f16 vcvtph2ps) and serves up to 4
 *     heads, whose q stays in registers (64-dim parts of the head for up to
 *     4 heads; at D = 128 one pass with q of 2 heads in registers and of 2
 *     as FMA memory operands, scores_nb_d128: 1 thread, f16, 2048 keys in
 *     L3, ~20% less time per key at GQA 1, ~5% at GQA 4); the per-(head,
 *     key) 16-lane partial sums are reduced 16 keys at a time by one 16x16
 *     transpose-and-add (hsum16).
 *   - Variant 4, bf16 q and cache: vdpbf16ps multiplies bf16 pairs exactly
 *     and adds in fp32 (half the instructions, no conversion of K); the
 *     softmax scale multiplies the scores instead of q, which stays in
 *     registers as bf16 for the chunk.
 *   - The softmax update runs on vectors of 16 scores: lanes outside the
 *     row's visible keys are -inf, exp16 (degree-7 polynomial + vscalefps);
 *     no expf for the rescale when the running max did not change.
 *   - P.V is register-blocked: 4 heads x 64 output dims (or 8 heads x 32) in
 *     16 zmm accumulators while the V rows stream through, converted in
 *     registers once per head block; bf16 rows without a shuffle (even and
 *     odd dims of one 64-byte load, accumulators un-paired once per item).
 *   - Loops specialized for D = Dv = 64, 128, 256 and each row format;
 *     other shapes take a runtime-D copy.
 *   - Variant 4 over int8 keys (INT8_CHANNEL, INT8_TOKEN_K, symmetric or
 *     not) on a CPU with AVX512_VNNI: q' held as a 23-bit integer in 3
 *     signed byte digits, 16 keys transposed by dwords into lanes, vpdpbusd
 *     against the codes biased to unsigned bytes (scores_rows_i8dot in
 *     decode_avx512_step.inc: no conversion of K, no 16x16 reductions; exact up to
 *     q's 2^-23 rounding and a few fp32 roundings).
 *   - Over an NHD cache with Hkv > 1 (a kv head's rows Hkv * D elements
 *     apart) the loops visit each group of 4 keys as 0, 2, 1, 3 and
 *     prefetch the row two steps ahead into L1 (key_at in decode_avx512.h):
 *     read in order, the constant stride makes the core's stride prefetcher
 *     run past each block's end into other blocks' lines. Separate step
 *     functions (*_ko), so the loops of the other layouts stay as they were
 *     (measured in bench/results/2026-11-22_performance-journal.md, "NHD key order").
 *   - Decode groups (cpu_attn.h, "Groups"): the items of one request and key
 *     range over several kv heads run interleaved chunk by chunk
 *     (run_group), so that a block's rows of all those kv heads are read
 *     together; each item keeps its state in its own part of the scratch.
 *
 * Non-finite semantics are v1's: NaN scores do not enter the max and make
 * the row's sum NaN; an all -inf chunk leaves a row untouched (it takes no
 * part in the chunk's P.V, so 0 * inf in V cannot reach it); p = 0 keys
 * inside the visible range are accumulated like v1 does.
 *
 * Measured: bench/results/2026-11-22_performance-journal.md
 * ("CPU decode loops rework"). In L2, 1
 * thread, GQA 4, D = 128 bf16 (v4), a key and kv head cost about 125 cycles
 * before the rework and about 90 after it (scores ~28, softmax ~10, P.V ~41
 * against 16 vdpbf16ps + 32 FMAs = 48 cycles of FMA-port work); from DRAM
 * the misses left after prefetching still add about 40 cycles.
 * Tried and dropped (A/B, 1 thread, bf16, 8 x 4096 keys, alternating
 * rounds): prefetch distance 1, 3, 4, 8, 16 chunks instead of 2 (equal or
 * slower: 16 chunks 27 vs 19 ms at GQA 1); prefetcht0 / prefetchnta instead
 * of prefetcht2 (2x slower: L1 prefetches of DRAM lines hold the L1 miss
 * buffers); prefetcht1 (same as t2); no software prefetch (2.2x slower).
 */
#include "cpu_attn.h"

#if defined(__x86_64__)

#include "decode_avx512.h"

#include <immintrin.h>
#include <math.h>

/* Whether an fp8 row of `bytes` bytes holds a NaN code (0x7f, 0xff). */
AI int row_has_nan_fp8(const unsigned char *src, size_t bytes)
{
    const __m512i lo7 = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (size_t b = 0; b < bytes; b += 64) {
        const __mmask64 m = bytes - b >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - b)) - 1;
        const __m512i x = _mm512_maskz_loadu_epi8(m, src + b);
        nan |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_and_si512(x, lo7), lo7);
    }
    return nan != 0;
}

/* Whether the loops read the cache rows in place, in their storage format
 * (f32, f16, bf16 and the 1-byte rows of a quantized cache); other storage
 * dtypes are converted to fp32 per chunk by load_chunk. */
AI int rows_in_place(const kva__cpu_run *run)
{
    const kva_dtype dt = run->kv_dt;
    return run->quant || dt == KVA_DTYPE_F32 || dt == KVA_DTYPE_F16 || dt == KVA_DTYPE_BF16;
}

/* Rows of a chunk for the loops below: s->kp/vp [KEY_CHUNK] point at the
 * cache rows themselves in their storage format (f32, f16, bf16, and the
 * int8/fp8 rows of a quantized cache, with fi->tok the per-token key scales;
 * rows n.. repeat row 0); any other
 * storage dtype is converted to fp32 with kva__cpu_load_row. Sets fi->kf/vf
 * to the formats the loops read. */
static void load_chunk(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                       kva__cpu_scratch *s, fold_info *fi)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    const kva_dtype dt = run->kv_dt;
    const int direct = rows_in_place(run);
    const int fp8 = run->quant && dt == KVA_DTYPE_FP8_E4M3;
    int nan = 0;
    for (int32_t t = 0; t < n; t++) {
        if (direct) {
            /* Read in place: the rows were prefetched into L2 while the
             * chunk PF_DIST before this one computed (pf_key_k/v); fp8 rows
             * are only scanned for NaN codes. */
            if (fp8)
                nan |= row_has_nan_fp8(cr->k[t], (size_t)D) | row_has_nan_fp8(cr->v[t], (size_t)Dv);
            s->kp[t] = (const float *)cr->k[t];
            s->vp[t] = (const float *)cr->v[t];
        } else {
            float *kd = s->kbuf + (size_t)t * D, *vd = s->vbuf + (size_t)t * Dv;
            kva__cpu_load_row(kd, cr->k[t], dt, D);
            kva__cpu_load_row(vd, cr->v[t], dt, Dv);
            s->kp[t] = kd;
            s->vp[t] = vd;
        }
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
    if (!direct)
        fi->kf = fi->vf = FMT_F32;
}

/* Restores the dim order of the M accumulator rows [M, Dv] after P.V over
 * bf16 values (pv_block's pair layout: each full 32-dim block stored as
 * [even dims, odd dims]). */
static void bf16_acc_unpair(float *acc, int32_t M, int32_t Dv)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int32_t m = 0; m < M; m++)
        for (int32_t d = 0; d + 32 <= Dv; d += 32) {
            float *a = acc + (size_t)m * Dv + d;
            const __m512 ev = _mm512_loadu_ps(a), od = _mm512_loadu_ps(a + 16);
            _mm512_storeu_ps(a, _mm512_permutex2var_ps(ev, lo, od));
            _mm512_storeu_ps(a + 16, _mm512_permutex2var_ps(ev, hi, od));
        }
}

/* The item's row formats and the static key scales folded into q (cpu_fold.h). */
static void fold_begin(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                       const kva__cpu_item_geom *g, fold_info *fi)
{
    kva__cpu_fold f;
    kva__cpu_fold_begin(run, it, s->q, g->M, &f);
    fi->kf = f.kf, fi->vf = f.vf, fi->koff = f.koff, fi->voff = f.voff;
    fi->kq = 0;
}

/*
 * The query rows of an item over int8 keys for the VNNI scores
 * (scores_rows_i8dot in decode_avx512_step.inc): row m of s->q [M, D] (scales
 * folded) becomes qn = rint(q' / step), step = max_d |q'_d| / 2^22, as 3
 * signed base-256 digits in s->qi [M, 3, D], with s->qk [M, 2] = {step,
 * sum_d qn_d o_d (FMT_I8 keys' offsets)} and s->qc [M, 4] = 128 x each
 * digit's sum. Returns 0 (fp32 scores) when a row holds a non-finite value.
 */
static int kq_prepare(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t M, const fold_info *fi)
{
    const int32_t D = run->plan->d.head_dim;
    for (int32_t m = 0; m < M; m++) {
        const float *q = s->q + (size_t)m * D;
        float amax = 0.0f;
        for (int32_t d = 0; d < D; d++)
            amax = fabsf(q[d]) > amax || q[d] != q[d] ? fabsf(q[d]) : amax;
        if (!(amax <= 3.4e38f)) /* inf or NaN: the fp32 path keeps their semantics */
            return 0;
    }
    for (int32_t m = 0; m < M; m++) {
        const float *q = s->q + (size_t)m * D;
        int8_t *qi = s->qi + (size_t)m * 3 * D;
        float amax = 0.0f;
        for (int32_t d = 0; d < D; d++)
            amax = fabsf(q[d]) > amax || q[d] != q[d] ? fabsf(q[d]) : amax;
        /* In double: 2^22 / amax overflows float for subnormal rows. */
        const float step = amax * 0x1p-22f;
        const double inv = amax > 0.0f ? 0x1p22 / amax : 0.0;
        int32_t sum[3] = {0, 0, 0};
        double off = 0.0;
        for (int32_t d = 0; d < D; d++) {
            int32_t n = (int32_t)lrint(q[d] * inv);
            n = n > (1 << 22) ? 1 << 22 : n < -(1 << 22) ? -(1 << 22) : n;
            const int32_t c = ((n + 128) & 255) - 128, n1 = (n - c) / 256;
            const int32_t b = ((n1 + 128) & 255) - 128, a = (n1 - b) / 256;
            qi[d] = (int8_t)a;
            qi[D + d] = (int8_t)b;
            qi[2 * D + d] = (int8_t)c;
            sum[0] += a, sum[1] += b, sum[2] += c;
            if (fi->kf == FMT_I8)
                off += (double)n * fi->koff[d];
        }
        s->qk[2 * m] = step;
        s->qk[2 * m + 1] = (float)off;
        for (int p = 0; p < 3; p++)
            s->qc[4 * m + p] = 128 * sum[p];
        s->qc[4 * m + 3] = 0;
    }
    return 1;
}

/* Chunks in flight per item: chunk c is computed while chunk c + PF_DIST is
 * prefetched (a ring of PF_DIST + 1 located chunks). */
enum { PF_DIST = 2 };

/* One item while it runs, alone (run_item) or interleaved with the other
 * members of its decode group (run_group). */
typedef struct item_run {
    const kva__work_item *it;
    kva__cpu_scratch s; /* the thread's scratch, per-item state moved for group members */
    kva__cpu_item_geom g;
    fold_info fi;
    int slot; /* the step tables' D = Dv column (0, 1, 2 for 64, 128, 256), or -1: any */
    const kva__avx512_steps *dot; /* the vdpbf16ps steps (decode_avx512bf16: bf16 q, K), or NULL */
    kva__cpu_chunk_rows rows[PF_DIST + 1];
    int32_t nchunks;
} item_run;

/* The chunk steps of each format pair (cpu_fold.h), one file each. */
static const kva__avx512_steps *const pair_steps[PAIR_COUNT] = {
    [PAIR_F32] = &kva__avx512_steps_f32,           [PAIR_F16] = &kva__avx512_steps_f16,
    [PAIR_BF16] = &kva__avx512_steps_bf16,         [PAIR_I8] = &kva__avx512_steps_i8,
    [PAIR_I8S] = &kva__avx512_steps_i8s,           [PAIR_I8T_I8] = &kva__avx512_steps_i8t_i8,
    [PAIR_I8T_I8S] = &kva__avx512_steps_i8t_i8s,   [PAIR_I8T_F16] = &kva__avx512_steps_i8t_f16,
    [PAIR_I8T_BF16] = &kva__avx512_steps_i8t_bf16, [PAIR_FP8] = &kva__avx512_steps_fp8,
    [PAIR_FP8N] = &kva__avx512_steps_fp8n,
};

/* The step for the item's current chunk: its row formats as load_chunk left
 * them (fp8 chunks with NaN codes, rows converted to fp32), the item's head
 * size column and key order. */
static kva__avx512_step_fn step_of(const item_run *ir)
{
    const kva__avx512_steps *t =
        ir->dot ? ir->dot : pair_steps[kva__cpu_fmt_pair(ir->fi.kf, ir->fi.vf)];
    return ir->slot >= 0 ? t->d[ir->slot][ir->fi.ko] : t->any;
}

/* Starts item it: query tile, row formats, the step table column for its
 * shapes (bf16dot asks for the vdpbf16ps scores where q and K are bf16:
 * decode_avx512bf16), and the prefetch of its first PF_DIST chunks. ir->s must be
 * set. */
static void item_open(const kva__cpu_run *run, const kva__work_item *it, int bf16dot, item_run *ir)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    ir->it = it;
    kva__cpu_item_begin(run, it, &ir->s, &ir->g);
    fold_begin(run, it, &ir->s, &ir->g, &ir->fi);
    const int kf = ir->fi.kf;
    if (bf16dot && run->vnni && D % 4 == 0 && (kf == FMT_I8 || kf == FMT_I8S || kf == FMT_I8T))
        ir->fi.kq = kq_prepare(run, &ir->s, ir->g.M, &ir->fi);
    /* Strided rows (NHD, Hkv > 1) read in place: key_at's order. */
    const int direct = rows_in_place(run);
    ir->fi.ko = run->cache && run->cache->desc.layout == KVA_LAYOUT_NHD &&
                run->cache->desc.num_kv_heads > 1 && direct;
    ir->slot = D != Dv ? -1 : D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1;
    ir->dot = NULL;
#if defined(__AVX512BF16__)
    if (bf16dot && run->dt == KVA_DTYPE_BF16 && run->kv_dt == KVA_DTYPE_BF16 && ir->slot >= 0)
        ir->dot = &kva__avx512_steps_bf16dot;
#else
    (void)bf16dot;
#endif
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t v_esz = run->cache ? run->cache->v_elem : kv_esz;
    const int32_t C = KVA_CPU_KEY_CHUNK;
    ir->nchunks = (it->k1 - it->k0 + C - 1) / C;
    ir->fi.pf = NULL;
    ir->fi.pf_kbytes = (size_t)D * kv_esz;
    ir->fi.pf_vbytes = (size_t)Dv * v_esz;
    ir->fi.kesz = kv_esz;
    for (int32_t c = 0; c < PF_DIST && c < ir->nchunks; c++) {
        const int32_t a = it->k0 + c * C, n = it->k1 - a < C ? it->k1 - a : C;
        kva__cpu_locate_chunk(run, it->req, it->kv_head, a, n, &ir->rows[c]);
        kva__cpu_prefetch_chunk(&ir->rows[c], n, ir->fi.pf_kbytes, ir->fi.pf_vbytes);
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
        ir->fi.pf = nr; /* prefetched by the scores loop of this chunk */
        ir->fi.pf_n = n;
    }
    load_chunk(run, &ir->rows[c % (PF_DIST + 1)], c1 - c0, &ir->s, &ir->fi);
    step_of(ir)(run, it, &ir->s, &ir->g, c0, c1, &ir->fi);
}

/* Ends the item: value scales, normalization, the result rows. */
static void item_close(const kva__cpu_run *run, item_run *ir)
{
    if (ir->fi.vf == FMT_BF16)
        bf16_acc_unpair(ir->s.acc, ir->g.M, run->plan->d.head_dim_v);
    kva__cpu_fold_end(run, ir->it, ir->s.acc, ir->g.M, ir->fi.vf);
    kva__cpu_item_finish(run, ir->it, &ir->s, &ir->g);
}

static void run_item(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                     int bf16dot)
{
    item_run ir;
    ir.s = *s;
    item_open(run, it, bf16dot, &ir);
    for (int32_t c = 0; c < ir.nchunks; c++)
        item_chunk(run, &ir, c);
    item_close(run, &ir);
}

/*
 * The n items of a decode group (cpu_attn.h, "Groups": one request and key
 * range, different kv heads), interleaved chunk by chunk: chunk c of every
 * member, then chunk c + 1. The members' rows of a block are then read
 * together (NHD: the kv heads of a token are adjacent), which the hardware
 * prefetchers follow, and each member's own prefetches run as before. Each
 * member keeps its state in its part of the group area; the result is
 * bitwise the same as running the items one after the other.
 */
static void run_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                      kva__cpu_scratch *s, int bf16dot)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    item_run ir[KVA_CPU_GROUP_MAX];
    int32_t nchunks = 0;
    for (int32_t i = 0; i < n; i++) {
        kva__cpu_scratch_member(s, i, D, Dv, &ir[i].s);
        item_open(run, &items[i], bf16dot, &ir[i]);
        nchunks = ir[i].nchunks > nchunks ? ir[i].nchunks : nchunks;
    }
    for (int32_t c = 0; c < nchunks; c++)
        for (int32_t i = 0; i < n; i++)
            if (c < ir[i].nchunks)
                item_chunk(run, &ir[i], c);
    for (int32_t i = 0; i < n; i++)
        item_close(run, &ir[i]);
}

void kva__cpu_decode_avx512(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    run_item(run, it, s, 0);
}

/* Variant 4: v3 with vdpbf16ps scores for bf16 q and cache (D = Dv = 64, 128
 * or 256); without a compiler that knows AVX512_BF16 it is v3. */
void kva__cpu_decode_avx512bf16(const kva__cpu_run *run, const kva__work_item *it,
                                kva__cpu_scratch *s)
{
    run_item(run, it, s, 1);
}

void kva__cpu_decode_avx512_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                  kva__cpu_scratch *s)
{
    run_group(run, items, n, s, 0);
}

void kva__cpu_decode_avx512bf16_group(const kva__cpu_run *run, const kva__work_item *items,
                                      int32_t n, kva__cpu_scratch *s)
{
    run_group(run, items, n, s, 1);
}

#endif /* __x86_64__ */
