/*
 * bench_device.c - `kvattn bench --backend cuda`: one shape on GPU 0, the way
 * bench/bench_cuda.c times it.
 *
 *   1. The cache is created on the host (CPU backend) and on the device with
 *      the same descriptor and scales; the host one is written through
 *      kva_cache_write (bench_cache_fill) and its bytes (K, V and the
 *      per-token key scales) are copied to the device one (the paged path;
 *      --ragged is refused with cuda).
 *   2. q (and sinks) are uploaded; the plan is created on the CUDA context
 *      (host time, PLAN_REPEATS times).
 *   3. The first run writes into outputs poisoned with NaN; out and lse come
 *      back to the host and bench_check compares them with the reference
 *      backend over the host cache (the same bytes).
 *   4. Warm-up, then every timed run between its own pair of CUDA events on
 *      the context's stream (the legacy default stream); median and min.
 *   5. The step's cache write (device k_new/v_new/slot_mapping) the same way.
 *   6. The ceiling: a 1 GiB device-to-device cudaMemcpy, median of 10, bytes
 *      read + written per second (bench_cuda --mode copy), in the same run.
 * Builds without the CUDA backend compile the stubs at the end.
 */
#include "bench.h"
#include "cli.h"
#include "serve_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device check of serve_device.c (a visible CUDA device, or why not,
 * also in builds without the CUDA backend). */
int bench_cuda_available(char *why, size_t n)
{
    return serve_dev_available(why, n);
}

#ifdef KVA_HAVE_CUDA

#include <cuda_runtime.h>

#define PLAN_REPEATS 5
#define AUTO_SECONDS 1.0
#define AUTO_ITERS_MIN 10
#define AUTO_ITERS_MAX 500
#define COPY_BYTES ((size_t)1 << 30)
#define COPY_ITERS 10

/* Everything the run owns (device buffers NULL until allocated). */
typedef struct dev_bench {
    kva_context *host, *ctx;
    kva_cache *hc, *dc;
    kva_plan *plan;
    void *q, *out, *k_new, *v_new;
    float *lse, *sinks;
    int64_t *slot_new;
    cudaEvent_t ev[2];
    double *times;
} dev_bench;

static int cu_error(const char *what, cudaError_t e)
{
    fprintf(stderr, "kvattn: %s failed: %s\n", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return KVA_EXIT_LIBRARY;
}

/* Copies n bytes of src into a new device buffer *dst (n may be 0). */
static cudaError_t upload(void **dst, const void *src, size_t n)
{
    cudaError_t e = cudaMalloc(dst, n ? n : 1);
    if (e == cudaSuccess && n)
        e = cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice);
    return e;
}

static kva_status run_once(dev_bench *d)
{
    return kva_attention_run(d->ctx, d->plan, d->q, d->dc, d->sinks, d->out, d->lse);
}

/* Seconds of one attention run (or cache write) between two events. */
static int timed(const bench_opts *o, const bench_batch *b, dev_bench *d, int write, double *sec)
{
    cudaError_t e = cudaEventRecord(d->ev[0], 0);
    if (e != cudaSuccess)
        return cu_error("cudaEventRecord", e);
    kva_status st = write ? kva_cache_write(d->ctx, d->dc, b->num_tokens, d->k_new, 0, d->v_new, 0,
                                            o->dtype, d->slot_new)
                          : run_once(d);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error(write ? "kva_cache_write" : "kva_attention_run", st);
    float ms = 0.f;
    if ((e = cudaEventRecord(d->ev[1], 0)) != cudaSuccess ||
        (e = cudaEventSynchronize(d->ev[1])) != cudaSuccess ||
        (e = cudaEventElapsedTime(&ms, d->ev[0], d->ev[1])) != cudaSuccess)
        return cu_error("timing with CUDA events", e);
    *sec = ms * 1e-3;
    return KVA_EXIT_OK;
}

/* Device copy ceiling in GB/s (read + write), 0 when the buffers do not fit. */
static double copy_ceiling(const dev_bench *d)
{
    void *x = NULL, *y = NULL;
    double t[COPY_ITERS], gbps = 0;
    if (cudaMalloc(&x, COPY_BYTES) != cudaSuccess || cudaMalloc(&y, COPY_BYTES) != cudaSuccess ||
        cudaMemset(x, 0x5a, COPY_BYTES) != cudaSuccess)
        goto done;
    for (int k = -2; k < COPY_ITERS; k++) {
        float ms = 0.f;
        if (cudaEventRecord(d->ev[0], 0) != cudaSuccess ||
            cudaMemcpyAsync(y, x, COPY_BYTES, cudaMemcpyDeviceToDevice, 0) != cudaSuccess ||
            cudaEventRecord(d->ev[1], 0) != cudaSuccess ||
            cudaEventSynchronize(d->ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, d->ev[0], d->ev[1]) != cudaSuccess)
            goto done;
        if (k >= 0)
            t[k] = ms * 1e-3;
    }
    gbps = 2.0 * (double)COPY_BYTES / bench_median(t, COPY_ITERS) / 1e9;
done:
    (void)cudaGetLastError();
    cudaFree(x);
    cudaFree(y);
    return gbps;
}

/* Uploads the host cache's bytes (K, V, per-token key scales) into the device cache. */
static int upload_cache(const bench_batch *b, dev_bench *d)
{
    void *hk, *hv, *dk, *dv;
    float *hts = NULL, *dts = NULL;
    kva_status st = kva_cache_data(d->hc, &hk, &hv);
    if (st == KVA_STATUS_OK)
        st = kva_cache_data(d->dc, &dk, &dv);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_data", st);
    const size_t nb = (size_t)b->num_blocks;
    cudaError_t e = cudaMemcpy(dk, hk, nb * kva_cache_block_bytes_k(d->hc), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(dv, hv, nb * kva_cache_block_bytes_v(d->hc), cudaMemcpyHostToDevice);
    const size_t ts = nb * kva_cache_block_bytes_scales(d->hc);
    if (e == cudaSuccess && ts > 0 && kva_cache_token_scales(d->hc, &hts) == KVA_STATUS_OK &&
        kva_cache_token_scales(d->dc, &dts) == KVA_STATUS_OK)
        e = cudaMemcpy(dts, hts, ts, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? KVA_EXIT_OK : cu_error("uploading the cache", e);
}

static int bench_dev(const bench_opts *o, bench_batch *b, bench_result *res, dev_bench *d)
{
    kva_status st;
    cudaError_t e;
    int rc;
    const size_t es = kva_dtype_size(o->dtype), T = (size_t)b->num_tokens, H = (size_t)o->heads;
    const size_t Hkv = (size_t)o->kv_heads, D = (size_t)o->head_dim, Dv = (size_t)o->head_dim_v;
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
        return cu_error("cudaGetDeviceProperties", e);
    snprintf(res->device, sizeof res->device, "%s", prop.name);
    kva_context_desc hd = {KVA_BACKEND_CPU, o->threads, 0}, cd = {KVA_BACKEND_CUDA, 0, 0};
    if ((st = kva_context_create(&hd, &d->host)) != KVA_STATUS_OK ||
        (st = kva_context_create(&cd, &d->ctx)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    res->threads = 1;
    res->num_requests = b->num_requests;
    res->num_tokens = b->num_tokens;
    res->num_blocks = b->num_blocks;
    if ((e = cudaEventCreate(&d->ev[0])) != cudaSuccess ||
        (e = cudaEventCreate(&d->ev[1])) != cudaSuccess)
        return cu_error("cudaEventCreate", e);

    /* 1. The host cache, written and uploaded (the paged path only: --ragged
     * is refused for cuda by the option parser). */
    if ((st = bench_cache_create(d->host, o, b, &d->hc)) != KVA_STATUS_OK ||
        (st = bench_cache_create(d->ctx, o, b, &d->dc)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_create_quant", st);
    if ((st = bench_cache_fill(d->host, o, b, d->hc)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_write (host cache)", st);
    if ((rc = upload_cache(b, d)) != KVA_EXIT_OK)
        return rc;
    if ((e = upload(&d->q, b->q, T * H * D * es)) != cudaSuccess ||
        (e = cudaMalloc(&d->out, T * H * Dv * es + 1)) != cudaSuccess ||
        (e = cudaMalloc((void **)&d->lse, T * H * sizeof(float) + 1)) != cudaSuccess ||
        (b->sinks && (e = upload((void **)&d->sinks, b->sinks, H * sizeof(float))) != cudaSuccess))
        return cu_error("allocating device tensors", e);

    /* 2. The plan (host time: partition and upload). */
    kva_plan_desc pd;
    bench_plan_desc(o, b, &pd);
    double plan_times[PLAN_REPEATS];
    for (int k = 0; k < PLAN_REPEATS; k++) {
        kva_plan_destroy(d->plan);
        d->plan = NULL;
        const double t0 = kva_cli_now();
        st = kva_plan_create(d->ctx, &pd, &d->plan);
        plan_times[k] = kva_cli_now() - t0;
        if (st != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_plan_create", st);
    }
    res->plan_s = bench_median(plan_times, PLAN_REPEATS);
    if ((st = kva_plan_get_info(d->plan, &res->info)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_plan_get_info", st);

    /* 3. First run into poisoned outputs (all-ones bytes: NaN in f32/f16/bf16), checked. */
    double first = 0;
    if ((e = cudaMemset(d->out, 0xff, T * H * Dv * es)) != cudaSuccess ||
        (e = cudaMemset(d->lse, 0xff, T * H * sizeof(float))) != cudaSuccess)
        return cu_error("cudaMemset", e);
    if ((rc = timed(o, b, d, 0, &first)) != KVA_EXIT_OK)
        return rc;
    if ((e = cudaMemcpy(b->out, d->out, T * H * Dv * es, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(b->lse, d->lse, T * H * sizeof(float), cudaMemcpyDeviceToHost)) !=
            cudaSuccess)
        return cu_error("copying out and lse back", e);
    if (o->no_check) {
        res->check.skip_reason = "--no-check";
    } else {
        if ((rc = bench_check_report(o, b, d->hc, "cuda", &res->check)) != KVA_EXIT_OK)
            return rc;
    }
    fflush(stdout);

    /* 4. Warm-up and timed runs. */
    double est = first;
    for (int k = 0; k < o->warmup; k++) {
        double t = 0;
        if ((rc = timed(o, b, d, 0, &t)) != KVA_EXIT_OK)
            return rc;
        est = t < est ? t : est;
    }
    int iters = o->iters;
    if (iters == 0) {
        const double n = est > 0 ? AUTO_SECONDS / est : AUTO_ITERS_MAX;
        iters = n < AUTO_ITERS_MIN ? AUTO_ITERS_MIN : n > AUTO_ITERS_MAX ? AUTO_ITERS_MAX : (int)n;
    }
    res->iters = iters;
    if (!(d->times = malloc((size_t)iters * sizeof *d->times))) {
        fprintf(stderr, "kvattn: out of memory\n");
        return KVA_EXIT_LIBRARY;
    }
    for (int k = 0; k < iters; k++)
        if ((rc = timed(o, b, d, 0, &d->times[k])) != KVA_EXIT_OK)
            return rc;
    res->median_s = bench_median(d->times, iters);
    res->min_s = d->times[0]; /* sorted by bench_median */

    /* 5. The step's cache write on the device (same slots and data: idempotent). */
    if ((e = upload(&d->k_new, b->k_new, T * Hkv * D * es)) != cudaSuccess ||
        (e = upload(&d->v_new, b->v_new, T * Hkv * Dv * es)) != cudaSuccess ||
        (e = upload((void **)&d->slot_new, b->slot_new, T * sizeof(int64_t))) != cudaSuccess)
        return cu_error("uploading the new tokens", e);
    const int nw = iters < 50 ? iters : 50;
    for (int k = 0; k < nw; k++)
        if ((rc = timed(o, b, d, 1, &d->times[k])) != KVA_EXIT_OK)
            return rc;
    res->write_s = bench_median(d->times, nw);
    res->counts = bench_count(o, b);

    /* 6. The device copy ceiling, same run. */
    if (!o->no_ceiling)
        res->read_bw = copy_ceiling(d);
    if (!o->quiet)
        bench_report_print(o, b, res);
    if (o->json && !o->quiet && bench_report_json(o->json, o, res) != 0) {
        fprintf(stderr, "kvattn: cannot write --json file '%s'\n", o->json);
        return KVA_EXIT_LIBRARY;
    }
    return KVA_EXIT_OK;
}

int bench_cuda_main(const bench_opts *o, bench_batch *b, bench_result *res)
{
    dev_bench d;
    memset(&d, 0, sizeof d);
    const int rc = bench_dev(o, b, res, &d);
    kva_plan_destroy(d.plan);
    kva_cache_destroy(d.dc);
    kva_cache_destroy(d.hc);
    cudaFree(d.q);
    cudaFree(d.out);
    cudaFree(d.lse);
    cudaFree(d.sinks);
    cudaFree(d.k_new);
    cudaFree(d.v_new);
    cudaFree(d.slot_new);
    if (d.ev[0])
        cudaEventDestroy(d.ev[0]);
    if (d.ev[1])
        cudaEventDestroy(d.ev[1]);
    kva_context_destroy(d.ctx);
    kva_context_destroy(d.host);
    free(d.times);
    return rc;
}

#else /* no CUDA backend in this build */

int bench_cuda_main(const bench_opts *o, bench_batch *b, bench_result *res)
{
    (void)o, (void)b, (void)res;
    char why[160];
    bench_cuda_available(why, sizeof why);
    fprintf(stderr, "kvattn: --backend cuda: %s\n", why);
    return KVA_EXIT_LIBRARY;
}

#endif
