/*
 * elem_io.cuh - one element of an f32, f16 or bf16 array as a float, and a
 * float into one (round to nearest even): the merges (lse_merge.cuh) and the
 * cache copies (cache_ops.cu).
 */
#ifndef KVA_CUDA_ELEM_IO_CUH
#define KVA_CUDA_ELEM_IO_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ float load_f(const float *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ float load_f(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
static __device__ __forceinline__ float load_f(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void store_f(float *p, int64_t i, float x)
{
    p[i] = x;
}
static __device__ __forceinline__ void store_f(__half *p, int64_t i, float x)
{
    p[i] = __float2half_rn(x);
}
static __device__ __forceinline__ void store_f(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

#endif /* KVA_CUDA_ELEM_IO_CUH */
