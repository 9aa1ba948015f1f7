/*
 * copy_probe.cu - issue 23 (host37): what a decode plan's staging fill and
 * metadata copy cost the host inside a serving step, by variant, in one
 * process. Each iteration is a step's shape: L small kernels and a
 * synchronize (serve-sim's step ends so), then a plan's upload: ~17 KB
 * written into a 32 KiB slot of pinned staging (256 records of 40 B, as the
 * work items, and a 7.5 KB block-table memcpy) and one 32 KiB
 * cudaMemcpyAsync of the slot. Slots cycle through 8 x 32 KiB (the hot
 * ring's two 128 KiB halves), so each was read by the copy engine 8 uploads
 * ago. Variants (medians in us of the timed parts):
 *   tight        no kernels before (only the previous copy's synchronize)
 *   step         L kernels + synchronize before            (serve-sim's case)
 *   step+event   the same, then an event record (timed) before the fill:
 *                does a cheap first enqueue take over part of the copy?
 *   step+query   the same with a stream query instead
 *   step clean   no fill: the copy of bytes the host did not just write
 *   step wc      staging allocated write-combined (cudaHostAllocWriteCombined)
 *   step pfw     the slot's lines prefetched for writing (prefetchw) 3 us
 *                before the fill (as at the plan's start, before its checks)
 *   step 1slot   always the same slot
 *   step heap    the fill into ordinary (never copied) heap memory, no copy
 *
 *   nvcc -O2 -arch=sm_90a -o copy_probe dev/host37/copy_probe.cu && ./copy_probe [L]
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
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
    if (v.empty())
        return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void spin_us(double us)
{
    const double t = now_us() + us;
    while (now_us() < t) {
    }
}

struct rec {
    int32_t a[10];
};

/* The plan's fill: 256 records of 40 B from a 48 B source, and a 7.5 KB memcpy. */
static void fill(char *dst, const int32_t *items, const int32_t *bt, int step)
{
    rec *it = (rec *)dst;
    for (int i = 0; i < 256; i++) {
        rec x;
        memcpy(x.a, items + 12 * i, 40);
        x.a[7] += step;
        it[i] = x;
    }
    memcpy(dst + 10240 + 2048, bt, 32 * 60 * 4);
}

enum { T_TIGHT, T_STEP, T_EVENT, T_QUERY, T_CLEAN, T_WC, T_PFW, T_1SLOT, T_HEAP, T_N };
static const char *names[T_N] = {"tight",   "step",     "step+event", "step+query", "step clean",
                                 "step wc", "step pfw", "step 1slot", "step heap"};

int main(int argc, char **argv)
{
    const int L = argc > 1 ? atoi(argv[1]) : 20, N = 300;
    const size_t SLOT = 32 << 10, RING = 8 * SLOT;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("copy_probe: %s, %d kernels per step, %d iterations per variant\n", prop.name, L, N);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *pin = nullptr, *wc = nullptr, *dev = nullptr, *work = nullptr;
    CK(cudaMallocHost(&pin, RING));
    CK(cudaHostAlloc(&wc, RING, cudaHostAllocWriteCombined));
    CK(cudaMalloc(&dev, SLOT));
    CK(cudaMalloc(&work, 4096));
    char *heap = (char *)aligned_alloc(4096, RING);
    memset(pin, 1, RING);
    memset(wc, 1, RING);
    memset(heap, 1, RING);
    std::vector<int32_t> items(12 * 256), bt(32 * 60);
    for (size_t i = 0; i < items.size(); i++)
        items[i] = (int32_t)(i * 7);
    for (size_t i = 0; i < bt.size(); i++)
        bt[i] = (int32_t)i;
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    printf("%-11s %9s %9s %9s %9s\n", "variant", "before_us", "fill_us", "copy_us", "sum_us");
    for (int round = 0; round < 2; round++)
        for (int v = 0; v < T_N; v++) {
            std::vector<double> b, f, c;
            for (int it = 0; it < N + 20; it++) {
                if (v != T_TIGHT)
                    for (int k = 0; k < L; k++)
                        CK(cudaMemsetAsync(work, k, 4096, s));
                CK(cudaStreamSynchronize(s));
                char *base = v == T_WC ? wc : v == T_HEAP ? heap : pin;
                char *slot = base + (v == T_1SLOT ? 0 : (size_t)(it % 8) * SLOT);
                double t0 = now_us();
                if (v == T_EVENT)
                    CK(cudaEventRecord(ev, s));
                else if (v == T_QUERY)
                    (void)cudaStreamQuery(s);
                double t1 = now_us();
                if (v == T_PFW) {
                    for (size_t o = 0; o < 17 * 1024; o += 64)
                        __builtin_prefetch(slot + o, 1, 3);
                    spin_us(3.0);
                    t1 = now_us();
                }
                if (v != T_CLEAN)
                    fill(slot, items.data(), bt.data(), it);
                double t2 = now_us();
                if (v != T_HEAP)
                    CK(cudaMemcpyAsync(dev, slot, SLOT, cudaMemcpyHostToDevice, s));
                double t3 = now_us();
                if (it >= 20) {
                    b.push_back(t1 - t0 - (v == T_PFW ? 3.0 : 0.0));
                    f.push_back(t2 - t1);
                    c.push_back(t3 - t2);
                }
            }
            CK(cudaStreamSynchronize(s));
            const double mb = v == T_PFW ? 0.0 : med(b);
            printf("%-11s %9.2f %9.2f %9.2f %9.2f%s\n", names[v], mb, med(f), med(c),
                   mb + med(f) + med(c), round ? "  (round 2)" : "");
        }
    return 0;
}
