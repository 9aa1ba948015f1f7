/*
 * decode_avx512_i8.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for INT8_CHANNEL K and V rows with per-channel offsets.
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_i8, FMT_I8, FMT_I8, 0, 1);

#endif /* __x86_64__ */
