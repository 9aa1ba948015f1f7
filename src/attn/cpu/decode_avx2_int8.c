/*
 * decode_avx2_int8.c - the AVX2 decode chunk step (decode_avx2_step.inc)
 * instantiated for the int8 formats: INT8_CHANNEL K and V, INT8_TOKEN_K
 * (per-token key scales, int8 values) and INT8_TOKEN_K_V16 (f16/bf16 values).
 */
#if defined(__x86_64__)

#include "decode_avx2_step.inc"

DECODE_AVX2_STEPS(kva__avx2_steps_i8, FMT_I8, FMT_I8);
DECODE_AVX2_STEPS(kva__avx2_steps_i8s, FMT_I8S, FMT_I8S);
DECODE_AVX2_STEPS(kva__avx2_steps_i8t_i8, FMT_I8T, FMT_I8);
DECODE_AVX2_STEPS(kva__avx2_steps_i8t_i8s, FMT_I8T, FMT_I8S);
DECODE_AVX2_STEPS(kva__avx2_steps_i8t_f16, FMT_I8T, FMT_F16);
DECODE_AVX2_STEPS(kva__avx2_steps_i8t_bf16, FMT_I8T, FMT_BF16);
#endif /* __x86_64__ */
