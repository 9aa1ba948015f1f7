/*
 * cpu_dequant.h - the CPU backend's chunk converter for quantized caches.
 *
 * Every CPU attention kernel converts a chunk of key rows and a chunk of value
 * rows of one kv head to fp32 before computing on them; for a quantized cache
 * that conversion is kva__cpu_dequant_rows. It reads the int8/fp8 rows in
 * place (nothing is materialized beyond the chunk) and applies the format's
 * scales:
 *   I8 with token_scale:   x = q * token_scale[t][0]            (per-token keys)
 *   I8 with scale/offset:  x = q * scale[c] - offset[c] * scale[c]   (C8)
 *   FP8_E4M3 with scale:   x = fp8(q) * scale[c]
 *   F32/F16/BF16:          x = the stored value (the 16-bit V of INT8_TOKEN_K_V16)
 */
#ifndef KVA_CPU_DEQUANT_H
#define KVA_CPU_DEQUANT_H

#include "cpu_attn.h"

#include <string.h>

/*
 * Dequantizes n rows of one kv head into dst [n, width] fp32.
 *   dt:          storage dtype of the rows (I8, FP8_E4M3, F32, F16 or BF16)
 *   rows:        [n] byte pointers to the rows (width elements each)
 *   token_scale: [n] pointers to each row's per-token scale (I8 keys of the
 *                INT8_TOKEN_K formats), or NULL
 *   scale:       [width] per-channel scale of the head, or NULL (per-token or plain rows)
 *   offset:      [width] per-channel offset of the head (I8), or NULL for 0
 *   simd:        kva__cpu_dequant_simd()'s answer, once per run
 * width is a multiple of 8, at most KVA_MAX_HEAD_DIM.
 */
void kva__cpu_dequant_rows(int32_t n, int32_t width, kva_dtype dt, const unsigned char *const *rows,
                           const float *const *token_scale, const float *scale, const float *offset,
                           int simd, float *dst);

/*
 * The whole chunk of a quantized cache for kernels: dequantizes the K rows
 * krows [n] (per-token scales kscales [n] for the INT8_TOKEN_K formats, else
 * unused and may be NULL) into kdst [n, D] and the V rows vrows [n] into
 * vdst [n, Dv], with kv head kvh's scales of run->cache. One call per chunk.
 */
void kva__cpu_dequant_chunk(const kva__cpu_run *run, int32_t kvh, int32_t n,
                            const unsigned char *const *krows, const float *const *kscales,
                            const unsigned char *const *vrows, float *kdst, float *vdst);

/* 1 if the AVX2 converter may run on a CPU with features f (AVX2, FMA and
 * F16C, and KVA_CPU_ISA not below avx2), else 0. Runs pass the features the
 * context detected at creation (ctx->cpu_features): no cpuid per run. */
int kva__cpu_dequant_simd(const kva__cpu_features *f);

/* The AVX2 converter for I8 and FP8 rows (cpu_dequant_avx2.c, x86-64 only):
 * same contract, os = offset * scale precomputed ([width], or NULL). */
void kva__cpu_dequant_rows_avx2(int32_t n, int32_t width, kva_dtype dt,
                                const unsigned char *const *rows, const float *const *token_scale,
                                const float *scale, const float *os, float *dst);

/* fp8 e4m3 code -> float, branch-free (exact): normals rebias the exponent
 * in the integer domain, subnormals are m * 2^-9, 0x7f/0xff are NaN. */
static inline float kva__cpu_fp8_to_f32(uint8_t code)
{
    const uint32_t a = code & 0x7fu;
    uint32_t u = (a << 20) + (120u << 23);
    float f;
    memcpy(&f, &u, sizeof f);
    const float sub = (float)a * 0x1p-9f;
    f = a < 8u ? sub : f;
    memcpy(&u, &f, sizeof u);
    u = a == 0x7fu ? 0x7fc00000u : u;
    u |= (uint32_t)(code & 0x80u) << 24;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* KVA_CPU_DEQUANT_H */
