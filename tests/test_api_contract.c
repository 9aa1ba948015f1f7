/*
 * test_api_contract.c - the header's general rules (issue #22), on the
 * reference and CPU backends:
 *   - limits: every KVA_MAX_* limit and the head-size rule at every entry
 *     point that takes such a value (the limit accepted, one past it refused);
 *   - zero sizes: counts may be 0 (NULL arrays, OK, nothing touched), shape
 *     dimensions may not;
 *   - kva_last_error: set by a failure, cleared by the next call's success;
 *   - the workspace rule of plans shared between contexts;
 *   - what the header says of NaN in padding tokens of an int8 write,
 *     causal values other than 0/1, block-table padding and duplicate slots.
 */
#include "cache_util.h"

/* The pools below use a hash this build has (prefix caching needs one;
 * kvattn_pool.h: a build without it refuses, checked in test_limits). */
#if defined(KVA_HAVE_OPENSSL)
#define CT_HASH KVA_POOL_HASH_SHA256
#define CT_PREFIX 1
#elif defined(KVA_HAVE_XXHASH)
#define CT_HASH KVA_POOL_HASH_XXH3_128
#define CT_PREFIX 1
#else
#define CT_HASH KVA_POOL_HASH_SHA256
#define CT_PREFIX 0
#endif

static const kva_backend kBk[2] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};

/* A plan descriptor over one request (q_len ql, seq_len sl) with f32 q. */
static kva_plan_desc one_req(const int32_t *qsl, const int32_t *sl, const int32_t *bt,
                             int32_t stride, int32_t H, int32_t Hkv, int32_t D)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = 1;
    d.query_start_loc = qsl;
    d.seq_lens = sl;
    d.block_table = bt;
    d.block_table_stride = stride;
    d.block_size = 4;
    d.num_heads = H;
    d.num_kv_heads = Hkv;
    d.head_dim = D;
    d.q_dtype = KVA_DTYPE_F32;
    d.causal = 1;
    d.window_left = -1;
    return d;
}

static void test_limits(void)
{
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        kva_cache *c = NULL;
        /* Cache: Hkv = KVA_MAX_HEADS is accepted, one more is not, by each creator. */
        kva_cache_desc cd = make_desc(1, 1, KVA_MAX_HEADS, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        kva_cache_destroy(c);
        c = NULL;
        cd.num_kv_heads = KVA_MAX_HEADS + 1;
        CHECK_STATUS(kva_cache_create(ctx, &cd, &c), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_kv_heads = 4097");
        CHECK_STATUS(kva_cache_create_quant(ctx, &cd, NULL, &c), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_kv_heads = 4097");
        float kbuf[8], vbuf[8];
        CHECK_STATUS(kva_cache_create_from(ctx, &cd, kbuf, vbuf, &c), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_kv_heads = 4097");
        CHECK(c == NULL);
        cd.num_kv_heads = 1;
        cd.head_dim = KVA_MAX_HEAD_DIM + 8; /* above every backend's limit */
        CHECK_STATUS(kva_cache_create(ctx, &cd, &c), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("head_dim = 584");

        /* Plan: heads and kv heads up to KVA_MAX_HEADS, seq_len up to KVA_MAX_SEQ_LEN. */
        const int32_t qsl[2] = {0, 1}, sl_max[1] = {KVA_MAX_SEQ_LEN};
        const int32_t sl_over[1] = {KVA_MAX_SEQ_LEN + 1};
        kva_plan *p = NULL;
        kva_plan_desc pd = one_req(qsl, sl_max, NULL, 0, KVA_MAX_HEADS, KVA_MAX_HEADS, 8);
        pd.num_requests = 0; /* the heads only */
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        kva_plan_destroy(p);
        p = NULL;
        pd.num_heads = KVA_MAX_HEADS + 1;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_heads = 4097");
        pd.num_heads = KVA_MAX_HEADS;
        pd.num_kv_heads = KVA_MAX_HEADS + 1;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_kv_heads = 4097");
        pd = one_req(qsl, sl_max, NULL, 0, 1, 1, 8); /* ragged, no block table */
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        kva_plan_destroy(p);
        p = NULL;
        pd.seq_lens = sl_over;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_OUT_OF_RANGE);
        CHECK_ERROR_MENTIONS("KVA_MAX_SEQ_LEN");
        pd.seq_lens = sl_max;
        pd.head_dim = KVA_MAX_HEAD_DIM + 8;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("head_dim = 584");
        CHECK(p == NULL);

        /* Merge: num_heads as the plan's. */
        CHECK_STATUS(kva_merge_states(ctx, 0, KVA_MAX_HEADS + 1, 8, KVA_DTYPE_F32, NULL, NULL, NULL,
                                      NULL, NULL, NULL),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_heads = 4097");
        CHECK_OK(kva_merge_states(ctx, 0, KVA_MAX_HEADS, 8, KVA_DTYPE_F32, NULL, NULL, NULL, NULL,
                                  NULL, NULL));
        CHECK_STATUS(kva_merge_states(ctx, 0, 1, KVA_MAX_HEAD_DIM + 8, KVA_DTYPE_F32, NULL, NULL,
                                      NULL, NULL, NULL, NULL),
                     KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("head_dim_v = 584");
        kva_context_destroy(ctx);
    }
    /* Context threads, checkpoint scales, pool. */
    kva_context *ctx = NULL;
    kva_context_desc xd = {KVA_BACKEND_CPU, KVA_MAX_THREADS + 1, 0};
    CHECK_STATUS(kva_context_create(&xd, &ctx), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_threads = 1025");
    kva_c8_scales *sc = NULL;
#ifdef KVA_HAVE_CJSON
    CHECK_STATUS(kva_c8_scales_load("/nonexistent", 0, KVA_MAX_HEADS + 1, 8, 0, 1, &sc),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("4097");
    CHECK_STATUS(kva_c8_scales_load("/nonexistent", 0, 1, KVA_MAX_HEAD_DIM + 8, 0, 1, &sc),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("584");
#else
    /* A build without cJSON refuses the loader whatever the arguments (kvattn_c8.h). */
    CHECK_STATUS(kva_c8_scales_load("/nonexistent", 0, KVA_MAX_HEADS + 1, 8, 0, 1, &sc),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("KVA_WITH_CJSON=OFF");
#endif
    kva_pool *pool = NULL;
#ifndef KVA_HAVE_OPENSSL
    /* A build without libcrypto refuses SHA-256 prefix caching (kvattn_pool.h). */
    CHECK_STATUS(kva_pool_create(&(kva_pool_desc){8, 4, KVA_POOL_HASH_SHA256, 1}, &pool),
                 KVA_STATUS_UNSUPPORTED);
    CHECK(pool == NULL);
#endif
    kva_pool_desc pdsc = {(1 << 30) + 1, 16, CT_HASH, CT_PREFIX};
    CHECK_STATUS(kva_pool_create(&pdsc, &pool), KVA_STATUS_INVALID_ARGUMENT);
    pdsc.num_blocks = 8;
    pdsc.block_size = 65537;
    CHECK_STATUS(kva_pool_create(&pdsc, &pool), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(pool == NULL);
}

static void test_zero_sizes(void)
{
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        kva_rng rng = {77};
        kva_cache *c = NULL, *c2 = NULL;
        kva_cache_desc cd = make_desc(4, 4, 2, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        CHECK_OK(kva_cache_create(ctx, &cd, &c2));
        fill_cache(c, &rng);
        snapshot s = take(c);
        /* Counts of 0 with NULL arrays. */
        CHECK_OK(kva_convert(NULL, KVA_DTYPE_F32, NULL, KVA_DTYPE_F16, 0));
        CHECK_OK(kva_cache_write(ctx, c, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
        CHECK_OK(kva_cache_copy_blocks(ctx, c, NULL, 0));
        CHECK_OK(kva_cache_swap_blocks(ctx, c2, c, NULL, 0));
        CHECK_OK(kva_merge_states(ctx, 0, 2, 8, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL));
        CHECK_OK(kva_batch_reorder_decode_first(0, NULL, 1, NULL, NULL));
        const int32_t bt_none[1] = {0};
        kva_plan_desc pd = one_req(NULL, NULL, bt_none, 0, 2, 2, 8);
        pd.num_requests = 0;
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        CHECK_OK(kva_attention_run(ctx, p, NULL, c, NULL, NULL, NULL));
        kva_plan_destroy(p);
        p = NULL;
        /* A request with q_len 0: no rows, no tensors needed. */
        const int32_t qsl0[2] = {0, 0}, sl[1] = {3}, bt[1] = {1};
        pd = one_req(qsl0, sl, bt, 1, 2, 2, 8);
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        CHECK_OK(kva_attention_run(ctx, p, NULL, c, NULL, NULL, NULL));
        kva_plan_destroy(p);
        p = NULL;
        CHECK(same(c, &s));
        /* Shape dimensions of 0 are refused. */
        int32_t *fields[4] = {&cd.num_blocks, &cd.block_size, &cd.num_kv_heads, &cd.head_dim};
        for (int f = 0; f < 4; f++) {
            kva_cache_desc bad = cd;
            int32_t *fp = (int32_t *)((char *)&bad + ((char *)fields[f] - (char *)&cd));
            *fp = 0;
            kva_cache *x = NULL;
            CHECK(kva_cache_create(ctx, &bad, &x) != KVA_STATUS_OK);
            CHECK(x == NULL);
        }
        pd.num_heads = 0;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
        pd.num_heads = 2;
        pd.num_kv_heads = 0;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
        pd.num_kv_heads = 2;
        pd.head_dim = 0;
        CHECK(kva_plan_create(ctx, &pd, &p) != KVA_STATUS_OK);
        CHECK(p == NULL);
        CHECK_STATUS(
            kva_merge_states(ctx, 0, 0, 8, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL),
            KVA_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(
            kva_merge_states(ctx, 0, 2, 0, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL),
            KVA_STATUS_UNSUPPORTED);
        drop(&s);
        kva_cache_destroy(c);
        kva_cache_destroy(c2);
        kva_context_destroy(ctx);
    }
    /* Pool: counts of 0 are fine, a prompt of 0 tokens is the exception. */
    kva_pool *pool = NULL;
    kva_pool_desc pdsc = {8, 4, CT_HASH, CT_PREFIX};
    CHECK_OK(kva_pool_create(&pdsc, &pool));
    const int32_t prompt[3] = {5, 6, 7};
    int32_t id = -1;
    CHECK_STATUS(kva_pool_request_add(pool, prompt, 0, NULL, 0, &id, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_OK(kva_pool_request_add(pool, prompt, 3, NULL, 0, &id, NULL));
    CHECK_OK(kva_pool_request_allocate(pool, id, 0, 0));
    CHECK_OK(kva_pool_request_append_tokens(pool, id, NULL, 0));
    CHECK_OK(kva_pool_request_slots(pool, id, 0, 0, NULL));
    CHECK_OK(kva_pool_request_block_table(pool, id, NULL, 0, NULL));
    CHECK_STATUS(kva_pool_create(&(kva_pool_desc){0, 4, CT_HASH, CT_PREFIX}, &(kva_pool *){0}),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_pool_create(&(kva_pool_desc){8, 0, CT_HASH, CT_PREFIX}, &(kva_pool *){0}),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_OK(kva_pool_check(pool));
    kva_pool_destroy(pool);
}

/* A failure sets the message, the next successful call of any kind clears it. */
#define FAIL_THEN(ok_call)                                                                         \
    do {                                                                                           \
        CHECK(kva_convert(NULL, (kva_dtype)99, NULL, KVA_DTYPE_F32, 1) != KVA_STATUS_OK);          \
        CHECK(kva_last_error()[0] != '\0');                                                        \
        CHECK_OK(ok_call);                                                                         \
        CHECK_MSG(kva_last_error()[0] == '\0', "%s left \"%s\"", #ok_call, kva_last_error());      \
    } while (0)

static void test_last_error(void)
{
    kva_context *ctx = NULL;
    FAIL_THEN(kva_context_create(&(kva_context_desc){KVA_BACKEND_CPU, 1, 0}, &ctx));
    kva_cache *c = NULL;
    kva_cache_desc cd = make_desc(2, 4, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    FAIL_THEN(kva_cache_create(ctx, &cd, &c));
    kva_cache_desc got;
    FAIL_THEN(kva_cache_get_desc(c, &got));
    FAIL_THEN(kva_cache_data(c, NULL, NULL));
    float row[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int64_t slot = 1;
    FAIL_THEN(kva_cache_write(ctx, c, 1, row, 0, row, 0, KVA_DTYPE_F32, &slot));
    const int32_t pair[2] = {0, 1};
    FAIL_THEN(kva_cache_copy_blocks(ctx, c, pair, 1));
    const int32_t qsl[2] = {0, 1}, sl[1] = {2}, bt[1] = {0};
    kva_plan_desc pd = one_req(qsl, sl, bt, 1, 1, 1, 8);
    kva_plan *p = NULL;
    FAIL_THEN(kva_plan_create(ctx, &pd, &p));
    kva_plan_info info;
    FAIL_THEN(kva_plan_get_info(p, &info));
    float out[8], lse[1];
    FAIL_THEN(kva_attention_run(ctx, p, row, c, NULL, out, lse));
    FAIL_THEN(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, out, lse, out, lse, out, lse));
    int32_t perm[1];
    FAIL_THEN(kva_batch_reorder_decode_first(1, qsl + 1, 1, perm, NULL));
    uint16_t h;
    FAIL_THEN(kva_convert(row, KVA_DTYPE_F32, &h, KVA_DTYPE_F16, 1));
    kva_pool *pool = NULL;
    FAIL_THEN(kva_pool_create(&(kva_pool_desc){4, 4, KVA_POOL_HASH_SHA256, 0}, &pool));
    kva_pool_stats st;
    FAIL_THEN(kva_pool_get_stats(pool, &st));
    kva_pool_destroy(pool);
    kva_plan_destroy(p);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* One plan, several contexts: the same thread count is enough (the header's
 * rule); a too-small reservation is refused with the rule in the message and
 * nothing written. */
static void test_workspace_rule(void)
{
    kva_rng rng = {5};
    enum { NBk = 64, Bk = 16, Hk = 4, Dk = 64 };
    const int32_t qsl[3] = {0, 1, 2}, sl[2] = {900, 1000};
    int32_t bt[2 * NBk];
    for (int i = 0; i < 2 * NBk; i++)
        bt[i] = (i * 7) % NBk;
    kva_plan_desc pd = one_req(qsl, sl, bt, NBk, Hk, Hk, Dk);
    pd.num_requests = 2;
    pd.block_size = Bk;
    kva_context *a = new_ctx(KVA_BACKEND_CPU, 2), *b = new_ctx(KVA_BACKEND_CPU, 2);
    kva_context *one = new_ctx(KVA_BACKEND_CPU, 1);
    kva_cache *c = NULL;
    kva_cache_desc cd = make_desc(NBk, Bk, Hk, Dk, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND);
    CHECK_OK(kva_cache_create(a, &cd, &c));
    if (!c)
        return;
    fill_cache(c, &rng);
    float q[2 * Hk * Dk], want[2 * Hk * Dk], got[2 * Hk * Dk], lw[2 * Hk], lg[2 * Hk];
    kva_test_fill(q, KVA_DTYPE_F32, 2 * Hk * Dk, &rng, 1.0);
    kva_plan *pa = NULL, *pb = NULL, *p1 = NULL;
    CHECK_OK(kva_plan_create(a, &pd, &pa));
    CHECK_OK(kva_plan_create(b, &pd, &pb));
    CHECK_OK(kva_plan_create(one, &pd, &p1));
    kva_test_poison(want, KVA_DTYPE_F32, 2 * Hk * Dk);
    CHECK_OK(kva_attention_run(a, pa, q, c, NULL, want, lw));
    kva_test_poison(got, KVA_DTYPE_F32, 2 * Hk * Dk);
    CHECK_OK(kva_attention_run(b, pa, q, c, NULL, got, lg));
    CHECK(kva_test_compare("plan of a on b", got, want, KVA_DTYPE_F32, 2 * Hk * Dk, 1e-6, 1e-6) ==
          0);
    CHECK(kva_test_compare_f32("lse", lg, lw, 2 * Hk, 1e-6, 1e-6) == 0);
    /* The 1-thread context: either it holds enough (same result) or it says why. */
    kva_test_poison(got, KVA_DTYPE_F32, 2 * Hk * Dk);
    kva_status s = kva_attention_run(one, pa, q, c, NULL, got, lg);
    if (s == KVA_STATUS_OK) {
        CHECK(kva_test_compare("plan of a on one", got, want, KVA_DTYPE_F32, 2 * Hk * Dk, 1e-6,
                               1e-6) == 0);
    } else {
        CHECK_STATUS(s, KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("same thread count");
        CHECK(kva_test_poisoned(got, KVA_DTYPE_F32, 0) &&
              kva_test_poisoned(got, KVA_DTYPE_F32, 2 * Hk * Dk - 1));
    }
    kva_plan_destroy(pa);
    kva_plan_destroy(pb);
    kva_plan_destroy(p1);
    kva_cache_destroy(c);
    kva_context_destroy(a);
    kva_context_destroy(b);
    kva_context_destroy(one);
}

/* NaN in padding tokens of an int8 write; duplicate slots; causal values;
 * block-table padding. */
static void test_header_statements(void)
{
    kva_rng rng = {9};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        /* A C8 cache: a padding token full of NaN is accepted and not read. */
        enum { Hkv = 2, D = 8, NBc = 3, Bc = 4 };
        float buf[2 * Hkv * (D + D)];
        kva_quant_params qp;
        make_params(KVA_QUANT_INT8_CHANNEL, Hkv, D, D, 0, &rng, buf, &qp);
        kva_cache_desc cd = {
            NBc, Bc, Hkv, D, D, KVA_DTYPE_I8, KVA_LAYOUT_NHD, KVA_QUANT_INT8_CHANNEL};
        kva_cache *c1 = NULL, *c2 = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &cd, &qp, &c1));
        CHECK_OK(kva_cache_create_quant(ctx, &cd, &qp, &c2));
        if (!c1 || !c2)
            return;
        void *k1, *v1, *k2, *v2;
        kva_cache_data(c1, &k1, &v1);
        kva_cache_data(c2, &k2, &v2);
        const size_t kb = (size_t)NBc * kva_cache_block_bytes_k(c1);
        memset(k1, 0x11, kb), memset(v1, 0x11, kb), memset(k2, 0x11, kb), memset(v2, 0x11, kb);
        float k[3][Hkv * D], v[3][Hkv * D];
        kva_test_fill(k, KVA_DTYPE_F32, 3 * Hkv * D, &rng, 1.0);
        kva_test_fill(v, KVA_DTYPE_F32, 3 * Hkv * D, &rng, 1.0);
        for (int i = 0; i < Hkv * D; i++)
            k[1][i] = v[1][i] = NAN;
        const int64_t with_pad[3] = {5, -1, 9}, alone0[1] = {5}, alone2[1] = {9};
        CHECK_OK(kva_cache_write(ctx, c1, 3, k, 0, v, 0, KVA_DTYPE_F32, with_pad));
        CHECK_OK(kva_cache_write(ctx, c2, 1, k[0], 0, v[0], 0, KVA_DTYPE_F32, alone0));
        CHECK_OK(kva_cache_write(ctx, c2, 1, k[2], 0, v[2], 0, KVA_DTYPE_F32, alone2));
        CHECK(memcmp(k1, k2, kb) == 0 && memcmp(v1, v2, kb) == 0);
        /* Duplicate slots: the other slots are written normally. */
        for (int i = 0; i < Hkv * D; i++)
            k[1][i] = v[1][i] = (float)i / 8.0f;
        const int64_t dup[3] = {2, 7, 2}, alone1[1] = {7};
        CHECK_OK(kva_cache_write(ctx, c1, 3, k, 0, v, 0, KVA_DTYPE_F32, dup));
        CHECK_OK(kva_cache_write(ctx, c2, 1, k[1], 0, v[1], 0, KVA_DTYPE_F32, alone1));
        const size_t row = (size_t)Hkv * D; /* NHD: slot s is bytes s*row .. */
        CHECK(memcmp((char *)k1 + 7 * row, (char *)k2 + 7 * row, row) == 0);
        CHECK(memcmp((char *)k1 + 5 * row, (char *)k2 + 5 * row, row) == 0);
        CHECK(memcmp((char *)k1 + 9 * row, (char *)k2 + 9 * row, row) == 0);
        kva_cache_destroy(c1);
        kva_cache_destroy(c2);

        /* causal 2 and -1 mean causal; block-table padding (-1, a huge id)
         * after the needed entries and in a q_len 0 row is not read. */
        kva_cache *c = NULL;
        kva_cache_desc fd = make_desc(6, 4, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        CHECK_OK(kva_cache_create(ctx, &fd, &c));
        fill_cache(c, &rng);
        const int32_t qsl[3] = {0, 3, 3}, sl[2] = {6, 5};
        const int32_t bt_clean[6] = {4, 1, 0, 2, 3, 0}, bt_pad[6] = {4, 1, -1, -1, 99999, -7};
        kva_plan_desc pd = one_req(qsl, sl, bt_clean, 3, 2, 1, 8);
        pd.num_requests = 2;
        float q[3 * 2 * 8], want[3 * 2 * 8], got[3 * 2 * 8], lw[6], lg[6];
        kva_test_fill(q, KVA_DTYPE_F32, 48, &rng, 1.0);
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        kva_test_poison(want, KVA_DTYPE_F32, 48);
        CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, want, lw));
        kva_plan_destroy(p);
        const int32_t causal_vals[3] = {2, -1, 1};
        for (int i = 0; i < 3; i++) {
            pd.causal = causal_vals[i];
            pd.block_table = i == 2 ? bt_pad : bt_clean;
            p = NULL;
            CHECK_OK(kva_plan_create(ctx, &pd, &p));
            kva_test_poison(got, KVA_DTYPE_F32, 48);
            kva_test_poison(lg, KVA_DTYPE_F32, 6);
            CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, got, lg));
            CHECK_MSG(kva_test_compare("out", got, want, KVA_DTYPE_F32, 48, 0, 0) == 0 &&
                          kva_test_compare_f32("lse", lg, lw, 6, 0, 0) == 0,
                      "causal %d, padded table %d", (int)pd.causal, i == 2);
            kva_plan_destroy(p);
        }
        /* ... and causal 0 is not causal (q_len 3 of seq_len 6 sees every key). */
        pd.causal = 0;
        pd.block_table = bt_clean;
        p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, got, lg));
        int differs = 0;
        for (int i = 0; i < 16; i++)
            differs |= got[i] != want[i];
        CHECK_MSG(differs, "causal 0 gave the causal result");
        kva_plan_destroy(p);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

int main(void)
{
    RUN(test_limits);
    RUN(test_zero_sizes);
    RUN(test_last_error);
    RUN(test_workspace_rule);
    RUN(test_header_statements);
    return kva_test_finish();
}
