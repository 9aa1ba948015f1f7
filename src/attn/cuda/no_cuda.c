/* no_cuda.c - stands in for the CUDA sources when the build has no nvcc:
 * no device is visible, so kva_backend_available(KVA_BACKEND_CUDA) is 0 and
 * no CUDA context (hence no device cache or CUDA plan) can exist. */
#include "internal.h"
#include "kvattn_cuda.h"

static kva_status unavailable(const char *fn)
{
    return kva__fail(KVA_STATUS_BACKEND_UNAVAILABLE, "%s: this build has no CUDA backend", fn);
}

int kva__cuda_device_count(void)
{
    return 0;
}

kva_status kva__cuda_context_init(kva_context *ctx)
{
    (void)ctx;
    return unavailable("kva_context_create");
}

void kva__cuda_context_free(kva_context *ctx)
{
    (void)ctx;
}

kva_status kva__cuda_alloc(const kva_context *ctx, size_t bytes, void **out)
{
    (void)ctx;
    (void)bytes;
    *out = NULL;
    return unavailable("kva_cache_create");
}

void kva__cuda_free(int32_t device_id, void *p)
{
    (void)device_id;
    (void)p;
}

kva_status kva__cuda_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                                 kva_dtype src_dtype, const int64_t *slot_mapping)
{
    (void)ctx, (void)cache, (void)num_tokens, (void)k, (void)k_stride, (void)v, (void)v_stride;
    (void)src_dtype, (void)slot_mapping;
    return unavailable("kva_cache_write");
}

kva_status kva__cuda_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t n)
{
    (void)ctx, (void)src, (void)dst, (void)pairs, (void)n;
    return unavailable("kva_cache_copy_blocks");
}

kva_status kva__cuda_cache_quant_init(const kva_context *ctx, kva_cache *c)
{
    (void)ctx, (void)c;
    return unavailable("kva_cache_create_quant");
}

void kva__cuda_cache_quant_free(kva_cache *c)
{
    (void)c;
}

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

/* Never reached: no CUDA context can be created without the backend. */
const kva__backend_ops kva__cuda_ops = {"cuda", NULL, NULL, NULL, NULL, NULL};
