/*
 * dcp_nccl_agrs.cu - the device work of the NCCL combine's AG_RS mode
 * (dcp_nccl.c), compiled into kvattn_nccl:
 *   rescale: after the all-gather of the LSEs, each (token, head) row of this
 *     rank's partial is weighted by exp(lse_part - lse), lse = log sum_p
 *     exp(lse_p), and stored in float32 destination-major ([N][T][Hn][Dv]:
 *     block k holds the rows of rank k's heads), ready for ncclReduceScatter;
 *     the rows of this rank's own heads also give lse_out.
 *   convert: the reduced float32 rows [T*Hn*Dv] into the output dtype.
 * Row semantics are dcp_mpi.c's AG_RS and the N-way merge's: a row whose
 * weight is 0 is not read (its partial may hold anything), all ranks -inf
 * gives 0 and -inf, any NaN lse gives a NaN row and lse.
 */
#include "kvattn.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ float to_f<__half>(__half x)
{
    return __half2float(x);
}
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half from_f<__half>(float x)
{
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* One warp per row n = t * H + h of [T*H]. lses [N][T*H] (gathered),
 * lse_part [T*H], out_part [T*H][Dv]; send [N][T][Hn][Dv] float32; lse_out
 * [T][Hn] (or NULL) for the heads of rank `rank`. */
template <typename T>
__global__ void __launch_bounds__(128)
    agrs_rescale_kernel(int32_t N, int32_t Tn, int32_t H, int32_t Dv, int32_t rank,
                        const float *lses, const float *lse_part, const T *out_part, float *send,
                        float *lse_out)
{
    const int lane = threadIdx.x & 31;
    const int64_t rows = (int64_t)Tn * H;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    const int32_t Hn = H / N;
    for (int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); n < rows;
         n += warps) {
        float m = -INFINITY;
        bool nan = false;
        for (int32_t p = 0; p < N; p++) {
            const float l = lses[p * rows + n];
            nan |= l != l;
            m = l > m ? l : m;
        }
        float lse = -INFINITY, w = 0.f;
        if (nan) {
            lse = w = NAN;
        } else if (m != -INFINITY) {
            float sum = 0.f;
            for (int32_t p = 0; p < N; p++)
                sum += expf(lses[p * rows + n] - m);
            lse = m + logf(sum);
            w = expf(lse_part[n] - lse);
        }
        const int32_t t = (int32_t)(n / H), h = (int32_t)(n % H), k = h / Hn;
        float *dst = send + (((int64_t)k * Tn + t) * Hn + h % Hn) * Dv;
        const T *src = out_part + n * Dv;
        for (int32_t c = lane; c < Dv; c += 32)
            dst[c] = w == 0.f ? 0.f : w * to_f(src[c]);
        if (lse_out && lane == 0 && k == rank)
            lse_out[(int64_t)t * Hn + h % Hn] = lse;
    }
}

template <typename T> __global__ void agrs_convert_kernel(int64_t n, const float *src, T *dst)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f<T>(src[i]);
}

static int grid_of(int64_t work, int per_block)
{
    const int64_t g = (work + per_block - 1) / per_block;
    return g < 1 ? 1 : g > 65535 ? 65535 : (int)g;
}

/* The rescale for dtype F32, F16 or BF16 on stream s (shapes above). */
extern "C" cudaError_t kva__dcp_nccl_rescale(cudaStream_t s, kva_dtype dt, int32_t N, int32_t Tn,
                                             int32_t H, int32_t Dv, int32_t rank, const float *lses,
                                             const float *lse_part, const void *out_part,
                                             float *send, float *lse_out)
{
    const int grid = grid_of((int64_t)Tn * H, 4);
    if (dt == KVA_DTYPE_F32)
        agrs_rescale_kernel<float><<<grid, 128, 0, s>>>(N, Tn, H, Dv, rank, lses, lse_part,
                                                        (const float *)out_part, send, lse_out);
    else if (dt == KVA_DTYPE_F16)
        agrs_rescale_kernel<__half><<<grid, 128, 0, s>>>(N, Tn, H, Dv, rank, lses, lse_part,
                                                         (const __half *)out_part, send, lse_out);
    else
        agrs_rescale_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(
            N, Tn, H, Dv, rank, lses, lse_part, (const __nv_bfloat16 *)out_part, send, lse_out);
    return cudaGetLastError();
}

/* n float32 elements of src into dst in dtype F16 or BF16 on stream s. */
extern "C" cudaError_t kva__dcp_nccl_convert(cudaStream_t s, kva_dtype dt, int64_t n,
                                             const float *src, void *dst)
{
    const int grid = grid_of(n, 256);
    if (dt == KVA_DTYPE_F16)
        agrs_convert_kernel<__half><<<grid, 256, 0, s>>>(n, src, (__half *)dst);
    else
        agrs_convert_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(n, src, (__nv_bfloat16 *)dst);
    return cudaGetLastError();
}
