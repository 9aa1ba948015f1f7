/*
 * cache_write.c - kva_cache_write: scatter new K/V rows into cache slots
 * (vLLM's reshape_and_cache).
 *
 * Every argument, including every slot, is validated before the first byte
 * is written, so a failing call leaves the cache untouched. Tokens are
 * independent and are distributed over the context's threads. When the
 * source and cache dtypes agree a token is a memcpy (one per token in NHD,
 * one per head in HND); otherwise elements are converted with
 * round-to-nearest-even. Quantized caches quantize each token through
 * src/cache/quant.c after a check pass over the rows (NaN is rejected there).
 *
 * Two tokens with the same non-negative slot write the same cache row; which
 * token's values the row ends up holding is unspecified (vLLM's kernel has
 * the same contract). Checking for duplicates would cost a sort or an
 * allocation on the hot path.
 */
#include "internal.h"

#include <string.h>

/* Below this many bytes moved in total the write stays on one thread: the
 * fork/join costs more than the copy. */
#define KVA_WRITE_PARALLEL_BYTES 262144.0

/* f32 -> bf16 with round-to-nearest-even, NaN kept quiet with its sign: the
 * same rounding as kva_f32_to_bf16 (test_cache checks them bit for bit on
 * special values), written branch-free so that the row loop vectorizes. */
static inline uint16_t bf16_rne(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Converts n elements of one row; the dtypes differ. */
static void convert_row(void *dst, kva_dtype dst_dt, const void *src, kva_dtype src_dt, int64_t n)
{
    if (src_dt == KVA_DTYPE_F32 && dst_dt == KVA_DTYPE_F16) {
        const float *s = src;
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = kva_f32_to_f16(s[i]);
    } else if (src_dt == KVA_DTYPE_F32 && dst_dt == KVA_DTYPE_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = bf16_rne(s[i]);
    } else {
        /* f16/bf16 sources, or f32 storage: the general path. f16 -> bf16
         * and bf16 -> f16 pass through f32 exactly, then round once. */
        for (int64_t i = 0; i < n; i++)
            kva__store_f(dst, dst_dt, (size_t)i, kva__load_f(src, src_dt, (size_t)i));
    }
}

kva_status kva__resolve_token_stride(const char *fn, const char *name, int64_t stride,
                                     int64_t row_elems, int32_t num_tokens, size_t elem,
                                     int64_t *out)
{
    if (stride == 0)
        stride = row_elems;
    if (stride < row_elems)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: %s = %lld is smaller than a token's row (%lld elements); 0 means "
                         "contiguous",
                         fn, name, (long long)stride, (long long)row_elems);
    /* The last row ends at (T-1)*stride + row_elems elements; its byte offset
     * must fit a signed 64-bit integer. */
    int64_t max_elems = PTRDIFF_MAX / (int64_t)elem;
    if (num_tokens > 1 && stride > (max_elems - row_elems) / (num_tokens - 1))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: %s = %lld with num_tokens = %d overflows the address space", fn, name,
                         (long long)stride, (int)num_tokens);
    *out = stride;
    return KVA_STATUS_OK;
}

/* Writes one token's K or V row (all heads, width dim) into the cache
 * storage base, at (block, off). */
static void write_token(const kva_cache *c, char *base, int64_t block, int64_t off, const char *src,
                        kva_dtype src_dt, int64_t dim)
{
    const kva_cache_desc *d = &c->desc;
    size_t elem = c->elem_size;
    size_t src_elem = kva_dtype_size(src_dt);
    if (d->layout == KVA_LAYOUT_NHD) {
        /* All Hkv heads of the slot are one contiguous run of Hkv*dim. */
        char *dst = base + kva__cache_row(d, block, off, 0, dim) * (int64_t)elem;
        int64_t n = (int64_t)d->num_kv_heads * dim;
        if (src_dt == d->dtype)
            memcpy(dst, src, (size_t)n * elem);
        else
            convert_row(dst, d->dtype, src, src_dt, n);
        return;
    }
    for (int64_t h = 0; h < d->num_kv_heads; h++) {
        char *dst = base + kva__cache_row(d, block, off, h, dim) * (int64_t)elem;
        const char *s = src + h * dim * (int64_t)src_elem;
        if (src_dt == d->dtype)
            memcpy(dst, s, (size_t)dim * elem);
        else
            convert_row(dst, d->dtype, s, src_dt, dim);
    }
}

kva_status kva_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens, const void *k,
                           int64_t k_token_stride, const void *v, int64_t v_token_stride,
                           kva_dtype src_dtype, const int64_t *slot_mapping)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(cache);
    if (num_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: num_tokens = %d is negative", (int)num_tokens);
    if ((unsigned)src_dtype >= (unsigned)KVA_DTYPE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: src_dtype = %d is not a kva_dtype", (int)src_dtype);
    if (!kva__dtype_is_float(src_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_write: src_dtype = %s is not supported (f32, f16 or bf16)",
                         kva_dtype_name(src_dtype));
    if (cache->mem != ctx->ops->memory)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: ctx backend '%s' (%s memory) cannot write a cache in "
                         "%s memory",
                         kva_backend_name(ctx->backend), ctx->ops->memory->name, cache->mem->name);
    if (cache->mem->per_device && cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: cache lives on device %d but the context uses device %d",
                         (int)cache->device_id, (int)ctx->device_id);
    const kva_cache_desc *d = &cache->desc;
    const int64_t hkv = d->num_kv_heads;
    /* Source row widths: K and V rows of all kv heads; for an MLA cache
     * c_kv (Dc) and k_pe (Dr = D - Dc), the two parts of one latent row. */
    const int mla = d->kind == KVA_ATTN_MLA;
    /* An index-key cache takes key rows [T, D] only (v = NULL). */
    if (d->kind == KVA_ATTN_INDEX && v)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_write: v = %p, but an index-key cache (kind KVA_ATTN_INDEX) "
                         "has no values: pass NULL",
                         v);
    const int64_t k_row = mla ? d->head_dim_v : hkv * d->head_dim;
    const int64_t v_row = mla ? d->head_dim - d->head_dim_v : hkv * d->head_dim_v;
    const size_t src_elem = kva_dtype_size(src_dtype);
    int64_t ks = 0, vs = 0;
    KVA_TRY(kva__resolve_token_stride("kva_cache_write", "k_token_stride", k_token_stride, k_row,
                                      num_tokens, src_elem, &ks));
    KVA_TRY(kva__resolve_token_stride("kva_cache_write", "v_token_stride", v_token_stride, v_row,
                                      num_tokens, src_elem, &vs));
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(k);
    if (d->kind != KVA_ATTN_INDEX)
        KVA_CHECK_PTR(v);
    KVA_CHECK_PTR(slot_mapping);
    KVA_CHECK_ALIGNED(k, src_elem);
    KVA_CHECK_ALIGNED(v, src_elem);
    KVA_CHECK_ALIGNED(slot_mapping, sizeof(int64_t));
    /* The aliasing rule (kvattn.h): the cache's storage (every byte of it:
     * which blocks a call writes depends on slot values, which may be device
     * memory) must not overlap the rows of k and v or slot_mapping. */
    const kva__span ins[3] = {
        {"k", k, kva__span_bytes(k_row, 1, src_elem), num_tokens, ks * (int64_t)src_elem},
        {"v", v, kva__span_bytes(v_row, 1, src_elem), num_tokens, vs * (int64_t)src_elem},
        {"slot_mapping", slot_mapping, kva__span_bytes(num_tokens, 1, sizeof(int64_t)), 0, 0}};
    kva__span store[3];
    kva__cache_spans(cache, store);
    for (int i = 0; i < 3; i++)
        KVA_TRY(kva__check_disjoint("kva_cache_write", &store[i], 1, ins, 3));

    /* The slot values are read by the memory space: a device slot_mapping
     * cannot be read without a host sync, so the CUDA kernel skips slots
     * >= NB*B instead (docs/cuda.md); the host checks them all first. */
    return cache->mem->cache_write(ctx, cache, num_tokens, k, ks, v, vs, src_dtype, slot_mapping);
}

/* Writes one token's latent row [c_kv (Dc) | k_pe (Dr)] into an MLA cache at
 * (block, off): converted to the cache dtype, or quantized to FP8 with the
 * cache's per-tensor k scale. */
static void write_latent(const kva_cache *c, int64_t block, int64_t off, const char *ckv,
                         const char *kpe, kva_dtype src_dt)
{
    const kva_cache_desc *d = &c->desc;
    const int64_t D = d->head_dim, Dc = d->head_dim_v, Dr = D - Dc;
    const size_t src_elem = kva_dtype_size(src_dt);
    if (d->quant != KVA_QUANT_NONE) {
        float row[KVA_MAX_HEAD_DIM]; /* the row in f32 (exact), quantized once */
        for (int64_t i = 0; i < Dc; i++)
            row[i] = kva__load_f(ckv, src_dt, (size_t)i);
        for (int64_t i = 0; i < Dr; i++)
            row[Dc + i] = kva__load_f(kpe, src_dt, (size_t)i);
        if (d->quant == KVA_QUANT_FP8_DS_MLA) {
            /* One kva__ds_mla_row_bytes row per slot (Hkv = 1). */
            uint8_t *dst =
                (uint8_t *)c->k + (block * d->block_size + off) * kva__ds_mla_row_bytes(D, Dc);
            kva__ds_mla_quantize_row(dst, row, row + Dc, Dc, Dr);
            return;
        }
        kva__quant_write_token(c, 0, block, off, (const char *)row, KVA_DTYPE_F32);
        return;
    }
    const size_t elem = c->elem_size;
    char *dst = (char *)c->k + kva__cache_row(d, block, off, 0, D) * (int64_t)elem;
    if (src_dt == d->dtype) {
        memcpy(dst, ckv, (size_t)Dc * src_elem);
        memcpy(dst + (size_t)Dc * elem, kpe, (size_t)Dr * src_elem);
    } else {
        convert_row(dst, d->dtype, ckv, src_dt, Dc);
        convert_row(dst + (size_t)Dc * elem, d->dtype, kpe, src_dt, Dr);
    }
}

/* The host memory space's write (kva__host_memory): every slot is checked
 * before anything is written, then tokens are spread over ctx's threads. */
kva_status kva__host_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t ks, const void *v, int64_t vs,
                                 kva_dtype src_dtype, const int64_t *slot_mapping)
{
    const kva_cache_desc *d = &cache->desc;
    if (d->kind == KVA_ATTN_INDEX) /* src/cache/index_cache.c */
        return kva__host_index_write(ctx, cache, num_tokens, k, ks, src_dtype, slot_mapping);
    const int64_t hkv = d->num_kv_heads, dk = d->head_dim, dv = d->head_dim_v;
    const size_t src_elem = kva_dtype_size(src_dtype);
    /* Every slot is checked before anything is written. */
    const int64_t num_slots = (int64_t)d->num_blocks * d->block_size;
    for (int32_t t = 0; t < num_tokens; t++) {
        if (slot_mapping[t] >= num_slots)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_cache_write: slot_mapping[%d] = %lld is past the cache "
                             "(num_blocks * block_size = %lld slots)",
                             (int)t, (long long)slot_mapping[t], (long long)num_slots);
    }

    const char *kc = k, *vc = v;
    char *kbase = cache->k, *vbase = cache->v;
    const int64_t bs = d->block_size;
    const int64_t kstride_bytes = ks * (int64_t)src_elem, vstride_bytes = vs * (int64_t)src_elem;
    /* Quantized caches: rows int8 cannot represent are rejected up front, so
     * a failing write changes nothing (src/cache/quant.c). */
    const int quant = d->quant != KVA_QUANT_NONE;
    const int mla = d->kind == KVA_ATTN_MLA; /* FP8 keeps NaN: nothing to check */
    if (quant && !mla)
        KVA_TRY(kva__quant_check_rows(cache, num_tokens, kc, kstride_bytes, vc, vstride_bytes,
                                      src_dtype, slot_mapping));
    /* In double: only a threshold, and the product may exceed int64. */
    const double total_bytes = (double)num_tokens * (double)(hkv * (dk + dv)) * (double)src_elem;
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    const int parallel = nt > 1 && total_bytes >= KVA_WRITE_PARALLEL_BYTES;
    (void)nt; /* unused without OpenMP */
    (void)parallel;
#pragma omp parallel for num_threads(nt) schedule(static) if (parallel)
    for (int32_t t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue; /* padding token */
        int64_t block = slot / bs, off = slot % bs;
        if (mla) {
            write_latent(cache, block, off, kc + t * kstride_bytes, vc + t * vstride_bytes,
                         src_dtype);
            continue;
        }
        if (quant) {
            kva__quant_write_token(cache, 0, block, off, kc + t * kstride_bytes, src_dtype);
            kva__quant_write_token(cache, 1, block, off, vc + t * vstride_bytes, src_dtype);
            continue;
        }
        write_token(cache, kbase, block, off, kc + t * kstride_bytes, src_dtype, dk);
        write_token(cache, vbase, block, off, vc + t * vstride_bytes, src_dtype, dv);
    }
    return KVA_STATUS_OK;
}
