/*
 * plan_scan_avx2.c - the plan check's block-table row scan (plan_check.c
 * check_batch) in AVX2. CMake compiles this file with -mavx2; check_batch calls
 * it only when the context's CPU has AVX2 (ctx->cpu_features).
 *
 * Every plan checks the ids of the blocks its requests read: a decode step of
 * R requests scans R rows of a few dozen ids each, the largest single piece
 * of the generic plan's host work. The portable loop (plan_check.c) runs four ids
 * per step in SSE2, which has no signed 32-bit max; here eight per step with
 * vpmaxsd, and a row's last ids in one load of its last eight (ids seen
 * twice change neither the OR nor the max) instead of a scalar tail.
 */
#if defined(__x86_64__)

#include "internal.h"
#include "plan_scan.h"

#include <immintrin.h>

void kva__plan_scan_row_avx2(const int32_t *row, int64_t n, int32_t *any, int32_t *hi)
{
    __m256i o = _mm256_setzero_si256();
    __m256i m = _mm256_set1_epi32(-1);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(row + j));
        o = _mm256_or_si256(o, x);
        m = _mm256_max_epi32(m, x);
    }
    if (j < n && n >= 8) {
        /* The row's last eight ids (some seen already: neutral for both). */
        const __m256i x = _mm256_loadu_si256((const __m256i *)(row + n - 8));
        o = _mm256_or_si256(o, x);
        m = _mm256_max_epi32(m, x);
    }
    int32_t so = 0, sm = -1;
    for (; n < 8 && j < n; j++) { /* a row of fewer than eight ids */
        so |= row[j];
        sm = row[j] > sm ? row[j] : sm;
    }
    __m128i o4 = _mm_or_si128(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1));
    __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    o4 = _mm_or_si128(o4, _mm_shuffle_epi32(o4, 0x4e));
    m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
    o4 = _mm_or_si128(o4, _mm_shuffle_epi32(o4, 0xb1));
    m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
    *any |= _mm_cvtsi128_si32(o4) | so;
    int32_t h = _mm_cvtsi128_si32(m4);
    h = sm > h ? sm : h;
    *hi = h > *hi ? h : *hi;
}

#endif
