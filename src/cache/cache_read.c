/*
 * cache_read.c - kva_cache_read: gather tokens' K/V rows back out of the
 * cache, dequantized (the inverse of kva_cache_write).
 *
 * The API validates everything but the slot values and hands the call to
 * the cache's memory space (kva__memory_ops.cache_read). The host space
 * (kva__host_cache_read) checks every slot first, so a failing call writes
 * nothing, then decodes each token's rows into float32 in the format's own
 * arithmetic and rounds them once to the destination dtype. The host
 * backends' separate sparse-MLA prefill gathers its workspace through the
 * same function.
 */
#include "internal.h"

#include <string.h>

/* Decodes one K (is_v = 0) or V (is_v = 1) row of kv head h at (block,
 * off), channels [c0, c0 + n) of the stored row, into x [n] float32:
 * unquantized values exactly, int8 as (code - offset) * scale, fp8 as
 * code * scale, fp8_ds_mla through its tile scales, each computed exactly
 * (in double where the float32 product would round twice) and rounded once
 * to float32. */
static void decode_row(const kva_cache *c, int is_v, int64_t block, int64_t off, int64_t h,
                       int64_t c0, int64_t n, float *x)
{
    const kva_cache_desc *d = &c->desc;
    const int mla = d->kind == KVA_ATTN_MLA;
    if (d->quant == KVA_QUANT_FP8_DS_MLA) {
        const int64_t D = d->head_dim, Dc = d->head_dim_v;
        const uint8_t *row =
            (const uint8_t *)c->k + (block * d->block_size + off) * kva__ds_mla_row_bytes(D, Dc);
        float tmp[KVA_MAX_HEAD_DIM];
        kva__ds_mla_dequantize_row(row, c0 < Dc ? tmp : NULL, c0 < Dc ? NULL : tmp + Dc, Dc,
                                   D - Dc);
        memcpy(x, tmp + c0, (size_t)n * sizeof(float));
        return;
    }
    /* An MLA row holds c_kv and k_pe: both halves are K storage. */
    if (mla)
        is_v = 0;
    const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
    const int64_t e = kva__cache_row(d, block, off, h, dim) + c0;
    const void *base = is_v ? c->v : c->k;
    if (d->quant == KVA_QUANT_NONE ||
        (is_v && d->quant == KVA_QUANT_INT8_TOKEN_K_V16)) { /* stored as desc.dtype */
        for (int64_t i = 0; i < n; i++)
            x[i] = kva__load_f(base, d->dtype, (size_t)(e + i));
        return;
    }
    const float *scale = (is_v ? c->v_scale : c->k_scale) + h * dim + c0;
    const float *offset = (is_v ? c->v_offset : c->k_offset) + h * dim + c0;
    if (!is_v && c->k_token_scale) {
        const float s = c->k_token_scale[kva__token_scale_index(d, block, off, h)];
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)((const int8_t *)base)[e + i] * s;
    } else if (kva__quant_is_int8(d->quant, is_v)) {
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)(((double)((const int8_t *)base)[e + i] - offset[i]) * scale[i]);
    } else { /* FP8_E4M3 */
        for (int64_t i = 0; i < n; i++)
            x[i] = kva_fp8_e4m3_to_f32(((const uint8_t *)base)[e + i]) * scale[i];
    }
}

kva_status kva__host_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                const int64_t *slot_mapping, void *k, int64_t k_stride, void *v,
                                int64_t v_stride, kva_dtype dst_dtype)
{
    (void)ctx;
    const kva_cache_desc *d = &cache->desc;
    if (d->kind == KVA_ATTN_INDEX) /* src/cache/index_cache.c */
        return kva__host_index_read(ctx, cache, num_tokens, slot_mapping, k, k_stride, dst_dtype);
    const int64_t num_slots = (int64_t)d->num_blocks * d->block_size;
    for (int32_t t = 0; t < num_tokens; t++)
        if (slot_mapping[t] >= num_slots)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_cache_read: slot_mapping[%d] = %lld is past the cache "
                             "(num_blocks * block_size = %lld slots); nothing was written",
                             (int)t, (long long)slot_mapping[t], (long long)num_slots);
    const int mla = d->kind == KVA_ATTN_MLA;
    /* Per half: kv heads, channels per head and the first stored channel
     * (MLA: k = c_kv = channels 0 .. Dc, v = k_pe = Dc .. D of the row). */
    const int64_t heads = mla ? 1 : d->num_kv_heads;
    const int64_t dim[2] = {mla ? d->head_dim_v : d->head_dim,
                            mla ? d->head_dim - d->head_dim_v : d->head_dim_v};
    const int64_t first[2] = {0, mla ? d->head_dim_v : 0};
    void *dst[2] = {k, v};
    const int64_t stride[2] = {k_stride, v_stride};
    const size_t es = kva_dtype_size(dst_dtype);
    float x[KVA_MAX_HEAD_DIM];
    for (int32_t t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue;
        const int64_t block = slot / d->block_size, off = slot % d->block_size;
        for (int half = 0; half < 2; half++) {
            if (!dst[half])
                continue;
            char *row = (char *)dst[half] + (size_t)(t * stride[half]) * es;
            for (int64_t h = 0; h < heads; h++) {
                decode_row(cache, half, block, off, h, first[half], dim[half], x);
                void *out = row + (size_t)(h * dim[half]) * es;
                if (dst_dtype == KVA_DTYPE_F32)
                    memcpy(out, x, (size_t)dim[half] * sizeof(float));
                else
                    for (int64_t i = 0; i < dim[half]; i++)
                        kva__store_f(out, dst_dtype, (size_t)i, x[i]);
            }
        }
    }
    return KVA_STATUS_OK;
}

kva_status kva__check_read_aliasing(const char *fn, const kva_cache *cache, int32_t num_tokens,
                                    const int64_t *slot_mapping, const void *k, size_t k_row,
                                    int64_t k_stride, const void *v, size_t v_row, int64_t v_stride)
{
    kva__span ins[4] = {
        {"slot_mapping", slot_mapping, kva__span_bytes(num_tokens, 1, sizeof(int64_t)), 0, 0}};
    kva__cache_spans(cache, &ins[1]);
    const kva__span outs[2] = {{"k", k, k_row, num_tokens, k_stride},
                               {"v", v, v_row, num_tokens, v_stride}};
    return kva__check_disjoint(fn, outs, 2, ins, 4);
}

kva_status kva_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                          const int64_t *slot_mapping, void *k, int64_t k_token_stride, void *v,
                          int64_t v_token_stride, kva_dtype dst_dtype)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(cache);
    if (cache->desc.kind == KVA_ATTN_INDEX) /* its own checks: src/cache/index_cache.c */
        return kva__index_cache_read(ctx, cache, num_tokens, slot_mapping, k, k_token_stride, v,
                                     v_token_stride, dst_dtype);
    if (num_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "kva_cache_read: num_tokens = %d is negative",
                         (int)num_tokens);
    if ((unsigned)dst_dtype >= (unsigned)KVA_DTYPE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_read: dst_dtype = %d is not a kva_dtype", (int)dst_dtype);
    if (!kva__dtype_is_float(dst_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_read: dst_dtype = %s is not supported (f32, f16 or bf16)",
                         kva_dtype_name(dst_dtype));
    const kva_cache_desc *d = &cache->desc;
    KVA_TRY(kva__cache_check_space("kva_cache_read", ctx, cache));
    /* Destination row widths, as kva_cache_write's sources. */
    const int mla = d->kind == KVA_ATTN_MLA;
    const int64_t hkv = d->num_kv_heads;
    const int64_t k_row = mla ? d->head_dim_v : hkv * d->head_dim;
    const int64_t v_row = mla ? d->head_dim - d->head_dim_v : hkv * d->head_dim_v;
    const size_t es = kva_dtype_size(dst_dtype);
    int64_t ks = 0, vs = 0;
    KVA_TRY(kva__resolve_token_stride("kva_cache_read", "k_token_stride", k_token_stride, k_row,
                                      num_tokens, es, &ks));
    KVA_TRY(kva__resolve_token_stride("kva_cache_read", "v_token_stride", v_token_stride, v_row,
                                      num_tokens, es, &vs));
    /* The zero-size rule (kvattn.h): with no tokens, k and v are empty arrays and may
     * both be NULL. */
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    if (!k && !v)
        return kva__fail(KVA_STATUS_NULL_POINTER,
                         "kva_cache_read: k and v are both NULL (pass at least one)");
    KVA_CHECK_PTR(slot_mapping);
    KVA_CHECK_ALIGNED(slot_mapping, sizeof(int64_t));
    KVA_CHECK_ALIGNED(k, es);
    KVA_CHECK_ALIGNED(v, es);
    KVA_TRY(kva__check_read_aliasing("kva_cache_read", cache, num_tokens, slot_mapping, k,
                                     kva__span_bytes(k_row, 1, es), ks * (int64_t)es, v,
                                     kva__span_bytes(v_row, 1, es), vs * (int64_t)es));
    if (!cache->mem->cache_read)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_read: the %s memory space cannot read caches back yet",
                         cache->mem->name);
    return cache->mem->cache_read(ctx, cache, num_tokens, slot_mapping, k, k ? ks : 0, v,
                                  v ? vs : 0, dst_dtype);
}
