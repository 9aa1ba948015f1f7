/*
 * test_dcp_mla.c - decode context parallelism over an MLA latent cache on
 * the reference and CPU backends. As vLLM shards MLA: every rank holds the
 * latent rows [c_kv | k_pe] of its tokens and runs the absorbed attention
 * (queries of all heads, [T, H, Dc + Dr]) over them; the N partials
 * (out [T, H, Dc], lse) combine as MHA partials with Dv = Dc
 * (kva_merge_states_n), before the caller applies W_UV. For N in {2, 3, 4}
 * and I in {1, B}, bf16 and fp8 latent caches, a causal mixed batch (decodes,
 * a spec decode, prefill chunks, requests shorter than N * I) and a
 * non-causal one, with and without per-head sinks (given to every rank's
 * run: kvattn.h adds them on rank 0 only, so they count once), the combine
 * must equal the unsharded absorbed run. A layer-level (kva_mla_run)
 * sharded plan is refused at plan time.
 */
#include "mla_util.h"

/* A cache holding rank `rank`'s tokens of the case, each latent row copied
 * from the unsharded cache full (slot map through kva_dcp_slots), and its
 * block table (R x *stride). */
static kva_cache *shard_cache(kva_context *ctx, const mla_case *c, const mla_data *full, int32_t N,
                              int32_t rank, int32_t I, int32_t **bt, int32_t *stride)
{
    int32_t local[MLA_MAX_REQ], nb = 1;
    *stride = 1;
    CHECK_OK(kva_dcp_local_lens(c->R, c->seq_len, N, rank, I, local));
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t need = (local[r] + c->B - 1) / c->B;
        *stride = need > *stride ? need : *stride;
        nb += need;
    }
    *bt = malloc(sizeof(int32_t) * c->R * *stride);
    int32_t next = 0;
    for (int32_t r = 0; r < c->R; r++) /* blocks 1 .. nb-1 in a scrambled order */
        for (int32_t j = 0; j < *stride; j++)
            (*bt)[r * *stride + j] = j < (local[r] + c->B - 1) / c->B
                                         ? 1 + (int32_t)(((int64_t)next++ * 7919) % (nb - 1))
                                         : -1;
    kva_cache_desc cd = mla_cache_desc(c, nb);
    const float fp8_scale = 0.02f; /* mla_data_make's */
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    kva_cache *sc = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, c->fp8 ? &qp : NULL, &sc));
    const size_t row = kva_cache_block_bytes_k(sc) / (size_t)c->B; /* one token's latent row */
    void *src = NULL, *dst = NULL;
    CHECK_OK(kva_cache_data(full->cache, &src, NULL));
    CHECK_OK(kva_cache_data(sc, &dst, NULL));
    for (int32_t r = 0; r < c->R; r++) {
        int64_t *slots = malloc(sizeof(int64_t) * (c->seq_len[r] + 1));
        CHECK_OK(
            kva_dcp_slots(N, rank, I, c->B, *bt + r * *stride, *stride, 0, c->seq_len[r], slots));
        for (int32_t g = 0; g < c->seq_len[r]; g++) {
            if (slots[g] < 0)
                continue;
            const int64_t from =
                (int64_t)full->bt[(size_t)r * full->stride + g / c->B] * c->B + g % c->B;
            memcpy((char *)dst + slots[g] * row, (const char *)src + from * row, row);
        }
        free(slots);
    }
    return sc;
}

/* Elements of got [n] that differ from want beyond the dtype's tolerance
 * plus its relative rounding of the largest partial (parts [N][n]). */
static size_t compare(const char *label, kva_dtype dt, const void *got, const void *want,
                      const void *parts, int32_t N, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double big = 0.0;
        for (int32_t p = 0; p < N; p++) {
            const double x = fabs(kva_test_get(parts, dt, (size_t)p * n + i));
            big = x > big ? x : big;
        }
        const double a = kva_test_get(got, dt, i), w = kva_test_get(want, dt, i);
        if (!(fabs(a - w) <= kva_test_atol(dt) + kva_test_rtol(dt) * (fabs(w) + big)) && bad++ < 3)
            fprintf(stderr, "  %s: element %zu: got %.8g, want %.8g\n", label, i, a, w);
    }
    return bad;
}

static void run_case(kva_backend be, const mla_case *c, int use_sinks)
{
    kva_context_desc cdesc = {be, 2, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cdesc, &ctx));
    mla_data m;
    CHECK(mla_data_make(ctx, c, &m));
    const size_t on = (size_t)m.T * c->H * c->Dc, es = mla_es(c->dt);
    void *want = malloc(on * es), *got = malloc(on * es), *parts = malloc(on * es * 4);
    float *want_lse = malloc(sizeof(float) * m.T * c->H),
          *lses = malloc(sizeof(float) * m.T * c->H * 4);
    /* Absorbed queries [T, H, Dc + Dr] (random: the test is of the attention). */
    kva_rng rng = {c->seed + 7};
    void *q = malloc((size_t)m.T * c->H * (c->Dc + c->Dr) * es);
    kva_test_fill_uniform(q, c->dt, (size_t)m.T * c->H * (c->Dc + c->Dr), &rng);
    /* Sink logits of the order of the rows' own (unit scores). */
    float *sinks = NULL;
    if (use_sinks) {
        sinks = malloc(sizeof(float) * c->H);
        for (int32_t h = 0; h < c->H; h++)
            sinks[h] = (float)(1.5 * kva_rng_unit(&rng) - 0.25);
    }
    kva_plan_desc pd = mla_plan_desc(c, &m, 0);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    kva_test_poison(want, c->dt, on);
    CHECK_OK(kva_attention_run(ctx, plan, q, m.cache, sinks, want, want_lse));
    kva_plan_destroy(plan);
    for (int32_t N = 2; N <= 4; N++)
        for (int32_t I = 1; I <= c->B; I += c->B - 1) {
            for (int32_t rank = 0; rank < N; rank++) {
                int32_t *bt = NULL, stride = 0;
                kva_cache *sc = shard_cache(ctx, c, &m, N, rank, I, &bt, &stride);
                kva_plan_desc sd = pd;
                sd.block_table = bt;
                sd.block_table_stride = stride;
                sd.dcp_size = N;
                sd.dcp_rank = rank;
                sd.dcp_interleave = I;
                CHECK_OK(kva_plan_create(ctx, &sd, &plan));
                void *part = (char *)parts + (size_t)rank * on * es;
                kva_test_poison(part, c->dt, on);
                CHECK_OK(kva_attention_run(ctx, plan, q, sc, sinks, part,
                                           lses + (size_t)rank * m.T * c->H));
                kva_plan_destroy(plan);
                kva_cache_destroy(sc);
                free(bt);
            }
            kva_test_poison(got, c->dt, on);
            CHECK_OK(
                kva_merge_states_n(ctx, N, m.T, c->H, c->Dc, c->dt, parts, 0, lses, 0, got, NULL));
            char label[128];
            snprintf(label, sizeof label, "%s %s%s %s%s N=%d I=%d", kva_backend_name(be),
                     kva_dtype_name(c->dt), c->fp8 ? " fp8 cache" : "",
                     c->causal ? "causal" : "non-causal", use_sinks ? " sinks" : "", (int)N,
                     (int)I);
            const size_t bad = compare(label, c->dt, got, want, parts, N, on);
            CHECK_MSG(bad == 0, "%s: %zu elements differ", label, bad);
        }
    free(q), free(want), free(got), free(parts), free(want_lse), free(lses), free(sinks);
    mla_data_free(&m);
    kva_context_destroy(ctx);
}

static void test_sharded_absorbed(void)
{
    const int32_t ql[6] = {1, 3, 9, 1, 1, 17};
    const int32_t sl[6] = {37, 20, 41, 300, 2, 17};
    for (int be = 0; be < 2; be++)
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int causal = 1; causal >= 0; causal--) {
                mla_case c = mla_case_of(8, 64, 16, 32, 24, 16, KVA_DTYPE_BF16, causal, 3, 6, ql,
                                         sl, 41 + (uint64_t)fp8);
                c.fp8 = fp8;
                for (int sinks = 0; sinks < 2; sinks++)
                    run_case(be ? KVA_BACKEND_CPU : KVA_BACKEND_REF, &c, sinks);
            }
}

/* kva_mla_run applies W_UV inside, after the softmax: a rank's partial
 * cannot be combined there, so a layer-level sharded plan is refused. */
static void test_layer_plan_refused(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(NULL, &ctx));
    const int32_t ql[1] = {1}, sl[1] = {40};
    mla_case c = mla_case_of(8, 64, 16, 32, 24, 16, KVA_DTYPE_BF16, 1, 3, 1, ql, sl, 5);
    mla_data m;
    CHECK(mla_data_make(ctx, &c, &m));
    kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
    pd.dcp_size = 2;
    kva_plan *plan = NULL;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("kva_attention_run");
    mla_data_free(&m);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_sharded_absorbed);
    RUN(test_layer_plan_refused);
    return kva_test_finish();
}
