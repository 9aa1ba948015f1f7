/*
 * test_ref.c - the reference backend against an independent dense computation.
 *
 * The reference kernels are the truth for every other backend, so they are
 * checked here against code that shares nothing with them: this file gathers
 * each request's K and V out of the paged cache with its own stride math for
 * NHD and HND (not kva__cache_row), materializes the score matrix and the mask
 * of each (request, head), and does the softmax in double. Plus a tiny case
 * whose expected numbers were worked out on paper, split-and-merge identities
 * and kva_merge_states against a direct computation.
 *
 * Every output is poisoned with NaN before each run, so an element the kernel
 * fails to write fails the comparison.
 */
#include "batchgen.h"
#include "internal.h"

#include <math.h>

static const kva_context_desc REF = {KVA_BACKEND_REF, 0, 0};

/* ------------------------------------------------------------------------ */
/* The independent dense implementation                                      */
/* ------------------------------------------------------------------------ */

/* Mask and score options of one case, mirroring kva_plan_desc. */
typedef struct dense_opts {
    int causal;
    int32_t window_left; /* -1: none */
    double softcap;      /* 0: none */
    double scale;        /* already resolved (never 0) */
    const float *alibi;  /* [H] or NULL */
    const float *sinks;  /* [H] or NULL */
} dense_opts;

/*
 * Attention of one request, densely: Q [q_len, H, D], K [s, Hkv, D],
 * V [s, Hkv, Dv] (double) -> O [q_len, H, Dv], L [q_len, H] (double).
 * The score matrix S [q_len, s] and its mask are built in full per head.
 */
static void dense_attention(int32_t q_len, int32_t s, int32_t H, int32_t Hkv, int32_t D, int32_t Dv,
                            const double *Q, const double *K, const double *V, const dense_opts *o,
                            double *O, double *L)
{
    double *S = malloc(sizeof(double) * (size_t)(q_len > 0 ? q_len : 1) * (size_t)(s > 0 ? s : 1));
    unsigned char *M = malloc((size_t)(q_len > 0 ? q_len : 1) * (size_t)(s > 0 ? s : 1));
    const int32_t context = s - q_len; /* query i sits at key position context + i */
    for (int32_t h = 0; h < H; h++) {
        const int32_t g = (int32_t)((int64_t)h * Hkv / H);
        for (int32_t i = 0; i < q_len; i++) {
            for (int32_t j = 0; j < s; j++) {
                double dot = 0.0;
                for (int32_t c = 0; c < D; c++)
                    dot += Q[((size_t)i * H + h) * D + c] * K[((size_t)j * Hkv + g) * D + c];
                double x = o->scale * dot;
                if (o->softcap > 0.0)
                    x = o->softcap * tanh(x / o->softcap);
                if (o->alibi)
                    x -= (double)o->alibi[h] * (double)(context + i - j);
                S[(size_t)i * s + j] = x;
                int vis = 1;
                if (o->causal && j - context > i)
                    vis = 0;
                if (o->window_left >= 0 && context + i - j > o->window_left)
                    vis = 0;
                M[(size_t)i * s + j] = (unsigned char)vis;
            }
        }
        for (int32_t i = 0; i < q_len; i++) {
            double mx = o->sinks ? (double)o->sinks[h] : -INFINITY;
            for (int32_t j = 0; j < s; j++)
                if (M[(size_t)i * s + j] && S[(size_t)i * s + j] > mx)
                    mx = S[(size_t)i * s + j];
            double *orow = O + ((size_t)i * H + h) * Dv;
            for (int32_t c = 0; c < Dv; c++)
                orow[c] = 0.0;
            if (mx == -INFINITY) { /* no key and no sink */
                L[(size_t)i * H + h] = -INFINITY;
                continue;
            }
            double sum = o->sinks ? exp((double)o->sinks[h] - mx) : 0.0;
            for (int32_t j = 0; j < s; j++) {
                if (!M[(size_t)i * s + j])
                    continue;
                double p = exp(S[(size_t)i * s + j] - mx);
                sum += p;
                for (int32_t c = 0; c < Dv; c++)
                    orow[c] += p * V[((size_t)j * Hkv + g) * Dv + c];
            }
            for (int32_t c = 0; c < Dv; c++)
                orow[c] /= sum;
            L[(size_t)i * H + h] = mx + log(sum);
        }
    }
    free(S);
    free(M);
}

/* Element strides of one K or V array of the paged cache (width = D or Dv). */
typedef struct cache_strides {
    int64_t block, token, head;
} cache_strides;

static cache_strides strides_for(kva_layout layout, int32_t B, int32_t Hkv, int32_t width)
{
    cache_strides st;
    if (layout == KVA_LAYOUT_NHD) { /* [NB, B, Hkv, width] */
        st.head = width;
        st.token = (int64_t)Hkv * width;
        st.block = (int64_t)B * st.token;
    } else { /* [NB, Hkv, B, width] */
        st.token = width;
        st.head = (int64_t)B * width;
        st.block = (int64_t)Hkv * st.head;
    }
    return st;
}

/* Gathers keys [0, s) of request r from the cache into K [s, Hkv, D] and
 * V [s, Hkv, Dv] (double), following the block table. */
static void gather_paged(const kva_test_batch *b, int32_t r, const void *kc, const void *vc,
                         kva_dtype dt, kva_layout layout, int32_t Hkv, int32_t D, int32_t Dv,
                         double *K, double *V)
{
    const int32_t B = b->block_size;
    const cache_strides sk = strides_for(layout, B, Hkv, D);
    const cache_strides sv = strides_for(layout, B, Hkv, Dv);
    for (int32_t j = 0; j < b->seq_lens[r]; j++) {
        const int64_t blk = b->block_table[(size_t)r * b->stride + (size_t)(j / B)];
        const int64_t off = j % B;
        for (int32_t g = 0; g < Hkv; g++) {
            const int64_t kb = blk * sk.block + off * sk.token + g * sk.head;
            const int64_t vb = blk * sv.block + off * sv.token + g * sv.head;
            for (int32_t c = 0; c < D; c++)
                K[((size_t)j * Hkv + g) * D + c] = kva_test_get(kc, dt, (size_t)(kb + c));
            for (int32_t c = 0; c < Dv; c++)
                V[((size_t)j * Hkv + g) * Dv + c] = kva_test_get(vc, dt, (size_t)(vb + c));
        }
    }
}

/* Reads n elements of a float-typed buffer into doubles. */
static void to_double(const void *p, kva_dtype dt, size_t first, size_t n, double *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kva_test_get(p, dt, first + i);
}

/* Number of NaNs among n elements (an unwritten, poisoned element). */
static size_t count_nan(const void *p, kva_dtype dt, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += isnan(kva_test_get(p, dt, i)) != 0;
    return bad;
}

/*
 * Compares out [n] in dtype dt and lse [m] against the double truth. The
 * output was rounded to dt once, so dt's tolerance applies; the lse is f32
 * computed from the same inputs, so f32's tolerance applies.
 */
static size_t compare_truth(const char *label, const void *out, kva_dtype dt, const double *want,
                            size_t n, const float *lse, const double *want_lse, size_t m)
{
    float *got = malloc(sizeof(float) * (n ? n : 1));
    float *w = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        got[i] = (float)kva_test_get(out, dt, i);
        w[i] = (float)want[i];
    }
    size_t bad =
        kva_test_compare(label, got, w, KVA_DTYPE_F32, n, kva_test_atol(dt), kva_test_rtol(dt));
    if (lse) {
        float *wl = malloc(sizeof(float) * (m ? m : 1));
        for (size_t i = 0; i < m; i++)
            wl[i] = (float)want_lse[i];
        bad += kva_test_compare_f32(label, lse, wl, m, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        free(wl);
    }
    free(got);
    free(w);
    return bad;
}

/* ------------------------------------------------------------------------ */
/* Hand-computed case                                                        */
/* ------------------------------------------------------------------------ */

/* Runs the hand case's plan (2 rows, D = 8, f32) and checks every output
 * element and lse against the expected value of its row. */
static void hand_check(kva_context *ctx, const kva_plan *plan, const kva_cache *cache,
                       const float *q, const float *sinks, const double *want_out,
                       const double *want_lse, float *out, float *lse, double tol)
{
    enum { D = 8 };
    kva_test_poison(out, KVA_DTYPE_F32, 2 * D);
    kva_test_poison(lse, KVA_DTYPE_F32, 2);
    CHECK_OK(kva_attention_run(ctx, plan, q, cache, sinks, out, lse));
    for (int i = 0; i < 2; i++) {
        for (int c = 0; c < D; c++)
            CHECK_MSG(fabs(out[i * D + c] - want_out[i]) <= tol, "sink %d row %d: %.9g vs %.9g",
                      sinks != NULL, i, out[i * D + c], want_out[i]);
        CHECK_MSG(fabs(lse[i] - want_lse[i]) <= tol * (1.0 + fabs(want_lse[i])),
                  "sink %d lse %d: %.9g vs %.9g", sinks != NULL, i, lse[i], want_lse[i]);
    }
}

/*
 * One request, q_len 2, seq_len 2, H = Hkv = 1, D = 8, scale 1, causal.
 * q rows are all 0.5; k0 = 0, k1 = all 0.25, so score(k0) = 0 and
 * score(k1) = 8 * 0.5 * 0.25 = 1. v0 = all 1, v1 = all 3.
 *   Query 0 (pos 0) sees k0 only: out = 1, lse = log(e^0) = 0.
 *   Query 1 (pos 1) sees both: p1 = e / (1 + e), out = 1 + 2 e / (1 + e)
 *     = 2.4621171572600096, lse = log(1 + e) = 1.3132616875182228.
 * With a sink logit 0 the denominators gain e^0 = 1:
 *   Query 0: out = 1 / 2 = 0.5, lse = log 2 = 0.6931471805599453.
 *   Query 1: out = (1 + 3 e) / (2 + e) = 1.9402922119145731,
 *     lse = log(2 + e) = 1.5514447139320509.
 */
static void test_hand_computed(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    enum { D = 8, B = 4 };
    float kd[B * D], vd[B * D]; /* NB = 1, NHD, one kv head */
    for (int i = 0; i < B * D; i++) {
        kd[i] = 100.0f; /* rows 2, 3 are past seq_len and must not be read */
        vd[i] = 100.0f;
    }
    for (int c = 0; c < D; c++) {
        kd[0 * D + c] = 0.0f;
        kd[1 * D + c] = 0.25f;
        vd[0 * D + c] = 1.0f;
        vd[1 * D + c] = 3.0f;
    }
    kva_cache_desc cd = {1,           B, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MHA};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &cd, kd, vd, &cache));

    int32_t qsl[2] = {0, 2}, seq[1] = {2}, bt[1] = {0};
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq;
    pd.block_table = bt;
    pd.block_table_stride = 1;
    pd.block_size = B;
    pd.num_heads = 1;
    pd.num_kv_heads = 1;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.scale = 1.0f;
    pd.causal = 1;
    pd.window_left = -1;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));

    float q[2 * D], out[2 * D], lse[2];
    for (int i = 0; i < 2 * D; i++)
        q[i] = 0.5f;
    const float sink[1] = {0.0f};
    const double want_out[2][2] = {{1.0, 2.4621171572600096}, {0.5, 1.9402922119145731}};
    const double want_lse[2][2] = {{0.0, 1.3132616875182228},
                                   {0.6931471805599453, 1.5514447139320509}};
    for (int with_sink = 0; with_sink < 2; with_sink++)
        hand_check(ctx, plan, cache, q, with_sink ? sink : NULL, want_out[with_sink],
                   want_lse[with_sink], out, lse, 1e-6);
    kva_plan_destroy(plan);

    /*
     * Scale 1000: scores 0 and 1000, beyond exp's range without the max
     * subtraction. Query 0: out 1, lse 0. Query 1: p1 = 1 / (1 + e^-1000) = 1
     * in any precision: out 3, lse 1000.
     * With a sink logit 2000 (which must join the maximum): both rows have
     * weight e^(s - 2000) <= e^-1000 on their keys, so out = 0 and lse = 2000
     * (log(1 + e^-1000 + e^-2000) = 0 in any precision).
     */
    pd.scale = 1000.0f;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    const float big_sink[1] = {2000.0f};
    const double big_out[2][2] = {{1.0, 3.0}, {0.0, 0.0}};
    const double big_lse[2][2] = {{0.0, 1000.0}, {2000.0, 2000.0}};
    for (int with_sink = 0; with_sink < 2; with_sink++)
        hand_check(ctx, plan, cache, q, with_sink ? big_sink : NULL, big_out[with_sink],
                   big_lse[with_sink], out, lse, 1e-6);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
}

/* ------------------------------------------------------------------------ */
/* The grid: paged and ragged runs against the dense truth                   */
/* ------------------------------------------------------------------------ */

typedef struct grid_case {
    int32_t D, Dv, H, Hkv, B;
    kva_dtype dt;
    kva_layout layout;
    int causal;
    int32_t window_left;
    float softcap, scale;
    int alibi, sinks, share;
    double q_sigma;
} grid_case;

/* Multiply-adds of one run, to keep every case small. */
static double case_work(const kva_test_batch *b, const grid_case *gc)
{
    double pairs = 0.0;
    for (int32_t r = 0; r < b->R; r++)
        pairs += (double)b->q_lens[r] * b->seq_lens[r];
    return pairs * gc->H * (gc->D + gc->Dv);
}

/* Longest request: past a couple of block boundaries for small B, past one for large B. */
static int32_t case_max_len(int32_t B)
{
    return B == 1 ? 24 : B <= 16 ? 3 * B + 5 : B + B / 4 + 8;
}

/* Which request kinds appeared over the whole grid (bit = 1 << kind). */
static unsigned g_kinds_seen;

/* Tracks the kinds of a batch from its lengths (as kva_test_batch_random makes them). */
static void note_kinds(const kva_test_batch *b)
{
    for (int32_t r = 0; r < b->R; r++) {
        int32_t q = b->q_lens[r], s = b->seq_lens[r];
        if (q == s)
            g_kinds_seen |= 1u << KVA_TEST_FRESH;
        else if (q == 1)
            g_kinds_seen |= 1u << KVA_TEST_DECODE;
        else if (q <= 4)
            g_kinds_seen |= 1u << KVA_TEST_SPEC; /* or a short chunk: both are multi-token */
        else
            g_kinds_seen |= 1u << KVA_TEST_CHUNKED;
    }
}

/* Fills the plan's mask and score options and the dense options from a case. */
static void case_options(const grid_case *gc, kva_plan_desc *pd, dense_opts *o, const float *alibi,
                         const float *sinks)
{
    pd->causal = gc->causal;
    pd->window_left = gc->window_left;
    pd->softcap = gc->softcap;
    pd->scale = gc->scale;
    pd->alibi_slopes = gc->alibi ? alibi : NULL;
    o->causal = gc->causal;
    o->window_left = gc->window_left;
    o->softcap = gc->softcap;
    o->scale = gc->scale > 0.0f ? (double)gc->scale : 1.0 / sqrt((double)gc->D);
    o->alibi = gc->alibi ? alibi : NULL;
    o->sinks = gc->sinks ? sinks : NULL;
}

/* Per-head ALiBi slopes (2^(-8 (h+1) / H), as in the ALiBi paper) and sinks. */
static void make_head_params(kva_rng *rng, int32_t H, float *alibi, float *sinks)
{
    for (int32_t h = 0; h < H; h++) {
        alibi[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(rng) * 2.0);
    }
}

static void describe(char *buf, size_t n, const char *kind, int idx, const grid_case *gc)
{
    snprintf(buf, n,
             "%s case %d: D=%d Dv=%d H=%d Hkv=%d B=%d %s %s causal=%d win=%d cap=%g scale=%g "
             "alibi=%d sinks=%d",
             kind, idx, gc->D, gc->Dv, gc->H, gc->Hkv, gc->B, kva_dtype_name(gc->dt),
             gc->layout == KVA_LAYOUT_NHD ? "NHD" : "HND", gc->causal, gc->window_left,
             (double)gc->softcap, (double)gc->scale, gc->alibi, gc->sinks);
}

/* Runs the paged kernel on batch b (random cache, random q) and compares it
 * with the dense truth. idx selects the occasional extra lse = NULL run. */
static void check_paged_batch(kva_rng *rng, const char *label, int idx, const grid_case *gc,
                              const kva_test_batch *bp)
{
    const kva_test_batch b = *bp;
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    kva_cache *cache = NULL;
    CHECK_OK(
        kva_test_batch_cache(&b, ctx, rng, gc->Hkv, gc->D, gc->Dv, gc->dt, gc->layout, &cache));
    void *kc = NULL, *vc = NULL;
    kva_cache_data(cache, &kc, &vc);

    float alibi[64], sinks[64];
    make_head_params(rng, gc->H, alibi, sinks);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, gc->H, gc->Hkv, gc->D, gc->Dv, gc->dt);
    dense_opts o;
    case_options(gc, &pd, &o, alibi, sinks);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));

    const size_t T = (size_t)b.T, H = (size_t)gc->H;
    const size_t elem = kva_dtype_size(gc->dt);
    void *q = malloc(T * H * (size_t)gc->D * elem);
    void *out = malloc(T * H * (size_t)gc->Dv * elem + 1);
    float *lse = malloc(sizeof(float) * T * H + 1);
    kva_test_fill(q, gc->dt, T * H * (size_t)gc->D, rng, gc->q_sigma);
    kva_test_poison(out, gc->dt, T * H * (size_t)gc->Dv);
    kva_test_poison(lse, KVA_DTYPE_F32, T * H);
    CHECK_OK(kva_attention_run(ctx, plan, q, cache, gc->sinks ? sinks : NULL, out, lse));
    CHECK_MSG(count_nan(out, gc->dt, T * H * (size_t)gc->Dv) == 0, "%s: unwritten out", label);
    CHECK_MSG(count_nan(lse, KVA_DTYPE_F32, T * H) == 0, "%s: unwritten lse", label);

    /* The truth, request by request. */
    double *want = malloc(sizeof(double) * T * H * (size_t)gc->Dv + 1);
    double *want_lse = malloc(sizeof(double) * T * H + 1);
    for (int32_t r = 0; r < b.R; r++) {
        const int32_t ql = b.q_lens[r], s = b.seq_lens[r], t0 = b.query_start_loc[r];
        if (ql == 0)
            continue; /* no rows; its block table may hold -1 */
        double *K = malloc(sizeof(double) * (size_t)s * gc->Hkv * gc->D + 1);
        double *V = malloc(sizeof(double) * (size_t)s * gc->Hkv * gc->Dv + 1);
        double *Q = malloc(sizeof(double) * (size_t)ql * H * gc->D + 1);
        gather_paged(&b, r, kc, vc, gc->dt, gc->layout, gc->Hkv, gc->D, gc->Dv, K, V);
        to_double(q, gc->dt, (size_t)t0 * H * gc->D, (size_t)ql * H * gc->D, Q);
        dense_attention(ql, s, gc->H, gc->Hkv, gc->D, gc->Dv, Q, K, V, &o,
                        want + (size_t)t0 * H * gc->Dv, want_lse + (size_t)t0 * H);
        free(K);
        free(V);
        free(Q);
    }
    size_t bad =
        compare_truth(label, out, gc->dt, want, T * H * (size_t)gc->Dv, lse, want_lse, T * H);
    CHECK_MSG(bad == 0, "%s: %zu mismatches (T=%d R=%d)", label, bad, b.T, b.R);

    /* Every few cases: without lse the output must be the same, bit for bit. */
    if (idx % 4 == 0) {
        void *out2 = malloc(T * H * (size_t)gc->Dv * elem + 1);
        kva_test_poison(out2, gc->dt, T * H * (size_t)gc->Dv);
        CHECK_OK(kva_attention_run(ctx, plan, q, cache, gc->sinks ? sinks : NULL, out2, NULL));
        CHECK_MSG(memcmp(out, out2, T * H * (size_t)gc->Dv * elem) == 0, "%s: lse=NULL differs",
                  label);
        free(out2);
    }

    free(want);
    free(want_lse);
    free(q);
    free(out);
    free(lse);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
}

/* One paged case: random mixed batch, random cache, random q; ref vs dense. */
static void run_paged_case(kva_rng *rng, int idx, const grid_case *gc)
{
    char label[256];
    describe(label, sizeof label, "paged", idx, gc);
    /* A batch of all four kinds, regenerated until the case is small; after a
     * few tries only decodes and speculative decodes (cheap at any length). */
    kva_test_batch b;
    unsigned kinds = 0xf;
    for (int attempt = 0;; attempt++) {
        kva_test_batch_random(&b, rng, kva_rng_int(rng, 2, 5), gc->B, case_max_len(gc->B), kinds,
                              gc->share);
        if (case_work(&b, gc) <= 6e6)
            break;
        kva_test_batch_free(&b);
        if (attempt >= 6)
            kinds = (1u << KVA_TEST_DECODE) | (1u << KVA_TEST_SPEC);
    }
    note_kinds(&b);
    check_paged_batch(rng, label, idx, gc, &b);
    kva_test_batch_free(&b);
}

/* One ragged case: packed random K/V [sum(seq_lens), Hkv, D]; ref vs dense. */
static void run_ragged_case(kva_rng *rng, int idx, const grid_case *gc)
{
    char label[256];
    describe(label, sizeof label, "ragged", idx, gc);
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    kva_test_batch b;
    int32_t max_len = 40;
    for (;;) {
        kva_test_batch_random(&b, rng, kva_rng_int(rng, 1, 4), 16, max_len, 0xf, 0);
        if (case_work(&b, gc) <= 6e6)
            break;
        kva_test_batch_free(&b);
        max_len = max_len * 3 / 4 + 1;
    }
    note_kinds(&b);

    float alibi[64], sinks[64];
    make_head_params(rng, gc->H, alibi, sinks);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, gc->H, gc->Hkv, gc->D, gc->Dv, gc->dt);
    pd.block_table = NULL; /* a plan for ragged runs only */
    pd.block_table_stride = 0;
    dense_opts o;
    case_options(gc, &pd, &o, alibi, sinks);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));

    size_t rows = 0;
    for (int32_t r = 0; r < b.R; r++)
        rows += (size_t)b.seq_lens[r];
    const size_t T = (size_t)b.T, H = (size_t)gc->H, Hkv = (size_t)gc->Hkv;
    const size_t elem = kva_dtype_size(gc->dt);
    void *k = malloc(rows * Hkv * (size_t)gc->D * elem + 1);
    void *v = malloc(rows * Hkv * (size_t)gc->Dv * elem + 1);
    void *q = malloc(T * H * (size_t)gc->D * elem + 1);
    void *out = malloc(T * H * (size_t)gc->Dv * elem + 1);
    float *lse = malloc(sizeof(float) * T * H + 1);
    kva_test_fill(k, gc->dt, rows * Hkv * (size_t)gc->D, rng, 1.0);
    kva_test_fill(v, gc->dt, rows * Hkv * (size_t)gc->Dv, rng, 1.0);
    kva_test_fill(q, gc->dt, T * H * (size_t)gc->D, rng, gc->q_sigma);
    kva_test_poison(out, gc->dt, T * H * (size_t)gc->Dv);
    kva_test_poison(lse, KVA_DTYPE_F32, T * H);
    CHECK_OK(kva_attention_run_ragged(ctx, plan, q, k, v, gc->sinks ? sinks : NULL, out, lse));

    double *want = malloc(sizeof(double) * T * H * (size_t)gc->Dv + 1);
    double *want_lse = malloc(sizeof(double) * T * H + 1);
    size_t first = 0; /* this request's first K/V row, counted here independently */
    for (int32_t r = 0; r < b.R; r++) {
        const int32_t ql = b.q_lens[r], s = b.seq_lens[r], t0 = b.query_start_loc[r];
        double *K = malloc(sizeof(double) * (size_t)s * Hkv * gc->D + 1);
        double *V = malloc(sizeof(double) * (size_t)s * Hkv * gc->Dv + 1);
        double *Q = malloc(sizeof(double) * (size_t)ql * H * gc->D + 1);
        to_double(k, gc->dt, first * Hkv * gc->D, (size_t)s * Hkv * gc->D, K);
        to_double(v, gc->dt, first * Hkv * gc->Dv, (size_t)s * Hkv * gc->Dv, V);
        to_double(q, gc->dt, (size_t)t0 * H * gc->D, (size_t)ql * H * gc->D, Q);
        dense_attention(ql, s, gc->H, gc->Hkv, gc->D, gc->Dv, Q, K, V, &o,
                        want + (size_t)t0 * H * gc->Dv, want_lse + (size_t)t0 * H);
        first += (size_t)s;
        free(K);
        free(V);
        free(Q);
    }
    size_t bad =
        compare_truth(label, out, gc->dt, want, T * H * (size_t)gc->Dv, lse, want_lse, T * H);
    CHECK_MSG(bad == 0, "%s: %zu mismatches (T=%d R=%d)", label, bad, b.T, b.R);

    free(want);
    free(want_lse);
    free(k);
    free(v);
    free(q);
    free(out);
    free(lse);
    kva_plan_destroy(plan);
    kva_test_batch_free(&b);
    kva_context_destroy(ctx);
}

/* A random permutation of [0, n) (Fisher-Yates). */
static void shuffle(kva_rng *rng, int *a, int n)
{
    for (int i = 0; i < n; i++)
        a[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = kva_rng_int(rng, 0, i), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/*
 * Builds n cases so that every value of every axis appears about n / values
 * times: axis value of case c = values[perm_axis[c] % values], with an
 * independent random permutation per axis, so combinations are random.
 */
enum { GRID_MAX = 64 };
static void make_grid(kva_rng *rng, int n, grid_case *cases)
{
    static const int32_t dims[][2] = {{64, 64},   {80, 80},  {128, 128},
                                      {256, 256}, {128, 64}, {64, 256}};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {32, 8}};
    static const int32_t blocks[] = {1, 16, 64, 128};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const int32_t windows[] = {-1, -1, 0, 5, 37};
    static const float caps[] = {0.0f, 0.0f, 1.5f, 30.0f};
    static const float scales[] = {0.0f, 0.0f, 0.03f};
    int p[9][GRID_MAX];
    for (int a = 0; a < 9; a++)
        shuffle(rng, p[a], n);
    for (int c = 0; c < n; c++) {
        grid_case *g = &cases[c];
        g->D = dims[p[0][c] % 6][0];
        g->Dv = dims[p[0][c] % 6][1];
        g->H = heads[p[1][c] % 4][0];
        g->Hkv = heads[p[1][c] % 4][1];
        g->B = blocks[p[2][c] % 4];
        g->dt = dts[p[3][c] % 3];
        g->layout = (kva_layout)(p[4][c] % 2);
        g->causal = (p[5][c] % 2) == 0;
        g->window_left = windows[p[6][c] % 5];
        g->softcap = caps[p[7][c] % 4];
        g->scale = scales[p[8][c] % 3];
        g->alibi = kva_rng_int(rng, 0, 2) == 0;
        g->sinks = kva_rng_int(rng, 0, 1);
        g->share = kva_rng_int(rng, 0, 1);
        g->q_sigma = kva_rng_int(rng, 0, 1) ? 1.0 : 3.0; /* soft and peaked softmaxes */
    }
}

static void test_paged_grid(void)
{
    kva_rng rng = {0x7265665f70616765ull};
    enum { N = 48 };
    grid_case cases[N];
    make_grid(&rng, N, cases);
    for (int c = 0; c < N; c++)
        run_paged_case(&rng, c, &cases[c]);
    /* The regenerate-when-too-big loop must not have starved any kind. */
    CHECK_MSG(g_kinds_seen == 0xf, "kinds seen: %#x", g_kinds_seen);
}

static void test_ragged_grid(void)
{
    kva_rng rng = {0x7261676765640001ull};
    enum { N = 24 };
    grid_case cases[N];
    make_grid(&rng, N, cases);
    for (int c = 0; c < N; c++)
        run_ragged_case(&rng, c, &cases[c]);
}

/*
 * Requests with q_len 0 (one of them with seq_len 0 too) produce no rows and
 * their blocks are not read: the plan does not check their block ids, so here
 * they are -1 and a kernel that touched them would read out of bounds (ASan).
 */
static void test_zero_query_requests(void)
{
    kva_rng rng = {0x7a65726f71ull};
    const int32_t q_lens[6] = {0, 3, 0, 1, 2, 0};
    const int32_t seq_lens[6] = {0, 20, 17, 5, 33, 9};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 6, q_lens, seq_lens, 4, 2, 1);
    for (int32_t r = 0; r < b.R; r++)
        if (b.q_lens[r] == 0)
            for (int32_t i = 0; i < b.stride; i++)
                b.block_table[(size_t)r * b.stride + i] = -1;
    for (int layout = 0; layout < 2; layout++) {
        grid_case gc = {64,   64, 8, 2, 4,  KVA_DTYPE_F32, (kva_layout)layout, 1, -1, 0.0f,
                        0.0f, 1,  1, 1, 1.0};
        check_paged_batch(&rng, layout ? "q_len 0, HND" : "q_len 0, NHD", 0, &gc, &b);
    }
    kva_test_batch_free(&b);
}

int main(void)
{
    RUN(test_hand_computed);
    RUN(test_paged_grid);
    RUN(test_ragged_grid);
    RUN(test_zero_query_requests);
    return kva_test_finish();
}
