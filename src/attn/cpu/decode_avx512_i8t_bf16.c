/*
 * decode_avx512_i8t_bf16.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for INT8_TOKEN_K_V16: int8 keys with per-token scales,
 * bf16 values.
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_i8t_bf16, FMT_I8T, FMT_BF16, 0, 1);

#endif /* __x86_64__ */
