/*
 * cache_copy.c - whole-block copies: kva_cache_copy_blocks inside one cache
 * (copy-on-write of shared blocks) and kva_cache_swap_blocks between two
 * caches of the same shape (swap-out / swap-in).
 *
 * In both layouts block b of K is the contiguous byte range
 * [b * B*Hkv*D*elem, (b+1) * B*Hkv*D*elem) and likewise for V, so a block copy
 * is one memcpy of K and one of V, plus one of its per-token key scales
 * ([NB, Hkv, B] float32) for the INT8_TOKEN_K formats. Static scales belong to
 * the cache, not to blocks: swap_blocks requires src and dst to hold equal ones.
 *
 * Semantics of the pairs [n, 2] = (src, dst):
 *   - every id is checked to be in range before anything is copied;
 *   - a dst block that appears in two pairs is an error (INVALID_ARGUMENT);
 *   - copy_blocks: a pair with src == dst is a no-op and is allowed;
 *   - copy_blocks: a block that is the src of one pair and the dst of another
 *     (pairs with src == dst aside) is rejected with INVALID_ARGUMENT. Such
 *     chains would need either an order (which copy reads first) or
 *     read-before-write snapshot semantics; rejecting them keeps every pair
 *     independent, so pairs can be copied in any order and in parallel.
 *   - swap_blocks: src and dst are different caches whose storage must not
 *     overlap, so the chain question does not arise.
 */
#include "internal.h"

#include <string.h>

/* Below this many bytes copied in total the copy stays on one thread. */
#define KVA_COPY_PARALLEL_BYTES 1048576.0

/* Per-block marks in kva_cache.pair_flags, which find duplicates and chains in
 * O(pairs) and are cleared again before the check returns. */
enum { FLAG_DST = 1, FLAG_SRC_MOVING = 2, FLAG_DST_MOVING = 4 };

/* Checks that every id of pairs is in range: column 0 against src_blocks,
 * column 1 against dst_blocks. */
static kva_status check_ids(const char *fn, const int32_t *pairs, int32_t n, int32_t src_blocks,
                            int32_t dst_blocks)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t s = pairs[2 * (int64_t)i], t = pairs[2 * (int64_t)i + 1];
        if (s < 0 || s >= src_blocks)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: pairs[%d][0] = %d (src block) is outside [0, %d)", fn, (int)i,
                             (int)s, (int)src_blocks);
        if (t < 0 || t >= dst_blocks)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: pairs[%d][1] = %d (dst block) is outside [0, %d)", fn, (int)i,
                             (int)t, (int)dst_blocks);
    }
    return KVA_STATUS_OK;
}

static kva_status fail_duplicate(const char *fn, const int32_t *pairs, int32_t i)
{
    return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                     "%s: pairs[%d][1] = %d: dst block appears in an earlier pair", fn, (int)i,
                     (int)pairs[2 * (int64_t)i + 1]);
}

static kva_status fail_chain(const char *fn, const int32_t *pairs, int32_t i)
{
    return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                     "%s: pairs[%d][0] = %d: block is both a src and the dst of another pair "
                     "(chained copies are not supported)",
                     fn, (int)i, (int)pairs[2 * (int64_t)i]);
}

/* Rejects duplicate dst ids and, if check_chains, blocks that are both the src
 * of one moving pair and the dst of another (a moving pair has src != dst).
 * Ids are in range. flags [NB of the dst cache] is all zero on entry and is
 * left all zero on return. */
static kva_status check_pairs(const char *fn, const int32_t *pairs, int32_t n, unsigned char *flags,
                              int check_chains)
{
    kva_status st = KVA_STATUS_OK;
    int32_t marked = 0; /* pairs 0 .. marked-1 have set their flags */
    for (; marked < n; marked++) {
        int32_t s = pairs[2 * (int64_t)marked], t = pairs[2 * (int64_t)marked + 1];
        if (flags[t] & FLAG_DST) {
            st = fail_duplicate(fn, pairs, marked);
            break;
        }
        flags[t] |= FLAG_DST;
        if (check_chains && s != t) {
            flags[s] |= FLAG_SRC_MOVING;
            flags[t] |= FLAG_DST_MOVING;
        }
    }
    if (st == KVA_STATUS_OK && check_chains) {
        for (int32_t i = 0; i < n; i++) {
            int32_t s = pairs[2 * (int64_t)i], t = pairs[2 * (int64_t)i + 1];
            if (s != t && (flags[s] & FLAG_DST_MOVING)) {
                st = fail_chain(fn, pairs, i);
                break;
            }
        }
    }
    for (int32_t i = 0; i < marked; i++) {
        flags[pairs[2 * (int64_t)i + 1]] = 0;
        if (check_chains)
            flags[pairs[2 * (int64_t)i]] = 0;
    }
    return st;
}

/* Copies block pairs from src storage to dst storage (K and V). The caches
 * have equal block sizes; pairs are validated and independent. */
static void copy_pairs(const kva_context *ctx, const kva_cache *src, kva_cache *dst,
                       const int32_t *pairs, int32_t n)
{
    const int64_t kbb = src->k_block_elems * (int64_t)src->elem_size;
    const int64_t vbb = src->v_block_elems * (int64_t)src->v_elem;
    /* Per-token key scales [NB, Hkv, B]: block b is B*Hkv contiguous floats. */
    const int64_t tsb =
        src->k_token_scale ? (int64_t)src->desc.block_size * src->desc.num_kv_heads : 0;
    const float *sts = src->k_token_scale;
    float *dts = dst->k_token_scale;
    const char *sk = src->k, *sv = src->v;
    char *dk = dst->k, *dv = dst->v;
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    const double total = (double)n * (double)(kbb + vbb);
    const int parallel = nt > 1 && n > 1 && total >= KVA_COPY_PARALLEL_BYTES;
    (void)nt; /* unused without OpenMP */
    (void)parallel;
#pragma omp parallel for num_threads(nt) schedule(static) if (parallel)
    for (int32_t i = 0; i < n; i++) {
        int64_t s = pairs[2 * (int64_t)i], t = pairs[2 * (int64_t)i + 1];
        if (src == dst && s == t)
            continue;
        memcpy(dk + t * kbb, sk + s * kbb, (size_t)kbb);
        memcpy(dv + t * vbb, sv + s * vbb, (size_t)vbb);
        if (tsb)
            memcpy(dts + t * tsb, sts + s * tsb, (size_t)tsb * sizeof(float));
    }
}

/* A context copies caches in its own memory space (on its device) and caches
 * in host memory, which every space reaches (CUDA: swap-out and swap-in);
 * memory of another space or device is out of its reach. */
static kva_status check_host(const char *fn, const kva_context *ctx, const kva_cache *c,
                             const char *name)
{
    const kva__memory_ops *own = ctx->ops->memory;
    if (c->mem != own && !c->mem->host)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: ctx backend '%s' (%s memory) cannot copy %s, which lives in %s "
                         "memory",
                         fn, kva_backend_name(ctx->backend), own->name, name, c->mem->name);
    if (c->mem == own && own->per_device && c->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: %s lives on device %d but the context uses device %d", fn, name,
                         (int)c->device_id, (int)ctx->device_id);
    return KVA_STATUS_OK;
}

/* The host memory space's block copy (kva__host_memory): both caches are in
 * host memory. */
kva_status kva__host_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t n)
{
    copy_pairs(ctx, src, dst, pairs, n);
    return KVA_STATUS_OK;
}

/* Copies validated pairs through the context's memory space (CUDA:
 * device<->device, device<->host, host<->host on its stream). */
static kva_status do_copy(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                          const int32_t *pairs, int32_t n)
{
    return ctx->ops->memory->copy_blocks(ctx, src, dst, pairs, n);
}

/* The aliasing rule (kvattn.h) for a block copy into dst: no byte of dst's
 * storage (K, V, per-token key scales) may overlap the pairs array or, when
 * src is another cache, src's storage. */
static kva_status check_copy_aliasing(const char *fn, const kva_cache *src, const kva_cache *dst,
                                      const int32_t *pairs, int32_t n)
{
    kva__span ins[4] = {{"pairs", pairs, kva__span_bytes(n, 2, sizeof(int32_t)), 0, 0}};
    int ni = 1;
    if (src != dst) {
        kva__cache_spans(src, &ins[1]);
        ins[1].name = "src cache K";
        ins[2].name = "src cache V";
        ins[3].name = "src cache key scales";
        ni = 4;
    }
    kva__span store[3];
    kva__cache_spans(dst, store);
    for (int i = 0; i < 3; i++) {
        if (src != dst)
            store[i].name = i == 0   ? "dst cache K"
                            : i == 1 ? "dst cache V"
                                     : "dst cache key scales";
        KVA_TRY(kva__check_disjoint(fn, &store[i], 1, ins, ni));
    }
    return KVA_STATUS_OK;
}

kva_status kva_cache_copy_blocks(kva_context *ctx, kva_cache *cache, const int32_t *pairs,
                                 int32_t num_pairs)
{
    static const char fn[] = "kva_cache_copy_blocks";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(cache);
    if (num_pairs < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: num_pairs = %d is negative", fn,
                         (int)num_pairs);
    KVA_TRY(check_host(fn, ctx, cache, "cache"));
    if (num_pairs == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(pairs);
    KVA_CHECK_ALIGNED(pairs, sizeof(int32_t));
    KVA_TRY(check_copy_aliasing(fn, cache, cache, pairs, num_pairs));
    int32_t nb = cache->desc.num_blocks;
    KVA_TRY(check_ids(fn, pairs, num_pairs, nb, nb));
    KVA_TRY(check_pairs(fn, pairs, num_pairs, cache->pair_flags, 1));
    return do_copy(ctx, cache, cache, pairs, num_pairs);
}

/* Checks that two caches agree in everything but num_blocks. */
static kva_status check_same_shape(const char *fn, const kva_cache_desc *a, const kva_cache_desc *b)
{
    if (a->dtype != b->dtype)
        return kva__fail(KVA_STATUS_DTYPE_MISMATCH, "%s: dtype: src is %s, dst is %s", fn,
                         kva_dtype_name(a->dtype), kva_dtype_name(b->dtype));
    if (a->quant != b->quant)
        return kva__fail(KVA_STATUS_DTYPE_MISMATCH, "%s: quant: src is %s, dst is %s", fn,
                         kva_quant_name(a->quant), kva_quant_name(b->quant));

    const struct {
        const char *name;
        int32_t x, y;
    } f[] = {
        {"layout", (int32_t)a->layout, (int32_t)b->layout},
        {"block_size", a->block_size, b->block_size},
        {"num_kv_heads", a->num_kv_heads, b->num_kv_heads},
        {"head_dim", a->head_dim, b->head_dim},
        {"head_dim_v", a->head_dim_v, b->head_dim_v},
        {"kind", (int32_t)a->kind, (int32_t)b->kind},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].x != f[i].y)
            return kva__fail(KVA_STATUS_SHAPE_MISMATCH, "%s: %s: src has %d, dst has %d", fn,
                             f[i].name, (int)f[i].x, (int)f[i].y);
    return KVA_STATUS_OK;
}

kva_status kva_cache_swap_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t num_pairs)
{
    static const char fn[] = "kva_cache_swap_blocks";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(src);
    KVA_CHECK_PTR(dst);
    if (src == dst)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: src and dst are the same cache; use kva_cache_copy_blocks", fn);
    if (num_pairs < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: num_pairs = %d is negative", fn,
                         (int)num_pairs);
    KVA_TRY(check_same_shape(fn, &src->desc, &dst->desc));
    /* Quantized bytes mean the same values only under the same static scales. */
    if (kva_cache_static_scale_bytes(src) != kva_cache_static_scale_bytes(dst) ||
        (src->k_scale &&
         memcmp(src->k_scale, dst->k_scale, kva_cache_static_scale_bytes(src)) != 0))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: src and dst have different static scales or offsets (quant %s): "
                         "their int8/fp8 codes would change meaning",
                         fn, kva_quant_name(src->desc.quant));
    KVA_TRY(check_host(fn, ctx, src, "src"));
    KVA_TRY(check_host(fn, ctx, dst, "dst"));
    /* Two caches over the same caller memory (kva_cache_create_from) would
     * make the copy order observable; reject them like src == dst (use
     * kva_cache_copy_blocks), and a pairs array inside dst's storage. */
    KVA_TRY(check_copy_aliasing(fn, src, dst, num_pairs > 0 ? pairs : NULL, num_pairs));
    if (num_pairs == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(pairs);
    KVA_CHECK_ALIGNED(pairs, sizeof(int32_t));
    KVA_TRY(check_ids(fn, pairs, num_pairs, src->desc.num_blocks, dst->desc.num_blocks));
    KVA_TRY(check_pairs(fn, pairs, num_pairs, dst->pair_flags, 0));
    return do_copy(ctx, src, dst, pairs, num_pairs);
}
