/*
 * decode_avx512_f32.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for float32 K and V rows (an f32 cache, and the rows of any other
 * storage dtype, which load_chunk converts to fp32).
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_f32, FMT_F32, FMT_F32, 0, 1);

#endif /* __x86_64__ */
