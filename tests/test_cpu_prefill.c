/*
 * test_cpu_prefill.c - the tiled prefill kernels (prefill_avx2,
 * prefill_avx512, prefill_avx512bf16: AVX-512 + BF16 scores;
 * src/attn/cpu/prefill_tiled.inc) against the
 * reference backend on the shapes their fast paths specialize.
 *
 * Each case builds one random batch (fixed seed, paged cache with shuffled
 * block tables), runs the reference once, then runs the CPU backend with the
 * dispatcher's choice and with each tiled kernel that runs here forced on the
 * prefill-shaped items (kva__context_force_kernel), outputs
 * and lse poisoned with NaN before every run, compared with the per-dtype
 * tolerances of harness.h:
 *   - head sizes 128, 64, 256 and 40 / 24 (not a multiple of the vector
 *     length: the q and output transposes' scalar edges), GQA 1, 3, 4 and 12
 *     (row counts that are not a multiple of 8 or 16), prompts of 1 to 300
 *     tokens (tiles of 96 keys: full, partial and tail tiles), f32/f16/bf16;
 *   - long contexts (a chunk of 40-96 queries after 2000-4000 cached
 *     tokens: dozens of fully visible tiles whose max comes from the score
 *     micro-kernels, base-2 running max and sums over thousands of keys);
 *   - wide score ranges (scale 0.5 and 3 with unit-variance q and K: scores
 *     hundreds apart, so 2^x underflows to exactly 0 and the running max
 *     jumps by more than 126 between tiles);
 *   - sliding window, soft-cap, ALiBi and sinks, alone and together, after a
 *     cached context, in NHD and HND caches;
 *   - split items (a partition forced to split long rows into key chunks),
 *     whose partials and lse (base-2 max times ln 2) the merge combines;
 *   - non-causal plans (every row sees the same keys: the cascade's prefix
 *     pass), whose items take up to KVA_CPU_TILE_ROWS rows.
 * KVA_TEST_QUICK=1 (the sanitizer run) runs one dtype of each shape and mask
 * case (in turn), bf16 only for the long contexts, and shorter contexts
 * (fewer fully visible tiles of the same code) for the long contexts, the
 * split items and the non-causal plans: every case's kernels, dtypes and
 * masks still run.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

typedef struct pcase {
    int32_t H, Hkv, D, Dv;
    kva_dtype dt;
    int32_t R;
    int32_t q_len[3], ctx[3]; /* per request: new tokens, cached tokens before them */
    int32_t window;           /* window_left, -1 none */
    float softcap, scale;     /* 0: none / 1/sqrt(D) */
    int alibi, sinks, split;
    int noncausal; /* causal = 0 */
    kva_layout layout;
    uint64_t seed;
} pcase;

static const char *dt_name(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? "f32" : dt == KVA_DTYPE_F16 ? "f16" : "bf16";
}

static void print_case(const pcase *c, const char *kernel)
{
    fprintf(stderr,
            "  case: H=%d Hkv=%d D=%d Dv=%d %s R=%d q=%d,%d,%d ctx=%d,%d,%d window=%d softcap=%g "
            "scale=%g alibi=%d sinks=%d split=%d layout=%d seed=%llu kernel=%s\n",
            c->H, c->Hkv, c->D, c->Dv, dt_name(c->dt), c->R, c->q_len[0], c->q_len[1], c->q_len[2],
            c->ctx[0], c->ctx[1], c->ctx[2], c->window, (double)c->softcap, (double)c->scale,
            c->alibi, c->sinks, c->split, (int)c->layout, (unsigned long long)c->seed,
            kernel ? kernel : "dispatcher");
}

/* Kernels a case runs: NULL (the dispatcher) and every tiled prefill kernel
 * that runs here (the prefill family but the portable kernel). */
static int kernels(const char **v)
{
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(k);
    int n = 0;
    v[n++] = NULL;
    for (int32_t i = 0; i < nk; i++)
        if (k[i].runs && k[i].family == KVA__KERNEL_PREFILL &&
            strcmp(k[i].name, "prefill_portable"))
            v[n++] = k[i].name;
    return n;
}

static void run_pcase(const pcase *c)
{
    kva_rng rng = {c->seed};
    int32_t seq[3];
    for (int32_t r = 0; r < c->R; r++)
        seq[r] = c->ctx[r] + c->q_len[r];
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, c->R, c->q_len, seq, 16, 3, 0);
    const int32_t H = c->H, D = c->D, Dv = c->Dv, T = b.T;
    const size_t esz = kva_dtype_size(c->dt);

    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(&b, ref, &rng, c->Hkv, D, Dv, c->dt, c->layout, &cache));

    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, c->Hkv, D, Dv, c->dt);
    pd.window_left = c->window;
    pd.causal = !c->noncausal;
    pd.softcap = c->softcap;
    pd.scale = c->scale;
    float *slopes = malloc(sizeof(float) * (size_t)H);
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    }
    pd.alibi_slopes = c->alibi ? slopes : NULL;
    const float *sk = c->sinks ? sinks : NULL;

    const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
    void *q = malloc(nq * esz + 1);
    void *out_ref = malloc(no * esz + 1), *out_cpu = malloc(no * esz + 1);
    float *lse_ref = malloc(nl * sizeof(float) + 1), *lse_cpu = malloc(nl * sizeof(float) + 1);
    kva_test_fill_uniform(q, c->dt, nq, &rng);

    kva_plan *pref = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    kva_test_poison(out_ref, c->dt, no);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    if (pref)
        CHECK_OK(kva_attention_run(ref, pref, q, cache, sk, out_ref, lse_ref));

    const char *vs[KVA_TEST_MAX_KERNELS + 1];
    const int nv = kernels(vs);
    for (int i = 0; i < nv && pref; i++) {
        kva_plan *pcpu = NULL;
        if (cpu)
            CHECK_OK(kva__context_force_kernel(cpu, vs[i])); /* NULL: none */
        CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
        if (!pcpu)
            break;
        if (c->split) {
            /* Rows of more than a few hundred keys split into chunks. */
            kva__partition_params pp = {3, KVA_CPU_MAX_ROWS, KVA_CPU_PREFILL_ROWS, 32, 64, 16, 64};
            CHECK_OK(kva__cpu_plan_partition(cpu, pcpu, &pp));
            CHECK_MSG(pcpu->part->num_tasks > 0, "the forced partition split nothing");
        }
        if (c->noncausal &&
            strcmp(kva__cpu_plan_kernel(pcpu, KVA__KERNEL_PREFILL), "prefill_portable") != 0) {
            /* The tiled kernels get items of more than KVA_CPU_MAX_ROWS rows. */
            int32_t most = 0;
            for (int32_t k = 0; k < pcpu->part->num_items; k++) {
                const kva__work_item *it = &pcpu->part->items[k];
                most = it->nq * it->nh > most ? it->nq * it->nh : most;
            }
            CHECK_MSG(most > KVA_CPU_MAX_ROWS, "items of %d rows at most", (int)most);
        }
        kva_test_poison(out_cpu, c->dt, no);
        kva_test_poison(lse_cpu, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(cpu, pcpu, q, cache, sk, out_cpu, lse_cpu));
        size_t bad = kva_test_compare("out", out_cpu, out_ref, c->dt, no, kva_test_atol(c->dt),
                                      kva_test_rtol(c->dt));
        bad += kva_test_compare_f32("lse", lse_cpu, lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d)", bad, (int)T);
        if (bad)
            print_case(c, vs[i]);
        kva_plan_destroy(pcpu);
    }

    free(q);
    free(out_ref);
    free(out_cpu);
    free(lse_ref);
    free(lse_cpu);
    free(slopes);
    free(sinks);
    kva_plan_destroy(pref);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

static pcase base_case(int32_t H, int32_t Hkv, int32_t D, int32_t Dv, kva_dtype dt, uint64_t seed)
{
    pcase c;
    memset(&c, 0, sizeof c);
    c.H = H;
    c.Hkv = Hkv;
    c.D = D;
    c.Dv = Dv;
    c.dt = dt;
    c.R = 1;
    c.window = -1;
    c.layout = KVA_LAYOUT_NHD;
    c.seed = seed;
    return c;
}

/* Head sizes x GQA groups x dtypes, fresh prompts of 1-300 tokens. */
static void test_shapes(void)
{
    static const int32_t dims[4][2] = {{128, 128}, {64, 64}, {256, 256}, {40, 24}};
    static const int32_t heads[4][2] = {{8, 2}, {12, 1}, {6, 2}, {3, 3}};
    static const int32_t lens[] = {1, 16, 95, 96, 97, 150, 193, 300};
    kva_rng rng = {31};
    int i = 0;
    for (int di = 0; di < 4; di++)
        for (int hi = 0; hi < 4; hi++)
            for (int t = 0; t < 3; t++, i++) {
                /* Quick: one dtype per (dims, heads) pair, each dtype in turn. */
                if (kva_test_quick() && t != (di + hi) % 3)
                    continue;
                pcase c = base_case(heads[hi][0], heads[hi][1], dims[di][0], dims[di][1],
                                    (kva_dtype)t, 100 + (uint64_t)i);
                c.R = 2;
                c.q_len[0] = lens[kva_rng_int(&rng, 0, 7)];
                c.q_len[1] = kva_rng_int(&rng, 1, 300);
                run_pcase(&c);
            }
}

/* A chunk of queries after thousands of cached tokens. */
static void test_long_context(void)
{
    const int quick = kva_test_quick();
    for (int t = quick ? 2 : 0; t < 3; t++) { /* quick: bf16 only */
        pcase c = base_case(8, 2, 128, 128, (kva_dtype)t, 200 + (uint64_t)t);
        c.R = 2;
        c.q_len[0] = 40;
        c.ctx[0] = quick ? 2000 : 4000;
        c.q_len[1] = 96;
        c.ctx[1] = quick ? 1000 : 2000;
        run_pcase(&c);
    }
}

/* Scores far apart: 2^x underflows to exact zeros, maxima jump. Scale 1.5
 * (scores of standard deviation 17 over 900 keys: some rows span more than
 * 87 = 126 ln 2) only in bf16: the fp32 rounding of scores that large
 * (|s| ~ 60, error ~ 1e-5 absolute, hence relative in p) exceeds the f32
 * output tolerance for any fp32 accumulation, the old kernels' included. */
static void test_wide_scores(void)
{
    static const float scales[3] = {0.5f, 0.5f, 1.5f};
    static const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_BF16};
    for (int s = 0; s < 3; s++) {
        pcase c = base_case(8, 2, 128, 128, dts[s], 300 + (uint64_t)s);
        c.R = 2;
        c.q_len[0] = 200;
        c.q_len[1] = 64;
        c.ctx[1] = 700;
        c.scale = scales[s];
        run_pcase(&c);
    }
}

/* Window, soft-cap, ALiBi, sinks (alone, then together) after a context. */
static void test_masks_after_context(void)
{
    for (int m = 0; m < 5; m++)
        for (int t = 0; t < 3; t++) {
            if (kva_test_quick() && t != m % 3) /* quick: each mask once, dtypes in turn */
                continue;
            pcase c = base_case(8, 2, 64, 64, (kva_dtype)t, 400 + (uint64_t)(m * 3 + t));
            c.R = 3;
            c.q_len[0] = 150;
            c.ctx[0] = 500;
            c.q_len[1] = 100;
            c.q_len[2] = 33;
            c.ctx[2] = 1000;
            c.window = m == 0 || m == 4 ? 130 : -1;
            c.softcap = m == 1 || m == 4 ? 5.0f : 0.0f;
            c.alibi = m == 2 || m == 4;
            c.sinks = m == 3 || m == 4;
            c.layout = t == 1 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            run_pcase(&c);
        }
}

/* Items split into key chunks: partials, lse and the merge. */
static void test_splits(void)
{
    const int quick = kva_test_quick(); /* quick: rows of 700 / 330 keys */
    for (int t = 0; t < 3; t++) {
        pcase c = base_case(8, 2, 128, 128, (kva_dtype)t, 500 + (uint64_t)t);
        c.R = 2;
        c.q_len[0] = 24;
        c.ctx[0] = quick ? 700 : 1500;
        c.q_len[1] = 70;
        c.ctx[1] = quick ? 300 : 600;
        c.sinks = t != 1;
        c.softcap = t == 2 ? 8.0f : 0.0f;
        run_pcase(&c);
    }
}

/* Non-causal plans: 64 and 150 queries of GQA 8 (tiles of 256 rows and a
 * remainder), after cached keys, with sinks and soft-cap in turn. */
static void test_same_keys(void)
{
    const int quick = kva_test_quick(); /* quick: 3 and 2 key tiles */
    for (int t = 0; t < 3; t++) {
        pcase c = base_case(16, 2, 128, 128, (kva_dtype)t, 600 + (uint64_t)t);
        c.R = 2;
        c.q_len[0] = 64;
        c.ctx[0] = quick ? 200 : 1200;
        c.q_len[1] = 150;
        c.ctx[1] = quick ? 40 : 300;
        c.noncausal = 1;
        c.sinks = t != 1;
        c.softcap = t == 2 ? 8.0f : 0.0f;
        run_pcase(&c);
    }
}

int main(void)
{
    const char *vs[KVA_TEST_MAX_KERNELS + 1];
    const int nv = kernels(vs);
    printf("tiled prefill kernels run here:");
    for (int i = 1; i < nv; i++)
        printf(" %s", vs[i]);
    printf("%s\n", nv == 1 ? " none (portable ISA level): only the dispatcher's choice" : "");
    RUN(test_shapes);
    RUN(test_long_context);
    RUN(test_wide_scores);
    RUN(test_masks_after_context);
    RUN(test_splits);
    RUN(test_same_keys);
    return kva_test_finish();
}
