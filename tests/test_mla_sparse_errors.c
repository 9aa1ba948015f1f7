/*
 * test_mla_sparse_errors.c - bad input to sparse MLA plans and
 * kva_mla_sparse_run on the host backends: a status naming the argument,
 * nothing created, out / lse (poisoned) and the cache unchanged.
 *
 *   - Plans: sparse_topk < 0 or > KVA_MAX_TOPK, on an MHA plan, a bad
 *     sparse_mode (or one on a dense plan), layer head sizes, DCP, a tree,
 *     cascade on, the MLA masks.
 *   - Runs: an index past seq_len or below -1 (KVA_STATUS_OUT_OF_RANGE
 *     naming token, entry and value), a topk_length outside 0 .. K, a short
 *     indices_stride, NULL and misaligned pointers, a dense plan given to
 *     the sparse run and a sparse plan to kva_attention_run / kva_mla_run,
 *     an fp8_ds_mla cache to the dense run, an MHA cache, a plan of another
 *     backend.
 *   - Entries past topk_length are never read, so garbage there is fine.
 */
#include "sparse_util.h"

#define EXPECT_FAIL(expr, status, substr)                                                          \
    do {                                                                                           \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_ERROR_MENTIONS(substr);                                                              \
    } while (0)

static kva_context *new_ctx(kva_backend b)
{
    kva_context_desc cd = {b, 2, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    return ctx;
}

static const sp_case base = {.H = 4,
                             .Dc = 128,
                             .Dr = 64,
                             .B = 8,
                             .K = 16,
                             .dt = KVA_DTYPE_BF16,
                             .quant = KVA_QUANT_FP8_DS_MLA,
                             .thr = 1,
                             .R = 2,
                             .q_len = {1, 3},
                             .seq_len = {10, 20},
                             .use_len = 1,
                             .unused = 0.2,
                             .seed = 7};

static void test_plans(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU);
    sp_data m;
    if (!sp_data_make(ctx, &base, &m)) {
        CHECK_MSG(0, "setup: %s", kva_last_error());
        kva_context_destroy(ctx);
        return;
    }
    kva_plan *p = (kva_plan *)(uintptr_t)0x1234;
    kva_plan_desc d = sp_plan_desc(&base, &m);
    d.sparse_topk = -1;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "sparse_topk = -1");
    d.sparse_topk = KVA_MAX_TOPK + 1;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "KVA_MAX_TOPK");
    d = sp_plan_desc(&base, &m);
    d.kind = KVA_ATTN_MHA;
    d.num_kv_heads = 1;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "kind = 0");
    d = sp_plan_desc(&base, &m);
    d.sparse_mode = 2;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "sparse_mode = 2");
    d.sparse_topk = 0;
    d.sparse_mode = 1;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "dense plan");
    d = sp_plan_desc(&base, &m);
    d.mla_qk_nope_head_dim = 128;
    d.mla_v_head_dim = 128;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT, "mla_qk_nope_head_dim");
    d = sp_plan_desc(&base, &m);
    d.dcp_size = 2;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_UNSUPPORTED, "dcp_size = 2");
    d = sp_plan_desc(&base, &m);
    d.cascade = KVA_CASCADE_ON;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_UNSUPPORTED, "cascade");
    d = sp_plan_desc(&base, &m);
    const int32_t parents[4] = {-1, -1, 0, 1};
    d.tree_parents = parents;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_UNSUPPORTED, "tree");
    d = sp_plan_desc(&base, &m);
    d.window_left = 4;
    EXPECT_FAIL(kva_plan_create(ctx, &d, &p), KVA_STATUS_UNSUPPORTED, "window_left = 4");
    CHECK(p == (kva_plan *)(uintptr_t)0x1234);
    /* causal is ignored: more queries than keys is fine for a sparse plan. */
    d = sp_plan_desc(&base, &m);
    int32_t sl[2] = {10, 2};
    d.seq_lens = sl;
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    kva_plan_destroy(p);
    sp_data_free(&m);
    kva_context_destroy(ctx);
}

/* Runs the bad calls of one backend; out, lse and the cache stay as they were. */
static void check_runs(kva_backend be)
{
    kva_context *ctx = new_ctx(be),
                *other = new_ctx(be == KVA_BACKEND_CPU ? KVA_BACKEND_REF : KVA_BACKEND_CPU);
    sp_data m;
    if (!sp_data_make(ctx, &base, &m)) {
        CHECK_MSG(0, "setup: %s", kva_last_error());
        kva_context_destroy(ctx);
        kva_context_destroy(other);
        return;
    }
    kva_plan_desc d = sp_plan_desc(&base, &m);
    kva_plan *plan = NULL, *dense = NULL, *foreign = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    CHECK_OK(kva_plan_create(other, &d, &foreign));
    kva_plan_desc dd = d;
    dd.sparse_topk = 0;
    CHECK_OK(kva_plan_create(ctx, &dd, &dense));
    const size_t rows = (size_t)m.T * base.H, n = rows * base.Dc;
    uint16_t *out = malloc(n * 2 + 16);
    float *lse = malloc(rows * 4 + 16);
    kva_test_poison(out, KVA_DTYPE_BF16, n + 8);
    kva_test_poison(lse, KVA_DTYPE_F32, rows + 4);
    void *kdata = NULL;
    kva_cache_data(m.cache, &kdata, NULL);
    const size_t cb = (size_t)m.nb * kva_cache_block_bytes_k(m.cache);
    unsigned char *before = malloc(cb);
    memcpy(before, kdata, cb);
    const int32_t K = base.K;
    int32_t *idx = m.idx, *len = m.len;
    /* Entries past topk_length are garbage and must not be read. */
    len[1] = 3;
    idx[(size_t)1 * K + 5] = 99999;
    CHECK_OK(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, out, lse));
    kva_test_poison(out, KVA_DTYPE_BF16, n + 8);
    kva_test_poison(lse, KVA_DTYPE_F32, rows + 4);

    /* Token 2 belongs to request 1 (seq_len 20): 20 is past its end. */
    idx[(size_t)2 * K + 1] = 20;
    len[2] = K;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_OUT_OF_RANGE, "indices[token 2, entry 1] = 20");
    idx[(size_t)2 * K + 1] = -2;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_OUT_OF_RANGE, "= -2");
    /* Without topk_length every entry counts: token 1's garbage too. */
    idx[(size_t)2 * K + 1] = 19;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, NULL, NULL, out, lse),
                KVA_STATUS_OUT_OF_RANGE, "indices[token 1, entry 5] = 99999");
    idx[(size_t)1 * K + 5] = -1;
    len[0] = K + 1;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_OUT_OF_RANGE, "topk_length[0] = 17");
    len[0] = -1;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_OUT_OF_RANGE, "topk_length[0] = -1");
    len[0] = 2;
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, K - 1, len, NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "indices_stride = 15");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, NULL, 0, len, NULL, out, lse),
                KVA_STATUS_NULL_POINTER, "indices");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, NULL, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_NULL_POINTER, "'q'");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, NULL, lse),
                KVA_STATUS_NULL_POINTER, "'out'");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, NULL, idx, 0, len, NULL, out, lse),
                KVA_STATUS_NULL_POINTER, "cache");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, (int32_t *)((char *)idx + 2), 0, len,
                                   NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "indices");
    EXPECT_FAIL(
        kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len, NULL, (char *)out + 1, lse),
        KVA_STATUS_INVALID_ARGUMENT, "out");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, m.cache, idx, 0, len,
                                   (const float *)((char *)lse + 1), out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "sinks");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, dense, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "sparse_topk = 0");
    EXPECT_FAIL(kva_mla_sparse_run(ctx, foreign, m.q, m.cache, idx, 0, len, NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "backend");
    EXPECT_FAIL(kva_attention_run(ctx, plan, m.q, m.cache, NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "kva_mla_sparse_run");
    EXPECT_FAIL(kva_mla_run(ctx, plan, m.q, m.q, m.q, m.cache, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "kva_mla_sparse_run");
    EXPECT_FAIL(kva_attention_run(ctx, dense, m.q, m.cache, NULL, out, lse), KVA_STATUS_UNSUPPORTED,
                "fp8_ds_mla");
    /* An MHA cache of the same sizes. */
    kva_cache_desc mc = {.num_blocks = m.nb,
                         .block_size = base.B,
                         .num_kv_heads = 1,
                         .head_dim = base.Dc + base.Dr,
                         .head_dim_v = base.Dc,
                         .dtype = KVA_DTYPE_BF16};
    kva_cache *mha = NULL;
    CHECK_OK(kva_cache_create(ctx, &mc, &mha));
    EXPECT_FAIL(kva_mla_sparse_run(ctx, plan, m.q, mha, idx, 0, len, NULL, out, lse),
                KVA_STATUS_SHAPE_MISMATCH, "kind");
    kva_cache_destroy(mha);

    int untouched = 1;
    for (size_t i = 0; i < n + 8; i++)
        untouched &= kva_test_poisoned(out, KVA_DTYPE_BF16, i);
    for (size_t i = 0; i < rows + 4; i++)
        untouched &= kva_test_poisoned(lse, KVA_DTYPE_F32, i);
    CHECK_MSG(untouched, "a failing call wrote out or lse");
    CHECK(memcmp(kdata, before, cb) == 0);
    free(before);
    free(out);
    free(lse);
    kva_plan_destroy(plan);
    kva_plan_destroy(dense);
    kva_plan_destroy(foreign);
    sp_data_free(&m);
    kva_context_destroy(ctx);
    kva_context_destroy(other);
}

static void test_runs_cpu(void)
{
    check_runs(KVA_BACKEND_CPU);
}

static void test_runs_ref(void)
{
    check_runs(KVA_BACKEND_REF);
}

int main(void)
{
    RUN(test_plans);
    RUN(test_runs_cpu);
    RUN(test_runs_ref);
    return kva_test_finish();
}
