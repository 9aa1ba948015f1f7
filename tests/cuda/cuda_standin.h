/*
 * cuda_standin.h - for the CUDA tests whose very cases can also run with the
 * CPU backend standing in for the GPU (an environment variable set to
 * anything but "0"): that is how their expectations are exercised on a
 * machine without one. Buffers and contexts of "the run's backend": device
 * memory and CUDA contexts, or host memory and CPU contexts.
 */
#ifndef KVA_TEST_CUDA_STANDIN_H
#define KVA_TEST_CUDA_STANDIN_H

#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

static int g_gpu = 1; /* 0: the CPU backend stands in */

/* Reads env; on the GPU path the usual skip rule (exit status 77 without a
 * device), else 0 after saying which backend runs. */
static inline int standin_start(const char *env)
{
    const char *v = getenv(env);
    g_gpu = !(v && *v && strcmp(v, "0") != 0);
    if (g_gpu)
        return cuda_test_skip();
    printf("%s: the CPU backend stands in for the GPU\n", env);
    return 0;
}

static inline kva_backend standin_backend(void)
{
    return g_gpu ? KVA_BACKEND_CUDA : KVA_BACKEND_CPU;
}

/* A context of the run's backend (3 threads on the CPU). */
static inline kva_context *run_ctx(void)
{
    kva_context_desc d = {standin_backend(), g_gpu ? 0 : 3, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&d, &ctx));
    return ctx;
}

static inline void *buf_from(const void *src, size_t n)
{
    if (g_gpu)
        return dev_from(src, n);
    void *p = malloc(n ? n : 1);
    memcpy(p, src, n);
    return p;
}

/* n bytes of 0xff (NaN in f32, f16 and bf16), as dev_poisoned. */
static inline void *buf_poisoned(size_t n)
{
    if (g_gpu)
        return dev_poisoned(n);
    void *p = malloc(n ? n : 1);
    memset(p, 0xff, n);
    return p;
}

static inline void buf_get(void *dst, const void *src, size_t n)
{
    if (g_gpu)
        to_host(dst, src, n);
    else
        memcpy(dst, src, n);
}

static inline void buf_free(void *p)
{
    if (g_gpu)
        cudaFree(p);
    else
        free(p);
}

#endif /* KVA_HAVE_CUDA */
#endif /* KVA_TEST_CUDA_STANDIN_H */
