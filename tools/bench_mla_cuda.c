/*
 * bench_mla_cuda.c - `kvattn bench --mla --backend cuda`: the MLA layer of
 * bench_mla.c timed on GPU 0.
 *
 * The latent cache built on the host (bench_mla.c) is copied byte for byte
 * into a device cache of the same descriptor; q, W_UK, W_UV go to the device;
 * the plan is created on the CUDA context. The first run writes into outputs
 * poisoned with NaN and its out / lse come back to the host for bench_mla.c's
 * check against the reference. Then warm-up and every timed run between its
 * own pair of CUDA events on the context's stream (median and min), and, for
 * kva_mla_run, one more run per iteration with events between its phases
 * (kva__cuda_mla_run_timed: absorbed, decompress, attention, merge; medians).
 * Builds without the CUDA backend compile the stub at the end.
 */
#include "bench_mla.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA

#include "../src/attn/cuda/mla_run.h"

#include <cuda_runtime.h>

static int cu_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "kvattn: bench --mla: %s failed: %s\n", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return KVA_EXIT_LIBRARY;
}

static void sort(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            const double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
}

int bench_mla_cuda(const bench_mla_io *io, bench_mla_times *tm)
{
    memset(tm, 0, sizeof *tm);
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0};
    kva_status st = kva_context_create(&cd, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create (cuda)", st);
    kva_cache *dc = NULL;
    void *q = NULL, *wuk = NULL, *wuv = NULL, *out = NULL;
    float *lse = NULL;
    kva_plan *plan = NULL;
    double *t = calloc((size_t)io->iters * (KVA__CUDA_MLA_PHASES + 1), sizeof(double));
    cudaEvent_t ev[2] = {NULL, NULL};
    int rc = KVA_EXIT_OK;
    cudaError_t e = cudaSuccess;
    void *hk = NULL, *dk = NULL;
    /* The host cache's bytes go over as they are: an FP8 cache keeps its scale. */
    const kva_quant_params qp = {.k_scale = &io->kv_scale, .k_scale_len = 1};
    const int fp8 = io->cache->desc.quant == KVA_QUANT_FP8_E4M3;
    if ((st = kva_cache_create_quant(ctx, &io->cache->desc, fp8 ? &qp : NULL, &dc)) !=
        KVA_STATUS_OK) {
        rc = kva_cli_lib_error("kva_cache_create_quant (cuda)", st);
        goto done;
    }
    kva_cache_data(io->cache, &hk, NULL);
    kva_cache_data(dc, &dk, NULL);
    const size_t cache_bytes = (size_t)io->cache->desc.num_blocks * kva_cache_block_bytes_k(dc);
    if ((e = cudaMemcpy(dk, hk, cache_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc(&q, io->q_bytes)) != cudaSuccess ||
        (e = cudaMemcpy(q, io->q, io->q_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc(&wuk, io->w_uk_bytes)) != cudaSuccess ||
        (e = cudaMemcpy(wuk, io->w_uk, io->w_uk_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc(&wuv, io->w_uv_bytes)) != cudaSuccess ||
        (e = cudaMemcpy(wuv, io->w_uv, io->w_uv_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc(&out, io->out_bytes)) != cudaSuccess ||
        (e = cudaMemset(out, 0xff, io->out_bytes)) != cudaSuccess ||
        (e = cudaMalloc((void **)&lse, io->lse_bytes)) != cudaSuccess ||
        (e = cudaMemset(lse, 0xff, io->lse_bytes)) != cudaSuccess ||
        (e = cudaEventCreate(&ev[0])) != cudaSuccess ||
        (e = cudaEventCreate(&ev[1])) != cudaSuccess) {
        rc = cu_fail("device setup", e);
        goto done;
    }
    if ((st = kva_plan_create(ctx, io->plan_desc, &plan)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("kva_plan_create (cuda)", st);
        goto done;
    }
    for (int k = -io->warmup - 1; k < io->iters; k++) {
        if ((e = cudaEventRecord(ev[0], 0)) != cudaSuccess) {
            rc = cu_fail("cudaEventRecord", e);
            goto done;
        }
        st = io->kernel ? kva_attention_run(ctx, plan, q, dc, NULL, out, lse)
                        : kva_mla_run(ctx, plan, q, wuk, wuv, dc, out, lse);
        if (st != KVA_STATUS_OK) {
            rc = kva_cli_lib_error(io->kernel ? "kva_attention_run" : "kva_mla_run", st);
            goto done;
        }
        float ms = 0.f;
        if ((e = cudaEventRecord(ev[1], 0)) != cudaSuccess ||
            (e = cudaEventSynchronize(ev[1])) != cudaSuccess ||
            (e = cudaEventElapsedTime(&ms, ev[0], ev[1])) != cudaSuccess) {
            rc = cu_fail("timing with CUDA events", e);
            goto done;
        }
        if (k == -io->warmup - 1 && /* the first run: the checked output */
            ((e = cudaMemcpy(io->out, out, io->out_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
             (e = cudaMemcpy(io->lse, lse, io->lse_bytes, cudaMemcpyDeviceToHost)) !=
                 cudaSuccess)) {
            rc = cu_fail("cudaMemcpy of the output", e);
            goto done;
        }
        if (k >= 0)
            t[k] = ms * 1e-3;
    }
    sort(t, io->iters);
    tm->median = t[io->iters / 2];
    tm->best = t[0];
    if (!io->kernel) {
        double *ph = t + io->iters;
        for (int k = 0; k < io->iters; k++) {
            float ms[KVA__CUDA_MLA_PHASES];
            st = kva__cuda_mla_run_timed(ctx, plan, q, wuk, wuv, dc, out, lse, ms);
            if (st != KVA_STATUS_OK) {
                rc = kva_cli_lib_error("kva__cuda_mla_run_timed", st);
                goto done;
            }
            for (int p = 0; p < KVA__CUDA_MLA_PHASES; p++)
                ph[p * io->iters + k] = ms[p] * 1e-3;
        }
        for (int p = 0; p < KVA__CUDA_MLA_PHASES; p++) {
            sort(ph + p * io->iters, io->iters);
            tm->phase[p] = ph[p * io->iters + io->iters / 2];
        }
        tm->has_phases = 1;
    }
done:
    kva_plan_destroy(plan);
    kva_cache_destroy(dc);
    cudaFree(q);
    cudaFree(wuk);
    cudaFree(wuv);
    cudaFree(out);
    cudaFree(lse);
    if (ev[0])
        cudaEventDestroy(ev[0]);
    if (ev[1])
        cudaEventDestroy(ev[1]);
    free(t);
    kva_context_destroy(ctx);
    return rc;
}

#else

int bench_mla_cuda(const bench_mla_io *io, bench_mla_times *tm)
{
    (void)io;
    memset(tm, 0, sizeof *tm);
    fprintf(stderr, "kvattn: bench --mla --backend cuda: built without the CUDA backend\n");
    return KVA_EXIT_USAGE;
}

#endif
