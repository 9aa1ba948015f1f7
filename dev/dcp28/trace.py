#!/usr/bin/env python3
"""dev/dcp28/trace.py TREE - dev/dyn27/trace.py with anchors for both the count of
main (all threads fence, atomicAdd) and of dcp28 (one thread's acquire-release atomic). Turns a kvattn source tree into the dev trace build of the 16-bit
tensor-core decode (never merged): per CTA %globaltimer stamps (decode_mma_kernel.cuh), their dump
(decode_mma.cu: kva__dm_trace_dump) and host costs of the run path's runtime calls
(kva__dm_host_costs), called by bench_cuda after its back-to-back runs. Anchored insertions, so it
applies to main and to branches that keep the anchors; fails loudly otherwise."""
import sys
T = sys.argv[1]
def edit(path, pairs):
    s = open(path).read()
    for anchor, new in pairs:
        for alt in ALT.get(anchor, []):
            if s.count(anchor) == 1:
                break
            anchor, new = alt
        assert s.count(anchor) == 1, (path, anchor)
        s = s.replace(anchor, new)
    if path.endswith("decode_mma_kernel.cuh"):
        for anchor, new in OPT.items():
            if s.count(anchor) == 1:
                s = s.replace(anchor, new)
    open(path, "w").write(s)
OPT = {  # optional anchors: the merge's copies landed (12), a spread merge's helper went (13), merged (14)
    "                __syncthreads();\n                if (s_go)\n":
    "                __syncthreads();\n                DM_TR(13);\n                if (s_go)\n",
    "                                                          a.H, a.G, D, sl);\n            }\n        }\n":
    "                                                          a.H, a.G, D, sl);\n                DM_TR(14);\n            }\n        }\n",
    "        kva__mbar_wait(bar, ph); /* the copy landed, visible to every thread */\n":
    "        kva__mbar_wait(bar, ph); /* the copy landed, visible to every thread */\n        DM_TR(12);\n",
    "    __syncthreads(); /* every thread's copies landed */\n":
    "    __syncthreads(); /* every thread's copies landed */\n    DM_TR(12);\n",
}
ALT = {  # anchor of main 8c09eda: [(anchor, new) of later trees, tried in order]
    "                s_last = atomicAdd(done, 1) == nsplit - 1;\n            __syncthreads();\n":
    [("                s_last = dm_count_acq_rel(done) == nsplit - 1;\n            __syncthreads();\n",
      "                s_last = dm_count_acq_rel(done) == nsplit - 1;\n            __syncthreads();\n            DM_TR(6);\n"
      "            if (threadIdx.x == 0 && blockIdx.x < DM_TR_CTAS)\n                dm_trace[blockIdx.x * DM_TR_N + 8] = s_last;\n"),
     ("                s_word = old;\n            }\n            __syncthreads();\n",
      "                s_word = old;\n            }\n            __syncthreads();\n            DM_TR(6);\n"
      "            if (threadIdx.x == 0 && blockIdx.x < DM_TR_CTAS)\n                dm_trace[blockIdx.x * DM_TR_N + 8] = s_last;\n")],
    "            if (s_last) {\n                __threadfence();\n":
    [("            if (s_last) {\n                /* From shared memory",
      "            if (s_last) {\n                DM_TR(9);\n                /* From shared memory"),
     ("            if (s_last) {\n                /* The slices this CTA merges",
      "            if (s_last) {\n                DM_TR(9);\n                /* The slices this CTA merges")],
    "                if (threadIdx.x == 0) {\n                    atomicExch(done, 0);":
    [("                if (threadIdx.x == 0) {\n                    if (!spread)\n                        atomicExch(done, 0);",
      "                DM_TR(10);\n                if (threadIdx.x == 0) {\n                    if (!spread)\n                        atomicExch(done, 0);")],
}
K = T + "/src/attn/cuda/decode_mma_kernel.cuh"
DEFS = '/* dev/dyn27 trace: per CTA %globaltimer stamps (ns) of the last launch,\n * DM_TR_N slots per CTA (11: thread 0 merged the warps\' first row): 0 entry, 1 after griddepcontrol.wait, 2 warp 0\'s\n * first step landed, 3 warp 0\'s key loop end, 4 every warp\'s loop end (the\n * barrier after the O stores), 5 out/partial written, 6 after the task\'s\n * count, 7 item end (after a merge), 8 1 if this CTA merged its task, 9 the\n * merger after its fence, 10 the merger after the merge\'s loads and stores\n * were issued (before its reset atomics). */\n#define DM_TR_N 16\n#define DM_TR_CTAS 4096\nstatic __device__ unsigned long long dm_trace[DM_TR_CTAS * DM_TR_N];\nstatic __device__ __forceinline__ unsigned long long dm_now()\n{\n    unsigned long long t;\n    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n    return t;\n}\n#define DM_TR(i)                                                                                  \\\n    do {                                                                                          \\\n        if (threadIdx.x == 0 && blockIdx.x < DM_TR_CTAS)                                          \\\n            dm_trace[blockIdx.x * DM_TR_N + (i)] = dm_now();                                      \\\n    } while (0)\n\n'
edit(K, [
    ("#define DM_UNIT 64", DEFS + "#define DM_UNIT 64"),
    ("    kva__pdl_wait();\n    /* The CTA's first item record",
     "    DM_TR(0);\n    kva__pdl_wait();\n    DM_TR(1);\n    bool tr_landed = false;\n    /* The CTA's first item record"),
    ("            __syncwarp(); /* the other lanes' copies of this step have landed */\n",
     "            __syncwarp(); /* the other lanes' copies of this step have landed */\n"
     "            if (!tr_landed) {\n                DM_TR(2);\n                tr_landed = true;\n            }\n"),
    ("        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */\n",
     "        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */\n        DM_TR(3);\n"),
    ("                first_steps(wn);\n        }\n        __syncthreads();\n",
     "                first_steps(wn);\n        }\n        __syncthreads();\n        DM_TR(4);\n"),
    ("        if (w.task >= 0) {\n            /* Publish the partial",
     "        DM_TR(5);\n        if (w.task >= 0) {\n            /* Publish the partial"),
    ("                s_last = atomicAdd(done, 1) == nsplit - 1;\n            __syncthreads();\n",
     "                s_last = atomicAdd(done, 1) == nsplit - 1;\n            __syncthreads();\n            DM_TR(6);\n"
     "            if (threadIdx.x == 0 && blockIdx.x < DM_TR_CTAS)\n                dm_trace[blockIdx.x * DM_TR_N + 8] = s_last;\n"),
    ("            if (s_last) {\n                __threadfence();\n",
     "            if (s_last) {\n                __threadfence();\n                DM_TR(9);\n"),
    ("                if (threadIdx.x == 0) {\n                    atomicExch(done, 0);",
     "                DM_TR(10);\n                if (threadIdx.x == 0) {\n                    atomicExch(done, 0);"),
    ("            kva__dmma_merge<DM_NW, DM_M, D, WS, CW>(s_m, s_l, s_acc, r, d, M, mu, L, O);\n",
     "            kva__dmma_merge<DM_NW, DM_M, D, WS, CW>(s_m, s_l, s_acc, r, d, M, mu, L, O);\n            if (x == (int32_t)threadIdx.x)\n                DM_TR(11);\n"),
    ("        __syncthreads(); /* Q, s_acc (and without OVL the rings) are rewritten by the next item */\n",
     "        __syncthreads(); /* Q, s_acc (and without OVL the rings) are rewritten by the next item */\n        DM_TR(7);\n"),
])
with open(T + "/src/attn/cuda/decode_mma.cu", "a") as f:
    f.write('\n/* dev/dyn27 trace dump: reset (clears the 16-bit decode\'s stamps) or prints\n * per stamp the min / median / max over the CTAs that ran, in us from the\n * earliest entry, and the merging CTAs\' count-to-end. */\n#include <algorithm>\n#include <string.h>\n#include <stdio.h>\n#include <vector>\nextern "C" int kva__dm_trace_dump(const char *tag, int reset)\n{\n    static unsigned long long h[DM_TR_CTAS * DM_TR_N];\n    if (reset) {\n        memset(h, 0, sizeof h);\n        return cudaMemcpyToSymbol(dm_trace, h, sizeof h) == cudaSuccess ? 0 : 1;\n    }\n    if (cudaMemcpyFromSymbol(h, dm_trace, sizeof h) != cudaSuccess)\n        return 1;\n    unsigned long long t0 = ~0ull;\n    int n = 0;\n    for (int b = 0; b < DM_TR_CTAS; b++)\n        if (h[b * DM_TR_N]) {\n            n++;\n            t0 = std::min(t0, h[b * DM_TR_N]);\n        }\n    static const char *names[8] = {"entry", "waited", "landed", "w0 loop end", "cta loop end",\n                                   "written", "counted", "end"};\n    printf("dm_trace %s: %d CTAs (us from the first entry: min p10 p50 p90 max)\\n", tag, n);\n    for (int i = 0; i < 8; i++) {\n        std::vector<double> v;\n        for (int b = 0; b < DM_TR_CTAS; b++)\n            if (h[b * DM_TR_N] && h[b * DM_TR_N + i])\n                v.push_back((double)(h[b * DM_TR_N + i] - t0) * 1e-3);\n        if (v.empty())\n            continue;\n        std::sort(v.begin(), v.end());\n        const size_t m = v.size();\n        printf("dm_trace %s: %-13s n %4zu  %8.2f %8.2f %8.2f %8.2f %8.2f\\n", tag, names[i], m, v[0],\n               v[m / 10], v[m / 2], v[(9 * m) / 10], v[m - 1]);\n    }\n    for (int b = 0; b < DM_TR_CTAS; b++)\n        if (h[b * DM_TR_N] && h[b * DM_TR_N + 8])\n            printf("dm_trace %s: merge cta %4d  loop end %8.2f wmerged %8.2f written %8.2f counted %8.2f fenced "\n                   "%8.2f landed %8.2f merged %8.2f end %8.2f\\n",\n                   tag, b, (double)(h[b * DM_TR_N + 4] - t0) * 1e-3, (double)(h[b * DM_TR_N + 11] - t0) * 1e-3,\n                   (double)(h[b * DM_TR_N + 5] - t0) * 1e-3, (double)(h[b * DM_TR_N + 6] - t0) * 1e-3,\n                   (double)(h[b * DM_TR_N + 9] - t0) * 1e-3, (double)(h[b * DM_TR_N + 12] - t0) * 1e-3, (double)(h[b * DM_TR_N + 10] - t0) * 1e-3,\n                   (double)(h[b * DM_TR_N + 7] - t0) * 1e-3);\n    for (int b = 0; b < DM_TR_CTAS; b++)\n        if (h[b * DM_TR_N] && h[b * DM_TR_N + 13])\n            printf("dm_trace %s: help cta %4d  loop end %8.2f counted %8.2f go %8.2f merged %8.2f end %8.2f\\n", tag, b,\n                   (double)(h[b * DM_TR_N + 4] - t0) * 1e-3, (double)(h[b * DM_TR_N + 6] - t0) * 1e-3,\n                   (double)(h[b * DM_TR_N + 13] - t0) * 1e-3, (double)(h[b * DM_TR_N + 14] - t0) * 1e-3,\n                   (double)(h[b * DM_TR_N + 7] - t0) * 1e-3);\n    return 0;\n}\n\n/* dev/dyn27: host microseconds per call of the run path\'s runtime calls\n * (medians of 200), and of an empty kernel\'s launch with and without the\n * programmatic-dependent attribute. */\n#include <chrono>\nstatic __global__ void dm_empty_kernel(kva__cuda_attn_args) {}\nextern "C" void kva__dm_host_costs(const kva__cuda_attn_args *a)\n{\n    auto now = [] { return std::chrono::steady_clock::now(); };\n    auto us = [](std::chrono::steady_clock::time_point x, std::chrono::steady_clock::time_point y) {\n        return std::chrono::duration<double, std::micro>(y - x).count();\n    };\n    const int n = 200;\n    std::vector<double> t[6];\n    for (int i = 0; i < n; i++) {\n        cudaStreamCaptureStatus cs;\n        int dev;\n        auto t0 = now();\n        (void)cudaStreamIsCapturing(0, &cs);\n        auto t1 = now();\n        (void)cudaGetDevice(&dev);\n        auto t2 = now();\n        (void)cudaGetLastError();\n        auto t3 = now();\n        (void)dm_launch_go(dm_empty_kernel, 256, 0, 0, *a, 1);\n        auto t4 = now();\n        (void)dm_launch_go(dm_empty_kernel, 256, 0, 0, *a, 0);\n        auto t5 = now();\n        (void)dm_launch_go(dm_empty_kernel, 256, 0, 0, *a, 0);\n        auto t6 = now();\n        t[0].push_back(us(t0, t1));\n        t[1].push_back(us(t1, t2));\n        t[2].push_back(us(t2, t3));\n        t[3].push_back(us(t3, t4));\n        t[4].push_back(us(t4, t5));\n        t[5].push_back(us(t5, t6));\n        if (i % 8 == 7)\n            (void)cudaDeviceSynchronize();\n    }\n    static const char *names[6] = {"cudaStreamIsCapturing", "cudaGetDevice", "cudaGetLastError",\n                                   "launch empty (PDL attr)", "launch empty (no attr)",\n                                   "launch empty (no attr) again"};\n    for (int k = 0; k < 6; k++) {\n        std::sort(t[k].begin(), t[k].end());\n        printf("dm_host %-30s median %.3f us, p10 %.3f, p90 %.3f\\n", names[k], t[k][n / 2],\n               t[k][n / 10], t[k][(9 * n) / 10]);\n    }\n    printf("dm_host sizeof(kva__cuda_attn_args) %zu bytes\\n", sizeof(kva__cuda_attn_args));\n    (void)cudaDeviceSynchronize();\n}\n')
edit(T + "/bench/bench_cuda.c", [('    const float b2b_ms = bench_median(b2b, 5);\n', '    const float b2b_ms = bench_median(b2b, 5);\n' + '\n    {\n        /* dev/dyn27 trace: one call on an idle GPU, then the last of 4 back to back. */\n        extern int kva__dm_trace_dump(const char *tag, int reset);\n        for (int rep = 0; rep < 2; rep++) {\n            CU(cudaDeviceSynchronize());\n            kva__dm_trace_dump(NULL, 1);\n            CU(cudaDeviceSynchronize());\n            struct timespec ts = {0, 2000000};\n            nanosleep(&ts, NULL);\n            CU(cudaEventRecord(ev[0], 0));\n            KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));\n            CU(cudaEventRecord(ev[1], 0));\n            CU(cudaEventSynchronize(ev[1]));\n            float one = 0.f;\n            CU(cudaEventElapsedTime(&one, ev[0], ev[1]));\n            printf("dm_trace per call %d: event time %.2f us\\n", rep, one * 1e3);\n            kva__dm_trace_dump(rep ? "per call 1" : "per call 0", 0);\n        }\n        kva__dm_trace_dump(NULL, 1);\n        CU(cudaDeviceSynchronize());\n        for (int it = 0; it < 4; it++)\n            KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));\n        CU(cudaDeviceSynchronize());\n        kva__dm_trace_dump("b2b (the 4th of 4)", 0);\n    }\n    {\n        /* dev/dyn27: the run path\'s runtime calls on the host (an empty kernel\'s launch beside). */\n        extern void kva__dm_host_costs(const void *a);\n        static char args[4096];\n        kva__dm_host_costs(args);\n    }\n\n')])
print("trace.py: instrumented", T)
