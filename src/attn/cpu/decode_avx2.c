/*
 * decode_avx2.c - CPU attention kernel decode_avx2: AVX2 + FMA + F16C,
 * GQA-packed online softmax for decode-shaped items.
 *
 * The 8-lane twin of decode_avx512 on the same item loop (decode_loop.c) for
 * x86-64 machines without AVX-512: the scheme of docs/architecture.md, "The
 * AVX-512 decode step", with 8-lane partial dot products reduced 8 keys at a
 * time (hsum8), exp8, and P.V over 4 heads x 16 output dims in registers.
 * Measurements: bench/results/2026-11-22_performance-journal.md.
 */
#include "cpu_attn.h"

#if defined(__x86_64__)

#include "decode_avx2.h"

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

/* kva__cpu_decode_isa.fp8_nan: the n K and V rows of an fp8 chunk. */
static int chunk_has_nan_fp8(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes)
{
    return chunk_any_row(cr, n, kbytes, vbytes, row_has_nan_fp8);
}

/* kva__cpu_decode_isa.acc_unpair: pv_block's pair layout stores each full
 * 16-dim block of a row as [even dims, odd dims]. */
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

/* The chunk steps of each format pair (cpu_fold.h). */
static const kva__cpu_steps *const pair_steps[PAIR_COUNT] = {
    [PAIR_F32] = &kva__avx2_steps_f32,           [PAIR_F16] = &kva__avx2_steps_f16,
    [PAIR_BF16] = &kva__avx2_steps_bf16,         [PAIR_I8] = &kva__avx2_steps_i8,
    [PAIR_I8S] = &kva__avx2_steps_i8s,           [PAIR_I8T_I8] = &kva__avx2_steps_i8t_i8,
    [PAIR_I8T_I8S] = &kva__avx2_steps_i8t_i8s,   [PAIR_I8T_F16] = &kva__avx2_steps_i8t_f16,
    [PAIR_I8T_BF16] = &kva__avx2_steps_i8t_bf16, [PAIR_FP8] = &kva__avx2_steps_fp8,
    [PAIR_FP8N] = &kva__avx2_steps_fp8n,
};

/* No bf16 dot products, no NHD key order, no VNNI scores. */
static const kva__cpu_decode_isa avx2 = {pair_steps,        NULL,           0, NULL,
                                         chunk_has_nan_fp8, bf16_acc_unpair};

void kva__cpu_decode_avx2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    kva__cpu_decode_item(run, it, s, &avx2);
}

void kva__cpu_decode_avx2_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                kva__cpu_scratch *s)
{
    kva__cpu_decode_group(run, items, n, s, &avx2);
}

#endif /* __x86_64__ */
