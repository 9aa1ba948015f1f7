/*
 * cache.c - creation, validation and introspection of the paged KV cache.
 *
 * A cache holds two arrays in the memory space of the context that created it
 * (host memory for the reference and CPU backends):
 *   K: [NB, B, Hkv, D]  (NHD) or [NB, Hkv, B, D]  (HND)
 *   V: [NB, B, Hkv, Dv] (NHD) or [NB, Hkv, B, Dv] (HND)
 * In both layouts one block is a contiguous run of B*Hkv*D (resp. B*Hkv*Dv)
 * elements, which copy/swap rely on. Every size is computed in 64 bits and
 * checked for overflow, so caches larger than 2^31 elements are supported.
 *
 * Quantized caches (kva_cache_create_quant) store 1-byte K/V elements (2-byte
 * V for INT8_TOKEN_K_V16), their static scales expanded per (kv head,
 * channel), and for the INT8_TOKEN_K formats per-token key scales
 * [NB, Hkv, B] float32 (src/cache/quant.c has the formats). The static
 * scales are kept on the host (validation, swap_blocks' comparison); the
 * memory space that allocates K, V and the per-token scales
 * (kva__memory_ops.cache_alloc: host_memory.c, or the CUDA backend's device
 * memory) may keep its own copy for its kernels.
 *
 * Writing tokens lives in cache_write.c, block copies in cache_copy.c.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Multiplies a by b; returns 0 (and leaves *out alone) if the product
 * exceeds limit. All operands are non-negative. */
static int mul_within(uint64_t a, uint64_t b, uint64_t limit, uint64_t *out)
{
    if (b != 0 && a > limit / b)
        return 0;
    *out = a * b;
    return 1;
}

/* The relations an MLA (latent) cache adds: one kv head, an explicit Dc =
 * head_dim_v below head_dim (Dr = head_dim - Dc is then a multiple of 8 >= 8),
 * unquantized or FP8 E4M3 storage. */
static kva_status validate_mla(const char *fn, const kva_cache_desc *d)
{
    if (d->num_kv_heads != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->num_kv_heads = %d, but an MLA cache (kind KVA_ATTN_MLA) has "
                         "one latent row per token: num_kv_heads must be 1",
                         fn, (int)d->num_kv_heads);
    if (d->head_dim_v == 0 || d->head_dim_v >= d->head_dim)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->head_dim_v = %d, but an MLA cache needs head_dim_v = Dc "
                         "(kv_lora_rank) given and below head_dim = Dc + Dr = %d",
                         fn, (int)d->head_dim_v, (int)d->head_dim);
    if (d->quant != KVA_QUANT_NONE && d->quant != KVA_QUANT_FP8_E4M3 &&
        d->quant != KVA_QUANT_FP8_DS_MLA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->quant = %s: MLA caches are unquantized (f32, f16, bf16), "
                         "fp8_e4m3 or fp8_ds_mla",
                         fn, kva_quant_name(d->quant));
    /* fp8_ds_mla scales c_kv per tile of 128 values: Dc must hold whole tiles. */
    if (d->quant == KVA_QUANT_FP8_DS_MLA && d->head_dim_v % KVA__DS_MLA_TILE != 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->head_dim_v = %d: an fp8_ds_mla cache needs Dc a multiple of "
                         "%d (one float32 scale per tile of %d c_kv values)",
                         fn, (int)d->head_dim_v, KVA__DS_MLA_TILE, KVA__DS_MLA_TILE);
    return KVA_STATUS_OK;
}

/* Validates a descriptor and resolves head_dim_v. On success *resolved holds
 * the descriptor with Dv resolved and *k_bytes / *v_bytes the storage sizes
 * in bytes (each <= PTRDIFF_MAX). fn names the public caller for messages. */
static kva_status validate_desc(const char *fn, const kva_cache_desc *d, kva_cache_desc *resolved,
                                uint64_t *k_bytes, uint64_t *v_bytes, uint64_t *t_bytes)
{
    if (d->num_blocks < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: desc->num_blocks = %d, must be >= 1", fn,
                         (int)d->num_blocks);
    if (d->block_size < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: desc->block_size = %d, must be >= 1", fn,
                         (int)d->block_size);
    if (d->num_kv_heads < 1 || d->num_kv_heads > KVA_MAX_HEADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->num_kv_heads = %d is outside [1, %d] (KVA_MAX_HEADS)", fn,
                         (int)d->num_kv_heads, KVA_MAX_HEADS);
    if (d->head_dim < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: desc->head_dim = %d, must be >= 1", fn,
                         (int)d->head_dim);
    if (!kva__head_dim_ok(d->head_dim))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->head_dim = %d is not supported (multiples of 8 from 8 to %d)",
                         fn, (int)d->head_dim, KVA_MAX_HEAD_DIM);
    if (d->head_dim_v < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->head_dim_v = %d is negative (0 means head_dim)", fn,
                         (int)d->head_dim_v);
    int32_t dv = d->head_dim_v == 0 ? d->head_dim : d->head_dim_v;
    if (!kva__head_dim_ok(dv))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->head_dim_v = %d is not supported (multiples of 8 from 8 to %d)",
                         fn, (int)dv, KVA_MAX_HEAD_DIM);
    if (d->layout != KVA_LAYOUT_NHD && d->layout != KVA_LAYOUT_HND)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->layout = %d is not a kva_layout (NHD = 0, HND = 1)", fn,
                         (int)d->layout);
    if ((unsigned)d->quant >= (unsigned)KVA_QUANT_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->quant = %d is not a kva_quant (0 .. %d)", fn, (int)d->quant,
                         (int)KVA_QUANT_COUNT_ - 1);
    if ((unsigned)d->dtype >= (unsigned)KVA_DTYPE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: desc->dtype = %d is not a kva_dtype", fn,
                         (int)d->dtype);
    if ((unsigned)d->kind >= (unsigned)KVA_ATTN_KIND_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->kind = %d is not a kva_attn_kind (0 .. %d)", fn, (int)d->kind,
                         (int)KVA_ATTN_KIND_COUNT_ - 1);
    /* A format that exists for one kind only (kvattn.h: fp8_ds_mla for MLA,
     * fp8_token for index keys) with another kind contradicts itself:
     * INVALID_ARGUMENT. A kind's own checks then refuse the formats it does
     * not implement with UNSUPPORTED. */
    const kva_attn_kind format_kind = d->quant == KVA_QUANT_FP8_DS_MLA  ? KVA_ATTN_MLA
                                      : d->quant == KVA_QUANT_FP8_TOKEN ? KVA_ATTN_INDEX
                                                                        : d->kind;
    if (d->kind != format_kind)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc->quant = %s is a format of kind %s caches only (got kind %d)",
                         fn, kva_quant_name(d->quant),
                         format_kind == KVA_ATTN_MLA ? "KVA_ATTN_MLA" : "KVA_ATTN_INDEX",
                         (int)d->kind);
    if (d->kind == KVA_ATTN_MLA)
        KVA_TRY(validate_mla(fn, d));
    if (d->kind == KVA_ATTN_INDEX)
        KVA_TRY(kva__index_cache_validate(fn, d));
    kva_dtype k_dtype = d->dtype; /* storage dtype of K elements */
    if (d->quant == KVA_QUANT_NONE) {
        if (!kva__dtype_is_float(d->dtype))
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "%s: desc->dtype = %s is not a storage dtype for KVA_QUANT_NONE "
                             "(f32, f16 or bf16)",
                             fn, kva_dtype_name(d->dtype));
    } else if (d->quant == KVA_QUANT_INT8_TOKEN_K_V16) {
        /* dtype is V's; K is int8. */
        if (d->dtype != KVA_DTYPE_F16 && d->dtype != KVA_DTYPE_BF16)
            return kva__fail(KVA_STATUS_DTYPE_MISMATCH,
                             "%s: desc->dtype = %s must be f16 or bf16 (the V dtype) for quant %s",
                             fn, kva_dtype_name(d->dtype), kva_quant_name(d->quant));
        k_dtype = KVA_DTYPE_I8;
    } else {
        const kva_dtype want = d->quant == KVA_QUANT_FP8_E4M3 || d->quant == KVA_QUANT_FP8_TOKEN ||
                                       d->quant == KVA_QUANT_FP8_DS_MLA
                                   ? KVA_DTYPE_FP8_E4M3
                                   : KVA_DTYPE_I8;
        if (d->dtype != want)
            return kva__fail(KVA_STATUS_DTYPE_MISMATCH,
                             "%s: desc->dtype = %s does not fit desc->quant = %s (needs %s)", fn,
                             kva_dtype_name(d->dtype), kva_quant_name(d->quant),
                             kva_dtype_name(want));
    }

    /* Bytes of K and V: NB * B * Hkv * {D, Dv} * elem, bounded by PTRDIFF_MAX so
     * that byte offsets fit a signed 64-bit integer everywhere. */
    const uint64_t limit = (uint64_t)PTRDIFF_MAX;
    uint64_t rows = 0, kb = 0, vb = 0, tb = 0;
    size_t elem = kva_dtype_size(k_dtype), v_elem = kva_dtype_size(d->dtype);
    /* Bytes of one kv head's K row: D elements, an fp8_ds_mla row, or an
     * FP8_TOKEN row with its float32 scale (D + 4 bytes). MLA and index-key
     * caches keep no V rows. */
    const uint64_t k_row = d->quant == KVA_QUANT_FP8_DS_MLA
                               ? (uint64_t)kva__ds_mla_row_bytes(d->head_dim, d->head_dim_v)
                               : (uint64_t)d->head_dim * elem + kva__index_scale_bytes(d);
    int ok = mul_within((uint64_t)d->num_blocks, (uint64_t)d->block_size, limit, &rows) &&
             mul_within(rows, (uint64_t)d->num_kv_heads, limit, &rows) &&
             mul_within(rows, k_row, limit, &kb) &&
             mul_within(rows, d->kind != KVA_ATTN_MHA ? 0 : (uint64_t)dv * v_elem, limit, &vb) &&
             mul_within(rows, sizeof(float), limit, &tb);
    if (!ok)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: desc: num_blocks %d * block_size %d * num_kv_heads %d * head_dim "
                         "%d/%d * %zu bytes overflows the address space",
                         fn, (int)d->num_blocks, (int)d->block_size, (int)d->num_kv_heads,
                         (int)d->head_dim, (int)dv, elem);
    *resolved = *d;
    resolved->head_dim_v = dv;
    *k_bytes = kb;
    *v_bytes = vb;
    *t_bytes = tb;
    return KVA_STATUS_OK;
}

/* A latent cache only on a backend with MLA kernels (an fp8_ds_mla one with
 * sparse MLA kernels): its memory space's write and copies must know the
 * latent row layout too. */
static kva_status check_mla_backend(const char *fn, const kva_context *ctx, const kva_cache_desc *d)
{
    if (d->kind == KVA_ATTN_MLA && !ctx->ops->mla_attention_paged)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->kind = KVA_ATTN_MLA: backend '%s' has no MLA kernels", fn,
                         kva_backend_name(ctx->backend));
    /* Only sparse plans read fp8_ds_mla rows: the backend's memory space
     * writes them when it has the sparse kernels. */
    if (d->quant == KVA_QUANT_FP8_DS_MLA && !ctx->ops->mla_sparse)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->quant = fp8_ds_mla: backend '%s' has no sparse MLA kernels", fn,
                         kva_backend_name(ctx->backend));
    if (d->kind == KVA_ATTN_INDEX && !ctx->ops->indexer)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->kind = KVA_ATTN_INDEX: backend '%s' has no indexer", fn,
                         kva_backend_name(ctx->backend));
    return KVA_STATUS_OK;
}

/* Allocates the handle and fills its derived fields; k/v are set by the caller. */
static kva_status new_handle(const char *fn, kva_context *ctx, const kva_cache_desc *resolved,
                             kva_cache **out)
{
    kva_cache *c = calloc(1, sizeof *c);
    unsigned char *flags = calloc((size_t)resolved->num_blocks, 1);
    if (!c || !flags) {
        free(c);
        free(flags);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for the cache handle", fn);
    }
    c->pair_flags = flags;
    c->desc = *resolved;
    c->mem = ctx->ops->memory;
    c->device_id = ctx->device_id;
    const int k_int8 = resolved->quant == KVA_QUANT_INT8_TOKEN_K_V16;
    c->k_dtype = k_int8 ? KVA_DTYPE_I8 : resolved->dtype;
    c->elem_size = kva_dtype_size(c->k_dtype);
    c->v_elem = kva_dtype_size(resolved->dtype);
    int64_t rows = (int64_t)resolved->block_size * resolved->num_kv_heads;
    c->k_block_elems = rows * resolved->head_dim;
    /* An FP8_TOKEN block ends with its B float32 scales (1-byte elements). */
    c->k_block_elems += rows * (int64_t)kva__index_scale_bytes(resolved);
    /* fp8_ds_mla rows are bytes of mixed types (codes, scales, bf16): the
     * block is B rows of kva__ds_mla_row_bytes 1-byte elements. */
    if (resolved->quant == KVA_QUANT_FP8_DS_MLA)
        c->k_block_elems = rows * kva__ds_mla_row_bytes(resolved->head_dim, resolved->head_dim_v);
    /* An MLA cache keeps its values inside the K rows, an index-key cache
     * has none: no V storage. */
    c->v_block_elems = resolved->kind != KVA_ATTN_MHA ? 0 : rows * resolved->head_dim_v;
    *out = c;
    return KVA_STATUS_OK;
}

/* Points the cache's static scale arrays into the one expanded allocation
 * (kva__quant_params_expand's order), which the cache now owns; NULL: none. */
static void set_scales(kva_cache *c, float *scales)
{
    if (!scales)
        return;
    const int64_t hkv = c->desc.num_kv_heads;
    c->k_scale = scales;
    c->k_offset = c->k_scale + hkv * c->desc.head_dim;
    c->v_scale = c->k_offset + hkv * c->desc.head_dim;
    c->v_offset = c->v_scale + hkv * c->desc.head_dim_v;
}

/* The body of kva_cache_create(_quant): validates desc and params, then
 * allocates K, V, the expanded static scales and the per-token key scales. */
static kva_status create(const char *fn, kva_context *ctx, const kva_cache_desc *desc,
                         const kva_quant_params *params, kva_cache **out)
{
    kva_cache_desc d;
    uint64_t kb, vb, tb;
    KVA_TRY(validate_desc(fn, desc, &d, &kb, &vb, &tb));
    KVA_TRY(kva__head_dim_check(fn, ctx, "desc->head_dim", d.head_dim));
    KVA_TRY(kva__head_dim_check(fn, ctx, "desc->head_dim_v", d.head_dim_v));
    KVA_TRY(check_mla_backend(fn, ctx, &d));
    float *scales = NULL;
    KVA_TRY(kva__quant_params_expand(fn, &d, params, &scales));
    kva_cache *c = NULL;
    kva_status st = new_handle(fn, ctx, &d, &c);
    if (st != KVA_STATUS_OK) {
        free(scales);
        return st;
    }
    set_scales(c, scales);
    /* Storage in the context's memory space (src/cache/host_memory.c; CUDA:
     * device memory plus device copies of the static scales). */
    st = c->mem->cache_alloc(ctx, c);
    if (st != KVA_STATUS_OK) {
        kva_cache_destroy(c);
        return st;
    }
    *out = c;
    return KVA_STATUS_OK;
}

kva_status kva_cache_create_quant(kva_context *ctx, const kva_cache_desc *desc,
                                  const kva_quant_params *params, kva_cache **out)
{
    static const char fn[] = "kva_cache_create_quant";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(out);
    return create(fn, ctx, desc, params, out);
}

kva_status kva_cache_create(kva_context *ctx, const kva_cache_desc *desc, kva_cache **out)
{
    static const char fn[] = "kva_cache_create";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(out);
    return create(fn, ctx, desc, NULL, out);
}

/* Wraps caller storage k_data / v_data for desc (validated here). interleaved
 * = 1 skips the K/V overlap check: kva_cache_create_from_interleaved's K and
 * V bases are one page apart by design. */
static kva_status wrap(const char *fn, kva_context *ctx, const kva_cache_desc *desc, void *k_data,
                       void *v_data, int interleaved, kva_cache **out)
{
    kva_cache_desc d;
    uint64_t kb, vb, tb;
    KVA_TRY(validate_desc(fn, desc, &d, &kb, &vb, &tb));
    KVA_TRY(kva__head_dim_check(fn, ctx, "desc->head_dim", d.head_dim));
    KVA_TRY(kva__head_dim_check(fn, ctx, "desc->head_dim_v", d.head_dim_v));
    KVA_TRY(check_mla_backend(fn, ctx, &d));
    if (d.quant != KVA_QUANT_NONE)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->quant = %s: caller-owned storage is for unquantized caches "
                         "only; use kva_cache_create_quant",
                         fn, kva_quant_name(d.quant));
    /* Elements are accessed through typed pointers, so the storage must be
     * aligned to the element size. */
    size_t elem = kva_dtype_size(d.dtype);
    if ((uintptr_t)k_data % elem != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: k_data = %p is not aligned to the %zu-byte %s element", fn, k_data,
                         elem, kva_dtype_name(d.dtype));
    if (d.kind != KVA_ATTN_MHA) {
        if (v_data)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: v_data = %p, but an MLA cache keeps its values in the K rows "
                             "and an index-key cache has none: pass NULL",
                             fn, v_data);
        v_data = k_data;
        vb = 0;
    }
    if ((uintptr_t)v_data % elem != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: v_data = %p is not aligned to the %zu-byte %s element", fn, v_data,
                         elem, kva_dtype_name(d.dtype));
    /* K and V must not overlap, or writes to one would corrupt the other. */
    uintptr_t k0 = (uintptr_t)k_data, v0 = (uintptr_t)v_data;
    if (!interleaved && k0 < v0 + vb && v0 < k0 + kb)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: k_data = %p (%llu bytes) and v_data = %p (%llu bytes) overlap", fn,
                         k_data, (unsigned long long)kb, v_data, (unsigned long long)vb);
    kva_cache *c = NULL;
    KVA_TRY(new_handle(fn, ctx, &d, &c));
    c->k = k_data;
    c->v = v_data;
    c->owns_memory = 0;
    *out = c;
    return KVA_STATUS_OK;
}

kva_status kva_cache_create_from(kva_context *ctx, const kva_cache_desc *desc, void *k_data,
                                 void *v_data, kva_cache **out)
{
    static const char fn[] = "kva_cache_create_from";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(k_data);
    if (desc->kind == KVA_ATTN_MHA)
        KVA_CHECK_PTR(v_data);
    KVA_CHECK_PTR(out);
    return wrap(fn, ctx, desc, k_data, v_data, 0, out);
}

kva_status kva_cache_create_from_interleaved(kva_context *ctx, const kva_cache_desc *desc,
                                             void *kv_data, kva_cache **out)
{
    static const char fn[] = "kva_cache_create_from_interleaved";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(kv_data);
    KVA_CHECK_PTR(out);
    kva_cache_desc d;
    uint64_t kb, vb, tb;
    KVA_TRY(validate_desc(fn, desc, &d, &kb, &vb, &tb));
    if (d.kind != KVA_ATTN_MHA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: desc->kind = %s: latent and index-key caches have no V pages to "
                         "interleave; use kva_cache_create_from",
                         fn, d.kind == KVA_ATTN_MLA ? "KVA_ATTN_MLA" : "KVA_ATTN_INDEX");
    if (d.head_dim_v != d.head_dim)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: head_dim_v = %d differs from head_dim = %d: interleaved K/V pages "
                         "have one size",
                         fn, (int)d.head_dim_v, (int)d.head_dim);
    if (d.num_blocks > (INT32_MAX - 1) / 2 + 1)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE, "%s: num_blocks = %d pages is too many", fn,
                         (int)d.num_blocks);
    /* NB pages of K, each followed by its V page: a cache of 2*NB - 1 blocks
     * whose block 2p is page p, K based at kv_data, V one page later. */
    uint64_t page = kb / (uint64_t)d.num_blocks;
    d.num_blocks = 2 * d.num_blocks - 1;
    return wrap(fn, ctx, &d, kv_data, (char *)kv_data + page, 1, out);
}

kva_status kva__cache_check_space(const char *fn, const kva_context *ctx, const kva_cache *cache)
{
    if (cache->mem != ctx->ops->memory)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: cache lives in %s memory but the context's backend '%s' reads %s "
                         "memory",
                         fn, cache->mem->name, kva_backend_name(ctx->backend),
                         ctx->ops->memory->name);
    if (cache->mem->per_device && cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: cache lives on device %d but the context uses device %d", fn,
                         (int)cache->device_id, (int)ctx->device_id);
    return KVA_STATUS_OK;
}

void kva_cache_destroy(kva_cache *cache)
{
    if (!cache)
        return;
    cache->mem->cache_free(cache); /* k, v if owned, token scales, device copies */
    free(cache->k_scale);          /* the one allocation of all static scales */
    free(cache->pair_flags);
    free(cache);
}

kva_status kva_cache_get_desc(const kva_cache *cache, kva_cache_desc *out)
{
    kva__clear_error();
    KVA_CHECK_PTR(cache);
    KVA_CHECK_PTR(out);
    *out = cache->desc;
    return KVA_STATUS_OK;
}

kva_status kva_cache_data(const kva_cache *cache, void **k_data, void **v_data)
{
    kva__clear_error();
    KVA_CHECK_PTR(cache);
    if (k_data)
        *k_data = cache->k;
    /* An index-key cache has no V storage: v_data is NULL (kvattn.h), though
     * cache->v points at K inside the library (as an MLA cache's does, whose
     * values are the first Dc columns of its K rows). */
    if (v_data)
        *v_data = cache->desc.kind == KVA_ATTN_INDEX ? NULL : cache->v;
    return KVA_STATUS_OK;
}

kva_status kva_cache_token_scales(const kva_cache *cache, float **scales)
{
    kva__clear_error();
    KVA_CHECK_PTR(cache);
    KVA_CHECK_PTR(scales);
    *scales = cache->k_token_scale;
    return KVA_STATUS_OK;
}

size_t kva_cache_block_bytes_k(const kva_cache *cache)
{
    return cache ? (size_t)cache->k_block_elems * cache->elem_size : 0;
}

size_t kva_cache_block_bytes_v(const kva_cache *cache)
{
    return cache ? (size_t)cache->v_block_elems * cache->v_elem : 0;
}

size_t kva_cache_block_bytes_scales(const kva_cache *cache)
{
    if (!cache || !cache->k_token_scale)
        return 0;
    return (size_t)cache->desc.block_size * (size_t)cache->desc.num_kv_heads * sizeof(float);
}

size_t kva_cache_static_scale_bytes(const kva_cache *cache)
{
    if (!cache || !cache->k_scale)
        return 0;
    const size_t hkv = (size_t)cache->desc.num_kv_heads;
    return 2 * hkv * ((size_t)cache->desc.head_dim + (size_t)cache->desc.head_dim_v) *
           sizeof(float);
}
