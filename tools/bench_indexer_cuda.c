/*
 * bench_indexer_cuda.c - `kvattn bench --indexer --backend cuda`: the host
 * index-key cache copied byte for byte to GPU 0, q and w uploaded, the
 * first run's indices brought back for the check; then each of four
 * timings (the whole run, the logits kernel alone, the top-K kernel alone,
 * the read-once baseline kernel) is the median of --iters runs, each
 * between its own pair of CUDA events on the context's stream. Builds
 * without the CUDA backend compile the stub at the end.
 */
#include "bench_indexer.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA

#include "../src/attn/cuda/cuda_backend.h"

#include <cuda_runtime.h>

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int bench_indexer_cuda(const bench_index_opts *o, bench_index_data *x, int32_t *ind,
                       bench_index_times *tm)
{
    kva_context_desc cd = {.backend = KVA_BACKEND_CUDA};
    kva_context *ctx = NULL;
    kva_status st = kva_context_create(&cd, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create (cuda)", st);
    kva_cache *dc = NULL;
    kva_plan *plan = NULL;
    void *q = NULL, *hk = NULL, *dk = NULL;
    float *w = NULL;
    int32_t *di = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    double *t = calloc((size_t)o->iters, sizeof *t);
    int rc = KVA_EXIT_OK;
    cudaError_t e = cudaSuccess;
    const size_t qb = (size_t)x->T * o->heads * o->head_dim * 2;
    const size_t wb = (size_t)x->T * o->heads * 4, ib = (size_t)x->T * o->topk * 4;
    if ((o->mma_sync || o->topk_full || o->no_ws) &&
        (st = kva__cuda_context_indexer_test(
             ctx, 0, o->mma_sync | o->topk_full << 1 | o->no_ws << 2)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("--mma-sync / --topk-full / --no-ws", st);
        goto done;
    }
    if ((st = kva_cache_create(ctx, &x->cache->desc, &dc)) != KVA_STATUS_OK ||
        (st = kva_plan_create(ctx, &x->pd, &plan)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("indexer setup (cuda)", st);
        goto done;
    }
    kva_cache_data(x->cache, &hk, NULL);
    kva_cache_data(dc, &dk, NULL);
    if ((e = cudaMemcpy(dk, hk, (size_t)x->cache->desc.num_blocks * kva_cache_block_bytes_k(dc),
                        cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc(&q, qb)) != cudaSuccess ||
        (e = cudaMemcpy(q, x->q, qb, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc((void **)&w, wb)) != cudaSuccess ||
        (e = cudaMemcpy(w, x->w, wb, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMalloc((void **)&di, ib)) != cudaSuccess ||
        (e = cudaMemset(di, 0x5a, ib)) != cudaSuccess ||
        (e = cudaEventCreate(&ev[0])) != cudaSuccess ||
        (e = cudaEventCreate(&ev[1])) != cudaSuccess)
        goto cuda_fail;
    cudaStream_t s = (cudaStream_t)((kva__cuda_state *)ctx->state)->stream;
    if ((st = kva_indexer_run(ctx, plan, q, w, dc, di, 0, NULL)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("kva_indexer_run (cuda)", st);
        goto done;
    }
    if ((e = cudaMemcpy(ind, di, ib, cudaMemcpyDeviceToHost)) != cudaSuccess)
        goto cuda_fail;
    double *out[4] = {&tm->total, &tm->logits, &tm->topk, &tm->read};
    for (int what = 0; what < 4; what++) {
        for (int i = 0; i < o->warmup + o->iters; i++) {
            cudaEventRecord(ev[0], s);
            if (what == 3)
                st = kva__cuda_indexer_probe(ctx, plan, dc, NULL);
            else
                st = kva__cuda_indexer_parts(ctx, plan, q, w, dc, di, o->topk, NULL,
                                             what == 0 ? 3 : what);
            cudaEventRecord(ev[1], s);
            if (st != KVA_STATUS_OK) {
                rc = kva_cli_lib_error("indexer timing (cuda)", st);
                goto done;
            }
            if ((e = cudaEventSynchronize(ev[1])) != cudaSuccess)
                goto cuda_fail;
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, ev[0], ev[1]);
            if (i >= o->warmup)
                t[i - o->warmup] = ms * 1e-3;
        }
        qsort(t, (size_t)o->iters, sizeof *t, cmp_d);
        *out[what] = t[o->iters / 2];
    }
    if ((st = kva__cuda_indexer_probe(ctx, plan, dc, &tm->read_bytes)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("indexer probe (cuda)", st);
        goto done;
    }
    goto done;
cuda_fail:
    fprintf(stderr, "kvattn: bench --indexer: %s\n", cudaGetErrorString(e));
    rc = KVA_EXIT_LIBRARY;
done:
    cudaDeviceSynchronize();
    if (ev[0])
        cudaEventDestroy(ev[0]);
    if (ev[1])
        cudaEventDestroy(ev[1]);
    cudaFree(q);
    cudaFree(w);
    cudaFree(di);
    free(t);
    kva_plan_destroy(plan);
    kva_cache_destroy(dc);
    kva_context_destroy(ctx);
    return rc;
}

#else

int bench_indexer_cuda(const bench_index_opts *o, bench_index_data *x, int32_t *ind,
                       bench_index_times *tm)
{
    (void)o, (void)x, (void)ind, (void)tm;
    fprintf(stderr, "kvattn: bench --indexer: this build has no CUDA backend\n");
    return KVA_EXIT_USAGE;
}

#endif
