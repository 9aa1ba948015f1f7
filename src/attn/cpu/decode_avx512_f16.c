/*
 * decode_avx512_f16.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for f16 K and V rows.
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_f16, FMT_F16, FMT_F16, 0, 1);

#endif /* __x86_64__ */
