/*
 * decode_avx2.h - the vector pieces of the AVX2 decode kernel (decode_avx2.c
 * describes it): exp8, the 8x8 transpose-and-add, the in-register row
 * conversion (ld8), and the chunk-step tables the format instantiations
 * export (the fold info and prefetch helpers: decode_loop.h). Included by the
 * files compiled with the AVX2 flags: decode_avx2.c (the ISA descriptor of
 * the item loop, decode_loop.c) and decode_avx2_<formats>.c
 * (decode_avx2_step.inc instantiated per format pair, cpu_fold.h).
 */
#ifndef KVA_DECODE_AVX2_H
#define KVA_DECODE_AVX2_H

#include "decode_loop.h"

#include <immintrin.h>
#include <math.h>

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
        /* e4m3 s.eeee.mmm -> f16 s.0eeee.mmm0000000 (value / 2^8), see decode_avx512.h. */
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

/* One table per format pair (PAIR_*, cpu_fold.h). */
extern const kva__cpu_steps kva__avx2_steps_f32, kva__avx2_steps_f16,
    kva__avx2_steps_bf16; /* decode_avx2_float.c */
extern const kva__cpu_steps kva__avx2_steps_i8, kva__avx2_steps_i8s, kva__avx2_steps_i8t_i8,
    kva__avx2_steps_i8t_i8s, kva__avx2_steps_i8t_f16,
    kva__avx2_steps_i8t_bf16;                                          /* decode_avx2_int8.c */
extern const kva__cpu_steps kva__avx2_steps_fp8, kva__avx2_steps_fp8n; /* decode_avx2_fp8.c */

#endif /* KVA_DECODE_AVX2_H */
