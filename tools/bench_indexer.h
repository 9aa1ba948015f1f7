/*
 * bench_indexer.h - `kvattn bench --indexer` (bench_indexer.c) and its CUDA
 * half (bench_indexer_cuda.c).
 */
#ifndef KVA_TOOLS_BENCH_INDEXER_H
#define KVA_TOOLS_BENCH_INDEXER_H

#include "../bench/data.h"
#include "kvattn.h"

typedef struct bench_index_opts {
    int32_t batch, context, q_len, heads, head_dim, topk, B, threads, iters, warmup;
    kva_dtype dt;
    int fp8, cuda, no_check, mma_sync; /* mma_sync: force the mma.sync logits kernel */
    int qfp8;                          /* index_q_quant FP8_TOKEN (--q-quant fp8) */
    int topk_full;                     /* cuda: every top-K radix pass reads the whole row */
    int no_ws; /* cuda: FP8-q on the sm_90a wgmma kernel, not the warp-specialized one */
} bench_index_opts;

/* The host data of one run: an index-key cache on a CPU context (copied
 * byte for byte to the device for CUDA), q [T, Hi, D] in dt, w [T, Hi],
 * the plan descriptor and its arrays. */
typedef struct bench_index_data {
    kva_context *host_ctx;
    kva_cache *cache;
    kva_plan_desc pd;
    int32_t *qsl, *seq, *bt, T, stride;
    void *q;
    float *w;
    double keys_scored; /* sum over tokens of pos + 1 */
} bench_index_data;

/* Medians in seconds: the whole run, its two kernels, and the read-once
 * baseline with the bytes it reads (CUDA only). */
typedef struct bench_index_times {
    double total, logits, topk, read, read_bytes;
} bench_index_times;

/* Times the run on CUDA device 0; the first run's indices [T, K] go to ind. */
int bench_indexer_cuda(const bench_index_opts *o, bench_index_data *x, int32_t *ind,
                       bench_index_times *tm);

#endif /* KVA_TOOLS_BENCH_INDEXER_H */
