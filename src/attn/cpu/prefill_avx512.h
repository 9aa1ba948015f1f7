/*
 * prefill_avx512.h - the AVX-512 vector primitives of the tiled prefill
 * kernels (see prefill_tiled.inc for the contract), shared by
 * prefill_avx512.c and prefill_avx512_bf16.c. Included only
 * by files compiled with the AVX-512 flags.
 */
#ifndef KVA_PREFILL_AVX512_H
#define KVA_PREFILL_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define PF_VL 16
#define PF_KT 96
#define PF_S_MR 6
#define PF_S_NV 4
#define PF_O_MR 6
#define PF_O_NV 4

typedef __m512 pf_v;
#define pf_load(p) _mm512_loadu_ps(p)
#define pf_store(p, x) _mm512_storeu_ps((p), (x))
#define pf_set1(f) _mm512_set1_ps(f)
#define pf_zero() _mm512_setzero_ps()
#define pf_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define pf_add(a, b) _mm512_add_ps((a), (b))
#define pf_sub(a, b) _mm512_sub_ps((a), (b))
#define pf_mul(a, b) _mm512_mul_ps((a), (b))
/* vmaxps returns its second operand when either is NaN. */
#define pf_maxskip(x, m) _mm512_max_ps((x), (m))

static inline __m512 pf_mask_keys(__m512 x, int32_t j, const int32_t *lo, const int32_t *hi)
{
    const __m512i jv = _mm512_set1_epi32(j);
    const __mmask16 vis = _mm512_cmple_epi32_mask(_mm512_loadu_si512(lo), jv) &
                          _mm512_cmpgt_epi32_mask(_mm512_loadu_si512(hi), jv);
    return _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), x);
}

static inline __m512 pf_alibi(__m512 x, const float *slope, int32_t j, const int32_t *pos)
{
    const __m512i dist = _mm512_sub_epi32(_mm512_set1_epi32(j), _mm512_loadu_si512(pos));
    return _mm512_fmadd_ps(_mm512_loadu_ps(slope), _mm512_cvtepi32_ps(dist), x);
}

/* e^x for x <= 0: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial
 * (1 + r + r^2 (1/2 + r/6 + ...), coefficients of the classic Cephes expf),
 * times 2^n built in the exponent field. x < -87.3 (e^x below the normal
 * range) and -inf give exactly 0; NaN stays NaN (the clamp keeps it). */
static inline __m512 pf_exp(__m512 x)
{
    const __m512 lim = _mm512_set1_ps(-87.3f);
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, lim, _CMP_LT_OQ);
    x = _mm512_max_ps(lim, x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    p = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_mask_blend_ps(tiny, p, _mm512_setzero_ps());
}

/* 2^x for x <= 0 (the softmax runs in base 2: scores are scaled by log2 e):
 * n = round(x), f = x - n in [-1/2, 1/2] (exact), 2^f by a degree-6
 * polynomial (Chebyshev-node fit, max relative error 8e-8), times 2^n by
 * vscalefps. x < -126 (2^x below the normal range) and -inf give exactly 0;
 * NaN stays NaN. 10 instructions (the Cephes-style pf_exp above takes 17). */
static inline __m512 pf_exp2(__m512 x)
{
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5461444855e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3400427997e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6180569381e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503271520e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650719e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* Bit l set when lane l of x is -inf. */
static inline unsigned pf_neginf_lanes(__m512 x)
{
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
}

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 16: a 16 x 16 block of
 * 32-bit values transposed in registers (4 rounds of 16 shuffles). */
static inline void pf_transpose(const float *src, size_t lds, float *dst, size_t ldd)
{
    __m512 a[16], b[16];
    for (int r = 0; r < 16; r++)
        a[r] = _mm512_loadu_ps(src + (size_t)r * lds);
    /* b[2i], b[2i+1], per 128-bit lane L: rows 2i, 2i+1 interleaved, columns 4L .. 4L+3 */
    for (int i = 0; i < 8; i++) {
        b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
    }
    /* a[4i+k], lane L: rows 4i .. 4i+3 of column 4L+k */
    for (int i = 0; i < 4; i++) {
        const __m512d x0 = _mm512_castps_pd(b[4 * i]), x1 = _mm512_castps_pd(b[4 * i + 1]);
        const __m512d x2 = _mm512_castps_pd(b[4 * i + 2]), x3 = _mm512_castps_pd(b[4 * i + 3]);
        a[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        a[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        a[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        a[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    /* b[k] / b[4+k]: rows 0-7 of columns k, 8+k / 4+k, 12+k; b[8+..]: rows 8-15 */
    for (int k = 0; k < 4; k++) {
        b[k] = _mm512_shuffle_f32x4(a[k], a[4 + k], 0x88);
        b[4 + k] = _mm512_shuffle_f32x4(a[k], a[4 + k], 0xdd);
        b[8 + k] = _mm512_shuffle_f32x4(a[8 + k], a[12 + k], 0x88);
        b[12 + k] = _mm512_shuffle_f32x4(a[8 + k], a[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; k++) {
        _mm512_storeu_ps(dst + (size_t)k * ldd, _mm512_shuffle_f32x4(b[k], b[8 + k], 0x88));
        _mm512_storeu_ps(dst + (size_t)(8 + k) * ldd, _mm512_shuffle_f32x4(b[k], b[8 + k], 0xdd));
        _mm512_storeu_ps(dst + (size_t)(4 + k) * ldd,
                         _mm512_shuffle_f32x4(b[4 + k], b[12 + k], 0x88));
        _mm512_storeu_ps(dst + (size_t)(12 + k) * ldd,
                         _mm512_shuffle_f32x4(b[4 + k], b[12 + k], 0xdd));
    }
}

/* tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|); +-inf -> +-1, NaN -> NaN. */
static inline __m512 pf_tanh(__m512 x)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512 ax = _mm512_andnot_ps(sign, x);
    const __m512 e = pf_exp(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    return _mm512_or_ps(t, _mm512_and_ps(sign, x));
}

#endif /* KVA_PREFILL_AVX512_H */
