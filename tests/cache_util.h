/*
 * cache_util.h - helpers shared by the cache tests: contexts, descriptors,
 * the test's own layout index math, byte snapshots of a cache's storage, and
 * the expected effect of writes and block copies on a snapshot, random
 * static scales of a quantized cache.
 */
#ifndef KVA_TEST_CACHE_UTIL_H
#define KVA_TEST_CACHE_UTIL_H

#include "harness.h"
#include "internal.h"

static inline kva_context *new_ctx(kva_backend backend, int32_t threads)
{
    kva_context_desc cd = {backend, threads, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    return ctx;
}

static inline kva_cache_desc make_desc(int32_t nb, int32_t b, int32_t hkv, int32_t d, int32_t dv,
                                       kva_dtype dt, kva_layout layout)
{
    kva_cache_desc desc = {nb, b, hkv, d, dv, dt, layout, KVA_QUANT_NONE, KVA_ATTN_MHA};
    return desc;
}

/* Element offset of (block, off, head) of a row of width dim, written with
 * explicit strides of each layout. */
static inline uint64_t ref_offset(const kva_cache_desc *d, uint64_t block, uint64_t off,
                                  uint64_t head, uint64_t dim)
{
    uint64_t b = (uint64_t)d->block_size, h = (uint64_t)d->num_kv_heads;
    uint64_t block_stride = b * h * dim;
    if (d->layout == KVA_LAYOUT_NHD)
        return block * block_stride + off * (h * dim) + head * dim;
    return block * block_stride + head * (b * dim) + off * dim;
}

/* Total bytes of K (dim = D) or V (dim = Dv). */
static inline size_t store_bytes(const kva_cache_desc *d, int32_t dim)
{
    return (size_t)d->num_blocks * (size_t)d->block_size * (size_t)d->num_kv_heads * (size_t)dim *
           kva_dtype_size(d->dtype);
}

/* Snapshot of a cache's K and V storage. */
typedef struct {
    void *k, *v;
    size_t kb, vb;
} snapshot;

static inline snapshot take(const kva_cache *c)
{
    kva_cache_desc d;
    void *k, *v;
    CHECK_OK(kva_cache_get_desc(c, &d));
    CHECK_OK(kva_cache_data(c, &k, &v));
    snapshot s = {NULL, NULL, store_bytes(&d, d.head_dim), store_bytes(&d, d.head_dim_v)};
    s.k = malloc(s.kb);
    s.v = malloc(s.vb);
    memcpy(s.k, k, s.kb);
    memcpy(s.v, v, s.vb);
    return s;
}

/* 1 if the cache's storage equals the snapshot byte for byte. */
static inline int same(const kva_cache *c, const snapshot *s)
{
    void *k, *v;
    kva_cache_data(c, &k, &v);
    return memcmp(k, s->k, s->kb) == 0 && memcmp(v, s->v, s->vb) == 0;
}

static inline void drop(snapshot *s)
{
    free(s->k);
    free(s->v);
}

/* Fills the whole storage of a cache with random values of its dtype. */
static inline void fill_cache(kva_cache *c, kva_rng *r)
{
    kva_cache_desc d;
    void *k, *v;
    kva_cache_get_desc(c, &d);
    kva_cache_data(c, &k, &v);
    size_t es = kva_dtype_size(d.dtype);
    kva_test_fill(k, d.dtype, store_bytes(&d, d.head_dim) / es, r, 1.0);
    kva_test_fill(v, d.dtype, store_bytes(&d, d.head_dim_v) / es, r, 1.0);
}

/* Copies blocks of the snapshot (K and V) with the test's own block math. */
static inline void expect_copy(snapshot *dst, const snapshot *src, const kva_cache_desc *d,
                               const int32_t *pairs, int32_t n)
{
    size_t es = kva_dtype_size(d->dtype);
    size_t kbb = (size_t)d->block_size * d->num_kv_heads * d->head_dim * es;
    size_t vbb = (size_t)d->block_size * d->num_kv_heads * d->head_dim_v * es;
    for (int32_t i = 0; i < n; i++) {
        size_t s = (size_t)pairs[2 * i], t = (size_t)pairs[2 * i + 1];
        if (dst == src && s == t)
            continue;
        memcpy((char *)dst->k + t * kbb, (const char *)src->k + s * kbb, kbb);
        memcpy((char *)dst->v + t * vbb, (const char *)src->v + s * vbb, vbb);
    }
}

/* Random static scales of a quantized cache for unit-variance uniform data
 * (|x| < 1.7321): gran 0 per channel, 1 per kv head, 2 per tensor. buf holds
 * 2*Hkv*(D+Dv) floats. */
static inline void make_params(kva_quant q, int32_t Hkv, int32_t D, int32_t Dv, int gran,
                               kva_rng *r, float *buf, kva_quant_params *p)
{
    memset(p, 0, sizeof *p);
    float *ks = buf, *ko = ks + Hkv * D, *vs = ko + Hkv * D, *vo = vs + Hkv * Dv;
    for (int32_t i = 0; i < Hkv * D; i++) {
        ks[i] = (float)((1.8 + 0.7 * kva_rng_unit(r)) / 127.0);
        ko[i] = (float)(6.0 * kva_rng_unit(r) - 3.0);
    }
    for (int32_t i = 0; i < Hkv * Dv; i++) {
        vs[i] = (float)((1.8 + 0.7 * kva_rng_unit(r)) / 127.0);
        vo[i] = (float)(6.0 * kva_rng_unit(r) - 3.0);
    }
    const int64_t kl = gran == 0 ? Hkv * D : gran == 1 ? Hkv : 1;
    const int64_t vl = gran == 0 ? Hkv * Dv : gran == 1 ? Hkv : 1;
    if (q == KVA_QUANT_INT8_CHANNEL) {
        *p = (kva_quant_params){ks, kl, gran == 2 ? NULL : ko, gran == 2 ? 0 : kl, vs, vl, vo, vl};
    } else if (q == KVA_QUANT_INT8_TOKEN_K) {
        p->v_scale = vs, p->v_scale_len = vl;
        p->v_offset = gran == 1 ? NULL : vo, p->v_offset_len = gran == 1 ? 0 : vl;
    } else if (q == KVA_QUANT_FP8_E4M3) {
        for (int32_t h = 0; h < Hkv; h++) {
            ks[h] = (float)(0.004 + 0.016 * kva_rng_unit(r));
            vs[h] = (float)(0.004 + 0.016 * kva_rng_unit(r));
        }
        p->k_scale = ks, p->k_scale_len = gran == 2 ? 1 : Hkv;
        p->v_scale = vs, p->v_scale_len = gran == 2 ? 1 : Hkv;
    }
}

#endif /* KVA_TEST_CACHE_UTIL_H */
