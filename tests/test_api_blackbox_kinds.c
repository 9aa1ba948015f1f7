/*
 * test_api_blackbox_kinds.c - black-box audit, round three (session 37, task
 * api37): plans of every kind together. One plan updated step after step
 * across every kind of plan (kvattn.h: "a plan of any kind, cascade or not,
 * may be updated to any other", afterwards equal to kva_plan_create's: same
 * info, same results), with the plans made on the way kept and rerun at the
 * end; draft trees, local chunks and cascades over quantized caches (every
 * format), CPU against the reference; the cache dtype rule of the three runs
 * of kvattn_mla.h; the plan fields an indexer plan does not use, validated.
 * Outputs are poisoned before every run.
 */
#include "blackbox_util.h"
#include "tree_util.h"

enum { UP_B = 4, UP_NB = 24, UP_H = 4, UP_D = 16, UP_DC = 16, UP_DR = 8, UP_DN = 8, UP_DV = 24 };

/* The step kinds of the update sequence. */
enum { UP_MHA, UP_TREE, UP_CASCADE, UP_CHUNK, UP_MLA, UP_SPARSE_MIX, UP_SPARSE_SEP, UP_INDEX };

static const char *const up_names[] = {"mha", "tree",   "cascade",    "chunk",
                                       "mla", "sparse", "sparse sep", "indexer"};

/* Two batches the steps alternate between (small and large), with a shared
 * leading block for the cascades. */
typedef struct up_batch {
    int32_t R, qsl[5], sl[4], bt[4 * 6], par[16];
} up_batch;

static const up_batch up_batches[2] = {
    {2, {0, 1, 3}, {9, 6}, {3, 7, 1, -1, -1, -1, 3, 2, -1, -1, -1, -1}, {-1, -1, 0}},
    {4,
     {0, 1, 5, 6, 9},
     {20, 13, 9, 7},
     {3, 4, 5, 6, 8, -1, 3, 9, 10, 11, -1, -1, 3, 12, 13, -1, -1, -1, 3, 14, -1, -1, -1, -1},
     {-1, -1, 0, 1, 0, -1, -1, 0, 0}},
};

/* The descriptor of step kind k over batch b. */
static kva_plan_desc up_desc(int k, const up_batch *b)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = b->R;
    d.query_start_loc = b->qsl;
    d.seq_lens = b->sl;
    d.block_table = b->bt;
    d.block_table_stride = 6;
    d.block_size = UP_B;
    d.num_heads = UP_H;
    d.num_kv_heads = 2;
    d.head_dim = UP_D;
    d.q_dtype = KVA_DTYPE_F32;
    d.causal = 1;
    d.window_left = -1;
    switch (k) {
    case UP_TREE:
        d.tree_parents = b->par;
        d.decode_threshold = 4;
        break;
    case UP_CASCADE:
        d.cascade = KVA_CASCADE_ON;
        break;
    case UP_CHUNK:
        d.attention_chunk = 5;
        d.window_left = 3;
        d.cascade = KVA_CASCADE_OFF;
        break;
    case UP_MLA:
    case UP_SPARSE_MIX:
    case UP_SPARSE_SEP:
        d.kind = KVA_ATTN_MLA;
        d.num_kv_heads = 1;
        d.head_dim = UP_DC + UP_DR;
        d.head_dim_v = UP_DC;
        d.scale = 0.3f;
        d.decode_threshold = 2;
        if (k == UP_MLA) {
            d.mla_qk_nope_head_dim = UP_DN;
            d.mla_v_head_dim = UP_DV;
        } else {
            d.sparse_topk = 5;
            d.sparse_mode = k == UP_SPARSE_SEP ? KVA_SPARSE_SEPARATE : KVA_SPARSE_MIXED;
        }
        break;
    case UP_INDEX:
        d.kind = KVA_ATTN_INDEX;
        d.num_kv_heads = 1;
        d.sparse_topk = 6;
        break;
    default:
        break;
    }
    return d;
}

/* The caches and inputs every step reads. */
typedef struct up_world {
    kva_cache *mha, *mla, *idx;
    float q[16 * UP_H * (UP_DC + UP_DR)], ql[16 * UP_H * (UP_DN + UP_DR)];
    float wuk[UP_H * UP_DN * UP_DC], wuv[UP_H * UP_DC * UP_DV], w[16 * UP_H];
    int32_t ind[16 * 5];
} up_world;

static void up_world_make(kva_context *ctx, up_world *x)
{
    kva_rng rng = {3900};
    kva_cache_desc cm = make_desc(UP_NB, UP_B, 2, UP_D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache_desc cl = {UP_NB,          UP_B,           1,
                         UP_DC + UP_DR,  UP_DC,          KVA_DTYPE_F32,
                         KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MLA};
    kva_cache_desc ci = {UP_NB,          UP_B,          1, UP_D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD,
                         KVA_QUANT_NONE, KVA_ATTN_INDEX};
    CHECK_OK(kva_cache_create(ctx, &cm, &x->mha));
    CHECK_OK(kva_cache_create(ctx, &cl, &x->mla));
    CHECK_OK(kva_cache_create(ctx, &ci, &x->idx));
    fill_cache(x->mha, &rng);
    kva_rng r2 = {3901};
    void *k = NULL;
    CHECK_OK(kva_cache_data(x->mla, &k, NULL));
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)UP_NB * UP_B * (UP_DC + UP_DR), &r2, 1.0);
    CHECK_OK(kva_cache_data(x->idx, &k, NULL));
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)UP_NB * UP_B * UP_D, &r2, 1.0);
    kva_test_fill(x->q, KVA_DTYPE_F32, sizeof x->q / sizeof(float), &r2, 1.0);
    kva_test_fill(x->ql, KVA_DTYPE_F32, sizeof x->ql / sizeof(float), &r2, 1.0);
    kva_test_fill(x->wuk, KVA_DTYPE_F32, sizeof x->wuk / sizeof(float), &r2, 0.25);
    kva_test_fill(x->wuv, KVA_DTYPE_F32, sizeof x->wuv / sizeof(float), &r2, 0.25);
    kva_test_fill(x->w, KVA_DTYPE_F32, sizeof x->w / sizeof(float), &r2, 1.0);
    for (int i = 0; i < 16 * 5; i++) /* positions below every request's seq_len (>= 6) */
        x->ind[i] = kva_rng_int(&r2, -1, 5);
}

/* What a step's runs write: out [T, H, <= 24], lse [T, H], indices [T, 6],
 * topk_length [T]; poisoned first. */
typedef struct up_out {
    float out[16 * UP_H * 24], out2[16 * UP_H * 24], lse[16 * UP_H], lse2[16 * UP_H];
    int32_t ind[16 * 6], len[16];
} up_out;

/* Runs plan p of step kind k; the outputs go to o. */
static void up_run(kva_context *ctx, const kva_plan *p, int k, const up_world *x, up_out *o)
{
    kva_test_poison(o->out, KVA_DTYPE_F32, sizeof o->out / sizeof(float));
    kva_test_poison(o->out2, KVA_DTYPE_F32, sizeof o->out2 / sizeof(float));
    kva_test_poison(o->lse, KVA_DTYPE_F32, sizeof o->lse / sizeof(float));
    kva_test_poison(o->lse2, KVA_DTYPE_F32, sizeof o->lse2 / sizeof(float));
    memset(o->ind, 0x5a, sizeof o->ind);
    memset(o->len, 0x5a, sizeof o->len);
    switch (k) {
    case UP_MLA:
        CHECK_OK(kva_attention_run(ctx, p, x->q, x->mla, NULL, o->out, o->lse));
        CHECK_OK(kva_mla_run(ctx, p, x->ql, x->wuk, x->wuv, x->mla, o->out2, o->lse2));
        break;
    case UP_SPARSE_MIX:
    case UP_SPARSE_SEP:
        CHECK_OK(kva_mla_sparse_run(ctx, p, x->q, x->mla, x->ind, 0, NULL, NULL, o->out, o->lse));
        break;
    case UP_INDEX:
        CHECK_OK(kva_indexer_run(ctx, p, x->q, x->w, x->idx, o->ind, 0, o->len));
        break;
    default:
        CHECK_OK(kva_attention_run(ctx, p, x->q, x->mha, NULL, o->out, o->lse));
        break;
    }
    /* The steps compare two runs' bytes: every output element must have been
     * written (one that neither run writes holds the same poison in both). */
    kva_plan_info in;
    if (k != UP_INDEX && kva_plan_get_info(p, &in) == KVA_STATUS_OK) {
        const size_t rows = (size_t)in.num_tokens * UP_H;
        const int32_t dv = k == UP_MLA || k == UP_SPARSE_MIX || k == UP_SPARSE_SEP ? UP_DC : UP_D;
        size_t left = kva_test_count_poisoned(o->out, KVA_DTYPE_F32, rows * (size_t)dv) +
                      kva_test_count_poisoned(o->lse, KVA_DTYPE_F32, rows);
        if (k == UP_MLA)
            left += kva_test_count_poisoned(o->out2, KVA_DTYPE_F32, rows * UP_DV) +
                    kva_test_count_poisoned(o->lse2, KVA_DTYPE_F32, rows);
        CHECK_MSG(left == 0, "%s: %zu output elements unwritten", up_names[k], left);
    }
}

/* Every kind after every other, alternating the two batches: the updated
 * plan's info and every output equal a fresh plan's, byte for byte. The
 * first fresh plan of each step is kept, and all of them run again at the
 * end, after the plans and updates that followed them on the same context
 * (whose workspace and cascade passes they share): the same bytes again. */
static void test_update_across_kinds(void)
{
    static const int seq[] = {UP_MHA,        UP_TREE,  UP_CASCADE, UP_MLA,        UP_INDEX,
                              UP_SPARSE_SEP, UP_CHUNK, UP_TREE,    UP_SPARSE_MIX, UP_CASCADE,
                              UP_INDEX,      UP_MLA,   UP_CHUNK,   UP_SPARSE_SEP, UP_MHA};
    const int n = (int)(sizeof seq / sizeof seq[0]);
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 3);
        up_world *x = calloc(1, sizeof *x);
        up_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        up_world_make(ctx, x);
        kva_plan *plan = NULL, *kept[16] = {NULL};
        up_out *first = calloc((size_t)n, sizeof *first);
        for (int s = 0; s < n; s++) {
            const int k = seq[s];
            const up_batch *bt = &up_batches[s % 2];
            const kva_plan_desc d = up_desc(k, bt);
            kva_plan *fresh = NULL;
            CHECK_OK(kva_plan_create(ctx, &d, &fresh));
            if (!fresh)
                continue;
            if (!plan) {
                CHECK_OK(kva_plan_create(ctx, &d, &plan));
            } else {
                CHECK_OK(kva_plan_update(ctx, plan, &d));
            }
            kva_plan_info fi, ui;
            CHECK_OK(kva_plan_get_info(fresh, &fi));
            CHECK_OK(kva_plan_get_info(plan, &ui));
            CHECK_MSG(memcmp(&fi, &ui, sizeof fi) == 0, "step %d (%s): info differs", s,
                      up_names[k]);
            if (k == UP_CASCADE)
                CHECK_MSG(ui.num_cascade_groups > 0, "step %d: no cascade", s);
            up_run(ctx, fresh, k, x, a);
            up_run(ctx, plan, k, x, b);
            CHECK_MSG(memcmp(a, b, sizeof *a) == 0, "step %d (%s) on %s: outputs differ", s,
                      up_names[k], kva_backend_name(kBk[bi]));
            first[s] = *a;
            kept[s] = fresh;
        }
        for (int s = 0; s < n; s++) {
            if (!kept[s])
                continue;
            up_run(ctx, kept[s], seq[s], x, a);
            CHECK_MSG(memcmp(a, &first[s], sizeof *a) == 0,
                      "step %d (%s) on %s: the kept plan's outputs changed", s, up_names[seq[s]],
                      kva_backend_name(kBk[bi]));
            kva_plan_destroy(kept[s]);
        }
        free(first);
        kva_plan_destroy(plan);
        kva_cache_destroy(x->mha);
        kva_cache_destroy(x->mla);
        kva_cache_destroy(x->idx);
        free(x);
        free(a);
        free(b);
        kva_context_destroy(ctx);
    }
}

/* Trees, local chunks (with a window) and cascades over every quantized MHA
 * format, every scale granularity, CPU against the reference on the same
 * keys. */
static void test_masks_quantized(void)
{
    enum { R = 3, B = 3, NB = 16, H = 6, Hkv = 2, D = 16, T = 14 };
    const int32_t qsl[R + 1] = {0, 9, 10, 14}, sl[R] = {20, 6, 4};
    const int32_t bt[R * 7] = {1,  4,  2,  9, 11, 7,  13, 3,  0,  -1, -1,
                               -1, -1, -1, 5, 6,  -1, -1, -1, -1, -1};
    int32_t par[T];
    kva_rng tr = {3950};
    make_tree(TREE_RANDOM, 9, &tr, par);
    make_tree(TREE_CHAIN, 1, &tr, par + 9);
    make_tree(TREE_STAR, 4, &tr, par + 10);
    static const kva_quant qs[] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                                   KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_FP8_E4M3};
    for (size_t qi = 0; qi < sizeof qs / sizeof qs[0]; qi++)
        for (int g = 0; g < 3; g++)
            for (int m = 0; m < 3; m++) { /* tree; chunk 4 + window 2; cascade */
                const kva_dtype qdt = (qi + g) % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_F32;
                float out[2][T * H * D], lse[2][T * H], keys[NB * B * Hkv * D],
                    vals[NB * B * Hkv * D], q[T * H * D], pbuf[2 * Hkv * 2 * D];
                uint16_t out16[2][T * H * D];
                int64_t slots[NB * B];
                kva_rng rng = {3960 + qi * 10 + (uint64_t)g};
                kva_test_fill(keys, KVA_DTYPE_F32, NB * B * Hkv * D, &rng, 1.0);
                kva_test_fill(vals, KVA_DTYPE_F32, NB * B * Hkv * D, &rng, 1.0);
                kva_test_fill(q, qdt, T * H * D, &rng, 1.0);
                for (int i = 0; i < NB * B; i++)
                    slots[i] = i;
                kva_quant_params qp;
                make_params(qs[qi], Hkv, D, D, g, &rng, pbuf, &qp);
                const kva_dtype cdt = qs[qi] == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
                                      : qs[qi] == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_BF16
                                                                             : KVA_DTYPE_I8;
                for (int bi = 0; bi < 2; bi++) {
                    kva_context *ctx = new_ctx(kBk[bi], 2);
                    kva_cache_desc cd = {NB,     B,           Hkv, D, 0, cdt, KVA_LAYOUT_HND,
                                         qs[qi], KVA_ATTN_MHA};
                    kva_cache *c = NULL;
                    CHECK_OK(kva_cache_create_quant(ctx, &cd, &qp, &c));
                    CHECK_OK(
                        kva_cache_write(ctx, c, NB * B, keys, 0, vals, 0, KVA_DTYPE_F32, slots));
                    kva_plan_desc d;
                    memset(&d, 0, sizeof d);
                    d.num_requests = R;
                    d.query_start_loc = qsl;
                    d.seq_lens = sl;
                    /* The cascade: request 1 shares request 0's first block. */
                    int32_t btc[R * 7];
                    memcpy(btc, bt, sizeof btc);
                    btc[7] = bt[0];
                    d.block_table = m == 2 ? btc : bt;
                    d.cascade = m == 2 ? KVA_CASCADE_ON : KVA_CASCADE_OFF;
                    d.block_table_stride = 7;
                    d.block_size = B;
                    d.decode_threshold = g == 1 ? 9 : 0;
                    d.num_heads = H;
                    d.num_kv_heads = Hkv;
                    d.head_dim = D;
                    d.q_dtype = qdt;
                    d.causal = 1;
                    d.window_left = m == 1 ? 2 : -1;
                    d.attention_chunk = m == 1 ? 4 : 0;
                    d.tree_parents = m == 0 ? par : NULL;
                    kva_plan *p = NULL;
                    CHECK_OK(kva_plan_create(ctx, &d, &p));
                    void *o = qdt == KVA_DTYPE_F32 ? (void *)out[bi] : (void *)out16[bi];
                    kva_test_poison(o, qdt, T * H * D);
                    kva_test_poison(lse[bi], KVA_DTYPE_F32, T * H);
                    kva_plan_info in = {0};
                    if (p) {
                        CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, o, lse[bi]));
                        CHECK_OK(kva_plan_get_info(p, &in));
                    }
                    CHECK((m == 2) == (in.num_cascade_groups > 0));
                    kva_plan_destroy(p);
                    kva_cache_destroy(c);
                    kva_context_destroy(ctx);
                }
                const void *o0 = qdt == KVA_DTYPE_F32 ? (void *)out[0] : (void *)out16[0];
                const void *o1 = qdt == KVA_DTYPE_F32 ? (void *)out[1] : (void *)out16[1];
                const double at =
                    m == 2 ? kva_test_cascade_atol(qdt) : 2 * kva_test_atol(qdt) + 1e-5;
                const double rt = m == 2 ? kva_test_cascade_rtol(qdt) : 2 * kva_test_rtol(qdt);
                const size_t bad =
                    kva_test_compare("quant mask", o1, o0, qdt, T * H * D, at, rt) +
                    kva_test_compare_f32("quant mask lse", lse[1], lse[0], T * H, 1e-4, 1e-5);
                CHECK_MSG(bad == 0, "%s gran %d %s: %zu mismatches", kva_quant_name(qs[qi]), g,
                          m == 0   ? "tree"
                          : m == 1 ? "chunk"
                                   : "cascade",
                          bad);
            }
}

/* The indexer plan of one request over blocks of 4 (block table [1, 2]):
 * 2 index heads of D 16, top-3, q in qdt. */
static kva_plan_desc ix_desc(const int32_t *qsl, const int32_t *sl, const int32_t *bt,
                             kva_dtype qdt)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = 1;
    d.query_start_loc = qsl;
    d.seq_lens = sl;
    d.block_table = bt;
    d.block_table_stride = 2;
    d.block_size = 4;
    d.num_heads = 2;
    d.num_kv_heads = 1;
    d.head_dim = 16;
    d.q_dtype = qdt;
    d.causal = 1;
    d.window_left = -1;
    d.kind = KVA_ATTN_INDEX;
    d.sparse_topk = 3;
    return d;
}

/* An indexer plan validates the plan fields it does not use as every plan
 * does: a cascade mode outside kva_cascade_mode is refused. */
static void test_indexer_fields(void)
{
    const int32_t qsl[2] = {0, 2}, sl[1] = {5}, bt[2] = {1, 0};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        kva_plan_desc d = ix_desc(qsl, sl, bt, KVA_DTYPE_F32);
        kva_plan *p = (kva_plan *)&d;
        d.cascade = 7;
        BAD(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK(p == (kva_plan *)&d);
        d.cascade = -1;
        BAD(kva_plan_create(ctx, &d, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK(p == (kva_plan *)&d);
        d.cascade = KVA_CASCADE_OFF;
        p = NULL;
        CHECK_OK(kva_plan_create(ctx, &d, &p));
        kva_plan_destroy(p);
        kva_context_destroy(ctx);
    }
}

/* Unquantized latent rows and index keys must be in q_dtype
 * (KVA_STATUS_DTYPE_MISMATCH, outputs untouched); FP8 rows and keys serve
 * any q_dtype. All three runs of kvattn_mla.h. */
static void test_cache_dtype(void)
{
    const int32_t qsl[2] = {0, 1}, sl[1] = {5}, bt[2] = {0, 1}, idx[3] = {0, 1, 2};
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 1);
        kva_cache *ic = NULL, *ic8 = NULL, *mc = NULL, *mc8 = NULL;
        kva_cache_desc d1 = {4, 4, 1, 16, 0, KVA_DTYPE_F32, 0, 0, KVA_ATTN_INDEX};
        kva_cache_desc d2 = {
            4, 4, 1, 16, 0, KVA_DTYPE_FP8_E4M3, 0, KVA_QUANT_FP8_TOKEN, KVA_ATTN_INDEX};
        kva_cache_desc d3 = {4, 4, 1, 24, 16, KVA_DTYPE_F32, 0, 0, KVA_ATTN_MLA};
        kva_cache_desc d4 = {4,           4, 1, 24, 16, KVA_DTYPE_FP8_E4M3, 0, KVA_QUANT_FP8_E4M3,
                             KVA_ATTN_MLA};
        CHECK_OK(kva_cache_create(ctx, &d1, &ic));
        CHECK_OK(kva_cache_create(ctx, &d2, &ic8));
        CHECK_OK(kva_cache_create(ctx, &d3, &mc));
        CHECK_OK(kva_cache_create(ctx, &d4, &mc8));
        kva_rng rng = {3990};
        uint16_t q[2 * 24], wmat[2 * 8 * 16];
        float w[2] = {1.0f, -0.5f}, out[2 * 16], lse[2]; /* out holds [1, 2, 16] bf16 */
        int32_t ind[3], len[1];
        kva_test_fill(q, KVA_DTYPE_BF16, 2 * 24, &rng, 1.0);
        kva_test_fill(wmat, KVA_DTYPE_BF16, 2 * 8 * 16, &rng, 0.25);
        float rows[16 * 24];
        int64_t slots[16];
        for (int i = 0; i < 16; i++)
            slots[i] = i;
        kva_test_fill(rows, KVA_DTYPE_F32, 16 * 24, &rng, 1.0);
        CHECK_OK(kva_cache_write(ctx, ic8, 16, rows, 0, NULL, 0, KVA_DTYPE_F32, slots));
        CHECK_OK(kva_cache_write(ctx, mc8, 16, rows, 24, rows + 16, 24, KVA_DTYPE_F32, slots));
        void *k = NULL;
        CHECK_OK(kva_cache_data(ic, &k, NULL));
        kva_test_fill(k, KVA_DTYPE_F32, 4 * 4 * 16, &rng, 1.0);
        CHECK_OK(kva_cache_data(mc, &k, NULL));
        kva_test_fill(k, KVA_DTYPE_F32, 4 * 4 * 24, &rng, 1.0);
        kva_plan_desc d = ix_desc(qsl, sl, bt, KVA_DTYPE_BF16);
        kva_plan *pi = NULL, *ps = NULL, *pm = NULL;
        CHECK_OK(kva_plan_create(ctx, &d, &pi));
        d.kind = KVA_ATTN_MLA;
        d.head_dim = 24;
        d.head_dim_v = 16;
        d.scale = 0.3f;
        CHECK_OK(kva_plan_create(ctx, &d, &ps));
        d.sparse_topk = 0;
        d.mla_qk_nope_head_dim = 8;
        d.mla_v_head_dim = 8;
        CHECK_OK(kva_plan_create(ctx, &d, &pm));
        memset(ind, 0x5a, sizeof ind);
        memset(len, 0x5a, sizeof len);
        kva_test_poison(out, KVA_DTYPE_F32, 2 * 16);
        kva_test_poison(lse, KVA_DTYPE_F32, 2);
        const uint64_t before = bb_sum(ind, sizeof ind) ^ bb_sum(len, sizeof len) ^
                                bb_sum(out, sizeof out) ^ bb_sum(lse, sizeof lse);
        if (pi && ps && pm) {
            BAD(kva_indexer_run(ctx, pi, q, w, ic, ind, 0, len), KVA_STATUS_DTYPE_MISMATCH);
            BAD(kva_mla_sparse_run(ctx, ps, q, mc, idx, 0, NULL, NULL, out, lse),
                KVA_STATUS_DTYPE_MISMATCH);
            BAD(kva_mla_run(ctx, pm, q, wmat, wmat, mc, out, lse), KVA_STATUS_DTYPE_MISMATCH);
            CHECK((bb_sum(ind, sizeof ind) ^ bb_sum(len, sizeof len) ^ bb_sum(out, sizeof out) ^
                   bb_sum(lse, sizeof lse)) == before);
            CHECK_OK(kva_indexer_run(ctx, pi, q, w, ic8, ind, 0, len));
            CHECK(len[0] == 3 && ind[0] >= 0 && ind[0] < 5);
            CHECK_OK(kva_mla_sparse_run(ctx, ps, q, mc8, idx, 0, NULL, NULL, out, lse));
            CHECK(!isnan(kva_test_get(out, KVA_DTYPE_BF16, 2 * 16 - 1)) && !isnan(lse[1]));
            kva_test_poison(out, KVA_DTYPE_F32, 2 * 16);
            CHECK_OK(kva_mla_run(ctx, pm, q, wmat, wmat, mc8, out, lse));
            CHECK(!isnan(kva_test_get(out, KVA_DTYPE_BF16, 2 * 8 - 1)) && !isnan(lse[1]));
        }
        kva_plan_destroy(pi);
        kva_plan_destroy(ps);
        kva_plan_destroy(pm);
        kva_cache_destroy(ic);
        kva_cache_destroy(ic8);
        kva_cache_destroy(mc);
        kva_cache_destroy(mc8);
        kva_context_destroy(ctx);
    }
}

/* A plan built on a one-thread context, run on a three-thread context whose
 * reservation (from a plan of the same kind over shorter requests) holds the
 * plan's bytes but not three of its per-thread scratch areas: kvattn.h lets
 * such a context run it ("one whose reservation holds it runs the plan on
 * at most as many of its threads as the reservation holds scratch areas
 * for"). The run must use only those threads and give the one-thread result
 * (the CPU indexer ran three threads past the workspace's end: a heap
 * overflow under ASan). Attention, kva_mla_run and sparse runs alike. */
static void test_more_threads_than_plan(void)
{
    enum { B = 64, S1 = 20000, S3 = 5000, NB = S1 / B + 1, T = 3 };
    int32_t *bt = malloc(sizeof(int32_t) * NB);
    for (int i = 0; i < NB; i++)
        bt[i] = (i * 37) % NB;
    const int32_t qsl[2] = {0, T}, sl1[1] = {S1}, sl3[1] = {S3};
    kva_rng rng = {3995};
    float *q = malloc(sizeof(float) * T * 4 * 32), w[T * 4],
          *wm = malloc(sizeof(float) * 4 * 16 * 16);
    float out1[T * 4 * 16], out3[T * 4 * 16], lse1[T * 4], lse3[T * 4];
    int32_t idx[T * 16], ind1[T * 16], ind3[T * 16];
    kva_test_fill(q, KVA_DTYPE_F32, T * 4 * 32, &rng, 1.0);
    kva_test_fill(w, KVA_DTYPE_F32, T * 4, &rng, 1.0);
    kva_test_fill(wm, KVA_DTYPE_F32, 4 * 16 * 16, &rng, 0.25);
    for (int i = 0; i < T * 16; i++)
        idx[i] = kva_rng_int(&rng, -1, S1 - 1);
    for (int kind = 0; kind < 4; kind++) { /* indexer, attention, kva_mla_run, sparse */
        kva_context *c1 = new_ctx(KVA_BACKEND_CPU, 1), *c3 = new_ctx(KVA_BACKEND_CPU, 3);
        kva_cache_desc cd = {NB, B, 1, 32, 0, KVA_DTYPE_F32, 0, 0, KVA_ATTN_INDEX};
        kva_plan_desc d;
        memset(&d, 0, sizeof d);
        d.num_requests = 1;
        d.query_start_loc = qsl;
        d.block_table = bt;
        d.block_table_stride = NB;
        d.block_size = B;
        d.num_heads = 4;
        d.num_kv_heads = 1;
        d.head_dim = 32;
        d.q_dtype = KVA_DTYPE_F32;
        d.causal = 1;
        d.window_left = -1;
        d.kind = KVA_ATTN_INDEX;
        d.sparse_topk = 16;
        if (kind > 0) {
            cd.kind = d.kind = kind == 1 ? KVA_ATTN_MHA : KVA_ATTN_MLA;
            cd.head_dim_v = d.head_dim_v = 16;
            d.scale = 0.2f;
            d.sparse_topk = kind == 3 ? 16 : 0;
            d.sparse_mode = kind == 3 ? KVA_SPARSE_SEPARATE : 0;
            d.mla_qk_nope_head_dim = kind == 2 ? 16 : 0;
            d.mla_v_head_dim = kind == 2 ? 16 : 0;
            d.cascade = KVA_CASCADE_OFF;
        }
        kva_cache *cache = NULL;
        CHECK_OK(kva_cache_create(c1, &cd, &cache));
        void *k = NULL, *v = NULL;
        CHECK_OK(kva_cache_data(cache, &k, &v));
        kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)NB * B * 32, &rng);
        if (kind == 1)
            kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)NB * B * 16, &rng);
        kva_plan *p = NULL, *x = NULL;
        d.seq_lens = sl1;
        CHECK_OK(kva_plan_create(c1, &d, &p));
        d.seq_lens = sl3;
        CHECK_OK(kva_plan_create(c3, &d, &x));
        kva_status st[2] = {KVA_STATUS_OK, KVA_STATUS_OK};
        for (int i = 0; i < 2 && p; i++) {
            kva_context *c = i ? c3 : c1;
            float *o = i ? out3 : out1, *l = i ? lse3 : lse1;
            int32_t *ind = i ? ind3 : ind1;
            kva_test_poison(o, KVA_DTYPE_F32, T * 4 * 16);
            kva_test_poison(l, KVA_DTYPE_F32, T * 4);
            memset(ind, 0x5a, sizeof ind1);
            st[i] = kind == 0   ? kva_indexer_run(c, p, q, w, cache, ind, 0, NULL)
                    : kind == 1 ? kva_attention_run(c, p, q, cache, NULL, o, l)
                    : kind == 2 ? kva_mla_run(c, p, q, wm, wm, cache, o, l)
                                : kva_mla_sparse_run(c, p, q, cache, idx, 0, NULL, NULL, o, l);
        }
        CHECK_MSG(st[0] == KVA_STATUS_OK, "kind %d: %s", kind, kva_status_name(st[0]));
        /* The indexer's reservation here holds the plan's bytes (3 x 40 KiB
         * of scratch against 99 KiB); the others may refuse, unchanged. */
        CHECK_MSG(st[1] == KVA_STATUS_OK || (kind > 0 && st[1] == KVA_STATUS_INVALID_ARGUMENT),
                  "kind %d: %s (%s)", kind, kva_status_name(st[1]), kva_last_error());
        if (getenv("KVA_TEST_VERBOSE"))
            fprintf(stderr, "more threads, kind %d: %s\n", kind, kva_status_name(st[1]));
        if (kind == 0)
            CHECK(memcmp(ind1, ind3, sizeof ind1) == 0);
        else if (st[1] != KVA_STATUS_OK) /* refused: nothing written (the poison's bits) */
            CHECK(kva_test_poisoned(out3, KVA_DTYPE_F32, 0) &&
                  kva_test_poisoned(out3, KVA_DTYPE_F32, T * 4 * 16 - 1) &&
                  kva_test_poisoned(lse3, KVA_DTYPE_F32, T * 4 - 1));
        else
            CHECK(kva_test_compare("more threads", out3, out1, KVA_DTYPE_F32, T * 4 * 16, 1e-5,
                                   1e-5) == 0 &&
                  kva_test_compare_f32("more threads lse", lse3, lse1, T * 4, 1e-5, 1e-6) == 0);
        kva_plan_destroy(p);
        kva_plan_destroy(x);
        kva_cache_destroy(cache);
        kva_context_destroy(c1);
        kva_context_destroy(c3);
    }
    free(bt);
    free(q);
    free(wm);
}

/* A cascade plan runs on the context that created it or last updated it
 * (kvattn.h): created on A and updated through B, it runs on B (as a plan
 * created on B would) and A refuses it, writing nothing. */
static void test_cascade_updated_context(void)
{
    const up_batch *b = &up_batches[1];
    const kva_plan_desc d = up_desc(UP_CASCADE, b);
    for (int bi = 0; bi < 2; bi++) {
        kva_context *A = new_ctx(kBk[bi], 1), *B = new_ctx(kBk[bi], 2);
        up_world *x = calloc(1, sizeof *x);
        up_out *o1 = calloc(1, sizeof *o1), *o2 = calloc(1, sizeof *o2);
        up_world_make(A, x);
        kva_plan *p = NULL, *fresh = NULL;
        CHECK_OK(kva_plan_create(A, &d, &p));
        CHECK_OK(kva_plan_create(B, &d, &fresh));
        if (p && fresh) {
            CHECK_OK(kva_plan_update(B, p, &d));
            up_run(B, p, UP_CASCADE, x, o1);
            up_run(B, fresh, UP_CASCADE, x, o2);
            CHECK(memcmp(o1, o2, sizeof *o1) == 0);
            kva_test_poison(o2->out, KVA_DTYPE_F32, sizeof o2->out / sizeof(float));
            kva_test_poison(o2->lse, KVA_DTYPE_F32, sizeof o2->lse / sizeof(float));
            const uint64_t before = bb_sum(o2, sizeof *o2);
            BAD(kva_attention_run(A, p, x->q, x->mha, NULL, o2->out, o2->lse),
                KVA_STATUS_INVALID_ARGUMENT);
            CHECK(bb_sum(o2, sizeof *o2) == before);
        }
        kva_plan_destroy(p);
        kva_plan_destroy(fresh);
        kva_cache_destroy(x->mha);
        kva_cache_destroy(x->mla);
        kva_cache_destroy(x->idx);
        free(x);
        free(o1);
        free(o2);
        kva_context_destroy(A);
        kva_context_destroy(B);
    }
}

int main(void)
{
    RUN(test_update_across_kinds);
    RUN(test_masks_quantized);
    RUN(test_indexer_fields);
    RUN(test_cache_dtype);
    RUN(test_more_threads_than_plan);
    RUN(test_cascade_updated_context);
    return kva_test_finish();
}
