/*
 * test_head_dim.c - large head sizes and the attention-kind axis.
 *
 * Head sizes past 256 up to KVA_MAX_HEAD_DIM (576), on the CPU backend against
 * the reference, random data, outputs poisoned before each run:
 *   - MLA's absorbed decode math as plain MQA: Hkv = 1, D = 576 (Dc 512 +
 *     Dr 64), Dv = 512, the model's softmax scale 1/sqrt(192), decode
 *     (q_len 1), speculative decode (q_len 2-4) and a causal prefill mixed in,
 *     contexts past one key chunk, block sizes 1, 16 and 64;
 *   - GQA at D = Dv = 576 and at D = 264 (just past the old limit), D = 512
 *     with Dv = 128, HND and NHD, f32 / f16 / bf16;
 *   - quantized caches (FP8 E4M3 with unit scales, INT8_TOKEN_K_V16) at
 *     D = 576 / Dv = 512, written through kva_cache_write;
 *   - kva_merge_states at Dv = 512;
 * each under the dispatcher's choice and then under every kernel of the CPU
 * registry (kva__context_force_kernel), or, while the registry is empty,
 * every ISA level of KVA_CPU_ISA.
 * The limits and the kind axis reject bad values with a status and change
 * nothing: D or Dv past a backend's own limit (a backend table limited to
 * 256, as CUDA's is), an unknown kind, an MLA cache without its Dc, and a
 * cache whose kind differs from the plan's or from a swap partner's.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "batchgen.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct hd_case {
    const char *name;
    int32_t H, Hkv, D, Dv, block_size;
    kva_dtype dt;
    kva_layout layout;
    kva_quant quant;
    float scale; /* 0: 1/sqrt(D) */
    int32_t R;
    const int32_t *q_lens, *seq_lens;
    uint64_t seed;
} hd_case;

/* Storage dtype of a cache of format quant for q dtype dt. */
static kva_dtype cache_dtype(kva_quant quant, kva_dtype dt)
{
    if (quant == KVA_QUANT_FP8_E4M3)
        return KVA_DTYPE_FP8_E4M3;
    return quant == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_F16 : dt;
}

/* Writes random rows into every slot of c through kva_cache_write (which
 * quantizes for quantized formats). */
static void fill_cache(kva_context *ctx, kva_cache *c, kva_rng *rng)
{
    kva_cache_desc rd; /* head_dim_v resolved */
    CHECK_OK(kva_cache_get_desc(c, &rd));
    const kva_cache_desc *d = &rd;
    const int64_t n = (int64_t)d->num_blocks * d->block_size;
    const size_t kr = (size_t)d->num_kv_heads * d->head_dim;
    const size_t vr = (size_t)d->num_kv_heads * d->head_dim_v;
    float *k = malloc((size_t)n * kr * sizeof(float));
    float *v = malloc((size_t)n * vr * sizeof(float));
    int64_t *slots = malloc((size_t)n * sizeof(int64_t));
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * kr, rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * vr, rng);
    for (int64_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ctx, c, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    free(k);
    free(v);
    free(slots);
}

/* Runs one case on the reference and CPU backends and compares out and lse. */
static void run_case(const hd_case *c)
{
    kva_rng rng = {c->seed};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, c->R, c->q_lens, c->seq_lens, c->block_size, 2, 1);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_cache_desc desc = {.num_blocks = b.num_blocks,
                           .block_size = c->block_size,
                           .num_kv_heads = c->Hkv,
                           .head_dim = c->D,
                           .head_dim_v = c->Dv,
                           .dtype = cache_dtype(c->quant, c->dt),
                           .layout = c->layout,
                           .quant = c->quant};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ref, &desc, &cache));
    if (cache)
        fill_cache(ref, cache, &rng);

    kva_plan_desc pd = kva_test_batch_plan_desc(&b, c->H, c->Hkv, c->D, c->Dv, c->dt);
    pd.scale = c->scale;
    const size_t nq = (size_t)b.T * c->H * c->D, no = (size_t)b.T * c->H * c->Dv;
    const size_t nl = (size_t)b.T * c->H, es = kva_dtype_size(c->dt);
    void *q = malloc(nq * es), *out_ref = malloc(no * es), *out_cpu = malloc(no * es);
    float *lse_ref = malloc(nl * sizeof(float)), *lse_cpu = malloc(nl * sizeof(float));
    kva_test_fill_uniform(q, c->dt, nq, &rng);
    kva_plan *pref = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    kva_test_poison(out_ref, c->dt, no);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_attention_run(ref, pref, q, cache, NULL, out_ref, lse_ref));

    /* The dispatcher's choice, then each registry kernel forced (or, with no
     * registry yet, each ISA level the plans read from KVA_CPU_ISA). */
    static const char *const isas[] = {"portable", "avx2", "avx512", "avx512bf16"};
    int32_t nk = 0;
    const kva__kernel_info *ks = kva__context_kernels(cpu, &nk);
    const int rounds = 1 + (nk > 0 ? nk : 4);
    for (int r = 0; r < rounds; r++) {
        const char *what = "dispatcher";
        CHECK_OK(kva__context_force_kernel(cpu, NULL));
        unsetenv("KVA_CPU_ISA");
        if (r > 0 && nk > 0) {
            what = ks[r - 1].name;
            if (kva__context_force_kernel(cpu, what) != KVA_STATUS_OK)
                continue; /* not on this machine */
        } else if (r > 0) {
            what = isas[r - 1];
            setenv("KVA_CPU_ISA", what, 1);
        }
        kva_plan *pcpu = NULL;
        CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
        kva_test_poison(out_cpu, c->dt, no);
        kva_test_poison(lse_cpu, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(cpu, pcpu, q, cache, NULL, out_cpu, lse_cpu));
        size_t bad = kva_test_compare("out", out_cpu, out_ref, c->dt, no, kva_test_atol(c->dt),
                                      kva_test_rtol(c->dt));
        bad += kva_test_compare_f32("lse", lse_cpu, lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "%s (%s): %zu mismatches\n", c->name, what, bad);
        kva_plan_destroy(pcpu);
    }
    unsetenv("KVA_CPU_ISA");
    CHECK_OK(kva__context_force_kernel(cpu, NULL));
    free(q), free(out_ref), free(out_cpu), free(lse_ref), free(lse_cpu);
    kva_plan_destroy(pref);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

static void test_large_head_sizes(void)
{
    /* Decodes over contexts past one key chunk, speculative decodes, and one
     * causal prefill chunk after cached context. */
    static const int32_t dq[] = {1, 1, 1, 3, 1}, ds[] = {300, 1, 77, 140, 520};
    static const int32_t pq[] = {1, 24, 2}, ps[] = {90, 64, 33};
    const float mla_scale = (float)(1.0 / sqrt(192.0)); /* DeepSeek: 1/sqrt(Dn + Dr) */
    const hd_case cases[] = {
        {"MLA absorbed decode bf16 B64", 16, 1, 576, 512, 64, KVA_DTYPE_BF16, KVA_LAYOUT_NHD,
         KVA_QUANT_NONE, mla_scale, 5, dq, ds, 1},
        {"MLA absorbed decode f32 B1", 8, 1, 576, 512, 1, KVA_DTYPE_F32, KVA_LAYOUT_NHD,
         KVA_QUANT_NONE, mla_scale, 5, dq, ds, 2},
        {"MLA absorbed mixed f16 B16", 16, 1, 576, 512, 16, KVA_DTYPE_F16, KVA_LAYOUT_HND,
         KVA_QUANT_NONE, mla_scale, 3, pq, ps, 3},
        {"GQA D576 f32 HND", 4, 2, 576, 576, 16, KVA_DTYPE_F32, KVA_LAYOUT_HND, KVA_QUANT_NONE, 0,
         3, pq, ps, 4},
        {"GQA D264 bf16", 6, 2, 264, 264, 16, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE, 0, 5,
         dq, ds, 5},
        {"GQA D512/Dv128 f16", 4, 1, 512, 128, 16, KVA_DTYPE_F16, KVA_LAYOUT_NHD, KVA_QUANT_NONE, 0,
         3, pq, ps, 6},
        {"MLA decode fp8 cache", 16, 1, 576, 512, 64, KVA_DTYPE_BF16, KVA_LAYOUT_NHD,
         KVA_QUANT_FP8_E4M3, mla_scale, 5, dq, ds, 7},
        {"MLA decode int8-k v16 cache", 8, 1, 576, 512, 16, KVA_DTYPE_F16, KVA_LAYOUT_NHD,
         KVA_QUANT_INT8_TOKEN_K_V16, mla_scale, 3, pq, ps, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

/* kva_merge_states at Dv = 512: CPU against the reference. */
static void test_merge_512(void)
{
    const int32_t T = 5, H = 16, Dv = 512;
    const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H;
    kva_rng rng = {77};
    float *a = malloc(n * 4), *bb = malloc(n * 4), *o_ref = malloc(n * 4), *o_cpu = malloc(n * 4);
    float *la = malloc(nl * 4), *lb = malloc(nl * 4), *l_ref = malloc(nl * 4),
          *l_cpu = malloc(nl * 4);
    kva_test_fill_uniform(a, KVA_DTYPE_F32, n, &rng);
    kva_test_fill_uniform(bb, KVA_DTYPE_F32, n, &rng);
    kva_test_fill(la, KVA_DTYPE_F32, nl, &rng, 3.0);
    kva_test_fill(lb, KVA_DTYPE_F32, nl, &rng, 3.0);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_test_poison(o_ref, KVA_DTYPE_F32, n);
    kva_test_poison(o_cpu, KVA_DTYPE_F32, n);
    kva_test_poison(l_ref, KVA_DTYPE_F32, nl);
    kva_test_poison(l_cpu, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_merge_states(ref, T, H, Dv, KVA_DTYPE_F32, a, la, bb, lb, o_ref, l_ref));
    CHECK_OK(kva_merge_states(cpu, T, H, Dv, KVA_DTYPE_F32, a, la, bb, lb, o_cpu, l_cpu));
    size_t bad = kva_test_compare("merge out", o_cpu, o_ref, KVA_DTYPE_F32, n,
                                  kva_test_atol(KVA_DTYPE_F32), kva_test_rtol(KVA_DTYPE_F32));
    bad += kva_test_compare_f32("merge lse", l_cpu, l_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                kva_test_rtol(KVA_DTYPE_F32));
    CHECK_MSG(bad == 0, "%zu mismatches", bad);
    free(a), free(bb), free(o_ref), free(o_cpu), free(la), free(lb), free(l_ref), free(l_cpu);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
}

#define SENTINEL ((void *)(uintptr_t)0x1234)

/* Expects expr to fail with status and a message containing substr. */
#define EXPECT_FAIL(expr, status, substr)                                                          \
    do {                                                                                           \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_ERROR_MENTIONS(substr);                                                              \
    } while (0)

/* A plan of one f32 decode: 2 query heads of D, one kv head, block size bs,
 * a block table row of 2 blocks. */
static kva_plan_desc one_decode(const int32_t *qsl, const int32_t *sl, const int32_t *bt,
                                int32_t bs, int32_t D)
{
    kva_plan_desc pd = {.num_requests = 1,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_table = bt,
                        .block_table_stride = 2,
                        .block_size = bs,
                        .num_heads = 2,
                        .num_kv_heads = 1,
                        .head_dim = D,
                        .q_dtype = KVA_DTYPE_F32,
                        .window_left = -1};
    return pd;
}

/* A backend whose kernels stop at D = 256 (as CUDA's do): larger caches,
 * plans and merges get UNSUPPORTED naming the backend, and nothing is made. */
static void test_backend_limit(void)
{
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    kva__backend_ops limited = *ctx->ops;
    limited.max_head_dim = 256;
    ctx->ops = &limited;

    kva_cache_desc d = {.num_blocks = 4,
                        .block_size = 16,
                        .num_kv_heads = 1,
                        .head_dim = 576,
                        .head_dim_v = 256,
                        .dtype = KVA_DTYPE_F32};
    kva_cache *c = SENTINEL;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_UNSUPPORTED, "head_dim = 576");
    CHECK(c == SENTINEL);
    CHECK_ERROR_MENTIONS("cpu backend");
    d.head_dim = 256;
    d.head_dim_v = 512;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_UNSUPPORTED, "head_dim_v = 512");
    CHECK(c == SENTINEL);
    float buf[16];
    EXPECT_FAIL(kva_cache_create_from(ctx, &d, buf, buf + 8, &c), KVA_STATUS_UNSUPPORTED,
                "head_dim_v = 512");
    CHECK(c == SENTINEL);
    d.head_dim_v = 256;
    c = NULL;
    CHECK_OK(kva_cache_create(ctx, &d, &c)); /* the limit itself is fine */
    kva_cache_destroy(c);

    int32_t qsl[2] = {0, 1}, sl[1] = {5}, bt[2] = {0, 1};
    kva_plan_desc pd = one_decode(qsl, sl, bt, 16, 264);
    kva_plan *p = SENTINEL;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "head_dim = 264");
    CHECK(p == SENTINEL);
    pd.head_dim = 256;
    pd.head_dim_v = 512;
    EXPECT_FAIL(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED, "head_dim_v = 512");
    CHECK(p == SENTINEL);

    float a[8 * 4], la[4], out[8 * 4], lo[4];
    for (int i = 0; i < 32; i++)
        a[i] = 1.0f, out[i] = -7.0f;
    for (int i = 0; i < 4; i++)
        la[i] = 0.5f, lo[i] = -7.0f;
    /* T * H * Dv elements would be read: Dv is checked before any is touched. */
    EXPECT_FAIL(kva_merge_states(ctx, 1, 1, 512, KVA_DTYPE_F32, a, la, a, la, out, lo),
                KVA_STATUS_UNSUPPORTED, "head_dim_v = 512");
    CHECK(out[0] == -7.0f && lo[0] == -7.0f);
    ctx->ops = kva__backend(KVA_BACKEND_CPU);
    kva_context_destroy(ctx);
}

/* The kind axis: unknown kinds are invalid, MLA is planned (UNSUPPORTED), a
 * zero field is MHA; a cache and a plan (or two swapped caches) of different
 * kinds are rejected before anything is read or written. */
static void test_attn_kind(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(NULL, &ctx));
    kva_cache_desc d = {.num_blocks = 4,
                        .block_size = 4,
                        .num_kv_heads = 1,
                        .head_dim = 16,
                        .dtype = KVA_DTYPE_F32};
    kva_cache *c = SENTINEL;
    d.kind = KVA_ATTN_KIND_COUNT_;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "kind = 3");
    d.kind = (kva_attn_kind)-3;
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "kind = -3");
    d.kind = KVA_ATTN_MLA;
    /* An MLA cache needs head_dim_v = Dc below head_dim (tests/test_mla.c has the rest). */
    EXPECT_FAIL(kva_cache_create(ctx, &d, &c), KVA_STATUS_INVALID_ARGUMENT, "MLA cache");
    EXPECT_FAIL(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_INVALID_ARGUMENT,
                "MLA cache");
    CHECK(c == SENTINEL);
    d.kind = KVA_ATTN_MHA;
    kva_cache *a = NULL, *b = NULL;
    CHECK_OK(kva_cache_create(ctx, &d, &a));
    CHECK_OK(kva_cache_create(ctx, &d, &b));
    kva_cache_desc got;
    CHECK_OK(kva_cache_get_desc(a, &got));
    CHECK(got.kind == KVA_ATTN_MHA);
    kva_rng rng = {5};
    fill_cache(ctx, a, &rng);
    fill_cache(ctx, b, &rng);

    /* A plan of another kind than its cache (the cache's kind forced). */
    int32_t qsl[2] = {0, 1}, sl[1] = {6}, bt[2] = {1, 3};
    kva_plan_desc pd = one_decode(qsl, sl, bt, 4, 16);
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    float q[2 * 16], out[2 * 16], lse[2];
    kva_test_fill_uniform(q, KVA_DTYPE_F32, 32, &rng);
    for (int i = 0; i < 32; i++)
        out[i] = -9.0f;
    lse[0] = lse[1] = -9.0f;
    a->desc.kind = KVA_ATTN_MLA;
    EXPECT_FAIL(kva_attention_run(ctx, p, q, a, NULL, out, lse), KVA_STATUS_SHAPE_MISMATCH, "kind");
    for (int i = 0; i < 32; i++)
        CHECK(out[i] == -9.0f);
    CHECK(lse[0] == -9.0f && lse[1] == -9.0f);

    /* swap_blocks between caches of different kinds: nothing moves. */
    void *bk = NULL;
    CHECK_OK(kva_cache_data(b, &bk, NULL));
    float before[4 * 16];
    memcpy(before, bk, sizeof before);
    int32_t pair[2] = {0, 0};
    EXPECT_FAIL(kva_cache_swap_blocks(ctx, a, b, pair, 1), KVA_STATUS_SHAPE_MISMATCH, "kind");
    CHECK(memcmp(before, bk, sizeof before) == 0);
    a->desc.kind = KVA_ATTN_MHA;
    CHECK_OK(kva_attention_run(ctx, p, q, a, NULL, out, lse)); /* the same call now runs */
    for (int i = 0; i < 32; i++)
        CHECK(!isnan(out[i]) && out[i] != -9.0f);

    kva_plan_destroy(p);
    kva_cache_destroy(a);
    kva_cache_destroy(b);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_large_head_sizes);
    RUN(test_merge_512);
    RUN(test_backend_limit);
    RUN(test_attn_kind);
    return kva_test_finish();
}
