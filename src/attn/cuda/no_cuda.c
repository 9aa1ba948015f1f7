/* no_cuda.c - stands in for the CUDA sources when the build has no nvcc: a
 * backend table that sees no device, so kva_backend_available(KVA_BACKEND_CUDA)
 * is 0 and no CUDA context (hence no device cache or CUDA plan) can exist; plus
 * the kvattn_cuda.h entry points, which report KVA_STATUS_BACKEND_UNAVAILABLE. */
#include "internal.h"
#include "kvattn_cuda.h"

static kva_status unavailable(const char *fn)
{
    return kva__fail(KVA_STATUS_BACKEND_UNAVAILABLE, "%s: this build has no CUDA backend", fn);
}

/* ---- the backend table: no device ---- */

static int no_devices(void)
{
    return 0;
}

/* Device memory that cannot exist here; named as the real one is, so that
 * messages read the same in both builds (tests give a host cache this space to
 * check that host contexts refuse device caches). It has no operations: they
 * take a CUDA context or a cache one made. */
static const kva__memory_ops no_memory = {
    .name = "cuda device",
    .host = 0,
    .per_device = 1,
};

/* No context, plan, run, merge or device memory operation can be reached:
 * kva_backend_available(KVA_BACKEND_CUDA) is 0 (no device), so
 * kva_context_create refuses the backend before it calls context_init. */
const kva__backend_ops kva__cuda_ops = {
    .name = "cuda",
    .device_count = no_devices,
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
