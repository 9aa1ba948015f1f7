/*
 * serve_device.c - the device side of `kvattn serve-sim --backend cuda`: a
 * stream, timing events and device / pinned buffers through the CUDA
 * runtime (the library itself allocates no user tensors). Built with the
 * runtime only where the CLI is compiled with KVA_HAVE_CUDA; elsewhere every
 * call reports that this build has no CUDA backend, so the test of the
 * simulation (which compiles tools/serve_*.c without it) links too.
 *
 * Errors are returned as KVA_STATUS_DEVICE_ERROR (or BACKEND_UNAVAILABLE)
 * with the runtime's message in the serve_dev's err (serve_dev_error).
 */
#include "serve_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA

#include <cuda_runtime.h>

struct serve_dev {
    cudaStream_t stream;
    cudaEvent_t *ev; /* [num_events] */
    int32_t num_events;
    char err[256];
};

int serve_dev_available(char *why, size_t n)
{
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(why, n, "no CUDA device is visible (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        (void)cudaGetLastError();
        return 0;
    }
    return 1;
}

/* Records the failing runtime call; clears the runtime's sticky last error. */
static kva_status fail(serve_dev *d, const char *what, cudaError_t e)
{
    if (d)
        snprintf(d->err, sizeof d->err, "%s failed: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return KVA_STATUS_DEVICE_ERROR;
}

kva_status serve_dev_create(int32_t num_events, serve_dev **out)
{
    serve_dev *d = calloc(1, sizeof *d);
    if (!d)
        return KVA_STATUS_OUT_OF_MEMORY;
    *out = d;
    d->ev = calloc((size_t)num_events, sizeof *d->ev);
    if (!d->ev)
        return KVA_STATUS_OUT_OF_MEMORY;
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return fail(d, "creating the stream (cudaStreamCreateWithFlags)", e);
    for (int32_t i = 0; i < num_events; i++) {
        if ((e = cudaEventCreate(&d->ev[i])) != cudaSuccess)
            return fail(d, "cudaEventCreate", e);
        d->num_events = i + 1;
    }
    return KVA_STATUS_OK;
}

void serve_dev_destroy(serve_dev *d)
{
    if (!d)
        return;
    for (int32_t i = 0; i < d->num_events; i++)
        cudaEventDestroy(d->ev[i]);
    if (d->stream)
        cudaStreamDestroy(d->stream);
    free(d->ev);
    free(d);
}

const char *serve_dev_error(const serve_dev *d)
{
    return d ? d->err : "";
}

void *serve_dev_stream(serve_dev *d)
{
    return d->stream;
}

void serve_dev_name(char *name, size_t n)
{
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        snprintf(name, n, "GPU 0: %s", p.name);
    else
        snprintf(name, n, "GPU 0");
    (void)cudaGetLastError();
}

kva_status serve_dev_alloc(serve_dev *d, size_t n, void **p)
{
    cudaError_t e = cudaMalloc(p, n ? n : 1);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaMalloc", e);
}

void serve_dev_free(void *p)
{
    if (p)
        cudaFree(p);
}

kva_status serve_dev_alloc_host(serve_dev *d, size_t n, void **p)
{
    cudaError_t e = cudaMallocHost(p, n ? n : 1);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaMallocHost", e);
}

void serve_dev_free_host(void *p)
{
    if (p)
        cudaFreeHost(p);
}

kva_status serve_dev_upload(serve_dev *d, void *dst, const void *src, size_t n)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->stream);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaMemcpyAsync (host to device)", e);
}

kva_status serve_dev_download(serve_dev *d, void *dst, const void *src, size_t n)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaMemcpyAsync (device to host)", e);
}

kva_status serve_dev_memset(serve_dev *d, void *p, int value, size_t n)
{
    cudaError_t e = cudaMemsetAsync(p, value, n, d->stream);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaMemsetAsync", e);
}

kva_status serve_dev_record(serve_dev *d, int32_t i)
{
    cudaError_t e = cudaEventRecord(d->ev[i], d->stream);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaEventRecord", e);
}

kva_status serve_dev_sync(serve_dev *d)
{
    cudaError_t e = cudaStreamSynchronize(d->stream);
    return e == cudaSuccess ? KVA_STATUS_OK : fail(d, "cudaStreamSynchronize", e);
}

int serve_dev_query(serve_dev *d)
{
    const cudaError_t e = cudaStreamQuery(d->stream);
    if (e != cudaSuccess)
        (void)cudaGetLastError(); /* cudaErrorNotReady */
    return e == cudaSuccess;
}

kva_status serve_dev_elapsed(serve_dev *d, int32_t a, int32_t b, double *sec)
{
    float ms = 0.f;
    cudaError_t e = cudaEventElapsedTime(&ms, d->ev[a], d->ev[b]);
    if (e != cudaSuccess)
        return fail(d, "cudaEventElapsedTime", e);
    *sec = (double)ms * 1e-3;
    return KVA_STATUS_OK;
}

#else /* the CLI (or the test) is built without the CUDA runtime */

struct serve_dev {
    char err[256];
};

#define NO_CUDA                                                                                    \
    "this kvattn was built without the CUDA backend (configure with -DKVA_CUDA=ON on a machine "   \
    "with nvcc)"

int serve_dev_available(char *why, size_t n)
{
    snprintf(why, n, "%s", NO_CUDA);
    return 0;
}

static kva_status unavailable(serve_dev *d)
{
    if (d)
        snprintf(d->err, sizeof d->err, "%s", NO_CUDA);
    return KVA_STATUS_BACKEND_UNAVAILABLE;
}

kva_status serve_dev_create(int32_t num_events, serve_dev **out)
{
    (void)num_events;
    *out = calloc(1, sizeof **out);
    return *out ? unavailable(*out) : KVA_STATUS_OUT_OF_MEMORY;
}

void serve_dev_destroy(serve_dev *d)
{
    free(d);
}

const char *serve_dev_error(const serve_dev *d)
{
    return d ? d->err : "";
}

void *serve_dev_stream(serve_dev *d)
{
    (void)d;
    return NULL;
}

void serve_dev_name(char *name, size_t n)
{
    snprintf(name, n, "no GPU");
}

kva_status serve_dev_alloc(serve_dev *d, size_t n, void **p)
{
    (void)n;
    *p = NULL;
    return unavailable(d);
}

void serve_dev_free(void *p)
{
    (void)p;
}

kva_status serve_dev_alloc_host(serve_dev *d, size_t n, void **p)
{
    (void)n;
    *p = NULL;
    return unavailable(d);
}

void serve_dev_free_host(void *p)
{
    (void)p;
}

kva_status serve_dev_upload(serve_dev *d, void *dst, const void *src, size_t n)
{
    (void)dst, (void)src, (void)n;
    return unavailable(d);
}

kva_status serve_dev_download(serve_dev *d, void *dst, const void *src, size_t n)
{
    (void)dst, (void)src, (void)n;
    return unavailable(d);
}

kva_status serve_dev_memset(serve_dev *d, void *p, int value, size_t n)
{
    (void)p, (void)value, (void)n;
    return unavailable(d);
}

kva_status serve_dev_record(serve_dev *d, int32_t i)
{
    (void)i;
    return unavailable(d);
}

kva_status serve_dev_sync(serve_dev *d)
{
    return unavailable(d);
}

int serve_dev_query(serve_dev *d)
{
    (void)d;
    return 0;
}

kva_status serve_dev_elapsed(serve_dev *d, int32_t a, int32_t b, double *sec)
{
    (void)a, (void)b;
    *sec = 0.0;
    return unavailable(d);
}

#endif
