/*
 * quant_exact.cuh - device conversions bit-identical to the host's
 * (src/core/dtype.c, src/cache/quant.c), shared by the quantizing cache
 * writers (cache_quant.cu, cache_ds_mla.cu): source loads that keep the
 * host's NaN bits, int8 rne with clamp, the integer f32 -> fp8 e4m3
 * conversion, and f16 / bf16 rounding.
 */
#ifndef KVA_CUDA_QUANT_EXACT_CUH
#define KVA_CUDA_QUANT_EXACT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* ---- conversions, bit-identical to src/core/dtype.c and src/cache/quant.c ---- */

static __device__ __forceinline__ float ld(const float *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ float ld(const __half *p, int64_t i)
{
    /* NaN through the host's bits (sign and payload), not the hardware's canonical NaN. */
    const uint32_t h = __half_as_ushort(p[i]);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
        return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
    return __half2float(p[i]);
}
static __device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}

/* rne(clamp(y, -128, 127)); y is not NaN (checked before). */
static __device__ __forceinline__ int8_t to_i8(float y)
{
    y = fminf(fmaxf(y, -128.0f), 127.0f);
    return (int8_t)__float2int_rn(y);
}

/* kva_f32_to_fp8_e4m3: integer round-to-nearest-even, saturating, NaN kept. */
static __device__ __forceinline__ uint8_t to_fp8(float x)
{
    const uint32_t u = __float_as_uint(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u)
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) {
        if (a <= 0x3a800000u)
            return (uint8_t)sign;
        const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 141u - e;
        uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint8_t)(sign | q);
    }
    const uint32_t r = a - (120u << 23);
    const uint32_t rem = r & 0xfffffu;
    uint32_t q = r >> 20;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1u)))
        q++;
    return (uint8_t)(sign | q);
}

/* kva_f32_to_f16 / kva_f32_to_bf16: RNE; NaN keeps its sign and payload bits. */
static __device__ __forceinline__ uint16_t to_f16(float x)
{
    const uint32_t u = __float_as_uint(x), a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7c00u | 0x200u | ((a >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(x));
}
static __device__ __forceinline__ uint16_t to_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif /* KVA_CUDA_QUANT_EXACT_CUH */
