/*
 * test_cross_attention.c - non-causal calls whose requests have more queries
 * than keys (encoder-decoder cross-attention), including requests with no
 * keys at all, on the reference and CPU backends, ragged and paged.
 *
 * Expected values come from a dense computation in this file (double, the
 * header's formulas written out directly). Rows of a request with seq_len 0
 * must be exactly 0 with lse -inf, or lse equal to the sink when sinks are
 * given. Outputs are poisoned with NaN before each run.
 */
#include "batchgen.h"

enum { H = 8, HKV = 2, D = 64, DV = 32 };

/* Dense non-causal attention of every request (optional ALiBi, sinks, window)
 * from packed q [T, H, D], k [S, HKV, D], v [S, HKV, DV] (f32) -> out, lse. */
static void dense(const kva_test_batch *b, const float *q, const float *k, const float *v,
                  double scale, int32_t window, const float *alibi, const float *sinks, double *out,
                  double *lse)
{
    int64_t kv0 = 0;
    for (int32_t r = 0; r < b->R; r++) {
        int32_t ql = b->q_lens[r], s = b->seq_lens[r];
        for (int32_t i = 0; i < ql; i++) {
            int64_t t = b->query_start_loc[r] + i;
            int32_t pos = s - ql + i;
            for (int32_t h = 0; h < H; h++) {
                int32_t g = h / (H / HKV);
                double sc[512], mx = sinks ? sinks[h] : -INFINITY;
                int vis[512];
                for (int32_t j = 0; j < s; j++) {
                    double dot = 0;
                    for (int c = 0; c < D; c++)
                        dot += (double)q[(t * H + h) * D + c] * k[((kv0 + j) * HKV + g) * D + c];
                    sc[j] = scale * dot + (alibi ? alibi[h] * (double)(j - pos) : 0.0);
                    vis[j] = window < 0 || pos - j <= window;
                    if (vis[j] && sc[j] > mx)
                        mx = sc[j];
                }
                double den = sinks && mx > -INFINITY ? exp(sinks[h] - mx) : 0.0, acc[DV] = {0};
                for (int32_t j = 0; j < s; j++) {
                    if (!vis[j])
                        continue;
                    double p = exp(sc[j] - mx);
                    den += p;
                    for (int c = 0; c < DV; c++)
                        acc[c] += p * v[((kv0 + j) * HKV + g) * DV + c];
                }
                for (int c = 0; c < DV; c++)
                    out[(t * H + h) * DV + c] = den > 0 ? acc[c] / den : 0.0;
                lse[t * H + h] = mx == -INFINITY ? -INFINITY : mx + log(den);
            }
        }
        kv0 += s;
    }
}

static void run_case(kva_rng *rng, int variant)
{
    /* q_len up to 40 over 0..30 keys: many requests have q_len > seq_len. */
    int32_t R = 5, ql[5], sl[5];
    for (int32_t r = 0; r < R; r++) {
        ql[r] = kva_rng_int(rng, 1, 40);
        sl[r] = r == 1 ? 0 : kva_rng_int(rng, 1, 30);
    }
    kva_test_batch b;
    kva_test_batch_init(&b, rng, R, ql, sl, 16, 2, 0);
    int64_t S = 0;
    for (int32_t r = 0; r < R; r++)
        S += sl[r];
    size_t nq = (size_t)b.T * H * D, nk = (size_t)S * HKV * D, nv = (size_t)S * HKV * DV;
    float *q = malloc(nq * 4), *k = malloc(nk * 4 + 4), *v = malloc(nv * 4 + 4);
    kva_test_fill(q, KVA_DTYPE_F32, nq, rng, 1.0);
    kva_test_fill(k, KVA_DTYPE_F32, nk, rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, nv, rng, 1.0);
    float alibi[H], sinks[H];
    for (int h = 0; h < H; h++) {
        alibi[h] = -0.1f * (float)(h + 1);
        sinks[h] = (float)kva_rng_normal(rng);
    }
    int use_alibi = variant & 1, use_sinks = (variant >> 1) & 1;
    int32_t window = (variant >> 2) & 1 ? 7 : -1;
    size_t no = (size_t)b.T * H * DV;
    double *want = malloc(no * 8), *want_lse = malloc((size_t)b.T * H * 8);
    dense(&b, q, k, v, 1.0 / sqrt((double)D), window, use_alibi ? alibi : NULL,
          use_sinks ? sinks : NULL, want, want_lse);
    float *wantf = malloc(no * 4), *want_lsef = malloc((size_t)b.T * H * 4);
    for (size_t i = 0; i < no; i++)
        wantf[i] = (float)want[i];
    for (size_t i = 0; i < (size_t)b.T * H; i++)
        want_lsef[i] = (float)want_lse[i];

    float *out = malloc(no * 4), *lse = malloc((size_t)b.T * H * 4);
    for (int be = 0; be < 4; be++) {
        kva_context_desc cd = {be == 0 ? KVA_BACKEND_REF : KVA_BACKEND_CPU, be, 0};
        kva_context *ctx = NULL;
        CHECK_OK(kva_context_create(&cd, &ctx));
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, HKV, D, DV, KVA_DTYPE_F32);
        pd.causal = 0;
        pd.window_left = window;
        pd.alibi_slopes = use_alibi ? alibi : NULL;
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        for (int paged = 0; paged < 2 && plan; paged++) {
            kva_test_poison(out, KVA_DTYPE_F32, no);
            kva_test_poison(lse, KVA_DTYPE_F32, (size_t)b.T * H);
            kva_cache *cache = NULL;
            if (!paged) {
                CHECK_OK(kva_attention_run_ragged(ctx, plan, q, k, v, use_sinks ? sinks : NULL, out,
                                                  lse));
            } else {
                /* Write the packed encoder K/V into the cache through its block table. */
                kva_cache_desc cdsc = {b.num_blocks,
                                       b.block_size,
                                       HKV,
                                       D,
                                       DV,
                                       KVA_DTYPE_F32,
                                       variant & 8 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD,
                                       KVA_QUANT_NONE,
                                       KVA_ATTN_MHA};
                CHECK_OK(kva_cache_create(ctx, &cdsc, &cache));
                int64_t *slots = malloc(sizeof(int64_t) * (size_t)(S > 0 ? S : 1));
                int64_t n = 0;
                for (int32_t r = 0; r < R; r++)
                    for (int32_t j = 0; j < sl[r]; j++)
                        slots[n++] = (int64_t)b.block_table[r * b.stride + j / 16] * 16 + j % 16;
                CHECK_OK(kva_cache_write(ctx, cache, (int32_t)S, k, 0, v, 0, KVA_DTYPE_F32, slots));
                free(slots);
                CHECK_OK(
                    kva_attention_run(ctx, plan, q, cache, use_sinks ? sinks : NULL, out, lse));
            }
            char label[96];
            snprintf(label, sizeof label, "variant %d backend %d %s", variant, be,
                     paged ? "paged" : "ragged");
            CHECK(kva_test_compare(label, out, wantf, KVA_DTYPE_F32, no, 1e-5, 1e-5) == 0);
            CHECK(kva_test_compare_f32(label, lse, want_lsef, (size_t)b.T * H, 1e-5, 1e-5) == 0);
            /* Request 1 has no keys: exact zeros and -inf (or the sink). */
            for (int32_t t = b.query_start_loc[1]; t < b.query_start_loc[2]; t++)
                for (int h = 0; h < H; h++) {
                    CHECK(lse[t * H + h] == (use_sinks ? sinks[h] : -INFINITY));
                    for (int c = 0; c < DV; c++)
                        CHECK(out[((size_t)t * H + h) * DV + c] == 0.0f);
                }
            kva_cache_destroy(cache);
        }
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
    }
    free(q), free(k), free(v), free(want), free(want_lse), free(wantf), free(want_lsef);
    free(out), free(lse);
    kva_test_batch_free(&b);
}

static void test_cross_attention(void)
{
    kva_rng rng = {77};
    for (int variant = 0; variant < 16; variant++)
        run_case(&rng, variant);
}

/* A causal plan still rejects q_len > seq_len. */
static void test_causal_rejects_more_queries(void)
{
    int32_t qsl[2] = {0, 5}, sl[1] = {3}, bt[1] = {0};
    kva_plan_desc pd = {1,  qsl,           sl, bt, 1,  16, 0,    H,           HKV, D,
                        DV, KVA_DTYPE_F32, 0,  1,  -1, 0,  NULL, KVA_ATTN_MHA};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(NULL, &ctx));
    kva_plan *plan = NULL;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("q_len = 5");
    CHECK(plan == NULL);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_cross_attention);
    RUN(test_causal_rejects_more_queries);
    return kva_test_finish();
}
