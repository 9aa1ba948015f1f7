/*
 * cascade_util.h - the batches of the cascade (shared-prefix) tests: groups
 * of requests whose block-table rows begin with the same shared blocks, the
 * other blocks drawn at random from the cache, and a cache filled with random
 * K/V rows through kva_cache_write (every format).
 */
#ifndef KVA_TEST_CASCADE_UTIL_H
#define KVA_TEST_CASCADE_UTIL_H

#include "cache_util.h"

#define CAS_MAX_R 40
#define CAS_MAX_G 8

/* One request: its group (-1 for none), query rows, and keys after the
 * group's shared blocks (seq_len = shared * B + own >= q_len). */
typedef struct {
    int32_t group, q_len, own;
} cas_req;

typedef struct {
    const char *name;
    int32_t H, Hkv, D, B;
    kva_dtype dt;       /* q / out dtype */
    kva_dtype cache_dt; /* storage dtype */
    kva_quant quant;
    kva_layout layout;
    int32_t R, G;
    cas_req req[CAS_MAX_R];
    int32_t shared[CAS_MAX_G];    /* blocks each group shares */
    int32_t given;                /* pass the grouping (with prefix = given_len) */
    int32_t given_len[CAS_MAX_G]; /* tokens given as cascade_prefix_len (0: shared * B) */
    int32_t mode;                 /* kva_cascade_mode */
    float softcap;
    int32_t sinks;
    int32_t expect_groups; /* info.num_cascade_groups the plan must report */
    /* Nested groups: group g's first shared[parent[g]] blocks are its
     * parent's (parent[g] < g, or -1 for a top-level group); with `given`
     * the parents are passed as cascade_parent. */
    int32_t nested;
    int32_t parent[CAS_MAX_G];
} cas_case;

typedef struct {
    int32_t R, T, stride, NB;
    int32_t qsl[CAS_MAX_R + 1], seq[CAS_MAX_R], grp[CAS_MAX_R], plen[CAS_MAX_G], par[CAS_MAX_G];
    int32_t *bt; /* [R, stride] */
    float sinks[64];
} cas_batch;

/* The parent of group g, -1 for a top-level group. */
static inline int32_t cas_parent(const cas_case *c, int32_t g)
{
    return c->nested ? c->parent[g] : -1;
}

/* Shared blocks group g adds to its parent's. */
static inline int32_t cas_own_shared(const cas_case *c, int32_t g)
{
    const int32_t p = cas_parent(c, g);
    return c->shared[g] - (p >= 0 ? c->shared[p] : 0);
}

/* Block ids: group g's shared blocks, then each request's own, all distinct
 * and drawn at random from 1 .. NB-1 (block 0 stays unused); a nested
 * group's blocks begin with its parent's. */
static inline void cas_build(const cas_case *c, kva_rng *r, cas_batch *b)
{
    memset(b, 0, sizeof *b);
    b->R = c->R;
    int32_t need = 0, stride = 0;
    for (int32_t g = 0; g < c->G; g++)
        need += cas_own_shared(c, g);
    for (int32_t i = 0; i < c->R; i++) {
        const cas_req *q = &c->req[i];
        const int32_t sh = q->group >= 0 ? c->shared[q->group] : 0;
        b->seq[i] = sh * c->B + q->own;
        const int32_t nb = (b->seq[i] + c->B - 1) / c->B;
        need += nb - sh;
        stride = nb > stride ? nb : stride;
        b->qsl[i + 1] = b->qsl[i] + q->q_len;
        b->grp[i] = q->group;
    }
    b->T = b->qsl[c->R];
    b->stride = stride + 1;
    b->NB = need + 1 + 7;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)b->NB);
    for (int32_t i = 0; i < b->NB; i++)
        perm[i] = i;
    for (int32_t i = b->NB - 1; i > 1; i--) {
        const int32_t j = kva_rng_int(r, 1, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 1, shared_at[CAS_MAX_G];
    for (int32_t g = 0; g < c->G; g++) {
        shared_at[g] = next;
        next += cas_own_shared(c, g);
        b->plen[g] = c->given_len[g] ? c->given_len[g] : c->shared[g] * c->B;
        b->par[g] = cas_parent(c, g);
    }
    b->bt = malloc(sizeof(int32_t) * (size_t)c->R * (size_t)b->stride);
    for (int32_t i = 0; i < c->R; i++) {
        int32_t *row = b->bt + (int64_t)i * b->stride;
        const int32_t g = c->req[i].group, sh = g >= 0 ? c->shared[g] : 0;
        const int32_t nb = (b->seq[i] + c->B - 1) / c->B;
        for (int32_t j = 0; j < b->stride; j++)
            row[j] = -1;
        for (int32_t j = 0; j < nb; j++) {
            if (j >= sh) {
                row[j] = perm[next++];
                continue;
            }
            int32_t a = g; /* the group that added shared block j */
            while (cas_parent(c, a) >= 0 && j < c->shared[cas_parent(c, a)])
                a = cas_parent(c, a);
            row[j] = perm[shared_at[a] + j - (c->shared[a] - cas_own_shared(c, a))];
        }
    }
    free(perm);
    for (int32_t h = 0; h < c->H && h < 64; h++)
        b->sinks[h] = (float)(2.0 * kva_rng_unit(r) - 1.0);
}

static inline kva_plan_desc cas_desc(const cas_case *c, const cas_batch *b, int32_t mode,
                                     int with_grouping)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = c->R;
    d.query_start_loc = b->qsl;
    d.seq_lens = b->seq;
    d.block_table = b->bt;
    d.block_table_stride = b->stride;
    d.block_size = c->B;
    d.num_heads = c->H;
    d.num_kv_heads = c->Hkv;
    d.head_dim = c->D;
    d.q_dtype = c->dt;
    d.causal = 1;
    d.window_left = -1;
    d.softcap = c->softcap;
    d.cascade = mode;
    if (with_grouping) {
        d.num_cascade_groups = c->G;
        d.cascade_group = b->grp;
        d.cascade_prefix_len = b->plen;
        d.cascade_parent = c->nested ? b->par : NULL;
    }
    return d;
}

/* A cache of the case's format on ctx with every slot written from random
 * rows (host arrays k_rows, v_rows, slots of ctx's memory space: the caller
 * passes device copies for a device context). */
/* Groups of the automatic plan of c with group 0 sharing `shared` blocks,
 * the grouping found (given 0) or given (1). */
static inline int32_t cas_auto_groups(kva_context *ctx, cas_case *c, int32_t shared, int given,
                                      kva_rng *r)
{
    c->shared[0] = shared;
    cas_batch b;
    cas_build(c, r, &b);
    kva_plan_desc d = cas_desc(c, &b, KVA_CASCADE_AUTO, given);
    kva_plan *p = NULL;
    kva_plan_info info;
    memset(&info, 0, sizeof info);
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    if (p)
        CHECK_OK(kva_plan_get_info(p, &info));
    kva_plan_destroy(p);
    free(b.bt);
    return info.num_cascade_groups;
}

/*
 * The automatic choice without a grouping skips finding the groups when a
 * bound of their gain stays below the fixed cost (cascade.c auto_may_keep).
 * Found that way or given (the choice then weighs the given group, no
 * bound), one group of 3 to 39 decodes must be kept or declined alike: at
 * the prefix length where the given group starts to be kept (bisection over
 * 1 to 256 blocks) and around it; f32 and bf16, GQA 4 and 1. On the CUDA
 * model the bound is within a few % of the gain of a large group at the
 * turn; on the CPU models it is looser (their prefix pass costs more).
 */
static inline void cas_check_auto_bound(kva_context *ctx, uint64_t seed)
{
    kva_rng r = {seed};
    int kept = 0, turns = 0;
    for (int k = 0; k < 12; k++) {
        cas_case c;
        memset(&c, 0, sizeof c);
        c.H = k % 3 == 0 ? 32 : 8, c.Hkv = k % 3 == 0 ? 8 : k % 3 == 1 ? 2 : 8;
        c.D = k % 2 ? 128 : 64, c.B = 16;
        c.dt = c.cache_dt = k % 2 ? KVA_DTYPE_BF16 : KVA_DTYPE_F32;
        c.G = 1, c.R = kva_rng_int(&r, 4, CAS_MAX_R);
        for (int32_t i = 0; i < c.R; i++) {
            const int32_t q = kva_rng_int(&r, 1, 3);
            c.req[i] = (cas_req){i < c.R - 1 ? 0 : -1, q, q + kva_rng_int(&r, 0, 40)};
        }
        int32_t lo = 1, hi = 256; /* the first length the given group is kept at */
        if (!cas_auto_groups(ctx, &c, hi, 1, &r))
            continue;
        while (lo < hi) {
            const int32_t mid = (lo + hi) / 2;
            if (cas_auto_groups(ctx, &c, mid, 1, &r))
                hi = mid;
            else
                lo = mid + 1;
        }
        turns += lo > 1;
        const int32_t at[5] = {lo - 2, lo - 1, lo, lo + 1, lo + 8};
        for (int j = 0; j < 5; j++) {
            if (at[j] < 1)
                continue;
            const int32_t found = cas_auto_groups(ctx, &c, at[j], 0, &r);
            const int32_t given = cas_auto_groups(ctx, &c, at[j], 1, &r);
            CHECK_MSG(found == given, "R %d, prefix %d blocks, H %d/%d: %d groups found, %d given",
                      (int)c.R, (int)at[j], (int)c.H, (int)c.Hkv, (int)found, (int)given);
            kept += given > 0;
        }
    }
    CHECK_MSG(turns >= 3 && kept >= 6, "%d turns, %d kept: the sweep misses the choice's turn",
              turns, kept);
}

static inline kva_cache *cas_cache(kva_context *ctx, const cas_case *c, const cas_batch *b,
                                   const void *k_rows, const void *v_rows, const int64_t *slots)
{
    kva_cache_desc cd = make_desc(b->NB, c->B, c->Hkv, c->D, c->D, c->cache_dt, c->layout);
    cd.quant = c->quant;
    kva_rng r = {77};
    float buf[2 * 8 * 2 * 256];
    kva_quant_params qp;
    make_params(c->quant, c->Hkv, c->D, c->D, 1, &r, buf, &qp);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, c->quant == KVA_QUANT_NONE ? NULL : &qp, &cache));
    CHECK_OK(kva_cache_write(ctx, cache, b->NB * c->B, k_rows, 0, v_rows, 0, KVA_DTYPE_F32, slots));
    return cache;
}

/* An empty case of the small shape (H/Hkv 8/2, D 64, B 16, f32, NHD) with
 * the R requests reqs, forced on, expecting `groups` groups. */
static inline cas_case cas_small(const char *name, const cas_req *reqs, int32_t R, int32_t groups)
{
    cas_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.H = 8, c.Hkv = 2, c.D = 64, c.B = 16;
    c.dt = c.cache_dt = KVA_DTYPE_F32;
    c.layout = KVA_LAYOUT_NHD;
    c.R = R;
    memcpy(c.req, reqs, sizeof(cas_req) * (size_t)R);
    c.mode = KVA_CASCADE_ON;
    c.expect_groups = groups;
    return c;
}

/* A base case: 2 groups (3 and 2 shared blocks), ungrouped requests around them. */
static inline cas_case cas_base(const char *name)
{
    const cas_req reqs[] = {{0, 1, 7},  {-1, 1, 40}, {0, 1, 16}, {1, 1, 1},
                            {0, 1, 30}, {1, 1, 20},  {-1, 1, 5}, {0, 1, 3}};
    cas_case c = cas_small(name, reqs, 8, 2);
    c.G = 2;
    c.shared[0] = 3, c.shared[1] = 2;
    return c;
}

/* cas_base with groups of one request (given) and prefill rows in the same
 * step: a speculative decode in a group, a chunked prefill after its group's
 * prefix, and an ungrouped prefill. */
static inline cas_case cas_prefill_rows(const char *name)
{
    cas_case c = cas_base(name);
    c.given = 1;
    c.G = 3, c.shared[2] = 4;
    c.req[1] = (cas_req){2, 1, 9};
    c.req[4].q_len = 5;
    c.req[5].q_len = 19, c.req[5].own = 25;
    c.req[6] = (cas_req){-1, 33, 33};
    c.expect_groups = 3;
    return c;
}

/* Two levels: group 0 shares 2 blocks; its subgroup 1 shares 5 (the first
 * 2 of them group 0's). Request 0 is in group 0 only, requests 2 and 4 in
 * group 1, the rest ungrouped. */
static inline cas_case cas_two_levels(const char *name)
{
    const cas_req reqs[] = {{0, 1, 9}, {-1, 1, 40}, {1, 1, 16}, {-1, 3, 7}, {1, 1, 3}};
    cas_case c = cas_small(name, reqs, 5, 2);
    c.nested = 1;
    c.G = 2;
    c.shared[0] = 2, c.parent[0] = -1;
    c.shared[1] = 5, c.parent[1] = 0;
    return c;
}

/* Three levels, ragged: top-level groups 0 (2 blocks) and 5 (3 blocks, no
 * subgroups); group 0's subgroups 1 (4 blocks) and 3 (3 blocks, a leaf);
 * group 1's subgroup 2 (7 blocks). Members at every level, with decodes,
 * speculative decodes and prefills after the prefix. */
static inline cas_case cas_three_levels(const char *name)
{
    const cas_req reqs[] = {
        {2, 1, 5},    {0, 1, 30}, {1, 1, 20},  {2, 4, 12}, {3, 1, 1},  {-1, 1, 50},
        {2, 1, 40},   {5, 1, 6},  {1, 17, 17}, {3, 2, 9},  {0, 1, 2},  {5, 9, 30},
        {-1, 24, 24}, {2, 1, 16}, {1, 1, 1},   {3, 1, 33}, {5, 1, 16},
    };
    cas_case c = cas_small(name, reqs, (int32_t)(sizeof reqs / sizeof reqs[0]), 5);
    c.nested = 1;
    c.G = 6;
    /* Group 4 (1 block, top-level) has no members: it stays unused. */
    const int32_t shared[6] = {2, 4, 7, 3, 1, 3}, parent[6] = {-1, 0, 1, 0, -1, -1};
    memcpy(c.shared, shared, sizeof shared);
    memcpy(c.parent, parent, sizeof parent);
    return c;
}

/* One case's data and its reference: the batch, random K/V rows [NB*B, Hkv,
 * D] f32 for every slot, q [T, H, D], a host cache of the rows on the
 * reference backend, and the reference's plain run over it (o_ref, l_ref). */
typedef struct {
    cas_batch b;
    size_t nq, nl, rows, nslots;
    float *kr, *vr, *l_ref;
    int64_t *slots;
    void *q, *o_ref;
    const float *sinks; /* b.sinks or NULL */
    kva_context *ref;
    kva_cache *cache; /* on ref (host memory: the CPU backend reads it too) */
} cas_data;

static inline void cas_data_make(const cas_case *c, uint64_t seed, cas_data *x)
{
    kva_rng r = {seed};
    memset(x, 0, sizeof *x);
    cas_build(c, &r, &x->b);
    const size_t es = kva_dtype_size(c->dt);
    x->nq = (size_t)x->b.T * c->H * c->D, x->nl = (size_t)x->b.T * c->H;
    x->nslots = (size_t)x->b.NB * c->B, x->rows = x->nslots * c->Hkv * c->D;
    x->kr = malloc(x->rows * 4), x->vr = malloc(x->rows * 4);
    x->slots = malloc(sizeof(int64_t) * x->nslots);
    kva_test_fill(x->kr, KVA_DTYPE_F32, x->rows, &r, 1.0);
    kva_test_fill(x->vr, KVA_DTYPE_F32, x->rows, &r, 1.0);
    for (size_t s = 0; s < x->nslots; s++)
        x->slots[s] = (int64_t)s;
    x->q = malloc(x->nq * es), x->o_ref = malloc(x->nq * es), x->l_ref = malloc(x->nl * 4);
    kva_test_fill(x->q, c->dt, x->nq, &r, 1.0);
    x->sinks = c->sinks ? x->b.sinks : NULL;
    x->ref = new_ctx(KVA_BACKEND_REF, 1);
    x->cache = cas_cache(x->ref, c, &x->b, x->kr, x->vr, x->slots);
    kva_plan *plain = NULL;
    kva_plan_desc d = cas_desc(c, &x->b, KVA_CASCADE_OFF, 0);
    CHECK_OK(kva_plan_create(x->ref, &d, &plain));
    kva_test_poison(x->o_ref, c->dt, x->nq);
    kva_test_poison(x->l_ref, KVA_DTYPE_F32, x->nl);
    CHECK_OK(kva_attention_run(x->ref, plain, x->q, x->cache, x->sinks, x->o_ref, x->l_ref));
    kva_plan_destroy(plain);
}

static inline void cas_data_free(cas_data *x)
{
    kva_cache_destroy(x->cache);
    kva_context_destroy(x->ref);
    free(x->kr), free(x->vr), free(x->slots), free(x->q), free(x->o_ref), free(x->l_ref);
    free(x->b.bt);
}

/* Tolerances of a cascade run against the reference (bench/data.h). */
static inline double cas_atol(kva_dtype dt)
{
    return kva_test_cascade_atol(dt);
}
static inline double cas_rtol(kva_dtype dt)
{
    return kva_test_cascade_rtol(dt);
}

/* Runs case c on a host context of backend `be` (2 threads) and compares
 * it with the reference's plain run, with and without the LSE output; the
 * plan must report c->expect_groups groups (of every level). */
static inline void cas_run_host(const cas_case *c, kva_backend be, uint64_t seed)
{
    cas_data x;
    cas_data_make(c, seed, &x);
    const size_t es = kva_dtype_size(c->dt);
    void *o = malloc(x.nq * es);
    float *l = malloc(x.nl * 4);
    kva_context *ctx = new_ctx(be, 2);
    kva_plan *plan = NULL;
    kva_plan_desc d = cas_desc(c, &x.b, c->mode, c->given);
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(plan, &info));
    CHECK_MSG(info.num_cascade_groups == c->expect_groups, "%s on %s: %d cascade groups, want %d",
              c->name, kva_backend_name(be), (int)info.num_cascade_groups, (int)c->expect_groups);
    for (int with_lse = 1; with_lse >= 0; with_lse--) {
        kva_test_poison(o, c->dt, x.nq);
        kva_test_poison(l, KVA_DTYPE_F32, x.nl);
        CHECK_OK(kva_attention_run(ctx, plan, x.q, x.cache, x.sinks, o, with_lse ? l : NULL));
        size_t bad =
            kva_test_compare("out", o, x.o_ref, c->dt, x.nq, cas_atol(c->dt), cas_rtol(c->dt));
        if (with_lse)
            bad += kva_test_compare_f32("lse", l, x.l_ref, x.nl, 1e-4, 1e-4);
        CHECK_MSG(bad == 0, "%s on %s (lse %s): %zu mismatches", c->name, kva_backend_name(be),
                  with_lse ? "on" : "off", bad);
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    cas_data_free(&x);
    free(o), free(l);
}

#endif /* KVA_TEST_CASCADE_UTIL_H */
