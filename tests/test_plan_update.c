/*
 * test_plan_update.c - kva_plan_update (re-planning a plan in place) on the
 * reference and CPU backends, and the grid partition's rebuild in a reused
 * partition (what the CUDA plan's update does).
 *
 *   - A plan updated through a sequence of random steps (decodes, speculative
 *     decodes, chunked and fresh prefills; R growing and shrinking; causal or
 *     not, windows, ALiBi, cascade on shared prefixes or off) equals, after
 *     every step, a plan created fresh from the same descriptor: the info,
 *     the workspace, the host copies, the partition item for item, and the
 *     attention outputs bit for bit (outputs poisoned before each run).
 *   - Bad descriptors (negative R, a negative block id, a bad cascade
 *     grouping, NULL arrays), a context of another backend and NULL
 *     arguments get their status and change nothing: the plan's info and
 *     its outputs stay those of its last good update.
 *   - kva__partition_build_grid into a reused partition (chained over random
 *     plans) gives the partition a fresh build gives.
 * KVA_TEST_QUICK=1 (the sanitizer run) runs the first 30 of the sequence's 60
 * steps (the same steps as the full run's first half; the reference
 * backend's runs were ~75% of the sanitizer run's time): every step kind,
 * mask and cascade setting (a step's residues mod 2 to 7) still occurs.
 */
#include "batchgen.h"
#include "../src/plan/partition.h"

#define H 8
#define HKV 2
#define D 64

/* A step's batch and descriptor with the masks of case c. */
typedef struct step {
    kva_test_batch b;
    kva_plan_desc pd;
    float alibi[H];
} step;

static void make_step(step *s, kva_rng *rng, int c)
{
    const int32_t R = kva_rng_int(rng, c % 5 == 0 ? 0 : 1, c % 3 == 0 ? 24 : 8);
    const unsigned kinds = c % 4 == 0 ? 1u : c % 4 == 1 ? 3u : 15u;
    kva_test_batch_random(&s->b, rng, R, 16, c % 2 ? 300 : 120, kinds, c % 3 == 1);
    s->pd = kva_test_batch_plan_desc(&s->b, H, HKV, D, D, KVA_DTYPE_F32);
    s->pd.causal = c % 7 != 3;
    if (c % 4 == 2)
        s->pd.window_left = kva_rng_int(rng, 0, 90);
    if (c % 6 == 5) {
        for (int h = 0; h < H; h++)
            s->alibi[h] = -0.05f * (float)(h + 1);
        s->pd.alibi_slopes = s->alibi;
    }
    s->pd.cascade = c % 3 == 1 ? KVA_CASCADE_ON : c % 3 == 2 ? KVA_CASCADE_OFF : KVA_CASCADE_AUTO;
    /* A cascade needs a causal plan without window or ALiBi: ON is refused
     * otherwise, so fall back to AUTO (which declines). */
    if (s->pd.cascade == KVA_CASCADE_ON &&
        (!s->pd.causal || s->pd.window_left >= 0 || s->pd.alibi_slopes || s->b.T == 0))
        s->pd.cascade = KVA_CASCADE_AUTO;
}

/* An f32 NHD cache of nb blocks of 16 tokens for the steps' shape. */
static kva_cache_desc cache_desc(int32_t nb)
{
    kva_cache_desc c;
    memset(&c, 0, sizeof c);
    c.num_blocks = nb;
    c.block_size = 16;
    c.num_kv_heads = HKV;
    c.head_dim = D;
    c.head_dim_v = D;
    c.dtype = KVA_DTYPE_F32;
    c.layout = KVA_LAYOUT_NHD;
    return c;
}

/* Whether two plans hold the same plan (what kva_plan_create decides). */
static int same_plan(const kva_plan *a, const kva_plan *b)
{
    const int32_t R = a->d.num_requests;
    int ok = R == b->d.num_requests && !memcmp(&a->info, &b->info, sizeof a->info) &&
             a->workspace_bytes == b->workspace_bytes && a->max_block_id == b->max_block_id &&
             a->d.causal == b->d.causal && a->d.window_left == b->d.window_left &&
             a->d.scale == b->d.scale && a->d.block_table_stride == b->d.block_table_stride &&
             !a->cascade == !b->cascade && !a->alibi_slopes == !b->alibi_slopes &&
             !a->block_table == !b->block_table;
    ok = ok && !memcmp(a->query_start_loc, b->query_start_loc, sizeof(int32_t) * (size_t)(R + 1));
    ok = ok && (R == 0 || (!memcmp(a->seq_lens, b->seq_lens, sizeof(int32_t) * (size_t)R) &&
                           !memcmp(a->kv_lens, b->kv_lens, sizeof(int32_t) * (size_t)R)));
    ok = ok && !memcmp(a->kv_start, b->kv_start, sizeof(int64_t) * (size_t)(R + 1));
    if (ok && a->block_table)
        ok = !memcmp(a->block_table, b->block_table,
                     sizeof(int32_t) * (size_t)R * (size_t)a->d.block_table_stride);
    if (ok && a->alibi_slopes)
        ok = !memcmp(a->alibi_slopes, b->alibi_slopes, sizeof(float) * H);
    if (ok && (a->part || b->part))
        ok = a->part && b->part && a->part->num_items == b->part->num_items &&
             a->part->num_tasks == b->part->num_tasks &&
             a->part->partial_floats == b->part->partial_floats &&
             !memcmp(a->part->items, b->part->items,
                     sizeof *a->part->items * (size_t)a->part->num_items);
    return ok;
}

/* Runs plan over cache into out [T, H, D] and lse [T, H] (poisoned first). */
static void run_plan(kva_context *ctx, const kva_plan *plan, const float *q, const kva_cache *cache,
                     float *out, float *lse, int32_t T)
{
    kva_test_poison(out, KVA_DTYPE_F32, (size_t)T * H * D);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    if (T > 0)
        CHECK_OK(kva_attention_run(ctx, plan, q, cache, NULL, out, lse));
    /* The updated and the fresh plan's runs are compared with each other
     * only: each must write every element (the same poison left in both
     * would compare equal). */
    CHECK(kva_test_count_poisoned(out, KVA_DTYPE_F32, (size_t)T * H * D) == 0 &&
          kva_test_count_poisoned(lse, KVA_DTYPE_F32, (size_t)T * H) == 0);
}

static void test_update_sequence(kva_backend be)
{
    kva_context *ctx = NULL, *fresh_ctx = NULL;
    kva_context_desc cd = {be, 2, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_context_create(&cd, &fresh_ctx));
    kva_rng rng = {20261127u + (uint64_t)be};
    kva_plan *plan = NULL;
    int updates = 0, cascades = 0;
    const int steps = kva_test_quick() ? 30 : 60;
    for (int c = 0; c < steps; c++) {
        step s;
        make_step(&s, &rng, c);
        kva_plan *fresh = NULL;
        CHECK_OK(kva_plan_create(fresh_ctx, &s.pd, &fresh));
        if (!plan) {
            CHECK_OK(kva_plan_create(ctx, &s.pd, &plan));
        } else {
            CHECK_OK(kva_plan_update(ctx, plan, &s.pd));
            updates++;
        }
        if (!plan || !fresh) {
            kva_plan_destroy(fresh);
            kva_test_batch_free(&s.b);
            continue;
        }
        cascades += plan->info.num_cascade_groups > 0;
        CHECK_MSG(same_plan(plan, fresh), "%s step %d: the updated plan differs from a fresh one",
                  kva_backend_name(be), c);
        /* The outputs of both, over one random cache. */
        const int32_t T = s.b.T;
        const kva_cache_desc cdesc = cache_desc(s.b.num_blocks);
        kva_cache *cache = NULL;
        CHECK_OK(kva_cache_create(ctx, &cdesc, &cache));
        if (cache) {
            void *k = NULL, *v = NULL;
            kva_cache_data(cache, &k, &v);
            const size_t n = (size_t)s.b.num_blocks * 16 * HKV * D;
            kva_test_fill(k, KVA_DTYPE_F32, n, &rng, 1.0);
            kva_test_fill(v, KVA_DTYPE_F32, n, &rng, 1.0);
            const size_t nq = (size_t)(T > 0 ? T : 1) * H * D;
            float *q = malloc(sizeof(float) * nq), *o1 = malloc(sizeof(float) * nq),
                  *o2 = malloc(sizeof(float) * nq);
            float *l1 = malloc(sizeof(float) * (size_t)(T + 1) * H),
                  *l2 = malloc(sizeof(float) * (size_t)(T + 1) * H);
            kva_test_fill(q, KVA_DTYPE_F32, nq, &rng, 1.0);
            run_plan(ctx, plan, q, cache, o1, l1, T);
            run_plan(fresh_ctx, fresh, q, cache, o2, l2, T);
            CHECK_MSG(!memcmp(o1, o2, sizeof(float) * (size_t)T * H * D) &&
                          !memcmp(l1, l2, sizeof(float) * (size_t)T * H),
                      "%s step %d: outputs of the updated and the fresh plan differ",
                      kva_backend_name(be), c);
            free(q), free(o1), free(o2), free(l1), free(l2);
        }
        kva_cache_destroy(cache);
        kva_plan_destroy(fresh);
        kva_test_batch_free(&s.b);
    }
    CHECK(updates >= steps - 10);
    CHECK_MSG(cascades > 0, "no step ran as a cascade: the sequence misses that path");
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_context_destroy(fresh_ctx);
}

/* Bad input leaves the plan as its last good update made it. */
static void test_update_bad_input(void)
{
    kva_context *ctx = NULL, *cpu = NULL;
    kva_context_desc cd = {KVA_BACKEND_REF, 1, 0}, cc = {KVA_BACKEND_CPU, 1, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_context_create(&cc, &cpu));
    kva_rng rng = {99};
    step s;
    make_step(&s, &rng, 1); /* decodes and spec decodes, shared prefixes, cascade on */
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &s.pd, &plan));
    step s2;
    make_step(&s2, &rng, 4);
    CHECK_OK(kva_plan_update(ctx, plan, &s2.pd)); /* the plan to keep, with a spare */
    kva_plan *fresh = NULL;
    CHECK_OK(kva_plan_create(ctx, &s2.pd, &fresh));
    const kva_plan_info before = plan->info;

    kva_plan_desc bad = s.pd;
    bad.num_requests = -1;
    CHECK_STATUS(kva_plan_update(ctx, plan, &bad), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_requests");
    bad = s.pd;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)s.b.R * (size_t)s.b.stride);
    memcpy(bt, s.b.block_table, sizeof(int32_t) * (size_t)s.b.R * (size_t)s.b.stride);
    bt[0] = -5; /* request 0's first block, always needed */
    bad.block_table = bt;
    CHECK_STATUS(kva_plan_update(ctx, plan, &bad), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("negative");
    bad = s.pd;
    bad.num_cascade_groups = s.b.R + 1;
    int32_t groups[64] = {0};
    bad.cascade_group = groups;
    CHECK_STATUS(kva_plan_update(ctx, plan, &bad), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_cascade_groups");
    /* A grouping checked only after the plan's copies exist: a request in a
     * group of one other member whose blocks differ. */
    bad = s.pd;
    bad.num_cascade_groups = 1;
    bad.cascade_group = groups;
    bad.cascade = KVA_CASCADE_ON;
    for (int32_t r = 0; r < s.b.R; r++)
        groups[r] = r < 2 ? 0 : -1;
    int32_t plen = 1000000;
    bad.cascade_prefix_len = &plen;
    kva_status st = kva_plan_update(ctx, plan, &bad);
    CHECK_MSG(st != KVA_STATUS_OK, "a prefix longer than the requests was accepted");
    bad = s.pd;
    bad.seq_lens = NULL;
    CHECK_STATUS(kva_plan_update(ctx, plan, &bad), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_plan_update(cpu, plan, &s.pd), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("backend");
    CHECK_STATUS(kva_plan_update(NULL, plan, &s.pd), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_plan_update(ctx, NULL, &s.pd), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_plan_update(ctx, plan, NULL), KVA_STATUS_NULL_POINTER);
    CHECK(!memcmp(&before, &plan->info, sizeof before));
    CHECK(same_plan(plan, fresh));
    /* And it still runs as before: the same outputs as the fresh plan. */
    const int32_t T = s2.b.T;
    const kva_cache_desc cdesc = cache_desc(s2.b.num_blocks);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cdesc, &cache));
    void *k = NULL, *v = NULL;
    kva_cache_data(cache, &k, &v);
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)s2.b.num_blocks * 16 * HKV * D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, (size_t)s2.b.num_blocks * 16 * HKV * D, &rng, 1.0);
    const size_t nq = (size_t)(T > 0 ? T : 1) * H * D;
    float *q = malloc(sizeof(float) * nq), *o1 = malloc(sizeof(float) * nq),
          *o2 = malloc(sizeof(float) * nq), *l1 = malloc(sizeof(float) * (size_t)(T + 1) * H),
          *l2 = malloc(sizeof(float) * (size_t)(T + 1) * H);
    kva_test_fill(q, KVA_DTYPE_F32, nq, &rng, 1.0);
    run_plan(ctx, plan, q, cache, o1, l1, T);
    run_plan(ctx, fresh, q, cache, o2, l2, T);
    CHECK(T > 0 && !memcmp(o1, o2, sizeof(float) * (size_t)T * H * D));
    free(q), free(o1), free(o2), free(l1), free(l2), free(bt);
    kva_cache_destroy(cache);
    kva_plan_destroy(fresh);
    kva_plan_destroy(plan);
    kva_test_batch_free(&s.b);
    kva_test_batch_free(&s2.b);
    kva_context_destroy(ctx);
    kva_context_destroy(cpu);
}

static void test_update_backends(void)
{
    test_update_sequence(KVA_BACKEND_REF);
    test_update_sequence(KVA_BACKEND_CPU);
}

/* The grid partition rebuilt in a reused partition equals a fresh build. */
static void test_grid_reuse(void)
{
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    kva_rng rng = {5150};
    kva__partition *reuse = NULL;
    const int64_t slot_set[4] = {1, 33, 132, 264};
    for (int c = 0; c < 120; c++) {
        step s;
        make_step(&s, &rng, c);
        s.pd.cascade = KVA_CASCADE_OFF;
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &s.pd, &plan));
        kva__partition_params pp;
        memset(&pp, 0, sizeof pp);
        pp.max_rows = c % 3 ? 16 : 4;
        pp.prefill_rows = pp.max_rows;
        pp.split_align = 64;
        pp.min_split_keys = c % 2 ? 64 : 256;
        pp.max_splits = 32;
        kva__partition_grid grid = {slot_set[c % 4], c % 11 == 0 ? 3 : 0, 176, 600, 1100};
        kva__partition *a = NULL, *b = NULL;
        CHECK_OK(kva__partition_build_grid(plan, &pp, &grid, NULL, NULL, &a));
        CHECK_OK(kva__partition_build_grid(plan, &pp, &grid, NULL, reuse, &b));
        reuse = b;
        int ok = a && b && a->num_items == b->num_items && a->num_tasks == b->num_tasks &&
                 a->pick == b->pick && a->makespan == b->makespan && a->estimate == b->estimate &&
                 a->partial_floats == b->partial_floats &&
                 !memcmp(a->items, b->items, sizeof *a->items * (size_t)a->num_items);
        for (int32_t t = 0; ok && t < a->num_tasks; t++)
            ok = a->tasks[t].req == b->tasks[t].req && a->tasks[t].ws_off == b->tasks[t].ws_off &&
                 a->tasks[t].num_splits == b->tasks[t].num_splits &&
                 a->tasks[t].kv_head == b->tasks[t].kv_head;
        CHECK_MSG(ok, "case %d: the rebuilt partition differs from a fresh one", c);
        kva__partition_free(a);
        kva_plan_destroy(plan);
        kva_test_batch_free(&s.b);
    }
    kva__partition_free(reuse);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_update_backends);
    RUN(test_update_bad_input);
    RUN(test_grid_reuse);
    return kva_test_finish();
}
