/*
 * test_api_blackbox_degenerate.c - plans at the degenerate ends of their
 * masks, checked through the public API against kvattn.h's formula
 * (blackbox_oracle.h) on the reference and CPU backends:
 *   - window_left 0, attention_chunk 1, both, a window past every key, causal
 *     and not; draft trees of one token (given as parents and as a mask, equal
 *     to a plain causal decode) and small branching trees;
 *   - the same plan run twice gives identical bytes (outputs poisoned before
 *     each run), and a plan run after kva_cache_write changed the keys it reads
 *     sees the new data;
 *   - cascades whose shared prefix is one block, ends exactly at the first
 *     query, or has one member;
 *   - DCP with N = 1 (dcp_size 1, the helpers with N 0 and 1) equals no DCP.
 */
#include "blackbox_oracle.h"

enum { NB = 24, BS = 4, HKV = 2, H = 4, DH = 16, R = 4, STRIDE = 5, MAXT = 32 };

typedef struct {
    kva_context *ctx;
    kva_cache *cache;
    int32_t qsl[R + 1], sl[R], bt[R * STRIDE];
    float q[MAXT * H * DH];
    kva_rng rng;
} fix;

/* Request r: q_lens {1, 3, 0, 6}, seq_lens {9, 14, 5, 6}; scattered blocks. */
static void rewrite_cache(fix *f);

/* quant: KVA_QUANT_NONE (f32 cache), INT8_TOKEN_K or FP8_E4M3 (a scale of 0.5). */
static void fix_init_q(fix *f, kva_backend b, uint64_t seed, kva_quant quant)
{
    memset(f, 0, sizeof *f);
    f->rng.s = seed;
    f->ctx = new_ctx(b, 2);
    kva_cache_desc cd = make_desc(NB, BS, HKV, DH, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    if (quant == KVA_QUANT_NONE) {
        CHECK_OK(kva_cache_create(f->ctx, &cd, &f->cache));
        fill_cache(f->cache, &f->rng);
    } else {
        static const float half = 0.5f, v8 = 1.0f / 64;
        const kva_quant_params qp = quant == KVA_QUANT_FP8_E4M3
                                        ? (kva_quant_params){&half, 1, NULL, 0, &half, 1, NULL, 0}
                                        : (kva_quant_params){NULL, 0, NULL, 0, &v8, 1, NULL, 0};
        cd.quant = quant;
        cd.dtype = quant == KVA_QUANT_FP8_E4M3 ? KVA_DTYPE_FP8_E4M3 : KVA_DTYPE_I8;
        CHECK_OK(kva_cache_create_quant(f->ctx, &cd, &qp, &f->cache));
    }
    const int32_t ql[R] = {1, 3, 0, 6}, sl[R] = {9, 14, 5, 6};
    int32_t perm[NB - 1];
    for (int i = 0; i < NB - 1; i++)
        perm[i] = i + 1;
    for (int i = NB - 2; i > 0; i--) {
        int j = (int)(kva_rng_u64(&f->rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < R * STRIDE; i++)
        f->bt[i] = perm[i];
    for (int r = 0; r < R; r++) {
        f->qsl[r + 1] = f->qsl[r] + ql[r];
        f->sl[r] = sl[r];
    }
    kva_test_fill(f->q, KVA_DTYPE_F32, MAXT * H * DH, &f->rng, 1.0);
    if (quant != KVA_QUANT_NONE)
        rewrite_cache(f);
}

static void fix_init(fix *f, kva_backend b, uint64_t seed)
{
    fix_init_q(f, b, seed, KVA_QUANT_NONE);
}

static void fix_free(fix *f)
{
    kva_cache_destroy(f->cache);
    kva_context_destroy(f->ctx);
}

static kva_plan_desc fix_desc(const fix *f)
{
    return (kva_plan_desc){.num_requests = R,
                           .query_start_loc = f->qsl,
                           .seq_lens = f->sl,
                           .block_table = f->bt,
                           .block_table_stride = STRIDE,
                           .block_size = BS,
                           .num_heads = H,
                           .num_kv_heads = HKV,
                           .head_dim = DH,
                           .q_dtype = KVA_DTYPE_F32,
                           .causal = 1,
                           .window_left = -1};
}

/* Runs plan pd into poisoned out/lse twice; checks identical bytes, and that
 * every element was written (both runs leaving one unwritten compare equal). */
static void run_twice(fix *f, const kva_plan *p, float *out, float *lse)
{
    static float out2[MAXT * H * DH], lse2[MAXT * H];
    const int32_t T = f->qsl[R];
    kva_test_poison(out, KVA_DTYPE_F32, (size_t)T * H * DH);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    CHECK_OK(kva_attention_run(f->ctx, p, f->q, f->cache, NULL, out, lse));
    CHECK_MSG(kva_test_count_poisoned(out, KVA_DTYPE_F32, (size_t)T * H * DH) == 0 &&
                  kva_test_count_poisoned(lse, KVA_DTYPE_F32, (size_t)T * H) == 0,
              "a plan's run left out or lse elements unwritten");
    kva_test_poison(out2, KVA_DTYPE_F32, (size_t)T * H * DH);
    kva_test_poison(lse2, KVA_DTYPE_F32, (size_t)T * H);
    CHECK_OK(kva_attention_run(f->ctx, p, f->q, f->cache, NULL, out2, lse2));
    CHECK_MSG(memcmp(out, out2, sizeof(float) * (size_t)T * H * DH) == 0 &&
                  memcmp(lse, lse2, sizeof(float) * (size_t)T * H) == 0,
              "a plan run twice gave different bytes");
}

/* Overwrites every slot of every block-table row with new random K/V. */
static void rewrite_cache(fix *f)
{
    int64_t slots[R * STRIDE * BS];
    int n = 0;
    for (int i = 0; i < R * STRIDE; i++)
        for (int o = 0; o < BS; o++)
            slots[n++] = (int64_t)f->bt[i] * BS + o;
    float *k = malloc(sizeof(float) * (size_t)n * HKV * DH), *v = malloc(sizeof(float) * (size_t)n * HKV * DH);
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)n * HKV * DH, &f->rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, (size_t)n * HKV * DH, &f->rng, 1.0);
    CHECK_OK(kva_cache_write(f->ctx, f->cache, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    free(k);
    free(v);
}

/* A mask case: plan, run twice, oracle, rewrite the cache, run, oracle, and
 * the output must have changed. */
static void mask_case_q(kva_backend b, kva_quant quant, int32_t causal, int32_t window,
                        int32_t chunk, const char *label)
{
    fix f;
    fix_init_q(&f, b, 100 + (uint64_t)window * 7 + (uint64_t)chunk, quant);
    if (!causal) /* non-causal: request 3 gets more queries than keys */
        f.sl[3] = 4;
    kva_plan_desc pd = fix_desc(&f);
    pd.causal = causal;
    pd.window_left = window;
    pd.attention_chunk = chunk;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
    sz_sem m = {1.0 / sqrt((double)DH), 0.0, causal, window >= 100000 ? -1 : window, chunk, NULL, NULL};
    static float out[MAXT * H * DH], lse[MAXT * H], before[MAXT * H * DH];
    char l[96];
    snprintf(l, sizeof l, "%s %s %s", kva_backend_name(b), kva_quant_name(quant), label);
    run_twice(&f, p, out, lse);
    CHECK_MSG(sz_check_run(f.ctx, f.cache, &pd, &m, f.q, out, lse, KVA_DTYPE_F32, l) == 0, "%s", l);
    memcpy(before, out, sizeof out);
    rewrite_cache(&f);
    run_twice(&f, p, out, lse);
    snprintf(l, sizeof l, "%s %s %s after kva_cache_write", kva_backend_name(b),
             kva_quant_name(quant), label);
    CHECK_MSG(sz_check_run(f.ctx, f.cache, &pd, &m, f.q, out, lse, KVA_DTYPE_F32, l) == 0, "%s", l);
    CHECK_MSG(memcmp(before, out, sizeof(float) * (size_t)f.qsl[R] * H * DH) != 0,
              "%s: the output did not change", l);
    kva_plan_destroy(p);
    fix_free(&f);
}

static void mask_case(kva_backend b, int32_t causal, int32_t window, int32_t chunk, const char *label)
{
    mask_case_q(b, KVA_QUANT_NONE, causal, window, chunk, label);
}

static void test_degenerate_masks(void)
{
    /* Quantized caches: a plan sees what kva_cache_write quantized last. */
    for (int bi = 0; bi < 2; bi++)
        for (int qi = 0; qi < 2; qi++) {
            const kva_quant q = qi ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_INT8_TOKEN_K;
            mask_case_q(kBk[bi], q, 1, 0, 1, "causal window 0 chunk 1");
            mask_case_q(kBk[bi], q, 1, -1, 0, "causal");
        }
    for (int bi = 0; bi < 2; bi++) {
        mask_case(kBk[bi], 1, 0, 0, "causal window 0");
        mask_case(kBk[bi], 1, -1, 1, "causal chunk 1");
        mask_case(kBk[bi], 1, 0, 1, "causal window 0 chunk 1");
        mask_case(kBk[bi], 1, 1, 2, "causal window 1 chunk 2");
        mask_case(kBk[bi], 1, 1000000, 0, "causal window past every key");
        mask_case(kBk[bi], 1, -1, 1000000, "causal chunk past every key");
        mask_case(kBk[bi], 0, 0, 0, "non-causal window 0");
        mask_case(kBk[bi], 0, -1, 0, "non-causal");
        /* A local chunk needs causal = 1 (kvattn.h, docs/masks.md). */
        fix f;
        fix_init(&f, kBk[bi], 1);
        kva_plan_desc pd = fix_desc(&f);
        pd.causal = 0;
        pd.attention_chunk = 1;
        kva_plan *p = (kva_plan *)(uintptr_t)0x1234;
        BAD(kva_plan_create(f.ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
        CHECK(p == (kva_plan *)(uintptr_t)0x1234);
        fix_free(&f);
    }
}

/* The oracle of a tree plan: row i of request r sees committed keys and its
 * ancestors-or-self in the tree (parents as within-request indices). */
static size_t tree_check(fix *f, const kva_plan_desc *pd, const int32_t *parents, const float *out,
                         const float *lse, const char *label)
{
    size_t bad = 0;
    sz_sem m = {1.0 / sqrt((double)DH), 0.0, 1, -1, 0, NULL, NULL};
    for (int r = 0; r < R; r++) {
        const int32_t q = f->qsl[r + 1] - f->qsl[r], s = f->sl[r];
        for (int i = 0; i < q; i++) {
            int64_t posj[MAXT], slot[MAXT];
            int32_t n = 0;
            for (int32_t j = 0; j < s; j++) {
                int vis = j < s - q;
                for (int a = i; !vis && a >= 0; a = parents[f->qsl[r] + a])
                    vis = j - (s - q) == a;
                if (vis) {
                    posj[n] = j;
                    slot[n++] = (int64_t)f->bt[r * STRIDE + j / BS] * BS + j % BS;
                }
            }
            float k[MAXT * HKV * DH], v[MAXT * HKV * DH];
            CHECK_OK(kva_cache_read(f->ctx, f->cache, n, slot, k, 0, v, 0, KVA_DTYPE_F32));
            for (int h = 0; h < H; h++) {
                double qd[DH], want[DH], wl;
                const int64_t t = f->qsl[r] + i;
                for (int x = 0; x < DH; x++)
                    qd[x] = f->q[(t * H + h) * DH + x];
                sz_oracle(&m, qd, DH, DH, HKV, h / (H / HKV), h, s - q + i, n, posj, k, v, want, &wl);
                for (int x = 0; x < DH; x++)
                    if (!(fabs(out[(t * H + h) * DH + x] - want[x]) <= 2e-5 + 2e-5 * fabs(want[x])))
                        if (bad++ < 4)
                            fprintf(stderr, "  %s: r %d i %d h %d x %d: %g want %g\n", label, r, i,
                                    h, x, out[(t * H + h) * DH + x], want[x]);
                if (!(fabs(lse[t * H + h] - wl) <= 1e-5 + 1e-5 * fabs(wl)) && bad++ < 4)
                    fprintf(stderr, "  %s: lse r %d i %d h %d\n", label, r, i, h);
            }
        }
    }
    return bad;
}

/* Packs parents into FlashInfer's tree mask (segment_packbits, little). */
static size_t pack_mask(const fix *f, const int32_t *parents, uint8_t *mask)
{
    size_t at = 0;
    for (int r = 0; r < R; r++) {
        const int32_t q = f->qsl[r + 1] - f->qsl[r];
        const size_t bytes = ((size_t)q * q + 7) / 8;
        memset(mask + at, 0, bytes);
        for (int i = 0; i < q; i++)
            for (int a = i; a >= 0; a = parents[f->qsl[r] + a])
                mask[at + (size_t)(i * q + a) / 8] |= (uint8_t)(1u << ((i * q + a) % 8));
        at += bytes;
    }
    return at;
}

static void tree_case(kva_backend b, const int32_t *ql, const int32_t *parents, const char *label)
{
    fix f;
    fix_init(&f, b, 300);
    for (int r = 0; r < R; r++)
        f.qsl[r + 1] = f.qsl[r] + ql[r];
    kva_plan_desc pd = fix_desc(&f);
    static float out[MAXT * H * DH], lse[MAXT * H], out_m[MAXT * H * DH], lse_m[MAXT * H];
    static float out_c[MAXT * H * DH], lse_c[MAXT * H];
    char l[96];
    snprintf(l, sizeof l, "%s %s", kva_backend_name(b), label);
    pd.tree_parents = parents;
    kva_plan *p = NULL, *pm = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
    run_twice(&f, p, out, lse);
    CHECK_MSG(tree_check(&f, &pd, parents, out, lse, l) == 0, "%s (parents)", l);
    uint8_t mask[256];
    pack_mask(&f, parents, mask);
    pd.tree_parents = NULL;
    pd.tree_mask = mask;
    CHECK_OK(kva_plan_create(f.ctx, &pd, &pm));
    run_twice(&f, pm, out_m, lse_m);
    const size_t nout = sizeof(float) * (size_t)f.qsl[R] * H * DH, nlse = sizeof(float) * (size_t)f.qsl[R] * H;
    CHECK_MSG(memcmp(out, out_m, nout) == 0 && memcmp(lse, lse_m, nlse) == 0,
              "%s: tree_mask and tree_parents differ", l);
    /* Trees where every token is a root hanging off the context see only
     * themselves in the tree; a one-token tree equals a causal plan. */
    int all_one = 1;
    for (int r = 0; r < R; r++)
        all_one &= ql[r] <= 1;
    if (all_one) {
        kva_plan *pc = NULL;
        pd.tree_mask = NULL;
        CHECK_OK(kva_plan_create(f.ctx, &pd, &pc));
        run_twice(&f, pc, out_c, lse_c);
        CHECK_MSG(memcmp(out, out_c, nout) == 0 && memcmp(lse, lse_c, nlse) == 0,
                  "%s: a one-token tree differs from the causal plan", l);
        kva_plan_destroy(pc);
    }
    rewrite_cache(&f);
    run_twice(&f, p, out, lse);
    CHECK_MSG(tree_check(&f, &pd, parents, out, lse, l) == 0, "%s after kva_cache_write", l);
    kva_plan_destroy(p);
    kva_plan_destroy(pm);
    fix_free(&f);
}

static void test_trees(void)
{
    const int32_t one[R] = {1, 1, 0, 1}, one_p[3] = {-1, -1, -1};
    const int32_t mix[R] = {1, 3, 0, 6}, mix_p[10] = {-1, -1, 0, -1, -1, 0, 0, 1, -1, 4};
    const int32_t chain[R] = {1, 4, 1, 5}, chain_p[11] = {-1, -1, 0, 1, 2, -1, -1, 0, 1, 2, 3};
    for (int bi = 0; bi < 2; bi++) {
        tree_case(kBk[bi], one, one_p, "one-token trees");
        tree_case(kBk[bi], mix, mix_p, "branching trees");
        tree_case(kBk[bi], chain, chain_p, "chains (= causal)");
    }
}

/* Cascades: requests 0, 1 and 3 share leading blocks. */
static void cascade_case(kva_backend b, int32_t mode, int32_t groups, const int32_t *group,
                         const int32_t *prefix, const int32_t *sl, const char *label)
{
    fix f;
    fix_init(&f, b, 500);
    const int32_t ql[R] = {1, 2, 0, 3};
    for (int r = 0; r < R; r++) {
        f.qsl[r + 1] = f.qsl[r] + ql[r];
        f.sl[r] = sl[r];
    }
    for (int i = 0; i < 2; i++) { /* rows 1 and 3 begin with row 0's blocks */
        f.bt[1 * STRIDE + i] = f.bt[i];
        f.bt[3 * STRIDE + i] = f.bt[i];
    }
    kva_plan_desc pd = fix_desc(&f);
    pd.cascade = mode;
    pd.num_cascade_groups = groups;
    pd.cascade_group = group;
    pd.cascade_prefix_len = prefix;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(p, &info));
    if (mode == KVA_CASCADE_ON)
        CHECK_MSG(info.num_cascade_groups >= 1, "%s: %s: ON gave no cascade", kva_backend_name(b),
                  label);
    static float out[MAXT * H * DH], lse[MAXT * H];
    char l[96];
    snprintf(l, sizeof l, "%s %s (groups %d)", kva_backend_name(b), label, info.num_cascade_groups);
    sz_sem m = {1.0 / sqrt((double)DH), 0.0, 1, -1, 0, NULL, NULL};
    run_twice(&f, p, out, lse);
    CHECK_MSG(sz_check_run(f.ctx, f.cache, &pd, &m, f.q, out, lse, KVA_DTYPE_F32, l) == 0, "%s", l);
    rewrite_cache(&f);
    run_twice(&f, p, out, lse);
    CHECK_MSG(sz_check_run(f.ctx, f.cache, &pd, &m, f.q, out, lse, KVA_DTYPE_F32, l) == 0,
              "%s after kva_cache_write", l);
    kva_plan_destroy(p);
    fix_free(&f);
}

static void test_cascades(void)
{
    /* seq_lens: first queries at 8 (prefix of 2 blocks ends exactly there). */
    const int32_t sl[R] = {9, 10, 5, 11}, sl_one[R] = {5, 6, 5, 7};
    const int32_t g_all[R] = {0, 0, -1, 0}, p8[1] = {8}, p4[1] = {4};
    const int32_t g_one[R] = {0, -1, -1, -1};
    const int32_t g_two[R] = {0, 1, -1, 1}, p_two[2] = {4, 8};
    for (int bi = 0; bi < 2; bi++) {
        cascade_case(kBk[bi], KVA_CASCADE_AUTO, 0, NULL, NULL, sl, "auto");
        cascade_case(kBk[bi], KVA_CASCADE_ON, 0, NULL, NULL, sl, "on, found");
        cascade_case(kBk[bi], KVA_CASCADE_ON, 1, g_all, p8, sl, "prefix ends at the first query");
        cascade_case(kBk[bi], KVA_CASCADE_ON, 1, g_all, p4, sl_one, "one-block prefix");
        cascade_case(kBk[bi], KVA_CASCADE_ON, 1, g_one, p8, sl, "one member");
        cascade_case(kBk[bi], KVA_CASCADE_ON, 2, g_two, p_two, sl, "two groups");
        cascade_case(kBk[bi], KVA_CASCADE_OFF, 1, g_all, p8, sl, "off, given");
    }
}

/* DCP with one rank is no DCP. */
static void test_dcp_one_rank(void)
{
    const int32_t sl[5] = {0, 1, 7, 64, 1000};
    int32_t ll[5];
    for (int n = 0; n <= 1; n++)
        for (int il = 0; il <= 5; il += 5) {
            memset(ll, 0x55, sizeof ll);
            CHECK_OK(kva_dcp_local_lens(5, sl, n, 0, il, ll));
            CHECK(memcmp(ll, sl, sizeof sl) == 0);
            const int32_t row[3] = {7, 2, 9};
            int64_t slots[12];
            for (int i = 0; i < 12; i++)
                slots[i] = -9;
            CHECK_OK(kva_dcp_slots(n, 0, il, 4, row, 3, 0, 12, slots));
            for (int i = 0; i < 12; i++)
                CHECK_MSG(slots[i] == (int64_t)row[i / 4] * 4 + i % 4, "N %d I %d slot %d = %lld", n,
                          il, i, (long long)slots[i]);
            CHECK_STATUS(kva_dcp_slots(n, 0, il, 4, row, 3, 0, 13, slots), KVA_STATUS_OUT_OF_RANGE);
            CHECK_STATUS(kva_dcp_local_lens(5, sl, n, 1, il, ll), KVA_STATUS_INVALID_ARGUMENT);
        }
    for (int bi = 0; bi < 2; bi++) {
        fix f;
        fix_init(&f, kBk[bi], 700);
        kva_plan_desc pd = fix_desc(&f);
        static float out[MAXT * H * DH], lse[MAXT * H], out1[MAXT * H * DH], lse1[MAXT * H];
        kva_plan *p = NULL, *p1 = NULL;
        CHECK_OK(kva_plan_create(f.ctx, &pd, &p));
        run_twice(&f, p, out, lse);
        pd.dcp_size = 1;
        pd.dcp_interleave = 3;
        CHECK_OK(kva_plan_create(f.ctx, &pd, &p1));
        run_twice(&f, p1, out1, lse1);
        const size_t nout = sizeof(float) * (size_t)f.qsl[R] * H * DH, nlse = sizeof(float) * (size_t)f.qsl[R] * H;
        CHECK_MSG(memcmp(out, out1, nout) == 0 && memcmp(lse, lse1, nlse) == 0,
                  "%s: dcp_size 1 differs from no DCP", kva_backend_name(kBk[bi]));
        kva_plan_destroy(p);
        kva_plan_destroy(p1);
        fix_free(&f);
    }
}

int main(void)
{
    RUN(test_degenerate_masks);
    RUN(test_trees);
    RUN(test_cascades);
    RUN(test_dcp_one_rank);
    return kva_test_finish();
}
