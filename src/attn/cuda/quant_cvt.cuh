/*
 * quant_cvt.cuh - device conversion of 1-byte cache codes to f16 (or, for
 * FP8 e4m3, to either 16-bit mma type), and the f16 staging of a query
 * scaled by the key scales (Q'), shared by the tensor-core kernels over
 * quantized caches (decode_mma_quant.cuh, prefill_mma_quant.cuh, the MLA
 * decode and GEMM over FP8 latent caches).
 */
#ifndef KVA_CUDA_QUANT_CVT_CUH
#define KVA_CUDA_QUANT_CVT_CUH

#include "mma_ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

/* Four codes (b0, b1, b2, b3) of w as f16 pairs {b0, b1} (lo) and {b2, b3}
 * (hi), exact: FP8 e4m3 by cvt, int8 c as the f16 1152 + c minus 1152. */
template <bool FP8>
static __device__ __forceinline__ void kva__cvt4_f16(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    if (FP8) {
        const __half2_raw a =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
        const __half2_raw b =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
        lo = (uint32_t)a.x | ((uint32_t)a.y << 16);
        hi = (uint32_t)b.x | ((uint32_t)b.y << 16);
    } else {
        /* 0x64 | (c ^ 0x80) is the f16 1024 + 128 + c; minus 1152. */
        const uint32_t x = w ^ 0x80808080u;
        const uint32_t m = 0x64806480u;
        uint32_t l = __byte_perm(x, 0x64646464u, 0x4140), h = __byte_perm(x, 0x64646464u, 0x4342);
        __half2 lh = __hsub2(*(__half2 *)&l, *(const __half2 *)&m);
        __half2 hh = __hsub2(*(__half2 *)&h, *(const __half2 *)&m);
        lo = *(uint32_t *)&lh;
        hi = *(uint32_t *)&hh;
    }
}

/* Four int8 codes (b0, b1, b2, b3) of w as f16 pairs {b0, b1} (lo) and
 * {b2, b3} (hi) plus the bias 1152, exact: 0x64 | (c ^ 0x80) is the f16
 * 1024 + 128 + c (one xor per word, one byte_perm per pair). For sums of
 * products whose caller subtracts the bias term once (1152 times the sum of
 * the other operand), not per element. */
static __device__ __forceinline__ void kva__cvt4_f16_b1152(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    const uint32_t x = w ^ 0x80808080u;
    lo = __byte_perm(x, 0x64646464u, 0x4140);
    hi = __byte_perm(x, 0x64646464u, 0x4342);
}

/* Two FP8 e4m3 codes (low byte first) as their exact values, packed in the
 * mma type's 16-bit element (e4m3 -> f16 by cvt is exact, and so is f16 ->
 * f32 -> bf16; NaN stays NaN). */
static __device__ __forceinline__ uint32_t kva__fp8x2_as(kva__mma_f16, uint32_t pair)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
static __device__ __forceinline__ uint32_t kva__fp8x2_as(kva__mma_bf16, uint32_t pair)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    return kva__mma_bf16::pack(f.x, f.y);
}
/* Eight codes (c.x bytes 0 .. 3, then c.y) as one 16-byte chunk of Ty values. */
template <typename Ty> static __device__ __forceinline__ uint4 kva__fp8x8_as(uint2 c)
{
    return make_uint4(kva__fp8x2_as(Ty(), c.x & 0xffffu), kva__fp8x2_as(Ty(), c.x >> 16),
                      kva__fp8x2_as(Ty(), c.y & 0xffffu), kva__fp8x2_as(Ty(), c.y >> 16));
}

/* 2^k as a float, k in [-126, 127]. */
static __device__ __forceinline__ float kva__exp2i(int k)
{
    return __int_as_float((k + 127) << 23);
}

/* Q' range: f16 holds |x| < 65504 and is exact only above 2^-14 (6.1e-5);
 * q * s can be far larger (bf16 q) or smaller (small q times key scales of
 * ~0.01: issue #22). Returns k such that a row whose largest finite |Q'| is
 * mx has mx * 2^k in [2^14, 2^15); Q' is stored times 2^k (exact) and the
 * scores times 2^-k after the offset or token-scale step (exact, before the
 * softmax scale), so the result does not depend on how the scale is split
 * between q, the key scales and the softmax scale. k = 0 for a row without
 * a finite nonzero element. */
static __device__ __forceinline__ int kva__q_row_exp(float mx)
{
    int k = 0;
    if (mx > 0.f && mx <= 3.4028235e38f) {
        int ex;
        frexpf(mx, &ex); /* mx in [2^(ex-1), 2^ex) */
        k = min(max(15 - ex, -120), 120);
    }
    return k;
}

/* p[0 .. 7] (16-byte aligned, read-only) into v. */
static __device__ __forceinline__ void kva__ldg_f8(const float *p, float v[8])
{
    const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* One chunk of 8 channels of a Q' row, v (q, times the key scales where
 * they are folded), whose row's C8 chunks lie in consecutive lanes of one
 * warp: k = kva__q_row_exp of the row's largest finite |v| (by shuffles),
 * and v 2^k as two f16, hi + lo (lo = rn(v 2^k - hi)). An infinite element
 * stays infinite in hi with lo 0 (not inf - inf = NaN), and the row's
 * finite elements keep their scaling, so its scores are the IEEE results
 * of kvattn.h's rule (-inf times a positive key element: -inf); a NaN
 * element stays NaN in both. Returns k. */
template <int C8>
static __device__ __forceinline__ int kva__q_hilo(const float v[8], __half hi[8], __half lo[8])
{
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float a = fabsf(v[j]);
        mx = fmaxf(mx, a <= 3.4028235e38f ? a : 0.f); /* inf and NaN left out */
    }
#pragma unroll
    for (int o = C8 / 2; o >= 1; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const int k = kva__q_row_exp(mx);
    const float up = kva__exp2i(k);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float x = v[j] * up;
        hi[j] = __float2half_rn(x);
        lo[j] = __float2half_rn(isinf(x) ? 0.f : x - __half2float(hi[j]));
    }
    return k;
}

/* The row's sum_c Q'_c o_c (INT8_CHANNEL key offsets; Q' = hi, plus lo
 * with LO) from this lane's chunk (o: its 8 offsets, 16-byte aligned), by
 * shuffles over the row's C8 lanes (kva__q_hilo). Infinite Q'_c are left
 * out: the scores subtract this sum from Q' C (C the codes), and -inf o_c
 * there would make every score inf - inf = NaN; without it such a channel
 * adds Q'_c c, whose sign is the code's (kvattn.h: the sign of c - o_c
 * where the two differ). */
template <int C8, bool LO>
static __device__ __forceinline__ float kva__q_offset_dot(const __half hi[8], const __half lo[8],
                                                          const float *o)
{
    float ov[8], acc = 0.f;
    kva__ldg_f8(o, ov);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float h = __half2float(hi[j]);
        acc = fmaf(isinf(h) ? 0.f : h + (LO ? __half2float(lo[j]) : 0.0f), ov[j], acc);
    }
#pragma unroll
    for (int o = C8 / 2; o >= 1; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

#endif /* KVA_CUDA_QUANT_CVT_CUH */
