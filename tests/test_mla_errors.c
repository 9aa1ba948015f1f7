/*
 * test_mla_errors.c - the latent cache's storage contract (write, copy,
 * swap) and bad input to every MLA entry point.
 *
 *   - kva_cache_write on an MLA cache stores [c_kv | k_pe] per slot exactly
 *     (f32 -> f32 bit for bit, f32 -> bf16 rounded once, FP8 codes of x /
 *     scale), from strided sources; negative slots are skipped; a slot past
 *     the cache, a short stride change nothing.
 *   - copy_blocks / swap_blocks move whole latent blocks.
 *   - Descriptors that break the MLA relations (Hkv != 1, Dc missing or not
 *     below D, int8 formats, v scales, V storage), MLA plans with a default
 *     scale, masks MLA does not take, half-given layer head sizes, a backend
 *     without MLA kernels: a status naming the argument, nothing created.
 *   - A latent cache passed to an MHA plan and vice versa, Dc disagreeing
 *     between plan and cache, kva_mla_run on an MHA or kernel-level plan,
 *     the ragged run on an MLA plan, NULL weights: a status, outputs unchanged.
 */
#include "mla_util.h"

#define SENTINEL ((void *)(uintptr_t)0x1234)

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

static kva_cache_desc latent_desc(kva_dtype dt)
{
    kva_cache_desc d = {.num_blocks = 4,
                        .block_size = 4,
                        .num_kv_heads = 1,
                        .head_dim = 24,
                        .head_dim_v = 16,
                        .dtype = dt,
                        .kind = KVA_ATTN_MLA};
    return d;
}

static void test_cache_desc(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU);
    kva_cache *c = SENTINEL;
    kva_cache_desc d = latent_desc(KVA_DTYPE_F32);
    d.num_kv_heads = 2;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads = 2");
    d = latent_desc(KVA_DTYPE_F32);
    d.head_dim_v = 0;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "head_dim_v = 0");
    d.head_dim_v = 24;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "head_dim_v = 24");
    d = latent_desc(KVA_DTYPE_I8);
    d.quant = KVA_QUANT_INT8_CHANNEL;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_UNSUPPORTED, "int8_channel");
    d = latent_desc(KVA_DTYPE_FP8_E4M3);
    d.quant = KVA_QUANT_FP8_E4M3;
    const float s = 0.5f;
    kva_quant_params qp = {.v_scale = &s, .v_scale_len = 1};
    EXPECT_FAIL(kva_cache_create_quant(ctx, &d, &qp, &c), KVA_STATUS_INVALID_ARGUMENT, "v_scale");
    float buf[4 * 4 * 24];
    d = latent_desc(KVA_DTYPE_F32);
    EXPECT_FAIL(kva_cache_create_from(ctx, &d, buf, buf, &c), KVA_STATUS_INVALID_ARGUMENT,
                "v_data");
    EXPECT_FAIL(kva_cache_create_from_interleaved(ctx, &d, buf, &c), KVA_STATUS_UNSUPPORTED,
                "KVA_ATTN_MLA");
    CHECK(c == SENTINEL);

    /* Caller storage without V: v_data reads back as k_data. */
    c = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &d, buf, NULL, &c));
    void *k = NULL, *v = NULL;
    CHECK_OK(kva_cache_data(c, &k, &v));
    CHECK(k == (void *)buf && v == (void *)buf);
    CHECK(kva_cache_block_bytes_k(c) == 4 * 24 * sizeof(float));
    CHECK(kva_cache_block_bytes_v(c) == 0);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* Writes: layout, conversion, strides, skipped slots, failing calls. */
static void test_write(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU);
    kva_rng rng = {3};
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_FP8_E4M3};
    for (int di = 0; di < 3; di++) {
        const int fp8 = dts[di] == KVA_DTYPE_FP8_E4M3;
        kva_cache_desc d = latent_desc(dts[di]);
        d.quant = fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE;
        const float scale = 0.25f;
        kva_quant_params qp = {.k_scale = &scale, .k_scale_len = 1};
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &d, fp8 ? &qp : NULL, &c));
        unsigned char *k = NULL;
        CHECK_OK(kva_cache_data(c, (void **)&k, NULL));
        const size_t es = kva_dtype_size(dts[di]), bytes = 4 * 4 * 24 * es;
        memset(k, 0x11, bytes);
        /* 3 tokens, c_kv rows 16 + 4 apart, k_pe rows 8 + 2 apart; token 1 skipped
         * (its rows hold NaN). */
        float ckv[3 * 20], kpe[3 * 10];
        kva_test_fill_uniform(ckv, KVA_DTYPE_F32, 60, &rng);
        kva_test_fill_uniform(kpe, KVA_DTYPE_F32, 30, &rng);
        for (int i = 0; i < 16; i++)
            ckv[20 + i] = NAN;
        int64_t slots[3] = {5, -1, 14};
        CHECK_OK(kva_cache_write(ctx, c, 3, ckv, 20, kpe, 10, KVA_DTYPE_F32, slots));
        for (int64_t slot = 0; slot < 16; slot++) {
            const int t = slot == 5 ? 0 : slot == 14 ? 2 : -1;
            for (int ch = 0; ch < 24; ch++) {
                const unsigned char *e = k + (size_t)(slot * 24 + ch) * es;
                if (t < 0) {
                    CHECK(*e == 0x11);
                    continue;
                }
                const float x = ch < 16 ? ckv[t * 20 + ch] : kpe[t * 10 + ch - 16];
                if (dts[di] == KVA_DTYPE_F32)
                    CHECK(memcmp(e, &x, 4) == 0);
                else if (dts[di] == KVA_DTYPE_BF16) {
                    uint16_t want = kva_f32_to_bf16(x), got;
                    memcpy(&got, e, 2);
                    CHECK(got == want);
                } else
                    CHECK(*e == kva_f32_to_fp8_e4m3(x / scale));
            }
        }
        /* Failing writes change nothing. */
        unsigned char *before = malloc(bytes);
        memcpy(before, k, bytes);
        int64_t bad[2] = {2, 16};
        EXPECT_FAIL(kva_cache_write(ctx, c, 2, ckv, 0, kpe, 0, KVA_DTYPE_F32, bad),
                    KVA_STATUS_OUT_OF_RANGE, "slot_mapping[1] = 16");
        EXPECT_FAIL(kva_cache_write(ctx, c, 2, ckv, 12, kpe, 0, KVA_DTYPE_F32, slots),
                    KVA_STATUS_INVALID_ARGUMENT, "k_token_stride = 12");
        EXPECT_FAIL(kva_cache_write(ctx, c, 2, ckv, 0, kpe, 6, KVA_DTYPE_F32, slots),
                    KVA_STATUS_INVALID_ARGUMENT, "v_token_stride = 6");
        CHECK(memcmp(before, k, bytes) == 0);

        /* Block copies move whole latent rows: block 1 (slots 4..7) -> 3. */
        int32_t pair[2] = {1, 3};
        CHECK_OK(kva_cache_copy_blocks(ctx, c, pair, 1));
        CHECK(memcmp(k + 3 * 4 * 24 * es, k + 1 * 4 * 24 * es, 4 * 24 * es) == 0);
        kva_cache *c2 = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &d, fp8 ? &qp : NULL, &c2));
        unsigned char *k2 = NULL;
        CHECK_OK(kva_cache_data(c2, (void **)&k2, NULL));
        int32_t sw[2] = {3, 0};
        CHECK_OK(kva_cache_swap_blocks(ctx, c, c2, sw, 1));
        CHECK(memcmp(k2, k + 3 * 4 * 24 * es, 4 * 24 * es) == 0);
        free(before);
        kva_cache_destroy(c);
        kva_cache_destroy(c2);
    }
    kva_context_destroy(ctx);
}

/* A small MLA case for the plan and run checks. */
static mla_case tiny(void)
{
    const int32_t ql[2] = {1, 3}, sl[2] = {6, 9};
    return mla_case_of(4, 16, 8, 8, 8, 4, KVA_DTYPE_F32, 1, 1, 2, ql, sl, 5);
}

/* A rotary part wider than the latent part (Dr 496 > Dc 16; fuzz_desc's
 * finding crash-81db0a6b was the harness sizing k_pe by Dc): the write reads
 * exactly Dc values of c_kv and Dr of k_pe (buffers of those sizes, so ASan
 * sees any read past them) on the reference and CPU backends. */
static void test_write_wide_rope(void)
{
    const kva_backend bs[2] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(bs[bi]);
        kva_cache_desc d = latent_desc(KVA_DTYPE_F32);
        d.head_dim = 512;
        d.head_dim_v = 16;
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &d, &c));
        float *rows = NULL;
        CHECK_OK(kva_cache_data(c, (void **)&rows, NULL));
        float *ckv = malloc(16 * sizeof *ckv), *kpe = malloc(496 * sizeof *kpe);
        kva_rng rng = {11};
        kva_test_fill_uniform(ckv, KVA_DTYPE_F32, 16, &rng);
        kva_test_fill_uniform(kpe, KVA_DTYPE_F32, 496, &rng);
        const int64_t slot = 6;
        CHECK_OK(kva_cache_write(ctx, c, 1, ckv, 0, kpe, 0, KVA_DTYPE_F32, &slot));
        CHECK(memcmp(rows + slot * 512, ckv, 16 * sizeof *ckv) == 0);
        CHECK(memcmp(rows + slot * 512 + 16, kpe, 496 * sizeof *kpe) == 0);
        free(ckv);
        free(kpe);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

static void test_plan_desc(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU);
    mla_case c = tiny();
    mla_data m;
    CHECK(mla_data_make(ctx, &c, &m));
    kva_plan *p = SENTINEL;
    kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
    pd.num_kv_heads = 2;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads = 2");
    pd = mla_plan_desc(&c, &m, 1);
    pd.head_dim_v = 0;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT, "head_dim_v = 0");
    pd = mla_plan_desc(&c, &m, 1);
    pd.scale = 0.0f;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT, "scale");
    pd = mla_plan_desc(&c, &m, 1);
    pd.window_left = 8;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "window_left = 8");
    pd = mla_plan_desc(&c, &m, 1);
    pd.softcap = 30.0f;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "softcap = 30");
    pd = mla_plan_desc(&c, &m, 1);
    pd.mla_v_head_dim = 0;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT, "give both");
    pd = mla_plan_desc(&c, &m, 1);
    pd.mla_qk_nope_head_dim = 12;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "mla_qk_nope_head_dim = 12");
    pd = mla_plan_desc(&c, &m, 1);
    pd.kind = KVA_ATTN_MHA;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT, "must be 0");
    CHECK(p == SENTINEL);

    /* A backend without MLA kernels, or without the layer-level call. */
    kva__backend_ops limited = *ctx->ops;
    const kva__backend_ops *own = ctx->ops;
    limited.mla_run = NULL;
    ctx->ops = &limited;
    pd = mla_plan_desc(&c, &m, 1);
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "kva_mla_run");
    pd = mla_plan_desc(&c, &m, 0);
    p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p)); /* the kernel-level plan still works */
    kva_plan_destroy(p);
    p = SENTINEL;
    limited.mla_attention_paged = NULL;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "no MLA kernels");
    CHECK(p == SENTINEL);
    kva_cache_desc cd = mla_cache_desc(&c, 4);
    kva_cache *cc = SENTINEL;
    EXPECT_FAIL(kva_cache_create(ctx, &cd, &cc), KVA_STATUS_UNSUPPORTED, "no MLA kernels");
    CHECK(cc == SENTINEL);
    ctx->ops = own;
    mla_data_free(&m);
    kva_context_destroy(ctx);
}

/* Runs that must fail leave out and lse as they were. */
static void test_run_mismatch(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU);
    mla_case c = tiny();
    mla_data m;
    CHECK(mla_data_make(ctx, &c, &m));
    const size_t rows = (size_t)m.T * c.H;
    float out[4 * 4 * 24], lse[16], snap[4 * 4 * 24];
    for (size_t i = 0; i < sizeof out / 4; i++)
        out[i] = -7.0f;
    for (size_t i = 0; i < 16; i++)
        lse[i] = -7.0f;
    memcpy(snap, out, sizeof out);
    kva_plan_desc layer = mla_plan_desc(&c, &m, 1), kern = mla_plan_desc(&c, &m, 0);
    kva_plan *pl = NULL, *pk = NULL, *pm = NULL;
    CHECK_OK(kva_plan_create(ctx, &layer, &pl));
    CHECK_OK(kva_plan_create(ctx, &kern, &pk));

    /* An MHA plan of the same shape and an MHA cache. */
    kva_plan_desc mha = kern;
    mha.kind = KVA_ATTN_MHA;
    CHECK_OK(kva_plan_create(ctx, &mha, &pm));
    kva_cache_desc hd = mla_cache_desc(&c, m.nb);
    hd.kind = KVA_ATTN_MHA;
    kva_cache *mha_cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &hd, &mha_cache));
    EXPECT_FAIL(kva_attention_run(ctx, pm, m.q, m.cache, NULL, out, lse), KVA_STATUS_SHAPE_MISMATCH,
                "kind");
    EXPECT_FAIL(kva_attention_run(ctx, pk, m.q, mha_cache, NULL, out, lse),
                KVA_STATUS_SHAPE_MISMATCH, "kind");
    EXPECT_FAIL(kva_mla_run(ctx, pl, m.q, m.w_uk, m.w_uv, mha_cache, out, lse),
                KVA_STATUS_SHAPE_MISMATCH, "kind");
    EXPECT_FAIL(kva_mla_run(ctx, pm, m.q, m.w_uk, m.w_uv, m.cache, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "not KVA_ATTN_MLA");
    EXPECT_FAIL(kva_mla_run(ctx, pk, m.q, m.w_uk, m.w_uv, m.cache, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "kernel-level plan");
    EXPECT_FAIL(kva_mla_run(ctx, pl, m.q, NULL, m.w_uv, m.cache, out, lse), KVA_STATUS_NULL_POINTER,
                "w_uk");
    EXPECT_FAIL(kva_attention_run_ragged(ctx, pk, m.q, m.q, m.q, NULL, out, lse),
                KVA_STATUS_INVALID_ARGUMENT, "KVA_ATTN_MLA");

    /* Dc (and with it Dr) disagreeing between plan and cache. */
    kva_plan_desc other = layer;
    other.head_dim_v = 8; /* Dc 8, Dr 16: D stays 24 */
    kva_plan *po = NULL;
    CHECK_OK(kva_plan_create(ctx, &other, &po));
    EXPECT_FAIL(kva_mla_run(ctx, po, m.q, m.w_uk, m.w_uv, m.cache, out, lse),
                KVA_STATUS_SHAPE_MISMATCH, "head_dim_v");
    EXPECT_FAIL(kva_attention_run(ctx, po, m.q, m.cache, NULL, out, lse), KVA_STATUS_SHAPE_MISMATCH,
                "head_dim_v");
    CHECK(memcmp(snap, out, sizeof out) == 0);
    for (size_t i = 0; i < rows; i++)
        CHECK(lse[i] == -7.0f);

    /* The same calls with matching arguments run. */
    CHECK_OK(kva_mla_run(ctx, pl, m.q, m.w_uk, m.w_uv, m.cache, out, lse));
    for (size_t i = 0; i < rows * c.Dv; i++)
        CHECK(isfinite(out[i]) && out[i] != -7.0f);
    kva_plan_destroy(pl);
    kva_plan_destroy(pk);
    kva_plan_destroy(pm);
    kva_plan_destroy(po);
    kva_cache_destroy(mha_cache);
    mla_data_free(&m);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_cache_desc);
    RUN(test_write);
    RUN(test_write_wide_rope);
    RUN(test_plan_desc);
    RUN(test_run_mismatch);
    return kva_test_finish();
}
