/*
 * cuda_ctx.cu - the CUDA backend's context state and operation tables
 * (C-style CUDA): context creation and teardown, device allocations, the
 * kvattn_cuda.h stream calls, the run-path entries (which check that the
 * plan is the context's latest upload), and the backend and memory tables.
 *
 * A context holds its stream, the device metadata buffer with its pinned
 * staging twin (cuda_backend.h), and the device workspace for split-KV
 * partials; the plan builder that fills them is cuda_plan.cu.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_run.h"
#include "mla_sparse.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "cuda_ctx.h"

#include <stdlib.h>
#include <string.h>

extern "C" kva_status kva__cuda_context_init(kva_context *ctx)
{
    KVA_TRY(use_device(ctx->device_id));
    kva__cuda_state *st = (kva__cuda_state *)calloc(1, sizeof *st);
    if (!st)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_context_create: out of memory");
    st->device = ctx->device_id;
    st->upload_min = KVA__CUDA_UPLOAD_MIN;
    st->staging_hot = KVA__CUDA_STAGING_HOT;
    cudaError_t e =
        cudaDeviceGetAttribute(&st->num_sms, cudaDevAttrMultiProcessorCount, st->device);
    st->ring = (kva__cuda_ring *)calloc(KVA__CUDA_RINGS, sizeof *st->ring);
    if (!st->ring) {
        free(st);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_context_create: out of memory");
    }
    cudaEvent_t ev[2 * KVA__CUDA_RINGS] = {NULL};
    int made = 0;
    for (; made < 2 * KVA__CUDA_RINGS && e == cudaSuccess; made++)
        e = cudaEventCreateWithFlags(&ev[made], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        for (int i = 0; i < made; i++)
            if (ev[i])
                cudaEventDestroy(ev[i]);
        free(st->ring);
        free(st);
        return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_context_create: device %d: %s",
                         (int)ctx->device_id, cudaGetErrorString(e));
    }
    for (int i = 0; i < 2 * KVA__CUDA_RINGS; i++)
        st->ring[i / 2].events[i % 2] = ev[i];
    ctx->state = st;
    return KVA_STATUS_OK;
}

extern "C" void kva__cuda_context_free(kva_context *ctx)
{
    kva__cuda_state *st = state_of(ctx);
    if (!st)
        return;
    (void)use_device(st->device);
    /* Work still queued may read these buffers; after a move onto a capturing
     * stream (drain_deferred), copies on the streams before it may still read
     * the pinned staging. */
    if (st->drain_deferred)
        (void)cudaDeviceSynchronize();
    else
        (void)cudaStreamSynchronize(STREAM(st));
    cudaFree(st->meta_dev);
    cudaFreeHost(st->meta_host);
    cudaFreeHost(st->stage_big);
    for (int i = 0; i < 2 * KVA__CUDA_RINGS; i++)
        cudaEventDestroy((cudaEvent_t)st->ring[i / 2].events[i % 2]);
    free(st->ring);
    free(st);
    ctx->state = NULL;
}

/* The memory table's workspace_free: called after kva__cuda_context_free,
 * whose stream synchronize left no work reading the workspace. */
static void workspace_free(kva_context *ctx)
{
    if (ctx->workspace) {
        (void)use_device(ctx->device_id);
        cudaFree(ctx->workspace);
    }
    ctx->workspace = NULL;
    ctx->workspace_bytes = 0;
}

extern "C" kva_status kva__cuda_alloc(const kva_context *ctx, size_t bytes, void **out)
{
    *out = NULL;
    KVA_TRY(use_device(ctx->device_id));
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_cache_create: cudaMalloc of %zu bytes on device %d failed: %s", bytes,
                         (int)ctx->device_id, cudaGetErrorString(e));
    }
    return KVA_STATUS_OK;
}

extern "C" void kva__cuda_free(int32_t device_id, void *p)
{
    if (!p)
        return;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != device_id)
        (void)cudaSetDevice(device_id);
    cudaFree(p);
}

/* ---- kvattn_cuda.h ---- */

extern "C" kva_status kva__cuda_check_ctx(const char *fn, const kva_context *ctx)
{
    if (!ctx)
        return kva__fail(KVA_STATUS_NULL_POINTER, "%s: argument 'ctx' is NULL", fn);
    if (ctx->backend != KVA_BACKEND_CUDA || !ctx->state)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: ctx backend is '%s', not 'cuda'", fn,
                         kva_backend_name(ctx->backend));
    return KVA_STATUS_OK;
}

extern "C" kva_status kva_cuda_context_set_stream(kva_context *ctx, void *stream)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    kva__cuda_state *st = state_of(ctx);
    /* A later upload must not overwrite staging an earlier stream still reads:
     * drain the rings now, or, when the new stream is capturing a graph (a
     * host wait or an event on the old stream would end the capture), at the
     * next drain or upload. The legacy stream cannot capture. */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (stream)
        KVA_CUDA_TRY(cudaStreamIsCapturing((cudaStream_t)stream, &cs));
    if (cs == cudaStreamCaptureStatusActive)
        st->drain_deferred = 1;
    else
        KVA_TRY(kva__cuda_upload_drain(st));
    st->stream = stream;
    /* A cascade plan's prefix pass runs on the auxiliary context (plan/cascade.c,
     * which moves it only when it plans): it follows, or a run after this call
     * (a capture on the new stream among them) would launch it on the old one. */
    if (ctx->aux)
        return kva_cuda_context_set_stream(ctx->aux, stream);
    return KVA_STATUS_OK;
}

extern "C" kva_status kva_cuda_context_set_deferred_write_status(kva_context *ctx, int deferred)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (deferred != 0 && deferred != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: deferred = %d, must be 0 or 1", __func__,
                         deferred);
    state_of(ctx)->deferred_write_status = deferred;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva_cuda_context_get_stream(const kva_context *ctx, void **out)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    KVA_CHECK_PTR(out);
    *out = state_of(ctx)->stream;
    return KVA_STATUS_OK;
}

/* The run path's plan check: the plan must be the context's latest upload. */
static kva_status check_current(const char *fn, const kva_context *ctx, const kva_plan *plan)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva__cuda_state *st = state_of(ctx);
    if (!cp || cp->generation != st->generation)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: plan is stale: a newer kva_plan_create on this CUDA context owns "
                         "its device metadata (plan generation %llu, context generation %llu)",
                         fn, (unsigned long long)(cp ? cp->generation : 0),
                         (unsigned long long)st->generation);
    return KVA_STATUS_OK;
}

static kva_status cuda_attention_paged(kva_context *ctx, const kva_plan *plan, const void *q,
                                       const kva_cache *cache, const float *sinks, void *out,
                                       float *lse)
{
    KVA_TRY(check_current("kva_attention_run", ctx, plan));
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    const kva__cuda_mla_plan *mp = ((const kva__cuda_plan *)plan->device)->mla;
    if (mp && mp->Tp > 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: this MLA plan has mla head sizes and %d request "
                         "token(s) above decode_threshold = %d, which the CUDA backend runs only "
                         "in kva_mla_run (its partition leaves them out); plan the kernel-level "
                         "call with mla head sizes 0",
                         (int)mp->Tp, (int)plan->d.decode_threshold);
    return kva__cuda_attention(ctx, plan, q, cache, NULL, NULL, sinks, out, lse);
}

/* kva_mla_run: the plan must be the context's latest, the cache on its device. */
static kva_status cuda_mla_run(kva_context *ctx, const kva_plan *plan, const void *q,
                               const void *w_uk, const void *w_uv, const kva_cache *cache,
                               void *out, float *lse)
{
    KVA_TRY(check_current("kva_mla_run", ctx, plan));
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    return kva__cuda_mla_run(ctx, plan, q, w_uk, w_uv, cache, out, lse);
}

/* kva_mla_sparse_run: the plan must be the context's latest, the cache on its device. */
static kva_status cuda_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                                  const kva_cache *cache, const int32_t *indices,
                                  int64_t indices_stride, const int32_t *topk_length,
                                  const float *sinks, void *out, float *lse)
{
    KVA_TRY(check_current("kva_mla_sparse_run", ctx, plan));
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_sparse_run: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    return kva__cuda_mla_sparse(ctx, plan, q, cache, indices, indices_stride, topk_length, sinks,
                                out, lse);
}

static kva_status cuda_attention_ragged(kva_context *ctx, const kva_plan *plan, const void *q,
                                        const void *k, const void *v, const float *sinks, void *out,
                                        float *lse)
{
    KVA_TRY(check_current("kva_attention_run_ragged", ctx, plan));
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    if (cp->num_prefills > 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run_ragged: the plan has a block_table, so its %d "
                         "prefill(s) run in the paged tensor-core kernel; build plans for ragged "
                         "K/V with block_table = NULL",
                         (int)cp->num_prefills);
    return kva__cuda_attention(ctx, plan, q, NULL, k, v, sinks, out, lse);
}

/* Device memory of the context's device (positional: C++17 has no
 * designated initializers; fields in kva__memory_ops order). */
static const kva__memory_ops cuda_memory = {
    "cuda device",               /* name */
    0,                           /* host */
    1,                           /* per_device */
    kva__cuda_workspace_reserve, /* workspace_reserve (cuda_meta.cu) */
    workspace_free,              /* workspace_free */
    kva__cuda_cache_alloc,       /* cache_alloc (cache_ops.cu) */
    kva__cuda_cache_free,        /* cache_free */
    kva__cuda_cache_write,       /* cache_write */
    kva__cuda_copy_blocks,       /* copy_blocks */
    kva__cuda_cache_read, /* cache_read (cache_ds_mla.cu; index-key caches: index_cache.cu) */
};

extern "C" const kva__backend_ops kva__cuda_ops = {
    "cuda",
    kva__cuda_plan_build, /* cuda_plan.cu */
    kva__cuda_plan_release,
    cuda_attention_paged,
    cuda_attention_ragged,
    kva__cuda_merge_states,
    kva__cuda_kernels,
    KVA__CUDA_KERNELS,
    576, /* max_head_dim: MLA's latent rows (D 576, Dv 512); the MHA kernels' tiles
            and shared memory stop at D, Dv = 256 (kva__cuda_plan_build, cache_alloc) */
    1,   /* max_threads */
    kva__cuda_device_count,
    kva__cuda_context_init,
    kva__cuda_context_free,
    &cuda_memory,
    kva__cuda_merge_states_n,
    cuda_attention_paged,     /* mla_attention_paged: the plan chose an MLA kernel (plan_kernels) */
    cuda_mla_run,             /* mla_run: mla_run.cu */
    kva__cuda_cascade_cost,   /* cascade_cost (cascade.cu) */
    kva__cuda_cascade_follow, /* cascade_follow */
    kva__cuda_cascade_upload, /* cascade_upload */
    kva__cuda_cascade_gather, /* cascade_gather */
    kva__cuda_cascade_merge,  /* cascade_merge */
    cuda_mla_sparse,          /* mla_sparse (mla_sparse.cu) */
    kva__cuda_indexer,        /* indexer (indexer.cu) */
    kva__cuda_plan_recycle,   /* plan_recycle (cuda_plan.cu) */
};
