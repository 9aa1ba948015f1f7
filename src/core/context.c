/* context.c - backend choice, thread count and workspace of a kva_context. */
#include "internal.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

const char *kva_backend_name(kva_backend backend)
{
    switch (backend) {
    case KVA_BACKEND_REF:
        return "ref";
    case KVA_BACKEND_CPU:
        return "cpu";
    case KVA_BACKEND_CUDA:
        return "cuda";
    default:
        return "invalid";
    }
}

int kva_backend_available(kva_backend backend)
{
    switch (backend) {
    case KVA_BACKEND_REF:
    case KVA_BACKEND_CPU:
        return 1;
    case KVA_BACKEND_CUDA:
        /* Compiled in (no_cuda.c reports 0 devices otherwise) and a GPU is visible. */
        return kva__cuda_device_count() > 0;
    default:
        return 0;
    }
}

static int32_t available_cores(void)
{
#ifdef _OPENMP
    return (int32_t)omp_get_num_procs();
#else
    return 1;
#endif
}

kva_status kva_context_create(const kva_context_desc *desc, kva_context **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(out);
    kva_context_desc d = {KVA_BACKEND_CPU, 0, 0};
    if (desc)
        d = *desc;
    if ((unsigned)d.backend >= (unsigned)KVA_BACKEND_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_context_create: backend %d is not a kva_backend", (int)d.backend);
    if (!kva_backend_available(d.backend))
        return kva__fail(
            KVA_STATUS_BACKEND_UNAVAILABLE,
            "kva_context_create: backend '%s' is not available in this build or on this machine",
            kva_backend_name(d.backend));
    if (d.num_threads < 0 || d.num_threads > KVA_MAX_THREADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_context_create: num_threads = %d is outside [0, %d]",
                         (int)d.num_threads, KVA_MAX_THREADS);
    if (d.backend == KVA_BACKEND_CUDA &&
        (d.device_id < 0 || d.device_id >= kva__cuda_device_count()))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_context_create: device_id = %d is outside [0, %d) (visible CUDA "
                         "devices)",
                         (int)d.device_id, kva__cuda_device_count());
    kva_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_context_create: out of memory");
    ctx->backend = d.backend;
    ctx->device_id = d.device_id;
    ctx->num_threads = d.backend == KVA_BACKEND_REF ? 1
                       : d.num_threads > 0          ? d.num_threads
                                                    : available_cores();
    ctx->ops = d.backend == KVA_BACKEND_REF    ? &kva__ref_ops
               : d.backend == KVA_BACKEND_CUDA ? &kva__cuda_ops
                                               : &kva__cpu_ops;
    if (d.backend == KVA_BACKEND_CUDA) {
        ctx->num_threads = 1;
        kva_status st = kva__cuda_context_init(ctx);
        if (st != KVA_STATUS_OK) {
            free(ctx);
            return st;
        }
    }
    kva__cpu_features_get(&ctx->cpu_features); /* once: cpuid traps on a VM (~30 us) */
    *out = ctx;
    return KVA_STATUS_OK;
}

void kva_context_destroy(kva_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->backend == KVA_BACKEND_CUDA) {
        kva__cuda_context_free(ctx); /* frees the device workspace too */
        ctx->workspace = NULL;
    }
    free(ctx->workspace);
    free(ctx);
}

kva_backend kva_context_backend(const kva_context *ctx)
{
    return ctx ? ctx->backend : KVA_BACKEND_COUNT_;
}

int32_t kva_context_num_threads(const kva_context *ctx)
{
    return ctx ? ctx->num_threads : 0;
}

kva_status kva__context_reserve_workspace(kva_context *ctx, size_t bytes)
{
    if (bytes <= ctx->workspace_bytes)
        return KVA_STATUS_OK;
    /* 64-byte alignment for SIMD loads; round the size up to match. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "workspace: cannot allocate %zu bytes", rounded);
    free(ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_bytes = rounded;
    return KVA_STATUS_OK;
}
