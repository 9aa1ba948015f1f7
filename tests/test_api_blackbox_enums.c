/*
 * test_api_blackbox_enums.c - black-box: every enum-typed argument and
 * descriptor field of the public API with a value outside its enum (-1, the
 * _COUNT_ value one past the last, 99, INT32_MAX), and the enum fields that
 * belong to another plan kind set on the wrong kind (kvattn.h: sparse_mode
 * "sparse MLA plans only; 0 otherwise", index_q_quant "indexer plans only;
 * 0 otherwise"): each call fails with a status and a message, makes no
 * object, and leaves an updated plan, the cache and the outputs unchanged.
 */
#include "blackbox_util.h"

static const int32_t kBad[4] = {-1, 0 /* replaced by the enum's COUNT_ */, 99, INT32_MAX};

static int32_t bad_value(int i, int32_t count)
{
    return i == 1 ? count : kBad[i];
}

/* The call failed with a message and made nothing. */
#define REFUSED(expr, made, what)                                                                  \
    do {                                                                                           \
        kva_status st_ = (expr);                                                                   \
        CHECK_MSG(st_ != KVA_STATUS_OK && kva_last_error()[0] != '\0', "%s: %s", what,             \
                  st_ == KVA_STATUS_OK ? "accepted" : "no message");                               \
        CHECK_MSG((made) == NULL, "%s: an object was made", what);                                 \
    } while (0)

static void test_object_enums(void)
{
    char what[96];
    for (int i = 0; i < 4; i++) {
        kva_context *ctx = NULL;
        kva_context_desc cd = {(kva_backend)bad_value(i, KVA_BACKEND_COUNT_), 1, 0};
        snprintf(what, sizeof what, "context backend %d", (int)cd.backend);
        REFUSED(kva_context_create(&cd, &ctx), ctx, what);
        kva_pool *pool = NULL;
        kva_pool_desc pd = {8, 4, (kva_pool_hash)bad_value(i, KVA_POOL_HASH_COUNT_), 1};
        for (int caching = 0; caching < 2; caching++) {
            pd.enable_prefix_caching = caching;
            snprintf(what, sizeof what, "pool hash %d, prefix caching %d", (int)pd.hash, caching);
            REFUSED(kva_pool_create(&pd, &pool), pool, what);
        }
    }
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    static float kd[4 * 4 * 16], vd[4 * 4 * 16];
    const kva_cache_desc base = make_desc(4, 4, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    for (int i = 0; i < 4; i++) {
        for (int field = 0; field < 4; field++) {
            kva_cache_desc d = base;
            const char *name[4] = {"dtype", "layout", "quant", "kind"};
            int32_t v = 0;
            if (field == 0)
                d.dtype = (kva_dtype)(v = bad_value(i, KVA_DTYPE_COUNT_));
            else if (field == 1)
                d.layout = (kva_layout)(v = bad_value(i, KVA_LAYOUT_HND + 1));
            else if (field == 2)
                d.quant = (kva_quant)(v = bad_value(i, KVA_QUANT_COUNT_));
            else
                d.kind = (kva_attn_kind)(v = bad_value(i, KVA_ATTN_KIND_COUNT_));
            kva_cache *c = NULL;
            snprintf(what, sizeof what, "cache_create %s %d", name[field], (int)v);
            REFUSED(kva_cache_create(ctx, &d, &c), c, what);
            snprintf(what, sizeof what, "cache_create_quant %s %d", name[field], (int)v);
            REFUSED(kva_cache_create_quant(ctx, &d, NULL, &c), c, what);
            snprintf(what, sizeof what, "cache_create_from %s %d", name[field], (int)v);
            REFUSED(kva_cache_create_from(ctx, &d, kd, vd, &c), c, what);
            snprintf(what, sizeof what, "cache_create_from_interleaved %s %d", name[field], (int)v);
            REFUSED(kva_cache_create_from_interleaved(ctx, &d, kd, &c), c, what);
        }
    }
    kva_context_destroy(ctx);
}

static void test_call_enums(void)
{
    kva_rng rng = {4300};
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    const kva_cache_desc cd = make_desc(4, 4, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &c));
    if (!c) {
        kva_context_destroy(ctx);
        return;
    }
    fill_cache(c, &rng);
    const uint64_t sum_cache = bb_cache_sum(c);
    float k[2 * 16], v[2 * 16], o[64], l[8];
    kva_test_fill(k, KVA_DTYPE_F32, 32, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, 32, &rng, 1.0);
    kva_test_poison(o, KVA_DTYPE_F32, 64);
    kva_test_poison(l, KVA_DTYPE_F32, 8);
    const uint64_t sum_k = bb_sum(k, sizeof k), sum_v = bb_sum(v, sizeof v);
    const uint64_t sum_o = bb_sum(o, sizeof o), sum_l = bb_sum(l, sizeof l);
    const int64_t slots[2] = {0, 5};
    char what[96];
    for (int i = 0; i < 4; i++) {
        const kva_dtype dt = (kva_dtype)bad_value(i, KVA_DTYPE_COUNT_);
        for (int32_t n = 0; n <= 2; n += 2) { /* a count of 0 validates the dtype too */
            snprintf(what, sizeof what, "cache_write src_dtype %d, %d tokens", (int)dt, (int)n);
            REFUSED(kva_cache_write(ctx, c, n, k, 0, v, 0, dt, slots), NULL, what);
            snprintf(what, sizeof what, "cache_read dst_dtype %d, %d tokens", (int)dt, (int)n);
            REFUSED(kva_cache_read(ctx, c, n, slots, k, 0, v, 0, dt), NULL, what);
            snprintf(what, sizeof what, "convert dtype %d, n %d", (int)dt, (int)n);
            REFUSED(kva_convert(k, dt, o, KVA_DTYPE_F32, (size_t)n), NULL, what);
            REFUSED(kva_convert(k, KVA_DTYPE_F32, o, dt, (size_t)n), NULL, what);
            snprintf(what, sizeof what, "merge_states dtype %d, T %d", (int)dt, (int)n / 2);
            REFUSED(kva_merge_states(ctx, n / 2, 1, 16, dt, k, l, v, l + 1, o, l + 2), NULL, what);
            REFUSED(kva_merge_states_n(ctx, 1, n / 2, 1, 16, dt, k, 0, l, 0, o, l + 2), NULL, what);
        }
    }
    CHECK(bb_cache_sum(c) == sum_cache);
    CHECK(bb_sum(k, sizeof k) == sum_k && bb_sum(v, sizeof v) == sum_v);
    CHECK(bb_sum(o, sizeof o) == sum_o && bb_sum(l, sizeof l) == sum_l);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

static void test_plan_enums(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    const int32_t qsl[2] = {0, 1}, sl[1] = {2}, bt[1] = {0};
    kva_plan_desc mha = {0};
    mha.num_requests = 1;
    mha.query_start_loc = qsl;
    mha.seq_lens = sl;
    mha.block_table = bt;
    mha.block_table_stride = 1;
    mha.block_size = 4;
    mha.num_heads = 1;
    mha.num_kv_heads = 1;
    mha.head_dim = 16;
    mha.q_dtype = KVA_DTYPE_F32;
    mha.causal = 1;
    mha.window_left = -1;
    kva_plan_desc idx = mha, sparse = mha;
    idx.kind = KVA_ATTN_INDEX;
    idx.sparse_topk = 2;
    sparse.kind = KVA_ATTN_MLA;
    sparse.head_dim = 24;
    sparse.head_dim_v = 16;
    sparse.scale = 0.1f;
    sparse.sparse_topk = 2;
    const kva_plan_desc *good[3] = {&mha, &idx, &sparse};
    const char *kind_name[3] = {"MHA", "indexer", "sparse MLA"};
    kva_plan *updated[3] = {NULL, NULL, NULL};
    kva_plan_info before[3];
    for (int g = 0; g < 3; g++) {
        CHECK_OK(kva_plan_create(ctx, good[g], &updated[g]));
        if (updated[g])
            CHECK_OK(kva_plan_get_info(updated[g], &before[g]));
    }
    char what[128];
    for (int g = 0; g < 3; g++) {
        for (int i = 0; i < 4; i++) {
            for (int field = 0; field < 5; field++) {
                kva_plan_desc d = *good[g];
                const char *name[5] = {"q_dtype", "kind", "cascade", "sparse_mode",
                                       "index_q_quant"};
                int32_t v = 0;
                if (field == 0)
                    d.q_dtype = (kva_dtype)(v = bad_value(i, KVA_DTYPE_COUNT_));
                else if (field == 1)
                    d.kind = (kva_attn_kind)(v = bad_value(i, KVA_ATTN_KIND_COUNT_));
                else if (field == 2)
                    d.cascade = v = bad_value(i, KVA_CASCADE_MODE_COUNT_);
                else if (field == 3)
                    d.sparse_mode = v = bad_value(i, KVA_SPARSE_MODE_COUNT_);
                else
                    d.index_q_quant = v = bad_value(i, KVA_QUANT_COUNT_);
                kva_plan *p = NULL;
                snprintf(what, sizeof what, "%s plan %s %d", kind_name[g], name[field], (int)v);
                REFUSED(kva_plan_create(ctx, &d, &p), p, what);
                if (updated[g])
                    REFUSED(kva_plan_update(ctx, updated[g], &d), NULL, what);
            }
        }
    }
    /* Valid values of another kind's field. */
    for (int g = 0; g < 3; g++) {
        for (int field = 0; field < 2; field++) {
            kva_plan_desc d = *good[g];
            if (field == 0 && g != 2)
                d.sparse_mode = KVA_SPARSE_SEPARATE;
            else if (field == 1 && g != 1)
                d.index_q_quant = KVA_QUANT_FP8_TOKEN;
            else
                continue;
            kva_plan *p = NULL;
            snprintf(what, sizeof what, "%s plan with %s", kind_name[g],
                     field ? "index_q_quant FP8_TOKEN" : "sparse_mode SEPARATE");
            REFUSED(kva_plan_create(ctx, &d, &p), p, what);
        }
    }
    kva_plan_desc dense = sparse;
    dense.sparse_topk = 0;
    dense.sparse_mode = KVA_SPARSE_SEPARATE;
    kva_plan *p = NULL;
    REFUSED(kva_plan_create(ctx, &dense, &p), p, "dense MLA plan with sparse_mode SEPARATE");
    /* Quant formats other than NONE / FP8_TOKEN for the index queries. */
    for (int32_t qq = 1; qq < KVA_QUANT_COUNT_; qq++) {
        if (qq == KVA_QUANT_FP8_TOKEN)
            continue;
        kva_plan_desc d = idx;
        d.index_q_quant = qq;
        snprintf(what, sizeof what, "indexer plan index_q_quant %s", kva_quant_name(qq));
        REFUSED(kva_plan_create(ctx, &d, &p), p, what);
    }
    /* The refused updates left each plan as it was. */
    for (int g = 0; g < 3; g++) {
        if (!updated[g])
            continue;
        kva_plan_info after;
        CHECK_OK(kva_plan_get_info(updated[g], &after));
        CHECK(memcmp(&after, &before[g], sizeof after) == 0);
        kva_plan_destroy(updated[g]);
    }
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_object_enums);
    RUN(test_call_enums);
    RUN(test_plan_enums);
    return kva_test_finish();
}
