/*
 * test_cache_interleaved.c - kva_cache_create_from_interleaved (FlashInfer's
 * 5-D paged cache [NP, 2, ...], K and V pages interleaved): attention over it
 * with block ids 2p equals attention over the same pages given as separate
 * K and V buffers (bitwise, same backend), writes land in the right halves,
 * and bad descriptors are refused.
 */
#include "harness.h"

enum { NP = 5, B = 4, HKV = 2, D = 16, H = 4 };

static void test_matches_separate(kva_backend be, kva_layout layout)
{
    kva_context_desc cd = {be, 2, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    size_t page = (size_t)B * HKV * D;
    float *kv = malloc(sizeof(float) * NP * 2 * page);
    float *k = malloc(sizeof(float) * NP * page), *v = malloc(sizeof(float) * NP * page);
    kva_rng r = {5};
    kva_test_fill(kv, KVA_DTYPE_F32, NP * 2 * page, &r, 1.0);
    for (int p = 0; p < NP; p++) {
        memcpy(k + p * page, kv + (2 * p) * page, sizeof(float) * page);
        memcpy(v + p * page, kv + (2 * p + 1) * page, sizeof(float) * page);
    }
    kva_cache_desc desc = {NP, B, HKV, D, 0, KVA_DTYPE_F32, layout, KVA_QUANT_NONE};
    kva_cache *ci = NULL, *cs = NULL;
    CHECK_OK(kva_cache_create_from_interleaved(ctx, &desc, kv, &ci));
    CHECK_OK(kva_cache_create_from(ctx, &desc, k, v, &cs));
    kva_cache_desc got;
    CHECK_OK(kva_cache_get_desc(ci, &got));
    CHECK(got.num_blocks == 2 * NP - 1);

    /* Two decodes over pages {3, 0, 4} (10 keys) and {1} (3 keys). */
    int32_t qsl[3] = {0, 1, 2}, seq[2] = {10, 3};
    int32_t bt_s[6] = {3, 0, 4, 1, 0, 0}, bt_i[6];
    for (int i = 0; i < 6; i++)
        bt_i[i] = 2 * bt_s[i];
    kva_plan_desc pd = {0};
    pd.num_requests = 2;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq;
    pd.block_table_stride = 3;
    pd.block_size = B;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.causal = 1;
    pd.window_left = -1;
    float q[2 * H * D], out_i[2 * H * D], out_s[2 * H * D], lse_i[2 * H], lse_s[2 * H];
    kva_test_fill(q, KVA_DTYPE_F32, 2 * H * D, &r, 1.0);
    kva_plan *pi = NULL, *ps = NULL;
    pd.block_table = bt_i;
    CHECK_OK(kva_plan_create(ctx, &pd, &pi));
    pd.block_table = bt_s;
    CHECK_OK(kva_plan_create(ctx, &pd, &ps));
    kva_test_poison(out_i, KVA_DTYPE_F32, 2 * H * D);
    kva_test_poison(out_s, KVA_DTYPE_F32, 2 * H * D);
    kva_test_poison(lse_i, KVA_DTYPE_F32, 2 * H);
    kva_test_poison(lse_s, KVA_DTYPE_F32, 2 * H);
    CHECK_OK(kva_attention_run(ctx, pi, q, ci, NULL, out_i, lse_i));
    CHECK_OK(kva_attention_run(ctx, ps, q, cs, NULL, out_s, lse_s));
    CHECK(memcmp(out_i, out_s, sizeof out_i) == 0 && memcmp(lse_i, lse_s, sizeof lse_i) == 0);
    /* The two runs are compared only with each other: every element must
     * have been written (one that neither run writes holds the same poison). */
    CHECK(kva_test_count_poisoned(out_i, KVA_DTYPE_F32, 2 * H * D) == 0 &&
          kva_test_count_poisoned(lse_i, KVA_DTYPE_F32, 2 * H) == 0);

    /* A write to page 2, offset 1 (slot 2*2*B + 1) lands in kv[2][0] / kv[2][1]. */
    float kn[HKV * D], vn[HKV * D];
    kva_test_fill(kn, KVA_DTYPE_F32, HKV * D, &r, 1.0);
    kva_test_fill(vn, KVA_DTYPE_F32, HKV * D, &r, 1.0);
    int64_t slot = 2 * 2 * B + 1;
    CHECK_OK(kva_cache_write(ctx, ci, 1, kn, 0, vn, 0, KVA_DTYPE_F32, &slot));
    for (int h = 0; h < HKV; h++) {
        size_t row = layout == KVA_LAYOUT_NHD ? (size_t)(1 * HKV + h) * D : (size_t)(h * B + 1) * D;
        CHECK(memcmp(kv + 4 * page + row, kn + h * D, sizeof(float) * D) == 0);
        CHECK(memcmp(kv + 5 * page + row, vn + h * D, sizeof(float) * D) == 0);
    }
    kva_plan_destroy(pi);
    kva_plan_destroy(ps);
    kva_cache_destroy(ci);
    kva_cache_destroy(cs);
    free(kv);
    free(k);
    free(v);
    kva_context_destroy(ctx);
}

static void test_layouts(void)
{
    for (int be = KVA_BACKEND_REF; be <= KVA_BACKEND_CPU; be++) {
        test_matches_separate((kva_backend)be, KVA_LAYOUT_NHD);
        test_matches_separate((kva_backend)be, KVA_LAYOUT_HND);
    }
}

static void test_errors(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(NULL, &ctx));
    float buf[2 * B * HKV * 32];
    kva_cache *c = (kva_cache *)&buf; /* must stay untouched */
    kva_cache_desc desc = {1, B, HKV, 32, 16, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE};
    CHECK_STATUS(kva_cache_create_from_interleaved(ctx, &desc, buf, &c), KVA_STATUS_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "head_dim_v") != NULL);
    desc.head_dim_v = 0;
    desc.dtype = KVA_DTYPE_I8;
    desc.quant = KVA_QUANT_INT8_CHANNEL;
    CHECK(kva_cache_create_from_interleaved(ctx, &desc, buf, &c) != KVA_STATUS_OK);
    desc.dtype = KVA_DTYPE_F32;
    desc.quant = KVA_QUANT_NONE;
    desc.num_blocks = 0;
    CHECK_STATUS(kva_cache_create_from_interleaved(ctx, &desc, buf, &c),
                 KVA_STATUS_INVALID_ARGUMENT);
    desc.num_blocks = 1;
    CHECK_STATUS(kva_cache_create_from_interleaved(ctx, &desc, NULL, &c), KVA_STATUS_NULL_POINTER);
    CHECK(c == (kva_cache *)&buf);
    CHECK_OK(kva_cache_create_from_interleaved(ctx, &desc, buf, &c));
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_layouts);
    RUN(test_errors);
    return kva_test_finish();
}
