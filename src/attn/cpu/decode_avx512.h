/*
 * decode_avx512.h - the vector pieces of the AVX-512 decode kernel
 * (docs/architecture.md, "The AVX-512 decode step"): exp16, the 16x16
 * transpose-and-add, the in-register conversion of the row formats (ld16),
 * and the chunk-step tables the format instantiations export (the fold
 * info, key order and prefetch helpers they share with AVX2: decode_loop.h).
 * Included by the files compiled with the AVX-512 flags: decode_avx512.c
 * (the ISA descriptor of the item loop) and decode_avx512_<pair>.c
 * (decode_avx512_step.inc instantiated for one (K, V) format pair each, so
 * that the build compiles them in parallel).
 */
#ifndef KVA_DECODE_AVX512_H
#define KVA_DECODE_AVX512_H

#include "decode_loop.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^x in fp32 for x <= 0 (the softmax's only inputs): x = n ln2 + r with
 * |r| <= ln2/2 (two-part ln2), e^r by its degree-7 Taylor polynomial (error
 * below 1e-8 relative, about one ulp in total), times 2^n by vscalefps, which
 * flushes to 0 below the smallest subnormal; x = -inf gives 0, NaN stays NaN. */
AI __m512 exp16(__m512 x)
{
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-110.0f)); /* NaN -> -110, fixed below */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* Sums of 16 vectors: lane i of the result is the sum of the lanes of v[i]. */
AI __m512 hsum16(const __m512 v[16])
{
    __m512 s[8], t[4], u[2];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44),
                             _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
    /* s[i]: 128-bit blocks 0,1 hold v[i] (8 partial sums), blocks 2,3 v[i+8]. */
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[i], s[i + 4], 0x88),
                             _mm512_shuffle_f32x4(s[i], s[i + 4], 0xdd));
    /* t[i]: blocks hold 4 partial sums of v[i], v[i+8], v[i+4], v[i+12]. */
    for (int i = 0; i < 2; i++)
        u[i] =
            _mm512_add_ps(_mm512_unpacklo_ps(t[i], t[i + 2]), _mm512_unpackhi_ps(t[i], t[i + 2]));
    const __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    /* w: block k lane j is the sum of t[j]'s block k: vectors 0-3, 8-11, 4-7, 12-15. */
    return _mm512_shuffle_f32x4(w, w, 0xd8);
}

/* Row formats: FMT_* (cpu_fold.h); ld16 and load_chunk are what read them. */

/* 16 elements [i, i+16) of a K/V row of format fmt as fp32 (see above: int8
 * without scale/offset, fp8 as value / 2^8); lanes outside m are 0 (only the
 * masked lanes are read). This and load_chunk are the only places that know
 * the row format. */
AI __m512 ld16(const void *row, int32_t i, const int fmt, __mmask16 m)
{
    if (fmt == FMT_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    if (fmt >= FMT_I8) {
        const unsigned char *p = (const unsigned char *)row + i;
        const __m128i b =
            m == 0xffff ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(m, p);
        if (fmt < FMT_FP8)
            return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        /* e4m3 s.eeee.mmm -> f16 s.0eeee.mmm0000000: the same value / 2^8,
         * subnormals included (f16 has 10 mantissa bits and a 2^8 wider
         * exponent range). Sign-extended and shifted by 7, a negative code
         * also sets bit 14, which the mask clears. */
        __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                     _mm256_set1_epi16((short)0xbf80));
        if (fmt == FMT_FP8N) /* |code| 0x7f is NaN (1.875 as built) */
            h = _mm256_mask_mov_epi16(
                h,
                _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                        _mm256_set1_epi16(0x3f80)),
                _mm256_set1_epi16(0x7e00));
        return _mm512_cvtph_ps(h);
    }
    const __m256i h = m == 0xffff ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))
                                  : _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (fmt == FMT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Lanes of the last 16-element vector of a row of n elements (n a multiple of 8). */
#define TAIL16(n) ((n) % 16 ? (__mmask16)0x00ff : (__mmask16)0xffff)
#define NVEC16(n) (((n) + 15) / 16)

/* One table per format pair (PAIR_*, cpu_fold.h), each in its own file
 * decode_avx512_<pair>.c. */
extern const kva__cpu_steps kva__avx512_steps_f32, kva__avx512_steps_f16, kva__avx512_steps_bf16,
    kva__avx512_steps_i8, kva__avx512_steps_i8s, kva__avx512_steps_i8t_i8,
    kva__avx512_steps_i8t_i8s, kva__avx512_steps_i8t_f16, kva__avx512_steps_i8t_bf16,
    kva__avx512_steps_fp8, kva__avx512_steps_fp8n;
#if defined(__AVX512BF16__)
/* bf16 q and K scored by vdpbf16ps (D = Dv = 64, 128, 256; any = NULL). */
extern const kva__cpu_steps kva__avx512_steps_bf16dot;
#endif

#endif /* KVA_DECODE_AVX512_H */
