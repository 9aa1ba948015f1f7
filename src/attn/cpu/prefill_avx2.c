/*
 * prefill_avx2.c - CPU attention kernel prefill_avx2: the tiled
 * prefill kernel (prefill_tiled.inc) with AVX2+FMA vectors of 8 rows.
 *
 * Register blocks (16 ymm registers): scores 6 keys x 2 vectors (16 rows: 12
 * accumulators, 2 loads of QT and 6 broadcasts of K per step of D), outputs
 * 6 elements of Dv x 2 vectors. Tiles of 96 keys. Needs AVX2, FMA and F16C
 * (only called after run-time detection).
 * Measured: bench/results/2026-11-22_performance-journal.md (prefill section).
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)

#define PF_FN kva__cpu_prefill_avx2
#define PF_VL 8
#define PF_KT 96
#define PF_S_MR 6
#define PF_S_NV 2
#define PF_O_MR 6
#define PF_O_NV 2

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

typedef __m256 pf_v;
#define pf_load(p) _mm256_loadu_ps(p)
#define pf_store(p, x) _mm256_storeu_ps((p), (x))
#define pf_set1(f) _mm256_set1_ps(f)
#define pf_zero() _mm256_setzero_ps()
#define pf_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define pf_add(a, b) _mm256_add_ps((a), (b))
#define pf_sub(a, b) _mm256_sub_ps((a), (b))
#define pf_mul(a, b) _mm256_mul_ps((a), (b))
/* vmaxps returns its second operand when either is NaN. */
#define pf_maxskip(x, m) _mm256_max_ps((x), (m))

static inline __m256 pf_mask_keys(__m256 x, int32_t j, const int32_t *lo, const int32_t *hi)
{
    const __m256i jv = _mm256_set1_epi32(j);
    const __m256i lov = _mm256_loadu_si256((const __m256i *)lo);
    const __m256i hiv = _mm256_loadu_si256((const __m256i *)hi);
    /* hidden: lo > j or j >= hi (i.e. not hi > j) */
    const __m256i hidden =
        _mm256_or_si256(_mm256_cmpgt_epi32(lov, jv),
                        _mm256_xor_si256(_mm256_cmpgt_epi32(hiv, jv), _mm256_set1_epi32(-1)));
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(hidden));
}

static inline __m256 pf_alibi(__m256 x, const float *slope, int32_t j, const int32_t *pos)
{
    const __m256i dist =
        _mm256_sub_epi32(_mm256_set1_epi32(j), _mm256_loadu_si256((const __m256i *)pos));
    return _mm256_fmadd_ps(_mm256_loadu_ps(slope), _mm256_cvtepi32_ps(dist), x);
}

/* e^x for x <= 0, as in prefill_avx512.c: x < -87.3 and -inf give
 * exactly 0, NaN stays NaN. */
static inline __m256 pf_exp(__m256 x)
{
    const __m256 lim = _mm256_set1_ps(-87.3f);
    const __m256 tiny = _mm256_cmp_ps(x, lim, _CMP_LT_OQ);
    x = _mm256_max_ps(lim, x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(tiny, p);
}

/* 2^x for x <= 0, as in prefill_avx512.h (degree-6 polynomial of
 * f = x - round(x)), with 2^n built in the exponent field: x < -126 and
 * -inf give exactly 0 (the garbage exponent of -inf is masked), NaN stays
 * NaN (NaN times anything). */
static inline __m256 pf_exp2(__m256 x)
{
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5461444855e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3400427997e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6180569381e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503271520e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650719e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718246e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Bit l set when lane l of x is -inf. */
static inline unsigned pf_neginf_lanes(__m256 x)
{
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 8: an 8 x 8 block of
 * 32-bit values transposed in registers. */
static inline void pf_transpose(const float *src, size_t lds, float *dst, size_t ldd)
{
    __m256 a[8], b[8];
    for (int r = 0; r < 8; r++)
        a[r] = _mm256_loadu_ps(src + (size_t)r * lds);
    for (int i = 0; i < 4; i++) {
        b[2 * i] = _mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]);
    }
    /* a[4i+k], 128-bit lane L: rows 4i .. 4i+3 of column 4L+k */
    for (int i = 0; i < 2; i++) {
        const __m256d x0 = _mm256_castps_pd(b[4 * i]), x1 = _mm256_castps_pd(b[4 * i + 1]);
        const __m256d x2 = _mm256_castps_pd(b[4 * i + 2]), x3 = _mm256_castps_pd(b[4 * i + 3]);
        a[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(x0, x2));
        a[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(x0, x2));
        a[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(x1, x3));
        a[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(x1, x3));
    }
    for (int k = 0; k < 4; k++) {
        _mm256_storeu_ps(dst + (size_t)k * ldd, _mm256_permute2f128_ps(a[k], a[4 + k], 0x20));
        _mm256_storeu_ps(dst + (size_t)(4 + k) * ldd, _mm256_permute2f128_ps(a[k], a[4 + k], 0x31));
    }
}

/* tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|); +-inf -> +-1, NaN -> NaN. */
static inline __m256 pf_tanh(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 ax = _mm256_andnot_ps(sign, x);
    const __m256 e = pf_exp(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

#include "prefill_tiled.inc"

#endif
