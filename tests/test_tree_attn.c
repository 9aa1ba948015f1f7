/*
 * test_tree_attn.c - tree verification (kva_plan_desc.tree_parents and
 * .tree_mask) on the reference and CPU backends.
 *
 *   - The reference against an independent construction: each tree row
 *     equals a plain causal decode over the committed keys followed by its
 *     own path (root .. itself) gathered into a new key list (ragged run).
 *   - Chains equal ordinary causal speculative decoding (no tree), on ref
 *     and CPU.
 *   - Stars, a depth-8 tree and random trees, given as parents and as
 *     FlashInfer-packed masks (both must agree), CPU with every kernel that
 *     runs here forced, against the reference, in a paged cache with several
 *     requests (context lengths at and off the 32-key chunk edges), f32 /
 *     f16 / bf16, NHD / HND, with soft-cap and sinks; outputs poisoned.
 *   - Bad trees: a status naming the problem, no plan.
 * KVA_TEST_QUICK=1 runs the first 8 of the 24 random-tree cases.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "tree_util.h"

#include <math.h>
#include <stdlib.h>

static kva_context *ctx_of(kva_backend be)
{
    kva_context_desc cd = {be, be == KVA_BACKEND_CPU ? 2 : 0, 0};
    kva_context *c = NULL;
    CHECK_OK(kva_context_create(&cd, &c));
    return c;
}

/* Ragged run of R requests (q_lens, seq_lens) on ctx with an optional tree;
 * out [T, H, D] f32. */
static void run_ragged(kva_context *ctx, int32_t R, const int32_t *ql, const int32_t *sl,
                       const int32_t *parents, int32_t H, int32_t Hkv, int32_t D, const float *q,
                       const float *k, const float *v, float *out, float *lse)
{
    int32_t qsl[9] = {0};
    for (int32_t r = 0; r < R; r++)
        qsl[r + 1] = qsl[r] + ql[r];
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = sl;
    pd.decode_threshold = KVA_MAX_TREE_TOKENS;
    pd.num_heads = H;
    pd.num_kv_heads = Hkv;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.causal = 1;
    pd.window_left = -1;
    pd.tree_parents = parents;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    kva_test_poison(out, KVA_DTYPE_F32, (size_t)qsl[R] * H * D);
    if (p)
        CHECK_OK(kva_attention_run_ragged(ctx, p, q, k, v, NULL, out, lse));
    kva_plan_destroy(p);
}

/* Each tree row equals a causal decode over the committed keys plus its path. */
static void test_ref_paths(void)
{
    const int32_t H = 4, Hkv = 2, D = 32, c = 45, q = 16;
    kva_rng rng = {3};
    const int32_t s = c + q;
    float *k = malloc(sizeof(float) * (size_t)s * Hkv * D);
    float *v = malloc(sizeof(float) * (size_t)s * Hkv * D);
    float *qv = malloc(sizeof(float) * (size_t)q * H * D);
    float *out = malloc(sizeof(float) * (size_t)q * H * D), one[4 * 32];
    float *kp = malloc(sizeof(float) * (size_t)s * Hkv * D);
    float *vp = malloc(sizeof(float) * (size_t)s * Hkv * D);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)s * Hkv * D, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)s * Hkv * D, &rng);
    kva_test_fill_uniform(qv, KVA_DTYPE_F32, (size_t)q * H * D, &rng);
    kva_context *ref = ctx_of(KVA_BACKEND_REF);
    for (int kind = 0; kind < 4; kind++) {
        int32_t par[16];
        make_tree(kind, q, &rng, par);
        run_ragged(ref, 1, &q, &s, par, H, Hkv, D, qv, k, v, out, NULL);
        for (int32_t i = 0; i < q; i++) {
            /* The path root .. i, in index order (a parent comes before its child). */
            int32_t path[16], n = 0;
            for (int32_t t = i; t >= 0; t = par[t])
                path[n++] = t;
            const size_t row = (size_t)Hkv * D;
            memcpy(kp, k, sizeof(float) * row * c);
            memcpy(vp, v, sizeof(float) * row * c);
            for (int32_t x = 0; x < n; x++) {
                memcpy(kp + row * (c + x), k + row * (c + path[n - 1 - x]), sizeof(float) * row);
                memcpy(vp + row * (c + x), v + row * (c + path[n - 1 - x]), sizeof(float) * row);
            }
            const int32_t one_q = 1, one_s = c + n;
            run_ragged(ref, 1, &one_q, &one_s, NULL, H, Hkv, D, qv + (size_t)i * H * D, kp, vp, one,
                       NULL);
            const size_t bad = kva_test_compare("out", out + (size_t)i * H * D, one, KVA_DTYPE_F32,
                                                (size_t)H * D, 1e-6, 1e-6);
            CHECK_MSG(bad == 0, "tree kind %d row %d differs from its path's decode", kind, (int)i);
        }
    }
    kva_context_destroy(ref);
    free(k), free(v), free(qv), free(out), free(kp), free(vp);
}

typedef struct tcase {
    int32_t R, H, Hkv, D, B;
    int32_t q[4], ctx[4];
    int kind[4];
    kva_dtype dt;
    kva_layout layout;
    float softcap;
    int sinks;
    uint64_t seed;
} tcase;

/* Runs a paged tree case on ref (parents), ref (packed mask), the CPU with every
 * kernel, and, for chains, ref and CPU without a tree. */
static void run_tcase(const tcase *c)
{
    kva_rng rng = {c->seed};
    int32_t seq[4], par[4 * KVA_MAX_TREE_TOKENS];
    int32_t t0 = 0, all_chain = 1;
    for (int32_t r = 0; r < c->R; r++) {
        seq[r] = c->ctx[r] + c->q[r];
        make_tree(c->kind[r], c->q[r], &rng, par + t0);
        all_chain &= c->kind[r] == TREE_CHAIN;
        t0 += c->q[r];
    }
    uint8_t mask[4 * KVA_MAX_TREE_TOKENS * KVA_MAX_TREE_TOKENS / 8 + 4];
    pack_mask(c->R, c->q, par, mask);
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, c->R, c->q, seq, c->B, 2, 0);
    const int32_t H = c->H, D = c->D, T = b.T;
    kva_context *ref = ctx_of(KVA_BACKEND_REF), *cpu = ctx_of(KVA_BACKEND_CPU);
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(&b, ref, &rng, c->Hkv, D, D, c->dt, c->layout, &cache));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, c->Hkv, D, D, c->dt);
    pd.decode_threshold = c->seed % 2 ? KVA_MAX_TREE_TOKENS : 0; /* tiles of either kind */
    pd.softcap = c->softcap;
    pd.tree_parents = par;
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++)
        sinks[h] = (float)kva_rng_normal(&rng);
    const float *sk = c->sinks ? sinks : NULL;
    const size_t es = kva_dtype_size(c->dt), n = (size_t)T * H * D, nl = (size_t)T * H;
    void *q = malloc(n * es), *want = malloc(n * es), *got = malloc(n * es);
    float *lw = malloc(nl * sizeof(float)), *lg = malloc(nl * sizeof(float));
    kva_test_fill_uniform(q, c->dt, n, &rng);

    kva_plan *pr = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pr));
    kva_test_poison(want, c->dt, n);
    kva_test_poison(lw, KVA_DTYPE_F32, nl);
    if (pr && cache)
        CHECK_OK(kva_attention_run(ref, pr, q, cache, sk, want, lw));

    /* Every other way of running it must match: (backend, tree form, kernel). */
    const char *vs[KVA_TEST_MAX_KERNELS + 1];
    const int nv = kva_test_cpu_runnable(vs);
    for (int w = -2; w < nv && pr && cache; w++) {
        kva_context *ctx = w < 0 ? ref : cpu;
        kva_plan_desc wd = pd;
        if (w == -2) { /* the reference with the packed mask */
            wd.tree_parents = NULL;
            wd.tree_mask = mask;
        } else if (w == -1) { /* chains: no tree at all */
            if (!all_chain)
                continue;
            wd.tree_parents = NULL;
        } else {
            CHECK_OK(kva__context_force_kernel(cpu, vs[w]));
            if (w % 2)
                wd.tree_parents = NULL, wd.tree_mask = mask;
        }
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(ctx, &wd, &p));
        if (!p)
            continue;
        kva_test_poison(got, c->dt, n);
        kva_test_poison(lg, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(ctx, p, q, cache, sk, got, lg));
        size_t bad = kva_test_compare("out", got, want, c->dt, n, kva_test_atol(c->dt),
                                      kva_test_rtol(c->dt));
        bad += kva_test_compare_f32("lse", lg, lw, nl, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "seed %llu: way %d (%s): %zu mismatches", (unsigned long long)c->seed,
                  w, w >= 0 && vs[w] ? vs[w] : "-", bad);
        kva_plan_destroy(p);
    }
    CHECK_OK(kva__context_force_kernel(cpu, NULL));
    kva_plan_destroy(pr);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_test_batch_free(&b);
    free(q), free(want), free(got), free(lw), free(lg), free(sinks);
}

static void test_trees(void)
{
    static const int32_t ctxs[] = {0, 31, 32, 33, 200, 1000, 4095};
    kva_rng rng = {17};
    /* Quick: the first 8 cases (every R, H, D, B, dtype and layout, the
     * 64-token tree, soft-cap and sinks occur among them). */
    const int n = kva_test_quick() ? 8 : 24;
    for (int i = 0; i < n; i++) {
        tcase c;
        memset(&c, 0, sizeof c);
        c.R = 1 + i % 3;
        c.H = i % 2 ? 8 : 12;
        c.Hkv = i % 2 ? 2 : 4;
        c.D = i % 4 < 2 ? 64 : 128;
        c.B = i % 3 == 1 ? 5 : 16;
        for (int32_t r = 0; r < c.R; r++) {
            c.kind[r] = (i + r) % 4;
            c.q[r] = c.kind[r] == TREE_DEPTH8 ? kva_rng_int(&rng, 8, 20) : kva_rng_int(&rng, 1, 24);
            c.ctx[r] = ctxs[kva_rng_int(&rng, 0, 6)];
        }
        if (i == 5)
            c.q[0] = KVA_MAX_TREE_TOKENS; /* the largest tree: 64 bits per row */
        c.dt = (kva_dtype)(i % 3);
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.softcap = i % 5 == 3 ? 10.0f : 0.0f;
        c.sinks = i % 4 == 2;
        c.seed = 500 + (uint64_t)i;
        run_tcase(&c);
    }
}

/* Bad trees: status + message, *out untouched. */
static void test_bad_trees(void)
{
    const int32_t ql[2] = {4, 3}, sl[2] = {40, 10};
    kva_rng rng = {9};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 2, ql, sl, 16, 1, 0);
    for (int be = 0; be < 2; be++) {
        kva_context *ctx = ctx_of(be ? KVA_BACKEND_CPU : KVA_BACKEND_REF);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 4, 2, 32, 32, KVA_DTYPE_F32);
        pd.decode_threshold = 8;
        int32_t par[7] = {-1, 0, 0, 1, -1, 0, 1};
        const int32_t okq[2] = {4, 3};
        uint8_t mask[4];
        pack_mask(2, okq, par, mask);
        kva_plan *sentinel = (kva_plan *)&pd, *p = sentinel;
#define BAD(st, text)                                                                              \
    do {                                                                                           \
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), st);                                           \
        CHECK_ERROR_MENTIONS(text);                                                                \
        CHECK(p == sentinel);                                                                      \
    } while (0)
        pd.tree_parents = par;
        par[3] = 3; /* its own index */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "tree_parents[3] = 3");
        par[3] = 5; /* later token */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "tree_parents[3] = 5");
        par[3] = -2; /* out of range */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "tree_parents[3] = -2");
        par[3] = 1;
        par[6] = 2; /* request 1's token 2 naming itself */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "tree_parents[6] = 2");
        par[6] = 1;
        pd.tree_mask = mask; /* both forms */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "both");
        pd.tree_parents = NULL;
        mask[0] &= (uint8_t) ~(1u << 5); /* request 0, row 1 without its diagonal (bit 5) */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "row 1 lacks its diagonal");
        pack_mask(2, okq, par, mask);
        mask[0] |= 1u << 1; /* row 0 sees token 1 */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "row 0 sees token 1");
        pack_mask(2, okq, par, mask);
        mask[2] &= (uint8_t)~1u; /* request 1 starts at byte 2: its row 0 diagonal */
        BAD(KVA_STATUS_INVALID_ARGUMENT, "request 1: row 0 lacks");
        pack_mask(2, okq, par, mask);
        pd.window_left = 5;
        BAD(KVA_STATUS_UNSUPPORTED, "window_left (5)");
        pd.window_left = -1;
        pd.causal = 0;
        BAD(KVA_STATUS_UNSUPPORTED, "causal");
        pd.causal = 1;
        /* The packed form is valid once repaired. */
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        CHECK(p != sentinel && p != NULL);
        kva_plan_destroy(p);
#undef BAD
        kva_context_destroy(ctx);
    }
    /* More than KVA_MAX_TREE_TOKENS tokens. */
    const int32_t bq = KVA_MAX_TREE_TOKENS + 1, bs = 100;
    kva_test_batch bb;
    kva_test_batch_init(&bb, &rng, 1, &bq, &bs, 16, 1, 0);
    kva_context *ctx = ctx_of(KVA_BACKEND_CPU);
    kva_plan_desc pd = kva_test_batch_plan_desc(&bb, 4, 2, 32, 32, KVA_DTYPE_F32);
    pd.decode_threshold = 128;
    int32_t par[KVA_MAX_TREE_TOKENS + 1];
    make_tree(TREE_CHAIN, bq, &rng, par);
    pd.tree_parents = par;
    kva_plan *p = NULL;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("KVA_MAX_TREE_TOKENS");
    CHECK(p == NULL);
    kva_context_destroy(ctx);
    kva_test_batch_free(&bb);
    kva_test_batch_free(&b);
}

int main(void)
{
    RUN(test_bad_trees);
    RUN(test_ref_paths);
    RUN(test_trees);
    return kva_test_finish();
}
