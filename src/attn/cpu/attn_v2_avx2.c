/*
 * attn_v2_avx2.c - CPU attention kernel, variant 2: AVX2 + FMA + F16C,
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
 * semantics are v1's (see attn_v1.c).
 *
 * Measured (`kvattn bench --variant 2`, bf16, H/Hkv = 4/1 (GQA 4), D = 128,
 * 1 thread, shared 2-core Zen 4 VM, medians of 5): 2048 keys in L2 101 ->
 * 66 us, 8 x 4096 keys x 8 kv heads from DRAM 18.9 -> 13.5 ms against the
 * previous version (chunks converted to fp32 in scratch, then one head at a
 * time). Quantized caches, 4 x 16384 keys, f16 q, 1 thread: int8 32.1 ->
 * 21.1 ms, fp8 43.9 -> 27.5 ms against dequantizing each chunk to fp32 in
 * scratch (f16 cache: 31.4 ms). More in docs/performance.md.
 */
#include "cpu_attn.h"
#include "cpu_fold.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>

#define AI static inline __attribute__((always_inline))

/* e^x in fp32 for x <= 0: x = n ln2 + r (two-part ln2), e^r by its degree-7
 * Taylor polynomial, 2^n built in the exponent field; x < -87 (including
 * -inf) gives 0 (e^-87 is near the smallest normal), NaN stays NaN. */
AI __m256 exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 xc = _mm256_max_ps(x, lo); /* NaN -> -87, fixed below */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Sums of 8 vectors: lane i of the result is the sum of the lanes of v[i]. */
AI __m256 hsum8(const __m256 v[8])
{
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    /* u0: 128-bit halves hold 4-lane partial sums of v[0..3]; u1 of v[4..7]. */
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* 8 elements [i, i+8) of a row of format fmt (FMT_*, cpu_fold.h) as fp32
 * (int8 without scale and offset, fp8 as value / 2^8). */
AI __m256 ld8(const void *row, int32_t i, const int fmt)
{
    if (fmt == FMT_F32)
        return _mm256_loadu_ps((const float *)row + i);
    if (fmt >= FMT_I8) {
        const __m128i b = _mm_loadl_epi64((const __m128i *)((const unsigned char *)row + i));
        if (fmt < FMT_FP8)
            return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        /* e4m3 s.eeee.mmm -> f16 s.0eeee.mmm0000000 (value / 2^8), see v3. */
        __m128i h =
            _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xbf80));
        if (fmt == FMT_FP8N) /* |code| 0x7f is NaN */
            h = _mm_blendv_epi8(
                h, _mm_set1_epi16(0x7e00),
                _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80)));
        return _mm256_cvtph_ps(h);
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (fmt == FMT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* What the loops need for the quantized formats, set per item (fold_begin)
 * and per chunk (load_chunk). */
typedef struct fold_info {
    int kf, vf;                   /* row formats of K and V */
    const float *koff;            /* [D] key offsets of the item's kv head (FMT_I8 keys) */
    const float *voff;            /* [Dv] value offsets (FMT_I8 values) */
    float tok[KVA_CPU_KEY_CHUNK]; /* per-token key scales of the chunk (FMT_I8T) */
} fold_info;

/* The chunk PF_DIST ahead of the current one: its K rows are prefetched
 * (into L2) key by key from the scores loop, its V rows from the P.V loop,
 * so the misses stay in flight while the current chunk computes (a burst of
 * a whole chunk's lines fills the miss buffers and stalls the core). */
typedef struct pf_info {
    const kva__cpu_chunk_rows *rows; /* NULL: nothing (left) to prefetch */
    int32_t n;
    size_t kbytes, vbytes;
} pf_info;

AI void pf_key_k(const pf_info *pf, int32_t key)
{
    if (!pf || !pf->rows || key >= pf->n)
        return;
    const char *k = (const char *)pf->rows->k[key];
    for (size_t b = 0; b < pf->kbytes; b += 64)
        _mm_prefetch(k + b, _MM_HINT_T2);
}

AI void pf_key_v(const pf_info *pf, int32_t key)
{
    if (!pf || !pf->rows || key >= pf->n)
        return;
    const char *v = (const char *)pf->rows->v[key];
    for (size_t b = 0; b < pf->vbytes; b += 64)
        _mm_prefetch(v + b, _MM_HINT_T2);
}

/*
 * Scores of the NB (<= 4) rows m0.. (heads of one query row, q tile [M, D]
 * fp32) against the chunk's nk keys, into s->pm [m, KEY_CHUNK]. Keys are the
 * outer loop: each K row is read once, 16 dims at a time converted in
 * registers, for the NB heads (the q operands come from L1 with the FMAs);
 * the per-(head, key) 8-lane partial sums go to s->vs [NB, 8, 8] and hsum8
 * turns 8 keys of a head into one vector of scores.
 */
AI void scores_nb(kva__cpu_scratch *s, int32_t m0, const int NB, int32_t nk, const int32_t D,
                  const int kd, const pf_info *pf, const fold_info *fi)
{
    float *vs = s->vs;
    const float *q = s->q + (size_t)m0 * D;
    for (int32_t oct = 0; oct * 8 < nk; oct++) {
        for (int32_t t = 0; t < 8; t++) {
            const int32_t key = oct * 8 + t;
            pf_key_k(pf, key);
            if (key >= nk) {
                for (int b = 0; b < NB; b++)
                    _mm256_storeu_ps(vs + (b * 8 + t) * 8, _mm256_setzero_ps());
                continue;
            }
            const void *kr = s->kp[key];
            __m256 a0[4], a1[4];
            for (int b = 0; b < NB; b++)
                a0[b] = a1[b] = _mm256_setzero_ps();
            int32_t d = 0;
            for (; d + 16 <= D; d += 16) {
                __m256 k0 = ld8(kr, d, kd), k1 = ld8(kr, d + 8, kd);
                if (kd == FMT_I8) { /* (k - o): q already holds q * s */
                    k0 = _mm256_sub_ps(k0, _mm256_loadu_ps(fi->koff + d));
                    k1 = _mm256_sub_ps(k1, _mm256_loadu_ps(fi->koff + d + 8));
                }
                for (int b = 0; b < NB; b++) {
                    a0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)b * D + d), k0, a0[b]);
                    a1[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)b * D + d + 8), k1, a1[b]);
                }
            }
            if (d < D) {
                __m256 k0 = ld8(kr, d, kd);
                if (kd == FMT_I8)
                    k0 = _mm256_sub_ps(k0, _mm256_loadu_ps(fi->koff + d));
                for (int b = 0; b < NB; b++)
                    a0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)b * D + d), k0, a0[b]);
            }
            for (int b = 0; b < NB; b++)
                _mm256_storeu_ps(vs + (b * 8 + t) * 8, _mm256_add_ps(a0[b], a1[b]));
        }
        for (int b = 0; b < NB; b++) {
            __m256 v[8];
            for (int t = 0; t < 8; t++)
                v[t] = _mm256_loadu_ps(vs + (b * 8 + t) * 8);
            __m256 sc = hsum8(v);
            if (kd == FMT_I8T) /* score = s_tok * (q . k) */
                sc = _mm256_mul_ps(sc, _mm256_loadu_ps(fi->tok + oct * 8));
            _mm256_storeu_ps(s->pm + (size_t)(m0 + b) * KVA_CPU_KEY_CHUNK + oct * 8, sc);
        }
    }
}

/* Scores of the nh rows m0.. of one query row, in blocks of 4, 2, 1 heads;
 * the first block also prefetches the K rows of the chunk pf. */
AI void scores_query_row(kva__cpu_scratch *s, int32_t m0, int32_t nh, int32_t nk, const int32_t D,
                         const int kd, const pf_info *pf, const fold_info *fi)
{
    int32_t m = m0;
    const int32_t m1 = m0 + nh;
    for (; m + 4 <= m1; m += 4, pf = NULL)
        scores_nb(s, m, 4, nk, D, kd, pf, fi);
    if (m + 2 <= m1) {
        scores_nb(s, m, 2, nk, D, kd, pf, fi);
        m += 2;
        pf = NULL;
    }
    if (m < m1)
        scores_nb(s, m, 1, nk, D, kd, pf, fi);
}

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

/* Horizontal max / sum of 8 lanes. */
static inline float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline float hadd8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* Online-softmax update of the nh rows m0.. of one query row, whose scores
 * are in s->pm, over the chunk's keys [a, e) (see v3's softmax_rows). */
AI void softmax_rows(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m0, int32_t nh,
                     int32_t h0, int32_t pos, int32_t c0, int32_t a, int32_t e)
{
    const kva_plan *plan = run->plan;
    const int mods = plan->d.softcap > 0.0f || plan->alibi_slopes;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vis[4]; /* all-ones lanes for keys [a, e) of the chunk */
    for (int j = 0; j < 4; j++) {
        const __m256i idx = _mm256_add_epi32(iota, _mm256_set1_epi32(c0 + 8 * j));
        const __m256i ge_a = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(a - 1));
        const __m256i lt_e = _mm256_cmpgt_epi32(_mm256_set1_epi32(e), idx);
        vis[j] = _mm256_castsi256_ps(_mm256_and_si256(ge_a, lt_e));
    }
    for (int32_t hh = 0; hh < nh; hh++) {
        const int32_t m = m0 + hh;
        __m256 sc[4];
        float *pm = s->pm + (size_t)m * KVA_CPU_KEY_CHUNK;
        if (mods)
            score_mods(plan, pm, h0 + hh, c0, pos);
        for (int j = 0; j < 4; j++)
            sc[j] = _mm256_loadu_ps(pm + 8 * j);
        __m256 vm = ninf, nanv = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            sc[j] = _mm256_blendv_ps(ninf, sc[j], vis[j]);
            vm = _mm256_max_ps(sc[j], vm); /* NaN score -> vm: NaN stays out of the max */
            nanv = _mm256_or_ps(nanv, _mm256_cmp_ps(sc[j], sc[j], _CMP_UNORD_Q));
        }
        const float cmax = hmax8(vm);
        const float mold = s->mx[m];
        float mnew = kva__cpu_max_nan(mold, cmax);
        if (mnew == -INFINITY) {
            if (!_mm256_movemask_ps(nanv)) {
                s->live[m] = 0;
                continue;
            }
            mnew = NAN;
        }
        const __m256 mv = _mm256_set1_ps(mnew);
        __m256 psum = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            const __m256 p = exp8(_mm256_sub_ps(sc[j], mv));
            _mm256_storeu_ps(pm + 8 * j, p);
            psum = _mm256_add_ps(psum, p);
        }
        /* The max rarely changes once a few chunks are in: no expf then. */
        const float alpha = mold == mnew ? 1.0f : mold == -INFINITY ? 0.0f : expf(mold - mnew);
        s->mx[m] = mnew;
        s->sum[m] = s->sum[m] * alpha + hadd8(psum);
        s->alpha[m] = alpha;
        s->live[m] = 1;
    }
}

/* acc[m] = acc[m] * alpha[m] + sum over keys [ta, te) of pm[m][t] v[t] for
 * the NB rows m0.. over output dims [d0, d0 + 8 * NV); V rows of format kd
 * are converted in registers once for the NB heads; rows that are not live
 * keep their accumulators. bf16 rows in full 16-dim blocks are converted
 * without a shuffle (one 32-byte load: even dims = words << 16, odd dims =
 * words & 0xffff0000), so the accumulators hold such a block as [8 even
 * dims, 8 odd dims] until bf16_acc_unpair. The first block of a chunk also
 * prefetches the V rows of the chunk pf. */
AI void pv_block(kva__cpu_scratch *s, int32_t m0, int32_t ta, int32_t te, int32_t d0,
                 const int32_t Dv, const int kd, const int NB, const int NV, const pf_info *pf,
                 const float *voff)
{
    /* FMT_I8 values: acc += p (v - o); kva__cpu_fold_end multiplies acc by s. */
    __m256 vo[2];
    for (int j = 0; j < NV; j++)
        vo[j] = kd == FMT_I8 ? _mm256_loadu_ps(voff + d0 + 8 * j) : _mm256_setzero_ps();
    const int pair = kd == FMT_BF16 && NV == 2;
    __m256 acc[4][2];
    const float *const *vp = s->vp;
    const float *pm = s->pm + (size_t)m0 * KVA_CPU_KEY_CHUNK;
    for (int b = 0; b < NB; b++) {
        const float *ar = s->acc + (size_t)(m0 + b) * Dv + d0;
        const __m256 al = _mm256_set1_ps(s->alpha[m0 + b]);
        for (int j = 0; j < NV; j++)
            acc[b][j] = _mm256_mul_ps(_mm256_loadu_ps(ar + 8 * j), al);
    }
    for (int32_t t = ta; t < te; t++) {
        pf_key_v(pf, t);
        __m256 v[2];
        if (pair) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)((const uint16_t *)vp[t] + d0));
            v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            v[1] = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
        } else {
            for (int j = 0; j < NV; j++)
                v[j] = ld8(vp[t], d0 + 8 * j, kd);
        }
        if (kd == FMT_I8)
            for (int j = 0; j < NV; j++)
                v[j] = _mm256_sub_ps(v[j], vo[j]);
        for (int b = 0; b < NB; b++) {
            const __m256 p = _mm256_broadcast_ss(pm + (size_t)b * KVA_CPU_KEY_CHUNK + t);
            for (int j = 0; j < NV; j++)
                acc[b][j] = _mm256_fmadd_ps(p, v[j], acc[b][j]);
        }
    }
    for (int b = 0; b < NB; b++) {
        if (!s->live[m0 + b])
            continue;
        float *ar = s->acc + (size_t)(m0 + b) * Dv + d0;
        for (int j = 0; j < NV; j++)
            _mm256_storeu_ps(ar + 8 * j, acc[b][j]);
    }
}

AI void pv_rows(kva__cpu_scratch *s, int32_t m0, int32_t ta, int32_t te, const int32_t Dv,
                const int kd, const int NB, const pf_info *pf, const float *voff)
{
    int32_t d = 0;
    for (; d + 16 <= Dv; d += 16, pf = NULL)
        pv_block(s, m0, ta, te, d, Dv, kd, NB, 2, pf, voff);
    if (d < Dv)
        pv_block(s, m0, ta, te, d, Dv, kd, NB, 1, pf, voff);
}

/* P.V of the nh rows m0.. of one query row in register blocks of 4, 2, 1 rows. */
AI void pv_query_row(kva__cpu_scratch *s, int32_t m0, int32_t nh, int32_t ta, int32_t te,
                     const int32_t Dv, const int kd, const pf_info *pf, const float *voff)
{
    int32_t m = m0;
    const int32_t m1 = m0 + nh;
    for (; m + 4 <= m1; m += 4, pf = NULL)
        pv_rows(s, m, ta, te, Dv, kd, 4, pf, voff);
    if (m + 2 <= m1) {
        pv_rows(s, m, ta, te, Dv, kd, 2, pf, voff);
        m += 2;
        pf = NULL;
    }
    if (m < m1)
        pv_rows(s, m, ta, te, Dv, kd, 1, pf, voff);
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

/* One chunk [c0, c1) for every query row of the item; D and the row format
 * KD are constants in the specialized copies. pf (the chunk PF_DIST ahead)
 * is prefetched by the first query row's passes over this chunk. */
AI void chunk_step(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                   const kva__cpu_item_geom *g, int32_t c0, int32_t c1, const int32_t D,
                   const int KF, const int VF, pf_info *pf, const fold_info *fi)
{
    const int32_t Dv = run->plan->d.head_dim_v, nh = it->nh;
    for (int32_t ii = 0; ii < it->nq; ii++) {
        const int32_t a = s->lo[ii] > c0 ? s->lo[ii] : c0;
        const int32_t e = s->hi[ii] < c1 ? s->hi[ii] : c1;
        if (a >= e)
            continue;
        const int32_t pos = g->seq - g->q_len + it->i0 + ii;
        scores_query_row(s, ii * nh, nh, c1 - c0, D, KF, pf, fi);
        softmax_rows(run, s, ii * nh, nh, g->hbase, pos, c0, a, e);
        pv_query_row(s, ii * nh, nh, a - c0, e - c0, Dv, VF, pf, fi->voff);
        if (pf->rows) {
            for (int32_t t = 0; t < pf->n; t++) /* V rows P.V did not visit */
                if (t < a - c0 || t >= e - c0)
                    pf_key_v(pf, t);
            pf->rows = NULL;
        }
    }
    if (pf->rows) /* no query row saw this chunk */
        kva__cpu_prefetch_chunk(pf->rows, pf->n, pf->kbytes, pf->vbytes);
    pf->rows = NULL;
}

typedef void (*step_fn)(const kva__cpu_run *, const kva__work_item *, kva__cpu_scratch *,
                        const kva__cpu_item_geom *, int32_t, int32_t, pf_info *, const fold_info *);

/* chunk_step for the (K, V) format pairs that occur (as in v3). */
#define STEP_D(NAME, DIM)                                                                          \
    static void NAME(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,       \
                     const kva__cpu_item_geom *g, int32_t c0, int32_t c1, pf_info *pf,             \
                     const fold_info *fi)                                                          \
    {                                                                                              \
        const int32_t D_ = (DIM) ? (DIM) : run->plan->d.head_dim;                                  \
        const int kf_ = fi->kf, vf_ = fi->vf;                                                      \
        if (kf_ == FMT_BF16)                                                                       \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_BF16, FMT_BF16, pf, fi);                     \
        else if (kf_ == FMT_F16)                                                                   \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_F16, FMT_F16, pf, fi);                       \
        else if (kf_ == FMT_I8)                                                                    \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8, FMT_I8, pf, fi);                         \
        else if (kf_ == FMT_I8S)                                                                   \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8S, FMT_I8S, pf, fi);                       \
        else if (kf_ == FMT_I8T && vf_ == FMT_I8)                                                  \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8T, FMT_I8, pf, fi);                        \
        else if (kf_ == FMT_I8T && vf_ == FMT_I8S)                                                 \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8T, FMT_I8S, pf, fi);                       \
        else if (kf_ == FMT_I8T && vf_ == FMT_F16)                                                 \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8T, FMT_F16, pf, fi);                       \
        else if (kf_ == FMT_I8T)                                                                   \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_I8T, FMT_BF16, pf, fi);                      \
        else if (kf_ == FMT_FP8)                                                                   \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_FP8, FMT_FP8, pf, fi);                       \
        else if (kf_ == FMT_FP8N)                                                                  \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_FP8N, FMT_FP8N, pf, fi);                     \
        else                                                                                       \
            chunk_step(run, it, s, g, c0, c1, D_, FMT_F32, FMT_F32, pf, fi);                       \
    }
/* Only D = 128 gets constant-D copies (each copy of the format list costs
 * compile time, which sanitizer builds multiply); other head sizes take the
 * runtime-D copy. */
STEP_D(chunk_step_d128, 128)
STEP_D(chunk_step_any, 0)

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

/* One item while it runs, alone (kva__cpu_attn_v2) or interleaved with the
 * other members of its decode group (kva__cpu_group_v2). */
typedef struct item_run {
    const kva__work_item *it;
    kva__cpu_scratch s; /* the thread's scratch, per-item state moved for group members */
    kva__cpu_item_geom g;
    fold_info fi;
    step_fn step;
    pf_info pf;
    kva__cpu_chunk_rows rows[PF_DIST + 1];
    int32_t nchunks;
} item_run;

/* Starts item it (query tile, row formats, step function) and prefetches its
 * first PF_DIST chunks. ir->s must be set. */
static void item_open(const kva__cpu_run *run, const kva__work_item *it, item_run *ir)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    ir->it = it;
    kva__cpu_item_begin(run, it, &ir->s, &ir->g);
    fold_begin(run, it, &ir->s, &ir->g, &ir->fi);
    ir->step = D == 128 ? chunk_step_d128 : chunk_step_any;
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
    ir->step(run, it, &ir->s, &ir->g, c0, c1, &ir->pf, &ir->fi);
}

/* Ends the item: value scales, normalization, the result rows. */
static void item_close(const kva__cpu_run *run, item_run *ir)
{
    if (ir->fi.vf == FMT_BF16)
        bf16_acc_unpair(ir->s.acc, ir->g.M, run->plan->d.head_dim_v);
    kva__cpu_fold_end(run, ir->it, ir->s.acc, ir->g.M, ir->fi.vf);
    kva__cpu_item_finish(run, ir->it, &ir->s, &ir->g);
}

void kva__cpu_attn_v2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
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
void kva__cpu_group_v2(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
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
