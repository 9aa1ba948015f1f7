/*
 * decode_avx2_float.c - the AVX2 decode chunk step (decode_avx2_step.inc)
 * instantiated for float32, f16 and bf16 K and V rows.
 */
#if defined(__x86_64__)

#include "decode_avx2_step.inc"

DECODE_AVX2_STEPS(kva__avx2_steps_f32, FMT_F32, FMT_F32);
DECODE_AVX2_STEPS(kva__avx2_steps_f16, FMT_F16, FMT_F16);
DECODE_AVX2_STEPS(kva__avx2_steps_bf16, FMT_BF16, FMT_BF16);
#endif /* __x86_64__ */
