/*
 * decode_avx512_fp8.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for FP8_E4M3 K and V rows (chunks without NaN codes).
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_fp8, FMT_FP8, FMT_FP8, 0, 1);

#endif /* __x86_64__ */
