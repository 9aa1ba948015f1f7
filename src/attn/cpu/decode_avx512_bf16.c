/*
 * decode_avx512_bf16.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for bf16 K and V rows, scores by fp32 FMAs.
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_bf16, FMT_BF16, FMT_BF16, 0, 1);

#endif /* __x86_64__ */
