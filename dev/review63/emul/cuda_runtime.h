/* dev/review63/emul/cuda_runtime.h - a host stand-in for the few CUDA runtime
 * calls tests/cuda/test_cuda_mla_gemm.c and tests/cuda/cuda_util.h make, so
 * that the test's own indexing and checks run on a machine without a GPU
 * (device memory is host memory). Not a CUDA model: no streams, no kernels. */
#ifndef REVIEW63_FAKE_CUDA_RUNTIME_H
#define REVIEW63_FAKE_CUDA_RUNTIME_H
#include <stdlib.h>
#include <string.h>
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
       cudaStreamNonBlocking = 1, cudaStreamCaptureModeGlobal = 0 };
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
static inline const char *cudaGetErrorString(cudaError_t e) { return e ? "error" : "no error"; }
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    /* 256-byte aligned, as cudaMalloc's */
    return (*p = aligned_alloc(256, (n + 255) / 256 * 256)) ? 0 : 2;
}
static inline cudaError_t cudaFree(void *p) { free(p); return 0; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int k)
{
    (void)k;
    memcpy(d, s, n);
    return 0;
}
static inline cudaError_t cudaMemset(void *d, int b, size_t n) { memset(d, b, n); return 0; }
static inline cudaError_t cudaDeviceSynchronize(void) { return 0; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int f) { (void)f; *s = 0; return 0; }
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, int m) { (void)s, (void)m; return 1; }
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { (void)s, (void)g; return 1; }
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, int f) { (void)e, (void)g, (void)f; return 1; }
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { (void)e, (void)s; return 1; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return 0; }
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { (void)e; return 0; }
static inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { (void)g; return 0; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return 0; }
#endif
