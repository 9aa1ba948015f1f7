/*
 * bench_mla.h - the device half of `kvattn bench --mla` (bench_mla_cuda.c),
 * called by bench_mla.c with the host data it built.
 */
#ifndef KVA_TOOLS_BENCH_MLA_H
#define KVA_TOOLS_BENCH_MLA_H

#include "kvattn.h"

#include <stddef.h>

/* Host inputs and outputs of one timed MLA layer. */
typedef struct bench_mla_io {
    const kva_cache *cache;         /* host latent cache (copied to the device) */
    float kv_scale;                 /* its k_scale when it is FP8 E4M3 (the device cache's) */
    const kva_plan_desc *plan_desc; /* the plan to create on the device */
    const void *q, *w_uk, *w_uv;    /* host tensors */
    size_t q_bytes, w_uk_bytes, w_uv_bytes;
    void *out;  /* host copy of the first run's out [T, H, Dv] */
    float *lse; /* and lse [T, H] */
    size_t out_bytes, lse_bytes;
    int iters, warmup, kernel; /* kernel: kva_attention_run on absorbed q */
} bench_mla_io;

typedef struct bench_mla_times {
    double median, best; /* seconds per run */
    /* kva_mla_run's phases (medians, seconds): absorbed requests, then the
     * compute-friendly requests' decompression, attention and merges. */
    double phase[4];
    int has_phases;
} bench_mla_times;

/* Times the layer on CUDA device 0; returns a KVA_EXIT_* code. */
int bench_mla_cuda(const bench_mla_io *io, bench_mla_times *tm);

#endif /* KVA_TOOLS_BENCH_MLA_H */
