/*
 * bench_dcp.c - `kvattn bench --dcp N`: decode context parallelism with N
 * ranks emulated in one process (docs/dcp.md).
 *
 * One decode step of R requests of seq_len L: the unsharded run (one cache
 * of all L tokens), then each rank's sharded run over its own cache of its
 * L / N tokens, timed separately (each rank uses all the context's threads,
 * or the whole GPU, as it would on its own machine), then the local combine
 * (kva_merge_states_n) of the N partials. The combined output is checked
 * against the unsharded one first. Prints medians: the unsharded time, every
 * rank's, the slowest rank's over the unsharded (the speed-up that DCP's 1/N
 * of the KV per rank buys), the combine, and the KV bytes per rank.
 *
 * --backend cuda runs the same on GPU 0: q, the caches, the outputs and the
 * combine's parts live on the device (the K/V are made on the host and
 * uploaded), and every run is timed between its own pair of CUDA events on
 * the context's stream (per call, as bench_cuda); the outputs come back to
 * the host for the check.
 */
#include "../bench/data.h"
#include "bench.h"
#include "cli.h"

#ifdef KVA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dcp_opts {
    int32_t ranks, interleave, seq_len, batch, heads, kv_heads, head_dim, block, threads, iters;
    kva_dtype dtype;
    int cuda; /* --backend cuda */
} dcp_opts;

static void usage(void)
{
    fprintf(stderr,
            "usage: kvattn bench --dcp N [--interleave I] [--seq-len L] [--batch R] [--heads H]\n"
            "                    [--kv-heads Hkv] [--head-dim D] [--block-size B] [--dtype "
            "f16|bf16|f32]\n"
            "                    [--threads T] [--iters K] [--backend cpu|cuda]\n"
            "  N emulated DCP ranks in one process: the unsharded decode, each rank's\n"
            "  sharded decode and the local combine, timed separately (medians). cuda: on\n"
            "  GPU 0, each run between its own pair of CUDA events (per call).\n"
            "  Defaults: I 1, L 131072, R 1, H 32, Hkv 8, D 128, B 16, bf16, all cores, K 7,\n"
            "  cpu.\n");
}

static int parse(int argc, char **argv, dcp_opts *o)
{
    *o = (dcp_opts){1, 1, 131072, 1, 32, 8, 128, 16, 0, 7, KVA_DTYPE_BF16, 0};
    static const char *const dts[] = {"f32", "f16", "bf16"};
    static const char *const backends[] = {"cpu", "cuda"};
    static const char *const value_flags[] = {
        "--dcp",      "--interleave", "--seq-len", "--batch", "--heads", "--kv-heads",
        "--head-dim", "--block-size", "--threads", "--iters", "--dtype", "--backend"};
    for (int i = 1; i < argc; i++) { /* argv[0] is "bench" */
        int ok = 1, dt = 0;
        if (kva_cli_flag_is(argv[i], "--help") || kva_cli_flag_is(argv[i], "-h")) {
            usage();
            return 0;
        }
        char a[40]; /* the flag; v: its value, "--flag v" or "--flag=v" */
        const char *v = kva_cli_flag_split(argc, argv, &i, a, sizeof a, "bench --dcp", value_flags,
                                           sizeof value_flags / sizeof value_flags[0]);
        if (!v)
            return 2;
        if (kva_cli_flag_is(a, "--dcp"))
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_DCP, &o->ranks);
        else if (kva_cli_flag_is(a, "--interleave"))
            ok = kva_cli_parse_i32(a, v, 1, 1 << 20, &o->interleave);
        else if (kva_cli_flag_is(a, "--seq-len"))
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_SEQ_LEN, &o->seq_len);
        else if (kva_cli_flag_is(a, "--batch"))
            ok = kva_cli_parse_i32(a, v, 1, 4096, &o->batch);
        else if (kva_cli_flag_is(a, "--heads"))
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_HEADS, &o->heads);
        else if (kva_cli_flag_is(a, "--kv-heads"))
            ok = kva_cli_parse_i32(a, v, 1, KVA_MAX_HEADS, &o->kv_heads);
        else if (kva_cli_flag_is(a, "--head-dim"))
            ok = kva_cli_parse_i32(a, v, 8, KVA_MAX_HEAD_DIM, &o->head_dim);
        else if (kva_cli_flag_is(a, "--block-size"))
            ok = kva_cli_parse_i32(a, v, 1, 1024, &o->block);
        else if (kva_cli_flag_is(a, "--threads"))
            ok = kva_cli_parse_i32(a, v, 0, KVA_MAX_THREADS, &o->threads);
        else if (kva_cli_flag_is(a, "--iters"))
            ok = kva_cli_parse_i32(a, v, 1, 1000, &o->iters);
        else if (kva_cli_flag_is(a, "--dtype"))
            ok = kva_cli_parse_choice(a, v, dts, 3, &dt), o->dtype = (kva_dtype)dt;
        else if (kva_cli_flag_is(a, "--backend"))
            ok = kva_cli_parse_choice(a, v, backends, 2, &o->cuda);
        else {
            fprintf(stderr, "kvattn bench --dcp: unknown option '%s'\n", a);
            usage();
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (o->heads % o->kv_heads != 0) {
        fprintf(stderr, "kvattn bench --dcp: --heads %d is not a multiple of --kv-heads %d\n",
                (int)o->heads, (int)o->kv_heads);
        return 2;
    }
    if (o->head_dim % 8 != 0) {
        fprintf(stderr, "kvattn bench --dcp: --head-dim %d is not a multiple of 8\n",
                (int)o->head_dim);
        return 2;
    }
    return -1;
}

/* Times one call of fn(arg) in milliseconds: the host wall clock, or (dev)
 * a pair of CUDA events on the legacy default stream (the context's) around
 * it. Returns 0, a library error of fn, or KVA_EXIT_LIBRARY for the events. */
static int timed_ms(int dev, kva_status (*fn)(void *), void *arg, const char *what, double *ms)
{
#ifdef KVA_HAVE_CUDA
    if (dev) {
        cudaEvent_t ev[2] = {NULL, NULL};
        float f = 0.f;
        cudaError_t e = cudaEventCreate(&ev[0]);
        if (e == cudaSuccess)
            e = cudaEventCreate(&ev[1]);
        if (e == cudaSuccess)
            e = cudaEventRecord(ev[0], 0);
        kva_status st = KVA_STATUS_OK;
        if (e == cudaSuccess)
            st = fn(arg);
        if (e == cudaSuccess && st == KVA_STATUS_OK &&
            (e = cudaEventRecord(ev[1], 0)) == cudaSuccess &&
            (e = cudaEventSynchronize(ev[1])) == cudaSuccess)
            e = cudaEventElapsedTime(&f, ev[0], ev[1]);
        cudaEventDestroy(ev[0]);
        cudaEventDestroy(ev[1]);
        if (st != KVA_STATUS_OK)
            return kva_cli_lib_error(what, st);
        if (e != cudaSuccess) {
            fprintf(stderr, "kvattn bench --dcp: timing with CUDA events failed: %s\n",
                    cudaGetErrorString(e));
            (void)cudaGetLastError();
            return KVA_EXIT_LIBRARY;
        }
        *ms = f;
        return KVA_EXIT_OK;
    }
#endif
    (void)dev;
    const double t0 = kva_cli_now();
    const kva_status st = fn(arg);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error(what, st);
    *ms = (kva_cli_now() - t0) * 1e3;
    return KVA_EXIT_OK;
}

/* One rank's (or the unsharded) cache, plan and partial output: out and lse
 * in the backend's memory, out_h and lse_h their host copies after the runs. */
typedef struct shard {
    kva_cache *cache;
    kva_plan *plan;
    int32_t *bt;
    void *out, *out_h;
    float *lse, *lse_h;
    double ms; /* median run time */
} shard;

/* What one timed attention run needs. */
typedef struct run_args {
    kva_context *ctx;
    shard *s;
    const void *q;
} run_args;

static kva_status run_shard(void *p)
{
    const run_args *r = (const run_args *)p;
    return kva_attention_run(r->ctx, r->s->plan, r->q, r->s->cache, NULL, r->s->out, r->s->lse);
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A value in [-1, 1) for element e of the K (w = 0) or V row of request r
 * at global position g (a 64-bit mix of the four). */
static float kv_val(int32_t r, int64_t g, size_t e, int w)
{
    uint64_t x = ((uint64_t)g * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)e << 20) ^ ((uint64_t)r << 50) ^
                 ((uint64_t)w << 63);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1ull << 23) - 1.0);
}

static void store_val(void *p, kva_dtype dt, size_t i, float x)
{
    if (dt == KVA_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == KVA_DTYPE_F16)
        ((uint16_t *)p)[i] = kva_f32_to_f16(x);
    else
        ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
}

/* Creates rank `rank` of N (N = 0: unsharded): a cache of exactly its local
 * blocks with random K/V (made on the host, uploaded with cuda), its plan,
 * and times its run (q in the backend's memory). */
static int make_shard(kva_context *ctx, const dcp_opts *o, int32_t N, int32_t rank, const void *q,
                      const int32_t *qsl, const int32_t *lens, shard *s)
{
    const int32_t R = o->batch, Bs = o->block;
    const int dev = o->cuda;
    int32_t local[4096];
    kva_status st = kva_dcp_local_lens(R, lens, N, rank, o->interleave, local);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_dcp_local_lens", st);
    const int32_t stride = (local[0] + Bs - 1) / Bs + 1;
    s->bt = malloc(sizeof(int32_t) * (size_t)R * stride);
    int32_t nb = 0;
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < stride; j++)
            s->bt[r * stride + j] = j < (local[r] + Bs - 1) / Bs ? nb++ : -1;
    kva_cache_desc cd = {nb > 0 ? nb : 1, Bs,       o->kv_heads,    o->head_dim,
                         o->head_dim,     o->dtype, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MHA};
    if ((st = kva_cache_create(ctx, &cd, &s->cache)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_create", st);
    /* K/V of global position g are a function of (g, head, channel), so the
     * shards hold exactly the unsharded cache's rows and the combine can be
     * checked against the unsharded run. */
    const size_t es = kva_dtype_size(o->dtype);
    const size_t hd = (size_t)o->kv_heads * o->head_dim;
    const size_t cache_bytes = (size_t)cd.num_blocks * Bs * hd * es;
    void *k, *v, *kh, *vh;
    kva_cache_data(s->cache, &k, &v);
    kh = dev ? malloc(cache_bytes) : k;
    vh = dev ? malloc(cache_bytes) : v;
    if (!kh || !vh) {
        if (dev)
            free(kh), free(vh);
        fprintf(stderr, "kvattn bench --dcp: out of host memory\n");
        return KVA_EXIT_LIBRARY;
    }
    const int32_t I = N > 1 ? o->interleave : 1, n1 = N > 1 ? N : 1;
    for (int32_t r = 0; r < R; r++)
        for (int64_t j = 0; j < local[r]; j++) {
            const int64_t g = ((j / I) * n1 + (N > 1 ? rank : 0)) * I + j % I;
            const int64_t slot = (int64_t)s->bt[r * stride + j / Bs] * Bs + j % Bs;
            for (size_t e = 0; e < hd; e++) {
                store_val(kh, o->dtype, (size_t)slot * hd + e, kv_val(r, g, e, 0));
                store_val(vh, o->dtype, (size_t)slot * hd + e, kv_val(r, g, e, 1));
            }
        }
    int rc = KVA_EXIT_OK;
    if (dev) {
        rc = kva_cli_buf_copy(dev, k, kh, cache_bytes);
        if (!rc)
            rc = kva_cli_buf_copy(dev, v, vh, cache_bytes);
        free(kh), free(vh);
        if (rc)
            return rc;
    }
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = lens;
    pd.block_table = s->bt;
    pd.block_table_stride = stride;
    pd.block_size = Bs;
    pd.num_heads = o->heads;
    pd.num_kv_heads = o->kv_heads;
    pd.head_dim = o->head_dim;
    pd.q_dtype = o->dtype;
    pd.causal = 1;
    pd.window_left = -1;
    pd.dcp_size = N;
    pd.dcp_rank = rank;
    pd.dcp_interleave = o->interleave;
    if ((st = kva_plan_create(ctx, &pd, &s->plan)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_plan_create", st);
    const size_t rows = (size_t)R * o->heads, ob = rows * o->head_dim * es;
    s->out = kva_cli_buf_new(dev, ob);
    s->lse = kva_cli_buf_new(dev, rows * sizeof(float));
    s->out_h = malloc(ob);
    s->lse_h = malloc(rows * sizeof(float));
    if (!s->out || !s->lse || !s->out_h || !s->lse_h) {
        fprintf(stderr, "kvattn bench --dcp: out of memory for the outputs\n");
        return KVA_EXIT_LIBRARY;
    }
    double t[1000];
    run_args ra = {ctx, s, q};
    for (int32_t i = -1; i < o->iters && !rc; i++) { /* one warm-up run */
        double ms = 0.0;
        rc = timed_ms(dev, run_shard, &ra, "kva_attention_run", &ms);
        if (i >= 0)
            t[i] = ms;
    }
    if (!rc)
        rc = kva_cli_buf_copy(dev, s->out_h, s->out, ob);
    if (!rc)
        rc = kva_cli_buf_copy(dev, s->lse_h, s->lse, rows * sizeof(float));
    if (rc)
        return rc;
    qsort(t, (size_t)o->iters, sizeof t[0], cmp_d);
    s->ms = t[o->iters / 2];
    /* The KV of this shard is not needed past its run: free it now so that
     * only one rank's cache is resident at a time. */
    kva_cache_destroy(s->cache);
    s->cache = NULL;
    return 0;
}

static void free_shard(int dev, shard *s)
{
    kva_plan_destroy(s->plan);
    kva_cache_destroy(s->cache);
    free(s->bt);
    kva_cli_buf_free(dev, s->out);
    kva_cli_buf_free(dev, s->lse);
    free(s->out_h);
    free(s->lse_h);
}

/* The local combine's arguments (kva_merge_states_n over parts in the
 * backend's memory). */
typedef struct combine_args {
    kva_context *ctx;
    int32_t N, R, H, Dv;
    kva_dtype dt;
    const void *parts;
    const float *lses;
    void *got;
} combine_args;

static kva_status run_combine(void *p)
{
    const combine_args *c = (const combine_args *)p;
    return kva_merge_states_n(c->ctx, c->N, c->R, c->H, c->Dv, c->dt, c->parts, 0, c->lses, 0,
                              c->got, NULL);
}

int kva_cli_bench_dcp(int argc, char **argv)
{
    dcp_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const int dev = o.cuda;
    if (dev) {
        char why[160];
        if (!bench_cuda_available(why, sizeof why)) {
            fprintf(stderr, "kvattn bench --dcp: --backend cuda: %s\n", why);
            return KVA_EXIT_LIBRARY;
        }
    }
    kva_context_desc cdsc = {dev ? KVA_BACKEND_CUDA : KVA_BACKEND_CPU, dev ? 0 : o.threads, 0};
    kva_context *ctx = NULL;
    kva_status st = kva_context_create(&cdsc, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    const int32_t R = o.batch, N = o.ranks, H = o.heads, Dv = o.head_dim;
    const size_t es = kva_dtype_size(o.dtype), rows = (size_t)R * H, on = rows * Dv;
    int32_t *qsl = malloc(sizeof(int32_t) * (R + 1)), *lens = malloc(sizeof(int32_t) * R);
    for (int32_t r = 0; r <= R; r++)
        qsl[r] = r;
    for (int32_t r = 0; r < R; r++)
        lens[r] = o.seq_len;
    kva_rng rng = {2026};
    void *q_h = malloc(rows * o.head_dim * es);
    kva_test_fill(q_h, o.dtype, rows * o.head_dim, &rng, 1.0);

    shard full = {0}, *sh = calloc((size_t)N, sizeof *sh);
    void *parts_h = malloc(on * es * N), *got_h = malloc(on * es);
    float *lses_h = malloc(rows * sizeof(float) * N);
    void *q = kva_cli_buf_new(dev, rows * o.head_dim * es),
         *parts = kva_cli_buf_new(dev, on * es * N);
    void *got = kva_cli_buf_new(dev, on * es);
    float *lses = (float *)kva_cli_buf_new(dev, rows * sizeof(float) * N);
    if (!q || !parts || !got || !lses) {
        fprintf(stderr, "kvattn bench --dcp: out of memory\n");
        rc = KVA_EXIT_LIBRARY;
    } else {
        rc = kva_cli_buf_copy(dev, q, q_h, rows * o.head_dim * es);
    }
    if (!rc)
        rc = make_shard(ctx, &o, 0, 0, q, qsl, lens, &full);
    for (int32_t k = 0; k < N && !rc; k++) {
        rc = make_shard(ctx, &o, N, k, q, qsl, lens, &sh[k]);
        if (!rc) {
            memcpy((char *)parts_h + on * es * k, sh[k].out_h, on * es);
            memcpy(lses_h + rows * k, sh[k].lse_h, rows * sizeof(float));
        }
    }
    if (!rc)
        rc = kva_cli_buf_copy(dev, parts, parts_h, on * es * N);
    if (!rc)
        rc = kva_cli_buf_copy(dev, lses, lses_h, rows * sizeof(float) * N);
    double comb[1000];
    combine_args ca = {ctx, N, R, H, Dv, o.dtype, parts, lses, got};
    for (int32_t i = -1; i < o.iters && !rc; i++) {
        double ms = 0.0;
        rc = timed_ms(dev, run_combine, &ca, "kva_merge_states_n", &ms);
        if (i >= 0)
            comb[i] = ms;
    }
    if (!rc)
        rc = kva_cli_buf_copy(dev, got_h, got, on * es);
    if (!rc) { /* correctness first: the combine against the unsharded run */
        const double rtol = kva_test_rtol(o.dtype) * 2.0, atol = kva_test_atol(o.dtype) + rtol;
        const size_t bad =
            kva_test_compare("dcp combine", got_h, full.out_h, o.dtype, on, atol, rtol);
        if (bad) {
            fprintf(stderr,
                    "kvattn bench --dcp: the combined output differs from the unsharded "
                    "run in %zu of %zu elements\n",
                    bad, on);
            rc = 1;
        }
    }
    if (!rc) {
        qsort(comb, (size_t)o.iters, sizeof comb[0], cmp_d);
        double worst = 0.0;
        char where[64];
        if (dev)
            snprintf(where, sizeof where, "cuda (GPU 0, per call)");
        else
            snprintf(where, sizeof where, "cpu, %d threads", (int)kva_context_num_threads(ctx));
        printf("dcp: N %d, I %d, R %d x L %d, H %d, Hkv %d, D %d, B %d, %s, %s, %d "
               "iters (medians)\n",
               (int)N, (int)o.interleave, (int)R, (int)o.seq_len, (int)H, (int)o.kv_heads,
               (int)o.head_dim, (int)o.block, kva_dtype_name(o.dtype), where, (int)o.iters);
        printf("  unsharded           %9.3f ms  KV %.1f MiB\n", full.ms,
               2.0 * o.seq_len * R * o.kv_heads * o.head_dim * es / 1048576.0);
        for (int32_t k = 0; k < N; k++) {
            int32_t lk = 0;
            kva_dcp_local_lens(1, lens, N, k, o.interleave, &lk);
            printf("  rank %-3d            %9.3f ms  KV %.1f MiB (%d tokens per request)\n", (int)k,
                   sh[k].ms, 2.0 * lk * R * o.kv_heads * o.head_dim * es / 1048576.0, (int)lk);
            worst = sh[k].ms > worst ? sh[k].ms : worst;
        }
        printf("  slowest rank / unsharded  %.3f\n", worst / full.ms);
        printf("  local combine       %9.3f ms  (%d parts of [%d, %d, %d])\n", comb[o.iters / 2],
               (int)N, (int)R, (int)H, (int)Dv);
    }
    for (int32_t k = 0; k < N; k++)
        free_shard(dev, &sh[k]);
    free_shard(dev, &full);
    kva_cli_buf_free(dev, q), kva_cli_buf_free(dev, parts), kva_cli_buf_free(dev, got),
        kva_cli_buf_free(dev, lses);
    free(sh), free(parts_h), free(got_h), free(lses_h), free(q_h), free(qsl), free(lens);
    kva_context_destroy(ctx);
    return rc;
}
