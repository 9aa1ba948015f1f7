/*
 * test_api_blackbox_errors.c - the black-box audit of the public headers'
 * promises (session 35, task api35), bad inputs and the general rules, on the
 * reference and CPU backends: every bad argument gets its status and a
 * message, and cache, out, lse, plan and out-pointers stay as they were
 * (checksums before and after); the zero-size rule at the entry points
 * test_api_contract.c does not cover; kva_last_error cleared by every call;
 * names of values outside their enums; destroy(NULL); thread count 0.
 * test_api_blackbox.c has the valid inputs.
 */
#include "blackbox_util.h"

/* Names of every status, dtype, backend, quant, state; values outside the enums. */
static void test_names(void)
{
    for (int s = 0; s < KVA_STATUS_COUNT_; s++) {
        const char *n = kva_status_name((kva_status)s), *d = kva_status_string((kva_status)s);
        CHECK(n && strncmp(n, "KVA_STATUS_", 11) == 0 && strcmp(n, "KVA_STATUS_UNKNOWN") != 0);
        CHECK(d && d[0] != '\0');
        for (int t = 0; t < s; t++)
            CHECK(strcmp(n, kva_status_name((kva_status)t)) != 0);
    }
    CHECK(strcmp(kva_status_name(KVA_STATUS_COUNT_), "KVA_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(kva_status_name((kva_status)-1), "KVA_STATUS_UNKNOWN") == 0);
    CHECK(kva_status_string((kva_status)-1) != NULL);
    CHECK(kva_status_string((kva_status)KVA_STATUS_COUNT_) != NULL);
    CHECK(strcmp(kva_status_name(KVA_STATUS_OK), "KVA_STATUS_OK") == 0);
    CHECK(strcmp(kva_status_name(KVA_STATUS_INTERNAL), "KVA_STATUS_INTERNAL") == 0);
    CHECK(strcmp(kva_dtype_name((kva_dtype)-1), "invalid") == 0);
    CHECK(strcmp(kva_dtype_name(KVA_DTYPE_COUNT_), "invalid") == 0);
    CHECK(kva_dtype_size((kva_dtype)-1) == 0 && kva_dtype_size(KVA_DTYPE_COUNT_) == 0);
    CHECK(kva_dtype_size(KVA_DTYPE_U8) == 1 && kva_dtype_size(KVA_DTYPE_BF16) == 2);
    CHECK(strcmp(kva_backend_name((kva_backend)-1), "invalid") == 0);
    CHECK(strcmp(kva_backend_name(KVA_BACKEND_COUNT_), "invalid") == 0);
    CHECK(kva_backend_available((kva_backend)-1) == 0);
    CHECK(kva_backend_available(KVA_BACKEND_COUNT_) == 0);
    CHECK(kva_backend_available(KVA_BACKEND_REF) == 1);
    CHECK(strcmp(kva_quant_name((kva_quant)-1), "invalid") == 0);
    CHECK(strcmp(kva_quant_name(KVA_QUANT_COUNT_), "invalid") == 0);
    CHECK(strcmp(kva_quant_name(KVA_QUANT_FP8_TOKEN), "fp8_token") == 0);
    const char *st = kva_attn_state_name((kva_attn_state)99);
    CHECK(st != NULL);
    CHECK(strcmp(kva_attn_state_name(KVA_STATE_PREFILL_NO_CACHE), "prefill_no_cache") == 0);
    CHECK(kva_version() && kva_version()[0] >= '0' && kva_version()[0] <= '9');
}

/* destroy(NULL) of every handle; thread count 0 means all cores; out NULL. */
static void test_handles(void)
{
    kva_context_destroy(NULL);
    kva_cache_destroy(NULL);
    kva_plan_destroy(NULL);
    kva_pool_destroy(NULL);
    kva_c8_scales_free(NULL);
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&(kva_context_desc){KVA_BACKEND_CPU, 0, 0}, &ctx));
    CHECK(ctx && kva_context_num_threads(ctx) >= 1);
    CHECK(kva_context_backend(ctx) == KVA_BACKEND_CPU);
    kva_context *ctx2 = (kva_context *)&ctx; /* must be overwritten or left alone, not read */
    CHECK_OK(kva_context_create(NULL, &ctx2));
    CHECK(ctx2 && ctx2 != ctx && kva_context_backend(ctx2) == KVA_BACKEND_CPU);
    kva_context_destroy(ctx2);
    kva_context *r = NULL;
    CHECK_OK(kva_context_create(&(kva_context_desc){KVA_BACKEND_REF, 7, 0}, &r));
    CHECK(kva_context_num_threads(r) == 1);
    kva_context_destroy(r);
    CHECK_STATUS(kva_context_create(NULL, NULL), KVA_STATUS_NULL_POINTER);
    CHECK(kva_last_error()[0] != '\0');
    kva_context *bad = NULL;
    CHECK_STATUS(kva_context_create(&(kva_context_desc){KVA_BACKEND_CPU, -1, 0}, &bad),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_threads");
    CHECK(bad == NULL);
    CHECK_STATUS(kva_context_create(&(kva_context_desc){(kva_backend)7, 1, 0}, &bad),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    /* Queries of a cache / plan with NULL out-pointers. */
    kva_cache_desc cd = make_desc(2, 4, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &c));
    CHECK_STATUS(kva_cache_get_desc(c, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_cache_get_desc(NULL, &cd), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_cache_data(NULL, NULL, NULL), KVA_STATUS_NULL_POINTER);
    float *sc = (float *)&cd;
    CHECK_OK(kva_cache_token_scales(c, &sc));
    CHECK(sc == NULL);
    CHECK(kva_cache_block_bytes_k(c) == 4 * 8 * 4 && kva_cache_block_bytes_v(c) == 4 * 8 * 4);
    CHECK(kva_cache_block_bytes_scales(c) == 0 && kva_cache_static_scale_bytes(c) == 0);
    CHECK(kva_cache_block_bytes_k(NULL) == 0 && kva_cache_block_bytes_v(NULL) == 0);
    CHECK_STATUS(kva_plan_get_info(NULL, &(kva_plan_info){0}), KVA_STATUS_NULL_POINTER);
    kva_cache_destroy(c);
    /* Caches without V storage (kvattn.h): an index-key cache's v_data is NULL and
     * its head_dim_v reads back as D; an MLA cache's v_data points at K. */
    kva_cache_desc xd = {
        4, 3, 1, 24, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_INDEX};
    c = NULL;
    CHECK_OK(kva_cache_create(ctx, &xd, &c));
    void *kd = NULL, *vd = (void *)&xd;
    CHECK_OK(kva_cache_data(c, &kd, &vd));
    CHECK(kd != NULL && vd == NULL);
    CHECK(kva_cache_block_bytes_v(c) == 0 && kva_cache_block_bytes_k(c) == 3 * 24 * 4);
    CHECK_OK(kva_cache_get_desc(c, &xd));
    CHECK(xd.head_dim_v == 24);
    kva_cache_destroy(c);
    c = NULL;
    xd = (kva_cache_desc){4,           3, 1, 32, 24, KVA_DTYPE_F32, KVA_LAYOUT_HND, KVA_QUANT_NONE,
                          KVA_ATTN_MLA};
    CHECK_OK(kva_cache_create(ctx, &xd, &c));
    CHECK_OK(kva_cache_data(c, &kd, &vd));
    CHECK(kd != NULL && vd == kd && kva_cache_block_bytes_v(c) == 0);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* Bad plan descriptors: status, message, *out left alone, and plan_update of a
 * live plan with the same descriptor fails alike and leaves the plan running. */
static void test_bad_plans(void)
{
    for (int bi = 0; bi < 2; bi++) {
        bb_fix f;
        bb_fix_init(&f, kBk[bi], 500 + (uint64_t)bi);
        const float nan_slopes[4] = {0.1f, NAN, 0.1f, 0.1f};
        const int32_t qsl_bad0[3] = {1, 2, 4}, qsl_dec[3] = {0, 2, 1}, qsl_long[3] = {0, 1, 9};
        const int32_t parents[4] = {-1, -1, 0, 5};
        struct {
            kva_plan_desc d;
            kva_status st;
            const char *what;
        } cases[32];
        int n = 0;
#define BB_PLAN(field_assign, status, text)                                                        \
    do {                                                                                           \
        kva_plan_desc d_ = f.pd;                                                                   \
        field_assign;                                                                              \
        cases[n].d = d_, cases[n].st = (status), cases[n].what = (text), n++;                      \
    } while (0)
        BB_PLAN(d_.num_heads = 7, KVA_STATUS_INVALID_ARGUMENT, "not a multiple");
        BB_PLAN(d_.num_heads = 3, KVA_STATUS_INVALID_ARGUMENT, "not a multiple");
        BB_PLAN(d_.head_dim = 12, KVA_STATUS_UNSUPPORTED, "head_dim = 12");
        BB_PLAN(d_.head_dim_v = 4, KVA_STATUS_UNSUPPORTED, "head_dim_v = 4");
        BB_PLAN(d_.head_dim = 0, KVA_STATUS_INVALID_ARGUMENT, "head_dim = 0");
        BB_PLAN(d_.window_left = -2, KVA_STATUS_INVALID_ARGUMENT, "window_left = -2");
        BB_PLAN(d_.softcap = -1.0f, KVA_STATUS_INVALID_ARGUMENT, "softcap");
        BB_PLAN(d_.softcap = NAN, KVA_STATUS_INVALID_ARGUMENT, "softcap");
        BB_PLAN(d_.scale = -0.5f, KVA_STATUS_INVALID_ARGUMENT, "scale");
        BB_PLAN(d_.scale = INFINITY, KVA_STATUS_INVALID_ARGUMENT, "scale");
        BB_PLAN(d_.decode_threshold = -1, KVA_STATUS_INVALID_ARGUMENT, "decode_threshold");
        BB_PLAN(d_.attention_chunk = -4, KVA_STATUS_INVALID_ARGUMENT, "attention_chunk");
        BB_PLAN((d_.attention_chunk = 4, d_.causal = 0), KVA_STATUS_UNSUPPORTED, "attention_chunk");
        BB_PLAN(d_.alibi_slopes = nan_slopes, KVA_STATUS_INVALID_ARGUMENT, "alibi_slopes[1]");
        BB_PLAN(d_.query_start_loc = qsl_bad0, KVA_STATUS_INVALID_ARGUMENT, "query_start_loc[0]");
        BB_PLAN(d_.query_start_loc = qsl_dec, KVA_STATUS_INVALID_ARGUMENT, "decreases");
        BB_PLAN(d_.query_start_loc = qsl_long, KVA_STATUS_OUT_OF_RANGE, "q_len");
        BB_PLAN(d_.kind = (kva_attn_kind)9, KVA_STATUS_INVALID_ARGUMENT, "kind = 9");
        BB_PLAN(d_.q_dtype = KVA_DTYPE_I8, KVA_STATUS_UNSUPPORTED, "q_dtype");
        BB_PLAN(d_.block_size = 0, KVA_STATUS_INVALID_ARGUMENT, "block_size = 0");
        BB_PLAN(d_.block_table_stride = 2, KVA_STATUS_OUT_OF_RANGE, "block_table_stride");
        BB_PLAN(d_.num_requests = -1, KVA_STATUS_INVALID_ARGUMENT, "num_requests = -1");
        BB_PLAN(d_.seq_lens = NULL, KVA_STATUS_NULL_POINTER, "seq_lens");
        BB_PLAN((d_.tree_parents = parents, d_.window_left = 3), KVA_STATUS_UNSUPPORTED, "window");
        BB_PLAN(d_.dcp_size = KVA_MAX_DCP + 1, KVA_STATUS_INVALID_ARGUMENT, "dcp_size");
        BB_PLAN((d_.dcp_size = 2, d_.dcp_rank = 2), KVA_STATUS_INVALID_ARGUMENT, "dcp_rank");
        BB_PLAN(d_.sparse_mode = 1, KVA_STATUS_INVALID_ARGUMENT, "sparse_mode");
        BB_PLAN(d_.cascade = 7, KVA_STATUS_INVALID_ARGUMENT, "cascade");
#undef BB_PLAN
        for (int i = 0; i < n; i++) {
            kva_plan *sentinel = (kva_plan *)&f, *p = sentinel;
            kva_status s = kva_plan_create(f.ctx, &cases[i].d, &p);
            CHECK_MSG(s == cases[i].st, "case %d (%s): %s, want %s: %s", i, cases[i].what,
                      kva_status_name(s), kva_status_name(cases[i].st), kva_last_error());
            CHECK_MSG(strstr(kva_last_error(), cases[i].what) != NULL, "case %d: '%s' lacks '%s'",
                      i, kva_last_error(), cases[i].what);
            CHECK_MSG(p == sentinel, "case %d: *out changed on failure", i);
            if (s == KVA_STATUS_OK && p != sentinel)
                kva_plan_destroy(p);
            s = kva_plan_update(f.ctx, f.plan, &cases[i].d);
            CHECK_MSG(s == cases[i].st, "update case %d (%s): %s", i, cases[i].what,
                      kva_status_name(s));
            CHECK_MSG(bb_untouched(&f), "update case %d changed something", i);
        }
        /* The plan still runs after the failed updates, as created. */
        CHECK_OK(kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, f.lse));
        CHECK(!isnan(f.out[0]) && !isnan(f.lse[15]));
        bb_fix_free(&f);
    }
}

/* Bad run calls: the plan of another backend's context, a cache of another
 * shape or block size, NULL tensors. Nothing written. */
static void test_bad_runs(void)
{
    bb_fix a, b;
    bb_fix_init(&a, KVA_BACKEND_REF, 600);
    bb_fix_init(&b, KVA_BACKEND_CPU, 601);
    BAD(kva_attention_run(b.ctx, a.plan, b.q, b.cache, NULL, b.out, b.lse),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bb_untouched(&b));
    BAD(kva_attention_run(a.ctx, b.plan, a.q, a.cache, NULL, a.out, a.lse),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bb_untouched(&a));
    BAD(kva_plan_update(a.ctx, b.plan, &b.pd), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bb_untouched(&b));
    /* The cache of another context of the same backend is fine (both host memory). */
    kva_context *c2 = new_ctx(KVA_BACKEND_CPU, 2);
    kva_cache_desc cd = make_desc(6, 4, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD); /* B 4 */
    kva_cache *wrong = NULL;
    CHECK_OK(kva_cache_create(c2, &cd, &wrong));
    BAD(kva_attention_run(b.ctx, b.plan, b.q, wrong, NULL, b.out, b.lse),
        KVA_STATUS_SHAPE_MISMATCH);
    kva_cache_destroy(wrong);
    cd = make_desc(6, 3, 2, 16, 24, KVA_DTYPE_F32, KVA_LAYOUT_NHD); /* Dv 24 */
    CHECK_OK(kva_cache_create(c2, &cd, &wrong));
    BAD(kva_attention_run(b.ctx, b.plan, b.q, wrong, NULL, b.out, b.lse),
        KVA_STATUS_SHAPE_MISMATCH);
    kva_cache_destroy(wrong);
    cd = make_desc(5, 3, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD); /* block 5 is the last */
    CHECK_OK(kva_cache_create(c2, &cd, &wrong));
    BAD(kva_attention_run(b.ctx, b.plan, b.q, wrong, NULL, b.out, b.lse), KVA_STATUS_OUT_OF_RANGE);
    kva_cache_destroy(wrong);
    cd = make_desc(6, 3, 2, 16, 0, KVA_DTYPE_BF16, KVA_LAYOUT_NHD);
    CHECK_OK(kva_cache_create(c2, &cd, &wrong));
    BAD(kva_attention_run(b.ctx, b.plan, b.q, wrong, NULL, b.out, b.lse),
        KVA_STATUS_DTYPE_MISMATCH);
    kva_cache_destroy(wrong);
    BAD(kva_attention_run(b.ctx, b.plan, NULL, b.cache, NULL, b.out, b.lse),
        KVA_STATUS_NULL_POINTER);
    BAD(kva_attention_run(b.ctx, b.plan, b.q, b.cache, NULL, NULL, b.lse), KVA_STATUS_NULL_POINTER);
    BAD(kva_attention_run(b.ctx, NULL, b.q, b.cache, NULL, b.out, b.lse), KVA_STATUS_NULL_POINTER);
    BAD(kva_attention_run(b.ctx, b.plan, b.q, NULL, NULL, b.out, b.lse), KVA_STATUS_NULL_POINTER);
    BAD(kva_attention_run(NULL, b.plan, b.q, b.cache, NULL, b.out, b.lse), KVA_STATUS_NULL_POINTER);
    BAD(kva_attention_run_ragged(b.ctx, b.plan, b.q, NULL, b.q, NULL, b.out, b.lse),
        KVA_STATUS_NULL_POINTER);
    CHECK(bb_untouched(&b));
    /* Another CPU context that reserved the plan's workspace (a plan from the
     * same descriptor, same thread count) runs it. */
    kva_plan *p2 = NULL;
    CHECK_OK(kva_plan_create(c2, &b.pd, &p2));
    CHECK_OK(kva_attention_run(c2, b.plan, b.q, b.cache, NULL, b.out, b.lse));
    kva_plan_destroy(p2);
    kva_context_destroy(c2);
    bb_fix_free(&a);
    bb_fix_free(&b);
}

/* Bad cache descriptors, including sizes whose byte count overflows. */
static void test_bad_caches(void)
{
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        struct {
            kva_cache_desc d;
            kva_status st;
        } cases[] = {
            {make_desc(0, 4, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 0, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 4, 0, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 4, 1, 12, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_UNSUPPORTED},
            {make_desc(2, 4, 1, 8, 4, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_UNSUPPORTED},
            {make_desc(2, 4, 1, 8, -8, KVA_DTYPE_F32, KVA_LAYOUT_NHD), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 4, 1, 8, 0, (kva_dtype)17, KVA_LAYOUT_NHD), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 4, 1, 8, 0, KVA_DTYPE_F32, (kva_layout)2), KVA_STATUS_INVALID_ARGUMENT},
            {make_desc(2, 4, 1, 8, 0, KVA_DTYPE_I8, KVA_LAYOUT_NHD), KVA_STATUS_UNSUPPORTED},
            /* 2^31 blocks of 2^31 tokens of 4096 heads of 576 floats: 2^85 bytes. */
            {make_desc(INT32_MAX, INT32_MAX, KVA_MAX_HEADS, 576, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND),
             KVA_STATUS_OUT_OF_MEMORY},
        };
        const int n = (int)(sizeof cases / sizeof cases[0]);
        cases[n - 1].st = KVA_STATUS_OUT_OF_MEMORY;
        for (int i = 0; i < n; i++) {
            kva_cache *sentinel = (kva_cache *)&cases[i], *c = sentinel;
            kva_status s = kva_cache_create(ctx, &cases[i].d, &c);
            /* The last case may be refused as out of range or out of memory. */
            int ok =
                s == cases[i].st ||
                (i == n - 1 && (s == KVA_STATUS_INVALID_ARGUMENT || s == KVA_STATUS_OUT_OF_RANGE));
            CHECK_MSG(ok, "cache case %d: %s (%s)", i, kva_status_name(s), kva_last_error());
            CHECK_MSG(kva_last_error()[0] != '\0', "cache case %d: no message", i);
            CHECK_MSG(c == sentinel, "cache case %d: *out changed on failure", i);
            if (s == KVA_STATUS_OK && c != sentinel)
                kva_cache_destroy(c);
            /* Wrapped storage of the same shape: refused alike, without reading it. */
            float buf[16];
            c = sentinel;
            s = kva_cache_create_from(ctx, &cases[i].d, buf, buf, &c);
            CHECK_MSG(s != KVA_STATUS_OK, "create_from case %d accepted", i);
            CHECK_MSG(c == sentinel, "create_from case %d: *out changed on failure", i);
        }
        /* Quant values outside the enum and kinds outside theirs. */
        kva_cache_desc d = make_desc(2, 4, 1, 8, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *c = NULL;
        d.quant = (kva_quant)42;
        BAD(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT);
        d.quant = KVA_QUANT_NONE;
        d.kind = (kva_attn_kind)42;
        BAD(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT);
        CHECK(c == NULL);
        kva_context_destroy(ctx);
    }
}

/* Bad writes, reads and block copies: nothing written. */
static void test_bad_cache_calls(void)
{
    for (int bi = 0; bi < 2; bi++) {
        bb_fix f;
        bb_fix_init(&f, kBk[bi], 700 + (uint64_t)bi);
        float k[4 * 2 * 16], v[4 * 2 * 16];
        kva_rng rng = {9};
        kva_test_fill(k, KVA_DTYPE_F32, 4 * 2 * 16, &rng, 1.0);
        kva_test_fill(v, KVA_DTYPE_F32, 4 * 2 * 16, &rng, 1.0);
        const int64_t slots_over[2] = {0, 18}, slots_ok[2] = {0, 17}, slots_neg[2] = {-5, -1};
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, 0, v, 0, KVA_DTYPE_F32, slots_over),
            KVA_STATUS_OUT_OF_RANGE);
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, 31, v, 0, KVA_DTYPE_F32, slots_ok),
            KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, -32, v, 0, KVA_DTYPE_F32, slots_ok),
            KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, 0, v, 0, KVA_DTYPE_I8, slots_ok),
            KVA_STATUS_UNSUPPORTED);
        BAD(kva_cache_write(f.ctx, f.cache, -1, k, 0, v, 0, KVA_DTYPE_F32, slots_ok),
            KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, 0, NULL, 0, KVA_DTYPE_F32, slots_ok),
            KVA_STATUS_NULL_POINTER);
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, 0, v, 0, KVA_DTYPE_F32, NULL),
            KVA_STATUS_NULL_POINTER);
        /* Stride so large that the last row's byte offset overflows. */
        BAD(kva_cache_write(f.ctx, f.cache, 2, k, INT64_MAX / 2, v, 0, KVA_DTYPE_F32, slots_ok),
            KVA_STATUS_INVALID_ARGUMENT);
        CHECK(bb_untouched(&f));
        /* Negative slots only: OK, nothing written, rows never read (NULL-free garbage). */
        CHECK_OK(kva_cache_write(f.ctx, f.cache, 2, k, 0, v, 0, KVA_DTYPE_F32, slots_neg));
        CHECK(bb_untouched(&f));
        /* Reads: both halves NULL, a slot out of range, rows untouched. */
        uint64_t sk = bb_sum(k, sizeof k);
        BAD(kva_cache_read(f.ctx, f.cache, 2, slots_ok, NULL, 0, NULL, 0, KVA_DTYPE_F32),
            KVA_STATUS_NULL_POINTER);
        BAD(kva_cache_read(f.ctx, f.cache, 2, slots_over, k, 0, v, 0, KVA_DTYPE_F32),
            KVA_STATUS_OUT_OF_RANGE);
        BAD(kva_cache_read(f.ctx, f.cache, 2, slots_ok, k, 0, v, 0, KVA_DTYPE_FP8_E4M3),
            KVA_STATUS_UNSUPPORTED);
        CHECK(bb_sum(k, sizeof k) == sk);
        /* Block copies: ids out of range, a duplicate dst, negative count. */
        const int32_t p_over[4] = {0, 1, 6, 2}, p_neg[2] = {-1, 2}, p_dup[4] = {0, 1, 2, 1};
        BAD(kva_cache_copy_blocks(f.ctx, f.cache, p_over, 2), KVA_STATUS_OUT_OF_RANGE);
        BAD(kva_cache_copy_blocks(f.ctx, f.cache, p_neg, 1), KVA_STATUS_OUT_OF_RANGE);
        BAD(kva_cache_copy_blocks(f.ctx, f.cache, p_dup, 2), KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_copy_blocks(f.ctx, f.cache, p_dup, -1), KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_copy_blocks(f.ctx, f.cache, NULL, 1), KVA_STATUS_NULL_POINTER);
        /* Swap into a cache of another shape (Hkv 1). */
        kva_cache_desc cd = make_desc(6, 3, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *other = NULL;
        CHECK_OK(kva_cache_create(f.ctx, &cd, &other));
        const int32_t p1[2] = {0, 1};
        BAD(kva_cache_swap_blocks(f.ctx, other, f.cache, p1, 1), KVA_STATUS_SHAPE_MISMATCH);
        kva_cache_destroy(other);
        cd = make_desc(6, 3, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND); /* layout differs */
        CHECK_OK(kva_cache_create(f.ctx, &cd, &other));
        kva_status s = kva_cache_swap_blocks(f.ctx, other, f.cache, p1, 1);
        CHECK_MSG(s != KVA_STATUS_OK, "swap between NHD and HND caches accepted");
        kva_cache_destroy(other);
        CHECK(bb_untouched(&f));
        bb_fix_free(&f);
    }
}

/* Conversions, merges, reorder, DCP helpers and the pool: bad arguments
 * change nothing; a few valid edge cases. */
static void test_bad_misc(void)
{
    /* kva_convert: in place with different dtypes (the header forbids
     * overlap) is refused; equal dtypes in place are a no-op. */
    float fb[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t s0 = bb_sum(fb, sizeof fb);
    BAD(kva_convert(fb, KVA_DTYPE_F16, fb, KVA_DTYPE_F32, 4), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_convert(fb, KVA_DTYPE_F32, (char *)fb + 2, KVA_DTYPE_BF16, 4),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_convert(fb, KVA_DTYPE_I8, fb + 4, KVA_DTYPE_F32, 1), KVA_STATUS_UNSUPPORTED);
    BAD(kva_convert(NULL, KVA_DTYPE_F32, fb, KVA_DTYPE_F16, 1), KVA_STATUS_NULL_POINTER);
    CHECK(bb_sum(fb, sizeof fb) == s0);
    CHECK_OK(kva_convert(fb, KVA_DTYPE_F32, fb, KVA_DTYPE_F32, 8));
    CHECK_OK(kva_convert(NULL, KVA_DTYPE_F32, NULL, KVA_DTYPE_F16, 0));
    CHECK(bb_sum(fb, sizeof fb) == s0);
    /* Adjacent, not overlapping: fine. */
    CHECK_OK(kva_convert(fb, KVA_DTYPE_F32, fb + 4, KVA_DTYPE_BF16, 4));

    /* Merges. */
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    float oa[2 * 8], ob[2 * 8], la[2], lb[2], o[2 * 8], l[2];
    kva_rng rng = {11};
    kva_test_fill(oa, KVA_DTYPE_F32, 16, &rng, 1.0);
    kva_test_fill(ob, KVA_DTYPE_F32, 16, &rng, 1.0);
    la[0] = 0.5f, la[1] = -INFINITY, lb[0] = -INFINITY, lb[1] = -INFINITY;
    kva_test_poison(o, KVA_DTYPE_F32, 16);
    kva_test_poison(l, KVA_DTYPE_F32, 2);
    uint64_t so = bb_sum(o, sizeof o), sl = bb_sum(l, sizeof l);
    BAD(kva_merge_states(ctx, -1, 1, 8, KVA_DTYPE_F32, oa, la, ob, lb, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states(ctx, 2, 1, 12, KVA_DTYPE_F32, oa, la, ob, lb, o, l),
        KVA_STATUS_UNSUPPORTED);
    BAD(kva_merge_states(ctx, 2, 1, 8, KVA_DTYPE_I8, oa, la, ob, lb, o, l), KVA_STATUS_UNSUPPORTED);
    BAD(kva_merge_states(ctx, 2, 0, 8, KVA_DTYPE_F32, oa, la, ob, lb, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states(ctx, 2, 1, 8, KVA_DTYPE_F32, oa, NULL, ob, lb, o, l),
        KVA_STATUS_NULL_POINTER);
    BAD(kva_merge_states_n(ctx, 0, 2, 1, 8, KVA_DTYPE_F32, oa, 0, la, 0, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states_n(ctx, KVA_MAX_DCP + 1, 2, 1, 8, KVA_DTYPE_F32, oa, 0, la, 0, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states_n(ctx, 2, 2, 1, 8, KVA_DTYPE_F32, oa, 15, la, 0, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    /* Strides whose last part lies beyond the address space (the span wrapped). */
    BAD(kva_merge_states_n(ctx, 3, 2, 1, 8, KVA_DTYPE_F32, oa, INT64_MAX / 2, la, 0, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("overflows");
    BAD(kva_merge_states_n(ctx, 3, 2, 1, 8, KVA_DTYPE_F32, oa, 0, la, INT64_MAX / 3, o, l),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states_n(ctx, 3, 0, 1, 8, KVA_DTYPE_F32, NULL, INT64_MAX / 2, NULL, 0, NULL,
                           NULL),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_merge_states_n(ctx, 1, 2, 1, 8, KVA_DTYPE_F32, oa, 0, la, 0, oa + 8, l),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bb_sum(o, sizeof o) == so && bb_sum(l, sizeof l) == sl);
    /* Valid: a side of -inf contributes nothing, both -inf gives 0 and -inf; in place. */
    CHECK_OK(kva_merge_states(ctx, 2, 1, 8, KVA_DTYPE_F32, oa, la, ob, lb, o, l));
    CHECK(l[0] == 0.5f && isinf(l[1]) && l[1] < 0);
    CHECK(kva_test_compare("merge one side", o, oa, KVA_DTYPE_F32, 8, 0, 0) == 0);
    for (int e = 8; e < 16; e++)
        CHECK(o[e] == 0.0f);
    CHECK_OK(kva_merge_states(ctx, 2, 1, 8, KVA_DTYPE_F32, oa, la, ob, lb, oa, la));
    CHECK(kva_test_compare("merge in place", oa, o, KVA_DTYPE_F32, 16, 0, 0) == 0);
    kva_context_destroy(ctx);

    /* Reorder. */
    int32_t perm[4] = {9, 9, 9, 9}, nd = 77;
    const int32_t ql[4] = {3, 1, 0, 2}, ql_bad[4] = {3, -1, 0, 2};
    BAD(kva_batch_reorder_decode_first(4, ql_bad, 1, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_batch_reorder_decode_first(-1, ql, 1, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_batch_reorder_decode_first(4, ql, -2, perm, &nd), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_batch_reorder_decode_first(4, ql, 1, NULL, &nd), KVA_STATUS_NULL_POINTER);
    CHECK(perm[0] == 9 && perm[3] == 9 && nd == 77);
    CHECK_OK(kva_batch_reorder_decode_first(4, ql, 2, perm, &nd));
    CHECK(nd == 3 && perm[0] == 1 && perm[1] == 2 && perm[2] == 3 && perm[3] == 0);
    CHECK_OK(kva_batch_reorder_decode_first(0, NULL, 0, NULL, NULL));

    /* DCP helpers. */
    const int32_t sls[3] = {0, 5, 17};
    int32_t loc[3] = {-7, -7, -7};
    BAD(kva_dcp_local_lens(3, sls, 2, 2, 1, loc), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_dcp_local_lens(3, sls, -1, 0, 1, loc), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_dcp_local_lens(3, sls, 2, 0, -1, loc), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(loc[0] == -7 && loc[2] == -7);
    CHECK_OK(kva_dcp_local_lens(3, sls, 3, 1, 2, loc));
    /* positions with (i / 2) % 3 == 1: 2,3 | 8,9 | 14,15 -> 0, 2, 6 */
    CHECK(loc[0] == 0 && loc[1] == 2 && loc[2] == 6);
    int64_t slots[8];
    for (int i = 0; i < 8; i++)
        slots[i] = 123;
    const int32_t row[2] = {4, 7};
    /* rank 1 of 2, I 1: positions 0..7, local tokens 1,3,5,7 -> k 0..3; B 2: row needs 2 entries */
    BAD(kva_dcp_slots(2, 1, 1, 2, row, 1, 0, 8, slots), KVA_STATUS_OUT_OF_RANGE);
    BAD(kva_dcp_slots(2, 1, 1, 0, row, 2, 0, 8, slots), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_dcp_slots(2, 1, 1, 2, row, 2, -1, 8, slots), KVA_STATUS_INVALID_ARGUMENT);
    for (int i = 0; i < 8; i++)
        CHECK(slots[i] == 123);
    CHECK_OK(kva_dcp_slots(2, 1, 1, 2, row, 2, 0, 8, slots));
    CHECK(slots[0] == -1 && slots[1] == 8 && slots[3] == 9 && slots[5] == 14 && slots[7] == 15);

    /* Pool (no prefix caching: every build has it). */
    kva_pool *pool = NULL;
    BAD(kva_pool_create(&(kva_pool_desc){1, 4, KVA_POOL_HASH_SHA256, 0}, &pool),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_create(&(kva_pool_desc){4, 0, KVA_POOL_HASH_SHA256, 0}, &pool),
        KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_create(&(kva_pool_desc){4, 4, (kva_pool_hash)5, 1}, &pool),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    CHECK_OK(kva_pool_create(&(kva_pool_desc){4, 4, KVA_POOL_HASH_SHA256, 0}, &pool));
    const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    int32_t id = -1, cached = -1;
    BAD(kva_pool_request_add(pool, prompt, 0, NULL, 0, &id, &cached), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_request_add(pool, NULL, 6, NULL, 0, &id, &cached), KVA_STATUS_NULL_POINTER);
    BAD(kva_pool_request_add(pool, prompt, 6, NULL, 4, &id, &cached), KVA_STATUS_NULL_POINTER);
    /* The extra key: at most 65536 bytes (kvattn_pool.h). */
    static const unsigned char big[65537];
    BAD(kva_pool_request_add(pool, prompt, 6, big, sizeof big, &id, &cached),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK_OK(kva_pool_request_add(pool, prompt, 6, big, sizeof big - 1, &id, &cached));
    CHECK_OK(kva_pool_request_free(pool, id));
    id = -1, cached = -1;
    CHECK(id == -1 && cached == -1);
    CHECK_OK(kva_pool_request_add(pool, prompt, 6, NULL, 0, &id, &cached));
    CHECK(cached == 0);
    BAD(kva_pool_request_allocate(pool, id, 13, 0), KVA_STATUS_POOL_EXHAUSTED);
    BAD(kva_pool_request_allocate(pool, id + 1, 1, 0), KVA_STATUS_OUT_OF_RANGE);
    BAD(kva_pool_request_allocate(pool, -1, 1, 0), KVA_STATUS_OUT_OF_RANGE);
    BAD(kva_pool_request_allocate(pool, id, -1, 0), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_request_allocate(pool, id, INT32_MAX, INT32_MAX), KVA_STATUS_OUT_OF_RANGE);
    kva_pool_stats st;
    CHECK_OK(kva_pool_get_stats(pool, &st));
    CHECK(st.num_used_blocks == 0 && st.num_free_blocks == 3 && st.num_blocks == 3);
    CHECK_OK(kva_pool_request_allocate(pool, id, 6, 1));
    int64_t ps[4] = {5, 5, 5, 5};
    BAD(kva_pool_request_slots(pool, id, 6, 4, ps), KVA_STATUS_OUT_OF_RANGE);
    BAD(kva_pool_request_slots(pool, id, INT32_MAX, 4, ps), KVA_STATUS_OUT_OF_RANGE);
    CHECK(ps[0] == 5 && ps[3] == 5);
    int32_t brow[3] = {9, 9, 9}, nblk = -1;
    BAD(kva_pool_request_block_table(pool, id, brow, 1, &nblk), KVA_STATUS_OUT_OF_RANGE);
    CHECK(brow[0] == 9 && nblk == -1);
    CHECK_OK(kva_pool_request_block_table(pool, id, brow, 3, &nblk));
    CHECK(nblk == 2 && brow[0] > 0 && brow[1] > 0 && brow[2] == 0);
    BAD(kva_pool_request_append_tokens(pool, id, prompt, -1), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_request_drop_window(pool, id, -1), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_request_drop_chunk(pool, id, 0), KVA_STATUS_INVALID_ARGUMENT);
    BAD(kva_pool_request_free(pool, id + 5), KVA_STATUS_OUT_OF_RANGE);
    CHECK_OK(kva_pool_check(pool));
    CHECK_OK(kva_pool_request_free(pool, id));
    BAD(kva_pool_request_free(pool, id), KVA_STATUS_OUT_OF_RANGE); /* double free */
    CHECK_OK(kva_pool_check(pool));
    kva_pool_destroy(pool);
}

/* The zero-size rule (kvattn.h): a count of 0 validates the other arguments,
 * returns OK, touches nothing and takes NULL arrays, at every entry point the
 * other tests do not cover; a shape dimension of 0 is still refused. */
static void test_zero_counts(void)
{
    for (int bi = 0; bi < 2; bi++) {
        bb_fix f;
        bb_fix_init(&f, kBk[bi], 900 + (uint64_t)bi);
        CHECK_OK(kva_cache_read(f.ctx, f.cache, 0, NULL, NULL, 0, NULL, 0, KVA_DTYPE_F32));
        CHECK_OK(kva_cache_write(f.ctx, f.cache, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
        CHECK_OK(kva_cache_copy_blocks(f.ctx, f.cache, NULL, 0));
        /* Same cache twice is an argument error even with no pairs. */
        BAD(kva_cache_swap_blocks(f.ctx, f.cache, f.cache, NULL, 0), KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_read(f.ctx, f.cache, 0, NULL, NULL, 0, NULL, 0, (kva_dtype)17),
            KVA_STATUS_INVALID_ARGUMENT);
        CHECK_OK(
            kva_merge_states_n(f.ctx, 3, 0, 2, 8, KVA_DTYPE_BF16, NULL, 0, NULL, 0, NULL, NULL));
        BAD(kva_merge_states_n(f.ctx, 3, 0, 0, 8, KVA_DTYPE_BF16, NULL, 0, NULL, 0, NULL, NULL),
            KVA_STATUS_INVALID_ARGUMENT);
        /* Other arguments are still validated with a zero count. */
        BAD(kva_cache_write(f.ctx, f.cache, 0, NULL, 0, NULL, 0, KVA_DTYPE_I8, NULL),
            KVA_STATUS_UNSUPPORTED);
        BAD(kva_cache_write(f.ctx, f.cache, 0, NULL, -1, NULL, 0, KVA_DTYPE_F32, NULL),
            KVA_STATUS_INVALID_ARGUMENT);
        BAD(kva_cache_read(f.ctx, f.cache, 0, NULL, NULL, 0, NULL, 0, KVA_DTYPE_I8),
            KVA_STATUS_UNSUPPORTED);
        BAD(kva_cache_copy_blocks(f.ctx, NULL, NULL, 0), KVA_STATUS_NULL_POINTER);
        CHECK(bb_untouched(&f));
        /* A plan whose requests all have q_len 0 (state EMPTY) runs with NULL tensors. */
        const int32_t qsl0[3] = {0, 0, 0};
        kva_plan_desc pd = f.pd;
        pd.query_start_loc = qsl0;
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(p, &info));
        CHECK(info.num_tokens == 0 && info.state == KVA_STATE_EMPTY);
        CHECK_OK(kva_attention_run(f.ctx, p, NULL, f.cache, NULL, NULL, NULL));
        CHECK_OK(kva_attention_run_ragged(f.ctx, p, NULL, NULL, NULL, NULL, NULL, NULL));
        /* ... but not with a cache of the wrong shape. */
        kva_cache_desc cd = make_desc(6, 3, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *wrong = NULL;
        CHECK_OK(kva_cache_create(f.ctx, &cd, &wrong));
        BAD(kva_attention_run(f.ctx, p, NULL, wrong, NULL, NULL, NULL), KVA_STATUS_SHAPE_MISMATCH);
        kva_cache_destroy(wrong);
        kva_plan_destroy(p);
        bb_fix_free(&f);
    }
    CHECK_OK(kva_dcp_local_lens(0, NULL, 2, 1, 1, NULL));
    CHECK_OK(kva_dcp_slots(2, 1, 1, 4, NULL, 0, 5, 0, NULL));
    BAD(kva_dcp_slots(2, 1, 1, 0, NULL, 0, 5, 0, NULL), KVA_STATUS_INVALID_ARGUMENT);
    kva_pool *pool = NULL;
    CHECK_OK(kva_pool_create(&(kva_pool_desc){4, 4, KVA_POOL_HASH_SHA256, 0}, &pool));
    const int32_t prompt[2] = {7, 8};
    int32_t id = -1, nb = -1;
    CHECK_OK(kva_pool_request_add(pool, prompt, 2, NULL, 0, &id, NULL));
    CHECK_OK(kva_pool_request_allocate(pool, id, 0, 0));
    CHECK_OK(kva_pool_request_append_tokens(pool, id, NULL, 0));
    CHECK_OK(kva_pool_request_slots(pool, id, 0, 0, NULL));
    CHECK_OK(kva_pool_request_block_table(pool, id, NULL, 0, &nb));
    CHECK(nb == 0);
    CHECK_OK(kva_pool_check(pool));
    kva_pool_destroy(pool);
}

/* Every call that returns a kva_status clears kva_last_error on entry
 * (kvattn.h): after a failure, each of these succeeds and leaves "". */
#define BB_CLEARS(ok_call)                                                                         \
    do {                                                                                           \
        kva_context *bad_ = NULL;                                                                  \
        (void)kva_context_create(&(kva_context_desc){KVA_BACKEND_CPU, -5, 0}, &bad_);              \
        CHECK(kva_last_error()[0] != '\0');                                                        \
        CHECK_OK(ok_call);                                                                         \
        CHECK_MSG(kva_last_error()[0] == '\0', "%s left \"%s\"", #ok_call, kva_last_error());      \
    } while (0)

static void test_error_cleared(void)
{
    bb_fix f;
    bb_fix_init(&f, KVA_BACKEND_CPU, 1400);
    float kv[2 * 2 * 16];
    const int64_t slots[2] = {0, 4};
    const int32_t pairs[2] = {0, 1};
    BB_CLEARS(kva_cache_read(f.ctx, f.cache, 2, slots, kv, 0, NULL, 0, KVA_DTYPE_F32));
    kva_cache *c2 = NULL, *c3 = NULL;
    kva_cache_desc cd;
    BB_CLEARS(kva_cache_get_desc(f.cache, &cd));
    BB_CLEARS(kva_cache_create_quant(f.ctx, &cd, NULL, &c2));
    BB_CLEARS(kva_cache_swap_blocks(f.ctx, f.cache, c2, pairs, 1));
    float *ts = NULL;
    BB_CLEARS(kva_cache_token_scales(c2, &ts));
    void *kd = NULL, *vd = NULL;
    CHECK_OK(kva_cache_data(c2, &kd, &vd));
    BB_CLEARS(kva_cache_create_from(f.ctx, &cd, kd, vd, &c3));
    kva_cache_destroy(c3);
    c3 = NULL;
    cd.num_blocks = 3;
    BB_CLEARS(kva_cache_create_from_interleaved(f.ctx, &cd, kd, &c3));
    kva_cache_destroy(c3);
    kva_cache_destroy(c2);
    BB_CLEARS(kva_plan_update(f.ctx, f.plan, &f.pd));
    /* The ragged keys of the fixture's batch: 7 + 5 rows of [Hkv 2, D 16]
     * (f.q, 4 rows of [4, 16], is too short to serve as k / v, and out follows it). */
    static float kv_rows[12 * 2 * 16];
    kva_rng krng = {1401};
    kva_test_fill(kv_rows, KVA_DTYPE_F32, 12 * 2 * 16, &krng, 1.0);
    BB_CLEARS(kva_attention_run_ragged(f.ctx, f.plan, f.q, kv_rows, kv_rows, NULL, f.out, f.lse));
    BB_CLEARS(kva_merge_states_n(f.ctx, 1, 1, 1, 8, KVA_DTYPE_F32, f.q, 0, f.lse, 0, f.out, NULL));
    int32_t loc[2];
    int64_t sl[4];
    const int32_t row[2] = {1, 2};
    BB_CLEARS(kva_dcp_local_lens(2, f.sl, 2, 0, 1, loc));
    BB_CLEARS(kva_dcp_slots(2, 0, 1, 4, row, 2, 0, 4, sl));
    kva_pool *pool = NULL;
    BB_CLEARS(kva_pool_create(&(kva_pool_desc){8, 2, KVA_POOL_HASH_SHA256, 0}, &pool));
    const int32_t prompt[3] = {1, 2, 3};
    int32_t id = -1, id2 = -1, copy[2], brow[4];
    kva_pool_request_info ri;
    BB_CLEARS(kva_pool_request_add(pool, prompt, 3, NULL, 0, &id, NULL));
    BB_CLEARS(kva_pool_request_allocate(pool, id, 3, 0));
    BB_CLEARS(kva_pool_request_append_tokens(pool, id, prompt, 3));
    BB_CLEARS(kva_pool_request_fork(pool, id, &id2, copy));
    BB_CLEARS(kva_pool_request_block_table(pool, id, brow, 4, NULL));
    BB_CLEARS(kva_pool_request_slots(pool, id, 0, 3, sl));
    BB_CLEARS(kva_pool_request_get_info(pool, id, &ri));
    BB_CLEARS(kva_pool_request_drop_window(pool, id, 1));
    BB_CLEARS(kva_pool_request_drop_chunk(pool, id2, 2));
    BB_CLEARS(kva_pool_check(pool));
    BB_CLEARS(kva_pool_request_free(pool, id));
    BB_CLEARS(kva_pool_request_free(pool, id2));
    BB_CLEARS(kva_pool_reset_prefix_cache(pool));
    kva_pool_destroy(pool);
    bb_fix_free(&f);
}

int main(void)
{
    RUN(test_error_cleared);
    RUN(test_names);
    RUN(test_handles);
    RUN(test_bad_plans);
    RUN(test_bad_runs);
    RUN(test_bad_caches);
    RUN(test_bad_cache_calls);
    RUN(test_bad_misc);
    RUN(test_zero_counts);
    return kva_test_finish();
}
