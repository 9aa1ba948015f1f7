/*
 * test_cpu_nonfinite.c - the CPU backend on non-finite inputs and scores.
 *
 * kva_attention_run asks for finite q, K, V and scores, but a serving engine
 * that gets a NaN from a bad weight must see it in the affected rows, not a
 * plausible finite output that depends on how many threads split the keys.
 * Every case runs the reference once and the CPU backend with 1, 2 and 3
 * threads and with a partition forced into many small, unaligned key chunks,
 * once per registry kernel that runs here (forced on its family's items),
 * and compares with NaN == NaN and -inf == -inf:
 *   - a NaN in one cached key: NaN out and lse for the rows that see it
 *     (heads of that kv head, rows whose causal/window range covers the key),
 *     exact results everywhere else;
 *   - a NaN in one query row, and a NaN in one value element;
 *   - chunks whose scores all overflow to -inf (ALiBi slope 1e38, so every key
 *     but the last few scores -inf in fp32): they carry no weight;
 *   - a query row whose scores are all -inf (q holds -inf against keys that
 *     are positive in that channel): every weight is 0, so out 0 and lse =
 *     the sink, or lse -inf (the empty row) without one.
 * kva_merge_states with garbage rows on -inf sides is in test_cpu_merge.c.
 * KVA_TEST_QUICK=1 (the sanitizer run) leaves out the 2-thread runs (the
 * 3-thread ones split the same items at other boundaries) and gives the
 * NaN-key prefill a shorter context.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

/* The registry kernels main forces, one after the other, on the CPU contexts
 * of run_problem. */
static const char *g_kernels[KVA_TEST_MAX_KERNELS];
static int g_nkernels;

/* |a - b| <= atol + rtol |b|, or both NaN, or the same infinity. Both were
 * poisoned (kva_test_poison): a NaN must have been written on both sides, so
 * an element the kernel (or the reference) left unwritten fails. */
static size_t compare_nf(const char *label, const float *got, const float *want, size_t n)
{
    const double tol = kva_test_atol(KVA_DTYPE_F32);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = got[i], b = want[i];
        int ok = (kva_test_nan_written(got, KVA_DTYPE_F32, i) &&
                  kva_test_nan_written(want, KVA_DTYPE_F32, i)) ||
                 (isinf(b) && a == b) || fabs(a - b) <= tol + tol * fabs(b);
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s: element %zu: got %.8g, want %.8g\n", label, i, a, b);
            bad++;
        }
    }
    return bad;
}

/* One f32 problem over a paged cache (NHD, B = 16): H = 4 query heads on
 * Hkv = 2 kv heads, D = Dv = 64. */
typedef struct problem {
    kva_test_batch b;
    kva_context *ref;
    kva_cache *cache;
    float *k, *v; /* the cache's storage */
    float *q;     /* [T, H, D] */
    float sinks[4];
    float slopes[4];
    kva_plan_desc pd;
} problem;

enum { P_H = 4, P_HKV = 2, P_D = 64 };

static void problem_init(problem *p, int32_t R, const int32_t *q_lens, const int32_t *seq_lens,
                         uint64_t seed)
{
    memset(p, 0, sizeof *p);
    kva_rng rng = {seed};
    kva_test_batch_init(&p->b, &rng, R, q_lens, seq_lens, 16, 2, 0);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
    CHECK_OK(kva_context_create(&rd, &p->ref));
    CHECK_OK(kva_test_batch_cache(&p->b, p->ref, &rng, P_HKV, P_D, P_D, KVA_DTYPE_F32,
                                  KVA_LAYOUT_NHD, &p->cache));
    void *k = NULL, *v = NULL;
    if (p->cache)
        kva_cache_data(p->cache, &k, &v);
    p->k = k;
    p->v = v;
    const size_t nq = (size_t)p->b.T * P_H * P_D;
    p->q = malloc(nq * sizeof(float) + 1);
    kva_test_fill(p->q, KVA_DTYPE_F32, nq, &rng, 1.0);
    for (int h = 0; h < P_H; h++) {
        p->sinks[h] = (float)kva_rng_normal(&rng);
        p->slopes[h] = (float)pow(2.0, -(h + 1));
    }
    p->pd = kva_test_batch_plan_desc(&p->b, P_H, P_HKV, P_D, P_D, KVA_DTYPE_F32);
}

static void problem_free(problem *p)
{
    kva_cache_destroy(p->cache);
    kva_context_destroy(p->ref);
    free(p->q);
    kva_test_batch_free(&p->b);
}

/* The K (or V) row of key j of request r, kv head kvh. */
static float *kv_row(const problem *p, int v, int32_t r, int32_t j, int32_t kvh)
{
    const int32_t blk = p->b.block_table[(size_t)r * p->b.stride + (size_t)(j / 16)];
    return (v ? p->v : p->k) + kva__cache_row(&p->cache->desc, blk, j % 16, kvh, P_D);
}

/* The q row of request r's query i, head h. */
static float *q_row(const problem *p, int32_t r, int32_t i, int32_t h)
{
    return p->q + ((size_t)(p->b.query_start_loc[r] + i) * P_H + (size_t)h) * P_D;
}

/*
 * Runs the problem on the reference once and on the CPU backend with each
 * kernel of g_kernels forced, in four partitions each; compares out and lse.
 * Returns the least number, over the kernels, of CPU runs whose partition had
 * split tasks.
 */
static int run_problem(const char *label, problem *p, int use_sinks)
{
    const size_t no = (size_t)p->b.T * P_H * P_D, nl = (size_t)p->b.T * P_H;
    float *out_ref = malloc(no * sizeof(float) + 1), *lse_ref = malloc(nl * sizeof(float) + 1);
    float *out = malloc(no * sizeof(float) + 1), *lse = malloc(nl * sizeof(float) + 1);
    const float *sk = use_sinks ? p->sinks : NULL;
    kva_plan *rplan = NULL;
    CHECK_OK(kva_plan_create(p->ref, &p->pd, &rplan));
    kva_test_poison(out_ref, KVA_DTYPE_F32, no);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    if (rplan)
        CHECK_OK(kva_attention_run(p->ref, rplan, p->q, p->cache, sk, out_ref, lse_ref));
    kva_plan_destroy(rplan);
    int least = 4;
    for (int kv = 0; kv < g_nkernels; kv++) {
        int splits = 0;
        for (int mode = 0; mode < 4; mode++) {
            /* 1, 2, 3 threads with the default partition; 3 threads with many small
             * unaligned chunks (chunk boundaries inside 32-key loads). */
            if (mode == 1 && kva_test_quick())
                continue;
            const int thr = mode < 3 ? 1 + mode : 3;
            kva_context_desc cd = {KVA_BACKEND_CPU, thr, 0};
            kva_context *cpu = NULL;
            kva_plan *plan = NULL;
            CHECK_OK(kva_context_create(&cd, &cpu));
            if (cpu)
                CHECK_OK(kva__context_force_kernel(cpu, g_kernels[kv]));
            CHECK_OK(kva_plan_create(cpu, &p->pd, &plan));
            if (plan && mode == 3) {
                kva__partition_params pp = {3, 8, 4, 7, 50, 40, 64};
                CHECK_OK(kva__cpu_plan_partition(cpu, plan, &pp));
            }
            if (plan) {
                splits += plan->part->num_tasks > 0;
                kva_test_poison(out, KVA_DTYPE_F32, no);
                kva_test_poison(lse, KVA_DTYPE_F32, nl);
                CHECK_OK(kva_attention_run(cpu, plan, p->q, p->cache, sk, out, lse));
                size_t bad =
                    compare_nf("out", out, out_ref, no) + compare_nf("lse", lse, lse_ref, nl);
                CHECK_MSG(bad == 0, "%s (sinks %d): %zu mismatches with %d threads%s, kernel %s",
                          label, use_sinks, bad, thr, mode == 3 ? ", small chunks" : "",
                          g_kernels[kv]);
            }
            kva_plan_destroy(plan);
            kva_context_destroy(cpu);
        }
        least = splits < least ? splits : least;
    }
    free(out_ref);
    free(lse_ref);
    free(out);
    free(lse);
    return least;
}

/* Number of (token, head) rows of [T, H] lse whose value is a written NaN. */
static int count_nan_rows(const problem *p, int use_sinks)
{
    const size_t no = (size_t)p->b.T * P_H * P_D, nl = (size_t)p->b.T * P_H;
    float *out = malloc(no * sizeof(float)), *lse = malloc(nl * sizeof(float));
    kva_plan *plan = NULL;
    int n = 0;
    kva_test_poison(out, KVA_DTYPE_F32, no);
    kva_test_poison(lse, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_plan_create(p->ref, &p->pd, &plan));
    if (plan)
        CHECK_OK(
            kva_attention_run(p->ref, plan, p->q, p->cache, use_sinks ? p->sinks : NULL, out, lse));
    for (size_t i = 0; i < nl; i++)
        n += kva_test_nan_written(lse, KVA_DTYPE_F32, i);
    kva_plan_destroy(plan);
    free(out);
    free(lse);
    return n;
}

/* A NaN in one cached key of a 4000-key decode (and of a chunked prefill whose
 * early rows do not see it): NaN for every row that sees the key. */
static void test_nan_key(void)
{
    /* Quick: the prefill after 900 cached tokens instead of 2400 (its rows
     * are most of this test's work). */
    const int32_t q[] = {1, 100}, s[] = {4000, kva_test_quick() ? 1000 : 2500};
    problem p;
    problem_init(&p, 2, q, s, 11);
    kv_row(&p, 0, 0, 1234, 1)[17] = NAN;     /* decode: heads 2, 3 */
    kv_row(&p, 0, 1, s[1] - 50, 0)[3] = NAN; /* prefill: heads 0, 1 of rows i >= 50 */
    p.pd.causal = 1;
    /* The reference's own answer: 2 decode rows + 50 * 2 prefill rows. */
    CHECK_MSG(count_nan_rows(&p, 0) == 2 + 100, "reference has %d NaN rows", count_nan_rows(&p, 0));
    for (int sk = 0; sk < 2; sk++)
        CHECK(run_problem("NaN key", &p, sk) >= 2);
    /* A window that hides the decode's NaN key from it. */
    p.pd.window_left = 2000;
    CHECK(run_problem("NaN key, window", &p, 1) >= 2);
    problem_free(&p);
}

/* A NaN in one query row, and one in a value element. */
static void test_nan_q_and_v(void)
{
    static const int32_t q[] = {1, 3}, s[] = {4000, 3000};
    problem p;
    problem_init(&p, 2, q, s, 12);
    q_row(&p, 0, 0, 1)[5] = NAN;
    q_row(&p, 1, 2, 3)[60] = NAN;
    kv_row(&p, 1, 1, 700, 0)[9] = NAN; /* out element 9 of heads 0, 1 of request 1 */
    CHECK(count_nan_rows(&p, 1) == 2);
    for (int sk = 0; sk < 2; sk++)
        CHECK(run_problem("NaN q / v", &p, sk) >= 2);
    problem_free(&p);
}

/* Causal ALiBi with slope 1e38: score_j = x + 1e38 (j - pos) is -inf in fp32
 * for j <= pos - 4, so whole chunks see only -inf scores (finite in the fp64
 * reference, whose weights are exactly 0 there as well). */
static void test_neg_inf_chunks(void)
{
    static const int32_t q[] = {1, 40}, s[] = {4000, 1000};
    problem p;
    problem_init(&p, 2, q, s, 13);
    for (int h = 0; h < P_H; h++)
        p.slopes[h] = 1e38f;
    p.pd.alibi_slopes = p.slopes;
    for (int sk = 0; sk < 2; sk++)
        CHECK(run_problem("-inf chunks (ALiBi overflow)", &p, sk) >= 2);
    problem_free(&p);
}

/* q rows whose every score is -inf: channel 7 of q is -inf and channel 7 of
 * every key of kv head 0 is positive. */
static void test_neg_inf_rows(void)
{
    static const int32_t q[] = {1, 5}, s[] = {4000, 3000};
    problem p;
    problem_init(&p, 2, q, s, 14);
    for (int32_t r = 0; r < 2; r++)
        for (int32_t j = 0; j < s[r]; j++) {
            float *k = kv_row(&p, 0, r, j, 0);
            k[7] = fabsf(k[7]) + 0.25f;
        }
    q_row(&p, 0, 0, 1)[7] = -INFINITY;
    q_row(&p, 1, 4, 0)[7] = -INFINITY;
    /* The reference: out 0 and lse = sink with sinks, the empty row (out 0,
     * lse -inf) without. */
    const size_t no = (size_t)p.b.T * P_H * P_D, nl = (size_t)p.b.T * P_H;
    float *out = malloc(no * sizeof(float)), *lse = malloc(nl * sizeof(float));
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(p.ref, &p.pd, &plan));
    for (int sk = 0; sk < 2; sk++) {
        if (plan)
            CHECK_OK(kva_attention_run(p.ref, plan, p.q, p.cache, sk ? p.sinks : NULL, out, lse));
        const int64_t rows[2] = {0 * P_H + 1, (int64_t)(1 + 4) * P_H + 0};
        for (int x = 0; x < 2; x++) {
            const float want = sk ? p.sinks[rows[x] % P_H] : -INFINITY;
            CHECK_MSG(lse[rows[x]] == want && out[rows[x] * P_D] == 0.0f,
                      "reference row %d: lse %g, out[0] %g", (int)rows[x], (double)lse[rows[x]],
                      (double)out[rows[x] * P_D]);
        }
        CHECK(run_problem("-inf rows", &p, sk) >= 2);
    }
    kva_plan_destroy(plan);
    free(out);
    free(lse);
    problem_free(&p);
}

int main(void)
{
    /* Every registry kernel the machine runs, forced on the CPU contexts of
     * run_problem (the other family keeps the dispatcher's choice). */
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(k);
    printf("kernels:");
    for (int32_t v = 0; v < nk; v++)
        if (k[v].runs && k[v].family != KVA__KERNEL_MLA) { /* MLA: tests/test_mla.c */
            g_kernels[g_nkernels++] = k[v].name;
            printf(" %s", k[v].name);
        }
    printf("\n");
    RUN(test_nan_key);
    RUN(test_nan_q_and_v);
    RUN(test_neg_inf_chunks);
    RUN(test_neg_inf_rows);
    return kva_test_finish();
}
