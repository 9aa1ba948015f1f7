/*
 * kq_bench.c - kq62: the cost of one preparation of the VNNI int8 key
 * scores' query digits, the library's kva__cpu_kq_prepare_avx512 against the
 * scalar definition it replaced (tests/kq_scalar.h), for M rows of D = 128
 * (M = the GQA group of a decode item), with and without key offsets.
 * Alternates the two, 11 rounds of 20000 calls each; prints per call the
 * median and the minimum over rounds in ns (the minimum: the least disturbed
 * by other work on a shared machine). Build (x86-64 with AVX-512; the scalar without FMA flags, as
 * before): cc -O2 -Iinclude -Isrc/core -Itests dev/kq62/kq_bench.c build/libkvattn.a -fopenmp -lm
 * -o /tmp/kq_bench
 */
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"
#include "kq_scalar.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*kq_fn)(const float *, int32_t, int32_t, const float *, int8_t *, float *, int32_t *);

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e9 * (double)t.tv_sec + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    enum { D = 128, MAXM = 16, CALLS = 20000, ROUNDS = 11 };
    static float q[MAXM * D], koff[D], qk[MAXM * 2];
    static int8_t qi[MAXM * 3 * D];
    static int32_t qc[MAXM * 4];
    srand(1);
    for (int i = 0; i < MAXM * D; i++)
        q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < D; i++)
        koff[i] = (float)rand() / RAND_MAX;
    const int Ms[] = {1, 4, 8, 16};
    const kq_fn fn[2] = {kq_prepare_scalar, kva__cpu_kq_prepare_avx512};
    printf("%-3s %-8s | %10s %10s %6s | %10s %10s %6s\n", "M", "offsets", "scalar med",
           "avx512 med", "x", "scalar min", "avx512 min", "x");
    for (int mi = 0; mi < 4; mi++)
        for (int o = 0; o < 2; o++) {
            double t[2][ROUNDS];
            for (int r = 0; r < ROUNDS; r++)
                for (int f = 0; f < 2; f++) {
                    const double t0 = now_ns();
                    int ok = 0;
                    for (int c = 0; c < CALLS; c++) {
                        ok += fn[f](q, Ms[mi], D, o ? koff : NULL, qi, qk, qc);
                        __asm__ volatile("" ::: "memory");
                    }
                    t[f][r] = (now_ns() - t0) / CALLS;
                    if (ok != CALLS)
                        return 1;
                }
            qsort(t[0], ROUNDS, sizeof(double), cmp);
            qsort(t[1], ROUNDS, sizeof(double), cmp);
            printf("%-3d %-8s | %10.1f %10.1f %6.1f | %10.1f %10.1f %6.1f\n", Ms[mi],
                   o ? "yes" : "no", t[0][ROUNDS / 2], t[1][ROUNDS / 2],
                   t[0][ROUNDS / 2] / t[1][ROUNDS / 2], t[0][0], t[1][0], t[0][0] / t[1][0]);
        }
    return 0;
}
