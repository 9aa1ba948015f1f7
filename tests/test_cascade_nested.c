/*
 * test_cascade_nested.c - nested cascade groups (multi-level shared
 * prefixes) on the reference and CPU backends against the reference's plain
 * plan: two and three levels, found from the block ids and given with
 * cascade_parent, ragged groups (siblings of different depths, members at
 * every level), decodes, speculative decodes and prefills in one step, a
 * subgroup whose prefix ends off its shared blocks' edge, bf16 and a
 * quantized cache; the automatic choice keeps the levels that pay, and
 * decides alike whether it finds a group or is given it; bad
 * nestings get a status and create nothing. Outputs are poisoned before
 * every run.
 */
#include "cascade_util.h"

static void run_case(const cas_case *c, kva_backend be)
{
    cas_run_host(c, be, 4321);
}

static void test_levels(void)
{
    const kva_backend bes[] = {KVA_BACKEND_CPU, KVA_BACKEND_REF};
    for (int i = 0; i < 2; i++) {
        cas_case c = cas_two_levels("two levels found");
        run_case(&c, bes[i]);
        c.name = "two levels given";
        c.given = 1;
        run_case(&c, bes[i]);
        c = cas_three_levels("three levels found, ragged");
        run_case(&c, bes[i]);
        c.name = "three levels given, ragged";
        c.given = 1;
        c.G = 6; /* group 4 given without members */
        run_case(&c, bes[i]);
    }
    /* A member of group 2 whose first query lies inside group 2's sixth
     * block: found, subgroup 2 shares 5 blocks (its prefix ends off the edge
     * of what its block ids share; one block after group 1's), and its
     * other members form a fourth level over blocks 5 and 6. */
    cas_case c = cas_three_levels("subgroup prefix off the shared edge");
    c.req[3] = (cas_req){2, 30, 8}; /* first query at 112 + 8 - 30 = 90 */
    c.expect_groups = 6;
    run_case(&c, KVA_BACKEND_CPU);
    run_case(&c, KVA_BACKEND_REF);
    /* Given nested prefixes shorter than the blocks share; sinks, soft-cap. */
    c = cas_three_levels("given shorter nested prefixes, sinks, soft-cap");
    c.given = 1;
    c.given_len[1] = 3 * 16, c.given_len[2] = 5 * 16;
    c.sinks = 1, c.softcap = 20.0f;
    run_case(&c, KVA_BACKEND_CPU);
    /* GQA 4, bf16 (each level's merge rounds to bf16), and an int8 cache. */
    c = cas_three_levels("three levels, GQA 4, bf16, D 128");
    c.H = 16, c.Hkv = 4, c.D = 128, c.dt = c.cache_dt = KVA_DTYPE_BF16;
    run_case(&c, KVA_BACKEND_CPU);
    c = cas_two_levels("two levels, int8 token cache, HND");
    c.quant = KVA_QUANT_INT8_TOKEN_K, c.cache_dt = KVA_DTYPE_I8, c.layout = KVA_LAYOUT_HND;
    run_case(&c, KVA_BACKEND_CPU);
    c = cas_three_levels("three levels, no cascade");
    c.mode = KVA_CASCADE_OFF, c.expect_groups = 0;
    run_case(&c, KVA_BACKEND_CPU);
}

/* The automatic choice per level: a long outer prefix with a short inner
 * one keeps the outer level only; both long keep both (16 threads). */
static void test_choice(void)
{
    kva_context *wide = new_ctx(KVA_BACKEND_CPU, 16);
    kva_rng r = {6};
    cas_case c;
    memset(&c, 0, sizeof c);
    c.H = 32, c.Hkv = 8, c.D = 128, c.B = 16;
    c.dt = c.cache_dt = KVA_DTYPE_BF16;
    c.nested = 1;
    c.G = 2, c.R = 32;
    c.parent[0] = -1, c.parent[1] = 0;
    for (int32_t i = 0; i < c.R; i++)
        c.req[i] = (cas_req){i < 16 ? 1 : 0, 1, 64};
    for (int k = 0; k < 2; k++) {
        c.shared[0] = 512, c.shared[1] = k == 0 ? 513 : 1024;
        cas_batch b;
        cas_build(&c, &r, &b);
        kva_plan_desc d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 0);
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(wide, &d, &p));
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(p, &info));
        CHECK_MSG(info.num_cascade_groups == (k == 0 ? 1 : 2), "inner prefix %d blocks: %d groups",
                  (int)c.shared[1], (int)info.num_cascade_groups);
        /* The outer group's rows, plus the inner group's when it is kept. */
        CHECK(info.cascade_rows == (k == 0 ? 32 : 48));
        kva_plan_destroy(p);
        free(b.bt);
    }
    kva_context_destroy(wide);
}

/* The automatic choice decides alike whether it finds a group or is given
 * it (cascade_util.h), on the cost models of 2 and 16 threads. */
static void test_auto_bound(void)
{
    for (int t = 0; t < 2; t++) {
        kva_context *ctx = new_ctx(KVA_BACKEND_CPU, t ? 16 : 2);
        cas_check_auto_bound(ctx, 23 + (uint64_t)t);
        kva_context_destroy(ctx);
    }
}

static void test_bad_nestings(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng r = {10};
    cas_case c = cas_three_levels("bad");
    c.given = 1;
    cas_batch b;
    cas_build(&c, &r, &b);
    kva_plan *sentinel = (kva_plan *)&c, *p = sentinel;
    kva_plan_desc d = cas_desc(&c, &b, KVA_CASCADE_ON, 1);
    /* Each BAD case starts from a fresh valid batch. */
#define BAD(status, mention)                                                                       \
    do {                                                                                           \
        CHECK_STATUS(kva_plan_create(ctx, &d, &p), status);                                        \
        CHECK_ERROR_MENTIONS(mention);                                                             \
        CHECK(p == sentinel);                                                                      \
        free(b.bt);                                                                                \
        cas_build(&c, &r, &b);                                                                     \
        d = cas_desc(&c, &b, KVA_CASCADE_ON, 1);                                                   \
    } while (0)
    b.par[1] = 1; /* itself */
    BAD(KVA_STATUS_OUT_OF_RANGE, "cascade_parent[1]");
    b.par[1] = 2; /* a later group */
    BAD(KVA_STATUS_OUT_OF_RANGE, "cascade_parent[1]");
    b.par[0] = -2;
    BAD(KVA_STATUS_OUT_OF_RANGE, "cascade_parent[0]");
    b.plen[1] = b.plen[0]; /* not longer than its parent's */
    BAD(KVA_STATUS_INVALID_ARGUMENT, "not more than its parent");
    /* Request 0 (group 2, the first member of groups 0, 1 and 2) holds
     * another block at index 1: request 1 (group 0) no longer matches it. */
    b.bt[0 * b.stride + 1] = b.bt[5 * b.stride + 1];
    BAD(KVA_STATUS_INVALID_ARGUMENT, "cascade group 0 does not share");
    /* The valid nesting is accepted. */
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    kva_plan_destroy(p);
    p = sentinel;
    /* A chain of 9 levels. */
    cas_case deep;
    memset(&deep, 0, sizeof deep);
    deep.H = 4, deep.Hkv = 2, deep.D = 32, deep.B = 16;
    deep.dt = deep.cache_dt = KVA_DTYPE_F32;
    deep.nested = 1, deep.given = 1;
    deep.G = 0;
    deep.R = 10;
    for (int32_t i = 0; i < deep.R; i++)
        deep.req[i] = (cas_req){-1, 1, 1};
    cas_batch db;
    cas_build(&deep, &r, &db);
    int32_t dg[10], dl[9], dp[9];
    for (int32_t i = 0; i < 10; i++)
        dg[i] = 8;
    for (int32_t g = 0; g < 9; g++)
        dl[g] = 16 * (g + 1), dp[g] = g - 1;
    kva_plan_desc dd = cas_desc(&deep, &db, KVA_CASCADE_ON, 0);
    dd.num_cascade_groups = 9;
    dd.cascade_group = dg;
    dd.cascade_prefix_len = dl;
    dd.cascade_parent = dp;
    CHECK_STATUS(kva_plan_create(ctx, &dd, &p), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("levels deep");
    CHECK(p == sentinel);
#undef BAD
    free(db.bt);
    free(b.bt);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_levels);
    RUN(test_choice);
    RUN(test_auto_bound);
    RUN(test_bad_nestings);
    return kva_test_finish();
}
