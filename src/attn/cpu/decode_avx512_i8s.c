/*
 * decode_avx512_i8s.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for symmetric INT8_CHANNEL K and V rows.
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_i8s, FMT_I8S, FMT_I8S, 0, 1);

#endif /* __x86_64__ */
