/*
 * cpu_dequant_avx2.c - AVX2 + FMA chunk converter for int8 and fp8 rows
 * (contract in cpu_dequant.h). CMake compiles this file with -mavx2 -mfma
 * -mf16c; it is called only when kva__cpu_dequant_simd() detected them.
 *
 *   int8: 8 codes -> vpmovsxbd -> vcvtdq2ps -> vfmsub(q, s, o*s) (C8) or
 *         vmulps by the row's token scale (per-token keys);
 *   fp8:  8 codes -> vpmovzxbd; normals get their exponent rebiased in the
 *         integer domain ((a << 20) + (120 << 23)), subnormals (a < 8) are
 *         a * 2^-9, 0x7f is NaN, the sign bit is or-ed back; then * s.
 * No subnormal float is ever formed (they can be slow on x86).
 */
#if defined(__x86_64__)

#include "cpu_dequant.h"

#include <immintrin.h>

static inline __m256 fp8x8_to_f32(const uint8_t *p)
{
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i a = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
    const __m256 nrm = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(a, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(0x1p-9f));
    const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), a));
    __m256 r = _mm256_blendv_ps(nrm, sub, is_sub);
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_set1_epi32(0x7f)));
    r = _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    return _mm256_or_ps(r, _mm256_castsi256_ps(sign));
}

static inline __m256 i8x8_to_f32(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

void kva__cpu_dequant_rows_avx2(int32_t n, int32_t width, kva_dtype dt,
                                const unsigned char *const *rows, const float *const *token_scale,
                                const float *scale, const float *os, float *dst)
{
    for (int32_t t = 0; t < n; t++) {
        float *d = dst + (size_t)t * width;
        if (dt == KVA_DTYPE_I8) {
            const int8_t *q = (const int8_t *)rows[t];
            if (token_scale) {
                const __m256 s = _mm256_set1_ps(token_scale[t][0]);
                for (int32_t c = 0; c < width; c += 8)
                    _mm256_storeu_ps(d + c, _mm256_mul_ps(i8x8_to_f32(q + c), s));
            } else if (os) {
                for (int32_t c = 0; c < width; c += 8)
                    _mm256_storeu_ps(d + c,
                                     _mm256_fmsub_ps(i8x8_to_f32(q + c), _mm256_loadu_ps(scale + c),
                                                     _mm256_loadu_ps(os + c)));
            } else {
                for (int32_t c = 0; c < width; c += 8)
                    _mm256_storeu_ps(d + c,
                                     _mm256_mul_ps(i8x8_to_f32(q + c), _mm256_loadu_ps(scale + c)));
            }
        } else { /* FP8_E4M3 */
            const uint8_t *q = rows[t];
            for (int32_t c = 0; c < width; c += 8)
                _mm256_storeu_ps(d + c,
                                 _mm256_mul_ps(fp8x8_to_f32(q + c), _mm256_loadu_ps(scale + c)));
        }
    }
}

#endif /* __x86_64__ */
