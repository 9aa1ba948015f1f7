/*
 * attn_v3_avx512.c - CPU attention kernels, variants 3 and 4: AVX-512
 * (F/BW/VL/DQ), GQA-packed online softmax for decode-shaped items; variant 4
 * adds AVX512_BF16 scores for bf16 q and cache, and on CPUs with
 * AVX512_VNNI int8 dot-product scores for int8 keys.
 *
 * Same work item and semantics as v1 (attn_v1.c); what changes:
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
 *     attn_v3_avx512.h: no conversion of K, no 16x16 reductions; exact up to
 *     q's 2^-23 rounding and a few fp32 roundings). 1 thread, 4 x 16384 keys,
 *     f16 q, int8 cache (docs/performance.md, alternating rounds on the
 *     loaded VM): GQA 1 16.5 -> 14.5 ms, GQA 8 70.6 -> 53.7 ms against v3.
 *   - Over an NHD cache with Hkv > 1 (a kv head's rows Hkv * D elements
 *     apart) the loops visit each group of 4 keys as 0, 2, 1, 3 and
 *     prefetch the row two steps ahead into L1 (key_at in attn_v3_avx512.h):
 *     read in order, the constant stride makes the core's stride prefetcher
 *     run past each block's end into other blocks' lines. Separate step
 *     functions (*_ko), so the loops of the other layouts stay as they were.
 *     2 threads, f16, 4 x 16384 keys, B 16: GQA 1 11.45 -> 9.42 ms, GQA 4
 *     12.55 -> 11.51 ms (docs/performance.md, "NHD key order").
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
 * Measured: docs/performance.md ("CPU decode loops rework"). In L2, 1
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

#include "attn_v3_avx512.h"

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

/* Soft-cap and ALiBi of one row's scores (rare features: plain loops). */
static void score_mods(const kva_plan *plan, float *sc, int32_t h, int32_t c0, int32_t pos)
{
    if (plan->d.softcap > 0.0f) {
        const float cap = plan->d.softcap, inv_cap = 1.0f / cap;
        for (int32_t t = 0; t < KVA_CPU_KEY_CHUNK; t++)
            sc[t] = cap * tanhf(sc[t] * inv_cap);
    }
    if (plan->alibi_slopes) {
        const float slope = plan->alibi_slopes[h];
        for (int32_t t = 0; t < KVA_CPU_KEY_CHUNK; t++)
            sc[t] += slope * (float)(c0 + t - pos);
    }
}

/*
 * Online-softmax update of the nh rows m0 .. m0+nh-1 (one query row: heads
 * h0.., position pos) whose chunk scores are in s->pm, over the chunk's keys
 * [a, e) (chunk start c0). Leaves the probabilities in s->pm, the accumulator
 * rescale in s->alpha[m] and whether the row takes part in the chunk's P.V
 * in s->live[m].
 */
AI void softmax_rows(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m0, int32_t nh,
                     int32_t h0, int32_t pos, int32_t c0, int32_t a, int32_t e)
{
    const kva_plan *plan = run->plan;
    const int mods = plan->d.softcap > 0.0f || plan->alibi_slopes;
    /* Lanes of keys [a, e) of the chunk. */
    const uint32_t hi_bits = e - c0 >= 32 ? 0xffffffffu : (1u << (e - c0)) - 1u;
    const uint32_t vis = hi_bits & ~((1u << (a - c0)) - 1u);
    const __mmask16 vis0 = (__mmask16)vis, vis1 = (__mmask16)(vis >> 16);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int32_t hh = 0; hh < nh; hh++) {
        const int32_t m = m0 + hh;
        float *pm = s->pm + (size_t)m * KVA_CPU_KEY_CHUNK;
        if (mods)
            score_mods(plan, pm, h0 + hh, c0, pos);
        __m512 sc[2];
        sc[0] = _mm512_mask_loadu_ps(ninf, vis0, pm);
        sc[1] = _mm512_mask_loadu_ps(ninf, vis1, pm + 16);
        /* max(x, acc) returns acc when x is NaN: NaN scores stay out of the max. */
        const __m512 vm = _mm512_max_ps(sc[1], _mm512_max_ps(sc[0], ninf));
        const float cmax = _mm512_reduce_max_ps(vm);
        const float mold = s->mx[m];
        float mnew = kva__cpu_max_nan(mold, cmax);
        if (mnew == -INFINITY) {
            /* Every score so far is -inf (nothing to add) or NaN (row becomes NaN). */
            const int nan = _mm512_cmp_ps_mask(sc[0], sc[0], _CMP_UNORD_Q) |
                            _mm512_cmp_ps_mask(sc[1], sc[1], _CMP_UNORD_Q);
            if (!nan) {
                s->live[m] = 0;
                continue;
            }
            mnew = NAN;
        }
        const __m512 mv = _mm512_set1_ps(mnew);
        const __m512 p0 = exp16(_mm512_sub_ps(sc[0], mv));
        const __m512 p1 = exp16(_mm512_sub_ps(sc[1], mv));
        _mm512_storeu_ps(pm, p0);
        _mm512_storeu_ps(pm + 16, p1);
        /* The max rarely changes once a few chunks are in: no expf then. */
        const float alpha = mold == mnew ? 1.0f : mold == -INFINITY ? 0.0f : expf(mold - mnew);
        s->mx[m] = mnew;
        s->sum[m] = s->sum[m] * alpha + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
        s->alpha[m] = alpha;
        s->live[m] = 1;
    }
}

/*
 * acc[m] = acc[m] * alpha[m] + sum over keys t in [ta, te) of pm[m][t] v[t],
 * for the NB rows m0.. (NB a constant: the accumulators stay in registers),
 * over output dims [d0, d0 + 16 * NV) (NV zmm per row, the last one masked
 * by tail). V rows are read in their format kd and converted in registers,
 * once for the NB heads. Rows that are not live keep their accumulators.
 *
 * bf16 rows in full blocks of 32 dims (pair = 1) are converted without a
 * shuffle: one 64-byte load holds 32 values, the even dims are the words
 * shifted up by 16, the odd dims the words masked to their upper half. The
 * accumulators then hold each 32-dim block as [16 even dims, 16 odd dims]
 * (bf16_acc_unpair restores the order once per item).
 */
AI void pv_block(kva__cpu_scratch *s, int32_t m0, int32_t ta, int32_t te, int32_t d0,
                 const int32_t Dv, const int kd, const float *voff, const int NB, const int NV,
                 __mmask16 tail, const fold_info *pf, int ko)
{
    /* Bytes of a V row's dims [d0, d0 + 16 NV) in format kd (key_at's L1 prefetch). */
    const size_t esz = kd == FMT_F32 ? 4 : kd == FMT_F16 || kd == FMT_BF16 ? 2 : 1;
    const size_t l1_off = (size_t)d0 * esz, l1_bytes = (size_t)16 * NV * esz;
    const int pair = kd == FMT_BF16 && NV % 2 == 0 && tail == 0xffff;
    __m512 acc[8][8], vo[8];
    /* FMT_I8 values: acc += p (v - o); run_item multiplies acc by s at the end. */
    for (int j = 0; j < NV; j++)
        vo[j] = kd == FMT_I8
                    ? _mm512_maskz_loadu_ps(j == NV - 1 ? tail : 0xffff, voff + d0 + 16 * j)
                    : _mm512_setzero_ps();
    const float *const *vp = s->vp;
    for (int b = 0; b < NB; b++) {
        const float *ar = s->acc + (size_t)(m0 + b) * Dv + d0;
        const __m512 al = _mm512_set1_ps(s->alpha[m0 + b]);
        for (int j = 0; j < NV; j++)
            acc[b][j] =
                _mm512_mul_ps(_mm512_maskz_loadu_ps(j == NV - 1 ? tail : 0xffff, ar + 16 * j), al);
    }
    const float *pm = s->pm + (size_t)m0 * KVA_CPU_KEY_CHUNK;
    for (int32_t i = ta; i < te; i++) {
        const int32_t t = key_at(i, ko, ta, te);
        pf_key_v(pf, i);
        if (ko && i + 2 < te)
            pf_l1((const char *)vp[key_at(i + 2, 1, ta, te)] + l1_off, l1_bytes);
        __m512 v[8];
        if (pair) {
            const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
            for (int j = 0; j < NV; j += 2) {
                const __m512i w = _mm512_loadu_si512((const uint16_t *)vp[t] + d0 + 16 * j);
                v[j] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                v[j + 1] = _mm512_castsi512_ps(_mm512_and_si512(w, hi));
            }
        } else {
            for (int j = 0; j < NV; j++)
                v[j] = ld16(vp[t], d0 + 16 * j, kd, j == NV - 1 ? tail : 0xffff);
        }
        if (kd == FMT_I8)
            for (int j = 0; j < NV; j++)
                v[j] = _mm512_sub_ps(v[j], vo[j]);
        for (int b = 0; b < NB; b++) {
            const __m512 p = _mm512_set1_ps(pm[(size_t)b * KVA_CPU_KEY_CHUNK + t]);
            for (int j = 0; j < NV; j++)
                acc[b][j] = _mm512_fmadd_ps(p, v[j], acc[b][j]);
        }
    }
    for (int b = 0; b < NB; b++) {
        if (!s->live[m0 + b])
            continue;
        float *ar = s->acc + (size_t)(m0 + b) * Dv + d0;
        for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(ar + 16 * j, j == NV - 1 ? tail : 0xffff, acc[b][j]);
    }
}

/* P.V of NB rows over all output dims: blocks of 128 dims for one row (8
 * accumulators, one pass over the keys; for 2 rows 16 accumulators measured
 * 5-15% slower than 2 blocks of 64), 64 while NB <= 4
 * (16 accumulators: each broadcast of p serves 4 vectors), 32 otherwise,
 * then 16, then 8. Every output dim sums the same terms in the same order
 * whatever the blocking. */
AI void pv_rows(kva__cpu_scratch *s, int32_t m0, int32_t ta, int32_t te, const int32_t Dv,
                const int kd, const float *voff, const int NB, const fold_info *pf, int ko)
{
    int32_t d = 0;
    if (NB == 1)
        for (; d + 128 <= Dv; d += 128, pf = NULL)
            pv_block(s, m0, ta, te, d, Dv, kd, voff, NB, 8, 0xffff, pf, ko);
    if (NB <= 4)
        for (; d + 64 <= Dv; d += 64, pf = NULL)
            pv_block(s, m0, ta, te, d, Dv, kd, voff, NB, 4, 0xffff, pf, ko);
    for (; d + 32 <= Dv; d += 32, pf = NULL)
        pv_block(s, m0, ta, te, d, Dv, kd, voff, NB, 2, 0xffff, pf, ko);
    if (d + 16 <= Dv) {
        pv_block(s, m0, ta, te, d, Dv, kd, voff, NB, 1, 0xffff, pf, ko);
        d += 16;
        pf = NULL;
    }
    if (d < Dv)
        pv_block(s, m0, ta, te, d, Dv, kd, voff, NB, 1, 0x00ff, pf, ko);
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

/* P.V of the nh rows m0.. of one query row, keys [ta, te) of the chunk
 * (indices relative to its start), in register blocks of 8, 4, 2, 1 rows. */
AI void pv_query_row(kva__cpu_scratch *s, int32_t m0, int32_t nh, int32_t ta, int32_t te,
                     const int32_t Dv, const int kd, const float *voff, const fold_info *pf, int ko)
{
    int32_t m = m0;
    const int32_t m1 = m0 + nh;
    for (; m + 8 <= m1; m += 8, pf = NULL)
        pv_rows(s, m, ta, te, Dv, kd, voff, 8, pf, ko);
    if (m + 4 <= m1) {
        pv_rows(s, m, ta, te, Dv, kd, voff, 4, pf, ko);
        m += 4;
        pf = NULL;
    }
    if (m + 2 <= m1) {
        pv_rows(s, m, ta, te, Dv, kd, voff, 2, pf, ko);
        m += 2;
        pf = NULL;
    }
    if (m < m1)
        pv_rows(s, m, ta, te, Dv, kd, voff, 1, pf, ko);
}

/* One chunk [c0, c1) for every query row of the item. D, Dv, the row
 * formats KF, VF and the key order KO (key_at) are constants in the
 * specialized copies below. */
AI void chunk_step(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                   const kva__cpu_item_geom *g, int32_t c0, int32_t c1, const int32_t D,
                   const int32_t Dv, const int KF, const int VF, const int bf16dot, fold_info *fi,
                   const int KO)
{
    const int32_t nh = it->nh;
    for (int32_t ii = 0; ii < it->nq; ii++) {
        const int32_t a = s->lo[ii] > c0 ? s->lo[ii] : c0;
        const int32_t e = s->hi[ii] < c1 ? s->hi[ii] : c1;
        if (a >= e)
            continue;
        const int32_t pos = g->seq - g->q_len + it->i0 + ii;
#if defined(__GNUC__)
        if ((KF == FMT_I8 || KF == FMT_I8S || KF == FMT_I8T) && fi->kq)
            scores_rows_i8dot(s, ii * nh, nh, c1 - c0, D, fi);
        else
#endif
            for (int32_t hb = 0; hb < nh; hb += 8) {
                const int32_t nb = nh - hb < 8 ? nh - hb : 8;
#if defined(__AVX512BF16__)
                if (bf16dot) {
                    const int64_t row =
                        (int64_t)(g->tok0 + ii) * run->plan->d.num_heads + g->hbase + hb;
                    scores_rows_bf16(run, s, (const uint16_t *)run->q + row * D, ii * nh + hb, nb,
                                     c1 - c0, D, fi, KO);
                } else
#endif
                    scores_rows(s, ii * nh + hb, nb, c1 - c0, D, KF, fi, KO);
            }
        softmax_rows(run, s, ii * nh, nh, g->hbase, pos, c0, a, e);
        pv_query_row(s, ii * nh, nh, a - c0, e - c0, Dv, VF, fi->voff, fi->pf ? fi : NULL, KO);
        if (fi->pf) {
            /* The first query row's passes prefetched K of every key and V
             * of keys [a, e); the V rows of the others follow here. */
            for (int32_t t = 0; t < fi->pf_n; t++)
                if (t < a - c0 || t >= e - c0)
                    pf_key_v(fi, t);
            fi->pf = NULL;
        }
    }
    if (fi->pf) /* no query row saw this chunk */
        kva__cpu_prefetch_chunk(fi->pf, fi->pf_n, fi->pf_kbytes, fi->pf_vbytes);
    fi->pf = NULL;
}

typedef void (*step_fn)(const kva__cpu_run *, const kva__work_item *, kva__cpu_scratch *,
                        const kva__cpu_item_geom *, int32_t, int32_t, fold_info *);

/* chunk_step for the (K, V) format pairs that occur: float caches (K and V
 * alike) and the four quantized formats (INT8_CHANNEL, INT8_TOKEN_K,
 * INT8_TOKEN_K_V16 with f16/bf16 V, FP8_E4M3). */
#define STEP_FORMATS(DK, DV, KO)                                                                   \
    do {                                                                                           \
        const int kf_ = fi->kf, vf_ = fi->vf;                                                      \
        if (kf_ == FMT_BF16)                                                                       \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_BF16, FMT_BF16, 0, fi, KO);              \
        else if (kf_ == FMT_F16)                                                                   \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_F16, FMT_F16, 0, fi, KO);                \
        else if (kf_ == FMT_I8)                                                                    \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8, FMT_I8, 0, fi, KO);                  \
        else if (kf_ == FMT_I8S)                                                                   \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8S, FMT_I8S, 0, fi, KO);                \
        else if (kf_ == FMT_I8T && vf_ == FMT_I8)                                                  \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8T, FMT_I8, 0, fi, KO);                 \
        else if (kf_ == FMT_I8T && vf_ == FMT_I8S)                                                 \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8T, FMT_I8S, 0, fi, KO);                \
        else if (kf_ == FMT_I8T && vf_ == FMT_F16)                                                 \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8T, FMT_F16, 0, fi, KO);                \
        else if (kf_ == FMT_I8T)                                                                   \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_I8T, FMT_BF16, 0, fi, KO);               \
        else if (kf_ == FMT_FP8)                                                                   \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_FP8, FMT_FP8, 0, fi, KO);                \
        else if (kf_ == FMT_FP8N)                                                                  \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_FP8N, FMT_FP8N, 0, fi, KO);              \
        else                                                                                       \
            chunk_step(run, it, s, g, c0, c1, DK, DV, FMT_F32, FMT_F32, 0, fi, KO);                \
    } while (0)

#define STEP_D(DIM, KO, SUF)                                                                       \
    static void step_d##DIM##SUF(const kva__cpu_run *run, const kva__work_item *it,                \
                                 kva__cpu_scratch *s, const kva__cpu_item_geom *g, int32_t c0,     \
                                 int32_t c1, fold_info *fi)                                        \
    {                                                                                              \
        STEP_FORMATS(DIM, DIM, KO);                                                                \
    }
STEP_D(64, 0, )
STEP_D(128, 0, )
STEP_D(256, 0, )
STEP_D(64, 1, _ko)
STEP_D(128, 1, _ko)
STEP_D(256, 1, _ko)

#if defined(__AVX512BF16__)
/* bf16 q and bf16 K, D = Dv = DIM (a multiple of 32): scores by vdpbf16ps. */
#define STEP_BF16DOT(DIM, KO, SUF)                                                                 \
    static void step_bf16dot_d##DIM##SUF(const kva__cpu_run *run, const kva__work_item *it,        \
                                         kva__cpu_scratch *s, const kva__cpu_item_geom *g,         \
                                         int32_t c0, int32_t c1, fold_info *fi)                    \
    {                                                                                              \
        chunk_step(run, it, s, g, c0, c1, DIM, DIM, FMT_BF16, FMT_BF16, 1, fi, KO);                \
    }
STEP_BF16DOT(64, 0, )
STEP_BF16DOT(128, 0, )
STEP_BF16DOT(256, 0, )
STEP_BF16DOT(64, 1, _ko)
STEP_BF16DOT(128, 1, _ko)
STEP_BF16DOT(256, 1, _ko)
#endif

/* Any other head size (runtime D and Dv, constant row formats). */
static void step_any(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                     const kva__cpu_item_geom *g, int32_t c0, int32_t c1, fold_info *fi)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    if (fi->ko)
        STEP_FORMATS(D, Dv, 1);
    else
        STEP_FORMATS(D, Dv, 0);
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
 * (scores_rows_i8dot in attn_v3_avx512.h): row m of s->q [M, D] (scales
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
    step_fn step;
    kva__cpu_chunk_rows rows[PF_DIST + 1];
    int32_t nchunks;
} item_run;

/* Starts item it: query tile, row formats, the step function picked for its
 * shapes (bf16dot asks for the vdpbf16ps scores where q and K are bf16:
 * variant 4), and the prefetch of its first PF_DIST chunks. ir->s must be
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
    const int ko = ir->fi.ko = run->cache && run->cache->desc.layout == KVA_LAYOUT_NHD &&
                               run->cache->desc.num_kv_heads > 1 && direct;
    step_fn step = D != Dv    ? step_any
                   : D == 128 ? (ko ? step_d128_ko : step_d128)
                   : D == 64  ? (ko ? step_d64_ko : step_d64)
                   : D == 256 ? (ko ? step_d256_ko : step_d256)
                              : step_any;
#if defined(__AVX512BF16__)
    if (bf16dot && run->dt == KVA_DTYPE_BF16 && run->kv_dt == KVA_DTYPE_BF16 && D == Dv)
        step = D == 128   ? (ko ? step_bf16dot_d128_ko : step_bf16dot_d128)
               : D == 64  ? (ko ? step_bf16dot_d64_ko : step_bf16dot_d64)
               : D == 256 ? (ko ? step_bf16dot_d256_ko : step_bf16dot_d256)
                          : step;
#else
    (void)bf16dot;
#endif
    ir->step = step;
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
    ir->step(run, it, &ir->s, &ir->g, c0, c1, &ir->fi);
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

void kva__cpu_attn_v3(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    run_item(run, it, s, 0);
}

/* Variant 4: v3 with vdpbf16ps scores for bf16 q and cache (D = Dv = 64, 128
 * or 256); without a compiler that knows AVX512_BF16 it is v3. */
void kva__cpu_attn_v4(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    run_item(run, it, s, 1);
}

void kva__cpu_group_v3(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                       kva__cpu_scratch *s)
{
    run_group(run, items, n, s, 0);
}

void kva__cpu_group_v4(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                       kva__cpu_scratch *s)
{
    run_group(run, items, n, s, 1);
}

#endif /* __x86_64__ */
