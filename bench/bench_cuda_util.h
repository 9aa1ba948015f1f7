/*
 * bench_cuda_util.h - what the CUDA benchmarks (bench/bench_cuda*.c,
 * dcp_nccl_bench.c) share:
 * the fatal-error macros around CUDA runtime and kvattn calls, the median of
 * timed runs, the event timing of one call, and host-to-device uploads.
 * Benchmarks only (they exit on any failure); built with the CUDA backend.
 * Define BENCH_NAME (the program name that starts every message) first.
 */
#ifndef KVA_BENCH_CUDA_UTIL_H
#define KVA_BENCH_CUDA_UTIL_H

#include "kvattn.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_cuda_util.h"
#endif
/* How DIE ends the process (a forked rank defines _exit). */
#ifndef BENCH_EXIT
#define BENCH_EXIT exit
#endif

/* Prints "BENCH_NAME: <message>" and ends the process with status 1. */
#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, BENCH_NAME ": " __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                                       \
        BENCH_EXIT(1);                                                                             \
    } while (0)
/* A CUDA runtime call that must succeed. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            DIE("%s: %s", #call, cudaGetErrorString(e_));                                          \
    } while (0)
/* A kvattn call that must return KVA_STATUS_OK. */
#define KV(call)                                                                                   \
    do {                                                                                           \
        kva_status s_ = (call);                                                                    \
        if (s_ != KVA_STATUS_OK)                                                                   \
            DIE("%s: %s: %s", #call, kva_status_name(s_), kva_last_error());                       \
    } while (0)

/* Times `call` iters times on stream (0: the default stream), each run
 * between its own pair of events: ms[0 .. iters) in milliseconds. */
#define BENCH_TIME_EVENTS(ms, iters, stream, call)                                                 \
    do {                                                                                           \
        cudaEvent_t ev_[2];                                                                        \
        CU(cudaEventCreate(&ev_[0]));                                                              \
        CU(cudaEventCreate(&ev_[1]));                                                              \
        for (int it_ = 0; it_ < (iters); it_++) {                                                  \
            CU(cudaEventRecord(ev_[0], (stream)));                                                 \
            call;                                                                                  \
            CU(cudaEventRecord(ev_[1], (stream)));                                                 \
            CU(cudaEventSynchronize(ev_[1]));                                                      \
            CU(cudaEventElapsedTime(&(ms)[it_], ev_[0], ev_[1]));                                  \
        }                                                                                          \
        cudaEventDestroy(ev_[0]);                                                                  \
        cudaEventDestroy(ev_[1]);                                                                  \
    } while (0)

static inline int bench_cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0 .. n), n >= 1 (v is sorted in place; the mean of the
 * middle two for even n). */
static inline float bench_median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* A new device buffer holding a copy of host[0 .. bytes). */
static inline void *bench_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes));
    CU(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

#endif /* KVA_BENCH_CUDA_UTIL_H */
