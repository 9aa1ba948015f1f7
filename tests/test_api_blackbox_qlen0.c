/*
 * test_api_blackbox_qlen0.c - black-box: requests with q_len 0 inside mixed
 * batches, on every plan kind. kvattn.h: "Requests with q_len 0 produce no
 * rows", and their block-table rows "may hold any value". A batch with
 * such a request between two others, its seq_len 15 (4 blocks) and its row
 * holding garbage block ids (negative, INT32_MAX, past the cache, NB), must
 * compute what the batch without it computes: plain, cascade (found and given groupings), draft
 * tree, DCP, windows / ALiBi / soft-cap / sinks, local chunks, the absorbed
 * and layer-level MLA calls, sparse MLA and the indexer, on the reference
 * and CPU backends (CPU: 1 and 3 threads). Outputs are poisoned first.
 */
#include "blackbox_util.h"

enum { NB = 16, B = 4, HKV = 2, H = 4, D = 16, STRIDE = 4, MAXT = 8 };

/* The two batches: with the q_len 0 request (index 1) and without it. The
 * rows of requests 0 and 2 start with block 3 (a shared 4-token prefix: a
 * cascade group). */
static const int32_t kQslWith[4] = {0, 2, 2, 5}, kQslWithout[3] = {0, 2, 5};
static const int32_t kSlWith[3] = {9, 15, 7}, kSlWithout[2] = {9, 7};
static const int32_t kBtWith[3 * STRIDE] = {3, 5, 7, -1, -7, INT32_MAX, 999, NB, 3, 6, -1, -1};
static const int32_t kBtWithout[2 * STRIDE] = {3, 5, 7, -1, 3, 6, -1, -1};

typedef struct variant {
    const char *name;
    int32_t window, chunk, cascade, given_groups, tree, dcp_size, dcp_rank;
    float softcap;
    int alibi, sinks;
} variant;

static const variant kVariants[] = {
    {"plain", -1, 0, KVA_CASCADE_OFF, 0, 0, 0, 0, 0.0f, 0, 0},
    {"cascade found", -1, 0, KVA_CASCADE_ON, 0, 0, 0, 0, 0.0f, 0, 0},
    {"cascade given", -1, 0, KVA_CASCADE_ON, 1, 0, 0, 0, 0.0f, 0, 0},
    {"tree", -1, 0, KVA_CASCADE_OFF, 0, 1, 0, 0, 0.0f, 0, 0},
    {"dcp rank 1 of 2", -1, 0, KVA_CASCADE_OFF, 0, 0, 2, 1, 0.0f, 0, 0},
    {"window alibi softcap sinks", 3, 0, KVA_CASCADE_OFF, 0, 0, 0, 0, 5.0f, 1, 1},
    {"chunk", -1, 4, KVA_CASCADE_OFF, 0, 0, 0, 0, 0.0f, 0, 1},
};

static kva_plan_desc mha_desc(const variant *v, int with, int32_t *groups, int32_t *prefix,
                              int32_t *parents, const float *slopes)
{
    kva_plan_desc d = {0};
    d.num_requests = with ? 3 : 2;
    d.query_start_loc = with ? kQslWith : kQslWithout;
    d.seq_lens = with ? kSlWith : kSlWithout;
    d.block_table = with ? kBtWith : kBtWithout;
    d.block_table_stride = STRIDE;
    d.block_size = B;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.q_dtype = KVA_DTYPE_F32;
    d.causal = 1;
    d.window_left = v->window;
    d.softcap = v->softcap;
    d.alibi_slopes = v->alibi ? slopes : NULL;
    d.attention_chunk = v->chunk;
    d.cascade = v->cascade;
    d.dcp_size = v->dcp_size;
    d.dcp_rank = v->dcp_rank;
    if (v->given_groups) {
        /* Requests 0 and 2 share block 3; the q_len 0 request's entry may be
         * -1 or a group (kvattn.h): give it the group. */
        groups[0] = 0;
        groups[1] = with ? 0 : 0;
        groups[with ? 2 : 1] = 0;
        prefix[0] = B;
        d.num_cascade_groups = 1;
        d.cascade_group = groups;
        d.cascade_prefix_len = prefix;
    }
    if (v->tree) {
        /* Request 0's two tokens: a root and its child; request 2's three:
         * a root and two children of it (siblings). */
        const int32_t p[5] = {-1, 0, -1, 0, 0};
        memcpy(parents, p, sizeof p);
        d.tree_parents = parents;
    }
    return d;
}

/* out / lse of one run of the MHA batch (with or without the q_len 0
 * request); 0 if the plan or run failed. */
static int run_mha(kva_context *ctx, const kva_cache *c, const variant *v, int with, const float *q,
                   const float *sinks, float *out, float *lse)
{
    int32_t groups[3], prefix[1], parents[5];
    const float slopes[H] = {0.5f, 0.25f, 0.125f, 0.0625f};
    kva_plan_desc d = mha_desc(v, with, groups, prefix, parents, slopes);
    kva_plan *p = NULL;
    kva_status st = kva_plan_create(ctx, &d, &p);
    CHECK_MSG(st == KVA_STATUS_OK, "%s (%s): plan: %s", v->name, with ? "with" : "without",
              kva_last_error());
    if (st != KVA_STATUS_OK)
        return 0;
    kva_test_poison(out, KVA_DTYPE_F32, 5 * H * D);
    kva_test_poison(lse, KVA_DTYPE_F32, 5 * H);
    st = kva_attention_run(ctx, p, q, c, v->sinks ? sinks : NULL, out, lse);
    CHECK_MSG(st == KVA_STATUS_OK, "%s (%s): run: %s", v->name, with ? "with" : "without",
              kva_last_error());
    if (v->cascade == KVA_CASCADE_ON && with) {
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(p, &info));
        CHECK_MSG(info.num_cascade_groups == 1, "%s: %d cascade groups, expected 1", v->name,
                  (int)info.num_cascade_groups);
    }
    kva_plan_destroy(p);
    return st == KVA_STATUS_OK;
}

/* The same rows with and without the q_len 0 request, every output written. */
static void compare(const char *what, const char *backend, const float *a, const float *b, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !(fabsf(a[i] - b[i]) <= 1e-6f * (1.0f + fabsf(b[i])));
    CHECK_MSG(bad == 0, "%s (%s): %zu of %zu values differ with a q_len 0 request", what, backend,
              bad, n);
}

static void test_mha_kinds(void)
{
    const kva_backend bk[3] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CPU};
    const int32_t threads[3] = {1, 1, 3};
    for (int bi = 0; bi < 3; bi++) {
        kva_rng rng = {4100 + (uint64_t)bi};
        kva_context *ctx = new_ctx(bk[bi], threads[bi]);
        kva_cache_desc cd = make_desc(NB, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        if (!c)
            continue;
        fill_cache(c, &rng);
        float q[5 * H * D], sinks[H], o1[5 * H * D], o2[5 * H * D], l1[5 * H], l2[5 * H];
        kva_test_fill(q, KVA_DTYPE_F32, 5 * H * D, &rng, 1.0);
        kva_test_fill(sinks, KVA_DTYPE_F32, H, &rng, 1.0);
        for (size_t vi = 0; vi < sizeof kVariants / sizeof kVariants[0]; vi++) {
            const variant *v = &kVariants[vi];
            if (bk[bi] == KVA_BACKEND_REF && v->cascade == KVA_CASCADE_ON)
                continue; /* cascades are the CPU backend's (the reference declines ON) */
            if (!run_mha(ctx, c, v, 1, q, sinks, o1, l1) ||
                !run_mha(ctx, c, v, 0, q, sinks, o2, l2))
                continue;
            char name[96];
            snprintf(name, sizeof name, "%s, %d threads", v->name, (int)threads[bi]);
            compare(name, kva_backend_name(bk[bi]), o1, o2, 5 * H * D);
            compare(name, kva_backend_name(bk[bi]), l1, l2, 5 * H);
        }
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

/* The latent kinds: an MLA cache [NB, B, Dc + Dr] read by the absorbed call,
 * the layer-level call and sparse MLA (both modes), and an index-key cache
 * read by the indexer; the same two batches. */
enum { DC = 16, DR = 8, DN = 8, DVL = 8, TOPK = 4, HI = 4, DI = 16 };

static kva_plan_desc latent_desc(int with, kva_attn_kind kind, int32_t topk, int32_t mode)
{
    kva_plan_desc d = {0};
    d.num_requests = with ? 3 : 2;
    d.query_start_loc = with ? kQslWith : kQslWithout;
    d.seq_lens = with ? kSlWith : kSlWithout;
    d.block_table = with ? kBtWith : kBtWithout;
    d.block_table_stride = STRIDE;
    d.block_size = B;
    d.num_kv_heads = 1;
    d.q_dtype = KVA_DTYPE_F32;
    d.causal = 1;
    d.window_left = -1;
    d.kind = kind;
    d.sparse_topk = topk;
    d.sparse_mode = mode;
    d.decode_threshold = 1;
    if (kind == KVA_ATTN_MLA) {
        d.num_heads = H;
        d.head_dim = DC + DR;
        d.head_dim_v = DC;
        d.scale = 0.3f;
        if (!topk) {
            d.mla_qk_nope_head_dim = DN;
            d.mla_v_head_dim = DVL;
        }
    } else {
        d.num_heads = HI;
        d.head_dim = DI;
    }
    return d;
}

/* One call on the batch with or without the q_len 0 request into poisoned
 * outputs: which = 0 absorbed MLA, 1 layer MLA, 2 / 3 sparse MLA (mixed /
 * separate), 4 indexer. out holds the float outputs (indexer: indices and
 * topk_length as int32 bit patterns). */
static int run_latent(kva_context *ctx, const kva_cache *mla, const kva_cache *idx, int which,
                      int with, const float *q, const float *w_uk, const float *w_uv,
                      const int32_t *indices, const float *sinks, const float *weights, float *out,
                      float *lse)
{
    kva_attn_kind kind = which == 4 ? KVA_ATTN_INDEX : KVA_ATTN_MLA;
    int32_t topk = which >= 2 ? TOPK : 0;
    kva_plan_desc d = latent_desc(with, kind, topk, which == 3 ? KVA_SPARSE_SEPARATE : 0);
    kva_plan *p = NULL;
    kva_status st = kva_plan_create(ctx, &d, &p);
    CHECK_MSG(st == KVA_STATUS_OK, "latent %d (%s): plan: %s", which, with ? "with" : "without",
              kva_last_error());
    if (st != KVA_STATUS_OK)
        return 0;
    kva_test_poison(out, KVA_DTYPE_F32, 5 * H * DC);
    kva_test_poison(lse, KVA_DTYPE_F32, 5 * H);
    if (which == 0)
        st = kva_attention_run(ctx, p, q, mla, NULL, out, lse);
    else if (which == 1)
        st = kva_mla_run(ctx, p, q, w_uk, w_uv, mla, out, lse);
    else if (which <= 3)
        st = kva_mla_sparse_run(ctx, p, q, mla, indices, 0, NULL, sinks, out, lse);
    else
        st = kva_indexer_run(ctx, p, q, weights, idx, (int32_t *)out, 0, (int32_t *)out + 5 * TOPK);
    CHECK_MSG(st == KVA_STATUS_OK, "latent %d (%s): run: %s", which, with ? "with" : "without",
              kva_last_error());
    kva_plan_destroy(p);
    return st == KVA_STATUS_OK;
}

static void test_latent_kinds(void)
{
    const kva_backend bk[3] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CPU};
    const int32_t threads[3] = {1, 1, 3};
    static const char *names[5] = {"absorbed MLA", "layer MLA", "sparse MLA mixed",
                                   "sparse MLA separate", "indexer"};
    for (int bi = 0; bi < 3; bi++) {
        kva_rng rng = {4200 + (uint64_t)bi};
        kva_context *ctx = new_ctx(bk[bi], threads[bi]);
        kva_cache_desc md = make_desc(NB, B, 1, DC + DR, DC, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        md.kind = KVA_ATTN_MLA;
        kva_cache_desc id = make_desc(NB, B, 1, DI, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        id.kind = KVA_ATTN_INDEX;
        kva_cache *mla = NULL, *idx = NULL;
        CHECK_OK(kva_cache_create(ctx, &md, &mla));
        CHECK_OK(kva_cache_create(ctx, &id, &idx));
        if (!mla || !idx) {
            kva_cache_destroy(mla);
            kva_cache_destroy(idx);
            kva_context_destroy(ctx);
            continue;
        }
        void *kd = NULL;
        CHECK_OK(kva_cache_data(mla, &kd, NULL));
        kva_test_fill(kd, KVA_DTYPE_F32, (size_t)NB * B * (DC + DR), &rng, 1.0);
        CHECK_OK(kva_cache_data(idx, &kd, NULL));
        kva_test_fill(kd, KVA_DTYPE_F32, (size_t)NB * B * DI, &rng, 1.0);
        static float q[5 * H * (DC + DR)], w_uk[H * DN * DC], w_uv[H * DC * DVL], sinks[H];
        static float weights[5 * HI];
        static float o1[5 * H * DC], o2[5 * H * DC], l1[5 * H], l2[5 * H];
        kva_test_fill(q, KVA_DTYPE_F32, 5 * H * (DC + DR), &rng, 1.0);
        kva_test_fill(w_uk, KVA_DTYPE_F32, H * DN * DC, &rng, 0.3);
        kva_test_fill(w_uv, KVA_DTYPE_F32, H * DC * DVL, &rng, 0.3);
        kva_test_fill(sinks, KVA_DTYPE_F32, H, &rng, 1.0);
        kva_test_fill(weights, KVA_DTYPE_F32, 5 * HI, &rng, 1.0);
        /* Request-local key positions of the 5 rows (keys 9 and 7), one -1. */
        const int32_t indices[5 * TOPK] = {0, 8,  3, -1, 7, 2, 2, 5, 6, 0,
                                           1, -1, 4, 3,  0, 6, 1, 2, 5, 4};
        for (int which = 0; which < 5; which++) {
            if (!run_latent(ctx, mla, idx, which, 1, q, w_uk, w_uv, indices, sinks, weights, o1,
                            l1) ||
                !run_latent(ctx, mla, idx, which, 0, q, w_uk, w_uv, indices, sinks, weights, o2,
                            l2))
                continue;
            char name[96];
            snprintf(name, sizeof name, "%s, %d threads", names[which], (int)threads[bi]);
            if (which == 4) {
                const int32_t *i1 = (const int32_t *)o1;
                int listed = 0;
                for (int t = 0; t < 5 * TOPK; t++)
                    listed += i1[t] >= 0;
                CHECK_MSG(listed == 5 * TOPK, "%s: %d of %d entries listed", name, listed,
                          5 * TOPK);
                CHECK_MSG(memcmp(o1, o2, sizeof(int32_t) * 5 * (TOPK + 1)) == 0,
                          "%s (%s): indices / topk_length differ with a q_len 0 request", name,
                          kva_backend_name(bk[bi]));
                continue;
            }
            size_t n = (size_t)5 * H * (which == 1 ? DVL : DC);
            compare(name, kva_backend_name(bk[bi]), o1, o2, n);
            compare(name, kva_backend_name(bk[bi]), l1, l2, 5 * H);
        }
        kva_cache_destroy(mla);
        kva_cache_destroy(idx);
        kva_context_destroy(ctx);
    }
}

int main(void)
{
    RUN(test_mha_kinds);
    RUN(test_latent_kinds);
    return kva_test_finish();
}
