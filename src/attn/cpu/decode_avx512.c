/*
 * decode_avx512.c - CPU attention kernels decode_avx512 and decode_avx512bf16:
 * AVX-512 (F/BW/VL/DQ), GQA-packed online softmax for decode-shaped items;
 * decode_avx512bf16 adds AVX512_BF16 scores for bf16 q and cache, and on CPUs with
 * AVX512_VNNI int8 dot-product scores for int8 keys.
 *
 * Same work item and semantics as decode_portable (attn_portable.c); what
 * changes:
 *   - The item loop (decode_loop.c, shared with decode_avx2) reads the K
 *     and V rows in place, in their storage format, and prefetches the
 *     chunk two ahead key by key from the compute loops of this file's steps.
 *   - Quantized rows are converted in registers like f16/bf16 (ld16: int8
 *     vpmovsxbd + vcvtdq2ps; fp8 e4m3 rebuilt as f16 bits + vcvtph2ps) and
 *     the scales are folded out of the inner loops: per-channel key scales
 *     into the query tile once per item (score = sum_d (q_d s_d)(k_d - o_d),
 *     one vsubps per vector, none for symmetric int8), per-token key scales
 *     as one multiply per score, per-channel value scales into the
 *     accumulators once at the end of the item (acc += p (v - o), then
 *     acc *= s: P.V, the partials and their merge are linear in V).
 *   - Scores: keys are the outer loop; each K row is converted once into
 *     registers (ld16: bf16 widen + shift, f16 vcvtph2ps) and serves up to 4
 *     heads, whose q stays in registers (64-dim parts of the head for up to
 *     4 heads; at D = 128 one pass with q of 2 heads in registers and of 2
 *     as FMA memory operands, scores_nb_d128); the per-(head,
 *     key) 16-lane partial sums are reduced 16 keys at a time by one 16x16
 *     transpose-and-add (hsum16).
 *   - decode_avx512bf16, bf16 q and cache: vdpbf16ps multiplies bf16 pairs exactly
 *     and adds in fp32 (half the instructions, no conversion of K); the
 *     softmax scale multiplies the scores instead of q, which stays in
 *     registers as bf16 for the chunk.
 *   - The softmax update runs on vectors of 16 scores: lanes outside the
 *     row's visible keys are -inf, exp16 (degree-7 polynomial + vscalefps);
 *     no expf for the rescale when the running max did not change.
 *   - P.V is register-blocked: 4 heads x 64 output dims (or 8 heads x 32) in
 *     16 zmm accumulators while the V rows stream through, converted in
 *     registers once per head block; bf16 rows without a shuffle (even and
 *     odd dims of one 64-byte load, accumulators un-paired once per item).
 *   - Loops specialized for D = Dv = 64, 128, 256 and each row format;
 *     other shapes take a runtime-D copy.
 *   - decode_avx512bf16 over int8 keys (INT8_CHANNEL, INT8_TOKEN_K, symmetric or
 *     not) on a CPU with AVX512_VNNI: q' held as a 23-bit integer in 3
 *     signed byte digits, 16 keys transposed by dwords into lanes, vpdpbusd
 *     against the codes biased to unsigned bytes (scores_rows_i8dot in
 *     decode_avx512_step.inc: no conversion of K, no 16x16 reductions; exact up to
 *     q's 2^-23 rounding and a few fp32 roundings).
 *   - Over an NHD cache with Hkv > 1 (a kv head's rows Hkv * D elements
 *     apart) the loops visit each group of 4 keys as 0, 2, 1, 3 and
 *     prefetch the row two steps ahead into L1 (key_at in decode_loop.h):
 *     read in order, the constant stride makes the core's stride prefetcher
 *     run past each block's end into other blocks' lines. Separate step
 *     functions (*_ko), so the loops of the other layouts stay as they were
 *     (measured in bench/results/2026-11-22_performance-journal.md, "NHD key order").
 *
 * Non-finite semantics are decode_portable's: NaN scores do not enter the max and make
 * the row's sum NaN; an all -inf chunk leaves a row untouched (it takes no
 * part in the chunk's P.V, so 0 * inf in V cannot reach it); p = 0 keys
 * inside the visible range are accumulated as decode_portable does.
 *
 * Measurements and what was tried: bench/results/2026-11-22_performance-journal.md
 * ("CPU decode loops rework", "Notes moved out of the CPU kernel sources").
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
