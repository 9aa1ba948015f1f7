/*
 * cli_buf.c - buffers where a benchmark's backend computes: host memory for
 * the CPU backends, GPU 0's memory for the CUDA backend (builds with the CUDA
 * backend; without it every buffer is on the host). Used by `bench
 * --cascade` and `bench --dcp`.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

void *kva_cli_buf_new(int dev, size_t n)
{
#ifdef KVA_HAVE_CUDA
    if (dev) {
        void *p = NULL;
        if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        return p;
    }
#endif
    (void)dev;
    return malloc(n ? n : 1);
}

void kva_cli_buf_free(int dev, void *p)
{
#ifdef KVA_HAVE_CUDA
    if (dev) {
        cudaFree(p);
        return;
    }
#endif
    (void)dev;
    free(p);
}

int kva_cli_buf_copy(int dev, void *dst, const void *src, size_t n)
{
#ifdef KVA_HAVE_CUDA
    if (dev) {
        /* Synchronous on the legacy default stream: the runs before it are done. */
        const cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
        if (e != cudaSuccess) {
            fprintf(stderr, "kvattn: cudaMemcpy failed: %s\n", cudaGetErrorString(e));
            (void)cudaGetLastError();
            return KVA_EXIT_LIBRARY;
        }
        return KVA_EXIT_OK;
    }
#endif
    (void)dev;
    memcpy(dst, src, n);
    return KVA_EXIT_OK;
}
