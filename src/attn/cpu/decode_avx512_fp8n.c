/*
 * decode_avx512_fp8n.c - the AVX-512 decode chunk steps (decode_avx512_step.inc)
 * for FP8_E4M3 K and V rows of a chunk that holds NaN
 * codes (load_chunk looks; the loads map them to NaN).
 */
#if defined(__x86_64__)

#include "decode_avx512_step.inc"

DECODE_AVX512_STEPS(kva__avx512_steps_fp8n, FMT_FP8N, FMT_FP8N, 0, 1);

#endif /* __x86_64__ */
