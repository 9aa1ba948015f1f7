/*
 * decode_avx512.c - CPU attention kernels decode_avx512 and decode_avx512bf16:
 * AVX-512 (F/BW/VL/DQ), GQA-packed online softmax for decode-shaped items;
 * decode_avx512bf16 adds AVX512_BF16 scores for bf16 q and cache, and on CPUs with
 * AVX512_VNNI int8 dot-product scores for int8 keys.
 *
 * Same work item and semantics as decode_portable (attn_portable.c); the
 * loop structure (scores with keys outer and up to 4 heads' q in registers,
 * hsum16 reductions, vdpbf16ps and VNNI int8 scores, register-blocked P.V,
 * the NHD key order 0, 2, 1, 3 of key_at) and the non-finite rules are
 * docs/architecture.md, "The AVX-512 decode step"; measurements and what was
 * tried: bench/results/2026-11-22_performance-journal.md.
 */
#include "cpu_attn.h"

#if defined(__x86_64__)

#include "decode_avx512.h"

/* Whether an fp8 row of `bytes` bytes holds a NaN code (0x7f, 0xff). */
AI int row_has_nan_fp8(const unsigned char *src, size_t bytes)
{
    const __m512i lo7 = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (size_t b = 0; b < bytes; b += 64) {
        const __mmask64 m = bytes - b >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - b)) - 1;
        const __m512i x = _mm512_maskz_loadu_epi8(m, src + b);
        nan |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_and_si512(x, lo7), lo7);
    }
    return nan != 0;
}

/* kva__cpu_decode_isa.fp8_nan: the n K and V rows of an fp8 chunk. */
static int chunk_has_nan_fp8(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes)
{
    return chunk_any_row(cr, n, kbytes, vbytes, row_has_nan_fp8);
}

/* kva__cpu_decode_isa.acc_unpair: pv_block's pair layout stores each full
 * 32-dim block of a row as [even dims, odd dims]. */
static void bf16_acc_unpair(float *acc, int32_t M, int32_t Dv)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int32_t m = 0; m < M; m++)
        for (int32_t d = 0; d + 32 <= Dv; d += 32) {
            float *a = acc + (size_t)m * Dv + d;
            const __m512 ev = _mm512_loadu_ps(a), od = _mm512_loadu_ps(a + 16);
            _mm512_storeu_ps(a, _mm512_permutex2var_ps(ev, lo, od));
            _mm512_storeu_ps(a + 16, _mm512_permutex2var_ps(ev, hi, od));
        }
}

/* The chunk steps of each format pair (cpu_fold.h), one file each. */
static const kva__cpu_steps *const pair_steps[PAIR_COUNT] = {
    [PAIR_F32] = &kva__avx512_steps_f32,           [PAIR_F16] = &kva__avx512_steps_f16,
    [PAIR_BF16] = &kva__avx512_steps_bf16,         [PAIR_I8] = &kva__avx512_steps_i8,
    [PAIR_I8S] = &kva__avx512_steps_i8s,           [PAIR_I8T_I8] = &kva__avx512_steps_i8t_i8,
    [PAIR_I8T_I8S] = &kva__avx512_steps_i8t_i8s,   [PAIR_I8T_F16] = &kva__avx512_steps_i8t_f16,
    [PAIR_I8T_BF16] = &kva__avx512_steps_i8t_bf16, [PAIR_FP8] = &kva__avx512_steps_fp8,
    [PAIR_FP8N] = &kva__avx512_steps_fp8n,
};

/* decode_avx512 and decode_avx512bf16: the same steps; the latter adds the
 * vdpbf16ps steps for bf16 q and cache (without a compiler that knows
 * AVX512_BF16 it has none) and the VNNI int8 key scores. */
static const kva__cpu_decode_isa avx512 = {pair_steps,        NULL,           1, 0,
                                           chunk_has_nan_fp8, bf16_acc_unpair};
#if defined(__AVX512BF16__)
static const kva__cpu_decode_isa avx512bf16 = {
    pair_steps, &kva__avx512_steps_bf16dot, 1, 1, chunk_has_nan_fp8, bf16_acc_unpair};
#else
static const kva__cpu_decode_isa avx512bf16 = {pair_steps,        NULL,           1, 1,
                                               chunk_has_nan_fp8, bf16_acc_unpair};
#endif

void kva__cpu_decode_avx512(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    kva__cpu_decode_item(run, it, s, &avx512);
}

void kva__cpu_decode_avx512bf16(const kva__cpu_run *run, const kva__work_item *it,
                                kva__cpu_scratch *s)
{
    kva__cpu_decode_item(run, it, s, &avx512bf16);
}

void kva__cpu_decode_avx512_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                  kva__cpu_scratch *s)
{
    kva__cpu_decode_group(run, items, n, s, &avx512);
}

void kva__cpu_decode_avx512bf16_group(const kva__cpu_run *run, const kva__work_item *items,
                                      int32_t n, kva__cpu_scratch *s)
{
    kva__cpu_decode_group(run, items, n, s, &avx512bf16);
}

#endif /* __x86_64__ */
