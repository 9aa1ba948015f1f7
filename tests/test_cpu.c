/*
 * test_cpu.c - the CPU backend against the reference backend.
 *
 * Both backends run the same random inputs (q, a random-filled paged cache or
 * ragged K/V, sinks, ALiBi slopes); the CPU outputs are poisoned with NaN
 * before each run. Covered:
 *   - the foundation grid (head sizes 8-256 incl. D != Dv, D = 8 with Dv = 8
 *     and 256, (H, Hkv), batch sizes 1-128, dtypes, NHD/HND, block sizes,
 *     causal, windows, soft-cap, explicit softmax scales, decode thresholds,
 *     ALiBi, sinks (small and about +-60), q_len 0 / seq_len 0 requests among
 *     others, thread counts 1-3, paged and ragged) by a seeded covering
 *     design: every axis walks its values in a fresh random order every
 *     len(values) cases, so each value appears several times in random
 *     combinations. Batches over the
 * reference's budget lose requests and prefills before keys, and the grid checks (and prints) that
 * most cases read more than one key chunk;
 *   - the long grid: 1-3 long, decode-heavy requests with small H, checked to
 *     split on 2-3 threads in at least half of its cases, windows included;
 *   - split-KV with the default partition: one long request on 2-3 threads
 *     (sink counted once, ALiBi), and split tasks asserted together with
 *     windows (causal and not), soft-cap, ALiBi, large sinks, explicit scales;
 *   - MQA 256/1 (a GQA group larger than max_rows, sliced by the default
 *     partition), and q_len 0 / seq_len 0 requests in explicit batches,
 *     including non-causal rows with no keys;
 *   - partitions built with extreme parameters (tiny tiles, sliced GQA groups,
 *     one-key chunks, rows that see nothing in a chunk) and every kernel;
 *   - a long prefill next to many decodes (balance, num_work_items, results).
 * Every case runs the reference once and the CPU backend with the
 * dispatcher's per-item choice (decode kernel for decode-shaped items, tiled
 * prefill kernel for query tiles: kva__cpu_item_prefill), then with each
 * registry kernel the machine runs forced on the items of its family
 * (kva__context_force_kernel), each against that one reference output.
 * Partition shapes are tested in test_cpu_partition.c, kva_merge_states in
 * test_cpu_merge.c, non-finite inputs in test_cpu_nonfinite.c. Output tolerances are
 * the harness's per q dtype; LSE (float32) uses the f32 tolerance.
 * KVA_TEST_QUICK=1 (the sanitizer run of scripts/test.sh) runs the first 36 of
 * the foundation grid's 72 cases: every axis value still appears at least
 * four times (the covering design walks each axis of at most 8 values in a
 * fresh order every len(values) cases), and the long prefill next to many
 * decodes on 3 threads only; the Release run covers all.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

/* The kernels every case runs on the CPU backend (main fills them): NULL (the
 * dispatcher's choice), then each registry kernel the machine runs; g_kernel
 * is the one of the run in progress (print_cfg). */
static const char *g_kernels[KVA_TEST_MAX_KERNELS + 1];
static int g_nkernels;
static const char *g_kernel;

/* One attention case. */
typedef struct cfg {
    int32_t D, Dv, H, Hkv, R, block_size, max_len, threads;
    unsigned kinds;
    kva_dtype dt;
    kva_layout layout;
    int share, causal, window, alibi, ragged;
    int sinks; /* 0 none, 1 N(0, 4) logits, 2 large (about +-60: the sink dominates or vanishes) */
    int empties; /* 1: some requests past the first get q_len 0, or q_len 0 and seq_len 0 */
    int32_t decode_threshold; /* the plan's (0 means 1) */
    float softcap;
    float scale; /* the plan's softmax scale, 0 = 1/sqrt(D) */
    uint64_t seed;
    double budget;      /* most fp64 multiply-adds the reference may spend (0: 4e6) */
    const char *kernel; /* a registry kernel forced for this case, or NULL */
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
            "share=%d causal=%d window=%d softcap=%g scale=%g decode_threshold=%d alibi=%d "
            "sinks=%d empties=%d ragged=%d kernel=%s seed=%llu%s\n",
            c->D, c->Dv, c->H, c->Hkv, c->R, c->block_size, c->max_len, c->threads,
            kinds_name(c->kinds), kva_dtype_name(c->dt),
            c->layout == KVA_LAYOUT_NHD ? "NHD" : "HND", c->share, c->causal, c->window,
            (double)c->softcap, (double)c->scale, (int)c->decode_threshold, c->alibi, c->sinks,
            c->empties, c->ragged,
            c->kernel  ? c->kernel
            : g_kernel ? g_kernel
                       : "-",
            (unsigned long long)c->seed, c->pp ? " custom-partition" : "");
}

/* Multiply-adds the fp64 reference spends on a batch (two passes over the keys). */
static double ref_cost(const kva_test_batch *b, const cfg *c)
{
    double s = 0;
    for (int32_t r = 0; r < b->R; r++)
        s += (double)b->q_lens[r] * b->seq_lens[r];
    return s * c->H * (2.0 * c->D + c->Dv);
}

/* Draws the case's random batch; with c->empties, every third request past
 * the first loses its queries (q_len 0 with its context kept, or q_len 0 and
 * seq_len 0 for every sixth), so that empty requests sit between others. */
static void random_batch(kva_test_batch *b, kva_rng *rng, const cfg *c)
{
    kva_test_batch_random(b, rng, c->R, c->block_size, c->max_len, c->kinds, c->share);
    if (!c->empties || c->R < 2)
        return;
    int32_t *q = malloc(sizeof(int32_t) * (size_t)c->R),
            *sl = malloc(sizeof(int32_t) * (size_t)c->R);
    for (int32_t r = 0; r < c->R; r++) {
        q[r] = r % 3 == 1 ? 0 : b->q_lens[r];
        sl[r] = r % 6 == 1 ? 0 : b->seq_lens[r];
    }
    kva_test_batch_free(b);
    kva_test_batch_init(b, rng, c->R, q, sl, c->block_size, 3, c->share);
    free(q);
    free(sl);
}

/* What the cases of a test exercised (reported and checked by the grids). */
typedef struct coverage {
    int cases;
    int multi_chunk; /* some request has more keys than one KEY_CHUNK load */
    int split;       /* the CPU plan has split tasks */
    int split_window, split_softcap, split_alibi, split_sinks; /* ... together with these */
    int empties; /* batches with q_len 0 / seq_len 0 requests among others */
} coverage;

static coverage cov;

/* One case's inputs and reference results, for the CPU runs of run_cpu. */
typedef struct cpu_io {
    const cfg *c;
    const kva_test_batch *b;
    const kva_plan_desc *pd;
    const kva_cache *cache; /* paged K/V, or NULL: ragged k, v */
    const void *q, *k, *v;
    const float *sinks;
    const void *out_ref;
    const float *lse_ref;
    size_t no, nl; /* elements of out and lse */
} cpu_io;

/* The case on the CPU backend with g_kernel (and the case's kernel) forced:
 * twice with lse (the second run reuses the plan and its workspace), once
 * without, each output poisoned first and compared with the reference.
 * count: add the case to the coverage. Returns the plan's work items. */
static int32_t run_cpu(const cpu_io *io, int count, kva_plan_info *info_out, int32_t *num_tasks_out)
{
    const cfg *c = io->c;
    const size_t no = io->no, nl = io->nl;
    kva_context_desc cd = {KVA_BACKEND_CPU, c->threads, 0};
    kva_context *cpu = NULL;
    kva_plan *pcpu = NULL;
    CHECK_OK(kva_context_create(&cd, &cpu));
    if (cpu && g_kernel)
        CHECK_OK(kva__context_force_kernel(cpu, g_kernel));
    if (cpu && c->kernel)
        CHECK_OK(kva__context_force_kernel(cpu, c->kernel));
    if (cpu)
        CHECK_OK(kva_plan_create(cpu, io->pd, &pcpu));
    if (pcpu && c->pp)
        CHECK_OK(kva__cpu_plan_partition(cpu, pcpu, c->pp));
    int32_t items = 0;
    void *out = malloc(no * kva_dtype_size(c->dt) + 1);
    float *lse = malloc(nl * sizeof(float) + 1);
    for (int rep = 0; pcpu && rep < 3; rep++) {
        /* rep 2: lse == NULL is allowed and must not change out. */
        float *l = rep < 2 ? lse : NULL;
        kva_test_poison(out, c->dt, no);
        kva_test_poison(lse, KVA_DTYPE_F32, nl);
        if (c->ragged)
            CHECK_OK(kva_attention_run_ragged(cpu, pcpu, io->q, io->k, io->v, io->sinks, out, l));
        else
            CHECK_OK(kva_attention_run(cpu, pcpu, io->q, io->cache, io->sinks, out, l));
        size_t bad = kva_test_compare(rep < 2 ? "out" : "out (lse NULL)", out, io->out_ref, c->dt,
                                      no, kva_test_atol(c->dt), kva_test_rtol(c->dt));
        if (l)
            bad += kva_test_compare_f32("lse", lse, io->lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                        kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d)%s", bad, (int)io->b->T, l ? "" : " without lse");
        if (bad) {
            print_cfg(c);
            break;
        }
    }
    if (pcpu) {
        items = pcpu->info.num_work_items;
        int32_t max_seq = 0, empty_reqs = 0;
        for (int32_t r = 0; r < io->b->R; r++) {
            max_seq = io->b->seq_lens[r] > max_seq ? io->b->seq_lens[r] : max_seq;
            empty_reqs += io->b->q_lens[r] == 0;
        }
        const int split = pcpu->part->num_tasks > 0;
        if (count) {
            cov.cases++;
            cov.multi_chunk += max_seq > KVA_CPU_KEY_CHUNK;
            cov.split += split;
            cov.split_window += split && c->window >= 0;
            cov.split_softcap += split && c->softcap > 0.0f;
            cov.split_alibi += split && c->alibi;
            cov.split_sinks += split && c->sinks;
            cov.empties += empty_reqs > 0 && io->b->R > 2;
        }
        if (info_out)
            *info_out = pcpu->info;
        if (num_tasks_out)
            *num_tasks_out = pcpu->part->num_tasks;
    }
    free(out);
    free(lse);
    kva_plan_destroy(pcpu);
    kva_context_destroy(cpu);
    return items;
}

/*
 * Runs one case on both backends and compares out and lse. If b is NULL a
 * random batch is drawn; while the reference's cost exceeds the budget the
 * batch shrinks: first the number of requests (down to an eighth), then
 * prefills give way to decodes, then max_len (down to 48, so keys still span
 * two chunks), then the rest. Returns the CPU plan's number of work items
 * (0 on failure).
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
        const int32_t r_floor = c.R / 8 > 1 ? c.R / 8 : 1;
        for (;;) {
            random_batch(&batch, &rng, &c);
            if (ref_cost(&batch, &c) <= (c.budget > 0 ? c.budget : 4e6))
                break;
            if (c.R > r_floor)
                c.R = c.R * 2 / 3 > r_floor ? c.R * 2 / 3 : r_floor;
            else if (c.kinds & 12u)
                c.kinds = c.kinds & 3u ? c.kinds & 3u : 3u;
            else if (c.max_len > 48)
                c.max_len = c.max_len * 2 / 3 > 48 ? c.max_len * 2 / 3 : 48;
            else if (c.R > 1)
                c.R = c.R * 2 / 3;
            else if (c.max_len > 4)
                c.max_len = c.max_len * 2 / 3;
            else
                break;
            kva_test_batch_free(&batch);
        }
    }
    const kva_test_batch *b = &batch;
    const int32_t H = c.H, Hkv = c.Hkv, D = c.D, Dv = c.Dv, T = b->T;
    const size_t esz = kva_dtype_size(c.dt);
    int32_t items = 0;

    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
    kva_context *ref = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));

    kva_cache *cache = NULL;
    void *k = NULL, *v = NULL;
    int64_t kv_rows = 0;
    for (int32_t r = 0; r < b->R; r++)
        kv_rows += b->seq_lens[r];
    if (c.ragged) {
        k = malloc((size_t)(kv_rows + 1) * Hkv * D * esz);
        v = malloc((size_t)(kv_rows + 1) * Hkv * Dv * esz);
        kva_test_fill_uniform(k, c.dt, (size_t)kv_rows * Hkv * D, &rng);
        kva_test_fill_uniform(v, c.dt, (size_t)kv_rows * Hkv * Dv, &rng);
    } else {
        CHECK_OK(kva_test_batch_cache(b, ref, &rng, Hkv, D, Dv, c.dt, c.layout, &cache));
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
    pd.scale = c.scale;
    pd.decode_threshold = c.decode_threshold;
    float *slopes = malloc(sizeof(float) * (size_t)H);
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
        if (c.sinks == 2)
            sinks[h] += h % 2 ? 60.0f : -60.0f;
    }
    pd.alibi_slopes = c.alibi ? slopes : NULL;

    kva_plan *pref = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));

    const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
    cpu_io io = {&c, b, &pd, cache, NULL, k, v, c.sinks ? sinks : NULL, NULL, NULL, no, nl};
    void *q = malloc(nq * esz + 1);
    void *out_ref = malloc(no * esz + 1);
    float *lse_ref = malloc(nl * sizeof(float) + 1);
    kva_test_fill_uniform(q, c.dt, nq, &rng);
    io.q = q, io.out_ref = out_ref, io.lse_ref = lse_ref;

    if (pref) {
        kva_test_poison(out_ref, c.dt, no);
        kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
        if (c.ragged)
            CHECK_OK(kva_attention_run_ragged(ref, pref, q, k, v, io.sinks, out_ref, lse_ref));
        else
            CHECK_OK(kva_attention_run(ref, pref, q, cache, io.sinks, out_ref, lse_ref));
        /* The CPU backend with each kernel against this one reference output;
         * the plan facts the callers check come from the dispatcher's run. */
        for (int kv = 0; kv < g_nkernels; kv++) {
            g_kernel = g_kernels[kv];
            const int32_t n =
                run_cpu(&io, kv == 0, kv == 0 ? info_out : NULL, kv == 0 ? num_tasks_out : NULL);
            items = kv == 0 ? n : items;
        }
        g_kernel = NULL;
    }

    free(q);
    free(out_ref);
    free(lse_ref);
    free(slopes);
    free(sinks);
    free(k);
    free(v);
    kva_plan_destroy(pref);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    if (!given)
        kva_test_batch_free(&batch);
    return items;
}

static int32_t run_case(const cfg *c)
{
    return run_case_batch(c, NULL, NULL, NULL);
}

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

/* The axes one grid walks besides the shared ones. */
typedef struct grid_axes {
    const int32_t *reqs;
    int nreqs;
    const int32_t *max_lens;
    int nlens;
    const int32_t (*heads)[2]; /* (H, Hkv) */
    int nheads;
    const unsigned *kinds;
    int nkinds;
    const kva_dtype *dts;
    int ndts;
    const int32_t *windows;
    int nwindows;
    double budget;
} grid_axes;

/* Prints what the cases since `before` covered and returns the counts. */
static coverage coverage_since(const char *name, const coverage *before)
{
    coverage d;
    d.cases = cov.cases - before->cases;
    d.multi_chunk = cov.multi_chunk - before->multi_chunk;
    d.split = cov.split - before->split;
    d.split_window = cov.split_window - before->split_window;
    d.split_softcap = cov.split_softcap - before->split_softcap;
    d.split_alibi = cov.split_alibi - before->split_alibi;
    d.split_sinks = cov.split_sinks - before->split_sinks;
    d.empties = cov.empties - before->empties;
    fprintf(stderr,
            "  %s: %d cases, %d with multi-chunk keys, %d split (window %d, softcap %d, "
            "alibi %d, sinks %d), %d with empty requests\n",
            name, d.cases, d.multi_chunk, d.split, d.split_window, d.split_softcap, d.split_alibi,
            d.split_sinks, d.empties);
    return d;
}

/* N cases of the covering design over the grid axes, drawn from seed. */
static void grid(int N, const grid_axes *ax, uint64_t seed)
{
    static const int32_t dims[][2] = {{64, 64},  {80, 80}, {128, 128}, {256, 256},
                                      {128, 64}, {64, 96}, {8, 8},     {8, 256}};
    static const int32_t bsizes[] = {1, 7, 16, 32};
    static const float caps[] = {0.0f, 2.0f};
    static const float scales[] = {0.0f, 0.03f, 0.3f};
    static const int32_t thresholds[] = {0, 4, 16};
    int p_dims[8], p_heads[8], p_reqs[8], p_dts[8], p_lay[2], p_bs[4], p_thr[3], p_kinds[8],
        p_len[8], p_causal[2], p_win[8], p_cap[2], p_alibi[2], p_sinks[3], p_share[2], p_rag[4],
        p_scale[3], p_dthr[3], p_empty[3];
    kva_rng rng = {seed};
    int failed_before = kva_test_checks_failed_;
    for (int i = 0; i < N; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        int di = axis_pick(&rng, p_dims, 8, i), hi = axis_pick(&rng, p_heads, ax->nheads, i);
        c.D = dims[di][0];
        c.Dv = dims[di][1];
        c.H = ax->heads[hi][0];
        c.Hkv = ax->heads[hi][1];
        c.R = ax->reqs[axis_pick(&rng, p_reqs, ax->nreqs, i)];
        c.dt = ax->dts[axis_pick(&rng, p_dts, ax->ndts, i)];
        c.layout = axis_pick(&rng, p_lay, 2, i) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.block_size = bsizes[axis_pick(&rng, p_bs, 4, i)];
        c.threads = 1 + axis_pick(&rng, p_thr, 3, i);
        c.kinds = ax->kinds[axis_pick(&rng, p_kinds, ax->nkinds, i)];
        c.max_len = ax->max_lens[axis_pick(&rng, p_len, ax->nlens, i)];
        c.causal = axis_pick(&rng, p_causal, 2, i);
        c.window = ax->windows[axis_pick(&rng, p_win, ax->nwindows, i)];
        c.softcap = caps[axis_pick(&rng, p_cap, 2, i)];
        c.scale = scales[axis_pick(&rng, p_scale, 3, i)];
        c.decode_threshold = thresholds[axis_pick(&rng, p_dthr, 3, i)];
        c.alibi = axis_pick(&rng, p_alibi, 2, i);
        c.sinks = axis_pick(&rng, p_sinks, 3, i);
        c.share = axis_pick(&rng, p_share, 2, i);
        c.ragged = axis_pick(&rng, p_rag, 4, i) == 0;
        c.empties = axis_pick(&rng, p_empty, 3, i) == 0;
        c.seed = seed + 1000 + (uint64_t)i;
        c.budget = ax->budget;
        run_case(&c);
        if (kva_test_checks_failed_ - failed_before > 20)
            break; /* enough output */
    }
}

/* The foundation grid: batch sizes 1-128, every head size (8 to 256, D != Dv),
 * GQA groups 1-8. Over the budget, batches lose requests and prefills before
 * their keys, so most cases still read several key chunks per item. */
static void test_grid(void)
{
    static const int32_t reqs[] = {1, 3, 16, 64, 128};
    static const int32_t lens[] = {40, 150, 600, 2000};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {32, 8}};
    static const unsigned kinds[] = {15u, 15u, 1u, 3u, 12u};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const int32_t windows[] = {-1, -1, 0, 5, 40, 300};
    const grid_axes ax = {reqs, 5, lens, 4, heads, 4, kinds, 5, dts, 3, windows, 6, 2.5e7};
    const coverage before = cov;
    grid(kva_test_quick() ? 36 : 72, &ax, 0xc0ffee);
    const coverage d = coverage_since("grid", &before);
    CHECK_MSG(d.multi_chunk * 4 >= d.cases * 3, "%d of %d cases multi-chunk", d.multi_chunk,
              d.cases);
    /* (10 of 72: scaled for the quick run) */
    CHECK_MSG(d.empties * 72 >= 10 * d.cases, "%d of %d cases with empty requests", d.empties,
              d.cases);
}

/* Few long requests (decode-heavy, small H, mostly f32 to keep the fp64
 * reference cheap): many key chunks per item, blocks crossed inside chunks,
 * windows far from the start, and split-KV on 2-3 threads, windows included. */
static void test_grid_long(void)
{
    static const int32_t reqs[] = {1, 2, 3};
    static const int32_t lens[] = {700, 1500, 2500};
    static const int32_t heads[][2] = {{2, 2}, {4, 1}, {8, 2}, {4, 4}};
    static const unsigned kinds[] = {1u, 3u, 1u, 15u};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_F16};
    static const int32_t windows[] = {-1, -1, 300, 600, 1000};
    const grid_axes ax = {reqs, 3, lens, 3, heads, 4, kinds, 4, dts, 4, windows, 5, 4e7};
    const coverage before = cov;
    grid(24, &ax, 0xbeef);
    const coverage d = coverage_since("long grid", &before);
    CHECK_MSG(d.multi_chunk + 2 >= d.cases, "%d of %d cases multi-chunk", d.multi_chunk, d.cases);
    CHECK_MSG(d.split * 2 >= d.cases && d.split_window >= 3, "%d of %d split, %d with a window",
              d.split, d.cases, d.split_window);
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
            c.sinks = 1; /* the sink must be counted once across the splits */
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

/* Split-KV (default partition) together with each mask and score option: one
 * long request per case, whose only parallelism on 2-3 threads is splitting. */
static void test_split_features(void)
{
    static const struct {
        int32_t q, s, window, alibi, sinks, causal, threads;
        float softcap, scale;
        kva_dtype dt;
    } cases[] = {
        {1, 3000, 700, 0, 0, 1, 2, 0.0f, 0.0f, KVA_DTYPE_F32},   /* window */
        {3, 2600, 900, 0, 1, 1, 3, 5.0f, 0.0f, KVA_DTYPE_F32},   /* window, softcap, sinks */
        {70, 1500, 500, 1, 1, 1, 2, 0.0f, 0.0f, KVA_DTYPE_BF16}, /* prefill tile, window, alibi */
        {1, 3000, -1, 1, 2, 1, 3, 4.0f, 0.0f, KVA_DTYPE_F16},    /* softcap, alibi, large sinks */
        {5, 2000, 400, 0, 2, 0, 2, 0.0f, 0.4f, KVA_DTYPE_F32},   /* non-causal window, scale */
        {2, 2800, 1200, 1, 1, 1, 3, 2.0f, 0.02f, KVA_DTYPE_F32}, /* all of them */
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        kva_test_batch b;
        make_batch(&b, 600 + (uint64_t)i, 1, &cases[i].q, &cases[i].s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = 64;
        c.Dv = i % 2 ? 32 : 64;
        c.H = 4;
        c.Hkv = 1;
        c.R = 1;
        c.block_size = 16;
        c.threads = cases[i].threads;
        c.dt = cases[i].dt;
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = cases[i].causal;
        c.window = cases[i].window;
        c.alibi = cases[i].alibi;
        c.sinks = cases[i].sinks;
        c.softcap = cases[i].softcap;
        c.scale = cases[i].scale;
        c.ragged = i == 3;
        c.seed = 700 + (uint64_t)i;
        int32_t tasks = 0;
        run_case_batch(&c, &b, NULL, &tasks);
        CHECK_MSG(tasks >= 1, "case %d: no split task", i);
        kva_test_batch_free(&b);
    }
}

/* MQA with 256 query heads on one kv head: the GQA group exceeds max_rows
 * (128), so the default partition slices it; decodes, a spec decode and a
 * short prefill, on 1-3 threads. */
static void test_mqa_256(void)
{
    static const int32_t q[] = {1, 3, 1, 9}, s[] = {300, 200, 45, 60};
    for (int thr = 1; thr <= 3; thr++) {
        kva_test_batch b;
        make_batch(&b, 800 + (uint64_t)thr, 4, q, s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = thr == 2 ? 8 : 32;
        c.Dv = 32;
        c.H = 256;
        c.Hkv = 1;
        c.R = 4;
        c.block_size = 16;
        c.threads = thr;
        c.dt = thr == 3 ? KVA_DTYPE_BF16 : KVA_DTYPE_F32;
        c.causal = 1;
        c.window = thr == 3 ? 50 : -1;
        c.sinks = 1;
        c.alibi = thr == 2;
        c.seed = 810 + (uint64_t)thr;
        run_case_batch(&c, &b, NULL, NULL);
        kva_test_batch_free(&b);
    }
    /* The partition itself: two slices of 128 heads per query tile. */
    kva_test_batch b;
    make_batch(&b, 800, 4, q, s, 16);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 256, 1, 32, 32, KVA_DTYPE_F32);
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (plan) {
        int heads[256] = {0};
        for (int32_t i = 0; i < plan->part->num_items; i++) {
            const kva__work_item *it = &plan->part->items[i];
            CHECK(it->nh == 128 && (it->h0 == 0 || it->h0 == 128));
            if (it->req == 0)
                for (int32_t h = it->h0; h < it->h0 + it->nh; h++)
                    heads[h]++;
        }
        for (int h = 0; h < 256; h++)
            CHECK_MSG(heads[h] == 1, "head %d covered %d times", h, heads[h]);
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_test_batch_free(&b);
}

/* Requests with q_len 0 (with and without context) and seq_len 0 between
 * others, paged and ragged; non-causal plans may also give queries no keys
 * (seq_len 0, q_len > 0: out 0, lse -inf or the sink). */
static void test_empty_requests(void)
{
    static const int32_t q_causal[] = {1, 0, 40, 0, 3, 0, 1};
    static const int32_t s_causal[] = {900, 0, 300, 500, 700, 0, 33};
    static const int32_t q_cross[] = {2, 4, 0, 7, 0, 1};
    static const int32_t s_cross[] = {400, 0, 0, 50, 300, 0};
    for (int i = 0; i < 6; i++) {
        const int cross = i >= 3;
        const int32_t R = cross ? 6 : 7;
        kva_test_batch b;
        make_batch(&b, 900 + (uint64_t)i, R, cross ? q_cross : q_causal, cross ? s_cross : s_causal,
                   16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = 64;
        c.Dv = 64;
        c.H = 8;
        c.Hkv = 2;
        c.R = R;
        c.block_size = 16;
        c.threads = 1 + i % 3;
        c.dt = (kva_dtype)(i % 3);
        c.causal = !cross;
        c.window = i == 2 ? 100 : -1;
        c.sinks = i % 2;
        c.ragged = i == 1 || i == 4;
        c.seed = 910 + (uint64_t)i;
        kva_plan_info info;
        memset(&info, 0, sizeof info);
        CHECK(run_case_batch(&c, &b, &info, NULL) > 0 && info.num_tokens == b.T);
        kva_test_batch_free(&b);
    }
}

/* Partitions with extreme parameters: one- and few-row tiles, GQA groups
 * sliced into several items, chunks of a few keys (rows that see nothing in
 * a chunk), many splits; and every kernel. */
static void test_custom_partitions(void)
{
    kva_rng rng = {4242};
    kva_test_kernel kernels[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(kernels);
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
        /* Cycle through the kernels this machine runs. */
        c.kernel = nk && kernels[i % nk].runs ? kernels[i % nk].name : NULL;
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
    /* Quick: the 3-thread run only (f32, sinks); f16 and 2 threads run in the grid. */
    for (int thr = kva_test_quick() ? 3 : 2; thr <= 3; thr++) {
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

int main(void)
{
    /* NULL: the dispatcher's per-item choice; then every registry kernel the
     * machine runs, forced on its family's items. */
    kva_test_kernel kernels[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(kernels);
    g_kernels[g_nkernels++] = NULL;
    printf("kernels: dispatcher");
    for (int32_t v = 0; v < nk; v++) {
        if (kernels[v].family == KVA__KERNEL_MLA)
            continue; /* kva_mla_run's items: tests/test_mla.c */
        if (kernels[v].runs)
            g_kernels[g_nkernels++] = kernels[v].name;
        printf(", %s%s", kernels[v].name, kernels[v].runs ? "" : " (not on this machine)");
    }
    printf("\n");
    RUN(test_grid);
    RUN(test_grid_long);
    RUN(test_split_kv);
    RUN(test_split_features);
    RUN(test_mqa_256);
    RUN(test_empty_requests);
    RUN(test_custom_partitions);
    RUN(test_prefill_plus_decodes);
    return kva_test_finish();
}
