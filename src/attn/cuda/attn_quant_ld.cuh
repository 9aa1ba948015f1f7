/*
 * attn_quant_ld.cuh - loads and in-register conversions of attn_quant.cu
 * (included by it only; templates and device functions, hence a header):
 * chunks of CB bytes read with one 16- or 8-byte load, int8 / fp8 codes and
 * f16 / bf16 values turned into floats, q loads and out stores in the plan's
 * dtype.
 */
#ifndef KVA_ATTN_QUANT_LD_CUH
#define KVA_ATTN_QUANT_LD_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* Storage formats as the kernel is instantiated: K codes / V elements. */
enum { QF_I8 = 0, QF_FP8 = 1, QF_I8_F16 = 2, QF_I8_BF16 = 3 };

/* ---- loads and conversions ---- */

template <int CB> struct chunk {
    uint32_t w[CB / 4];
};

template <int CB> __device__ __forceinline__ chunk<CB> ldc(const uint8_t *p)
{
    chunk<CB> c;
    if constexpr (CB == 16) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
        c.w[0] = u.x, c.w[1] = u.y, c.w[2] = u.z, c.w[3] = u.w;
    } else {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));
        c.w[0] = u.x, c.w[1] = u.y;
    }
    return c;
}

template <int CB> __device__ __forceinline__ void zero(chunk<CB> &c)
{
#pragma unroll
    for (int i = 0; i < CB / 4; i++)
        c.w[i] = 0u;
}

/* 4 int8 codes of w as floats (exact): 2^23 + (c ^ 0x80) - (2^23 + 128). */
__device__ __forceinline__ void i8x4(uint32_t w, float *f)
{
    const uint32_t x = w ^ 0x80808080u;
    f[0] = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7440)) - 8388736.0f;
    f[1] = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7441)) - 8388736.0f;
    f[2] = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7442)) - 8388736.0f;
    f[3] = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7443)) - 8388736.0f;
}

/* 4 fp8 e4m3 codes of w as floats (exact; NaN codes give NaN). */
__device__ __forceinline__ void fp8x4(uint32_t w, float *f)
{
    const __half2_raw lo =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

/* 2 f16 / bf16 values of w as floats. */
__device__ __forceinline__ void f16x2(uint32_t w, float *f)
{
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    f[0] = a.x, f[1] = a.y;
}
__device__ __forceinline__ void bf16x2(uint32_t w, float *f)
{
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
}

/* The codes of a K chunk (CB 1-byte codes) as floats. */
template <int FMT, int CB> __device__ __forceinline__ void deq_k(const chunk<CB> &c, float *f)
{
#pragma unroll
    for (int i = 0; i < CB / 4; i++) {
        if constexpr (FMT == QF_FP8)
            fp8x4(c.w[i], f + 4 * i);
        else
            i8x4(c.w[i], f + 4 * i);
    }
}

/* The elements of a V chunk (CB bytes: CB codes or CB/2 16-bit values). */
template <int FMT, int CB> __device__ __forceinline__ void deq_v(const chunk<CB> &c, float *f)
{
#pragma unroll
    for (int i = 0; i < CB / 4; i++) {
        if constexpr (FMT == QF_FP8)
            fp8x4(c.w[i], f + 4 * i);
        else if constexpr (FMT == QF_I8)
            i8x4(c.w[i], f + 4 * i);
        else if constexpr (FMT == QF_I8_F16)
            f16x2(c.w[i], f + 2 * i);
        else
            bf16x2(c.w[i], f + 2 * i);
    }
}

__device__ __forceinline__ float load_q(const void *p, int qdt, int64_t i)
{
    if (qdt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    if (qdt == KVA_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

__device__ __forceinline__ void store_out(void *p, int qdt, int64_t i, float x)
{
    if (qdt == KVA_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (qdt == KVA_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

#endif /* KVA_ATTN_QUANT_LD_CUH */
