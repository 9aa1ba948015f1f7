/*
 * attn_v2_avx2.c - CPU attention kernel, variant 2: AVX2 + FMA + F16C,
 * GQA-packed online softmax for decode-shaped items.
 *
 * The 8-lane twin of v3 (attn_v3_avx512.c, which explains the scheme) for
 * x86-64 machines without AVX-512: load_chunk converts a chunk of K/V rows
 * to fp32 once per GQA group (bf16: widen + shift; f16: vcvtph2ps), scores
 * are 8-lane partial dot products reduced by an 8x8 transpose-and-add
 * (hsum8), the softmax update runs on score vectors with a polynomial exp
 * (exp8), and P.V keeps 4 heads x 16 output dims in registers while the
 * keys stream through. Non-finite semantics are v1's (see attn_v1.c).
 *
 * Measured (`kvattn bench`, bf16, H=32 Hkv=8 D=128, 16 x 4096 keys, shared
 * 2-core Zen 4 VM, best of 3): 1 thread 38.8 ms (v1: 77 ms), 2 threads
 * 23.9 ms (v1: 46 ms). More in docs/performance.md. Not yet ported from v3:
 * keys-outer scores with in-register conversion (AVX2 has 16 registers:
 * a D = 128 row does not fit next to the accumulators).
 */
#include "cpu_attn.h"

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

/* 8-lane partial sums of <q, k> over D (a multiple of 8). */
AI __m256 dot_vec(const float *restrict q, const float *restrict k, const int32_t D)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= D; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
    }
    if (d < D)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    return _mm256_add_ps(a0, a1);
}

/* Scores of attention row q [D] against the 32 keys kp[0..31] of a chunk
 * (rows past the chunk's end point at a valid row; masked by the caller). */
AI void scores32(const float *restrict q, const float *const *kp, int32_t nk, const int32_t D,
                 __m256 s[4])
{
    __m256 v[8];
    for (int h = 0; h < 4; h++) {
        if (h * 8 >= nk) {
            s[h] = _mm256_set1_ps(-INFINITY);
            continue;
        }
        for (int t = 0; t < 8; t++)
            v[t] = dot_vec(q, kp[h * 8 + t], D);
        s[h] = hsum8(v);
    }
}

/* Converts the n rows of a chunk to fp32 (kbuf/vbuf) or points at them (f32);
 * s->kp/vp [KEY_CHUNK] get the row pointers, rows n.. repeat row 0. */
static void load_chunk(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                       int32_t kvh, kva__cpu_scratch *s)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    if (run->quant) {
        kva__cpu_load_chunk_dequant(run, cr, n, kvh, s);
        return;
    }
    const kva_dtype dt = run->kv_dt;
    for (int32_t t = 0; t < n; t++) {
        if (dt == KVA_DTYPE_F32) {
            s->kp[t] = (const float *)cr->k[t];
            s->vp[t] = (const float *)cr->v[t];
            continue;
        }
        float *kd = s->kbuf + (size_t)t * D, *vd = s->vbuf + (size_t)t * Dv;
        for (int w = 0; w < 2; w++) {
            const uint16_t *src = (const uint16_t *)(w ? cr->v[t] : cr->k[t]);
            float *dst = w ? vd : kd;
            const int32_t len = w ? Dv : D;
            if (dt == KVA_DTYPE_BF16) {
                for (int32_t d = 0; d < len; d += 8)
                    _mm256_storeu_ps(
                        dst + d,
                        _mm256_castsi256_ps(_mm256_slli_epi32(
                            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + d))),
                            16)));
            } else {
                for (int32_t d = 0; d < len; d += 8)
                    _mm256_storeu_ps(dst + d,
                                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
            }
        }
        s->kp[t] = kd;
        s->vp[t] = vd;
    }
    for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++) {
        s->kp[t] = s->kp[0];
        s->vp[t] = s->vp[0];
    }
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

/* Scores and online-softmax update of the nh rows m0.. of one query row over
 * the chunk's keys [a, e) (see v3's softmax_rows). */
AI void softmax_rows(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m0, int32_t nh,
                     int32_t h0, int32_t pos, int32_t c0, int32_t nk, int32_t a, int32_t e,
                     const int32_t D)
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
        scores32(s->q + (size_t)m * D, s->kp, nk, D, sc);
        float *pm = s->pm + (size_t)m * KVA_CPU_KEY_CHUNK;
        if (mods) {
            for (int j = 0; j < 4; j++)
                _mm256_storeu_ps(pm + 8 * j, sc[j]);
            score_mods(plan, pm, h0 + hh, c0, pos);
            for (int j = 0; j < 4; j++)
                sc[j] = _mm256_loadu_ps(pm + 8 * j);
        }
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
        const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
        s->mx[m] = mnew;
        s->sum[m] = s->sum[m] * alpha + hadd8(psum);
        s->alpha[m] = alpha;
        s->live[m] = 1;
    }
}

/* acc[m] = acc[m] * alpha[m] + sum over keys [ta, te) of pm[m][t] v[t] for
 * the NB rows m0.. over output dims [d0, d0 + 8 * NV); rows that are not
 * live keep their accumulators. */
AI void pv_block(kva__cpu_scratch *s, int32_t m0, int32_t ta, int32_t te, int32_t d0,
                 const int32_t Dv, const int NB, const int NV)
{
    __m256 acc[4][2];
    const float *const *vp = s->vp;
    for (int b = 0; b < NB; b++) {
        const float *ar = s->acc + (size_t)(m0 + b) * Dv + d0;
        const __m256 al = _mm256_set1_ps(s->alpha[m0 + b]);
        for (int j = 0; j < NV; j++)
            acc[b][j] = _mm256_mul_ps(_mm256_loadu_ps(ar + 8 * j), al);
    }
    for (int32_t t = ta; t < te; t++) {
        __m256 v[2];
        for (int j = 0; j < NV; j++)
            v[j] = _mm256_loadu_ps(vp[t] + d0 + 8 * j);
        for (int b = 0; b < NB; b++) {
            const __m256 p = _mm256_broadcast_ss(s->pm + (size_t)(m0 + b) * KVA_CPU_KEY_CHUNK + t);
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
                const int NB)
{
    int32_t d = 0;
    for (; d + 16 <= Dv; d += 16)
        pv_block(s, m0, ta, te, d, Dv, NB, 2);
    if (d < Dv)
        pv_block(s, m0, ta, te, d, Dv, NB, 1);
}

/* P.V of the nh rows m0.. of one query row in register blocks of 4, 2, 1 rows. */
static void pv_query_row(kva__cpu_scratch *s, int32_t m0, int32_t nh, int32_t ta, int32_t te,
                         int32_t Dv)
{
    int32_t m = m0;
    const int32_t m1 = m0 + nh;
    for (; m + 4 <= m1; m += 4)
        pv_rows(s, m, ta, te, Dv, 4);
    if (m + 2 <= m1) {
        pv_rows(s, m, ta, te, Dv, 2);
        m += 2;
    }
    if (m < m1)
        pv_rows(s, m, ta, te, Dv, 1);
}

/* One chunk for every query row of the item; D is a constant in the
 * specialized copies (the q row then stays in registers). */
AI void chunk_step(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                   const kva__cpu_item_geom *g, int32_t c0, int32_t c1, const int32_t D)
{
    const int32_t Dv = run->plan->d.head_dim_v, nh = it->nh;
    for (int32_t ii = 0; ii < it->nq; ii++) {
        const int32_t a = s->lo[ii] > c0 ? s->lo[ii] : c0;
        const int32_t e = s->hi[ii] < c1 ? s->hi[ii] : c1;
        if (a >= e)
            continue;
        const int32_t pos = g->seq - g->q_len + it->i0 + ii;
        softmax_rows(run, s, ii * nh, nh, g->hbase, pos, c0, c1 - c0, a, e, D);
        pv_query_row(s, ii * nh, nh, a - c0, e - c0, Dv);
    }
}

static void chunk_step_d64(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                           const kva__cpu_item_geom *g, int32_t c0, int32_t c1)
{
    chunk_step(run, it, s, g, c0, c1, 64);
}

static void chunk_step_d128(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                            const kva__cpu_item_geom *g, int32_t c0, int32_t c1)
{
    chunk_step(run, it, s, g, c0, c1, 128);
}

static void chunk_step_any(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                           const kva__cpu_item_geom *g, int32_t c0, int32_t c1)
{
    chunk_step(run, it, s, g, c0, c1, run->plan->d.head_dim);
}

void kva__cpu_attn_v2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    kva__cpu_item_geom g;
    kva__cpu_item_begin(run, it, s, &g);
    void (*step)(const kva__cpu_run *, const kva__work_item *, kva__cpu_scratch *,
                 const kva__cpu_item_geom *, int32_t, int32_t) = D == 128  ? chunk_step_d128
                                                                 : D == 64 ? chunk_step_d64
                                                                           : chunk_step_any;

    /* Rows of the current and of the next chunk (prefetched one chunk ahead). */
    kva__cpu_chunk_rows rows[2];
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t kbytes = (size_t)D * kv_esz, vbytes = (size_t)Dv * kv_esz;
    int cur = 0;
    if (it->k0 < it->k1)
        kva__cpu_locate_chunk(
            run, it->req, it->kv_head, it->k0,
            it->k1 - it->k0 < KVA_CPU_KEY_CHUNK ? it->k1 - it->k0 : KVA_CPU_KEY_CHUNK, &rows[0]);
    for (int32_t c0 = it->k0; c0 < it->k1; c0 += KVA_CPU_KEY_CHUNK) {
        const int32_t c1 = c0 + KVA_CPU_KEY_CHUNK < it->k1 ? c0 + KVA_CPU_KEY_CHUNK : it->k1;
        if (c1 < it->k1) {
            const int32_t n2 = it->k1 - c1 < KVA_CPU_KEY_CHUNK ? it->k1 - c1 : KVA_CPU_KEY_CHUNK;
            kva__cpu_locate_chunk(run, it->req, it->kv_head, c1, n2, &rows[cur ^ 1]);
            kva__cpu_prefetch_chunk(&rows[cur ^ 1], n2, kbytes, vbytes);
        }
        load_chunk(run, &rows[cur], c1 - c0, it->kv_head, s);
        cur ^= 1;
        step(run, it, s, &g, c0, c1);
    }
    kva__cpu_item_finish(run, it, s, &g);
}

#endif /* __x86_64__ */
