/*
 * index_cache.c - the index-key cache of DeepSeek V3.2's lightning indexer
 * (kind KVA_ATTN_INDEX) in host memory: validation of its descriptor, the
 * FP8_TOKEN quantizer, the write (kva_cache_write with v = NULL) and the
 * read-back (kva_cache_read).
 *
 * Layout (internal.h, "index-key caches"): one row of D values per token,
 * no V storage. FP8_TOKEN blocks are B * (D + 4) bytes: the B rows of D
 * e4m3 codes, then the B float32 scales, as vLLM lays out its indexer k
 * cache. Block copies and swaps need nothing special: a block is one
 * contiguous run of kva_cache_block_bytes_k bytes, scales included.
 */
#include "internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

float kva__index_fp8_scale(float amax)
{
    const float s = amax / 448.0f;
    return s > FLT_MIN ? s : FLT_MIN;
}

kva_status kva__index_cache_validate(const char *fn, const kva_cache_desc *d)
{
    if (d->num_kv_heads != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->num_kv_heads = %d, but an index-key cache (kind "
                         "KVA_ATTN_INDEX) has one key row per token: num_kv_heads must be 1",
                         fn, (int)d->num_kv_heads);
    if (d->head_dim_v != 0 && d->head_dim_v != d->head_dim)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->head_dim_v = %d: an index-key cache has no values; give 0 or "
                         "head_dim = %d",
                         fn, (int)d->head_dim_v, (int)d->head_dim);
    if (d->quant != KVA_QUANT_NONE && d->quant != KVA_QUANT_FP8_TOKEN)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->quant = %s: index-key caches are unquantized (f32, f16, "
                         "bf16) or fp8_token",
                         fn, kva_quant_name(d->quant));
    return KVA_STATUS_OK;
}

/* Byte address of block `block` of the cache's K storage. */
static char *block_base(const kva_cache *c, int64_t block)
{
    return (char *)c->k + block * c->k_block_elems * (int64_t)c->elem_size;
}

float kva__index_load_key(const kva_cache *c, int64_t block, int64_t off, float *dst)
{
    const kva_cache_desc *d = &c->desc;
    const int64_t D = d->head_dim;
    const char *base = block_base(c, block);
    if (d->quant == KVA_QUANT_FP8_TOKEN) {
        const uint8_t *codes = (const uint8_t *)base + off * D;
        for (int64_t i = 0; i < D; i++)
            dst[i] = kva_fp8_e4m3_to_f32(codes[i]);
        float s;
        memcpy(&s, base + (int64_t)d->block_size * D + off * (int64_t)sizeof(float), sizeof s);
        return s;
    }
    const void *row = base + off * D * (int64_t)c->elem_size;
    for (int64_t i = 0; i < D; i++)
        dst[i] = kva__load_f(row, d->dtype, (size_t)i);
    return 1.0f;
}

/* Writes one token's key row src [D] (src_dt) at (block, off): converted to
 * the cache dtype, or quantized with its own scale. */
static void write_key(const kva_cache *c, int64_t block, int64_t off, const char *src,
                      kva_dtype src_dt)
{
    const kva_cache_desc *d = &c->desc;
    const int64_t D = d->head_dim;
    char *base = block_base(c, block);
    if (d->quant != KVA_QUANT_FP8_TOKEN) {
        void *row = base + off * D * (int64_t)c->elem_size;
        if (src_dt == d->dtype) {
            memcpy(row, src, (size_t)D * c->elem_size);
            return;
        }
        for (int64_t i = 0; i < D; i++)
            kva__store_f(row, d->dtype, (size_t)i, kva__load_f(src, src_dt, (size_t)i));
        return;
    }
    float x[KVA_MAX_HEAD_DIM];
    for (int64_t i = 0; i < D; i++)
        x[i] = kva__load_f(src, src_dt, (size_t)i);
    const float s = kva__index_fp8_quant_row(x, D, (uint8_t *)base + off * D);
    memcpy(base + (int64_t)d->block_size * D + off * (int64_t)sizeof(float), &s, sizeof s);
}

float kva__index_fp8_quant_row(const float *x, int64_t D, uint8_t *codes)
{
    /* NaN is ignored by the comparison: a NaN element stays NaN (code 0x7f). */
    float amax = 0.0f;
    for (int64_t i = 0; i < D; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    const float s = kva__index_fp8_scale(amax);
    for (int64_t i = 0; i < D; i++)
        codes[i] = kva_f32_to_fp8_e4m3(x[i] / s);
    return s;
}

/* Checks every slot of a host call before anything is touched. */
static kva_status check_slots(const char *fn, const kva_cache *c, int32_t n, const int64_t *slots)
{
    const int64_t num_slots = (int64_t)c->desc.num_blocks * c->desc.block_size;
    for (int32_t t = 0; t < n; t++)
        if (slots[t] >= num_slots)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: slot_mapping[%d] = %lld is past the cache (num_blocks * "
                             "block_size = %lld slots)",
                             fn, (int)t, (long long)slots[t], (long long)num_slots);
    return KVA_STATUS_OK;
}

kva_status kva__host_index_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, kva_dtype src_dtype,
                                 const int64_t *slot_mapping)
{
    KVA_TRY(check_slots("kva_cache_write", cache, num_tokens, slot_mapping));
    const int64_t stride_bytes = k_stride * (int64_t)kva_dtype_size(src_dtype);
    const int64_t B = cache->desc.block_size;
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    (void)nt; /* unused without OpenMP */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && num_tokens >= 256)
    for (int32_t t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot >= 0)
            write_key(cache, slot / B, slot % B, (const char *)k + t * stride_bytes, src_dtype);
    }
    return KVA_STATUS_OK;
}

kva_status kva__host_index_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                const int64_t *slot_mapping, void *k, int64_t k_stride,
                                kva_dtype dst_dtype)
{
    (void)ctx;
    KVA_TRY(check_slots("kva_cache_read", cache, num_tokens, slot_mapping));
    const int64_t D = cache->desc.head_dim, B = cache->desc.block_size;
    const size_t es = kva_dtype_size(dst_dtype);
    float row[KVA_MAX_HEAD_DIM];
    for (int32_t t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue;
        const float s = kva__index_load_key(cache, slot / B, slot % B, row);
        char *dst = (char *)k + (int64_t)t * k_stride * (int64_t)es;
        /* code * scale in double, rounded once to the destination. */
        for (int64_t i = 0; i < D; i++)
            kva__store_f(dst, dst_dtype, (size_t)i, (float)((double)row[i] * (double)s));
    }
    return KVA_STATUS_OK;
}

kva_status kva__index_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                 const int64_t *slot_mapping, void *k, int64_t k_token_stride,
                                 void *v, int64_t v_token_stride, kva_dtype dst_dtype)
{
    static const char fn[] = "kva_cache_read";
    (void)v_token_stride;
    if (num_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: num_tokens = %d is negative", fn,
                         (int)num_tokens);
    /* As the other kinds' read (cache_read.c): a value outside the enum is an
     * invalid argument, a dtype the read does not produce is unsupported. */
    if ((unsigned)dst_dtype >= (unsigned)KVA_DTYPE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: dst_dtype = %d is not a kva_dtype", fn,
                         (int)dst_dtype);
    if (!kva__dtype_is_float(dst_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: dst_dtype = %s is not a read-back dtype (f32, f16 or bf16)", fn,
                         kva_dtype_name(dst_dtype));
    if (v)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: v = %p, but an index-key cache has no values: pass NULL", fn, v);
    KVA_TRY(kva__resolve_token_stride(fn, "k_token_stride", k_token_stride, cache->desc.head_dim,
                                      num_tokens, kva_dtype_size(dst_dtype), &k_token_stride));
    KVA_TRY(kva__cache_check_space(fn, ctx, cache));
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(k);
    KVA_CHECK_PTR(slot_mapping);
    KVA_CHECK_ALIGNED(k, kva_dtype_size(dst_dtype));
    KVA_CHECK_ALIGNED(slot_mapping, sizeof(int64_t));
    const size_t es = kva_dtype_size(dst_dtype);
    KVA_TRY(kva__check_read_aliasing(fn, cache, num_tokens, slot_mapping, k,
                                     kva__span_bytes(cache->desc.head_dim, 1, es),
                                     k_token_stride * (int64_t)es, NULL, 0, 0));
    if (cache->mem->host)
        return kva__host_index_read(ctx, cache, num_tokens, slot_mapping, k, k_token_stride,
                                    dst_dtype);
    if (!cache->mem->cache_read)
        return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: %s memory has no read-back", fn,
                         cache->mem->name);
    return cache->mem->cache_read(ctx, cache, num_tokens, slot_mapping, k, k_token_stride, NULL, 0,
                                  dst_dtype);
}
