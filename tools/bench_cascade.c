/*
 * bench_cascade.c - `kvattn bench --cascade`: a decode step whose requests
 * share a prompt prefix (G groups of requests with the same leading blocks,
 * then S keys of their own), timed as a plain plan and as a cascade plan
 * (docs/cascade.md) on the same cache, after checking the cascade's output
 * against the plain one. Also prints what the automatic choice
 * (KVA_CASCADE_AUTO) takes, and on the CPU the roofline ratio: the plain
 * step's lower bound over the cascade's (flops are the same; the cascade reads
 * each group's prefix once instead of once per request), with the measured
 * speedup as a percentage of it. Each bound is max(memory time, flops / FMA
 * peak), the memory time from two measured levels: both steps read the
 * step's distinct K/V bytes (every prefix once, every suffix) at the DRAM
 * read bandwidth, and the plain step's other R - 1 reads of each prefix at
 * the bandwidth of passes over a buffer of its reuse distance (the keys read
 * between two reads of the same prefix key: every group's prefix and one
 * suffix), which is the last-level cache's when that fits there.
 */
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef struct cas_opts {
    int32_t batch, prefix, suffix, groups, heads, kv_heads, head_dim, B, threads, iters, warmup;
    kva_dtype dt;
    kva_backend backend;
    int no_ceiling, paired;
} cas_opts;

static void usage(void)
{
    printf("usage: kvattn bench --cascade [options]\n"
           "\n"
           "Times a decode step whose requests share a prefix, as a plain plan and as a\n"
           "cascade plan over the same cache, after checking one against the other.\n"
           "  --batch R            decoding requests                [64]\n"
           "  --shared-prefix P    shared keys per group, a multiple of B [8192]\n"
           "  --suffix S           own keys per request after the prefix [256]\n"
           "  --groups G           groups (request r is in group r %% G) [1]\n"
           "  --heads H --kv-heads Hkv --head-dim D --block-size B   [32 8 128 16]\n"
           "  --dtype f32|f16|bf16 q, cache and output dtype         [bf16]\n"
           "  --backend cpu|cuda   backend                           [cpu]\n"
           "  --threads N          CPU threads, 0 = all              [0]\n"
           "  --iters N --warmup N timed and untimed runs            [20 3]\n"
           "  --no-ceiling         skip the CPU roofline (DRAM and re-read bandwidths, FMA\n"
           "                       peak)\n"
           "  --paired             cpu: also run plain, cascade and a measurement of the\n"
           "                       roofline's rates in turn --iters times, and print the\n"
           "                       medians of each turn's speedup over its own roofline\n");
}

static int parse(int argc, char **argv, cas_opts *o)
{
    static const char *const dts[] = {"f32", "f16", "bf16"};
    static const kva_dtype dtv[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const char *const bes[] = {"cpu", "cuda"};
    static const char *const value_flags[] = {
        "--batch",    "--shared-prefix", "--suffix",     "--groups",  "--heads",
        "--kv-heads", "--head-dim",      "--block-size", "--threads", "--iters",
        "--warmup",   "--dtype",         "--backend"};
    *o = (cas_opts){64, 8192, 256, 1, 32, 8, 128, 16, 0, 20, 3, KVA_DTYPE_BF16, KVA_BACKEND_CPU,
                    0,  0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int k = 0, ok = 1;
        if (strcmp(a, "--cascade") == 0)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage();
            return KVA_EXIT_OK;
        }
        if (strcmp(a, "--no-ceiling") == 0) {
            o->no_ceiling = 1;
            continue;
        }
        if (strcmp(a, "--paired") == 0) {
            o->paired = 1;
            continue;
        }
        char name[40]; /* "--flag v" or "--flag=v" */
        const char *v = kva_cli_flag_split(argc, argv, &i, name, sizeof name, "bench --cascade",
                                           value_flags, sizeof value_flags / sizeof value_flags[0]);
        a = name;
        if (!v)
            return KVA_EXIT_USAGE;
        if (strcmp(a, "--batch") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 1 << 16, &o->batch);
        else if (strcmp(a, "--shared-prefix") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 1 << 24, &o->prefix);
        else if (strcmp(a, "--suffix") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 1 << 24, &o->suffix);
        else if (strcmp(a, "--groups") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 1 << 16, &o->groups);
        else if (strcmp(a, "--heads") == 0)
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_HEADS, &o->heads);
        else if (strcmp(a, "--kv-heads") == 0)
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_HEADS, &o->kv_heads);
        else if (strcmp(a, "--head-dim") == 0)
            ok = kva_cli_parse_i32(a, v, 8, KVA_MAX_HEAD_DIM, &o->head_dim);
        else if (strcmp(a, "--block-size") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 1 << 16, &o->B);
        else if (strcmp(a, "--threads") == 0)
            ok = kva_cli_parse_i32(a, v, 0, KVA_MAX_THREADS, &o->threads);
        else if (strcmp(a, "--iters") == 0)
            ok = kva_cli_parse_i32(a, v, 1, 100000, &o->iters);
        else if (strcmp(a, "--warmup") == 0)
            ok = kva_cli_parse_i32(a, v, 0, 100000, &o->warmup);
        else if (strcmp(a, "--dtype") == 0) {
            ok = kva_cli_parse_choice(a, v, dts, 3, &k);
            o->dt = dtv[k];
        } else if (strcmp(a, "--backend") == 0) {
            ok = kva_cli_parse_choice(a, v, bes, 2, &k);
            o->backend = k ? KVA_BACKEND_CUDA : KVA_BACKEND_CPU;
        } else {
            fprintf(stderr, "kvattn: bench --cascade: unknown option '%s'\n", a);
            return KVA_EXIT_USAGE;
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    if (o->prefix % o->B != 0 || o->heads % o->kv_heads != 0 || o->groups > o->batch) {
        fprintf(stderr, "kvattn: bench --cascade: --shared-prefix must be a multiple of "
                        "--block-size, --heads of --kv-heads, and --groups at most --batch\n");
        return KVA_EXIT_USAGE;
    }
    return -1;
}

/* Median seconds of o->iters runs of plan (after o->warmup). */
static kva_status time_plan(const cas_opts *o, kva_context *ctx, const kva_plan *plan,
                            const void *q, const kva_cache *cache, void *out, float *lse,
                            double *med)
{
    const int dev = o->backend == KVA_BACKEND_CUDA;
    double *t = malloc(sizeof(double) * (size_t)o->iters);
    if (!t)
        return KVA_STATUS_OUT_OF_MEMORY;
    (void)dev;
    kva_status st = KVA_STATUS_OK;
    for (int i = 0; i < o->warmup && st == KVA_STATUS_OK; i++)
        st = kva_attention_run(ctx, plan, q, cache, NULL, out, lse);
#ifdef KVA_HAVE_CUDA
    cudaEvent_t ev[2];
    if (dev) {
        cudaEventCreate(&ev[0]);
        cudaEventCreate(&ev[1]);
    }
#endif
    for (int i = 0; i < o->iters && st == KVA_STATUS_OK; i++) {
        const double t0 = kva_cli_now();
#ifdef KVA_HAVE_CUDA
        if (dev)
            cudaEventRecord(ev[0], 0);
#endif
        st = kva_attention_run(ctx, plan, q, cache, NULL, out, lse);
        t[i] = kva_cli_now() - t0;
#ifdef KVA_HAVE_CUDA
        if (dev) {
            float ms = 0.f;
            cudaEventRecord(ev[1], 0);
            cudaEventSynchronize(ev[1]);
            cudaEventElapsedTime(&ms, ev[0], ev[1]);
            t[i] = ms * 1e-3;
        }
#endif
    }
#ifdef KVA_HAVE_CUDA
    if (dev) {
        cudaEventDestroy(ev[0]);
        cudaEventDestroy(ev[1]);
    }
#endif
    *med = bench_median(t, o->iters);
    free(t);
    return st;
}

/* Builds the batch: request r in group r % G, q_len 1, seq_len P + S; the
 * blocks of each group's prefix and of each request's suffix are distinct
 * and shuffled. */
static int32_t *build_table(const cas_opts *o, int32_t *stride, int32_t *nb)
{
    const int32_t pb = o->prefix / o->B, sb = (o->suffix + o->B - 1) / o->B;
    *stride = pb + sb;
    *nb = 1 + o->groups * pb + o->batch * sb;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)*nb);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)o->batch * (size_t)*stride);
    if (!perm || !bt) {
        free(perm);
        free(bt);
        return NULL;
    }
    uint64_t s = 99;
    for (int32_t i = 0; i < *nb; i++)
        perm[i] = i;
    for (int32_t i = *nb - 1; i > 1; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int32_t j = 1 + (int32_t)((s >> 33) % (uint64_t)i), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (int32_t r = 0; r < o->batch; r++) {
        int32_t *row = bt + (int64_t)r * *stride;
        for (int32_t j = 0; j < pb; j++)
            row[j] = perm[1 + (r % o->groups) * pb + j];
        for (int32_t j = 0; j < sb; j++)
            row[pb + j] = perm[1 + o->groups * pb + r * sb + j];
    }
    free(perm);
    return bt;
}

/* Writes random K/V into every slot of the cache, 8192 slots at a time. */
static kva_status fill(const cas_opts *o, kva_context *ctx, kva_cache *cache, int32_t nb)
{
    const int dev = o->backend == KVA_BACKEND_CUDA;
    const int64_t chunk = 8192, row = (int64_t)o->kv_heads * o->head_dim;
    float *h = malloc(sizeof(float) * (size_t)(2 * chunk * row));
    int64_t *hs = malloc(sizeof(int64_t) * (size_t)chunk);
    float *d = kva_cli_buf_new(dev, sizeof(float) * (size_t)(2 * chunk * row));
    int64_t *ds = kva_cli_buf_new(dev, sizeof(int64_t) * (size_t)chunk);
    kva_status st = h && hs && d && ds ? KVA_STATUS_OK : KVA_STATUS_OUT_OF_MEMORY;
    uint64_t seed = 7;
    for (int64_t s0 = 0; st == KVA_STATUS_OK && s0 < (int64_t)nb * o->B; s0 += chunk) {
        const int64_t n = (int64_t)nb * o->B - s0 < chunk ? (int64_t)nb * o->B - s0 : chunk;
        for (int64_t i = 0; i < n; i++)
            hs[i] = s0 + i;
        (void)kva_cli_buf_copy(dev, ds, hs, sizeof(int64_t) * (size_t)n);
        bench_fill(h, KVA_DTYPE_F32, (size_t)(2 * n * row), &seed);
        (void)kva_cli_buf_copy(dev, d, h, sizeof(float) * (size_t)(2 * n * row));
        st = kva_cache_write(ctx, cache, (int32_t)n, d, 0, d + n * row, 0, KVA_DTYPE_F32, ds);
    }
    free(h);
    free(hs);
    kva_cli_buf_free(dev, d);
    kva_cli_buf_free(dev, ds);
    return st;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The roofline of the two steps (bytes and flops of the shape). */
typedef struct cas_roof {
    double distinct; /* K/V bytes of the step, each key once (the cascade's reads) */
    double rereads;  /* the plain step's further reads of the prefixes */
    double reuse;    /* bytes read between two reads of one prefix key */
    double flops;
} cas_roof;

/* The machine's rates of one moment, in bytes/s and flop/s. */
typedef struct cas_rates {
    double dram, reread, peak;
} cas_rates;

/* Read bandwidth in bytes/s of passes over an open reader: one untimed pass
 * brings its buffer to the level it fits in, then the best of timed passes
 * reading `bytes` in all (at least two): a small buffer's single pass is short
 * enough for one late thread wake-up on a loaded machine to halve it. */
static double reader_bw(kva_cli_reader *rd, double bytes)
{
    const double buf = (double)rd->words * sizeof(uint64_t);
    const int passes = bytes / buf > 2.0 ? (int)ceil(bytes / buf) : 2;
    double best = 0.0;
    kva_cli_reader_pass(rd);
    for (int i = 0; i < passes; i++) {
        const double bw = kva_cli_reader_pass(rd) * 1e9;
        best = bw > best ? bw : best;
    }
    return best;
}

/* Measures the rates with the open readers (DRAM: 256 MiB; re-read: the
 * reuse distance), each from passes reading `bytes`. */
static cas_rates measure_rates(kva_cli_reader *dram, kva_cli_reader *reuse, int nt, double bytes)
{
    const char *isa = "";
    cas_rates r;
    r.dram = reader_bw(dram, bytes);
    r.reread = reader_bw(reuse, bytes);
    r.peak = kva_cli_measure_fma_peak(nt, &isa) * 1e9;
    return r;
}

/* The plain step's and the cascade's lower bounds in seconds. */
static void roof_bounds(const cas_roof *f, const cas_rates *r, double *tp, double *tc)
{
    const double tf = f->flops / r->peak, first = f->distinct / r->dram;
    *tp = fmax(first + f->rereads / r->reread, tf);
    *tc = fmax(first, tf);
}

/* Opens the two readers of measure_rates; -1 when out of memory. */
static int open_readers(kva_cli_reader *dram, kva_cli_reader *reuse, int nt, double reuse_bytes)
{
    if (kva_cli_reader_open(dram, nt) != 0)
        return -1;
    if (kva_cli_reader_open_bytes(reuse, nt, (size_t)reuse_bytes) != 0) {
        kva_cli_reader_close(dram);
        return -1;
    }
    return 0;
}

/* --paired (CPU): o->iters turns of one plain run, one cascade run and one
 * measurement of the rates (a DRAM pass, a re-read pass, the FMA peak), so
 * each turn's speedup is judged against the roofline of the same moment (the
 * VM's load moves them all); prints the medians over the turns, and the
 * least-disturbed estimate: the fastest plain and cascade runs against the
 * roofline of the highest rates seen over all turns. */
static kva_status paired(const cas_opts *o, kva_context *ctx, kva_plan_desc *d, const void *q,
                         const kva_cache *cache, void *out, float *lse, const cas_roof *f)
{
    const int nt = kva_context_num_threads(ctx);
    kva_plan *plan[2] = {NULL, NULL};
    kva_cli_reader rd = {0}, rr = {0};
    double *v = malloc(sizeof(double) * (size_t)o->iters * 7);
    kva_status st = v ? KVA_STATUS_OK : KVA_STATUS_OUT_OF_MEMORY;
    for (int m = 0; m < 2 && st == KVA_STATUS_OK; m++) {
        d->cascade = m ? KVA_CASCADE_ON : KVA_CASCADE_OFF;
        st = kva_plan_create(ctx, d, &plan[m]);
    }
    if (st == KVA_STATUS_OK && open_readers(&rd, &rr, nt, f->reuse) != 0)
        st = KVA_STATUS_OUT_OF_MEMORY;
    const int n = o->iters;
    double *sp = v, *roof = v + n, *share = v + 2 * n, *bw = v + 3 * n, *bd = v + 4 * n;
    double *ep = v + 5 * n, *ec = v + 6 * n; /* each step's bound over its time */
    double tmin[2] = {INFINITY, INFINITY};
    cas_rates best = {0.0, 0.0, 0.0};
    for (int i = 0; i < n && st == KVA_STATUS_OK; i++) {
        double t[2], tp, tc;
        for (int m = 0; m < 2 && st == KVA_STATUS_OK; m++) {
            const double t0 = kva_cli_now();
            st = kva_attention_run(ctx, plan[m], q, cache, NULL, out, lse);
            t[m] = kva_cli_now() - t0;
        }
        const cas_rates r = measure_rates(&rd, &rr, nt, 512e6);
        tmin[0] = fmin(tmin[0], t[0]);
        tmin[1] = fmin(tmin[1], t[1]);
        best.dram = fmax(best.dram, r.dram);
        best.reread = fmax(best.reread, r.reread);
        best.peak = fmax(best.peak, r.peak);
        roof_bounds(f, &r, &tp, &tc);
        bw[i] = r.reread;
        bd[i] = r.dram;
        sp[i] = t[0] / t[1];
        ep[i] = tp / t[0];
        ec[i] = tc / t[1];
        roof[i] = tp / tc;
        share[i] = sp[i] / roof[i];
    }
    if (st == KVA_STATUS_OK) {
        qsort(sp, (size_t)n, sizeof(double), by_value);
        qsort(roof, (size_t)n, sizeof(double), by_value);
        qsort(share, (size_t)n, sizeof(double), by_value);
        qsort(bw, (size_t)n, sizeof(double), by_value);
        qsort(bd, (size_t)n, sizeof(double), by_value);
        qsort(ep, (size_t)n, sizeof(double), by_value);
        qsort(ec, (size_t)n, sizeof(double), by_value);
        printf("  paired (%d turns of plain, cascade, DRAM and re-read passes, FMA peak; medians): "
               "speedup %.2fx, roofline ratio %.2fx (DRAM %.1f GB/s, re-read %.1f GB/s), speedup / "
               "roofline ratio %.0f%% (quartiles %.0f%% .. %.0f%%); plain at %.0f%% of its bound, "
               "cascade at %.0f%%\n",
               n, bench_median(sp, n), bench_median(roof, n), bench_median(bd, n) * 1e-9,
               bench_median(bw, n) * 1e-9, 100.0 * bench_median(share, n), 100.0 * share[n / 4],
               100.0 * share[(3 * n) / 4], 100.0 * bench_median(ep, n),
               100.0 * bench_median(ec, n));
        double tp, tc;
        roof_bounds(f, &best, &tp, &tc);
        printf("  paired, least disturbed (fastest runs, highest rates of the turns: DRAM %.1f "
               "GB/s, re-read %.1f GB/s, FMA peak %.1f GFLOP/s): plain %.1f us, cascade %.1f us, "
               "speedup %.2fx, roofline ratio %.2fx, speedup / roofline ratio %.0f%% (plain at "
               "%.0f%% of its bound, cascade at %.0f%%)\n",
               best.dram * 1e-9, best.reread * 1e-9, best.peak * 1e-9, tmin[0] * 1e6, tmin[1] * 1e6,
               tmin[0] / tmin[1], tp / tc, 100.0 * (tmin[0] / tmin[1]) / (tp / tc),
               100.0 * tp / tmin[0], 100.0 * tc / tmin[1]);
    }
    if (rd.buf)
        kva_cli_reader_close(&rd);
    if (rr.buf)
        kva_cli_reader_close(&rr);
    kva_plan_destroy(plan[0]);
    kva_plan_destroy(plan[1]);
    free(v);
    return st;
}

int kva_cli_bench_cascade(int argc, char **argv)
{
    cas_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const int dev = o.backend == KVA_BACKEND_CUDA;
    const int32_t R = o.batch, H = o.heads, D = o.head_dim;
    int32_t stride = 0, nb = 0;
    int32_t *bt = build_table(&o, &stride, &nb);
    int32_t *qsl = malloc(sizeof(int32_t) * ((size_t)R + 1));
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)R);
    const size_t es = kva_dtype_size(o.dt), nq = (size_t)R * H * D;
    void *hq = malloc(nq * es), *h_plain = malloc(nq * es), *h_casc = malloc(nq * es);
    if (!bt || !qsl || !seq || !hq || !h_plain || !h_casc) {
        fprintf(stderr, "kvattn: bench --cascade: out of memory\n");
        return KVA_EXIT_LIBRARY;
    }
    for (int32_t r = 0; r <= R; r++)
        qsl[r] = r;
    for (int32_t r = 0; r < R; r++)
        seq[r] = o.prefix + o.suffix;
    uint64_t seed = 11;
    bench_fill(hq, o.dt, nq, &seed);

    kva_context *ctx = NULL;
    kva_cache *cache = NULL;
    const kva_context_desc cd = {o.backend, o.threads, 0};
    kva_status st = kva_context_create(&cd, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    const kva_cache_desc cdesc = {
        nb, o.B, o.kv_heads, D, D, o.dt, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    if ((st = kva_cache_create(ctx, &cdesc, &cache)) != KVA_STATUS_OK ||
        (st = fill(&o, ctx, cache, nb)) != KVA_STATUS_OK)
        return kva_cli_lib_error("cache create / write", st);
    void *q = kva_cli_buf_new(dev, nq * es), *out = kva_cli_buf_new(dev, nq * es);
    float *lse = kva_cli_buf_new(dev, sizeof(float) * (size_t)R * H);
    (void)kva_cli_buf_copy(dev, q, hq, nq * es);

    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = R;
    d.query_start_loc = qsl;
    d.seq_lens = seq;
    d.block_table = bt;
    d.block_table_stride = stride;
    d.block_size = o.B;
    d.num_heads = H;
    d.num_kv_heads = o.kv_heads;
    d.head_dim = D;
    d.q_dtype = o.dt;
    d.causal = 1;
    d.window_left = -1;
    /* One plan at a time: a CUDA context keeps only its latest plan uploaded. */
    static const int32_t modes[3] = {KVA_CASCADE_OFF, KVA_CASCADE_ON, KVA_CASCADE_AUTO};
    double med[3] = {0, 0, 0};
    kva_plan_info info[3];
    for (int m = 0; m < 3 && st == KVA_STATUS_OK; m++) {
        kva_plan *plan = NULL;
        d.cascade = modes[m];
        if ((st = kva_plan_create(ctx, &d, &plan)) != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_plan_create", st);
        kva_plan_get_info(plan, &info[m]);
        void *h = m == 0 ? h_plain : h_casc;
        if (m < 2) { /* the auto plan is one of the two: its choice is reported */
            bench_poison(h, o.dt, nq);
            (void)kva_cli_buf_copy(dev, out, h, nq * es);
            st = kva_attention_run(ctx, plan, q, cache, NULL, out, lse);
            if (st == KVA_STATUS_OK)
                (void)kva_cli_buf_copy(dev, h, out, nq * es);
            if (st == KVA_STATUS_OK)
                st = time_plan(&o, ctx, plan, q, cache, out, lse, &med[m]);
        }
        kva_plan_destroy(plan);
    }
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_attention_run", st);
    /* The auto plan's time is the time of what it chose. */
    med[2] = info[2].num_cascade_groups > 0 ? med[1] : med[0];
    /* The check: the cascade's first output against the plain plan's. */
    double max_err = 0.0, max_ref = 0.0;
    size_t nan = 0;
    for (size_t i = 0; i < nq; i++) {
        double a, b;
        if (o.dt == KVA_DTYPE_F32)
            a = ((float *)h_casc)[i], b = ((float *)h_plain)[i];
        else if (o.dt == KVA_DTYPE_F16)
            a = kva_f16_to_f32(((uint16_t *)h_casc)[i]),
            b = kva_f16_to_f32(((uint16_t *)h_plain)[i]);
        else
            a = kva_bf16_to_f32(((uint16_t *)h_casc)[i]),
            b = kva_bf16_to_f32(((uint16_t *)h_plain)[i]);
        nan += !isfinite(a) || !isfinite(b);
        max_err = fabs(a - b) > max_err ? fabs(a - b) : max_err;
        max_ref = fabs(b) > max_ref ? fabs(b) : max_ref;
    }
    const double tol = o.dt == KVA_DTYPE_F32 ? 1e-4 : o.dt == KVA_DTYPE_F16 ? 4e-3 : 3e-2;
    const int ok = nan == 0 && max_err <= tol * (max_ref > 1.0 ? max_ref : 1.0);

    const double kvb = (double)o.kv_heads * 2.0 * D * es;
    const double plain_bytes = (double)R * (o.prefix + o.suffix) * kvb;
    const double casc_bytes = ((double)o.groups * o.prefix + (double)R * o.suffix) * kvb;
    const double flops = (double)R * H * (o.prefix + o.suffix) * 4.0 * D;
    printf("cascade bench: %s, R %d, shared prefix %d in %d group(s), suffix %d, H/Hkv %d/%d, "
           "D %d, B %d, %s\n",
           kva_backend_name(o.backend), R, o.prefix, o.groups, o.suffix, H, o.kv_heads, D, o.B,
           kva_dtype_name(o.dt));
    printf("  check (cascade vs plain): max |err| %.3g (max |out| %.3g), %zu non-finite: %s\n",
           max_err, max_ref, nan, ok ? "ok" : "MISMATCH");
    printf("  plain    %10.1f us  %8.1f GB/s of plain K/V bytes  %7.2f TFLOP/s\n", med[0] * 1e6,
           plain_bytes / med[0] * 1e-9, flops / med[0] * 1e-12);
    printf("  cascade  %10.1f us  %8.1f GB/s of its K/V bytes    %7.2f TFLOP/s  (%d chunk(s))\n",
           med[1] * 1e6, casc_bytes / med[1] * 1e-9, flops / med[1] * 1e-12,
           (int)info[1].cascade_chunks);
    printf("  speedup  %10.2fx   auto plan: %s (%.2fx of the plain time)\n", med[0] / med[1],
           info[2].num_cascade_groups > 0 ? "cascade" : "plain", med[0] / med[2]);
    const cas_roof roof = {casc_bytes, plain_bytes - casc_bytes,
                           ((double)o.groups * o.prefix + o.suffix) * kvb, flops};
    if (!dev && !o.no_ceiling) {
        const int nt = kva_context_num_threads(ctx);
        kva_cli_reader rd = {0}, rr = {0};
        if (open_readers(&rd, &rr, nt, roof.reuse) == 0) {
            const cas_rates r = measure_rates(&rd, &rr, nt, 1024e6);
            kva_cli_reader_close(&rd);
            kva_cli_reader_close(&rr);
            double tp, tc;
            roof_bounds(&roof, &r, &tp, &tc);
            printf("  roofline (%d threads; DRAM read %.1f GB/s for the %.1f MB of distinct K/V, "
                   "re-read of a %.1f MB buffer %.1f GB/s for the plain step's %.1f MB of prefix "
                   "re-reads; FMA peak %.1f GFLOP/s): plain >= %.1f us, cascade >= %.1f us, ratio "
                   "%.2fx; measured %.2fx = %.0f%% of it (plain at %.0f%% of its bound, cascade "
                   "at %.0f%%)\n",
                   nt, r.dram * 1e-9, roof.distinct * 1e-6, roof.reuse * 1e-6, r.reread * 1e-9,
                   roof.rereads * 1e-6, r.peak * 1e-9, tp * 1e6, tc * 1e6, tp / tc, med[0] / med[1],
                   100.0 * (med[0] / med[1]) / (tp / tc), 100.0 * tp / med[0], 100.0 * tc / med[1]);
        }
    }
    if (!dev && o.paired) {
        st = paired(&o, ctx, &d, q, cache, out, lse, &roof);
        if (st != KVA_STATUS_OK)
            return kva_cli_lib_error("--paired", st);
    }
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    kva_cli_buf_free(dev, q);
    kva_cli_buf_free(dev, out);
    kva_cli_buf_free(dev, lse);
    free(bt), free(qsl), free(seq), free(hq), free(h_plain), free(h_casc);
    return ok ? KVA_EXIT_OK : KVA_EXIT_LIBRARY;
}
