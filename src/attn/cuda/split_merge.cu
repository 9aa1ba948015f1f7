/*
 * split_merge.cu - the second pass of a run whose plan split some work items
 * into key chunks: merges every split task's partials (LSE-weighted), adds the
 * sink and writes out / lse. One kernel for every decode kernel (decode_mma*,
 * attn_simt, attn_quant): they all write partials in the same layout.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ void store_out(float *p, int64_t i, float x)
{
    p[i] = x;
}
static __device__ __forceinline__ void store_out(__half *p, int64_t i, float x)
{
    p[i] = __float2half_rn(x);
}
static __device__ __forceinline__ void store_out(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

/* Task t's partials at ws + t.ws_off: num_splits blocks of [nq * nh, Dv]
 * outputs then [nq * nh] lse (natural log). out [T, H, Dv] in T's type, lse
 * [T, H] or NULL; sinks [H] or NULL. One CTA per task at a time. A NaN lse in
 * any split makes the row NaN. */
template <typename T>
__global__ void __launch_bounds__(256)
    split_merge_kernel(kva__cuda_meta meta, const float *ws, const float *sinks, T *out, float *lse,
                       int32_t H, int32_t G, int32_t Dv)
{
    const int32_t n_tasks = meta.hdr[KVA_CUDA_HDR_TASKS];
    for (int32_t ti = blockIdx.x; ti < n_tasks; ti += gridDim.x) {
        const kva__cuda_task t = meta.tasks[ti];
        const int32_t nrows = t.nq * t.nh;
        const int64_t blk = (int64_t)nrows * (Dv + 1);
        const float *base = ws + t.ws_off;
        const int32_t qs = meta.qsl[t.req];
        for (int32_t x = threadIdx.x; x < nrows * Dv; x += blockDim.x) {
            const int32_t r = x / Dv, d = x - r * Dv;
            const int32_t qi = r / t.nh, hh = r - qi * t.nh;
            const int32_t head = t.kv_head * G + t.h0 + hh;
            const int64_t tok = qs + t.i0 + qi;
            float M = sinks ? sinks[head] : -INFINITY;
            int nan = 0;
            for (int32_t sp = 0; sp < t.num_splits; sp++) {
                const float ls = base[sp * blk + (int64_t)nrows * Dv + r];
                nan |= ls != ls;
                M = fmaxf(M, ls);
            }
            const float mu = M == -INFINITY ? 0.f : M;
            float L = sinks ? expf(sinks[head] - mu) : 0.f, O = 0.f;
            for (int32_t sp = 0; sp < t.num_splits; sp++) {
                const float c = expf(base[sp * blk + (int64_t)nrows * Dv + r] - mu);
                L += c;
                O += c * base[sp * blk + (int64_t)r * Dv + d];
            }
            float o = L > 0.f ? O / L : 0.f;
            float lv = L > 0.f ? mu + logf(L) : -INFINITY;
            if (nan) {
                o = NAN;
                lv = NAN;
            }
            store_out(out, (tok * H + head) * Dv + d, o);
            if (lse && d == 0)
                lse[tok * H + head] = lv;
        }
    }
}

extern "C" kva_status kva__cuda_split_merge_launch(const kva__cuda_meta *meta, const float *ws,
                                                   const float *sinks, void *out, float *lse,
                                                   int32_t H, int32_t G, int32_t Dv,
                                                   kva_dtype dtype, int grid, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (dtype == KVA_DTYPE_F32)
        split_merge_kernel<float>
            <<<grid, 256, 0, s>>>(*meta, ws, sinks, (float *)out, lse, H, G, Dv);
    else if (dtype == KVA_DTYPE_F16)
        split_merge_kernel<__half>
            <<<grid, 256, 0, s>>>(*meta, ws, sinks, (__half *)out, lse, H, G, Dv);
    else
        split_merge_kernel<__nv_bfloat16>
            <<<grid, 256, 0, s>>>(*meta, ws, sinks, (__nv_bfloat16 *)out, lse, H, G, Dv);
    KVA_CUDA_LAUNCHED("split_merge_kernel");
    return KVA_STATUS_OK;
}
