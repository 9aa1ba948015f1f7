/*
 * cascade.cu - the CUDA backend's part of cascade (shared-prefix) plans
 * (kva__cascade in src/core/internal.h, the run in src/attn/cascade.c):
 *   cascade_cost: the plan's cost model rates for this device;
 *   cascade_follow: the aux context runs on the context's stream, so both
 *     passes and the index passes are ordered (and captured) together;
 *   cascade_upload: the index arrays (gather [M], merge [L, T]) into aux's
 *     workspace at off_idx, at plan time;
 *   gather_kernel: q_pref [C, M, H, D] = q rows gather[i], C copies.
 * The merge of out/lse row (t, h) in place with its C prefix rows of one
 * level runs in split_merge.cu (kva__cuda_cascade_merge: merge_rows_kernel,
 * launched once per level of nested groups).
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
    KVA_TRY(kva__cuda_upload_drain(a));
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
