/* context.c - backend choice, thread count and workspace of a kva_context. */
#include "internal.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* The backend list: one line per backend, in kva_backend order. A backend
 * not compiled in has a table that sees no device, so that
 * kva_backend_available says 0 (src/attn/cuda/no_cuda.c). */
static const kva__backend_ops *const kva__backends[KVA_BACKEND_COUNT_] = {
    [KVA_BACKEND_REF] = &kva__ref_ops,
    [KVA_BACKEND_CPU] = &kva__cpu_ops,
    [KVA_BACKEND_CUDA] = &kva__cuda_ops,
};

const kva__backend_ops *kva__backend(kva_backend b)
{
    return kva__backends[b];
}

const char *kva_backend_name(kva_backend backend)
{
    if ((unsigned)backend >= (unsigned)KVA_BACKEND_COUNT_)
        return "invalid";
    return kva__backends[backend]->name;
}

int kva__backend_device_count(kva_backend b)
{
    if ((unsigned)b >= (unsigned)KVA_BACKEND_COUNT_ || !kva__backends[b]->device_count)
        return 0;
    return kva__backends[b]->device_count();
}

int kva_backend_available(kva_backend backend)
{
    if ((unsigned)backend >= (unsigned)KVA_BACKEND_COUNT_)
        return 0;
    /* A host backend always runs; a device backend needs a visible device
     * (its stub table reports none when it is not compiled in). */
    return !kva__backends[backend]->device_count || kva__backend_device_count(backend) > 0;
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
    const kva__backend_ops *ops = kva__backends[d.backend];
    const int devices = kva__backend_device_count(d.backend);
    if (ops->device_count && (d.device_id < 0 || d.device_id >= devices))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_context_create: device_id = %d is outside [0, %d) (visible %s "
                         "devices)",
                         (int)d.device_id, devices, ops->name);
    kva_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_context_create: out of memory");
    ctx->backend = d.backend;
    ctx->ops = ops;
    ctx->device_id = ops->device_count ? d.device_id : 0;
    ctx->num_threads = ops->max_threads > 0 ? ops->max_threads
                       : d.num_threads > 0  ? d.num_threads
                                            : available_cores();
    if (ops->context_init) {
        kva_status st = ops->context_init(ctx);
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
    kva_context_destroy(ctx->aux);
    if (ctx->ops->context_free)
        ctx->ops->context_free(ctx); /* first: queued work may still read the workspace */
    ctx->ops->memory->workspace_free(ctx);
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
    return ctx->ops->memory->workspace_reserve(ctx, bytes);
}

kva_status kva__head_dim_check(const char *fn, const kva_context *ctx, const char *what, int32_t d)
{
    const int32_t max = ctx->ops->max_head_dim > 0 ? ctx->ops->max_head_dim : KVA_MAX_HEAD_DIM;
    if (d > max)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: %s = %d is not supported by the %s backend (its kernels take head "
                         "sizes up to %d)",
                         fn, what, (int)d, ctx->ops->name, (int)max);
    return KVA_STATUS_OK;
}

kva_status kva__host_workspace_reserve(kva_context *ctx, size_t bytes)
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

void kva__host_workspace_free(kva_context *ctx)
{
    free(ctx->workspace);
    ctx->workspace = NULL;
    ctx->workspace_bytes = 0;
}
