/*
 * prefill_avx2.h - the AVX2 + FMA vector primitives of the tiled prefill
 * kernels (see prefill_tiled.inc for the contract; the elementwise functions
 * over these traits: prefill_vec.h), used by prefill_avx2.c and, for pf_exp,
 * by cpu_merge_avx2.c. Included only by files compiled with the AVX2 flags.
 */
#ifndef KVA_PREFILL_AVX2_H
#define KVA_PREFILL_AVX2_H

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
/* Traits of prefill_vec.h (masks are vectors of all-ones lanes). */
typedef __m256 pf_m;
#define pf_lt(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define pf_nlt(a, b) _mm256_cmp_ps((a), (b), _CMP_NLT_UQ)
#define pf_clear(m, x) _mm256_andnot_ps((m), (x))
#define pf_fnmadd(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define pf_round(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define pf_div(a, b) _mm256_div_ps((a), (b))
#define pf_and(a, b) _mm256_and_ps((a), (b))
#define pf_or(a, b) _mm256_or_ps((a), (b))
#define pf_andnot(a, b) _mm256_andnot_ps((a), (b))
#define pf_exp2i(n)                                                                                \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
/* NaN lanes are kept (keep is true there) and stay NaN through the product. */
#define pf_scale2_keep(keep, p, n) _mm256_and_ps((keep), _mm256_mul_ps((p), pf_exp2i(n)))

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

#include "prefill_vec.h"

#endif /* KVA_PREFILL_AVX2_H */
