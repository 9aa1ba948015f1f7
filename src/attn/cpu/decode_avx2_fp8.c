/*
 * decode_avx2_fp8.c - the AVX2 decode chunk step (decode_avx2_step.inc)
 * instantiated for e4m3 K and V rows (FP8_E4M3), chunks with and
 * without NaN codes.
 */
#if defined(__x86_64__)

#include "decode_avx2_step.inc"

DECODE_AVX2_STEPS(kva__avx2_steps_fp8, FMT_FP8, FMT_FP8);
DECODE_AVX2_STEPS(kva__avx2_steps_fp8n, FMT_FP8N, FMT_FP8N);
#endif /* __x86_64__ */
