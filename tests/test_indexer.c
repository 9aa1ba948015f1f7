/*
 * test_indexer.c - the lightning indexer (kva_indexer_run) and its index-key
 * cache (kind KVA_ATTN_INDEX) on the reference and CPU backends.
 *
 * Every run is checked against the test's own fp64 logits and a sort with
 * ties broken by position (indexer_util.h): the reference backend must
 * match it exactly; the CPU backend (fp32, each ISA level forced in turn)
 * may only swap keys whose logits lie within float rounding of each other.
 * The FP8_TOKEN bytes are checked against the test's own quantizer; bad
 * input must get a status and leave caches and outputs untouched.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "indexer_util.h"

#define SENTINEL 0x5a5a5a5a

/* Writes the case's keys into a new cache of ctx. */
static kva_cache *make_cache(kva_context *ctx, const idx_case *c, const idx_data *x)
{
    kva_cache_desc cd = idx_cache_desc(c, x);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    if (cache && x->total > 0)
        CHECK_OK(
            kva_cache_write(ctx, cache, x->total, x->keys, 0, NULL, 0, KVA_DTYPE_F32, x->slots));
    return cache;
}

/* Runs case c on ctx and checks it; rows are K + 3 apart, the 3 extra
 * entries must stay untouched. */
static void run_on(kva_context *ctx, const char *label, const idx_case *c, const idx_data *x,
                   int exact)
{
    kva_cache *cache = make_cache(ctx, c, x);
    kva_plan_desc pd = idx_plan_desc(c, x);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (!cache || !plan) {
        kva_cache_destroy(cache);
        return;
    }
    const int64_t stride = c->K + 3;
    const size_t n = (size_t)x->T * stride + 1;
    int32_t *ind = malloc(n * sizeof *ind), *len = malloc(((size_t)x->T + 1) * sizeof *len);
    for (size_t i = 0; i < n; i++)
        ind[i] = SENTINEL;
    for (int32_t t = 0; t <= x->T; t++)
        len[t] = SENTINEL;
    CHECK_OK(kva_indexer_run(ctx, plan, x->q, x->w, cache, ind, stride, len));
    int pad = 0;
    for (int32_t t = 0; t < x->T; t++)
        for (int64_t k = c->K; k < stride; k++)
            pad += ind[t * stride + k] != SENTINEL;
    CHECK_MSG(pad == 0 && len[x->T] == SENTINEL, "%s: wrote past K", label);
    const int bad = idx_check(label, c, x, ind, stride, len, exact);
    CHECK_MSG(bad == 0, "%s: %d of %d rows differ", label, bad, (int)x->T);
    /* Without topk_length, the same rows. */
    int32_t *ind2 = malloc(n * sizeof *ind2);
    CHECK_OK(kva_indexer_run(ctx, plan, x->q, x->w, cache, ind2, stride, NULL));
    int same = 1;
    for (int32_t t = 0; t < x->T; t++)
        same &= memcmp(ind + t * stride, ind2 + t * stride, (size_t)c->K * sizeof *ind) == 0;
    CHECK_MSG(same, "%s: the run without topk_length differs", label);
    free(ind2);
    free(ind);
    free(len);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
}

/* The case on the reference (exact) and on the CPU at every ISA level. */
static void run_case(const idx_case *c)
{
    idx_data x;
    idx_build(c, &x);
    char label[96];
    snprintf(label, sizeof label, "ref Hi %d D %d K %d fp8 %d", (int)c->Hi, (int)c->D, (int)c->K,
             c->fp8);
    kva_context *ref = idx_ctx(KVA_BACKEND_REF, 1);
    run_on(ref, label, c, &x, 1);
    kva_context_destroy(ref);
    static const char *isas[] = {"portable", "avx2", "avx512"};
    for (int i = 0; i < 3; i++) {
        setenv("KVA_CPU_ISA", isas[i], 1);
        kva_context *cpu = idx_ctx(KVA_BACKEND_CPU, 2);
        snprintf(label, sizeof label, "cpu/%s Hi %d D %d K %d fp8 %d", isas[i], (int)c->Hi,
                 (int)c->D, (int)c->K, c->fp8);
        run_on(cpu, label, c, &x, 0);
        kva_context_destroy(cpu);
    }
    unsetenv("KVA_CPU_ISA");
    idx_free(&x);
}

/* Decodes, a speculative decode, a prefill with context and one without,
 * repeated keys (exact ties) and a NaN key, f32 cache. */
static void test_mixed_batch(void)
{
    idx_case c = idx_case_of(8, 64, 16, 32, KVA_DTYPE_F32, 0, 4, (const int32_t[]){1, 3, 40, 33},
                             (const int32_t[]){200, 77, 300, 33}, 11);
    c.ties = 1;
    c.nan_key = 1;
    run_case(&c);
}

/* DeepSeek's shape (64 heads of 128) over an FP8_TOKEN cache, bf16 q. */
static void test_fp8_deepseek_shape(void)
{
    idx_case c = idx_case_of(64, 128, 64, 64, KVA_DTYPE_BF16, 1, 2, (const int32_t[]){1, 12},
                             (const int32_t[]){700, 260}, 12);
    c.ties = 1;
    run_case(&c);
}

/* K above pos + 1 (-1 padding, topk_length < K), seq_len 1, and a NaN key
 * that is listed last because every key is listed. */
static void test_short_rows(void)
{
    idx_case c = idx_case_of(4, 32, 8, 100, KVA_DTYPE_F16, 0, 3, (const int32_t[]){5, 1, 2},
                             (const int32_t[]){20, 1, 9}, 13);
    c.nan_key = 1;
    run_case(&c);
    idx_case f = c;
    f.fp8 = 1;
    f.seed = 14;
    run_case(&f);
}

/* K = 1, an odd head count (the tile kernels' remainder heads), D not a
 * multiple of 16, a block size that is not a power of two. */
static void test_k1_odd_shapes(void)
{
    idx_case c = idx_case_of(3, 24, 5, 1, KVA_DTYPE_BF16, 0, 2, (const int32_t[]){1, 17},
                             (const int32_t[]){64, 17}, 15);
    c.ties = 1;
    run_case(&c);
    idx_case d = idx_case_of(7, 136, 3, 7, KVA_DTYPE_F32, 1, 1, (const int32_t[]){9},
                             (const int32_t[]){50}, 16);
    run_case(&d);
}

/* index_q_quant = FP8_TOKEN: q quantized per (token, head) row as the keys
 * are, on DeepSeek's shape over FP8 keys, over f32 keys with a NaN key,
 * and with a q row of zeros (scale FLT_MIN, every code 0); the reference
 * must equal the test's quantized fp64 logits exactly, the CPU within fp32
 * rounding. Prints how much of the unquantized top K the FP8-q top K keeps
 * on this random data. */
static void test_fp8_q(void)
{
    idx_case c = idx_case_of(64, 128, 64, 64, KVA_DTYPE_BF16, 1, 2, (const int32_t[]){1, 6},
                             (const int32_t[]){900, 300}, 17);
    c.qfp8 = 1;
    c.ties = 1;
    run_case(&c);
    idx_data x;
    idx_build(&c, &x);
    printf("  fp8 q: %.1f%% of the bf16-q top-%d kept (random data, %d tokens)\n",
           100.0 * idx_fp8q_overlap(&c, &x), (int)c.K, (int)x.T);
    idx_free(&x);
    idx_case f = idx_case_of(5, 40, 7, 9, KVA_DTYPE_F32, 0, 2, (const int32_t[]){4, 1},
                             (const int32_t[]){60, 31}, 18);
    f.qfp8 = 1;
    f.nan_key = 1;
    idx_build(&f, &x);
    /* Token 1's head 2: all zeros. */
    memset((float *)x.q + ((size_t)1 * f.Hi + 2) * f.D, 0, (size_t)f.D * sizeof(float));
    kva_context *ref = idx_ctx(KVA_BACKEND_REF, 1);
    run_on(ref, "ref fp8 q, f32 keys", &f, &x, 1);
    kva_context_destroy(ref);
    kva_context *cpu = idx_ctx(KVA_BACKEND_CPU, 2);
    run_on(cpu, "cpu fp8 q, f32 keys", &f, &x, 0);
    kva_context_destroy(cpu);
    idx_free(&x);
}

/* The FP8_TOKEN bytes of kva_cache_write against the test's quantizer, the
 * block size, read-back, copy and swap. */
static void test_fp8_token_bytes(void)
{
    kva_context *ctx = idx_ctx(KVA_BACKEND_CPU, 1);
    const int32_t D = 32, B = 4, NB = 3, T = 7;
    kva_cache_desc cd = {.num_blocks = NB,
                         .block_size = B,
                         .num_kv_heads = 1,
                         .head_dim = D,
                         .dtype = KVA_DTYPE_FP8_E4M3,
                         .quant = KVA_QUANT_FP8_TOKEN,
                         .kind = KVA_ATTN_INDEX};
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &c));
    if (!c) {
        kva_context_destroy(ctx);
        return;
    }
    CHECK(kva_cache_block_bytes_k(c) == (size_t)B * (D + 4));
    CHECK(kva_cache_block_bytes_v(c) == 0 && kva_cache_block_bytes_scales(c) == 0);
    void *kd = NULL;
    kva_cache_data(c, &kd, NULL);
    memset(kd, 0, (size_t)NB * kva_cache_block_bytes_k(c));
    kva_rng rng = {21};
    float src[7 * 32];
    kva_test_fill(src, KVA_DTYPE_F32, (size_t)T * D, &rng, 1.0);
    for (int32_t i = 0; i < D; i++) {
        src[1 * D + i] = 0.0f;     /* all zero: scale FLT_MIN */
        src[2 * D + i] *= 1000.0f; /* beyond 448 before scaling */
        src[3 * D + i] *= 1e-30f;  /* tiny values */
    }
    const int64_t slots[7] = {5, 0, 11, -1, 6, 2, 9};
    CHECK_OK(kva_cache_write(ctx, c, T, src, 0, NULL, 0, KVA_DTYPE_F32, slots));
    const unsigned char *bytes = kd;
    int bad = 0;
    for (int32_t t = 0; t < T; t++) {
        if (slots[t] < 0)
            continue;
        uint8_t want[32];
        const float s = idx_quant_row(src + t * D, D, want);
        const int64_t b = slots[t] / B, o = slots[t] % B;
        const unsigned char *blk = bytes + b * (int64_t)B * (D + 4);
        bad += memcmp(blk + o * D, want, (size_t)D) != 0;
        float got_s;
        memcpy(&got_s, blk + (int64_t)B * D + o * 4, 4);
        bad += memcmp(&got_s, &s, 4) != 0;
    }
    CHECK_MSG(bad == 0, "%d FP8_TOKEN rows or scales differ from the test's quantizer", bad);
    /* A bf16 source: quantized from its bf16 values. */
    uint16_t hb[32];
    float hf[32];
    for (int32_t i = 0; i < D; i++) {
        hb[i] = kva_f32_to_bf16(src[i] * 3.0f);
        hf[i] = kva_bf16_to_f32(hb[i]);
    }
    const int64_t s10 = 10;
    CHECK_OK(kva_cache_write(ctx, c, 1, hb, 0, NULL, 0, KVA_DTYPE_BF16, &s10));
    uint8_t want[32];
    const float sw = idx_quant_row(hf, D, want);
    const unsigned char *blk2 = bytes + 2 * (int64_t)B * (D + 4);
    float gs;
    memcpy(&gs, blk2 + (int64_t)B * D + 2 * 4, 4);
    CHECK(memcmp(blk2 + 2 * D, want, (size_t)D) == 0 && gs == sw);
    /* Read-back: code * scale. */
    float back[7 * 32];
    kva_test_poison(back, KVA_DTYPE_F32, (size_t)T * D);
    CHECK_OK(kva_cache_read(ctx, c, T, slots, back, 0, NULL, 0, KVA_DTYPE_F32));
    bad = 0;
    for (int32_t t = 0; t < T; t++) {
        uint8_t codes[32];
        const float s = idx_quant_row(src + t * D, D, codes);
        for (int32_t i = 0; i < D; i++) {
            /* A padding slot's row is left untouched: the poison's bits. */
            const float v = (float)(idx_e4m3_value(codes[i]) * (double)s);
            bad += slots[t] < 0 ? !kva_test_poisoned(back, KVA_DTYPE_F32, (size_t)(t * D + i))
                                : back[t * D + i] != v;
        }
    }
    CHECK_MSG(bad == 0, "kva_cache_read: %d values differ from code * scale", bad);
    /* Copy block 1 onto block 0 and swap everything into a second cache. */
    const int32_t pair[2] = {1, 0};
    CHECK_OK(kva_cache_copy_blocks(ctx, c, pair, 1));
    const size_t bb = kva_cache_block_bytes_k(c);
    CHECK(memcmp(bytes, bytes + bb, bb) == 0);
    kva_cache *c2 = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &c2));
    if (c2) {
        const int32_t pairs[6] = {0, 2, 1, 1, 2, 0};
        CHECK_OK(kva_cache_swap_blocks(ctx, c, c2, pairs, 3));
        void *k2 = NULL;
        kva_cache_data(c2, &k2, NULL);
        const unsigned char *b2 = k2;
        CHECK(memcmp(b2 + 2 * bb, bytes, bb) == 0 && memcmp(b2 + bb, bytes + bb, bb) == 0 &&
              memcmp(b2, bytes + 2 * bb, bb) == 0);
        kva_cache_destroy(c2);
    }
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* Descriptors the index-key cache and its plans refuse. */
static void test_bad_descriptors(void)
{
    kva_context *ctx = idx_ctx(KVA_BACKEND_CPU, 1);
    kva_cache_desc good = {.num_blocks = 2,
                           .block_size = 4,
                           .num_kv_heads = 1,
                           .head_dim = 32,
                           .dtype = KVA_DTYPE_F32,
                           .kind = KVA_ATTN_INDEX};
    kva_cache *c = NULL;
    kva_cache_desc d = good;
    d.num_kv_heads = 2;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_kv_heads");
    d = good;
    d.head_dim_v = 16;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("head_dim_v");
    d = good;
    d.quant = KVA_QUANT_FP8_TOKEN;
    d.dtype = KVA_DTYPE_BF16;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_DTYPE_MISMATCH);
    d = good;
    d.quant = KVA_QUANT_FP8_E4M3;
    d.dtype = KVA_DTYPE_FP8_E4M3;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_UNSUPPORTED);
    d = good;
    d.kind = KVA_ATTN_MHA;
    d.quant = KVA_QUANT_FP8_TOKEN;
    d.dtype = KVA_DTYPE_FP8_E4M3;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("fp8_token");
    d = good;
    d.head_dim = 12;
    CHECK_STATUS(kva_cache_create(ctx, &d, &c), KVA_STATUS_UNSUPPORTED);
    float kv[64] = {0};
    CHECK_STATUS(kva_cache_create_from(ctx, &good, kv, kv, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(c == NULL);

    int32_t qsl[2] = {0, 2}, sl[1] = {6}, bt[2] = {0, 1};
    kva_plan_desc p = {.num_requests = 1,
                       .num_heads = 4,
                       .num_kv_heads = 1,
                       .head_dim = 32,
                       .q_dtype = KVA_DTYPE_F32,
                       .causal = 1,
                       .window_left = -1,
                       .query_start_loc = qsl,
                       .seq_lens = sl,
                       .block_table = bt,
                       .block_table_stride = 2,
                       .block_size = 4,
                       .kind = KVA_ATTN_INDEX,
                       .sparse_topk = 4};
    kva_plan *plan = NULL;
    kva_plan_desc q = p;
    q.causal = 0;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("causal");
    q = p;
    q.sparse_topk = 0;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("sparse_topk");
    q.sparse_topk = KVA_MAX_TOPK + 1;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    q = p;
    q.num_kv_heads = 2;
    q.num_heads = 4;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    q = p;
    q.head_dim_v = 16;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    q = p;
    q.window_left = 3;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_UNSUPPORTED);
    q = p;
    q.sparse_mode = 1;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    q = p;
    q.dcp_size = 2;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_UNSUPPORTED);
    q = p;
    q.index_q_quant = KVA_QUANT_FP8_E4M3; /* only NONE or FP8_TOKEN */
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("index_q_quant");
    q.index_q_quant = -1;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    q = p; /* an attention plan with an indexer option */
    q.kind = KVA_ATTN_MHA;
    q.sparse_topk = 0;
    q.index_q_quant = KVA_QUANT_FP8_TOKEN;
    CHECK_STATUS(kva_plan_create(ctx, &q, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("index_q_quant");
    CHECK(plan == NULL);
    kva_context_destroy(ctx);
}

/* Bad run, write and read arguments: a status, and nothing written. */
static void test_bad_runs(void)
{
    idx_case cs = idx_case_of(4, 32, 4, 5, KVA_DTYPE_F32, 1, 1, (const int32_t[]){3},
                              (const int32_t[]){10}, 31);
    idx_data x;
    idx_build(&cs, &x);
    kva_context *ctx = idx_ctx(KVA_BACKEND_CPU, 1);
    kva_cache *cache = make_cache(ctx, &cs, &x);
    kva_plan_desc pd = idx_plan_desc(&cs, &x);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (!cache || !plan) {
        kva_cache_destroy(cache);
        kva_context_destroy(ctx);
        idx_free(&x);
        return;
    }
    int32_t ind[32], len[4];
    for (int i = 0; i < 32; i++)
        ind[i] = SENTINEL;
    for (int i = 0; i < 4; i++)
        len[i] = SENTINEL;
#define UNTOUCHED()                                                                                \
    do {                                                                                           \
        int u_ = 1;                                                                                \
        for (int i_ = 0; i_ < 32; i_++)                                                            \
            u_ &= ind[i_] == SENTINEL;                                                             \
        for (int i_ = 0; i_ < 4; i_++)                                                             \
            u_ &= len[i_] == SENTINEL;                                                             \
        CHECK_MSG(u_, "a failed run wrote its outputs");                                           \
    } while (0)
    CHECK_STATUS(kva_indexer_run(ctx, plan, NULL, x.w, cache, ind, 0, len),
                 KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_indexer_run(ctx, plan, x.q, NULL, cache, ind, 0, len),
                 KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_indexer_run(ctx, plan, x.q, x.w, cache, NULL, 0, len),
                 KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_indexer_run(ctx, plan, x.q, x.w, cache, ind, 4, len),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("indices_stride");
    UNTOUCHED();
    /* An MHA plan, and an indexer plan in kva_attention_run. */
    kva_plan_desc mp = pd;
    mp.kind = KVA_ATTN_MHA;
    mp.sparse_topk = 0;
    kva_plan *mha = NULL;
    CHECK_OK(kva_plan_create(ctx, &mp, &mha));
    CHECK_STATUS(kva_indexer_run(ctx, mha, x.q, x.w, cache, ind, 0, len),
                 KVA_STATUS_INVALID_ARGUMENT);
    float out[3 * 4 * 32];
    CHECK_STATUS(kva_attention_run(ctx, plan, x.q, cache, NULL, out, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("kva_indexer_run");
    /* A cache of another kind or shape. */
    kva_cache_desc md = idx_cache_desc(&cs, &x);
    md.kind = KVA_ATTN_MHA;
    md.quant = KVA_QUANT_NONE;
    md.dtype = KVA_DTYPE_F32;
    kva_cache *mc = NULL;
    CHECK_OK(kva_cache_create(ctx, &md, &mc));
    CHECK_STATUS(kva_indexer_run(ctx, plan, x.q, x.w, mc, ind, 0, len), KVA_STATUS_SHAPE_MISMATCH);
    UNTOUCHED();
    kva_cache_destroy(mc);
    kva_plan_destroy(mha);

    /* Writes and reads: v given, a slot past the cache. */
    void *kd = NULL;
    kva_cache_data(cache, &kd, NULL);
    const size_t cb = (size_t)x.nb * kva_cache_block_bytes_k(cache);
    unsigned char *snap = malloc(cb);
    memcpy(snap, kd, cb);
    float row[2 * 32];
    for (int i = 0; i < 64; i++)
        row[i] = 1.0f + (float)i;
    const int64_t sl[2] = {0, (int64_t)x.nb * cs.B};
    CHECK_STATUS(kva_cache_write(ctx, cache, 1, row, 0, row, 0, KVA_DTYPE_F32, sl),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("v");
    CHECK_STATUS(kva_cache_write(ctx, cache, 2, row, 0, NULL, 0, KVA_DTYPE_F32, sl),
                 KVA_STATUS_OUT_OF_RANGE);
    CHECK_MSG(memcmp(snap, kd, cb) == 0, "a failed write changed the cache");
    float back[64];
    for (int i = 0; i < 64; i++)
        back[i] = 7.0f;
    CHECK_STATUS(kva_cache_read(ctx, cache, 2, sl, back, 0, NULL, 0, KVA_DTYPE_F32),
                 KVA_STATUS_OUT_OF_RANGE);
    CHECK_STATUS(kva_cache_read(ctx, cache, 1, sl, back, 0, back, 0, KVA_DTYPE_F32),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_cache_read(ctx, cache, 1, sl, back, 8, NULL, 0, KVA_DTYPE_F32),
                 KVA_STATUS_INVALID_ARGUMENT);
    int same = 1;
    for (int i = 0; i < 64; i++)
        same &= back[i] == 7.0f;
    CHECK_MSG(same, "a failed read wrote its output");
    free(snap);
#undef UNTOUCHED
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    idx_free(&x);
}

int main(void)
{
    RUN(test_fp8_token_bytes);
    RUN(test_bad_descriptors);
    RUN(test_bad_runs);
    RUN(test_mixed_batch);
    RUN(test_fp8_deepseek_shape);
    RUN(test_short_rows);
    RUN(test_k1_odd_shapes);
    RUN(test_fp8_q);
    return kva_test_finish();
}
