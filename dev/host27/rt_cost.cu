/*
 * rt_cost.cu - host time of the CUDA runtime calls a kvattn plan build and a
 * quantized decode run make, one by one, on an idle stream (as a serving
 * step finds it after the previous step's synchronize), and the device time
 * of the plan's metadata copy by the copy engine vs by a kernel reading
 * mapped pinned memory. Dev-only (issue 23, host27); prints medians in us.
 *
 *   nvcc -O2 -arch=sm_90a -o rt_cost dev/host27/rt_cost.cu && ./rt_cost
 */
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

static double now_us()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

__global__ void empty_kernel(int *p)
{
    if (p && threadIdx.x == 1024)
        p[0] = 1;
}

/* Copies n 16-byte words from src (mapped pinned host memory) to dst. */
__global__ void pull_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void big_smem_kernel(int *p)
{
    extern __shared__ int s[];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (p)
        p[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

static double med(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    const int N = 2000;
    const size_t BYTES =
        17 * 1024; /* serve-sim decode step: header, requests, block table, items */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("rt_cost: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *pin = nullptr, *pin_wc = nullptr, *mapped = nullptr, *dev = nullptr;
    std::vector<char> pageable(BYTES * 4), src(BYTES);
    for (size_t i = 0; i < BYTES; i++)
        src[i] = (char)(i * 7);
    CK(cudaMallocHost(&pin, BYTES * 4));
    CK(cudaHostAlloc(&pin_wc, BYTES * 4, cudaHostAllocWriteCombined));
    CK(cudaHostAlloc(&mapped, BYTES * 4, cudaHostAllocMapped));
    CK(cudaMalloc(&dev, BYTES * 4));
    char *mapped_dev = nullptr;
    CK(cudaHostGetDevicePointer((void **)&mapped_dev, mapped, 0));
    cudaEvent_t ev[2], g0, g1;
    CK(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming));
    CK(cudaEventCreate(&g0));
    CK(cudaEventCreate(&g1));
    const int smem = 100 * 1024;
    CK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

    enum {
        FILL,
        MEMCPY_PIN,
        MEMCPY_PIN_1K,
        MEMCPY_PAGEABLE,
        MEMCPY_WC,
        EV_RECORD,
        EV_SYNC,
        IS_CAPTURING,
        GET_DEVICE,
        LAUNCH_EMPTY,
        LAUNCH_PULL,
        LAUNCH_EX_PDL,
        ATTR_OCC,
        OCC_ONLY,
        PLAN_SEQ,
        NOPS
    };
    const char *names[NOPS] = {"fill 17 KB staging (memcpy)",
                               "cudaMemcpyAsync 17 KB pinned H2D",
                               "cudaMemcpyAsync 1 KB pinned H2D",
                               "cudaMemcpyAsync 17 KB pageable H2D",
                               "cudaMemcpyAsync 17 KB write-comb.",
                               "cudaEventRecord",
                               "cudaEventSynchronize (done)",
                               "cudaStreamIsCapturing",
                               "cudaGetDevice",
                               "launch empty kernel <<<>>>",
                               "launch pull kernel (17 KB mapped)",
                               "cudaLaunchKernelEx PDL attr",
                               "FuncSetAttribute + occupancy query",
                               "occupancy query alone",
                               "plan sequence (main, per plan)"};
    std::vector<double> t[NOPS];
    int sink = 0;
    for (int it = 0; it < N + 50; it++) {
        for (int op = 0; op < NOPS; op++) {
            /* the op's precondition: an idle stream with a finished event */
            if (op == EV_SYNC) {
                CK(cudaEventRecord(ev[0], s));
                CK(cudaStreamSynchronize(s));
            }
            const double t0 = now_us();
            switch (op) {
            case FILL:
                memcpy(pin + (it & 3) * BYTES, src.data(), BYTES);
                break;
            case MEMCPY_PIN:
                CK(cudaMemcpyAsync(dev, pin, BYTES, cudaMemcpyHostToDevice, s));
                break;
            case MEMCPY_PIN_1K:
                CK(cudaMemcpyAsync(dev, pin, 1024, cudaMemcpyHostToDevice, s));
                break;
            case MEMCPY_PAGEABLE:
                CK(cudaMemcpyAsync(dev, pageable.data(), BYTES, cudaMemcpyHostToDevice, s));
                break;
            case MEMCPY_WC:
                CK(cudaMemcpyAsync(dev, pin_wc, BYTES, cudaMemcpyHostToDevice, s));
                break;
            case EV_RECORD:
                CK(cudaEventRecord(ev[1], s));
                break;
            case EV_SYNC:
                CK(cudaEventSynchronize(ev[0]));
                break;
            case IS_CAPTURING: {
                cudaStreamCaptureStatus cs;
                CK(cudaStreamIsCapturing(s, &cs));
                sink += (int)cs;
                break;
            }
            case GET_DEVICE: {
                int d = -1;
                CK(cudaGetDevice(&d));
                sink += d;
                break;
            }
            case LAUNCH_EMPTY:
                empty_kernel<<<1, 32, 0, s>>>(nullptr);
                break;
            case LAUNCH_PULL:
                pull_kernel<<<8, 256, 0, s>>>((const int4 *)mapped_dev, (int4 *)dev,
                                              (int)(BYTES / 16));
                break;
            case LAUNCH_EX_PDL: {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(1);
                cfg.blockDim = dim3(32);
                cfg.stream = s;
                cudaLaunchAttribute at[1] = {};
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, empty_kernel, (int *)nullptr));
                break;
            }
            case ATTR_OCC: {
                int n = 0;
                CK(cudaFuncSetAttribute(big_smem_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, big_smem_kernel, 128, smem));
                sink += n;
                break;
            }
            case OCC_ONLY: {
                int n = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, big_smem_kernel, 128, smem));
                sink += n;
                break;
            }
            case PLAN_SEQ: {
                /* main's per-plan runtime calls: device, capture check, fill,
                 * one copy, and every second plan an event record + wait */
                int d = -1;
                cudaStreamCaptureStatus cs;
                CK(cudaGetDevice(&d));
                CK(cudaStreamIsCapturing(s, &cs));
                if (it & 1)
                    CK(cudaEventSynchronize(ev[0]));
                memcpy(pin + (it & 3) * BYTES, src.data(), BYTES);
                CK(cudaMemcpyAsync(dev, pin + (it & 3) * BYTES, BYTES, cudaMemcpyHostToDevice, s));
                if (!(it & 1))
                    CK(cudaEventRecord(ev[0], s));
                break;
            }
            }
            const double t1 = now_us();
            if (it >= 50)
                t[op].push_back(t1 - t0);
            CK(cudaStreamSynchronize(s)); /* idle again, as after a step */
        }
    }
    CK(cudaGetLastError());
    printf("host time per call, median of %d (us):\n", N);
    for (int op = 0; op < NOPS; op++)
        printf("  %-38s %7.2f\n", names[op], med(t[op]));
    /* Device time of the metadata copy: DMA vs a kernel pulling mapped memory. */
    std::vector<double> gd, gk;
    for (int it = 0; it < 500; it++) {
        float ms = 0;
        CK(cudaEventRecord(g0, s));
        CK(cudaMemcpyAsync(dev, pin, BYTES, cudaMemcpyHostToDevice, s));
        CK(cudaEventRecord(g1, s));
        CK(cudaEventSynchronize(g1));
        CK(cudaEventElapsedTime(&ms, g0, g1));
        gd.push_back(ms * 1e3);
        CK(cudaEventRecord(g0, s));
        pull_kernel<<<8, 256, 0, s>>>((const int4 *)mapped_dev, (int4 *)dev, (int)(BYTES / 16));
        CK(cudaEventRecord(g1, s));
        CK(cudaEventSynchronize(g1));
        CK(cudaEventElapsedTime(&ms, g0, g1));
        gk.push_back(ms * 1e3);
    }
    printf(
        "device time of a 17 KB upload, median of 500 (us): copy engine %.2f | pull kernel %.2f\n",
        med(gd), med(gk));
    printf("(sink %d)\n", sink & 1);
    return 0;
}
