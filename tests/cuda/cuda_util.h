/*
 * cuda_util.h - helpers of the CUDA tests: device buffers through the CUDA
 * runtime, poisoning (0xff bytes are NaN in f32, f16 and bf16), and the
 * skip rule (exit 77 without the CUDA build or without a device).
 */
#ifndef KVA_TEST_CUDA_UTIL_H
#define KVA_TEST_CUDA_UTIL_H

#include "harness.h"
#include "internal.h"
#include "kvattn_cuda.h"

#ifdef KVA_HAVE_CUDA
#include <cuda_runtime.h>

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                     \
    } while (0)

/* Device copy of n bytes of host memory (NULL when src is NULL). It and
 * cache_upload end with cudaDeviceSynchronize: a cudaMemcpy from pageable
 * host memory may return before its DMA has landed, on the legacy default
 * stream, which a context's cudaStreamNonBlocking stream does not wait for,
 * so a kernel launched next could read the old bytes (test_cuda_dcp read a
 * rank's cache early while other tests loaded the GPU: finite wrong values,
 * not the poison). */
static inline void *dev_from(const void *src, size_t n)
{
    if (!src)
        return NULL;
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n ? n : 1));
    if (n)
        CUDA_OK(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    return d;
}

/* Fills n bytes of device memory and waits: cudaMemset runs on the legacy
 * stream, which a cudaStreamNonBlocking stream does not wait for, so an
 * unfinished fill could land after a kernel's output (as dev_from's copy). */
static inline void dev_fill(void *d, int byte, size_t n)
{
    CUDA_OK(cudaMemset(d, byte, n));
    CUDA_OK(cudaDeviceSynchronize());
}

/* Device buffer of n bytes filled with 0xff (NaN in every float dtype). */
static inline void *dev_poisoned(size_t n)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n ? n : 1));
    dev_fill(d, 0xff, n ? n : 1);
    return d;
}

static inline void to_host(void *dst, const void *src, size_t n)
{
    CUDA_OK(cudaDeviceSynchronize());
    if (n)
        CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

/* 1 if the first 64 bytes of a dev_poisoned buffer still hold 0xff (a run
 * that failed must not have written its output). */
static inline int dev_untouched(const void *d)
{
    unsigned char probe[64];
    to_host(probe, d, sizeof probe);
    int untouched = 1;
    for (int i = 0; i < 64; i++)
        untouched &= probe[i] == 0xff;
    return untouched;
}

/* 1 if the registry kernel `name` can run here (the wgmma kernels need an
 * sm_90a build and device). */
static inline int kernel_usable(const char *name)
{
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    if (kva_context_create(&gd, &gpu) != KVA_STATUS_OK)
        return 0;
    const int ok = kva__context_force_kernel(gpu, name) == KVA_STATUS_OK;
    kva_context_destroy(gpu);
    return ok;
}

/* A CUDA graph captured from what the library enqueues on a context's
 * stream: graph_begin gives the context a new non-blocking stream and starts
 * capturing (a host synchronization inside the captured calls then fails the
 * capture), graph_end instantiates it and gives the context back the legacy
 * stream, graph_replay launches it after everything queued so far (e.g. the
 * poisoning of the outputs) and waits, graph_free releases it. */
typedef struct cu_graph {
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} cu_graph;

static inline void graph_begin(kva_context *ctx, cu_graph *g)
{
    memset(g, 0, sizeof *g);
    CUDA_OK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(ctx, g->stream));
    CUDA_OK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeGlobal));
}

static inline void graph_end(kva_context *ctx, cu_graph *g)
{
    CUDA_OK(cudaStreamEndCapture(g->stream, &g->graph));
    CUDA_OK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    CHECK_OK(kva_cuda_context_set_stream(ctx, NULL));
}

static inline void graph_replay(cu_graph *g)
{
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(g->exec, g->stream));
    CUDA_OK(cudaStreamSynchronize(g->stream));
}

static inline void graph_free(cu_graph *g)
{
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    if (g->graph)
        cudaGraphDestroy(g->graph);
    cudaStreamDestroy(g->stream);
}

/* Copies a host cache's K/V storage (and per-token scales, if its format has
 * them) into a device cache of the same desc and static scales. */
static inline void cache_upload(kva_cache *dev, const kva_cache *host)
{
    void *hk, *hv, *dk, *dv;
    kva_cache_data(host, &hk, &hv);
    kva_cache_data(dev, &dk, &dv);
    CUDA_OK(cudaMemcpy(dk, hk, (size_t)host->desc.num_blocks * kva_cache_block_bytes_k(host),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv, (size_t)host->desc.num_blocks * kva_cache_block_bytes_v(host),
                       cudaMemcpyHostToDevice));
    float *hs = NULL, *ds = NULL;
    kva_cache_token_scales(host, &hs);
    kva_cache_token_scales(dev, &ds);
    if (hs && ds)
        CUDA_OK(cudaMemcpy(ds, hs,
                           (size_t)host->desc.num_blocks * kva_cache_block_bytes_scales(host),
                           cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* see dev_from */
}
#endif

/* Returns 77 (ctest's skip) when the CUDA backend cannot run here, else 0. */
static inline int cuda_test_skip(void)
{
    (void)kva_test_checks_failed_; /* used by RUN(), which a skipping build compiles out */
#ifndef KVA_HAVE_CUDA
    printf("skipped: built without the CUDA backend\n");
    return 77;
#else
    if (!kva_backend_available(KVA_BACKEND_CUDA)) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    return 0;
#endif
}

#endif /* KVA_TEST_CUDA_UTIL_H */
