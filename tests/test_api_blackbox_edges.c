/*
 * test_api_blackbox_edges.c - black-box audit, round four (session 38, task
 * api38): scores at the edges of their values and plans shared between
 * threads and contexts. Public API only; outputs poisoned before every run.
 *
 *   - keys whose scores are -inf (kvattn.h: "a score of -inf carries no
 *     weight"), rows whose every key is -inf, with and without soft-cap,
 *     ALiBi, sinks and a window, on the reference and CPU backends against
 *     the header's formula in double (blackbox_oracle.h);
 *   - the scale's range (0 means 1/sqrt(D); negative or non-finite refused);
 *   - one plan run at the same time from two threads on two contexts
 *     (kvattn.h: plans are only read), and a plan built for one thread count
 *     run on contexts of other counts (refused, or equal to the reference).
 */
#include "blackbox_oracle.h"

#include <pthread.h>

enum { ED_NB = 16, ED_B = 5, ED_HKV = 2, ED_H = 6, ED_D = 16, ED_DV = 24, ED_STRIDE = 6 };

/* Four requests: a decode over 23 keys, a 4-token prefill over 30, a
 * decode whose 8 keys all score -inf, a decode over 12. */
static const int32_t ed_qsl[5] = {0, 1, 5, 6, 7}, ed_sl[4] = {23, 30, 8, 12};
static const int32_t ed_bt[4 * ED_STRIDE] = {0,  1,  2,  3,  4,  -1, 5,  6,  7,  8,  9,  10,
                                             11, 12, -1, -1, -1, -1, 13, 14, 15, -1, -1, -1};

/* Positions (request, key) whose K rows are -inf in every channel: with q > 0
 * their scores are -inf. */
static const int32_t ed_ninf[][2] = {{0, 3}, {0, 7}, {0, 22}, {1, 10}, {1, 26}, {3, 11}, {2, 0},
                                     {2, 1}, {2, 2}, {2, 3},  {2, 4},  {2, 5},  {2, 6},  {2, 7}};

/* kvattn.h: "a score of -inf carries no weight"; a row whose keys all score
 * -inf sees no key that counts (0 and lse -inf, or the sink). With a soft-cap
 * the score of such a key is c * tanh(-inf / c) = -c, which counts. */
static void test_minus_inf_scores(void)
{
    const float alibi[ED_H] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 1.0f};
    const float sinks[ED_H] = {0.5f, -2.0f, 1.0f, 0.0f, 3.0f, -0.5f};
    const struct {
        float softcap, qmul;
        int32_t window;
        int alibi, sinks;
    } cases[] = {{0.0f, 1.0f, -1, 0, 0}, {3.0f, 6.0f, -1, 1, 1}, {0.0f, 1.0f, -1, 0, 1},
                 {3.0f, 6.0f, -1, 0, 0}, {2.0f, 4.0f, 2, 1, 1},  {0.0f, 1.0f, 0, 1, 0}};
    const int32_t T = ed_qsl[4];
    for (int dti = 0; dti < 2; dti++) {
        const kva_dtype dt = dti ? KVA_DTYPE_BF16 : KVA_DTYPE_F32;
        kva_rng rng = {3803 + (uint64_t)dti};
        float kf[ED_NB * ED_B * ED_HKV * ED_D], vf[ED_NB * ED_B * ED_HKV * ED_DV];
        float qf[7 * ED_H * ED_D];
        kva_test_fill(kf, KVA_DTYPE_F32, sizeof kf / 4, &rng, 1.0);
        kva_test_fill(vf, KVA_DTYPE_F32, sizeof vf / 4, &rng, 1.0);
        kva_test_fill(qf, KVA_DTYPE_F32, sizeof qf / 4, &rng, 1.0);
        for (size_t i = 0; i < sizeof qf / 4; i++)
            qf[i] = fabsf(qf[i]) + 0.05f; /* q > 0: <q, -inf row> = -inf */
        int64_t slots[ED_NB * ED_B];
        for (int32_t s = 0; s < ED_NB * ED_B; s++)
            slots[s] = s;
        for (size_t i = 0; i < sizeof ed_ninf / sizeof ed_ninf[0]; i++) {
            const int32_t r = ed_ninf[i][0], j = ed_ninf[i][1];
            const int32_t slot = ed_bt[r * ED_STRIDE + j / ED_B] * ED_B + j % ED_B;
            for (int32_t x = 0; x < ED_HKV * ED_D; x++)
                kf[(size_t)slot * ED_HKV * ED_D + x] = -INFINITY;
        }
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            unsigned char q[sizeof qf], out[7 * ED_H * ED_DV * 4];
            float qs[sizeof qf / 4], lse[7 * ED_H];
            for (size_t i = 0; i < sizeof qf / 4; i++)
                qs[i] = qf[i] * cases[ci].qmul;
            CHECK_OK(kva_convert(qs, KVA_DTYPE_F32, q, dt, sizeof qf / 4));
            kva_plan_desc pd = {.num_requests = 4,
                                .query_start_loc = ed_qsl,
                                .seq_lens = ed_sl,
                                .block_table = ed_bt,
                                .block_table_stride = ED_STRIDE,
                                .block_size = ED_B,
                                .num_heads = ED_H,
                                .num_kv_heads = ED_HKV,
                                .head_dim = ED_D,
                                .head_dim_v = ED_DV,
                                .q_dtype = dt,
                                .causal = 1,
                                .window_left = cases[ci].window,
                                .softcap = cases[ci].softcap,
                                .alibi_slopes = cases[ci].alibi ? alibi : NULL};
            const float *sk = cases[ci].sinks ? sinks : NULL;
            sz_sem m = {1.0 / sqrt((double)ED_D),
                        cases[ci].softcap,
                        1,
                        cases[ci].window,
                        0,
                        pd.alibi_slopes,
                        sk};
            for (int b = 0; b < 2; b++) {
                char label[96];
                snprintf(label, sizeof label, "%s %s softcap %g window %d alibi %d sinks %d",
                         kva_backend_name(kBk[b]), kva_dtype_name(dt), (double)cases[ci].softcap,
                         (int)cases[ci].window, cases[ci].alibi, cases[ci].sinks);
                kva_context *ctx = new_ctx(kBk[b], 2);
                kva_cache_desc cd = make_desc(ED_NB, ED_B, ED_HKV, ED_D, ED_DV, dt, KVA_LAYOUT_NHD);
                kva_cache *c = NULL;
                kva_plan *plan = NULL;
                CHECK_OK(kva_cache_create(ctx, &cd, &c));
                CHECK_OK(kva_cache_write(ctx, c, ED_NB * ED_B, kf, 0, vf, 0, KVA_DTYPE_F32, slots));
                CHECK_OK(kva_plan_create(ctx, &pd, &plan));
                kva_test_poison(out, dt, (size_t)T * ED_H * ED_DV);
                kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * ED_H);
                CHECK_OK(kva_attention_run(ctx, plan, q, c, sk, out, lse));
                CHECK_MSG(sz_check_run(ctx, c, &pd, &m, q, out, lse, dt, label) == 0, "%s", label);
                kva_plan_destroy(plan);
                kva_cache_destroy(c);
                kva_context_destroy(ctx);
            }
        }
    }
}

/* kvattn.h: "scale: softmax scale; 0 means 1/sqrt(D)"; a negative or
 * non-finite one is refused (INVALID_ARGUMENT, nothing made). */
static void test_scale_range(void)
{
    for (int b = 0; b < 2; b++) {
        bb_fix f;
        bb_fix_init(&f, kBk[b], 3804);
        const float bad[] = {-1.0f, -0.0f, -1e-30f, NAN, INFINITY, -INFINITY};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            kva_plan_desc pd = f.pd;
            pd.scale = bad[i];
            kva_plan *p = (kva_plan *)&f; /* must stay as it was */
            if (bad[i] == 0.0f) {
                /* -0.0 == 0: the default scale, as 0. */
                CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
                kva_plan_destroy(p);
                continue;
            }
            BAD(kva_plan_create(f.ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
            CHECK_ERROR_MENTIONS("scale");
            CHECK(p == (kva_plan *)&f);
            BAD(kva_plan_update(f.ctx, f.plan, &pd), KVA_STATUS_INVALID_ARGUMENT);
            CHECK(bb_untouched(&f));
        }
        bb_fix_free(&f);
    }
}

/* ---- threads ---- */

enum { TH_R = 6, TH_B = 16, TH_H = 8, TH_HKV = 2, TH_D = 64, TH_S = 1500, TH_RUNS = 12 };
#define TH_NB (TH_R * ((TH_S + TH_B - 1) / TH_B))
#define TH_T (TH_R + 7)

typedef struct th_job {
    kva_context *ctx;
    const kva_plan *plan;
    const kva_cache *cache;
    const void *q;
    float *out; /* [TH_RUNS, T, H, D] */
    float *lse; /* [TH_RUNS, T, H] */
    kva_status st;
} th_job;

static void *th_main(void *arg)
{
    th_job *j = (th_job *)arg;
    j->st = KVA_STATUS_OK;
    for (int i = 0; i < TH_RUNS && j->st == KVA_STATUS_OK; i++)
        j->st = kva_attention_run(j->ctx, j->plan, j->q, j->cache, NULL,
                                  j->out + (size_t)i * TH_T * TH_H * TH_D,
                                  j->lse + (size_t)i * TH_T * TH_H);
    return NULL;
}

/* The batch of the thread cases: 5 decodes and a 7-token chunked prefill
 * of 1500 keys each, on their own blocks (f32, cascade off). */
static kva_plan_desc th_desc(int32_t *qsl, int32_t *sl, int32_t *bt)
{
    const int32_t stride = (TH_S + TH_B - 1) / TH_B;
    for (int32_t r = 0; r <= TH_R; r++)
        qsl[r] = r < TH_R ? r : TH_T;
    for (int32_t r = 0; r < TH_R; r++) {
        sl[r] = TH_S - 37 * r;
        for (int32_t j = 0; j < stride; j++)
            bt[r * stride + j] = (r * stride + j * 7) % TH_NB;
    }
    return (kva_plan_desc){.num_requests = TH_R,
                           .query_start_loc = qsl,
                           .seq_lens = sl,
                           .block_table = bt,
                           .block_table_stride = stride,
                           .block_size = TH_B,
                           .num_heads = TH_H,
                           .num_kv_heads = TH_HKV,
                           .head_dim = TH_D,
                           .q_dtype = KVA_DTYPE_F32,
                           .causal = 1,
                           .window_left = -1,
                           .cascade = KVA_CASCADE_OFF};
}

/* kvattn.h: "one plan may serve calls on several contexts of the same
 * backend, provided each context has reserved the plan's workspace: it
 * created the plan, or created a plan from the same descriptor with the same
 * number of threads"; contexts are independent. Two threads run one plan at
 * the same time on two such contexts (and a third thread another plan on a
 * third): every run gives the bytes of a run alone. */
static void test_plan_two_threads(void)
{
    int32_t qsl[TH_R + 1], sl[TH_R], bt[TH_R * ((TH_S + TH_B - 1) / TH_B)];
    const kva_plan_desc pd = th_desc(qsl, sl, bt);
    kva_context *ctx[3];
    kva_plan *plan[3];
    for (int i = 0; i < 3; i++) {
        ctx[i] = new_ctx(KVA_BACKEND_CPU, 2);
        plan[i] = NULL;
        CHECK_OK(kva_plan_create(ctx[i], &pd, &plan[i]));
    }
    kva_cache_desc cd = make_desc(TH_NB, TH_B, TH_HKV, TH_D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx[0], &cd, &c));
    kva_rng rng = {3805};
    fill_cache(c, &rng);
    const size_t no = (size_t)TH_T * TH_H * TH_D, nl = (size_t)TH_T * TH_H;
    float *q = malloc(no * 4), *alone = malloc(no * 4), *alone_lse = malloc(nl * 4);
    kva_test_fill(q, KVA_DTYPE_F32, no, &rng, 1.0);
    kva_test_poison(alone, KVA_DTYPE_F32, no);
    kva_test_poison(alone_lse, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_attention_run(ctx[0], plan[0], q, c, NULL, alone, alone_lse));
    /* The runs are compared with this one's bytes: it must write everything. */
    CHECK(kva_test_count_poisoned(alone, KVA_DTYPE_F32, no) == 0 &&
          kva_test_count_poisoned(alone_lse, KVA_DTYPE_F32, nl) == 0);
    th_job jobs[3];
    pthread_t tid[3];
    for (int i = 0; i < 3; i++) {
        /* Threads 0 and 1 share plan 0 (contexts 0 and 1); thread 2 runs plan 2. */
        jobs[i] = (th_job){ctx[i],
                           plan[i == 1 ? 0 : i],
                           c,
                           q,
                           malloc(TH_RUNS * no * 4),
                           malloc(TH_RUNS * nl * 4),
                           KVA_STATUS_INTERNAL};
        kva_test_poison(jobs[i].out, KVA_DTYPE_F32, TH_RUNS * no);
        kva_test_poison(jobs[i].lse, KVA_DTYPE_F32, TH_RUNS * nl);
    }
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&tid[i], NULL, th_main, &jobs[i]) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(tid[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(jobs[i].st == KVA_STATUS_OK, "thread %d: %s", i, kva_status_name(jobs[i].st));
        size_t differ = 0;
        for (int k = 0; k < TH_RUNS; k++)
            differ += memcmp(jobs[i].out + k * no, alone, no * 4) != 0 ||
                      memcmp(jobs[i].lse + k * nl, alone_lse, nl * 4) != 0;
        CHECK_MSG(differ == 0, "thread %d: %zu of %d concurrent runs differ from a run alone", i,
                  differ, TH_RUNS);
        free(jobs[i].out);
        free(jobs[i].lse);
    }
    for (int i = 0; i < 3; i++) {
        kva_plan_destroy(plan[i]);
        kva_context_destroy(ctx[i]);
    }
    kva_cache_destroy(c);
    free(q);
    free(alone);
    free(alone_lse);
}

/* A plan built on a context of t threads, run on contexts of u threads that
 * created a plan from the same descriptor: kvattn.h allows u == t; other
 * counts run (equal to the reference within the f32 tolerance) or are
 * refused with INVALID_ARGUMENT, leaving out and lse as they were. */
static void test_thread_counts(void)
{
    int32_t qsl[TH_R + 1], sl[TH_R], bt[TH_R * ((TH_S + TH_B - 1) / TH_B)];
    const kva_plan_desc pd = th_desc(qsl, sl, bt);
    const size_t no = (size_t)TH_T * TH_H * TH_D, nl = (size_t)TH_T * TH_H;
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1);
    kva_cache_desc cd = make_desc(TH_NB, TH_B, TH_HKV, TH_D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    kva_plan *rp = NULL;
    CHECK_OK(kva_cache_create(ref, &cd, &c));
    kva_rng rng = {3806};
    fill_cache(c, &rng);
    float *q = malloc(no * 4), *want = malloc(no * 4), *out = malloc(no * 4);
    float *want_lse = malloc(nl * 4), *lse = malloc(nl * 4);
    kva_test_fill(q, KVA_DTYPE_F32, no, &rng, 1.0);
    CHECK_OK(kva_plan_create(ref, &pd, &rp));
    CHECK_OK(kva_attention_run(ref, rp, q, c, NULL, want, want_lse));
    static const int32_t ts[] = {1, 2, 3, 5};
    int refused = 0;
    for (size_t a = 0; a < sizeof ts / sizeof ts[0]; a++) {
        kva_context *built = new_ctx(KVA_BACKEND_CPU, ts[a]);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(built, &pd, &plan));
        for (int32_t u = 1; u <= 6; u++) {
            kva_context *run = new_ctx(KVA_BACKEND_CPU, u);
            kva_plan *own = NULL;
            CHECK_OK(kva_plan_create(run, &pd, &own));
            kva_test_poison(out, KVA_DTYPE_F32, no);
            kva_test_poison(lse, KVA_DTYPE_F32, nl);
            const uint64_t so = bb_sum(out, no * 4), sl2 = bb_sum(lse, nl * 4);
            const kva_status st = kva_attention_run(run, plan, q, c, NULL, out, lse);
            if (st == KVA_STATUS_OK) {
                CHECK_MSG(kva_test_compare("threads", out, want, KVA_DTYPE_F32, no,
                                           kva_test_atol(KVA_DTYPE_F32),
                                           kva_test_rtol(KVA_DTYPE_F32)) == 0 &&
                              kva_test_compare_f32("threads lse", lse, want_lse, nl, 1e-5, 1e-5) ==
                                  0,
                          "plan of %d threads on a context of %d", (int)ts[a], (int)u);
            } else {
                refused++;
                CHECK_MSG(st == KVA_STATUS_INVALID_ARGUMENT && u != ts[a] &&
                              kva_last_error()[0] != '\0',
                          "plan of %d threads on a context of %d: %s", (int)ts[a], (int)u,
                          kva_status_name(st));
                CHECK(bb_sum(out, no * 4) == so && bb_sum(lse, nl * 4) == sl2);
            }
            kva_plan_destroy(own);
            kva_context_destroy(run);
        }
        kva_plan_destroy(plan);
        kva_context_destroy(built);
    }
    if (getenv("KVA_TEST_VERBOSE"))
        fprintf(stderr, "  thread counts: %d of 24 pairs refused\n", refused);
    kva_plan_destroy(rp);
    kva_cache_destroy(c);
    kva_context_destroy(ref);
    free(q);
    free(want);
    free(out);
    free(want_lse);
    free(lse);
}

/* kvattn.h: "q_len <= decode_threshold counts as a decode; 0 means 1": any
 * threshold up to INT32_MAX classifies the batch as the header says and runs
 * (a 300-token prefill on the decode path included) equal to the reference,
 * NHD and HND, with and without a soft-cap. */
static void test_decode_threshold_edges(void)
{
    enum { NB = 64, B = 16, HKV = 2, H = 8, D = 64, W = 48, T = 305 };
    static const int32_t thr[] = {0, 1, 64, 300, 100000, INT32_MAX};
    static const int32_t want_dec[] = {1, 1, 2, 3, 3, 3};
    const int32_t qsl[4] = {0, 1, 301, 305}, sl[3] = {500, 700, 4};
    int32_t bt[3 * W];
    for (int i = 0; i < 3 * W; i++)
        bt[i] = (i * 7) % NB;
    uint16_t *q = malloc((size_t)T * H * D * 2), *o[2];
    float *l[2];
    kva_rng rng = {3810};
    kva_test_fill(q, KVA_DTYPE_BF16, (size_t)T * H * D, &rng, 1.0);
    for (int b = 0; b < 2; b++) {
        o[b] = malloc((size_t)T * H * D * 2);
        l[b] = malloc((size_t)T * H * 4);
    }
    for (int v = 0; v < 2; v++)
        for (size_t ti = 0; ti < sizeof thr / sizeof thr[0]; ti++) {
            kva_plan_desc pd = {.num_requests = 3,
                                .query_start_loc = qsl,
                                .seq_lens = sl,
                                .block_table = bt,
                                .block_table_stride = W,
                                .block_size = B,
                                .num_heads = H,
                                .num_kv_heads = HKV,
                                .head_dim = D,
                                .q_dtype = KVA_DTYPE_BF16,
                                .causal = 1,
                                .window_left = -1,
                                .decode_threshold = thr[ti],
                                .softcap = v ? 20.0f : 0.0f};
            for (int b = 0; b < 2; b++) {
                kva_context *ctx = new_ctx(kBk[b], 2);
                kva_cache_desc cd = make_desc(NB, B, HKV, D, 0, KVA_DTYPE_BF16,
                                              v ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD);
                kva_cache *c = NULL;
                kva_plan *p = NULL;
                kva_plan_info info;
                CHECK_OK(kva_cache_create(ctx, &cd, &c));
                kva_rng fill = {3811};
                fill_cache(c, &fill);
                CHECK_OK(kva_plan_create(ctx, &pd, &p));
                CHECK_OK(kva_plan_get_info(p, &info));
                CHECK_MSG(info.num_decodes == want_dec[ti] &&
                              info.state == (want_dec[ti] == 3 ? KVA_STATE_SPEC_DECODING
                                                               : KVA_STATE_CHUNKED_PREFILL),
                          "threshold %d: %d decodes, state %s", (int)thr[ti], (int)info.num_decodes,
                          kva_attn_state_name(info.state));
                /* The reference's result does not depend on the threshold: it
                 * runs once per layout (its 2.4M key visits per run dominate). */
                if (b == 1 || ti == 0) {
                    kva_test_poison(o[b], KVA_DTYPE_BF16, (size_t)T * H * D);
                    kva_test_poison(l[b], KVA_DTYPE_F32, (size_t)T * H);
                    CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, o[b], l[b]));
                }
                kva_plan_destroy(p);
                kva_cache_destroy(c);
                kva_context_destroy(ctx);
            }
            CHECK_MSG(kva_test_compare("threshold", o[1], o[0], KVA_DTYPE_BF16, (size_t)T * H * D,
                                       kva_test_atol(KVA_DTYPE_BF16),
                                       kva_test_rtol(KVA_DTYPE_BF16)) == 0 &&
                          kva_test_compare_f32("threshold lse", l[1], l[0], (size_t)T * H, 1e-4,
                                               1e-4) == 0,
                      "decode_threshold %d, %s", (int)thr[ti], v ? "HND soft-cap" : "NHD");
        }
    for (int b = 0; b < 2; b++) {
        free(o[b]);
        free(l[b]);
    }
    free(q);
}

int main(void)
{
    RUN(test_minus_inf_scores);
    RUN(test_scale_range);
    RUN(test_decode_threshold_edges);
    RUN(test_plan_two_threads);
    RUN(test_thread_counts);
    return kva_test_finish();
}
