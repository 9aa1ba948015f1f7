/*
 * test_cpu.c - the CPU backend against the reference backend.
 *
 * Both backends run the same random inputs (q, a random-filled paged cache or
 * ragged K/V, sinks, ALiBi slopes); the CPU outputs are poisoned with NaN
 * before each run. Covered:
 *   - the foundation grid (head sizes incl. D != Dv, (H, Hkv), batch sizes,
 *     dtypes, NHD/HND, block sizes, masks, soft-cap, ALiBi, sinks, thread
 *     counts 1-3, paged and ragged) by a seeded covering design: every axis
 *     walks its values in a fresh random order every len(values) cases, so
 *     each value appears several times in random combinations;
 *   - split-KV (one long request on 2-3 threads, decodes and a chunked prefill);
 *   - partitions built with extreme parameters (tiny tiles, sliced GQA groups,
 *     one-key chunks, rows that see nothing in a chunk) and every kernel variant;
 *   - a long prefill next to many decodes (balance, num_work_items, results);
 *   - kva_merge_states, including -inf sides and in-place aliasing.
 * Output tolerances are the harness's per q dtype; LSE (float32) uses the f32
 * tolerance.
 */
#include "batchgen.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>

/* One attention case. */
typedef struct cfg {
    int32_t D, Dv, H, Hkv, R, block_size, max_len, threads;
    unsigned kinds;
    kva_dtype dt;
    kva_layout layout;
    int share, causal, window, alibi, sinks, ragged;
    float softcap;
    uint64_t seed;
    double budget; /* most fp64 multiply-adds the reference may spend (0: 4e6) */
    int variant; /* 0: the dispatcher's choice */
    /* Override of the partition (tiny tiles and chunks), or NULL. */
    const kva__partition_params *pp;
} cfg;

static const char *kinds_name(unsigned k)
{
    return k == 15u ? "mixed" : k == 1u ? "decode" : k == 3u ? "spec" : k == 12u ? "prefill" : "?";
}

static void print_cfg(const cfg *c)
{
    fprintf(stderr,
            "  case: D=%d Dv=%d H=%d Hkv=%d R=%d B=%d max_len=%d threads=%d kinds=%s %s %s "
            "share=%d causal=%d window=%d softcap=%g alibi=%d sinks=%d ragged=%d variant=%d "
            "seed=%llu%s\n",
            c->D, c->Dv, c->H, c->Hkv, c->R, c->block_size, c->max_len, c->threads,
            kinds_name(c->kinds), kva_dtype_name(c->dt), c->layout == KVA_LAYOUT_NHD ? "NHD" : "HND",
            c->share, c->causal, c->window, (double)c->softcap, c->alibi, c->sinks, c->ragged,
            c->variant, (unsigned long long)c->seed, c->pp ? " custom-partition" : "");
}

/* Fills n elements with uniform values of unit variance in (-sqrt 3, sqrt 3),
 * never zero: much cheaper than kva_test_fill's Box-Muller normals, which
 * dominated this test's run time on caches of 10^7 elements. */
static void fast_fill(void *p, kva_dtype dt, size_t n, kva_rng *rng)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t u = kva_rng_u64(rng);
        float x = (float)((int64_t)(u >> 11) - (int64_t)(1ull << 52)) * (float)(1.7320508 / 0x1p52);
        if (x == 0.0f)
            x = 0.5f;
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = x;
        else if (dt == KVA_DTYPE_F16)
            ((uint16_t *)p)[i] = kva_f32_to_f16(x);
        else
            ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
    }
}

/* A cache sized for the batch, every element (unused and shared blocks too) random. */
static kva_status make_cache(const kva_test_batch *b, kva_context *ctx, kva_rng *rng, int32_t Hkv,
                             int32_t D, int32_t Dv, kva_dtype dt, kva_layout layout,
                             kva_cache **out)
{
    kva_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.num_blocks = b->num_blocks;
    cd.block_size = b->block_size;
    cd.num_kv_heads = Hkv;
    cd.head_dim = D;
    cd.head_dim_v = Dv;
    cd.dtype = dt;
    cd.layout = layout;
    KVA_TRY(kva_cache_create(ctx, &cd, out));
    void *k, *v;
    KVA_TRY(kva_cache_data(*out, &k, &v));
    size_t rows = (size_t)b->num_blocks * (size_t)b->block_size * (size_t)Hkv;
    fast_fill(k, dt, rows * (size_t)D, rng);
    fast_fill(v, dt, rows * (size_t)Dv, rng);
    return KVA_STATUS_OK;
}

/* Multiply-adds the fp64 reference spends on a batch (two passes over the keys). */
static double ref_cost(const kva_test_batch *b, const cfg *c)
{
    double s = 0;
    for (int32_t r = 0; r < b->R; r++)
        s += (double)b->q_lens[r] * b->seq_lens[r];
    return s * c->H * (2.0 * c->D + c->Dv);
}

/* Replaces the plan's partition by one built with custom parameters, and
 * grows the workspace to match (what cpu_plan_build does with its defaults). */
static kva_status repartition(kva_context *ctx, kva_plan *plan, const kva__partition_params *pp)
{
    kva__partition *part = NULL;
    KVA_TRY(kva__partition_build(plan, pp, &part));
    part->variant = plan->part->variant;
    kva__partition_free(plan->part);
    plan->part = part;
    plan->info.num_work_items = part->num_items;
    size_t bytes = (((size_t)part->partial_floats * sizeof(float) + 63u) & ~(size_t)63u) +
                   (size_t)pp->num_threads *
                       kva__cpu_scratch_bytes(plan->d.head_dim, plan->d.head_dim_v);
    plan->workspace_bytes = bytes;
    return kva__context_reserve_workspace(ctx, bytes);
}

/*
 * Runs one case on both backends and compares out and lse. If b is NULL a
 * random batch is drawn (shrinking max_len until the reference's cost fits
 * the budget). Returns the CPU plan's number of work items (0 on failure).
 */
static int32_t run_case_batch(const cfg *c0, const kva_test_batch *given, kva_plan_info *info_out,
                              int32_t *num_tasks_out)
{
    cfg c = *c0;
    kva_rng rng = {c.seed};
    kva_test_batch batch;
    if (given) {
        batch = *given;
    } else {
        for (;;) {
            kva_test_batch_random(&batch, &rng, c.R, c.block_size, c.max_len, c.kinds, c.share);
            if (ref_cost(&batch, &c) <= (c.budget > 0 ? c.budget : 4e6) || c.max_len <= 4)
                break;
            kva_test_batch_free(&batch);
            c.max_len = c.max_len * 2 / 3;
        }
    }
    const kva_test_batch *b = &batch;
    const int32_t H = c.H, Hkv = c.Hkv, D = c.D, Dv = c.Dv, T = b->T;
    const size_t esz = kva_dtype_size(c.dt);
    int32_t items = 0;

    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, c.threads, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));

    kva_cache *cache = NULL;
    void *k = NULL, *v = NULL;
    int64_t kv_rows = 0;
    for (int32_t r = 0; r < b->R; r++)
        kv_rows += b->seq_lens[r];
    if (c.ragged) {
        k = malloc((size_t)(kv_rows + 1) * Hkv * D * esz);
        v = malloc((size_t)(kv_rows + 1) * Hkv * Dv * esz);
        fast_fill(k, c.dt, (size_t)kv_rows * Hkv * D, &rng);
        fast_fill(v, c.dt, (size_t)kv_rows * Hkv * Dv, &rng);
    } else {
        CHECK_OK(make_cache(b, ref, &rng, Hkv, D, Dv, c.dt, c.layout, &cache));
    }

    kva_plan_desc pd = kva_test_batch_plan_desc(b, H, Hkv, D, Dv, c.dt);
    if (c.ragged) {
        pd.block_table = NULL;
        pd.block_table_stride = 0;
        pd.block_size = 0;
    }
    pd.causal = c.causal;
    pd.window_left = c.window;
    pd.softcap = c.softcap;
    float *slopes = malloc(sizeof(float) * (size_t)H);
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    }
    pd.alibi_slopes = c.alibi ? slopes : NULL;

    kva_plan *pref = NULL, *pcpu = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
    if (pcpu && c.pp)
        CHECK_OK(repartition(cpu, pcpu, c.pp));
    if (pcpu && c.variant)
        pcpu->part->variant = c.variant;

    const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
    void *q = malloc(nq * esz + 1);
    void *out_ref = malloc(no * esz + 1), *out_cpu = malloc(no * esz + 1);
    float *lse_ref = malloc(nl * sizeof(float) + 1), *lse_cpu = malloc(nl * sizeof(float) + 1);
    fast_fill(q, c.dt, nq, &rng);

    if (pref && pcpu) {
        const float *sk = c.sinks ? sinks : NULL;
        kva_test_poison(out_ref, c.dt, no);
        kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
        if (c.ragged)
            CHECK_OK(kva_attention_run_ragged(ref, pref, q, k, v, sk, out_ref, lse_ref));
        else
            CHECK_OK(kva_attention_run(ref, pref, q, cache, sk, out_ref, lse_ref));
        /* Twice: the second run checks that a plan (and its workspace) can be reused. */
        for (int rep = 0; rep < 2; rep++) {
            kva_test_poison(out_cpu, c.dt, no);
            kva_test_poison(lse_cpu, KVA_DTYPE_F32, nl);
            if (c.ragged)
                CHECK_OK(kva_attention_run_ragged(cpu, pcpu, q, k, v, sk, out_cpu, lse_cpu));
            else
                CHECK_OK(kva_attention_run(cpu, pcpu, q, cache, sk, out_cpu, lse_cpu));
            size_t bad = kva_test_compare("out", out_cpu, out_ref, c.dt, no, kva_test_atol(c.dt),
                                          kva_test_rtol(c.dt));
            bad += kva_test_compare_f32("lse", lse_cpu, lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                        kva_test_rtol(KVA_DTYPE_F32));
            CHECK_MSG(bad == 0, "%zu mismatches (T=%d)", bad, (int)T);
            if (bad) {
                print_cfg(&c);
                break;
            }
        }
        /* lse == NULL is allowed and must not change out. */
        kva_test_poison(out_cpu, c.dt, no);
        if (c.ragged)
            CHECK_OK(kva_attention_run_ragged(cpu, pcpu, q, k, v, sk, out_cpu, NULL));
        else
            CHECK_OK(kva_attention_run(cpu, pcpu, q, cache, sk, out_cpu, NULL));
        size_t bad = kva_test_compare("out (lse NULL)", out_cpu, out_ref, c.dt, no,
                                      kva_test_atol(c.dt), kva_test_rtol(c.dt));
        CHECK_MSG(bad == 0, "%zu mismatches without lse", bad);
        items = pcpu->info.num_work_items;
        if (info_out)
            *info_out = pcpu->info;
        if (num_tasks_out)
            *num_tasks_out = pcpu->part->num_tasks;
    }

    free(q);
    free(out_ref);
    free(out_cpu);
    free(lse_ref);
    free(lse_cpu);
    free(slopes);
    free(sinks);
    free(k);
    free(v);
    kva_plan_destroy(pref);
    kva_plan_destroy(pcpu);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    if (!given)
        kva_test_batch_free(&batch);
    return items;
}

static int32_t run_case(const cfg *c) { return run_case_batch(c, NULL, NULL, NULL); }

/* ------------------------------------------------------------------------ */
/* The foundation grid                                                       */
/* ------------------------------------------------------------------------ */

/* Value index of an axis for case i: a fresh random order of the n values
 * every n cases (perm holds the current order, refreshed when i % n == 0). */
static int axis_pick(kva_rng *rng, int *perm, int n, int i)
{
    if (i % n == 0) {
        for (int j = 0; j < n; j++)
            perm[j] = j;
        for (int j = n - 1; j > 0; j--) {
            int x = kva_rng_int(rng, 0, j), t = perm[j];
            perm[j] = perm[x];
            perm[x] = t;
        }
    }
    return perm[i % n];
}

/* N cases of the covering design over the grid axes, with the given batch
 * sizes and length limits, drawn from seed. */
static void grid(int N, const int32_t *reqs, int nreqs, const int32_t *max_lens, int nlens,
                 double budget, uint64_t seed)
{
    static const int32_t dims[][2] = {{64, 64}, {80, 80}, {128, 128}, {256, 256}, {128, 64}, {64, 96}};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {32, 8}};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const int32_t bsizes[] = {1, 7, 16, 32};
    static const unsigned kinds[] = {15u, 15u, 1u, 3u, 12u};
    static const int32_t windows[] = {-1, -1, 0, 5, 40};
    static const float caps[] = {0.0f, 2.0f};
    int p_dims[6], p_heads[4], p_reqs[8], p_dts[3], p_lay[2], p_bs[4], p_thr[3], p_kinds[5],
        p_len[8], p_causal[2], p_win[5], p_cap[2], p_alibi[2], p_sinks[2], p_share[2], p_rag[4];
    kva_rng rng = {seed};
    int failed_before = kva_test_checks_failed_;
    for (int i = 0; i < N; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        int di = axis_pick(&rng, p_dims, 6, i), hi = axis_pick(&rng, p_heads, 4, i);
        c.D = dims[di][0];
        c.Dv = dims[di][1];
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.R = reqs[axis_pick(&rng, p_reqs, nreqs, i)];
        c.dt = dts[axis_pick(&rng, p_dts, 3, i)];
        c.layout = axis_pick(&rng, p_lay, 2, i) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.block_size = bsizes[axis_pick(&rng, p_bs, 4, i)];
        c.threads = 1 + axis_pick(&rng, p_thr, 3, i);
        c.kinds = kinds[axis_pick(&rng, p_kinds, 5, i)];
        c.max_len = max_lens[axis_pick(&rng, p_len, nlens, i)];
        c.causal = axis_pick(&rng, p_causal, 2, i);
        c.window = windows[axis_pick(&rng, p_win, 5, i)];
        c.softcap = caps[axis_pick(&rng, p_cap, 2, i)];
        c.alibi = axis_pick(&rng, p_alibi, 2, i);
        c.sinks = axis_pick(&rng, p_sinks, 2, i);
        c.share = axis_pick(&rng, p_share, 2, i);
        c.ragged = axis_pick(&rng, p_rag, 4, i) == 0;
        c.seed = seed + 1000 + (uint64_t)i;
        c.budget = budget;
        run_case(&c);
        if (kva_test_checks_failed_ - failed_before > 20)
            break; /* enough output */
    }
}

/* The foundation grid: batch sizes 1-128 (lengths shrink to fit the
 * reference's budget, so large batches have short requests). */
static void test_grid(void)
{
    static const int32_t reqs[] = {1, 16, 64, 128};
    static const int32_t lens[] = {30, 100, 300, 1000};
    grid(72, reqs, 4, lens, 4, 4e6, 0xc0ffee);
}

/* Few long requests: many key chunks per item, blocks crossed inside chunks,
 * windows far from the start, and split-KV on 2-3 threads. */
static void test_grid_long(void)
{
    static const int32_t reqs[] = {1, 2, 3};
    static const int32_t lens[] = {500, 1500};
    grid(24, reqs, 3, lens, 2, 1.5e7, 0xbeef);
}

/* ------------------------------------------------------------------------ */
/* Split-KV and the partition                                                */
/* ------------------------------------------------------------------------ */

/* Builds a batch from explicit q_lens / seq_lens. */
static void make_batch(kva_test_batch *b, uint64_t seed, int32_t R, const int32_t *q,
                       const int32_t *s, int32_t block_size)
{
    kva_rng rng = {seed};
    kva_test_batch_init(b, &rng, R, q, s, block_size, 2, 1);
}

/* One long request on one kv head: the only way to use 2+ threads is to split it. */
static void test_split_kv(void)
{
    static const int32_t qs[] = {1, 3, 70};
    for (int k = 0; k < 3; k++) {
        for (int thr = 2; thr <= 3; thr++) {
            int32_t q = qs[k], s = q == 70 ? 1500 : 2600;
            kva_test_batch b;
            make_batch(&b, 77 + (uint64_t)k, 1, &q, &s, 16);
            cfg c;
            memset(&c, 0, sizeof c);
            c.D = 64;
            c.Dv = 64;
            c.H = 4;
            c.Hkv = 1;
            c.R = 1;
            c.block_size = 16;
            c.threads = thr;
            c.dt = k == 1 ? KVA_DTYPE_BF16 : KVA_DTYPE_F32;
            c.layout = thr == 2 ? KVA_LAYOUT_NHD : KVA_LAYOUT_HND;
            c.causal = 1;
            c.window = -1;
            c.sinks = 1;          /* the sink must be counted once across the splits */
            c.alibi = k == 2;
            c.seed = 500 + (uint64_t)(k * 10 + thr);
            kva_plan_info info;
            int32_t tasks = 0;
            int32_t items = run_case_batch(&c, &b, &info, &tasks);
            CHECK_MSG(tasks >= 1 && items >= 2 * thr,
                      "q_len %d, %d threads: %d split tasks, %d items", (int)q, thr, (int)tasks,
                      (int)items);
            kva_test_batch_free(&b);
        }
    }
}

/* Partitions with extreme parameters: one- and few-row tiles, GQA groups
 * sliced into several items, chunks of a few keys (rows that see nothing in
 * a chunk), many splits; and every kernel variant. */
static void test_custom_partitions(void)
{
    kva_rng rng = {4242};
    for (int i = 0; i < 12; i++) {
        kva__partition_params pp;
        pp.num_threads = 3;
        pp.max_rows = kva_rng_int(&rng, 1, 6);
        pp.prefill_rows = kva_rng_int(&rng, 1, pp.max_rows);
        pp.split_align = kva_rng_int(&rng, 1, 5);
        pp.min_split_keys = kva_rng_int(&rng, 1, 9);
        pp.max_splits = kva_rng_int(&rng, 2, 40);
        pp.items_per_thread = kva_rng_int(&rng, 4, 64);
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = 32;
        c.Dv = i % 2 ? 24 : 40;
        c.H = 8;
        c.Hkv = i % 3 ? 2 : 1;
        c.R = kva_rng_int(&rng, 1, 6);
        c.block_size = kva_rng_int(&rng, 1, 9);
        c.max_len = 60;
        c.threads = kva_rng_int(&rng, 1, 3);
        c.kinds = 15u;
        c.dt = (kva_dtype)(i % 3);
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.share = 1;
        c.causal = i % 4 != 3;
        c.window = i % 3 == 0 ? kva_rng_int(&rng, 0, 10) : -1;
        c.softcap = i % 5 == 0 ? 3.0f : 0.0f;
        c.alibi = i % 2;
        c.sinks = i % 3 != 1;
        c.ragged = i % 4 == 1;
        c.seed = 9000 + (uint64_t)i;
        c.pp = &pp;
        c.variant = 1 + i % kva__cpu_attn_num_variants();
        run_case(&c);
    }
}

/* A long prefill next to many decodes: many items, none dominating, results right. */
static void test_prefill_plus_decodes(void)
{
    enum { R = 41 };
    int32_t q[R], s[R];
    kva_rng rng = {31337};
    q[0] = 300;
    s[0] = 420; /* chunked prefill with context */
    for (int r = 1; r < R; r++) {
        q[r] = 1;
        s[r] = kva_rng_int(&rng, 20, 400);
    }
    for (int thr = 2; thr <= 3; thr++) {
        kva_test_batch b;
        make_batch(&b, 99 + (uint64_t)thr, R, q, s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = 64;
        c.Dv = 64;
        c.H = 8;
        c.Hkv = 2;
        c.R = R;
        c.block_size = 16;
        c.threads = thr;
        c.dt = thr == 2 ? KVA_DTYPE_F16 : KVA_DTYPE_F32;
        c.layout = KVA_LAYOUT_NHD;
        c.causal = 1;
        c.window = -1;
        c.sinks = thr == 3;
        c.seed = 7 + (uint64_t)thr;
        kva_plan_info info;
        int32_t items = run_case_batch(&c, &b, &info, NULL);
        CHECK_MSG(items > 1 && info.num_work_items == items, "items %d", (int)items);
        CHECK(info.state == KVA_STATE_CHUNKED_PREFILL);
        kva_test_batch_free(&b);
    }
}

/* Partition shape only (no attention run, so it can be large): one 32k prefill
 * next to 60 decodes, and a lone long decode, on 2 and 3 threads. */
static void test_partition_balance(void)
{
    enum { R = 61 };
    static int32_t q[R], s[R];
    kva_rng rng = {2024};
    q[0] = 32768;
    s[0] = 32768;
    for (int r = 1; r < R; r++) {
        q[r] = 1;
        s[r] = kva_rng_int(&rng, 100, 4000);
    }
    for (int thr = 2; thr <= 3; thr++) {
        for (int lone = 0; lone < 2; lone++) {
            kva_test_batch b;
            int32_t q1 = 1, s1 = 32768;
            if (lone)
                make_batch(&b, 5, 1, &q1, &s1, 16);
            else
                make_batch(&b, 5, R, q, s, 16);
            kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_BF16);
            kva_context_desc cd = {KVA_BACKEND_CPU, thr, 0};
            kva_context *ctx = NULL;
            kva_plan *plan = NULL;
            CHECK_OK(kva_context_create(&cd, &ctx));
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
            if (plan) {
                const kva__partition *p = plan->part;
                int64_t max_cost = 0, sum = 0;
                for (int32_t i = 0; i < p->num_items; i++) {
                    sum += p->items[i].cost;
                    if (p->items[i].cost > max_cost)
                        max_cost = p->items[i].cost;
                    if (i > 0)
                        CHECK(p->items[i].cost <= p->items[i - 1].cost); /* longest first */
                }
                CHECK(sum == p->total_cost);
                CHECK(plan->info.num_work_items == p->num_items);
                CHECK_MSG(p->num_items >= 4 * thr, "%d items", (int)p->num_items);
                /* No item may hold more than a quarter of one thread's share. */
                CHECK_MSG(max_cost * 4 * thr <= sum * 1 + 4 * thr * 4096,
                          "largest item %lld of total %lld (threads %d, lone %d)",
                          (long long)max_cost, (long long)sum, thr, lone);
                CHECK(plan->workspace_bytes > 0 && ctx->workspace_bytes >= plan->workspace_bytes);
            }
            kva_plan_destroy(plan);
            kva_context_destroy(ctx);
            kva_test_batch_free(&b);
        }
    }
}

/* Decode-only batches with many requests are not split: one item per
 * (request, kv head), the whole GQA group in one item. */
static void test_decode_items(void)
{
    enum { R = 64 };
    int32_t q[R], s[R];
    for (int r = 0; r < R; r++) {
        q[r] = 1;
        s[r] = 100 + r;
    }
    kva_test_batch b;
    make_batch(&b, 3, R, q, s, 16);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_F16);
    kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ctx = NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (plan) {
        CHECK_MSG(plan->info.num_work_items == R * 8, "%d items", (int)plan->info.num_work_items);
        CHECK(plan->part->num_tasks == 0);
        for (int32_t i = 0; i < plan->part->num_items; i++)
            CHECK(plan->part->items[i].nh == 4 && plan->part->items[i].nq == 1);
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_test_batch_free(&b);
}

/* ------------------------------------------------------------------------ */
/* merge_states                                                              */
/* ------------------------------------------------------------------------ */

static void test_merge_states(void)
{
    kva_rng rng = {8080};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    for (int i = 0; i < 9; i++) {
        const kva_dtype dt = dts[i % 3];
        const int32_t T = kva_rng_int(&rng, 1, 300), H = kva_rng_int(&rng, 1, 8);
        const int32_t Dv = 8 * kva_rng_int(&rng, 1, 32);
        const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H, esz = kva_dtype_size(dt);
        void *a = malloc(n * esz), *bb = malloc(n * esz), *o_ref = malloc(n * esz),
             *o_cpu = malloc(n * esz);
        float *la = malloc(nl * 4), *lb = malloc(nl * 4), *l_ref = malloc(nl * 4),
              *l_cpu = malloc(nl * 4);
        kva_test_fill(a, dt, n, &rng, 1.0);
        kva_test_fill(bb, dt, n, &rng, 1.0);
        for (size_t x = 0; x < nl; x++) {
            int kind = kva_rng_int(&rng, 0, 5);
            la[x] = kind == 0 ? -INFINITY : (float)(kva_rng_normal(&rng) * 4);
            lb[x] = kind == 1 || kind == 2 ? -INFINITY : (float)(kva_rng_normal(&rng) * 4);
        }
        kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 1 + i % 3, 0};
        kva_context *ref = NULL, *cpu = NULL;
        CHECK_OK(kva_context_create(&rd, &ref));
        CHECK_OK(kva_context_create(&cd, &cpu));
        kva_test_poison(o_ref, dt, n);
        kva_test_poison(o_cpu, dt, n);
        kva_test_poison(l_ref, KVA_DTYPE_F32, nl);
        kva_test_poison(l_cpu, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_merge_states(ref, T, H, Dv, dt, a, la, bb, lb, o_ref, l_ref));
        CHECK_OK(kva_merge_states(cpu, T, H, Dv, dt, a, la, bb, lb, o_cpu, l_cpu));
        size_t bad = kva_test_compare("merge out", o_cpu, o_ref, dt, n, kva_test_atol(dt),
                                      kva_test_rtol(dt));
        bad += kva_test_compare_f32("merge lse", l_cpu, l_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "merge_states %s T=%d H=%d Dv=%d: %zu mismatches", kva_dtype_name(dt),
                  (int)T, (int)H, (int)Dv, bad);
        /* In place: out aliases out_a (i odd) or out_b, lse_out aliases the same side. */
        void *io = i % 2 ? a : bb;
        float *il = i % 2 ? la : lb;
        CHECK_OK(kva_merge_states(cpu, T, H, Dv, dt, a, la, bb, lb, io, il));
        bad = kva_test_compare("merge in place", io, o_ref, dt, n, kva_test_atol(dt),
                               kva_test_rtol(dt));
        bad += kva_test_compare_f32("merge lse in place", il, l_ref, nl,
                                    kva_test_atol(KVA_DTYPE_F32), kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "in-place merge_states: %zu mismatches", bad);
        kva_context_destroy(ref);
        kva_context_destroy(cpu);
        free(a);
        free(bb);
        free(o_ref);
        free(o_cpu);
        free(la);
        free(lb);
        free(l_ref);
        free(l_cpu);
    }
}

int main(void)
{
    RUN(test_grid);
    RUN(test_grid_long);
    RUN(test_split_kv);
    RUN(test_custom_partitions);
    RUN(test_prefill_plus_decodes);
    RUN(test_partition_balance);
    RUN(test_decode_items);
    RUN(test_merge_states);
    return kva_test_finish();
}
