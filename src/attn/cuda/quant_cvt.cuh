/*
 * quant_cvt.cuh - device conversion of 1-byte cache codes to f16 (or, for
 * FP8 e4m3, to either 16-bit mma type), shared by the tensor-core kernels
 * over quantized caches (decode_mma_quant.cu, prefill_mma_quant.cuh, the MLA
 * decode and GEMM over FP8 latent caches).
 */
#ifndef KVA_CUDA_QUANT_CVT_CUH
#define KVA_CUDA_QUANT_CVT_CUH

#include "mma_ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

#endif /* KVA_CUDA_QUANT_CVT_CUH */
