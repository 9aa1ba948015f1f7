/*
 * test_plan_grid.c - the persistent-grid partition (kva__partition_build_grid,
 * the CUDA backend's plan) on the host, against the partitions it replaces.
 *
 * On random batches (decodes, speculative decodes, chunked and fresh
 * prefills; GQA 1/4/8; causal or not, sliding windows; requests skipped as
 * the CUDA plan skips its tensor-core prefills; grids of 1 to 528 workers):
 *   - the items are in item_before order (cost, largest first, then request,
 *     kv head, head slice, query rows, keys), strictly;
 *   - every visible (row, head, key) of every request not skipped is covered
 *     by exactly one item, split chunks are contiguous and numbered 0..n-1,
 *     the tasks' partial blocks are disjoint and inside partial_floats;
 *   - the closed-form makespan it stored equals the makespan computed by
 *     simulating the grid over its items (every worker's load);
 *   - it is never above the best of the four candidates the former plan built
 *     (kva__partition_build_subset at 1..4 items per worker), and when it
 *     kept one of those (pick 1..4), its items equal that build's item for
 *     item and its tasks equal up to numbering;
 *   - a forced split count cuts no unit into more chunks than asked;
 *   - a build that splits under candidate k cuts fewer than 3 x slots x k
 *     chunks (kva_cuda_context_reserve's workspace bound, cuda_meta.cu);
 *   - the candidates skipped by their lower bound change nothing: the build
 *     equals the one that evaluates every candidate (makespan and time
 *     model), also where decode steps take the decode path (items written
 *     in cost order without the general choice), which must be taken.
 * KVA_TEST_QUICK=1 (the sanitizer run) runs the first 84 of the 240 batches.
 */
#include "batchgen.h"
#include "internal.h"
#include "../src/plan/partition_impl.h"

/* The GPU parameters (cuda_ctx.cu gpu_params) for items of `rows` rows. */
static kva__partition_params params_for(int32_t rows, int64_t threads)
{
    kva__partition_params pp;
    memset(&pp, 0, sizeof pp);
    pp.num_threads = (int32_t)threads;
    pp.max_rows = rows;
    pp.prefill_rows = rows;
    pp.split_align = 64;
    pp.min_split_keys = 256;
    pp.max_splits = 32;
    pp.items_per_thread = 1;
    return pp;
}

/* The largest worker load of a grid of `slots` workers running the items round-robin. */
static int64_t simulate(const kva__partition *p, int64_t slots)
{
    int64_t *load = calloc((size_t)slots, sizeof *load), worst = 0;
    for (int32_t i = 0; i < p->num_items; i++) {
        load[i % slots] += p->items[i].cost;
        if (load[i % slots] > worst)
            worst = load[i % slots];
    }
    free(load);
    return worst;
}

static int before(const kva__work_item *a, const kva__work_item *b)
{
    if (a->cost != b->cost)
        return a->cost > b->cost;
    if (a->req != b->req)
        return a->req < b->req;
    if (a->kv_head != b->kv_head)
        return a->kv_head < b->kv_head;
    if (a->h0 != b->h0)
        return a->h0 < b->h0;
    if (a->i0 != b->i0)
        return a->i0 < b->i0;
    return a->k0 < b->k0;
}

/*
 * The build of grid g equals the build that evaluates every candidate
 * (kva__partition_build_grid_all): the candidates skipped by their lower
 * bound could not have won. Items, tasks, the pick and its makespan and estimate are compared.
 */
static void check_exhaustive(const kva_plan *plan, const kva__partition_params *pp,
                             const kva__partition_grid *g, const uint8_t *skip,
                             const kva__partition *p, int c)
{
    kva__partition *x = NULL;
    CHECK_OK(kva__partition_build_grid_all(plan, pp, g, skip, NULL, &x));
    if (!x || !p)
        return;
    CHECK_MSG(x->pick == p->pick && x->makespan == p->makespan && x->estimate == p->estimate &&
                  x->num_items == p->num_items && x->num_tasks == p->num_tasks &&
                  x->partial_floats == p->partial_floats,
              "case %d: bounded pick %d (estimate %lld, %d items), exhaustive %d (%lld, %d)", c,
              (int)p->pick, (long long)p->estimate, (int)p->num_items, (int)x->pick,
              (long long)x->estimate, (int)x->num_items);
    if (x->num_items == p->num_items)
        CHECK(!memcmp(x->items, p->items, sizeof *x->items * (size_t)x->num_items));
    for (int32_t k = 0; x->num_tasks == p->num_tasks && k < x->num_tasks; k++) {
        const kva__split_task *a = &x->tasks[k], *b = &p->tasks[k];
        CHECK(a->req == b->req && a->kv_head == b->kv_head && a->h0 == b->h0 && a->nh == b->nh &&
              a->i0 == b->i0 && a->nq == b->nq && a->num_splits == b->num_splits &&
              a->ws_off == b->ws_off);
    }
    kva__partition_free(x);
}

/* {ws_off, floats} pairs by ws_off. */
static int cmp_block(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/*
 * The bound kva_cuda_context_reserve sizes its workspace by (cuda_meta.cu,
 * caps_for): a grid build that splits under candidate k (picks 1..4 and
 * 5..8: k = 1..4; pick 0 splits nothing) cuts fewer than 3 x slots x k
 * chunks in all, so fewer than 12 x slots, and its partials take at most
 * that many chunks of max_rows rows of Dv + 1 floats. most_per_slot keeps
 * the largest chunks per slot seen (printed: how close the batches come).
 */
static double most_per_slot;
static void check_split_bound(const kva_plan *plan, const kva__partition_params *pp,
                              const kva__partition *p, int64_t slots, int c)
{
    int64_t pieces = 0;
    for (int32_t t = 0; t < p->num_tasks; t++)
        pieces += p->tasks[t].num_splits;
    const int64_t k = p->pick >= 1 && p->pick <= 4   ? p->pick
                      : p->pick >= 5 && p->pick <= 8 ? p->pick - 4
                                                     : 0;
    CHECK_MSG(pieces == 0 || pieces < 3 * slots * k,
              "case %d: %lld split chunks on %lld slots under candidate %d (the reservation's "
              "bound: fewer than 3 x slots x k)",
              c, (long long)pieces, (long long)slots, (int)p->pick);
    CHECK_MSG(p->partial_floats <= pieces * pp->max_rows * (plan->d.head_dim_v + 1),
              "case %d: %lld partial floats for %lld chunks of at most %d rows", c,
              (long long)p->partial_floats, (long long)pieces, (int)pp->max_rows);
    if ((double)pieces / (double)slots > most_per_slot)
        most_per_slot = (double)pieces / (double)slots;
}

/* Structure and coverage of partition p of plan (skip [R] or NULL). */
static void check_partition(const kva_plan *plan, const kva__partition *p, const uint8_t *skip)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t R = d->num_requests, Hkv = d->num_kv_heads, G = d->num_heads / Hkv;
    const int32_t T = plan->query_start_loc[R];
    /* covered[(t * Hkv + kvh) * G + h]: keys of token t, head kvh*G+h the items cover. */
    int64_t *covered = calloc((size_t)(T > 0 ? T : 1) * (size_t)d->num_heads, sizeof *covered);
    int64_t sum = 0;
    for (int32_t i = 0; i < p->num_items; i++) {
        const kva__work_item *it = &p->items[i];
        sum += it->cost;
        if (i > 0)
            CHECK_MSG(before(&p->items[i - 1], it), "items %d and %d out of order", (int)i - 1,
                      (int)i);
        CHECK(it->req >= 0 && it->req < R && !(skip && skip[it->req]));
        CHECK(it->kv_head >= 0 && it->kv_head < Hkv && it->h0 >= 0 && it->h0 + it->nh <= G);
        const int32_t q = plan->query_start_loc[it->req + 1] - plan->query_start_loc[it->req];
        const int32_t s = plan->seq_lens[it->req];
        CHECK(it->i0 >= 0 && it->nq >= 1 && it->i0 + it->nq <= q);
        if (it->task >= 0) {
            CHECK(it->task < p->num_tasks);
            const kva__split_task *t = &p->tasks[it->task];
            CHECK(t->req == it->req && t->kv_head == it->kv_head && t->h0 == it->h0 &&
                  t->nh == it->nh && t->i0 == it->i0 && t->nq == it->nq);
            CHECK(it->split >= 0 && it->split < t->num_splits);
        }
        for (int32_t r = it->i0; r < it->i0 + it->nq; r++) {
            int32_t lo, hi;
            kva__row_keys(d, s, q, r, &lo, &hi);
            lo = lo > it->k0 ? lo : it->k0;
            hi = hi < it->k1 ? hi : it->k1;
            const int64_t t = plan->query_start_loc[it->req] + r;
            for (int32_t h = it->h0; h < it->h0 + it->nh; h++)
                covered[(t * Hkv + it->kv_head) * G + h] += hi > lo ? hi - lo : 0;
        }
    }
    CHECK(sum == p->total_cost);
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        for (int32_t i = 0; i < q; i++) {
            int32_t lo, hi;
            kva__row_keys(d, plan->seq_lens[r], q, i, &lo, &hi);
            const int64_t want = skip && skip[r] ? 0 : (hi > lo ? hi - lo : 0);
            const int64_t t = plan->query_start_loc[r] + i;
            for (int32_t hh = 0; hh < d->num_heads; hh++)
                CHECK_MSG(covered[t * d->num_heads + hh] == want,
                          "request %d row %d head %d: %lld keys covered, %lld visible", (int)r,
                          (int)i, (int)hh, (long long)covered[t * d->num_heads + hh],
                          (long long)want);
        }
    }
    free(covered);
    /* Tasks: chunks 0..n-1 present once each and contiguous; partial blocks disjoint. */
    int32_t nt = p->num_tasks > 0 ? p->num_tasks : 1;
    int32_t *chunk_of = malloc(sizeof(int32_t) * (size_t)nt * 32 * 2); /* [task][split] {k0, k1} */
    int32_t *seen = calloc((size_t)nt * 32, sizeof *seen);
    for (int32_t i = 0; i < p->num_items; i++) {
        const kva__work_item *it = &p->items[i];
        if (it->task < 0 || it->task >= p->num_tasks || it->split >= 32)
            continue;
        const int64_t x = (int64_t)it->task * 32 + it->split;
        seen[x]++;
        chunk_of[2 * x] = it->k0;
        chunk_of[2 * x + 1] = it->k1;
    }
    int64_t ws_sum = 0;
    int64_t *blocks = malloc(sizeof(int64_t) * 2 * (size_t)nt); /* {ws_off, floats} per task */
    for (int32_t k = 0; k < p->num_tasks; k++) {
        const kva__split_task *t = &p->tasks[k];
        CHECK(t->num_splits >= 2 && t->num_splits <= 32);
        for (int32_t c = 0; c < t->num_splits && c < 32; c++) {
            const int64_t x = (int64_t)k * 32 + c;
            CHECK_MSG(seen[x] == 1, "task %d chunk %d present %d times", (int)k, (int)c,
                      (int)seen[x]);
            if (c > 0 && seen[x] == 1 && seen[x - 1] == 1)
                CHECK_MSG(chunk_of[2 * x] == chunk_of[2 * x - 1],
                          "task %d chunk %d starts at %d, not %d", (int)k, (int)c,
                          (int)chunk_of[2 * x], (int)chunk_of[2 * x - 1]);
        }
        const int64_t blk = (int64_t)t->num_splits * t->nq * t->nh * (d->head_dim_v + 1);
        CHECK(t->ws_off >= 0 && t->ws_off + blk <= p->partial_floats);
        ws_sum += blk;
        blocks[2 * k] = t->ws_off, blocks[2 * k + 1] = blk;
    }
    free(chunk_of);
    free(seen);
    /* Inside, summing up to partial_floats, and in ws_off order none starts
     * before the previous one ends: disjoint. */
    CHECK(ws_sum == p->partial_floats);
    qsort(blocks, (size_t)p->num_tasks, 2 * sizeof(int64_t), cmp_block);
    for (int32_t k = 1; k < p->num_tasks; k++)
        CHECK_MSG(blocks[2 * k] >= blocks[2 * k - 2] + blocks[2 * k - 1],
                  "partial blocks at %lld and %lld overlap", (long long)blocks[2 * k - 2],
                  (long long)blocks[2 * k]);
    free(blocks);
}

static void test_grid_random(void)
{
    kva_rng rng = {20261122};
    const int64_t slot_set[6] = {1, 7, 132, 264, 396, 528};
    int kept_old = 0, kept_new = 0;
    /* KVA_TEST_QUICK: the first 84 cases (every residue of the case number
     * modulo 2 .. 7, so every axis value below, at least 12 times each). */
    const int ncase = kva_test_quick() ? 84 : 240;
    for (int c = 0; c < ncase; c++) {
        const int32_t R = kva_rng_int(&rng, 1, 48);
        const unsigned kinds = c % 3 == 0 ? 1u : c % 3 == 1 ? 3u : 15u;
        kva_test_batch b;
        kva_test_batch_random(&b, &rng, R, 16, c % 5 == 0 ? 9000 : 2500, kinds, 0);
        const int32_t gqa[3] = {1, 4, 8};
        const int32_t G = gqa[c % 3], Hkv = kva_rng_int(&rng, 1, 8);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, G * Hkv, Hkv, 128, 128, KVA_DTYPE_BF16);
        pd.causal = c % 7 != 3;
        if (c % 4 == 1)
            pd.window_left = kva_rng_int(&rng, 0, 700);
        kva_context *ctx = NULL;
        kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
        kva_plan *plan = NULL;
        CHECK_OK(kva_context_create(&cd, &ctx));
        kva_status st = kva_plan_create(ctx, &pd, &plan);
        if (st != KVA_STATUS_OK) { /* non-causal desc with a fresh prefill is still valid */
            CHECK_OK(st);
            kva_context_destroy(ctx);
            kva_test_batch_free(&b);
            continue;
        }
        uint8_t *skip = NULL;
        if (c % 2) {
            skip = calloc((size_t)R, 1);
            for (int32_t r = 0; r < R; r++)
                skip[r] = b.q_lens[r] > pd.decode_threshold && b.q_lens[r] * G >= 64;
        }
        const int32_t rows = c % 4 == 2 ? (G <= 4 ? 4 : 8) : 16;
        const int64_t slots = slot_set[c % 6];
        kva__partition_params pp = params_for(rows, slots);
        kva__partition_grid grid = {slots, 0, 0, 0, 0};
        kva__partition *pg = NULL;
        CHECK_OK(kva__partition_build_grid(plan, &pp, &grid, skip, NULL, &pg));
        check_exhaustive(plan, &pp, &grid, skip, pg, c);
        if (pg) {
            check_partition(plan, pg, skip);
            check_split_bound(plan, &pp, pg, slots, c);
            const int64_t sim = simulate(pg, slots);
            CHECK_MSG(pg->makespan == sim && kva__partition_makespan(pg, slots) == sim,
                      "case %d: makespan %lld stored, %lld simulated", c, (long long)pg->makespan,
                      (long long)sim);
            CHECK(pg->pick >= 0 && pg->pick <= 8 && pg->estimate == pg->makespan);
            int64_t best_old = -1;
            for (int k = 1; k <= 4; k++) {
                kva__partition_params po = params_for(rows, slots * k);
                kva__partition *p4 = NULL;
                CHECK_OK(kva__partition_build_subset(plan, &po, skip, &p4));
                if (!p4)
                    continue;
                const int64_t t = simulate(p4, slots);
                if (best_old < 0 || t < best_old)
                    best_old = t;
                if (k == pg->pick) {
                    CHECK(p4->num_items == pg->num_items && p4->num_tasks == pg->num_tasks &&
                          p4->partial_floats == pg->partial_floats);
                    for (int32_t i = 0; i < p4->num_items && i < pg->num_items; i++) {
                        const kva__work_item *x = &p4->items[i], *y = &pg->items[i];
                        int same = x->req == y->req && x->kv_head == y->kv_head && x->h0 == y->h0 &&
                                   x->nh == y->nh && x->i0 == y->i0 && x->nq == y->nq &&
                                   x->k0 == y->k0 && x->k1 == y->k1 && x->split == y->split &&
                                   x->cost == y->cost && (x->task < 0) == (y->task < 0);
                        if (same && x->task >= 0)
                            same = p4->tasks[x->task].num_splits == pg->tasks[y->task].num_splits;
                        CHECK_MSG(same, "case %d item %d differs from candidate %d", c, (int)i, k);
                    }
                }
                kva__partition_free(p4);
            }
            CHECK_MSG(pg->makespan <= best_old, "case %d: makespan %lld above the former %lld", c,
                      (long long)pg->makespan, (long long)best_old);
            kept_old += pg->pick >= 1 && pg->pick <= 4;
            kept_new += pg->pick > 4 || pg->pick == 0;
            /* The former choice (force_splits < 0) is the best of the four builds. */
            kva__partition_grid gold = {slots, -1, 0, 0, 0};
            kva__partition *po = NULL;
            CHECK_OK(kva__partition_build_grid(plan, &pp, &gold, skip, NULL, &po));
            if (po) {
                check_partition(plan, po, skip);
                check_split_bound(plan, &pp, po, slots, c);
                CHECK(po->pick >= 1 && po->pick <= 4 && po->makespan == best_old &&
                      simulate(po, slots) == best_old);
            }
            kva__partition_free(po);
            /* The CUDA backend's time model: still a valid partition, and its
             * estimate is never above the one of the unsplit candidate. */
            kva__partition_grid gm = {slots, 0, 176, 600, 1100};
            kva__partition *pm = NULL;
            CHECK_OK(kva__partition_build_grid(plan, &pp, &gm, skip, NULL, &pm));
            check_exhaustive(plan, &pp, &gm, skip, pm, c);
            if (pm) {
                check_partition(plan, pm, skip);
                check_split_bound(plan, &pp, pm, slots, c);
                CHECK(pm->makespan == simulate(pm, slots) &&
                      pm->estimate >= pm->makespan * 100 / 176);
            }
            kva__partition_free(pm);
        }
        kva__partition_free(pg);
        /* A forced split count. */
        const int32_t force = kva_rng_int(&rng, 1, 12);
        kva__partition_grid gf = {slots, force, 0, 0, 0};
        kva__partition *pf = NULL;
        CHECK_OK(kva__partition_build_grid(plan, &pp, &gf, skip, NULL, &pf));
        if (pf) {
            check_partition(plan, pf, skip);
            CHECK(pf->pick == 9 && pf->makespan == simulate(pf, slots));
            for (int32_t k = 0; k < pf->num_tasks; k++)
                CHECK(pf->tasks[k].num_splits <= force);
        }
        kva__partition_free(pf);
        free(skip);
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
        kva_test_batch_free(&b);
    }
    /* Both candidate families must occur, or the comparisons above test little. */
    CHECK_MSG(kept_old > 10 * ncase / 240 && kept_new > 10 * ncase / 240,
              "kept a former candidate %d times, a new one %d", kept_old, kept_new);
}

/*
 * Decode steps as a serving engine plans them (one query row per request,
 * 1..96 requests of 1..6000 keys, GQA 1/4/8, sliding windows, requests of
 * the batch skipped, grids of 132..528 workers) under the CUDA backend's
 * time model: the grid build takes its decode path (build_decodes) where no
 * split can win, and its partition, pick, makespan and estimate equal the
 * exhaustive build's item for item (check_exhaustive). Both outcomes must
 * occur: the decode path taken, and declined for batches that split.
 */
static void test_grid_decodes(void)
{
    kva_rng rng = {20261127};
    const int64_t slot_set[3] = {132, 264, 528};
    const int ncase = kva_test_quick() ? 60 : 160;
    int fast = 0, general = 0;
    for (int c = 0; c < ncase; c++) {
        const int32_t R = kva_rng_int(&rng, 1, c % 4 == 0 ? 8 : 96);
        int32_t q[96], sl[96];
        for (int32_t r = 0; r < R; r++)
            q[r] = 1, sl[r] = kva_rng_int(&rng, 1, c % 3 == 0 ? 6000 : 900);
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, R, q, sl, 16, 2, 0);
        const int32_t gqa[3] = {1, 4, 8};
        const int32_t G = gqa[c % 3], Hkv = kva_rng_int(&rng, 1, 8);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, G * Hkv, Hkv, 128, 128, KVA_DTYPE_BF16);
        if (c % 5 == 1)
            pd.window_left = kva_rng_int(&rng, 0, 700);
        kva_context *ctx = NULL;
        kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
        kva_plan *plan = NULL;
        CHECK_OK(kva_context_create(&cd, &ctx));
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        uint8_t *skip = NULL;
        if (c % 6 == 5) {
            skip = calloc((size_t)R, 1);
            for (int32_t r = 0; r < R; r++)
                skip[r] = kva_rng_int(&rng, 0, 3) == 0;
        }
        const int64_t slots = slot_set[c % 3];
        kva__partition_params pp = params_for(16, slots);
        kva__partition_grid gm = {slots, 0, 176, 600, 1100};
        kva__partition *pm = NULL;
        if (plan)
            CHECK_OK(kva__partition_build_grid(plan, &pp, &gm, skip, NULL, &pm));
        if (pm) {
            check_exhaustive(plan, &pp, &gm, skip, pm, c);
            check_partition(plan, pm, skip);
            check_split_bound(plan, &pp, pm, slots, c);
            CHECK(pm->makespan == simulate(pm, slots));
            /* The path taken: the decode path builds unsplit items only. */
            CHECK(!pm->decode_path || pm->num_tasks == 0);
            fast += pm->decode_path;
            general += !pm->decode_path;
            /* A rebuild in the same partition (kva_plan_update's reuse) gives the same. */
            kva__partition *again = NULL;
            const int32_t n = pm->num_items;
            kva__work_item *keep = malloc(sizeof *keep * (size_t)(n > 0 ? n : 1));
            memcpy(keep, pm->items, sizeof *keep * (size_t)n);
            CHECK_OK(kva__partition_build_grid(plan, &pp, &gm, skip, pm, &again));
            pm = again;
            if (pm)
                CHECK(pm->num_items == n && !memcmp(pm->items, keep, sizeof *keep * (size_t)n));
            free(keep);
        }
        kva__partition_free(pm);
        free(skip);
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
        kva_test_batch_free(&b);
    }
    CHECK_MSG(fast > ncase / 4 && general > ncase / 20,
              "decode path taken %d times, general path %d (of %d)", fast, general, ncase);
}

/*
 * A serving engine's decode steps one after another, each partition built in
 * the previous one (kva_plan_update's reuse), as kva_plan_update does: every
 * request one key longer per step (the decode path reuses the previous
 * step's order of the units where it still sorts them), with now and then
 * two requests' lengths swapped, equal lengths (ties, which go in request
 * order), a request dropped or a split batch between. Each rebuild must equal
 * a fresh build item for item, with the same pick, makespan and estimate.
 */
static void test_grid_decode_steps(void)
{
    kva_rng rng = {20261128};
    const int ncase = kva_test_quick() ? 12 : 40;
    int fast = 0;
    for (int c = 0; c < ncase; c++) {
        int32_t R = kva_rng_int(&rng, 2, 64);
        int32_t q[64], sl[64];
        for (int32_t r = 0; r < R; r++)
            q[r] = 1, sl[r] = kva_rng_int(&rng, 1, c % 3 == 0 ? 5000 : 700);
        const int32_t Hkv = kva_rng_int(&rng, 1, 8), G = 1 << kva_rng_int(&rng, 0, 3);
        const int64_t slots = c % 2 ? 264 : 132;
        kva__partition_params pp = params_for(16, slots);
        kva__partition_grid gm = {slots, 0, 176, 600, 1100};
        kva__partition *carry = NULL;
        for (int step = 0; step < 24; step++) {
            const int k = kva_rng_int(&rng, 0, 15);
            if (k == 0) { /* two requests trade lengths */
                const int32_t a = kva_rng_int(&rng, 0, R - 1), z = kva_rng_int(&rng, 0, R - 1);
                const int32_t t = sl[a];
                sl[a] = sl[z], sl[z] = t;
            } else if (k == 1 || k == 4) {
                /* A tie that the previous order breaks the wrong way: the
                 * longest request comes after the second longest in request
                 * order and precedes it in the units' order; now equal, the
                 * earlier request goes first. Else a random tie. */
                int32_t a = 0, z = -1;
                for (int32_t r = 1; r < R; r++)
                    a = sl[r] > sl[a] ? r : a;
                for (int32_t r = 0; r < R; r++)
                    z = r != a && (z < 0 || sl[r] > sl[z]) ? r : z;
                if (z < a && sl[z] < sl[a])
                    sl[z] = sl[a];
                else
                    sl[kva_rng_int(&rng, 0, R - 1)] = sl[kva_rng_int(&rng, 0, R - 1)];
            } else if (k == 2 && R > 2) { /* the last request finished */
                R--;
            } else if (k == 3) { /* one long request: a split may win */
                sl[kva_rng_int(&rng, 0, R - 1)] += 20000;
            } else {
                for (int32_t r = 0; r < R; r++)
                    sl[r]++;
            }
            kva_test_batch b;
            kva_test_batch_init(&b, &rng, R, q, sl, 16, 2, 0);
            kva_plan_desc pd = kva_test_batch_plan_desc(&b, G * Hkv, Hkv, 128, 128, KVA_DTYPE_BF16);
            kva_context *ctx = NULL;
            kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
            kva_plan *plan = NULL;
            CHECK_OK(kva_context_create(&cd, &ctx));
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
            kva__partition *fresh = NULL, *again = NULL;
            if (plan) {
                CHECK_OK(kva__partition_build_grid(plan, &pp, &gm, NULL, NULL, &fresh));
                CHECK_OK(kva__partition_build_grid(plan, &pp, &gm, NULL, carry, &again));
                carry = again;
            }
            if (fresh && again) {
                CHECK_MSG(
                    again->num_items == fresh->num_items && again->num_tasks == fresh->num_tasks &&
                        !memcmp(again->items, fresh->items,
                                sizeof *fresh->items * (size_t)fresh->num_items),
                    "case %d step %d: the rebuilt partition differs from a fresh one", c, step);
                CHECK(again->pick == fresh->pick && again->makespan == fresh->makespan &&
                      again->estimate == fresh->estimate &&
                      again->decode_path == fresh->decode_path);
                fast += again->decode_path;
            }
            kva__partition_free(fresh);
            kva_plan_destroy(plan);
            kva_context_destroy(ctx);
            kva_test_batch_free(&b);
        }
        kva__partition_free(carry);
    }
    CHECK_MSG(fast > ncase * 3, "decode path taken %d times in %d steps", fast, ncase * 24);
}

/* The cases the new candidates are for: equal decodes that the rounded-up
 * targets cut into one chunk too many (16 x 4k on 264 workers: 8 chunks of
 * 512 in four rounds before, 2 chunks of 2048 in one round now), and a batch
 * that fills the grid unsplit stays unsplit. */
static void test_grid_uniform(void)
{
    const int32_t Rs[3] = {16, 64, 4};
    const int32_t Ss[3] = {4096, 4096, 32768};
    const int32_t want_items[3] = {256, 512, 256};
    for (int c = 0; c < 3; c++) {
        int32_t q[64], s[64];
        for (int32_t r = 0; r < Rs[c]; r++)
            q[r] = 1, s[r] = Ss[c];
        kva_rng rng = {7};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, Rs[c], q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_BF16);
        kva_context *ctx = NULL;
        kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
        kva_plan *plan = NULL;
        CHECK_OK(kva_context_create(&cd, &ctx));
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        kva__partition_params pp = params_for(16, 264);
        kva__partition_grid grid = {264, 0, 176, 600, 1100};
        kva__partition *pg = NULL;
        if (plan)
            CHECK_OK(kva__partition_build_grid(plan, &pp, &grid, NULL, NULL, &pg));
        if (pg) {
            check_partition(plan, pg, NULL);
            CHECK_MSG(pg->num_items == want_items[c], "R %d S %d: %d items (candidate %d)",
                      (int)Rs[c], (int)Ss[c], (int)pg->num_items, (int)pg->pick);
        }
        kva__partition_free(pg);
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
        kva_test_batch_free(&b);
    }
}

int main(void)
{
    RUN(test_grid_random);
    RUN(test_grid_uniform);
    RUN(test_grid_decodes);
    RUN(test_grid_decode_steps);
    printf("split chunks per slot: at most %.2f (the reservation's bound: below 12)\n",
           most_per_slot);
    return kva_test_finish();
}
