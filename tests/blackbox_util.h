/*
 * blackbox_util.h - helpers of the black-box API tests (test_api_blackbox*.c):
 * the backends compared, a checksum of buffers a failing call must leave
 * alone, the BAD() check of a failing call, and a small fixture (a CPU or
 * reference context, a cache, a plan, q, out, lse) with its "untouched" test.
 */
#ifndef KVA_TEST_BLACKBOX_UTIL_H
#define KVA_TEST_BLACKBOX_UTIL_H

#include "cache_util.h"

static const kva_backend kBk[2] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};

/* A failing call: the status, a message, and nothing else. */
#define BAD(expr, st)                                                                              \
    do {                                                                                           \
        CHECK_STATUS(expr, st);                                                                    \
        CHECK_MSG(kva_last_error()[0] != '\0', "%s: no message", #expr);                           \
    } while (0)

/* FNV-1a of a byte range: checksums of buffers that a failing call must not change. */
static inline uint64_t bb_sum(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The fixture of the bad-input cases: a cache, a plan, q, out, lse. */
typedef struct bb_fix {
    kva_context *ctx;
    kva_cache *cache;
    kva_plan *plan;
    kva_plan_desc pd;
    int32_t qsl[3], sl[2], bt[6];
    float q[4 * 4 * 16], out[4 * 4 * 16], lse[16];
    uint64_t sum_cache, sum_out, sum_lse;
    kva_plan_info info;
} bb_fix;

static inline uint64_t bb_cache_sum(const kva_cache *c)
{
    kva_cache_desc d;
    void *k = NULL, *v = NULL;
    if (kva_cache_get_desc(c, &d) != KVA_STATUS_OK || kva_cache_data(c, &k, &v) != KVA_STATUS_OK)
        return 0;
    return bb_sum(k, store_bytes(&d, d.head_dim)) ^ (bb_sum(v, store_bytes(&d, d.head_dim_v)) << 1);
}

/* The small causal f32 plan of the fixture and of other cases over a cache of
 * 6 blocks of 3 tokens (2 KV heads, D 16): 2 requests, 4 query heads, block
 * table stride 3. */
static inline kva_plan_desc bb_small_desc(const int32_t *qsl, const int32_t *sl, const int32_t *bt)
{
    return (kva_plan_desc){.num_requests = 2,
                           .query_start_loc = qsl,
                           .seq_lens = sl,
                           .block_table = bt,
                           .block_table_stride = 3,
                           .block_size = 3,
                           .num_heads = 4,
                           .num_kv_heads = 2,
                           .head_dim = 16,
                           .q_dtype = KVA_DTYPE_F32,
                           .causal = 1,
                           .window_left = -1};
}

static inline void bb_fix_init(bb_fix *f, kva_backend b, uint64_t seed)
{
    kva_rng rng = {seed};
    memset(f, 0, sizeof *f);
    f->ctx = new_ctx(b, 2);
    kva_cache_desc cd = make_desc(6, 3, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    CHECK_OK(kva_cache_create(f->ctx, &cd, &f->cache));
    fill_cache(f->cache, &rng);
    const int32_t qsl[3] = {0, 1, 4}, sl[2] = {7, 5}, bt[6] = {5, 1, 3, 0, 2, -1};
    memcpy(f->qsl, qsl, sizeof qsl);
    memcpy(f->sl, sl, sizeof sl);
    memcpy(f->bt, bt, sizeof bt);
    f->pd = bb_small_desc(f->qsl, f->sl, f->bt);
    CHECK_OK(kva_plan_create(f->ctx, &f->pd, &f->plan));
    CHECK_OK(kva_plan_get_info(f->plan, &f->info));
    kva_test_fill(f->q, KVA_DTYPE_F32, 4 * 4 * 16, &rng, 1.0);
    kva_test_poison(f->out, KVA_DTYPE_F32, 4 * 4 * 16);
    kva_test_poison(f->lse, KVA_DTYPE_F32, 16);
    f->sum_cache = bb_cache_sum(f->cache);
    f->sum_out = bb_sum(f->out, sizeof f->out);
    f->sum_lse = bb_sum(f->lse, sizeof f->lse);
}

/* Cache, out, lse and the plan's info as they were. */
static inline int bb_untouched(const bb_fix *f)
{
    kva_plan_info info;
    memset(&info, 0xab, sizeof info);
    return bb_cache_sum(f->cache) == f->sum_cache && bb_sum(f->out, sizeof f->out) == f->sum_out &&
           bb_sum(f->lse, sizeof f->lse) == f->sum_lse &&
           kva_plan_get_info(f->plan, &info) == KVA_STATUS_OK &&
           memcmp(&info, &f->info, sizeof info) == 0;
}

static inline void bb_fix_free(bb_fix *f)
{
    kva_plan_destroy(f->plan);
    kva_cache_destroy(f->cache);
    kva_context_destroy(f->ctx);
}

#endif /* KVA_TEST_BLACKBOX_UTIL_H */
