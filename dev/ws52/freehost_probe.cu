/*
 * dev/ws52/freehost_probe.cu - does cudaFreeHost wait for queued work? (ws52: the planted fault
 * F2, "the large staging ring's growth frees its old halves without waiting for their copies",
 * passed test_update_grow_pad on the H200.) The CUDA runtime reference documents no wait for
 * cudaFreeHost; this measures it. A kernel spins ~spin_ms on a non-blocking stream, then:
 *   copy:  a 4 MiB cudaMemcpyAsync from pinned buffer A is queued behind the spin, A is freed;
 *   other: nothing reads pinned buffer B, B is freed while the spin runs;
 * each prints how long cudaFreeHost took and whether the stream was idle when it returned.
 * Build: nvcc -O2 -arch=sm_90a dev/ws52/freehost_probe.cu -o /tmp/fhp && /tmp/fhp
 */
#include <cstdio>
#include <chrono>
#include <cuda_runtime.h>

__global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static double ms_since(std::chrono::steady_clock::time_point t)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

int main()
{
    int clk_khz = 0;
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0);
    const double spin_ms = 200.0;
    const long long cycles = (long long)(spin_ms * clk_khz);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const size_t n = 4u << 20;
    void *dev = nullptr;
    cudaMalloc(&dev, n);
    spin<<<1, 1, 0, s>>>(1000); /* warm up: module load */
    cudaStreamSynchronize(s);
    for (int round = 0; round < 2; round++)
        for (int copy = 1; copy >= 0; copy--) {
            void *host = nullptr;
            cudaMallocHost(&host, n);
            spin<<<1, 1, 0, s>>>(cycles);
            if (copy)
                cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s);
            const auto t = std::chrono::steady_clock::now();
            const cudaError_t e = cudaFreeHost(host);
            const double ms = ms_since(t);
            const cudaError_t q = cudaStreamQuery(s);
            printf("freehost_probe round %d %-5s: cudaFreeHost %s after %.1f ms (spin %.0f ms); "
                   "stream %s at its return\n",
                   round, copy ? "copy" : "other", cudaGetErrorString(e), ms, spin_ms,
                   q == cudaSuccess ? "idle (the free waited)" : "busy (the free did not wait)");
            cudaStreamSynchronize(s);
        }
    printf("freehost_probe: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
