/*
 * vnni_ports.c - throughput of 512-bit vpdpbusd, vpdpwssd and vfmadd231ps,
 * alone and interleaved 1:1, on one core: settles whether the CPU issues
 * 512-bit VNNI on one port or two (the question of the journal's session-35
 * section "CPU int8 decode at GQA 4"). 12 independent accumulator chains
 * per kind (the FMA chains run on integer bit patterns: only the rate
 * matters); reports instructions per ns and the ratio to the FMA-alone
 * rate (best of 3 runs each). VNNI alone at ~0.5x the FMA rate means one
 * 512-bit VNNI port; the 1:1 mix with FMA then runs at ~0.67x if that port
 * is one of the two FMA ports, and the mix with vpermd (a shuffle port) shows
 * whether VNNI takes the shuffle port.
 * Build: gcc -O2 -mavx512f -mavx512vnni -o vnni_ports dev/cpuq28/vnni_ports.c
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 10000000L

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One instruction on a 12-register chain set, written out so that the
 * accumulators stay in registers. */
#define OP(ins, r) __asm__ volatile(ins " %1, %2, %0" : "+v"(r) : "v"(x), "v"(y))
#define LOOP(I0, I1)                                                                               \
    for (long it = 0; it < ITERS; it++) {                                                          \
        OP(I0, a0);                                                                                \
        OP(I1, a1);                                                                                \
        OP(I0, a2);                                                                                \
        OP(I1, a3);                                                                                \
        OP(I0, a4);                                                                                \
        OP(I1, a5);                                                                                \
        OP(I0, a6);                                                                                \
        OP(I1, a7);                                                                                \
        OP(I0, a8);                                                                                \
        OP(I1, a9);                                                                                \
        OP(I0, a10);                                                                               \
        OP(I1, a11);                                                                               \
    }

/* kind 0: vpdpbusd, 1: vpdpwssd, 2: vfmadd231ps, 3: vpdpbusd + vfmadd231ps 1:1,
 * 4: vpdpbusd + vpermd (a shuffle-port instruction) 1:1 */
static double run(int kind, float *sink)
{
    const __m512i x = _mm512_set1_epi32(0x01020304), y = _mm512_set1_epi32(0x01010101);
    __m512i a0 = x, a1 = y, a2 = x, a3 = y, a4 = x, a5 = y, a6 = x, a7 = y, a8 = x, a9 = y, a10 = x,
            a11 = y;
    const double t0 = now();
    if (kind == 0)
        LOOP("vpdpbusd", "vpdpbusd")
    else if (kind == 1)
        LOOP("vpdpwssd", "vpdpwssd")
    else if (kind == 2)
        LOOP("vfmadd231ps", "vfmadd231ps")
    else if (kind == 3)
        LOOP("vpdpbusd", "vfmadd231ps")
    else
        LOOP("vpdpbusd", "vpermd")
    const double t = now() - t0;
    const __m512i s = _mm512_add_epi32(
        _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
        _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)),
                         _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11))));
    *sink += (float)_mm512_reduce_add_epi32(s);
    return (double)ITERS * 12 / t / 1e9; /* instructions per ns */
}

int main(void)
{
    static const char *names[5] = {"vpdpbusd zmm", "vpdpwssd zmm", "vfmadd231ps zmm",
                                   "vpdpbusd + vfmadd 1:1", "vpdpbusd + vpermd 1:1"};
    float sink = 0;
    double r[5];
    for (int k = 0; k < 5; k++) /* the best of 3: other processes only slow a run down */
        for (int rep = 0; rep < 3; rep++) {
            const double x = run(k, &sink);
            r[k] = rep == 0 || x > r[k] ? x : r[k];
        }
    for (int k = 0; k < 5; k++)
        printf("%-24s %.3f instr/ns  (%.2f x vfmadd231ps alone)\n", names[k], r[k], r[k] / r[2]);
    return sink == 12345.0f;
}
