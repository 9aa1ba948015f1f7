/*
 * cuda_ctx.h - what the CUDA backend's context (cuda_ctx.cu), its plan
 * builder (cuda_plan.cu) and its device metadata (cuda_meta.cu) share: the
 * context state's accessors, the plan-side entries of the backend and memory
 * tables and the metadata calls of the plan builds. CUDA C++ only (the
 * helpers call the runtime); include after cuda_backend.h and cuda_check.h.
 */
#ifndef KVA_CUDA_CTX_H
#define KVA_CUDA_CTX_H

#include <time.h>

#define STREAM(st) ((cudaStream_t)(st)->stream)

static inline kva__cuda_state *state_of(const kva_context *ctx)
{
    return (kva__cuda_state *)ctx->state;
}

/* Benchmarks: stamps phase i of a plan build when a probe is set
 * (kva__cuda_context_plan_probe). */
static inline void kva__cuda_probe(const kva__cuda_state *st, int i)
{
    if (st->probe) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        st->probe[i] = (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
    }
}

/* Makes the context's device current (cheap when it already is). */
static inline kva_status use_device(int device)
{
    int cur = -1;
    KVA_CUDA_TRY(cudaGetDevice(&cur));
    if (cur != device)
        KVA_CUDA_TRY(cudaSetDevice(device));
    return KVA_STATUS_OK;
}

/* cuda_plan.cu: kva__backend_ops.plan_build / plan_release, and the memory
 * table's workspace_reserve (grows the device workspace, refused during
 * graph capture). */
extern "C" kva_status kva__cuda_plan_build(kva_context *ctx, kva_plan *plan);
extern "C" void kva__cuda_plan_release(kva_plan *plan);
extern "C" void kva__cuda_plan_recycle(kva_plan *plan);
extern "C" kva_status kva__cuda_workspace_reserve(kva_context *ctx, size_t bytes);

/* cuda_meta.cu, for the plan builds: refuses (a status and message naming
 * fn) while the context's stream is capturing; grows the metadata buffers to
 * hold need (slack: an overflowing section at least doubles); fills a staging
 * slot with the plan's metadata (its partition part, the prefill-tile
 * requests mma_req or NULL) and enqueues the copies on the stream. */
kva_status kva__cuda_check_not_capturing(const char *fn, kva__cuda_state *st);
kva_status kva__cuda_reserve_meta(kva__cuda_state *st, const kva__cuda_caps *need, int slack);
kva_status kva__cuda_upload_plan(kva__cuda_state *st, const kva_plan *plan,
                                 const kva__partition *part, const uint8_t *mma_req);

#endif /* KVA_CUDA_CTX_H */
