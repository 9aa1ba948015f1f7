/*
 * copy_sweep.cu - host time of one host-to-device metadata copy by size, on
 * an idle stream (as a serving step's plan finds it after the previous
 * step's synchronize): cudaMemcpyAsync from pinned memory, the driver's
 * cuMemcpyHtoDAsync, and a one-node graph that copies the same bytes; and
 * the device time of the copy (events). Dev-only (issue 23, host28): does a
 * copy above some size take a cheaper host path (DMA from the pinned source
 * instead of the bytes going through the driver), so that padding a plan's
 * upload would cost the host less? Prints medians in us.
 *
 *   nvcc -O2 -arch=sm_90a -o copy_sweep dev/host28/copy_sweep.cu -lcuda && ./copy_sweep
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define CKD(x)                                                                                     \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_);           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static double now_us()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static double med(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    const size_t KB = 1024;
    const size_t sizes[] = {1 * KB,  4 * KB,  8 * KB,  16 * KB,  24 * KB,  32 * KB,  48 * KB,
                            64 * KB, 65 * KB, 96 * KB, 128 * KB, 192 * KB, 256 * KB, 512 * KB};
    const int NS = sizeof sizes / sizeof sizes[0];
    const size_t MAXB = 512 * KB;
    const int N = 400;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("copy_sweep: %s\n", prop.name);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *pin = nullptr, *dev = nullptr;
    CK(cudaMallocHost(&pin, 2 * MAXB));
    CK(cudaMalloc(&dev, MAXB));
    memset(pin, 1, 2 * MAXB);
    cudaEvent_t g0, g1;
    CK(cudaEventCreate(&g0));
    CK(cudaEventCreate(&g1));
    /* One graph per size: a memcpy node from the pinned staging to dev. */
    std::vector<cudaGraphExec_t> gx(NS);
    for (int i = 0; i < NS; i++) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CK(cudaMemcpyAsync(dev, pin, sizes[i], cudaMemcpyHostToDevice, s));
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&gx[i], g, 0));
        CK(cudaGraphDestroy(g));
    }
    printf("size_KB  rt_memcpy_us  drv_memcpy_us  graph_launch_us  dev_copy_us (medians of %d)\n",
           N);
    for (int i = 0; i < NS; i++) {
        std::vector<double> a, b, c, d;
        for (int it = 0; it < N + 20; it++) {
            char *src = pin + (it & 1) * MAXB; /* alternate halves, as the staging ring */
            double t0 = now_us();
            CK(cudaMemcpyAsync(dev, src, sizes[i], cudaMemcpyHostToDevice, s));
            double t1 = now_us();
            CK(cudaStreamSynchronize(s));
            double t2 = now_us();
            CKD(cuMemcpyHtoDAsync((CUdeviceptr)dev, src, sizes[i], (CUstream)s));
            double t3 = now_us();
            CK(cudaStreamSynchronize(s));
            double t4 = now_us();
            CK(cudaGraphLaunch(gx[i], s));
            double t5 = now_us();
            CK(cudaStreamSynchronize(s));
            float ms = 0;
            CK(cudaEventRecord(g0, s));
            CK(cudaMemcpyAsync(dev, src, sizes[i], cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(g1, s));
            CK(cudaEventSynchronize(g1));
            CK(cudaEventElapsedTime(&ms, g0, g1));
            if (it >= 20) {
                a.push_back(t1 - t0);
                b.push_back(t3 - t2);
                c.push_back(t5 - t4);
                d.push_back(ms * 1e3);
            }
        }
        printf("%7zu  %12.2f  %13.2f  %15.2f  %11.2f\n", sizes[i] / KB, med(a), med(b), med(c),
               med(d));
    }
    return 0;
}
