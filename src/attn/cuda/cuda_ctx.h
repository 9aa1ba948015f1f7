/*
 * cuda_ctx.h - what the CUDA backend's context (cuda_ctx.cu) and its plan
 * builder (cuda_plan.cu) share: the context state's accessors and the
 * plan-side entries of the backend and memory tables. CUDA C++ only (the
 * helpers call the runtime); include after cuda_backend.h and cuda_check.h.
 */
#ifndef KVA_CUDA_CTX_H
#define KVA_CUDA_CTX_H

#define STREAM(st) ((cudaStream_t)(st)->stream)

static inline kva__cuda_state *state_of(const kva_context *ctx)
{
    return (kva__cuda_state *)ctx->state;
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

#endif /* KVA_CUDA_CTX_H */
