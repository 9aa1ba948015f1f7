/*
 * index_cache.cu - index-key caches (kind KVA_ATTN_INDEX) in CUDA device
 * memory: allocation, the write (kva_cache_write, v = NULL) and the
 * read-back (kva_cache_read). Layout as the host's (internal.h, "index-key
 * caches"): FP8_TOKEN blocks of B rows of D e4m3 codes then B float32
 * scales. Block copies and swaps go through cache_ops.cu unchanged (a block
 * is one run of kva_cache_block_bytes_k bytes).
 *
 * Both kernels take one warp per token (grid-stride); slots past the cache
 * are skipped (the host cannot read device slot values without a sync).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "indexer.cuh" /* kva__fp8_token_scale_warp, kva__fp8_token_code */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

static cudaStream_t stream_of(const kva_context *ctx)
{
    return (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
}

static __device__ __forceinline__ float ld(const void *p, int dt, int64_t i)
{
    if (dt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == KVA_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
static __device__ __forceinline__ void st(void *p, int dt, int64_t i, float x)
{
    if (dt == KVA_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == KVA_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

/* k [T, k_stride] rows of D values (src_dt) into the slots; FP8_TOKEN rows
 * get s = max(amax / 448, FLT_MIN) (NaN ignored) and codes fp8(x / s). */
__global__ void __launch_bounds__(128)
    index_write_kernel(char *cache, const void *k, int src_dt, int cache_dt, int fp8,
                       const int64_t *slots, int32_t T, int64_t k_stride, int32_t D, int32_t B,
                       int64_t num_slots, int64_t block_bytes)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < T;
         t += warps) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots)
            continue;
        const int64_t b = slot / B, off = slot % B;
        char *base = cache + b * block_bytes;
        const char *src = (const char *)k;
        const int64_t row = t * k_stride;
        if (!fp8) {
            for (int32_t i = lane; i < D; i += 32)
                st(base, cache_dt, off * D + i, ld(src, src_dt, row + i));
            continue;
        }
        float amax = 0.0f;
        for (int32_t i = lane; i < D; i += 32) {
            const float a = fabsf(ld(src, src_dt, row + i));
            amax = a > amax ? a : amax; /* NaN is ignored */
        }
        const float s = kva__fp8_token_scale_warp(amax);
        unsigned char *codes = (unsigned char *)base + off * D;
        for (int32_t i = lane; i < D; i += 32)
            codes[i] = kva__fp8_token_code(ld(src, src_dt, row + i), s);
        if (lane == 0)
            *(float *)(base + (int64_t)B * D + off * 4) = s;
    }
}

/* The inverse: code * scale (in double, rounded once to float, then to
 * dst_dt, as the host read) or the stored value, into k [T, k_stride]. */
__global__ void __launch_bounds__(128)
    index_read_kernel(const char *cache, void *k, int dst_dt, int cache_dt, int fp8,
                      const int64_t *slots, int32_t T, int64_t k_stride, int32_t D, int32_t B,
                      int64_t num_slots, int64_t block_bytes)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < T;
         t += warps) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots)
            continue;
        const int64_t b = slot / B, off = slot % B;
        const char *base = cache + b * block_bytes;
        for (int32_t i = lane; i < D; i += 32) {
            float v;
            if (fp8) {
                const __half_raw h = __nv_cvt_fp8_to_halfraw(
                    ((const __nv_fp8_storage_t *)base)[off * D + i], __NV_E4M3);
                const float s = *(const float *)(base + (int64_t)B * D + off * 4);
                v = __double2float_rn((double)__half2float(__half(h)) * (double)s);
            } else {
                v = ld(base, cache_dt, off * D + i);
            }
            st(k, dst_dt, t * k_stride + i, v);
        }
    }
}

extern "C" kva_status kva__cuda_index_cache_alloc(kva_context *ctx, kva_cache *c)
{
    const size_t bytes = (size_t)c->desc.num_blocks * (size_t)c->k_block_elems * c->elem_size;
    void *p = NULL;
    c->owns_memory = 1;
    KVA_TRY(kva__cuda_alloc(ctx, bytes, &p));
    c->k = p;
    c->v = c->k; /* no values */
    /* Zeroed, as the host's FP8_TOKEN blocks read before a write: 0 codes. */
    KVA_CUDA_TRY(cudaMemset(c->k, 0, bytes));
    return KVA_STATUS_OK;
}

static int grid_for(int32_t T)
{
    const int64_t g = ((int64_t)T + 3) / 4; /* 4 warps per CTA */
    return (int)(g < 65535 ? g : 65535);
}

extern "C" kva_status kva__cuda_index_cache_write(kva_context *ctx, kva_cache *cache,
                                                  int32_t num_tokens, const void *k,
                                                  int64_t k_stride, kva_dtype src_dtype,
                                                  const int64_t *slot_mapping)
{
    const kva_cache_desc *d = &cache->desc;
    index_write_kernel<<<grid_for(num_tokens), 128, 0, stream_of(ctx)>>>(
        (char *)cache->k, k, (int)src_dtype, (int)d->dtype, d->quant == KVA_QUANT_FP8_TOKEN,
        slot_mapping, num_tokens, k_stride, d->head_dim, d->block_size,
        (int64_t)d->num_blocks * d->block_size,
        (int64_t)cache->k_block_elems * (int64_t)cache->elem_size);
    KVA_CUDA_LAUNCHED("index_write_kernel");
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_index_cache_read(kva_context *ctx, const kva_cache *cache,
                                                 int32_t num_tokens, const int64_t *slot_mapping,
                                                 void *k, int64_t k_stride, kva_dtype dst_dtype)
{
    const kva_cache_desc *d = &cache->desc;
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_read: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    index_read_kernel<<<grid_for(num_tokens), 128, 0, stream_of(ctx)>>>(
        (const char *)cache->k, k, (int)dst_dtype, (int)d->dtype, d->quant == KVA_QUANT_FP8_TOKEN,
        slot_mapping, num_tokens, k_stride, d->head_dim, d->block_size,
        (int64_t)d->num_blocks * d->block_size,
        (int64_t)cache->k_block_elems * (int64_t)cache->elem_size);
    KVA_CUDA_LAUNCHED("index_read_kernel");
    return KVA_STATUS_OK;
}
