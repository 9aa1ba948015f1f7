/*
 * test_api_blackbox_masks.c - black-box audit, round three (session 37, task
 * api37): draft trees, chunked local attention and cascade plans on the
 * reference and CPU backends, each checked against an independent oracle
 * built from the public API alone: every query row is re-run as a one-token
 * request over exactly the keys kvattn.h says it sees (a block-size-1 cache
 * holding the same keys, one block-table entry per visible key), on the
 * reference backend. Outputs are poisoned before every run; ragged runs must
 * equal paged ones. Shapes: H 1 / 3 / 17, block sizes 1, 3, 16, 64, trees of
 * one node, 64-deep chains, 63-wide fans and masks that are no tree, chunk and
 * window edges on block boundaries, cascades whose prefix ends exactly at a
 * member's first query. test_api_blackbox_mla.c has MLA, sparse MLA and the
 * indexer; the bad cascade groupings and tree / chunk descriptors are at the
 * end of this file.
 */
#include "blackbox_util.h"
#include "tree_util.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

enum { MK_MAX_R = 6 };

/* One case: requests, shapes, masks. */
typedef struct mk_case {
    const char *name;
    int32_t R;
    int32_t ql[MK_MAX_R], sl[MK_MAX_R];
    int32_t H, Hkv, D, Dv, B;
    kva_layout layout;
    kva_dtype dt;
    int32_t window, chunk, thr;
    float softcap;
    int alibi, sinks;
    /* Tree: 0 none; 1 tree_parents of make_tree(tree_kind); 2 the same tree as
     * tree_mask; 3 a tree_mask that is no tree (random bits below the diagonal). */
    int tree, tree_kind;
    int32_t cascade; /* kva_cascade_mode (0 = AUTO) */
    int32_t share;   /* leading blocks every request shares with request 0 */
} mk_case;

/* The data of a case, built once and run on either backend. */
typedef struct mk_data {
    int32_t T, S, stride, nb;
    int32_t qsl[MK_MAX_R + 1], kvs[MK_MAX_R + 1];
    int32_t *bt, *par;
    uint8_t *mask;
    uint64_t *see; /* [T] tree words: bit k = sees tree token k */
    float *k, *v;  /* [S, Hkv, D], [S, Hkv, Dv] keys and values by position */
    int64_t *slot; /* [S] the slot of each key in the case's cache (-1: shared copy) */
    void *q;       /* [T, H, D] */
    float slopes[64], sinks[64];
} mk_data;

static int32_t mk_dv(const mk_case *c)
{
    return c->Dv ? c->Dv : c->D;
}

static void mk_build(const mk_case *c, uint64_t seed, mk_data *x)
{
    kva_rng rng = {seed};
    const int32_t Dv = mk_dv(c);
    memset(x, 0, sizeof *x);
    x->stride = 1;
    x->nb = 1;
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t n = (c->sl[r] + c->B - 1) / c->B;
        x->stride = n > x->stride ? n : x->stride;
        x->nb += n;
        x->qsl[r + 1] = x->qsl[r] + c->ql[r];
        x->kvs[r + 1] = x->kvs[r] + c->sl[r];
    }
    x->T = x->qsl[c->R];
    x->S = x->kvs[c->R];
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)x->nb);
    for (int32_t i = 0; i < x->nb; i++)
        perm[i] = i;
    for (int32_t i = x->nb - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    x->bt = malloc(sizeof(int32_t) * (size_t)(c->R * x->stride));
    int32_t used = 0;
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t n = (c->sl[r] + c->B - 1) / c->B;
        for (int32_t j = 0; j < x->stride; j++)
            x->bt[r * x->stride + j] = j >= n                  ? -1
                                       : r > 0 && j < c->share ? x->bt[j]
                                                               : perm[used + j];
        used += n;
    }
    free(perm);
    const size_t S1 = (size_t)(x->S > 0 ? x->S : 1);
    x->k = malloc(sizeof(float) * S1 * c->Hkv * c->D);
    x->v = malloc(sizeof(float) * S1 * c->Hkv * Dv);
    x->slot = malloc(sizeof(int64_t) * S1);
    kva_test_fill(x->k, KVA_DTYPE_F32, (size_t)x->S * c->Hkv * c->D, &rng, 1.0);
    kva_test_fill(x->v, KVA_DTYPE_F32, (size_t)x->S * c->Hkv * Dv, &rng, 1.0);
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t p = 0; p < c->sl[r]; p++) {
            const int32_t i = x->kvs[r] + p, shared = r > 0 && p / c->B < c->share;
            x->slot[i] = shared ? -1 : (int64_t)x->bt[r * x->stride + p / c->B] * c->B + p % c->B;
            if (shared) { /* the shared block holds request 0's keys */
                memcpy(x->k + (size_t)i * c->Hkv * c->D, x->k + (size_t)p * c->Hkv * c->D,
                       sizeof(float) * c->Hkv * c->D);
                memcpy(x->v + (size_t)i * c->Hkv * Dv, x->v + (size_t)p * c->Hkv * Dv,
                       sizeof(float) * c->Hkv * Dv);
            }
        }
    x->q = malloc(kva_dtype_size(c->dt) * (size_t)(x->T > 0 ? x->T : 1) * c->H * c->D);
    kva_test_fill(x->q, c->dt, (size_t)x->T * c->H * c->D, &rng, 1.0);
    for (int32_t h = 0; h < c->H && h < 64; h++) {
        x->slopes[h] = (float)(0.05 + 0.3 * kva_rng_unit(&rng));
        x->sinks[h] = (float)(2.0 * kva_rng_unit(&rng) - 1.0);
    }
    /* The tree of every request and its words. */
    const size_t T1 = (size_t)(x->T > 0 ? x->T : 1);
    x->par = malloc(sizeof(int32_t) * T1);
    x->see = calloc(T1, sizeof(uint64_t));
    size_t mbytes = 1;
    for (int32_t r = 0; r < c->R; r++)
        mbytes += ((size_t)c->ql[r] * c->ql[r] + 7) / 8;
    x->mask = calloc(mbytes, 1);
    if (c->tree) {
        for (int32_t r = 0; r < c->R; r++)
            make_tree(c->tree_kind, c->ql[r], &rng, x->par + x->qsl[r]);
        pack_mask(c->R, c->ql, x->par, x->mask);
        size_t byte = 0;
        for (int32_t r = 0; r < c->R; r++) {
            const int32_t q = c->ql[r];
            uint8_t *seg = x->mask + byte;
            for (int32_t i = 0; i < q; i++)
                for (int32_t k = 0; k <= i; k++) {
                    const size_t e = (size_t)i * q + k;
                    if (c->tree == 3 && k < i) { /* any lower bits: no tree */
                        if (kva_rng_int(&rng, 0, 2) == 0)
                            seg[e / 8] ^= (uint8_t)(1u << (e % 8));
                    }
                    if (seg[e / 8] >> (e % 8) & 1)
                        x->see[x->qsl[r] + i] |= (uint64_t)1 << k;
                }
            byte += ((size_t)q * q + 7) / 8;
        }
    }
}

static void mk_free(mk_data *x)
{
    free(x->bt);
    free(x->par);
    free(x->mask);
    free(x->see);
    free(x->k);
    free(x->v);
    free(x->slot);
    free(x->q);
}

static kva_plan_desc mk_desc(const mk_case *c, const mk_data *x)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = c->R;
    d.query_start_loc = x->qsl;
    d.seq_lens = c->sl;
    d.block_table = x->bt;
    d.block_table_stride = x->stride;
    d.block_size = c->B;
    d.decode_threshold = c->thr;
    d.num_heads = c->H;
    d.num_kv_heads = c->Hkv;
    d.head_dim = c->D;
    d.head_dim_v = c->Dv;
    d.q_dtype = c->dt;
    d.causal = 1;
    d.window_left = c->window;
    d.attention_chunk = c->chunk;
    d.softcap = c->softcap;
    d.alibi_slopes = c->alibi ? x->slopes : NULL;
    d.tree_parents = c->tree == 1 ? x->par : NULL;
    d.tree_mask = c->tree >= 2 ? x->mask : NULL;
    d.cascade = c->cascade;
    return d;
}

/* Whether token t (request r, query i) sees key position j (kvattn.h's rule). */
static int mk_visible(const mk_case *c, const mk_data *x, int32_t r, int32_t i, int32_t j)
{
    const int32_t s = c->sl[r], q = c->ql[r], pos = s - q + i;
    if (j > pos)
        return 0;
    if (c->window >= 0 && pos - j > c->window)
        return 0;
    if (c->chunk > 0 && j / c->chunk != pos / c->chunk)
        return 0;
    if (c->tree && j >= s - q && !(x->see[x->qsl[r] + i] >> (j - (s - q)) & 1))
        return 0;
    return 1;
}

/* The oracle: every row as a one-token request over its visible keys, in
 * position order, on the reference backend over a block-size-1 cache (slot =
 * the key's index in x->k). The visible keys of a row with ALiBi are
 * contiguous and end at the row's own position, so j - pos is kept. */
static void mk_oracle(const mk_case *c, const mk_data *x, void *out, float *lse)
{
    const int32_t Dv = mk_dv(c), T = x->T;
    int32_t *qsl = malloc(sizeof(int32_t) * (size_t)(T + 1)), *sl = malloc(sizeof(int32_t) * T);
    int32_t maxn = 1;
    for (int32_t r = 0; r < c->R; r++)
        maxn = c->sl[r] > maxn ? c->sl[r] : maxn;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)T * maxn);
    qsl[0] = 0;
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t i = 0; i < c->ql[r]; i++) {
            const int32_t t = x->qsl[r] + i;
            int32_t n = 0;
            for (int32_t j = 0; j < c->sl[r]; j++)
                if (mk_visible(c, x, r, i, j))
                    bt[(size_t)t * maxn + n++] = x->kvs[r] + j;
            for (int32_t j = n; j < maxn; j++)
                bt[(size_t)t * maxn + j] = -1;
            sl[t] = n;
            qsl[t + 1] = t + 1;
        }
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    kva_cache_desc cd = make_desc(x->S, 1, c->Hkv, c->D, c->Dv, c->dt, KVA_LAYOUT_NHD);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)x->S);
    for (int32_t i = 0; i < x->S; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ctx, cache, x->S, x->k, 0, x->v, 0, KVA_DTYPE_F32, slots));
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = T;
    d.query_start_loc = qsl;
    d.seq_lens = sl;
    d.block_table = bt;
    d.block_table_stride = maxn;
    d.block_size = 1;
    d.num_heads = c->H;
    d.num_kv_heads = c->Hkv;
    d.head_dim = c->D;
    d.head_dim_v = c->Dv;
    d.q_dtype = c->dt;
    d.causal = 1;
    d.window_left = -1;
    d.softcap = c->softcap;
    d.alibi_slopes = c->alibi ? x->slopes : NULL;
    d.cascade = KVA_CASCADE_OFF;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    kva_test_poison(out, c->dt, (size_t)T * c->H * Dv);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * c->H);
    CHECK_OK(kva_attention_run(ctx, p, x->q, cache, c->sinks ? x->sinks : NULL, out, lse));
    kva_plan_destroy(p);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(slots);
    free(bt);
    free(sl);
    free(qsl);
}

/* Runs a case on backend be (paged, and ragged where the plan allows it) and
 * compares with the oracle; returns the mismatches. */
static size_t mk_run(const mk_case *c, kva_backend be, uint64_t seed)
{
    mk_data x;
    mk_build(c, seed, &x);
    const int32_t Dv = mk_dv(c), T = x.T;
    const size_t es = kva_dtype_size(c->dt), on = (size_t)T * c->H * Dv;
    kva_context *ctx = new_ctx(be, 3);
    kva_cache_desc cd = make_desc(x.nb, c->B, c->Hkv, c->D, c->Dv, c->dt, c->layout);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    kva_rng rng = {seed ^ 77};
    fill_cache(cache, &rng); /* keys no plan should read: random, not zeros */
    CHECK_OK(kva_cache_write(ctx, cache, x.S, x.k, 0, x.v, 0, KVA_DTYPE_F32, x.slot));
    kva_plan_desc pd = mk_desc(c, &x);
    kva_plan *p = NULL;
    size_t bad = 0;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    if (!p) {
        bad = 1;
        goto done;
    }
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(p, &info));
    if (c->cascade == KVA_CASCADE_ON)
        CHECK_MSG(info.num_cascade_groups > 0, "%s: no cascade group", c->name);
    void *out = malloc(es * (on ? on : 1)), *want = malloc(es * (on ? on : 1));
    float *lse = malloc(sizeof(float) * (size_t)(T ? T : 1) * c->H);
    float *wl = malloc(sizeof(float) * (size_t)(T ? T : 1) * c->H);
    const float *sinks = c->sinks ? x.sinks : NULL;
    kva_test_poison(out, c->dt, on);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * c->H);
    CHECK_OK(kva_attention_run(ctx, p, x.q, cache, sinks, out, lse));
    /* lse NULL (a cascade then keeps its suffix LSE in the workspace): the
     * same out, byte for byte. */
    void *out2 = malloc(es * (on ? on : 1));
    kva_test_poison(out2, c->dt, on);
    CHECK_OK(kva_attention_run(ctx, p, x.q, cache, sinks, out2, NULL));
    CHECK_MSG(memcmp(out, out2, es * on) == 0, "%s: lse NULL changed out", c->name);
    free(out2);
    mk_oracle(c, &x, want, wl);
    const int cas = info.num_cascade_groups > 0;
    const double at = cas ? kva_test_cascade_atol(c->dt) : 2 * kva_test_atol(c->dt) + 1e-5;
    const double rt = cas ? kva_test_cascade_rtol(c->dt) : 2 * kva_test_rtol(c->dt);
    bad += kva_test_compare(c->name, out, want, c->dt, on, at, rt);
    bad += kva_test_compare_f32(c->name, lse, wl, (size_t)T * c->H, 1e-4, 1e-5);
    if (!cas) { /* ragged: the same keys packed per request in q_dtype */
        const size_t kn = (size_t)x.S * c->Hkv * c->D, vn = (size_t)x.S * c->Hkv * Dv;
        void *k = malloc(es * (kn ? kn : 1)), *v = malloc(es * (vn ? vn : 1));
        CHECK_OK(kva_convert(x.k, KVA_DTYPE_F32, k, c->dt, kn));
        CHECK_OK(kva_convert(x.v, KVA_DTYPE_F32, v, c->dt, vn));
        kva_test_poison(out, c->dt, on);
        kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * c->H);
        CHECK_OK(kva_attention_run_ragged(ctx, p, x.q, k, v, sinks, out, lse));
        bad += kva_test_compare(c->name, out, want, c->dt, on, at, rt);
        bad += kva_test_compare_f32(c->name, lse, wl, (size_t)T * c->H, 1e-4, 1e-5);
        free(k);
        free(v);
    }
    free(out);
    free(want);
    free(lse);
    free(wl);
done:
    kva_plan_destroy(p);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    mk_free(&x);
    return bad;
}

static void mk_cases(const mk_case *cs, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        for (int bi = 0; bi < 2; bi++) {
            const size_t bad = mk_run(&cs[i], kBk[bi], seed + i);
            CHECK_MSG(bad == 0, "%s on %s: %zu mismatches", cs[i].name, kva_backend_name(kBk[bi]),
                      bad);
        }
}

#define F32 KVA_DTYPE_F32
#define F16 KVA_DTYPE_F16
#define BF16 KVA_DTYPE_BF16
#define NHD KVA_LAYOUT_NHD
#define HND KVA_LAYOUT_HND

/* Draft trees: one node, a 64-deep chain, a 63-wide fan, random trees given
 * as parents and as masks, a mask that is no tree; as decodes (threshold 64)
 * and as prefills (threshold 1), with q_len 0 requests and trees without
 * committed context (seq_len = q_len). */
static void test_trees(void)
{
    /* clang-format off */
    static const mk_case cs[] = {
        {"tree one node", 2, {1, 1}, {5, 1}, 3, 1, 16, 0, 3, NHD, F32, -1, 0, 0, 0, 0, 0, 1,
         TREE_RANDOM},
        {"tree one node dec", 2, {1, 1}, {5, 1}, 3, 1, 16, 0, 3, NHD, F32, -1, 0, 64, 0, 0, 1, 2,
         TREE_RANDOM},
        {"tree chain 64", 1, {64}, {70}, 2, 2, 8, 24, 16, NHD, F32, -1, 0, 0, 0, 0, 0, 1,
         TREE_CHAIN},
        {"tree chain 64 dec", 1, {64}, {70}, 2, 2, 8, 24, 16, HND, F16, -1, 0, 64, 0, 0, 1, 1,
         TREE_CHAIN},
        {"tree fan 64", 3, {64, 0, 3}, {64, 4, 3}, 17, 1, 16, 0, 64, NHD, F32, -1, 0, 0, 0, 0, 1, 2,
         TREE_STAR},
        {"tree fan 64 dec", 3, {64, 0, 3}, {64, 4, 3}, 17, 1, 16, 0, 64, NHD, BF16, -1, 0, 64, 0, 0,
         0, 1, TREE_STAR},
        {"tree random mask", 4, {5, 9, 0, 2}, {20, 9, 3, 40}, 4, 2, 32, 0, 1, HND, F16, -1, 0, 8,
         5.0f, 0, 1, 2, TREE_RANDOM},
        {"tree random prefill", 4, {5, 9, 0, 2}, {20, 9, 3, 40}, 4, 2, 32, 0, 1, NHD, F32, -1, 0, 0,
         5.0f, 0, 1, 1, TREE_RANDOM},
        {"tree no-tree mask", 3, {7, 13, 1}, {30, 16, 2}, 6, 3, 16, 8, 3, NHD, F32, -1, 0, 16, 0, 0,
         1, 3, TREE_RANDOM},
        {"tree no-tree mask prefill", 3, {7, 13, 1}, {30, 16, 2}, 6, 3, 16, 8, 3, NHD, BF16, -1, 0,
         0, 0, 0, 0, 3, TREE_RANDOM},
        {"tree long context", 2, {7, 12}, {3000, 2012}, 4, 1, 16, 0, 16, NHD, F32, -1, 0, 16, 0,
         0, 1, 1, TREE_RANDOM},
        {"tree depth8", 2, {33, 12}, {33, 100}, 1, 1, 40, 0, 16, NHD, F32, -1, 0, 64, 0, 0, 1, 1,
         TREE_DEPTH8},
    };
    /* clang-format on */
    mk_cases(cs, sizeof cs / sizeof cs[0], 3700);
}

/* Chunked local attention: chunks of 1, of one block, of an odd size over
 * blocks of 64, wider than every sequence; windows ending on chunk and block
 * edges; sequences ending one before, on and one after a chunk edge; with
 * soft-cap, ALiBi and sinks; decodes, speculative decodes and prefills. */
static void test_chunks(void)
{
    /* clang-format off */
    static const mk_case cs[] = {
        {"chunk = B 16", 3, {1, 20, 5}, {16, 48, 33}, 4, 2, 16, 0, 16, NHD, F32, -1, 16},
        {"chunk = B 16 spec", 3, {1, 3, 4}, {17, 32, 33}, 4, 2, 16, 0, 16, HND, F16, -1, 16, 4},
        {"chunk 3 window 1", 2, {7, 1}, {9, 3}, 3, 1, 8, 0, 3, NHD, F32, 1, 3},
        {"chunk 1", 2, {4, 1}, {6, 2}, 2, 1, 16, 0, 1, NHD, F32, -1, 1, 0, 0, 0, 1},
        {"chunk 17 B 64", 3, {40, 1, 3}, {130, 64, 65}, 17, 1, 24, 0, 64, HND, BF16, -1, 17, 4,
         20.0f, 1, 1},
        {"chunk 64 window 62", 2, {65, 1}, {128, 129}, 2, 2, 16, 8, 16, NHD, F32, 62, 64},
        {"chunk 32 window 16", 2, {40, 2}, {96, 64}, 3, 3, 8, 0, 16, NHD, F16, 16, 32, 0, 0, 1, 1},
        {"chunk wider than seq", 2, {10, 1}, {50, 7}, 1, 1, 16, 0, 3, NHD, F32, -1, 1000, 0, 0, 0,
         1},
        {"chunk long split", 3, {1, 3, 1}, {2500, 2999, 1000}, 4, 2, 16, 0, 16, NHD, F32, 700,
         1000, 4, 0, 0, 1},
        {"chunk long prefill", 1, {300}, {2200}, 2, 1, 16, 0, 64, HND, F16, -1, 1024},
        {"chunk 48 on q edge", 4, {48, 1, 49, 0}, {96, 48, 97, 5}, 4, 1, 8, 0, 16, NHD, F32, -1, 48,
         1, 3.0f, 1, 0},
    };
    /* clang-format on */
    mk_cases(cs, sizeof cs / sizeof cs[0], 3720);
}

/* Cascades found from the block table (ON), including a member whose first
 * query is exactly where the shared blocks end, one that cannot share its
 * last shared block, block sizes 1 and 64, H 17 over one kv head. */
static void test_cascades(void)
{
    /* clang-format off */
    static const mk_case cs[] = {
        {"cascade B16", 4, {1, 1, 3, 1}, {40, 33, 50, 32}, 4, 2, 16, 0, 16, NHD, F32, -1, 0, 0, 0,
         0, 1, 0, 0, KVA_CASCADE_ON, 2},
        {"cascade B1", 3, {1, 2, 1}, {45, 42, 41}, 17, 1, 16, 0, 1, HND, F16, -1, 0, 0, 0, 0, 1, 0,
         0, KVA_CASCADE_ON, 40},
        {"cascade B64 edge", 3, {70, 65, 2}, {200, 129, 66}, 3, 1, 8, 16, 64, NHD, F32, -1, 0, 0,
         2.0f, 0, 0, 0, 0, KVA_CASCADE_ON, 1},
        {"cascade B3 bf16", 5, {1, 0, 4, 1, 1}, {10, 4, 13, 9, 12}, 6, 2, 24, 0, 3, NHD, BF16, -1,
         0, 4, 0, 0, 1, 0, 0, KVA_CASCADE_ON, 3},
    };
    /* clang-format on */
    mk_cases(cs, sizeof cs / sizeof cs[0], 3740);
}

/* One bad descriptor: kva_plan_create fails with st, says why (the message
 * names what), leaves *out alone; kva_plan_update fails alike with the same
 * message and leaves the plan as it was. */
static void mk_bad(kva_context *ctx, kva_plan *plan, const kva_plan_desc *d, kva_status st,
                   const char *what, const char *label)
{
    kva_plan_info before, after;
    CHECK_OK(kva_plan_get_info(plan, &before));
    kva_plan *o = (kva_plan *)&before;
    const kva_status got = kva_plan_create(ctx, d, &o);
    CHECK_MSG(got == st, "%s: create returned %s, expected %s (%s)", label, kva_status_name(got),
              kva_status_name(st), kva_last_error());
    CHECK_MSG(o == (kva_plan *)&before, "%s: *out written", label);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kva_last_error());
    CHECK_MSG(strstr(msg, what) != NULL, "%s: message '%s' lacks '%s'", label, msg, what);
    const kva_status gu = kva_plan_update(ctx, plan, d);
    CHECK_MSG(gu == st, "%s: update returned %s, expected %s", label, kva_status_name(gu),
              kva_status_name(st));
    CHECK_MSG(strcmp(msg, kva_last_error()) == 0, "%s: update says '%s', create '%s'", label,
              kva_last_error(), msg);
    CHECK_OK(kva_plan_get_info(plan, &after));
    CHECK_MSG(memcmp(&before, &after, sizeof before) == 0, "%s: plan info changed", label);
}

/* Bad trees, chunks and cascade groupings, and the valid edges next to them,
 * on both backends; afterwards the plan still gives the output it gave. */
static void test_bad_descs(void)
{
    enum { R = 4, B = 4, H = 2, D = 8 };
    /* Requests 0..2 share two blocks; request 3 has q_len 0. */
    const int32_t qsl[R + 1] = {0, 1, 3, 4, 4}, sl[R] = {12, 10, 8, 2};
    const int32_t bt[R * 3] = {7, 2, 5, 7, 2, 0, 7, 2, -1, 1, -1, -1};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 2);
        kva_cache_desc cd = make_desc(8, B, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *cache = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &cache));
        kva_rng rng = {3760 + (uint64_t)bi};
        fill_cache(cache, &rng);
        float q[4 * H * D], out0[4 * H * D], out1[4 * H * D], lse0[4 * H], lse1[4 * H];
        kva_test_fill(q, KVA_DTYPE_F32, 4 * H * D, &rng, 1.0);
        kva_plan_desc ok;
        memset(&ok, 0, sizeof ok);
        ok.num_requests = R;
        ok.query_start_loc = qsl;
        ok.seq_lens = sl;
        ok.block_table = bt;
        ok.block_table_stride = 3;
        ok.block_size = B;
        ok.num_heads = H;
        ok.num_kv_heads = 1;
        ok.head_dim = D;
        ok.q_dtype = KVA_DTYPE_F32;
        ok.causal = 1;
        ok.window_left = -1;
        ok.cascade = KVA_CASCADE_ON;
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &ok, &plan));
        kva_test_poison(out0, KVA_DTYPE_F32, 4 * H * D);
        kva_test_poison(lse0, KVA_DTYPE_F32, 4 * H);
        CHECK_OK(kva_attention_run(ctx, plan, q, cache, NULL, out0, lse0));
        /* The runs below are compared with these bytes: all written. */
        CHECK(kva_test_count_poisoned(out0, KVA_DTYPE_F32, 4 * H * D) == 0 &&
              kva_test_count_poisoned(lse0, KVA_DTYPE_F32, 4 * H) == 0);

        /* Given groupings: valid edges first (a prefix ending exactly at
         * request 1's first query, 10 - 2 = 8; one member; nested groups). */
        int32_t grp[R] = {0, 0, -1, -1}, plen[4] = {8, 4, 4, 8}, gpar[4] = {-1, -1, -1, -1};
        kva_plan_desc d = ok;
        d.num_cascade_groups = 1;
        d.cascade_group = grp;
        d.cascade_prefix_len = plen;
        kva_plan *p2 = NULL;
        CHECK_OK(kva_plan_create(ctx, &d, &p2)); /* requests 0, 1 share 8 tokens */
        kva_plan_destroy(p2);
        p2 = NULL;
        grp[0] = -1, grp[1] = 0, plen[0] = 8;
        CHECK_OK(kva_plan_create(ctx, &d, &p2)); /* one member */
        kva_plan_destroy(p2);
        p2 = NULL;
        int32_t grp2[R] = {1, 1, 0, 7}; /* request 3 (q_len 0) names no valid group */
        d.num_cascade_groups = 2;
        d.cascade_group = grp2;
        d.cascade_prefix_len = plen + 1; /* group 0: 4 tokens, group 1: 4 */
        d.cascade_parent = gpar;
        mk_bad(ctx, plan, &d, KVA_STATUS_OUT_OF_RANGE, "cascade_group[3]", "q_len 0 group 7");
        grp2[3] = -1;
        gpar[1] = 0;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "not more than its parent",
               "child prefix = parent prefix");
        int32_t plen2[2] = {4, 8};
        d.cascade_prefix_len = plen2; /* group 1 nested in group 0 */
        CHECK_OK(kva_plan_create(ctx, &d, &p2));
        if (p2) {
            kva_test_poison(out1, KVA_DTYPE_F32, 4 * H * D);
            kva_test_poison(lse1, KVA_DTYPE_F32, 4 * H);
            CHECK_OK(kva_attention_run(ctx, p2, q, cache, NULL, out1, lse1));
            CHECK(kva_test_compare("nested", out1, out0, KVA_DTYPE_F32, 4 * H * D, 1e-4, 1e-4) ==
                  0);
        }
        kva_plan_destroy(p2);
        p2 = NULL;
        gpar[1] = 1;
        mk_bad(ctx, plan, &d, KVA_STATUS_OUT_OF_RANGE, "cascade_parent[1]", "parent = self");
        gpar[1] = 0;
        d.cascade_parent = NULL;
        d.num_cascade_groups = 1;
        d.cascade_group = grp;
        grp[0] = 0, grp[1] = 0, grp[2] = 0;
        plen[0] = 8; /* request 2's first query is at 7 */
        d.cascade_prefix_len = plen;
        mk_bad(ctx, plan, &d, KVA_STATUS_OUT_OF_RANGE, "first query", "prefix past a query");
        plen[0] = 6;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "cascade_prefix_len[0]", "prefix 6");
        plen[0] = 0;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "cascade_prefix_len[0]", "prefix 0");
        plen[0] = 4;
        grp[2] = -1, grp[3] = 0; /* q_len 0 member whose blocks differ: ignored */
        CHECK_OK(kva_plan_create(ctx, &d, &p2));
        kva_plan_destroy(p2);
        p2 = NULL;
        grp[3] = -2;
        mk_bad(ctx, plan, &d, KVA_STATUS_OUT_OF_RANGE, "cascade_group[3]", "group -2");
        grp[3] = -1;
        int32_t bt2[R * 3];
        memcpy(bt2, bt, sizeof bt2);
        bt2[3] = 6; /* request 1's first block differs */
        d.block_table = bt2;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "does not share", "differing block");
        d.cascade = KVA_CASCADE_OFF; /* still validated */
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "does not share", "OFF, bad grouping");
        d.cascade = KVA_CASCADE_AUTO;
        d.window_left = 5; /* a declining plan's grouping is validated too */
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "does not share", "window, bad group");
        d = ok;
        d.num_cascade_groups = 1;
        mk_bad(ctx, plan, &d, KVA_STATUS_NULL_POINTER, "cascade_group", "groups, no array");
        d.cascade_group = grp;
        mk_bad(ctx, plan, &d, KVA_STATUS_NULL_POINTER, "cascade_prefix_len", "no prefix array");
        d.num_cascade_groups = R + 1;
        d.cascade_prefix_len = plen;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "num_cascade_groups", "G > R");
        d = ok;
        d.cascade = 3;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "cascade = 3", "mode 3");
        d.cascade = -1;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "cascade = -1", "mode -1");
        d = ok;
        d.attention_chunk = 4;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "attention_chunk", "chunk + cascade ON");
        d.cascade = KVA_CASCADE_AUTO;
        CHECK_OK(kva_plan_create(ctx, &d, &p2)); /* AUTO declines it: a plain plan */
        if (p2) {
            kva_plan_info in;
            CHECK_OK(kva_plan_get_info(p2, &in));
            CHECK(in.num_cascade_groups == 0);
        }
        kva_plan_destroy(p2);
        p2 = NULL;
        d.causal = 0;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "attention_chunk", "chunk, not causal");
        d.causal = 1;
        d.attention_chunk = -1;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "attention_chunk", "chunk -1");

        /* Trees: parents out of order, masks without the diagonal or with a
         * bit above it, too many tokens, masks it cannot take. */
        int32_t tp[65] = {-1, -1, 0, -1};
        uint8_t tm[4] = {0x01, 0x0d, 0x01, 0x00}; /* r0: 1x1; r1: 2x2 = bits 0, 2, 3 */
        d = ok;
        d.cascade = KVA_CASCADE_AUTO;
        d.tree_parents = tp;
        CHECK_OK(kva_plan_create(ctx, &d, &p2));
        kva_plan_destroy(p2);
        p2 = NULL;
        d.tree_mask = tm;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "both", "parents and mask");
        d.tree_mask = NULL;
        tp[2] = 1; /* token 1 of request 1 names itself */
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "tree_parents[2]", "self parent");
        tp[2] = -2;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "tree_parents[2]", "parent -2");
        tp[2] = 0;
        d.cascade = KVA_CASCADE_ON;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "tree", "tree + cascade ON");
        d.cascade = KVA_CASCADE_AUTO;
        d.causal = 0;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "causal", "tree, not causal");
        d.causal = 1;
        d.window_left = 3;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "window_left", "tree + window");
        d.window_left = -1;
        d.attention_chunk = 8;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "attention_chunk", "tree + chunk");
        d.attention_chunk = 0;
        d.tree_parents = NULL;
        d.tree_mask = tm;
        CHECK_OK(kva_plan_create(ctx, &d, &p2));
        kva_plan_destroy(p2);
        p2 = NULL;
        tm[1] = 0x05; /* request 1's row 1 (bits 2, 3) lacks its diagonal bit 3 */
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "diagonal", "no diagonal");
        tm[1] = 0x0f; /* row 0 sees token 1 after it */
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "after it", "bit above");
        tm[1] = 0x0d;
        tm[0] = 0x00;
        mk_bad(ctx, plan, &d, KVA_STATUS_INVALID_ARGUMENT, "diagonal", "empty 1x1 row");
        tm[0] = 0x01;
        int32_t qbig[R + 1] = {0, 65, 65, 65, 65}, sbig[R] = {65, 1, 1, 1};
        int32_t btbig[R * 17];
        for (int i = 0; i < R * 17; i++)
            btbig[i] = i < 17 ? i % 8 : -1;
        d.tree_mask = NULL;
        d.tree_parents = tp;
        d.query_start_loc = qbig;
        d.seq_lens = sbig;
        d.block_table = btbig;
        d.block_table_stride = 17;
        mk_bad(ctx, plan, &d, KVA_STATUS_UNSUPPORTED, "KVA_MAX_TREE_TOKENS", "tree of 65");

        /* The plan still runs as before every failed update. */
        kva_test_poison(out1, KVA_DTYPE_F32, 4 * H * D);
        kva_test_poison(lse1, KVA_DTYPE_F32, 4 * H);
        CHECK_OK(kva_attention_run(ctx, plan, q, cache, NULL, out1, lse1));
        CHECK(memcmp(out0, out1, sizeof out0) == 0 && memcmp(lse0, lse1, sizeof lse0) == 0);
        kva_plan_destroy(plan);
        kva_cache_destroy(cache);
        kva_context_destroy(ctx);
    }
}

/* window_left >= KVA_MAX_SEQ_LEN is no window (kvattn.h), so the plans that
 * take no window take it: trees, MLA plans, indexer plans; and a cascade
 * plan (ON) with it cascades. */
static void test_wide_window_is_none(void)
{
    const int32_t qsl[3] = {0, 1, 3}, sl[2] = {9, 8}, bt[6] = {3, 1, 2, 3, 1, -1};
    const int32_t tp[3] = {-1, -1, 0};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 2);
        kva_plan_desc d;
        memset(&d, 0, sizeof d);
        d.num_requests = 2;
        d.query_start_loc = qsl;
        d.seq_lens = sl;
        d.block_table = bt;
        d.block_table_stride = 3;
        d.block_size = 4;
        d.num_heads = 2;
        d.num_kv_heads = 1;
        d.head_dim = 8;
        d.q_dtype = KVA_DTYPE_F32;
        d.causal = 1;
        d.window_left = KVA_MAX_SEQ_LEN;
        kva_plan *p = NULL;
        d.tree_parents = tp;
        CHECK_OK(kva_plan_create(ctx, &d, &p)); /* tree */
        kva_plan_destroy(p);
        p = NULL;
        d.tree_parents = NULL;
        d.cascade = KVA_CASCADE_ON;
        CHECK_OK(kva_plan_create(ctx, &d, &p)); /* cascade */
        kva_plan_info in = {0};
        if (p)
            CHECK_OK(kva_plan_get_info(p, &in));
        CHECK(in.num_cascade_groups == 1);
        kva_plan_destroy(p);
        p = NULL;
        d.cascade = 0;
        d.kind = KVA_ATTN_MLA;
        d.head_dim = 16;
        d.head_dim_v = 8;
        d.scale = 0.5f;
        CHECK_OK(kva_plan_create(ctx, &d, &p)); /* MLA */
        kva_plan_destroy(p);
        p = NULL;
        d.sparse_topk = 4;
        CHECK_OK(kva_plan_create(ctx, &d, &p)); /* sparse MLA */
        kva_plan_destroy(p);
        p = NULL;
        d.sparse_topk = 0;
        d.kind = KVA_ATTN_INDEX;
        d.head_dim_v = 0;
        d.sparse_topk = 4;
        CHECK_OK(kva_plan_create(ctx, &d, &p)); /* indexer */
        kva_plan_destroy(p);
        kva_context_destroy(ctx);
    }
}

int main(void)
{
    RUN(test_trees);
    RUN(test_chunks);
    RUN(test_cascades);
    RUN(test_bad_descs);
    RUN(test_wide_window_is_none);
    return kva_test_finish();
}
