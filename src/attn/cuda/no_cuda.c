/* no_cuda.c - stands in for the CUDA sources when the build has no nvcc: a
 * backend table that sees no device, so kva_backend_available(KVA_BACKEND_CUDA)
 * is 0 and no CUDA context (hence no device cache or CUDA plan) can exist, and
 * whose context and memory entries report KVA_STATUS_BACKEND_UNAVAILABLE; plus the
 * kvattn_cuda.h entry points, which report the same. */
#include "internal.h"
#include "kvattn_cuda.h"

static kva_status unavailable(const char *fn)
{
    return kva__fail(KVA_STATUS_BACKEND_UNAVAILABLE, "%s: this build has no CUDA backend", fn);
}

/* ---- the backend table: no device, and every entry says "unavailable" ---- */

static int no_devices(void)
{
    return 0;
}

static kva_status no_context(kva_context *ctx)
{
    (void)ctx;
    return unavailable("kva_context_create");
}

static kva_status no_workspace(kva_context *ctx, size_t bytes)
{
    (void)ctx, (void)bytes;
    return unavailable("kva_plan_create");
}

static void no_free(kva_context *ctx)
{
    (void)ctx;
}

static kva_status no_cache_alloc(kva_context *ctx, kva_cache *c)
{
    (void)ctx, (void)c;
    return unavailable("kva_cache_create");
}

static void no_cache_free(kva_cache *c)
{
    (void)c;
}

static kva_status no_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                                 kva_dtype src_dtype, const int64_t *slot_mapping)
{
    (void)ctx, (void)cache, (void)num_tokens, (void)k, (void)k_stride, (void)v, (void)v_stride;
    (void)src_dtype, (void)slot_mapping;
    return unavailable("kva_cache_write");
}

static kva_status no_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t n)
{
    (void)ctx, (void)src, (void)dst, (void)pairs, (void)n;
    return unavailable("kva_cache_copy_blocks");
}

/* Device memory that cannot exist here; named as the real one is, so that
 * messages read the same in both builds. */
static const kva__memory_ops no_memory = {
    .name = "cuda device",
    .host = 0,
    .per_device = 1,
    .workspace_reserve = no_workspace,
    .workspace_free = no_free,
    .cache_alloc = no_cache_alloc,
    .cache_free = no_cache_free,
    .cache_write = no_cache_write,
    .copy_blocks = no_copy_blocks,
};

/* No plan, run or merge can be reached: no CUDA context can be created. */
const kva__backend_ops kva__cuda_ops = {
    .name = "cuda",
    .max_head_dim = 256,
    .max_threads = 1,
    .device_count = no_devices,
    .context_init = no_context,
    .context_free = no_free,
    .memory = &no_memory,
};

/* ---- kvattn_cuda.h ---- */

kva_status kva_cuda_cache_write_status(kva_context *ctx, const kva_cache *cache)
{
    (void)ctx, (void)cache;
    return unavailable("kva_cuda_cache_write_status");
}

kva_status kva_cuda_context_set_deferred_write_status(kva_context *ctx, int deferred)
{
    (void)ctx, (void)deferred;
    return unavailable("kva_cuda_context_set_deferred_write_status");
}

kva_status kva_cuda_context_set_stream(kva_context *ctx, void *stream)
{
    (void)ctx, (void)stream;
    return unavailable("kva_cuda_context_set_stream");
}

kva_status kva_cuda_context_get_stream(const kva_context *ctx, void **out)
{
    (void)ctx, (void)out;
    return unavailable("kva_cuda_context_get_stream");
}

kva_status kva_cuda_context_reserve(kva_context *ctx, const kva_cuda_capacity *cap)
{
    (void)ctx, (void)cap;
    return unavailable("kva_cuda_context_reserve");
}
