/*
 * prefill_avx512.h - the AVX-512 vector primitives of the tiled prefill
 * kernels (see prefill_tiled.inc for the contract; the elementwise
 * functions over these traits: prefill_vec.h), shared by prefill_avx512.c
 * and prefill_avx512_bf16.c. Included only
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
/* Traits of prefill_vec.h. */
typedef __mmask16 pf_m;
#define pf_lt(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define pf_nlt(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_NLT_UQ)
#define pf_clear(m, x) _mm512_mask_blend_ps((m), (x), _mm512_setzero_ps())
#define pf_fnmadd(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
#define pf_round(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define pf_div(a, b) _mm512_div_ps((a), (b))
#define pf_and(a, b) _mm512_and_ps((a), (b))
#define pf_or(a, b) _mm512_or_ps((a), (b))
#define pf_andnot(a, b) _mm512_andnot_ps((a), (b))
#define pf_exp2i(n)                                                                                \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define pf_scale2_keep(keep, p, n) _mm512_maskz_scalef_ps((keep), (p), (n))

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

#include "prefill_vec.h"

#endif /* KVA_PREFILL_AVX512_H */
