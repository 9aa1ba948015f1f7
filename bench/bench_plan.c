/*
 * bench_plan.c - host cost of the CUDA backend's plan partition, on any
 * machine (no GPU needed: the partition is host code).
 *
 *   bench_plan [--iters N] [--sms S] [--per-sm C] [--serve P] [--upload-min BYTES]
 *              [--between L] [--staging-hot BYTES]
 *
 * For each batch (64 decodes x 4k, 32 decodes x 600, 16 decodes x 4k, a mixed
 * 32-request batch of 28 ragged decodes and 4 chunked prefills of 256, 64
 * ragged decodes of 100-4100 keys; H/Hkv 32/8, D 128, B 16, bf16) it times,
 * median of N runs (microseconds):
 *   - create: kva_plan_create + destroy on the ref backend (metadata checks
 *     and host copies, what every backend pays before partitioning);
 *   - four:   the former GPU choice, four candidate partitions built
 *     (kva__partition_build_subset, 1..4 items per CTA) and the one with the
 *     shortest makespan kept;
 *   - grid:   kva__partition_build_grid (closed-form candidates, the winner
 *     built), what cuda_plan_build calls now (not in a -DBENCH_PLAN_FOUR_ONLY
 *     build, which links against an older tree's library).
 * --serve P runs only the serve-sim sequence below, P passes (for a profiler:
 * valgrind --tool=callgrind counts its instructions per plan).
 * The grid is S SMs x C CTAs (default 132 x 2: variant 4 at D 128 on an
 * H100). Requests the CUDA plan sends to the tensor-core prefill kernel (q_len
 * above the decode threshold and q_len x G >= 64) are left out of the
 * partition, as there. Prints the chosen partitions' items, tasks and
 * estimated makespan. --upload-min (CUDA builds) makes the CUDA plan's one
 * metadata copy at least BYTES long (kva__cuda_context_upload_min; 0: the
 * used bytes only; the default is KVA__CUDA_UPLOAD_MIN), to time the copy's
 * host cost by size. --between L (CUDA builds) puts a serving step's device
 * work before each CUDA update (L small kernels on the stream, then a
 * synchronize) and times the updates after it alone and, every second step,
 * after a cudaStreamQuery (timed too): whether the first runtime call after
 * a step pays for the driver's handling of that step's work, which a plan
 * timed back to back does not see. --staging-hot (CUDA builds) sets the
 * half of the context's hot staging ring (kva__cuda_context_staging_hot; 0:
 * none).
 */
#include "batches.h"
#include "internal.h"
#include "../src/plan/partition.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef KVA_HAVE_CUDA
#include "cuda_backend.h" /* kva__cuda_context_upload_min */
#include <cuda_runtime.h>
#endif

/* kva__partition_build_grid; an older tree's (-DBENCH_PLAN_NO_UPDATE) takes no reuse. */
#ifdef BENCH_PLAN_NO_UPDATE
#define GRID_BUILD(plan, pp, grid, skip, reuse, out)                                               \
    kva__partition_build_grid(plan, pp, grid, skip, out)
#else
#define GRID_BUILD(plan, pp, grid, skip, reuse, out)                                               \
    kva__partition_build_grid(plan, pp, grid, skip, reuse, out)
#endif

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The GPU's partition parameters (cuda_ctx.cu gpu_params) for variant 4. */
static kva__partition_params gpu_params(int64_t threads)
{
    kva__partition_params pp;
    memset(&pp, 0, sizeof pp);
    pp.num_threads = (int32_t)threads;
    pp.max_rows = 16;
    pp.prefill_rows = 16;
    pp.split_align = 64;
    pp.min_split_keys = 256;
    pp.max_splits = 32;
    pp.items_per_thread = 1;
    return pp;
}

/* The former choice: four candidates built, the shortest makespan kept. */
static kva__partition *four_builds(const kva_plan *plan, int64_t slots, const uint8_t *skip,
                                   int64_t *t_out)
{
    kva__partition *best = NULL;
    int64_t best_t = 0;
    for (int k = 1; k <= 4; k++) {
        kva__partition_params pp = gpu_params(slots * k);
        kva__partition *part = NULL;
        if (kva__partition_build_subset(plan, &pp, skip, &part) != KVA_STATUS_OK) {
            fprintf(stderr, "bench_plan: %s\n", kva_last_error());
            exit(1);
        }
        int64_t t = 0; /* worker 0's load: the largest (see partition.h) */
        for (int64_t i = 0; i < part->num_items; i += slots)
            t += part->items[i].cost;
        if (!best || t < best_t) {
            kva__partition_free(best);
            best = part;
            best_t = t;
        } else {
            kva__partition_free(part);
        }
    }
    *t_out = best_t;
    return best;
}

#ifdef KVA_HAVE_CUDA
/* --between N: a serving step's device work before the next plan, N small
 * memsets (each a kernel) on cu's stream and a synchronize, as serve-sim's
 * step ends; *stream gets the stream. */
static void step_work(kva_context *cu, void *buf, int n, cudaStream_t *stream)
{
    void *sp = NULL;
    (void)kva_cuda_context_get_stream(cu, &sp);
    *stream = (cudaStream_t)sp;
    for (int i = 0; i < n; i++)
        (void)cudaMemsetAsync(buf, i, 4096, *stream);
    (void)cudaStreamSynchronize(*stream);
}
#endif

/*
 * The decode phase of serve-sim's default workload, as a sequence of plans:
 * 32 requests sharing a 256-token prefix (16 blocks), 448..656 keys at the
 * first step, one more per step, each finishing after 48..80 steps (H/Hkv
 * 32/8, D 128, B 16, bf16). Per step it times (us; medians over every step
 * of `passes` passes): the generic plan on the ref backend created and
 * destroyed, or updated in place (kva_plan_update), and the grid partition
 * built fresh, or rebuilt in the previous step's (reuse), which is what the
 * CUDA plan's update does. A -DBENCH_PLAN_NO_UPDATE build (an older tree)
 * times only the first of each pair. With a CUDA context (cu, a CUDA build on
 * a machine with a GPU) it also times kva_plan_update there: the whole CUDA
 * plan, whose part beyond the ref update and the grid is the metadata upload.
 */
static void serve_sequence(kva_context *ctx, kva_context *cu, int64_t slots, int passes,
                           int between)
{
    enum { R0 = 32, STEPS = 80, STRIDE = 48 };
    int32_t base[R0], out[R0], qsl[R0 + 1], seq[R0], bt[R0 * STRIDE];
    kva_rng rng = {4242};
    for (int32_t r = 0; r < R0; r++) {
        base[r] = 256 + kva_rng_int(&rng, 192, 320) + 1;
        out[r] = kva_rng_int(&rng, 48, 80);
        for (int32_t j = 0; j < STRIDE; j++)
            bt[r * STRIDE + j] = j < 16 ? j : 16 + r * STRIDE + j;
    }
    const int n = STEPS * passes;
    double *t = malloc(sizeof(double) * (size_t)n * 8);
    int mp = 0, mq = 0; /* --between: plans timed without, with a stream query before them */
#ifdef KVA_HAVE_CUDA
    void *wbuf = NULL;
    if (cu && between > 0 && cudaMalloc(&wbuf, 4096) != cudaSuccess)
        between = 0;
#else
    (void)between;
#endif
    int m = 0;
    kva_plan *up = NULL, *cup = NULL;
    kva__partition *reuse = NULL;
    kva__partition_params pp = gpu_params(slots);
    kva__partition_grid grid = {slots, 0, 176, 600, 1100}; /* cuda_plan.cu best_partition */
    for (int pass = 0; pass < passes; pass++)
        for (int step = 0; step < STEPS; step++) {
            int32_t R = 0, rows[R0];
            qsl[0] = 0;
            for (int32_t r = 0; r < R0; r++)
                if (step < out[r]) {
                    rows[R] = r;
                    seq[R] = base[r] + step;
                    qsl[R + 1] = qsl[R] + 1;
                    R++;
                }
            if (R == 0)
                continue;
            int32_t btr[R0 * STRIDE];
            for (int32_t i = 0; i < R; i++)
                memcpy(btr + i * STRIDE, bt + rows[i] * STRIDE, sizeof(int32_t) * STRIDE);
            kva_plan_desc pd;
            memset(&pd, 0, sizeof pd);
            pd.num_requests = R, pd.query_start_loc = qsl, pd.seq_lens = seq;
            pd.block_table = btr, pd.block_table_stride = STRIDE, pd.block_size = 16;
            pd.num_heads = 32, pd.num_kv_heads = 8, pd.head_dim = 128;
            pd.q_dtype = KVA_DTYPE_BF16, pd.causal = 1, pd.window_left = -1;
            double t0 = now_us();
            kva_plan *p = NULL;
            if (kva_plan_create(ctx, &pd, &p) != KVA_STATUS_OK) {
                fprintf(stderr, "bench_plan: %s\n", kva_last_error());
                exit(1);
            }
            double t1 = now_us();
            kva__partition *x = NULL;
            (void)GRID_BUILD(p, &pp, &grid, NULL, NULL, &x);
            double t2 = now_us();
            kva__partition_free(x);
            double t3 = t2, t4 = t2;
#ifndef BENCH_PLAN_NO_UPDATE
            t3 = now_us();
            if (!up ? kva_plan_create(ctx, &pd, &up) : kva_plan_update(ctx, up, &pd)) {
                fprintf(stderr, "bench_plan: %s\n", kva_last_error());
                exit(1);
            }
            double t3b = now_us();
            (void)kva__partition_build_grid(p, &pp, &grid, NULL, reuse, &reuse);
            t4 = now_us();
            t[2 * n + m] = t3b - t3;
            t[3 * n + m] = t4 - t3b;
            t3 = t3b;
#endif
            double t5 = now_us();
            kva_plan_destroy(p);
            t[m] = (t1 - t0) + (now_us() - t5);
            t[n + m] = t2 - t1;
            if (cu) {
                int probe = -1; /* -1: back to back; 0: after step work; 1: after it and a query */
#ifdef KVA_HAVE_CUDA
                if (between > 0 && cup) {
                    cudaStream_t stream;
                    step_work(cu, wbuf, between, &stream);
                    probe = m & 1;
                    if (probe) { /* the first runtime call after the step's synchronize */
                        const double q0 = now_us();
                        (void)cudaStreamQuery(stream);
                        t[7 * n + mq] = now_us() - q0;
                    }
                }
#endif
                const double t6 = now_us();
                if (!cup ? kva_plan_create(cu, &pd, &cup) : kva_plan_update(cu, cup, &pd)) {
                    fprintf(stderr, "bench_plan: cuda: %s\n", kva_last_error());
                    exit(1);
                }
                t[4 * n + m] = now_us() - t6;
                if (probe == 0)
                    t[5 * n + mp++] = t[4 * n + m];
                else if (probe == 1)
                    t[6 * n + mq++] = t[4 * n + m];
            }
            m++;
        }
    printf(
        "  serve-sim default, decode phase (%d plans): create + destroy %6.2f us | grid %6.2f us",
        m, median(t, m), median(t + n, m));
#ifndef BENCH_PLAN_NO_UPDATE
    printf(" | update %6.2f us | grid rebuilt in place %6.2f us", median(t + 2 * n, m),
           median(t + 3 * n, m));
#endif
    if (cu && mp > 0 && mq > 0)
        printf(" | cuda update after %d launches + sync %6.2f us, after them and a stream query "
               "%6.2f us (the query %6.2f us)",
               between, median(t + 5 * n, mp), median(t + 6 * n, mq), median(t + 7 * n, mq));
    else if (cu)
        printf(" | cuda update %6.2f us", median(t + 4 * n, m));
    printf("\n");
#ifdef KVA_HAVE_CUDA
    if (wbuf)
        (void)cudaFree(wbuf);
#endif
    kva_plan_destroy(cup);
    kva_plan_destroy(up);
    kva__partition_free(reuse);
    free(t);
}

int main(int argc, char **argv)
{
    int iters = 201, sms = 132, per_sm = 2, serve = 0;
    long long upload_min = -1; /* -1: the context's default */
    int between = 0;
    long long staging_hot = -1; /* -1: the context's default */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sms"))
            sms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--per-sm"))
            per_sm = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--serve"))
            serve = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--upload-min"))
            upload_min = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--between"))
            between = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--staging-hot"))
            staging_hot = atoll(argv[i + 1]);
        else {
            fprintf(stderr, "bench_plan: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (iters < 1 || sms < 1 || per_sm < 1 || serve < 0) {
        fprintf(stderr, "bench_plan: --iters, --sms and --per-sm must be >= 1, --serve >= 0\n");
        return 2;
    }
    const int64_t slots = (int64_t)sms * per_sm;
    const char *names[5] = {"64 decodes x 4k", "32 decodes x 600", "16 decodes x 4k",
                            "mixed 28 decodes + 4 prefills x 256", "64 ragged decodes"};
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
    if (kva_context_create(&cd, &ctx) != KVA_STATUS_OK) {
        fprintf(stderr, "bench_plan: %s\n", kva_last_error());
        return 1;
    }
    if (serve > 0) {
        serve_sequence(ctx, NULL, slots, serve, 0);
        kva_context_destroy(ctx);
        return 0;
    }
    double *t = malloc(sizeof(double) * (size_t)iters * 3);
    printf("bench_plan: grid %d SMs x %d CTAs = %lld slots, medians of %d runs\n", sms, per_sm,
           (long long)slots, iters);
    for (int c = 0; c < 5; c++) {
        int32_t R = c == 0 || c == 4 ? 64 : c == 1 || c == 3 ? 32 : 16;
        int32_t q[64], s[64];
        kva_rng rng = {100 + (uint64_t)c};
        for (int32_t r = 0; r < R; r++) {
            q[r] = 1;
            s[r] = c == 1 ? 600 : 4096;
            if (c == 3)
                s[r] = kva_rng_int(&rng, 300, 4000);
            if (c == 3 && r >= 28)
                q[r] = 256, s[r] = 256 + kva_rng_int(&rng, 0, 1024);
            if (c == 4)
                s[r] = kva_rng_int(&rng, 100, 4100);
        }
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, R, q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_BF16);
        uint8_t skip[64];
        for (int32_t r = 0; r < R; r++)
            skip[r] = q[r] > pd.decode_threshold && q[r] * 4 >= 64;
        kva_plan *plan = NULL;
        if (kva_plan_create(ctx, &pd, &plan) != KVA_STATUS_OK) {
            fprintf(stderr, "bench_plan: %s\n", kva_last_error());
            return 1;
        }
        int64_t t_four = 0, t_grid = 0;
        kva__partition *p4 = four_builds(plan, slots, skip, &t_four);
        kva__partition *pg = NULL;
#ifndef BENCH_PLAN_FOUR_ONLY
        kva__partition_params pp = gpu_params(slots);
        kva__partition_grid grid = {slots, 0, 176, 600, 1100}; /* cuda_ctx.cu best_partition */
        if (GRID_BUILD(plan, &pp, &grid, skip, NULL, &pg) != KVA_STATUS_OK) {
            fprintf(stderr, "bench_plan: %s\n", kva_last_error());
            return 1;
        }
        t_grid = pg->makespan;
#endif
        for (int it = 0; it < iters; it++) {
            double t0 = now_us();
            kva_plan *p2 = NULL;
            (void)kva_plan_create(ctx, &pd, &p2);
            kva_plan_destroy(p2);
            double t1 = now_us();
            int64_t dummy = 0;
            kva__partition_free(four_builds(plan, slots, skip, &dummy));
            double t2 = now_us();
#ifndef BENCH_PLAN_FOUR_ONLY
            kva__partition *x = NULL;
            (void)GRID_BUILD(plan, &pp, &grid, skip, NULL, &x);
            kva__partition_free(x);
#endif
            double t3 = now_us();
            t[it] = t1 - t0;
            t[iters + it] = t2 - t1;
            t[2 * iters + it] = t3 - t2;
        }
        printf("  %-38s create %7.1f us | four %7.1f us: %5d items %4d tasks makespan %lld",
               names[c], median(t, iters), median(t + iters, iters), (int)p4->num_items,
               (int)p4->num_tasks, (long long)t_four);
        if (pg)
            printf(" | grid %6.1f us: %5d items %4d tasks makespan %lld (candidate %d)",
                   median(t + 2 * iters, iters), (int)pg->num_items, (int)pg->num_tasks,
                   (long long)t_grid, (int)pg->pick);
        printf("\n");
        kva__partition_free(p4);
        kva__partition_free(pg);
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    free(t);
    /* The CUDA plan where there is one (a CUDA build on a GPU machine). */
    kva_context *cu = NULL;
    kva_context_desc cud = {KVA_BACKEND_CUDA, 1, 0};
    if (kva_context_create(&cud, &cu) != KVA_STATUS_OK)
        cu = NULL;
#ifdef KVA_HAVE_CUDA
    if (cu && upload_min >= 0 && kva__cuda_context_upload_min(cu, upload_min) != KVA_STATUS_OK) {
        fprintf(stderr, "bench_plan: %s\n", kva_last_error());
        return 1;
    }
    if (cu && upload_min >= 0)
        printf("  (cuda: every plan's metadata copy at least %lld bytes)\n", upload_min);
    if (cu && staging_hot >= 0 && kva__cuda_context_staging_hot(cu, staging_hot) != KVA_STATUS_OK) {
        fprintf(stderr, "bench_plan: %s\n", kva_last_error());
        return 1;
    }
    if (cu && staging_hot >= 0)
        printf("  (cuda: hot staging ring half %lld bytes)\n", staging_hot);
#endif
#ifndef KVA_HAVE_CUDA
    (void)upload_min;
    (void)staging_hot;
#endif
    serve_sequence(ctx, cu, slots, iters / 20 + 1, between);
    kva_context_destroy(cu);
    kva_context_destroy(ctx);
    return 0;
}
