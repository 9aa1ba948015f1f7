/*
 * indexer_qquant.cu - the lightning indexer's FP8-q mode
 * (kva_plan_desc.index_q_quant = FP8_TOKEN) on CUDA: each (token, head)
 * row of q quantized as an FP8_TOKEN key row is written, before the logits
 * kernels of indexer.cu / indexer_wgmma.cu run on the result.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "indexer.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

static __device__ __forceinline__ float to_f(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
static __device__ __forceinline__ float to_f(__half x)
{
    return __half2float(x);
}

/* kva_plan_desc.index_q_quant = FP8_TOKEN: one warp per (token, head) row of
 * q [rows = T Hi, D] quantizes it as the FP8_TOKEN key rows are written
 * (indexer.cuh); qc [rows, D] gets the e4m3 codes (E8: for the e4m3 wgmma
 * kernel) or their values in the q dtype (exact: for the 16-bit kernels),
 * wq [rows] = wts * s (w relu(s x) = w s relu(x), s > 0). */
template <typename M, bool E8>
__global__ void __launch_bounds__(128)
    index_qquant_kernel(const typename M::elem *q, const float *wts, int64_t rows, int32_t D,
                        void *qc, float *wq)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    const typename M::elem *src = q + row * D;
    float amax = 0.0f;
    for (int32_t i = lane; i < D; i += 32) {
        const float a = fabsf(to_f(src[i]));
        amax = a > amax ? a : amax; /* NaN is left out */
    }
    const float s = kva__fp8_token_scale_warp(amax);
    for (int32_t i = lane; i < D; i += 32) {
        const unsigned char c = kva__fp8_token_code(to_f(src[i]), s);
        if (E8) {
            ((unsigned char *)qc)[row * D + i] = c;
        } else {
            const __half h(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3));
            M::store((typename M::elem *)qc + row * D + i, __half2float(h));
        }
    }
    if (lane == 0)
        wq[row] = wts[row] * s;
}

/* Launches index_qquant_kernel on s: e4m3 codes (e8) or their values. */
template <typename M>
static void launch(int e8, const void *q, const float *wts, int64_t rows, int32_t D, void *qc,
                   float *wq, cudaStream_t s)
{
    const unsigned grid = (unsigned)((rows + 3) / 4);
    const typename M::elem *qe = (const typename M::elem *)q;
    if (e8)
        index_qquant_kernel<M, true><<<grid, 128, 0, s>>>(qe, wts, rows, D, qc, wq);
    else
        index_qquant_kernel<M, false><<<grid, 128, 0, s>>>(qe, wts, rows, D, qc, wq);
}

void kva__cuda_index_qquant(kva_dtype q_dtype, int e8, const void *q, const float *wts,
                            int64_t rows, int32_t D, void *qc, float *wq, cudaStream_t s)
{
    if (q_dtype == KVA_DTYPE_BF16)
        launch<kva__mma_bf16>(e8, q, wts, rows, D, qc, wq, s);
    else
        launch<kva__mma_f16>(e8, q, wts, rows, D, qc, wq, s);
}
