/*
 * prefill_avx512_bf16.c - CPU attention kernel prefill_avx512bf16: prefill_avx512
 * with the scores computed by AVX512-BF16 dot products when q and K are bf16.
 *
 * vdpbf16ps multiplies pairs of bf16 values and adds both products to an fp32
 * lane. Products of two bf16 values are exact in fp32, so with q kept in
 * bf16 (the scale is applied to the fp32 scores instead of being folded into
 * q) the scores carry the same fp32 accumulation error as prefill_avx512, at half
 * the instructions, and K is read straight from the cache: the query tile is
 * packed as (q[2d], q[2d+1]) pairs per row and one 32-bit broadcast of a key
 * row feeds a pair of channels. P x V stays in fp32 (rounding P to bf16, as
 * FlashAttention does, would add up to 2^-9 relative error per weight; see
 * bench/results/2026-11-22_performance-journal.md). Other dtypes run prefill_avx512's
 * fp32 path.
 * Needs AVX-512 F/BW/VL/DQ and BF16 (only called after run-time detection);
 * a compiler without -mavx512bf16 builds it as prefill_avx512.
 */
#if defined(__x86_64__) && defined(__AVX512F__)

#define PF_FN kva__cpu_prefill_avx512bf16
#if defined(__AVX512BF16__)
#define PF_BF16_SCORES 1
#endif
#include "prefill_avx512.h"

#include "prefill_tiled.inc"

#endif
