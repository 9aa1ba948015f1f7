/*
 * cache_ops.cu - the CUDA side of the cache calls:
 *   cache storage: K and V of a device cache in cudaMalloc memory (the
 *     memory table's cache_alloc / cache_free; cache_quant.cu adds the
 *     quantized formats' device state);
 *   cache_write_kernel: scatter of new K/V rows into cache slots with dtype
 *     conversion (vLLM's reshape_and_cache), NHD or HND;
 *   block copies (copy_blocks inside a device cache, swap between a device
 *     and a host cache) through cudaMemcpyAsync, one copy per block of K, of
 *     V and of the per-token key scales (INT8_TOKEN_K formats);
 * Quantized caches are written by cache_quant.cu, kva_merge_states and
 * kva_merge_states_n run in split_merge.cu.
 * Everything is enqueued on the context's stream; nothing synchronizes except
 * copies into pageable host memory, which the runtime completes before
 * cudaMemcpyAsync returns.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_sparse.h"
}
#include "cuda_check.h"
#include "elem_io.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

static cudaStream_t stream_of(const kva_context *ctx)
{
    return (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
}

/* Copies element i of src to element j of dst: bit-exact when the types are
 * equal, else through float with round-to-nearest-even. */
template <typename TS, typename TD>
__device__ __forceinline__ void move(TD *dst, int64_t j, const TS *src, int64_t i)
{
    if constexpr (sizeof(TS) == sizeof(TD) && (sizeof(TS) == 4 || __is_same(TS, TD)))
        dst[j] = src[i];
    else
        store_f(dst, j, load_f(src, i));
}

/*
 * One CTA per token (grid-stride): k [T, k_stride] rows of Hkv*kw source
 * elements, v likewise with vw; slot = slot_mapping[t]; negative slots are
 * padding and slots >= num_slots are skipped (the host cannot check device
 * values without a synchronization). Destination rows are krow (K) and vrow
 * (V) elements apart: MHA caches kw = krow = D, vw = vrow = Dv; MLA caches
 * write c_kv (kw = Dc) and k_pe (vw = Dr, vc = kc + Dc) into the same latent
 * rows of krow = vrow = Dc + Dr.
 */
template <typename TS, typename TD>
__global__ void __launch_bounds__(256)
    cache_write_kernel(TD *kc, TD *vc, const TS *k, const TS *v, const int64_t *slot_mapping,
                       int32_t num_tokens, int64_t k_stride, int64_t v_stride, int32_t Hkv,
                       int32_t kw, int32_t krow, int32_t vw, int32_t vrow, int32_t B,
                       int64_t num_slots, int hnd)
{
    for (int32_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0 || slot >= num_slots)
            continue;
        const int64_t block = slot / B, off = slot % B;
        const int32_t nk = Hkv * kw, nv = Hkv * vw;
        for (int32_t e = threadIdx.x; e < nk + nv; e += blockDim.x) {
            const int is_v = e >= nk;
            const int32_t x = is_v ? e - nk : e;
            const int32_t dim = is_v ? vw : kw;
            const int32_t h = x / dim, c = x - h * dim;
            const int64_t row = hnd ? ((block * Hkv + h) * B + off) : ((block * B + off) * Hkv + h);
            if (is_v)
                move(vc, row * vrow + c, v, (int64_t)t * v_stride + x);
            else
                move(kc, row * krow + c, k, (int64_t)t * k_stride + x);
        }
    }
}

template <typename TS, typename TD>
static void launch_write(cudaStream_t s, kva_cache *c, int32_t n, const void *k, int64_t ks,
                         const void *v, int64_t vs, const int64_t *slots)
{
    const kva_cache_desc *d = &c->desc;
    const int mla = d->kind == KVA_ATTN_MLA;
    const int32_t D = d->head_dim, Dv = d->head_dim_v;
    int grid = n < 65535 ? n : 65535;
    cache_write_kernel<TS, TD><<<grid, 256, 0, s>>>(
        (TD *)c->k, mla ? (TD *)c->k + Dv : (TD *)c->v, (const TS *)k, (const TS *)v, slots, n, ks,
        vs, d->num_kv_heads, mla ? Dv : D, D, mla ? D - Dv : Dv, mla ? D : Dv, d->block_size,
        (int64_t)d->num_blocks * d->block_size, d->layout == KVA_LAYOUT_HND);
}

template <typename TS>
static void launch_write_src(cudaStream_t s, kva_cache *c, int32_t n, const void *k, int64_t ks,
                             const void *v, int64_t vs, const int64_t *slots)
{
    if (c->desc.dtype == KVA_DTYPE_F32)
        launch_write<TS, float>(s, c, n, k, ks, v, vs, slots);
    else if (c->desc.dtype == KVA_DTYPE_F16)
        launch_write<TS, __half>(s, c, n, k, ks, v, vs, slots);
    else
        launch_write<TS, __nv_bfloat16>(s, c, n, k, ks, v, vs, slots);
}

extern "C" kva_status kva__cuda_cache_alloc(kva_context *ctx, kva_cache *c)
{
    /* cudaMalloc memory is 256-byte aligned; sizes were bounded by validation. */
    const kva_cache_desc *d = &c->desc;
    if (d->kind == KVA_ATTN_INDEX) /* index_cache.cu */
        return kva__cuda_index_cache_alloc(ctx, c);
    const int mla = d->kind == KVA_ATTN_MLA;
    if (!mla && (d->head_dim > 256 || d->head_dim_v > 256))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_create: head_dim = %d, head_dim_v = %d: the CUDA backend's "
                         "attention kernels take head sizes up to 256 (576 / 512 for MLA caches)",
                         (int)d->head_dim, (int)d->head_dim_v);
    if (mla && d->quant != KVA_QUANT_NONE && d->quant != KVA_QUANT_FP8_DS_MLA &&
        d->quant != KVA_QUANT_FP8_E4M3)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_create: quant = %s: the CUDA backend's MLA caches are "
                         "unquantized (f32, f16, bf16), fp8_e4m3 or fp8_ds_mla",
                         kva_quant_name(d->quant));
    const size_t nb = (size_t)d->num_blocks;
    void *p = NULL;
    c->owns_memory = 1;
    /* fp8_ds_mla: B byte rows per block (cache_ds_mla.cu), no scale arrays. */
    const size_t kbytes =
        d->quant == KVA_QUANT_FP8_DS_MLA
            ? nb * (size_t)d->block_size * (size_t)kva__ds_mla_row_bytes(d->head_dim, d->head_dim_v)
            : nb * (size_t)c->k_block_elems * c->elem_size;
    KVA_TRY(kva__cuda_alloc(ctx, kbytes, &p));
    c->k = p;
    if (mla) { /* the values are the first Dc columns of the latent rows; an
                  fp8_e4m3 cache's one scale stays on the host (c->k_scale[0],
                  passed to the kernels by value) */
        c->v = c->k;
        return KVA_STATUS_OK;
    }
    KVA_TRY(kva__cuda_alloc(ctx, nb * (size_t)c->v_block_elems * c->v_elem, &p));
    c->v = p;
    if (c->desc.quant != KVA_QUANT_NONE)
        KVA_TRY(kva__cuda_cache_quant_init(ctx, c));
    return KVA_STATUS_OK;
}

extern "C" void kva__cuda_cache_free(kva_cache *c)
{
    if (c->owns_memory) {
        kva__cuda_free(c->device_id, c->k);
        if (c->v != c->k) /* MLA caches: v aliases k */
            kva__cuda_free(c->device_id, c->v);
    }
    kva__cuda_cache_quant_free(c); /* token scales, device scales, reject word */
}

extern "C" kva_status kva__cuda_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                            const void *k, int64_t k_stride, const void *v,
                                            int64_t v_stride, kva_dtype src_dtype,
                                            const int64_t *slot_mapping)
{
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    if (cache->desc.kind == KVA_ATTN_INDEX) /* index_cache.cu */
        return kva__cuda_index_cache_write(ctx, cache, num_tokens, k, k_stride, src_dtype,
                                           slot_mapping);
    if (cache->desc.quant == KVA_QUANT_FP8_DS_MLA) /* cache_ds_mla.cu */
        return kva__cuda_ds_mla_write(ctx, cache, num_tokens, k, k_stride, v, v_stride, src_dtype,
                                      slot_mapping);
    if (cache->desc.quant != KVA_QUANT_NONE) /* cache_quant.cu */
        return kva__cuda_cache_write_quant(ctx, cache, num_tokens, k, k_stride, v, v_stride,
                                           src_dtype, slot_mapping);
    cudaStream_t s = stream_of(ctx);
    if (src_dtype == KVA_DTYPE_F32)
        launch_write_src<float>(s, cache, num_tokens, k, k_stride, v, v_stride, slot_mapping);
    else if (src_dtype == KVA_DTYPE_F16)
        launch_write_src<__half>(s, cache, num_tokens, k, k_stride, v, v_stride, slot_mapping);
    else
        launch_write_src<__nv_bfloat16>(s, cache, num_tokens, k, k_stride, v, v_stride,
                                        slot_mapping);
    KVA_CUDA_LAUNCHED("cache_write_kernel");
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                            const int32_t *pairs, int32_t n)
{
    /* Validation left each cache in this context's device memory or on the host. */
    const int sd = !src->mem->host, dd = !dst->mem->host;
    const cudaMemcpyKind kind = sd && dd ? cudaMemcpyDeviceToDevice
                                : sd     ? cudaMemcpyDeviceToHost
                                : dd     ? cudaMemcpyHostToDevice
                                         : cudaMemcpyHostToHost;
    const size_t kbb = (size_t)src->k_block_elems * src->elem_size;
    const size_t vbb = (size_t)src->v_block_elems * src->v_elem;
    /* Per-token key scales [NB, Hkv, B]: block b is B*Hkv contiguous floats. */
    const size_t tbb = src->k_token_scale
                           ? (size_t)src->desc.block_size * src->desc.num_kv_heads * sizeof(float)
                           : 0;
    cudaStream_t s = stream_of(ctx);
    for (int32_t i = 0; i < n; i++) {
        const size_t a = (size_t)pairs[2 * (int64_t)i], b = (size_t)pairs[2 * (int64_t)i + 1];
        if (src == dst && a == b)
            continue;
        KVA_CUDA_TRY(cudaMemcpyAsync((char *)dst->k + b * kbb, (const char *)src->k + a * kbb, kbb,
                                     kind, s));
        KVA_CUDA_TRY(cudaMemcpyAsync((char *)dst->v + b * vbb, (const char *)src->v + a * vbb, vbb,
                                     kind, s));
        if (tbb)
            KVA_CUDA_TRY(cudaMemcpyAsync((char *)dst->k_token_scale + b * tbb,
                                         (const char *)src->k_token_scale + a * tbb, tbb, kind, s));
    }
    return KVA_STATUS_OK;
}
