/*
 * decode_avx512_bf16dot.c - the AVX-512 decode chunk steps
 * (decode_avx512_step.inc) for bf16 q, K and V with the scores by
 * AVX512_BF16 dot products (vdpbf16ps), D = Dv = 64, 128 or 256.
 */
#if defined(__x86_64__) && defined(__AVX512BF16__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_bf16dot, FMT_BF16, FMT_BF16, 1, 0);

#endif /* __x86_64__ && __AVX512BF16__ */
