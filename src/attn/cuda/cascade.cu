/*
 * cascade.cu - the CUDA backend's part of cascade (shared-prefix) plans
 * (kva__cascade in src/core/internal.h, the run in src/attn/cascade.c):
 *   cascade_cost: the plan's cost model rates for this device;
 *   cascade_follow: the aux context runs on the context's stream, so both
 *     passes and the index passes are ordered (and captured) together;
 *   cascade_upload: the index arrays (gather [M], merge [L, T]) into aux's
 *     workspace at off_idx, at plan time;
 *   gather_kernel: q_pref [C, M, H, D] = q rows gather[i], C copies;
 *   merge_kernel: out/lse row (t, h) merged in place with its C prefix rows
 *     of one level (launched once per level of nested groups).
 * The two passes between them are ordinary plans: the prefix plan's
 * virtual requests (many rows over long keys) run on the tensor-core prefill
 * tiles, the suffix plan's decodes on the decode kernels.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

static kva__cuda_state *state_of(const kva_context *ctx)
{
    return (kva__cuda_state *)ctx->state;
}

/* Rough rates of an H100-class part: HBM read bandwidth; plain decodes that
 * re-read a shared prefix find much of it in L2 (FlashInfer's non-cascade
 * decode of 128 requests over a shared 32k prefix reads at ~3x HBM rate);
 * tensor-core decode vs prefill flop rates; three extra launches. */
extern "C" kva_status kva__cuda_cascade_cost(const kva_context *ctx, kva__cascade_cost *out)
{
    out->read_bw = 3.0e12;
    out->reread_bw = 9.0e12;
    out->reread_max = 0.0; /* concurrent CTAs share the reads whatever the prefix size */
    out->decode_flops = 1.5e14;
    out->prefix_flops = 3.0e14;
    out->fixed_s = 12e-6;
    out->units = 2 * state_of(ctx)->num_sms;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_cascade_follow(kva_context *aux, const kva_context *ctx)
{
    kva__cuda_state *a = state_of(aux);
    const void *stream = state_of(ctx)->stream;
    if (a->stream == stream)
        return KVA_STATUS_OK;
    /* As kva_cuda_context_set_stream: no upload may still read the staging. */
    if (a->upload_pending)
        KVA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)a->upload_event));
    a->upload_pending = 0;
    a->stream = (void *)stream;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_cascade_upload(kva_context *ctx, const kva_plan *plan)
{
    const kva__cascade *c = plan->cascade;
    cudaStream_t s = (cudaStream_t)state_of(ctx)->stream;
    char *idx = (char *)c->aux->workspace + c->off_idx;
    const size_t gb = (size_t)c->rows * sizeof(int32_t);
    const size_t mb = (size_t)c->num_levels * plan->info.num_tokens * sizeof(int32_t);
    /* Earlier runs on the stream may still read the indices of a previous
     * cascade plan: the copies queue behind them; pageable sources complete
     * before cudaMemcpyAsync returns, and the stream is drained so the plan
     * is ready when kva_plan_create returns, as every CUDA plan is. */
    KVA_CUDA_TRY(cudaMemcpyAsync(idx, c->gather, gb, cudaMemcpyHostToDevice, s));
    KVA_CUDA_TRY(cudaMemcpyAsync(idx + gb, c->merge, mb, cudaMemcpyHostToDevice, s));
    KVA_CUDA_TRY(cudaStreamSynchronize(s));
    return KVA_STATUS_OK;
}

/* Copies rows of `words` U units: dst row i = src row gather[i % M]. */
template <typename U>
__global__ void __launch_bounds__(128) gather_kernel(const U *src, U *dst, const int32_t *gather,
                                                     int32_t M, int64_t n_rows, int64_t words)
{
    for (int64_t i = blockIdx.x; i < n_rows; i += gridDim.x) {
        const U *s = src + (int64_t)gather[i % M] * words;
        U *d = dst + i * words;
        for (int64_t w = threadIdx.x; w < words; w += blockDim.x)
            d[w] = s[w];
    }
}

extern "C" kva_status kva__cuda_cascade_gather(kva_context *ctx, const kva_plan *plan,
                                               const void *q, void *q_pref)
{
    const kva__cascade *c = plan->cascade;
    cudaStream_t s = (cudaStream_t)state_of(ctx)->stream;
    const int32_t *gather = (const int32_t *)((const char *)c->aux->workspace + c->off_idx);
    const int64_t n = (int64_t)c->num_chunks * c->rows;
    const size_t bytes =
        (size_t)plan->d.num_heads * plan->d.head_dim * kva_dtype_size(plan->d.q_dtype);
    const int grid = n < 65535 ? (int)n : 65535;
    if ((((uintptr_t)q | (uintptr_t)q_pref | bytes) & 15) == 0)
        gather_kernel<uint4><<<grid, 128, 0, s>>>((const uint4 *)q, (uint4 *)q_pref, gather,
                                                  c->rows, n, (int64_t)(bytes / 16));
    else
        gather_kernel<uint16_t><<<grid, 128, 0, s>>>((const uint16_t *)q, (uint16_t *)q_pref,
                                                     gather, c->rows, n, (int64_t)(bytes / 2));
    KVA_CUDA_LAUNCHED("cascade gather_kernel");
    return KVA_STATUS_OK;
}

static __device__ __forceinline__ float ld(const float *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ float ld(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
static __device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void st(float *p, int64_t i, float x)
{
    p[i] = x;
}
static __device__ __forceinline__ void st(__half *p, int64_t i, float x)
{
    p[i] = __float2half_rn(x);
}
static __device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

/* One warp per (token t, head h) row of [T, H] whose token is grouped
 * (merge[t] = m >= 0): parts are the C prefix rows (k * M + m, h) of
 * out_pref / lse_pref and the suffix row (t, h) of out / lse, which it
 * overwrites. As kva_merge_states_n: a part of weight 0 is not read, all
 * -inf gives 0 and -inf, a NaN lse a NaN row. Dv <= 256. */
template <typename T>
__global__ void __launch_bounds__(128)
    merge_kernel(const int32_t *merge, int32_t C, int32_t M, int32_t H, int32_t Dv,
                 const T *out_pref, const float *lse_pref, T *out, float *lse, int64_t rows)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); n < rows;
         n += warps) {
        const int64_t t = n / H, h = n % H;
        const int32_t m = merge[t];
        if (m < 0)
            continue;
        const float ls = lse[n];
        float mx = ls;
        bool nan = ls != ls;
        for (int32_t k = 0; k < C; k++) {
            const float l = lse_pref[((int64_t)k * M + m) * H + h];
            nan |= l != l;
            mx = l > mx ? l : mx;
        }
        __syncwarp();
        if (nan || mx == -INFINITY) {
            for (int32_t d = lane; d < Dv; d += 32)
                st(out, n * Dv + d, nan ? NAN : 0.f);
            if (lane == 0)
                lse[n] = nan ? NAN : -INFINITY;
            continue;
        }
        float acc[8], w = 0.f;
        const float ws = expf(ls - mx);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int32_t d = lane + 32 * i;
            acc[i] = ws > 0.f && d < Dv ? ws * ld(out, n * Dv + d) : 0.f;
        }
        w += ws;
        for (int32_t k = 0; k < C; k++) {
            const int64_t r = ((int64_t)k * M + m) * H + h;
            const float wk = expf(lse_pref[r] - mx);
            if (wk == 0.f)
                continue;
            w += wk;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int32_t d = lane + 32 * i;
                if (d < Dv)
                    acc[i] += wk * ld(out_pref, r * Dv + d);
            }
        }
        const float inv = 1.f / w;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int32_t d = lane + 32 * i;
            if (d < Dv)
                st(out, n * Dv + d, acc[i] * inv);
        }
        if (lane == 0)
            lse[n] = mx + logf(w);
    }
}

extern "C" kva_status kva__cuda_cascade_merge(kva_context *ctx, const kva_plan *plan, int32_t level,
                                              const void *out_pref, const float *lse_pref,
                                              void *out, float *lse)
{
    const kva__cascade *c = plan->cascade;
    cudaStream_t s = (cudaStream_t)state_of(ctx)->stream;
    /* The level's map: merge [L, T] follows gather [M]. */
    const int32_t *merge = (const int32_t *)((const char *)c->aux->workspace + c->off_idx) +
                           c->rows + (int64_t)level * plan->info.num_tokens;
    const int32_t H = plan->d.num_heads, Dv = plan->d.head_dim_v;
    const int64_t rows = (int64_t)plan->info.num_tokens * H;
    const int64_t ctas = (rows + 3) / 4;
    const int grid = ctas < 65535 ? (int)ctas : 65535;
    const int32_t C = c->num_chunks, M = c->rows;
    if (plan->d.q_dtype == KVA_DTYPE_F32)
        merge_kernel<float><<<grid, 128, 0, s>>>(merge, C, M, H, Dv, (const float *)out_pref,
                                                 lse_pref, (float *)out, lse, rows);
    else if (plan->d.q_dtype == KVA_DTYPE_F16)
        merge_kernel<__half><<<grid, 128, 0, s>>>(merge, C, M, H, Dv, (const __half *)out_pref,
                                                  lse_pref, (__half *)out, lse, rows);
    else
        merge_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(merge, C, M, H, Dv,
                                                         (const __nv_bfloat16 *)out_pref, lse_pref,
                                                         (__nv_bfloat16 *)out, lse, rows);
    KVA_CUDA_LAUNCHED("cascade merge_kernel");
    return KVA_STATUS_OK;
}
