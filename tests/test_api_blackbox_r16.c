/*
 * test_api_blackbox_r16.c - black-box round sixteen (session 44, task
 * api56): promises of the public headers checked where no other test looks,
 * on the reference and CPU backends, outputs poisoned before every run and
 * compared with kvattn.h's formula in double (blackbox_oracle.h):
 *   - several cascade plans alive on one context at once (kvattn.h: a
 *     cascade plan runs on the context that created it), run in interleaved
 *     orders, with plain plans of other shapes made in between, nested and
 *     flat groups, Dv != D, sinks and a soft-cap;
 *   - one plan run on contexts of other thread counts (kvattn.h, Threading:
 *     a context that made a plan of the same descriptor runs it, or one
 *     whose reservation is smaller refuses it and writes nothing), for
 *     split decodes, prefills and kva_mla_run, before and after the plan is
 *     updated (kva_plan_update) to a larger step on its own context;
 *   (MLA at the head sizes' edges and caches past 4 GiB: test_api_blackbox_r16_edges.c);
 *   - kva_plan_update across kinds (kvattn.h: "a plan of any kind ... may
 *     be updated to any other"): one plan taken through MHA (plain, draft
 *     tree, cascade), MLA (layer-level and absorbed), sparse MLA (SEPARATE,
 *     over FP8_DS_MLA rows) and indexer steps in a shuffled order; after
 *     each update the plan runs (the update reserved what its call needs)
 *     and, once a fresh plan of the step is made on the same context, gives
 *     the fresh plan's bytes;
 *   - a packed tree_mask whose padding bits (past each request's q * q
 *     bits, to its byte's end) are all set runs as the clean mask and as
 *     the same tree given by tree_parents (the padding is no row's).
 */
#include "blackbox_oracle.h"
#include "indexer_util.h"
#include "sparse_util.h" /* includes mla_util.h */

/* ---- shared helpers ---- */

/* A batch over a paged cache whose requests' block-table rows are built from
 * shared and own block ids: rows[r] lists request r's blocks. */
typedef struct r16_batch {
    int32_t R, T, stride, dthr;
    int32_t qsl[33], sl[32];
    int32_t bt[2048];
} r16_batch;

/* Request r: q_len q, seq_len s, its first `nshared` blocks from shared[],
 * the rest fresh ids taken from *next. */
static void r16_add(r16_batch *b, int32_t B, int32_t q, int32_t s, const int32_t *shared,
                    int32_t nshared, int32_t *next)
{
    const int32_t r = b->R++;
    CHECK(b->R <= 32 && b->R * b->stride <= 2048);
    b->qsl[r + 1] = b->qsl[r] + q;
    b->sl[r] = s;
    const int32_t nb = (s + B - 1) / B;
    for (int32_t i = 0; i < b->stride; i++)
        b->bt[r * b->stride + i] = i < nb ? (i < nshared ? shared[i] : (*next)++) : -1;
    b->T = b->qsl[r + 1];
}

static kva_plan_desc r16_desc(const r16_batch *b, int32_t B, int32_t H, int32_t Hkv, int32_t D,
                              int32_t Dv, kva_dtype dt)
{
    return (kva_plan_desc){.num_requests = b->R,
                           .query_start_loc = b->qsl,
                           .seq_lens = b->sl,
                           .block_table = b->bt,
                           .block_table_stride = b->stride,
                           .block_size = B,
                           .decode_threshold = b->dthr,
                           .num_heads = H,
                           .num_kv_heads = Hkv,
                           .head_dim = D,
                           .head_dim_v = Dv,
                           .q_dtype = dt,
                           .causal = 1,
                           .window_left = -1};
}

/* Runs plan p (desc pd) on ctx with fresh poison, checks out / lse against
 * the oracle; returns the mismatches. */
static size_t r16_run_check(kva_context *ctx, const kva_plan *p, const kva_plan_desc *pd,
                            const kva_cache *c, const sz_sem *m, const void *q, const float *sinks,
                            const char *label)
{
    const int32_t T = pd->query_start_loc[pd->num_requests], H = pd->num_heads;
    const int32_t Dv = pd->head_dim_v ? pd->head_dim_v : pd->head_dim;
    const size_t no = (size_t)T * H * Dv, es = kva_dtype_size(pd->q_dtype);
    void *out = malloc(no * es + 1);
    float *lse = malloc(sizeof(float) * ((size_t)T * H + 1));
    kva_test_poison(out, pd->q_dtype, no);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    kva_status st = kva_attention_run(ctx, p, q, c, sinks, out, lse);
    CHECK_MSG(st == KVA_STATUS_OK, "%s: %s", label, kva_last_error());
    /* A cascade's two passes round their outputs before the merge rounds
     * again (harness.h's cascade tolerances). */
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(p, &info));
    const kva_dtype dt = pd->q_dtype;
    const int cas = info.num_cascade_groups > 0;
    size_t bad = st == KVA_STATUS_OK
                     ? sz_check_run_tol(ctx, c, pd, m, q, out, lse, dt,
                                        cas ? kva_test_cascade_atol(dt) : kva_test_atol(dt),
                                        cas ? kva_test_cascade_rtol(dt) : kva_test_rtol(dt), label)
                     : 1;
    CHECK_MSG(bad == 0, "%s: %zu mismatches", label, bad);
    free(out);
    free(lse);
    return bad;
}

/* ---- cascade plans side by side on one context ---- */

static void test_cascade_plans_coexist(void)
{
    enum { B = 4, HKV = 2, H = 6, D = 16, DV = 24, NB = 160 };
    const kva_dtype dts[2] = {KVA_DTYPE_F32, KVA_DTYPE_BF16};
    for (int be = 0; be < 2; be++)
        for (int ti = 0; ti < 2; ti++) {
            if (be == 0 && ti == 1)
                continue;
            const kva_dtype dt = dts[ti];
            kva_context *ctx = new_ctx(kBk[be], ti == 0 ? 1 : 3);
            kva_rng rng = {0x5160 + (uint64_t)(be * 7 + ti)};
            kva_cache_desc cd =
                make_desc(NB, B, HKV, D, DV, dt, ti ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD);
            kva_cache *c = NULL;
            CHECK_OK(kva_cache_create(ctx, &cd, &c));
            fill_cache(c, &rng);
            int32_t next = 1;
            const int32_t sharedA[8] = {100, 101, 102, 103, 104, 105, 106, 107};
            const int32_t sharedB[6] = {110, 111, 112, 113, 114, 115};
            const int32_t sharedC[6] = {120, 121, 122, 123, 124, 125};
            const int32_t sharedC2[6] = {120, 121, 130, 131, 132, 133};
            /* A: four decodes over a 5-block prefix, two unshared requests. */
            r16_batch a = {.stride = 12, .dthr = 1};
            for (int32_t i = 0; i < 4; i++)
                r16_add(&a, B, 1, 5 * B + 1 + 3 * i, sharedA, 5, &next);
            r16_add(&a, B, 1, 9, NULL, 0, &next);
            r16_add(&a, B, 5, 13, NULL, 0, &next);
            /* B: speculative decodes (q 3) over a 3-block prefix, one q_len 0 member. */
            r16_batch bb = {.stride = 8, .dthr = 4};
            for (int32_t i = 0; i < 3; i++)
                r16_add(&bb, B, 3, 3 * B + 3 + i * 5, sharedB, 3, &next);
            r16_add(&bb, B, 0, 3 * B + 2, sharedB, 3, &next);
            r16_add(&bb, B, 2, 3 * B + 2, sharedB, 3, &next);
            /* C: nested: 2 shared blocks, two members sharing 2 more, a prefill. */
            r16_batch cc = {.stride = 10, .dthr = 1};
            r16_add(&cc, B, 1, 2 * B + 3, sharedC, 2, &next);
            r16_add(&cc, B, 1, 4 * B + 2, sharedC2, 6, &next);
            r16_add(&cc, B, 1, 6 * B + 1, sharedC2, 6, &next);
            r16_add(&cc, B, 6, 2 * B + 6, sharedC, 2, &next);
            r16_add(&cc, B, 1, 5 * B, sharedC2, 5, &next);
            CHECK(next < 100);
            r16_batch *bs[3] = {&a, &bb, &cc};
            kva_plan_desc pd[3];
            kva_plan *p[3] = {NULL, NULL, NULL};
            void *q[3];
            float sinks[H];
            for (int32_t h = 0; h < H; h++)
                sinks[h] = (float)(kva_rng_unit(&rng) * 2.0 - 1.0);
            for (int i = 0; i < 3; i++) {
                pd[i] = r16_desc(bs[i], B, H, HKV, D, DV, dt);
                pd[i].cascade = KVA_CASCADE_ON;
                pd[i].softcap = i == 1 ? 3.0f : 0.0f;
                CHECK_OK(kva_plan_create(ctx, &pd[i], &p[i]));
                kva_plan_info info;
                CHECK_OK(kva_plan_get_info(p[i], &info));
                CHECK_MSG(info.num_cascade_groups > 0, "batch %d: no cascade groups", i);
                const size_t nq = (size_t)bs[i]->T * H * D;
                q[i] = malloc(nq * kva_dtype_size(dt));
                kva_test_fill(q[i], dt, nq, &rng, 1.0);
            }
            /* A plain plan of another shape made on the same context in between. */
            kva_cache_desc cd2 = make_desc(40, 16, 1, 64, 0, dt, KVA_LAYOUT_NHD);
            kva_cache *c2 = NULL;
            CHECK_OK(kva_cache_create(ctx, &cd2, &c2));
            fill_cache(c2, &rng);
            r16_batch big = {.stride = 8, .dthr = 1};
            int32_t nx = 1;
            r16_add(&big, 16, 40, 100, NULL, 0, &nx);
            r16_add(&big, 16, 1, 120, NULL, 0, &nx);
            kva_plan_desc pdb = r16_desc(&big, 16, 8, 1, 64, 0, dt);
            pdb.cascade = KVA_CASCADE_OFF;
            kva_plan *pb = NULL;
            CHECK_OK(kva_plan_create(ctx, &pdb, &pb));
            void *qb = malloc((size_t)big.T * 8 * 64 * kva_dtype_size(dt));
            kva_test_fill(qb, dt, (size_t)big.T * 8 * 64, &rng, 1.0);
            const sz_sem sem0 = {.scale = 1.0 / sqrt((double)D), .causal = 1, .window = -1};
            const int order[] = {0, 2, 1, 3, 0, 1, 2, 3, 2, 0};
            char label[96];
            for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
                const int i = order[k];
                if (i == 3) {
                    const sz_sem semb = {.scale = 1.0 / 8.0, .causal = 1, .window = -1};
                    snprintf(label, sizeof label, "%s/%s plain step %zu", kva_backend_name(kBk[be]),
                             kva_dtype_name(dt), k);
                    r16_run_check(ctx, pb, &pdb, c2, &semb, qb, NULL, label);
                    continue;
                }
                sz_sem sem = sem0;
                sem.softcap = pd[i].softcap;
                sem.sinks = (k & 1) ? sinks : NULL;
                snprintf(label, sizeof label, "%s/%s cascade %c step %zu",
                         kva_backend_name(kBk[be]), kva_dtype_name(dt), 'A' + i, k);
                r16_run_check(ctx, p[i], &pd[i], c, &sem, q[i], sem.sinks, label);
            }
            /* Destroying one cascade plan leaves the others running. */
            kva_plan_destroy(p[1]);
            p[1] = NULL;
            for (int i = 0; i < 3; i += 2) {
                sz_sem sem = sem0;
                sem.softcap = pd[i].softcap;
                snprintf(label, sizeof label, "%s/%s cascade %c after destroy",
                         kva_backend_name(kBk[be]), kva_dtype_name(dt), 'A' + i);
                r16_run_check(ctx, p[i], &pd[i], c, &sem, q[i], NULL, label);
            }
            for (int i = 0; i < 3; i++) {
                kva_plan_destroy(p[i]);
                free(q[i]);
            }
            kva_plan_destroy(pb);
            free(qb);
            kva_cache_destroy(c2);
            kva_cache_destroy(c);
            kva_context_destroy(ctx);
        }
}

/* ---- one plan on contexts of other thread counts ---- */

/* Runs plan p on ctx: OK and right, or INVALID_ARGUMENT with out / lse
 * untouched (must_run: OK required). */
static void r16_run_or_refuse(kva_context *ctx, const kva_plan *p, const kva_plan_desc *pd,
                              const kva_cache *c, const void *q, int must_run, const char *label)
{
    const int32_t T = pd->query_start_loc[pd->num_requests], H = pd->num_heads;
    const int32_t Dv = pd->head_dim_v ? pd->head_dim_v : pd->head_dim;
    const size_t no = (size_t)T * H * Dv, es = kva_dtype_size(pd->q_dtype);
    void *out = malloc(no * es);
    float *lse = malloc(sizeof(float) * (size_t)T * H);
    kva_test_poison(out, pd->q_dtype, no);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    const uint64_t so = bb_sum(out, no * es), sl = bb_sum(lse, sizeof(float) * (size_t)T * H);
    kva_status st = kva_attention_run(ctx, p, q, c, NULL, out, lse);
    if (getenv("R16_VERBOSE"))
        fprintf(stderr, "%s: %s %s\n", label, kva_status_name(st), kva_last_error());
    if (st == KVA_STATUS_OK) {
        const sz_sem m = {.scale = 1.0 / sqrt((double)pd->head_dim), .causal = 1, .window = -1};
        size_t bad = sz_check_run(ctx, c, pd, &m, q, out, lse, pd->q_dtype, label);
        CHECK_MSG(bad == 0, "%s: %zu mismatches", label, bad);
    } else {
        CHECK_MSG(!must_run && st == KVA_STATUS_INVALID_ARGUMENT, "%s: %s (%s)", label,
                  kva_status_name(st), kva_last_error());
        CHECK_MSG(bb_sum(out, no * es) == so && bb_sum(lse, sizeof(float) * (size_t)T * H) == sl,
                  "%s: refused run wrote", label);
    }
    free(out);
    free(lse);
}

static void test_shared_plan_threads(void)
{
    enum { B = 16, HKV = 2, H = 8, D = 64, NB = 400 };
    const int32_t th[3] = {1, 2, 4};
    kva_rng rng = {0x51616};
    kva_context *cx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_cache_desc cd = make_desc(NB, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(cx, &cd, &c));
    fill_cache(c, &rng);
    /* small: two long decodes (split across threads) and a short prefill;
     * large: more and longer requests, the plan's update. */
    r16_batch sm = {.stride = 40, .dthr = 1}, lg = {.stride = 80, .dthr = 1};
    int32_t next = 0;
    r16_add(&sm, B, 1, 600, NULL, 0, &next);
    r16_add(&sm, B, 1, 350, NULL, 0, &next);
    r16_add(&sm, B, 7, 40, NULL, 0, &next);
    next = 0;
    for (int32_t i = 0; i < 4; i++)
        r16_add(&lg, B, i == 3 ? 33 : 1, 1200 - 170 * i, NULL, 0, &next);
    CHECK(next <= NB);
    kva_plan_desc ps = r16_desc(&sm, B, H, HKV, D, 0, KVA_DTYPE_F32);
    kva_plan_desc pl = r16_desc(&lg, B, H, HKV, D, 0, KVA_DTYPE_F32);
    float *qs = malloc(sizeof(float) * (size_t)sm.T * H * D);
    float *ql = malloc(sizeof(float) * (size_t)lg.T * H * D);
    kva_test_fill(qs, KVA_DTYPE_F32, (size_t)sm.T * H * D, &rng, 1.0);
    kva_test_fill(ql, KVA_DTYPE_F32, (size_t)lg.T * H * D, &rng, 1.0);
    char label[96];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            kva_context *ca = new_ctx(KVA_BACKEND_CPU, th[a]),
                        *cb = new_ctx(KVA_BACKEND_CPU, th[b]);
            kva_plan *pa = NULL, *pb = NULL;
            CHECK_OK(kva_plan_create(ca, &ps, &pa));
            CHECK_OK(kva_plan_create(cb, &ps, &pb)); /* cb's reservation */
            snprintf(label, sizeof label, "plan of %d threads on %d", th[a], th[b]);
            r16_run_or_refuse(cb, pa, &ps, c, qs, a == b, label);
            /* The plan grows on its own context: cb's reservation (the
             * small step's) may no longer hold it. */
            CHECK_OK(kva_plan_update(ca, pa, &pl));
            snprintf(label, sizeof label, "updated plan of %d threads on its own", th[a]);
            r16_run_or_refuse(ca, pa, &pl, c, ql, 1, label);
            snprintf(label, sizeof label, "updated plan of %d threads on %d", th[a], th[b]);
            r16_run_or_refuse(cb, pa, &pl, c, ql, 0, label);
            /* And back: cb's reservation holds the small step again. */
            CHECK_OK(kva_plan_update(ca, pa, &ps));
            snprintf(label, sizeof label, "re-updated plan of %d threads on %d", th[a], th[b]);
            r16_run_or_refuse(cb, pa, &ps, c, qs, a == b, label);
            kva_plan_destroy(pa);
            kva_plan_destroy(pb);
            kva_context_destroy(ca);
            kva_context_destroy(cb);
        }
    free(qs);
    free(ql);
    kva_cache_destroy(c);
    kva_context_destroy(cx);
}

/* ---- kva_plan_update across kinds ---- */

enum {
    UK_MHA,
    UK_TREE,
    UK_CASCADE,
    UK_LONG,
    UK_MLA_LAYER,
    UK_MLA_ABS,
    UK_SPARSE,
    UK_INDEX,
    UK_COUNT
};

typedef struct uk_work {
    kva_plan_desc pd;
    const kva_cache *cache;
    const void *q, *w_uk, *w_uv;
    const int32_t *idx;
    const float *weights;
    size_t out_bytes, lse_n; /* lse_n 0: the call has no lse */
    int kind;
} uk_work;

/* Runs work w with plan p on ctx into out / lse (poisoned first). */
static kva_status uk_run(kva_context *ctx, const kva_plan *p, const uk_work *w, void *out,
                         float *lse)
{
    memset(out, 0xa5, w->out_bytes);
    kva_test_poison(lse, KVA_DTYPE_F32, w->lse_n);
    switch (w->kind) {
    case UK_MLA_LAYER:
        return kva_mla_run(ctx, p, w->q, w->w_uk, w->w_uv, w->cache, out, lse);
    case UK_SPARSE:
        return kva_mla_sparse_run(ctx, p, w->q, w->cache, w->idx, 0, NULL, NULL, out, lse);
    case UK_INDEX:
        return kva_indexer_run(ctx, p, w->q, w->weights, w->cache, out, 0, NULL);
    default:
        return kva_attention_run(ctx, p, w->q, w->cache, NULL, out, lse);
    }
}

static void test_update_across_kinds(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng rng = {0x16e};
    uk_work w[UK_COUNT];
    memset(w, 0, sizeof w);
    /* MHA: a mixed batch; a tree step; a shared-prefix step run as a
     * cascade; long decodes whose split partials need more workspace than
     * any step before them (the chain's third step, an update). */
    enum { B = 8, HKV = 2, H = 6, D = 32, NB = 900 };
    kva_cache_desc cd = make_desc(NB, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND);
    kva_cache *mc = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &mc));
    fill_cache(mc, &rng);
    static r16_batch mb, tb, cb;
    int32_t next = 1;
    mb = (r16_batch){.stride = 20, .dthr = 2};
    r16_add(&mb, B, 1, 77, NULL, 0, &next);
    r16_add(&mb, B, 2, 30, NULL, 0, &next);
    r16_add(&mb, B, 9, 25, NULL, 0, &next);
    next = 1;
    tb = (r16_batch){.stride = 20, .dthr = 8};
    r16_add(&tb, B, 5, 40, NULL, 0, &next);
    r16_add(&tb, B, 3, 3, NULL, 0, &next);
    static const int32_t parents[8] = {-1, 0, 0, 1, -1, -1, 0, 1};
    next = 20;
    cb = (r16_batch){.stride = 20, .dthr = 1};
    const int32_t shared[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    for (int32_t i = 0; i < 6; i++)
        r16_add(&cb, B, 1 + (i == 5) * 4, 12 * B + 3 + i, shared, 12, &next);
    CHECK(next <= NB);
    static r16_batch lb;
    next = 100;
    lb = (r16_batch){.stride = 300, .dthr = 1};
    r16_add(&lb, B, 1, 2300, NULL, 0, &next);
    r16_add(&lb, B, 1, 1900, NULL, 0, &next);
    r16_add(&lb, B, 1, 1500, NULL, 0, &next);
    CHECK(next <= NB);
    r16_batch *mbs[4] = {&mb, &tb, &cb, &lb};
    void *mq[4];
    for (int i = 0; i < 4; i++) {
        w[i].pd = r16_desc(mbs[i], B, H, HKV, D, 0, KVA_DTYPE_F32);
        w[i].cache = mc;
        w[i].kind = i;
        w[i].out_bytes = (size_t)mbs[i]->T * H * D * 4;
        w[i].lse_n = (size_t)mbs[i]->T * H;
        mq[i] = malloc(w[i].out_bytes);
        kva_test_fill(mq[i], KVA_DTYPE_F32, (size_t)mbs[i]->T * H * D, &rng, 1.0);
        w[i].q = mq[i];
    }
    w[UK_TREE].pd.tree_parents = parents;
    w[UK_CASCADE].pd.cascade = KVA_CASCADE_ON;
    /* MLA: the layer-level and the absorbed call over one latent cache. */
    const int32_t mql[3] = {1, 7, 2}, msl[3] = {40, 50, 9};
    mla_case mcase = mla_case_of(16, 64, 16, 32, 24, 8, KVA_DTYPE_F32, 1, 1, 3, mql, msl, 0x16f);
    mla_data md;
    CHECK(mla_data_make(ctx, &mcase, &md));
    w[UK_MLA_LAYER].pd = mla_plan_desc(&mcase, &md, 1);
    w[UK_MLA_ABS].pd = mla_plan_desc(&mcase, &md, 0);
    w[UK_MLA_LAYER].cache = w[UK_MLA_ABS].cache = md.cache;
    w[UK_MLA_LAYER].q = md.q;
    w[UK_MLA_LAYER].w_uk = md.w_uk;
    w[UK_MLA_LAYER].w_uv = md.w_uv;
    void *qabs = malloc((size_t)md.T * 16 * 80 * 4);
    kva_test_fill(qabs, KVA_DTYPE_F32, (size_t)md.T * 16 * 80, &rng, 1.0);
    w[UK_MLA_ABS].q = qabs;
    w[UK_MLA_LAYER].out_bytes = (size_t)md.T * 16 * 24 * 4;
    w[UK_MLA_ABS].out_bytes = (size_t)md.T * 16 * 64 * 4;
    w[UK_MLA_LAYER].lse_n = w[UK_MLA_ABS].lse_n = (size_t)md.T * 16;
    w[UK_MLA_LAYER].kind = UK_MLA_LAYER;
    w[UK_MLA_ABS].kind = UK_MLA_ABS;
    /* Sparse MLA, SEPARATE (its prefills gather their keys into the
     * workspace), over FlashMLA's fp8 rows. */
    sp_case sc = {.H = 8,
                  .Dc = 128,
                  .Dr = 16,
                  .B = 16,
                  .K = 24,
                  .dt = KVA_DTYPE_F32,
                  .quant = KVA_QUANT_FP8_DS_MLA,
                  .mode = KVA_SPARSE_SEPARATE,
                  .thr = 1,
                  .R = 3,
                  .q_len = {1, 20, 3},
                  .seq_len = {60, 200, 30},
                  .unused = 0.1,
                  .dup = 0.1,
                  .seed = 0x170};
    sp_data sd;
    CHECK(sp_data_make(ctx, &sc, &sd));
    w[UK_SPARSE].pd = sp_plan_desc(&sc, &sd);
    w[UK_SPARSE].cache = sd.cache;
    w[UK_SPARSE].q = sd.q;
    w[UK_SPARSE].idx = sd.idx;
    w[UK_SPARSE].out_bytes = (size_t)sd.T * 8 * 128 * 4;
    w[UK_SPARSE].lse_n = (size_t)sd.T * 8;
    w[UK_SPARSE].kind = UK_SPARSE;
    /* The indexer over FP8_TOKEN keys. */
    const int32_t iql[2] = {2, 9}, isl[2] = {30, 70};
    idx_case ic = idx_case_of(8, 32, 16, 16, KVA_DTYPE_F32, 1, 2, iql, isl, 0x171);
    idx_data ix;
    idx_build(&ic, &ix);
    kva_cache_desc icd = idx_cache_desc(&ic, &ix);
    kva_cache *icache = NULL;
    CHECK_OK(kva_cache_create(ctx, &icd, &icache));
    CHECK_OK(kva_cache_write(ctx, icache, ix.total, ix.keys, 0, NULL, 0, KVA_DTYPE_F32, ix.slots));
    w[UK_INDEX].pd = idx_plan_desc(&ic, &ix);
    w[UK_INDEX].cache = icache;
    w[UK_INDEX].q = ix.q;
    w[UK_INDEX].weights = ix.w;
    w[UK_INDEX].out_bytes = (size_t)ix.T * 16 * 4;
    w[UK_INDEX].kind = UK_INDEX;

    static const int order[] = {UK_MHA,       UK_MLA_ABS, UK_LONG,      UK_SPARSE,  UK_INDEX,
                                UK_MLA_LAYER, UK_TREE,    UK_CASCADE,   UK_SPARSE,  UK_MHA,
                                UK_INDEX,     UK_LONG,    UK_MLA_LAYER, UK_CASCADE, UK_TREE,
                                UK_MLA_ABS,   UK_MHA};
    static const char *const names[UK_COUNT] = {
        "MHA", "tree", "cascade", "long MHA", "MLA layer", "MLA absorbed", "sparse MLA", "indexer"};
    kva_plan *p = NULL;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
        const uk_work *x = &w[order[k]];
        char label[96];
        snprintf(label, sizeof label, "step %zu (%s)", k, names[order[k]]);
        kva_status st = p ? kva_plan_update(ctx, p, &x->pd) : kva_plan_create(ctx, &x->pd, &p);
        CHECK_MSG(st == KVA_STATUS_OK, "%s: update: %s", label, kva_last_error());
        if (st != KVA_STATUS_OK)
            break;
        unsigned char *o1 = malloc(x->out_bytes), *o2 = malloc(x->out_bytes);
        unsigned char *of = malloc(x->out_bytes);
        float *l1 = malloc(sizeof(float) * (x->lse_n + 1)),
              *l2 = malloc(sizeof(float) * (x->lse_n + 1));
        float *lf = malloc(sizeof(float) * (x->lse_n + 1));
        /* The updated plan runs before any fresh plan of this step exists. */
        st = uk_run(ctx, p, x, o1, l1);
        CHECK_MSG(st == KVA_STATUS_OK, "%s: run of the updated plan: %s", label, kva_last_error());
        kva_plan *f = NULL;
        CHECK_OK(kva_plan_create(ctx, &x->pd, &f));
        kva_plan_info ia, ib;
        CHECK_OK(kva_plan_get_info(p, &ia));
        CHECK_OK(kva_plan_get_info(f, &ib));
        CHECK_MSG(memcmp(&ia, &ib, sizeof ia) == 0, "%s: info differs from a fresh plan's", label);
        CHECK_OK(uk_run(ctx, f, x, of, lf));
        CHECK_OK(uk_run(ctx, p, x, o2, l2));
        CHECK_MSG(memcmp(o2, of, x->out_bytes) == 0 &&
                      memcmp(l2, lf, sizeof(float) * x->lse_n) == 0,
                  "%s: the updated plan's output differs from a fresh plan's", label);
        /* The first run (the context's workspace as the update left it) is
         * right too: the same values up to the split of the keys. */
        if (st == KVA_STATUS_OK) {
            const size_t n = x->kind == UK_INDEX ? 0 : x->out_bytes / 4;
            size_t bad =
                kva_test_compare_f32(label, (const float *)o1, (const float *)of, n, 2e-5, 2e-5) +
                kva_test_compare_f32(label, l1, lf, x->lse_n, 2e-5, 2e-5);
            if (x->kind == UK_INDEX)
                bad += memcmp(o1, of, x->out_bytes) != 0;
            CHECK_MSG(bad == 0, "%s: the first run differs", label);
        }
        kva_plan_destroy(f);
        free(o1), free(o2), free(of), free(l1), free(l2), free(lf);
    }
    kva_plan_destroy(p);
    for (int i = 0; i < 4; i++)
        free(mq[i]);
    free(qabs);
    mla_data_free(&md);
    sp_data_free(&sd);
    idx_free(&ix);
    kva_cache_destroy(icache);
    kva_cache_destroy(mc);
    kva_context_destroy(ctx);
}

/* ---- tree masks with their padding bits set ---- */

static void test_tree_mask_padding(void)
{
    enum { B = 4, H = 3, HKV = 1, D = 16 };
    /* Requests of 3, 1, 5 and 2 tree tokens (9, 1, 25 and 4 bits: padding
     * of 7, 7, 7 and 4 bits), after contexts of 4, 0, 9 and 1 keys. */
    const int32_t qsl[5] = {0, 3, 4, 9, 11}, sl[4] = {7, 1, 14, 3};
    const int32_t parents[11] = {-1, 0, 0, -1, -1, 0, 1, 1, -1, -1, 0};
    int32_t bt[4 * 4];
    for (int i = 0; i < 16; i++)
        bt[i] = i;
    uint8_t clean[16], padded[16];
    memset(clean, 0, sizeof clean);
    int32_t byte = 0;
    for (int r = 0; r < 4; r++) {
        const int32_t q = qsl[r + 1] - qsl[r];
        for (int32_t i = 0; i < q; i++)
            for (int32_t k = i; k >= 0; k = parents[qsl[r] + k]) {
                clean[byte + (i * q + k) / 8] |= (uint8_t)(1u << ((i * q + k) % 8));
                if (parents[qsl[r] + k] < 0)
                    break;
            }
        memcpy(padded + byte, clean + byte, (size_t)(q * q + 7) / 8);
        for (int32_t e = q * q; e < (q * q + 7) / 8 * 8; e++)
            padded[byte + e / 8] |= (uint8_t)(1u << (e % 8));
        byte += (q * q + 7) / 8;
    }
    kva_rng rng = {0x1d};
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 2);
        kva_cache_desc cd = make_desc(16, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        fill_cache(c, &rng);
        float q[11 * H * D], out[3][11 * H * D], lse[3][11 * H];
        kva_test_fill(q, KVA_DTYPE_F32, 11 * H * D, &rng, 1.0);
        for (int v = 0; v < 3; v++) {
            kva_plan_desc pd = {.num_requests = 4,
                                .query_start_loc = qsl,
                                .seq_lens = sl,
                                .block_table = bt,
                                .block_table_stride = 4,
                                .block_size = B,
                                .decode_threshold = 8,
                                .num_heads = H,
                                .num_kv_heads = HKV,
                                .head_dim = D,
                                .q_dtype = KVA_DTYPE_F32,
                                .causal = 1,
                                .window_left = -1};
            if (v == 0)
                pd.tree_parents = parents;
            else
                pd.tree_mask = v == 1 ? clean : padded;
            kva_plan *p = NULL;
            CHECK_OK(kva_plan_create(ctx, &pd, &p));
            kva_test_poison(out[v], KVA_DTYPE_F32, 11 * H * D);
            kva_test_poison(lse[v], KVA_DTYPE_F32, 11 * H);
            CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, out[v], lse[v]));
            kva_plan_destroy(p);
        }
        for (int v = 1; v < 3; v++)
            CHECK_MSG(memcmp(out[v], out[0], sizeof out[0]) == 0 &&
                          memcmp(lse[v], lse[0], sizeof lse[0]) == 0,
                      "%s: the %s mask differs from tree_parents", kva_backend_name(kBk[b]),
                      v == 1 ? "clean" : "padded");
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

int main(void)
{
    RUN(test_cascade_plans_coexist);
    RUN(test_shared_plan_threads);
    RUN(test_update_across_kinds);
    RUN(test_tree_mask_padding);
    return kva_test_finish();
}
