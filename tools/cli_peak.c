/*
 * cli_peak.c - the machine's measured fp32 FMA peak, the compute ceiling
 * `kvattn bench` prints GFLOP/s against.
 *
 * Each thread runs chains of independent fused multiply-adds on registers
 * (enough chains to cover the FMA latency on every FMA port), with the widest
 * vectors the CPU and OS support (kva__cpu_features_get): AVX-512, AVX2+FMA,
 * or a scalar fallback. One FMA counts as 2 FLOPs, as in the bench's counts.
 */
#include "cli.h"
#include "internal.h" /* kva__cpu_features_get */

#include <stddef.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVA_PEAK_X86 1
#endif

/* Independent accumulator chains: latency 4 x 2 FMA ports needs >= 8. */
#define CHAINS 12

#ifdef KVA_PEAK_X86
__attribute__((target("avx2,fma"))) static float fma_avx2(long n)
{
    __m256 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++)
        acc[k] = _mm256_set1_ps(0.001f * (float)k);
    const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < n; i++)
        for (int k = 0; k < CHAINS; k++)
            acc[k] = _mm256_fmadd_ps(acc[k], m, a);
    __m256 s = acc[0];
    for (int k = 1; k < CHAINS; k++)
        s = _mm256_add_ps(s, acc[k]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

__attribute__((target("avx512f"))) static float fma_avx512(long n)
{
    __m512 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++)
        acc[k] = _mm512_set1_ps(0.001f * (float)k);
    const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < n; i++)
        for (int k = 0; k < CHAINS; k++)
            acc[k] = _mm512_fmadd_ps(acc[k], m, a);
    __m512 s = acc[0];
    for (int k = 1; k < CHAINS; k++)
        s = _mm512_add_ps(s, acc[k]);
    return _mm512_reduce_add_ps(s);
}
#endif

/* Scalar chains (the compiler may or may not fuse them; a floor, not a peak). */
static float fma_scalar(long n)
{
    float acc[CHAINS];
    for (int k = 0; k < CHAINS; k++)
        acc[k] = 0.001f * (float)k;
    for (long i = 0; i < n; i++)
        for (int k = 0; k < CHAINS; k++)
            acc[k] = acc[k] * 0.9999999f + 1e-7f;
    float s = 0;
    for (int k = 0; k < CHAINS; k++)
        s += acc[k];
    return s;
}

double kva_cli_measure_fma_peak(int num_threads, const char **isa)
{
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    int width = 1; /* floats per FMA */
    *isa = "scalar";
#ifdef KVA_PEAK_X86
    if (f.avx512f) {
        width = 16;
        *isa = "avx512";
    } else if (f.avx2 && f.fma) {
        width = 8;
        *isa = "avx2+fma";
    }
#endif
    if (num_threads < 1)
        num_threads = 1;
    const long n = 4000000; /* ~50 ms per pass on a 3 GHz core */
    double best = 0.0;
    volatile float sink = 0;
    for (int pass = 0; pass < 3; pass++) {
        float total = 0;
        int used = 1;
        double t0 = kva_cli_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads) reduction(+ : total)
#endif
        {
#ifdef _OPENMP
#pragma omp master
            used = omp_get_num_threads();
#endif
#ifdef KVA_PEAK_X86
            if (width == 16)
                total += fma_avx512(n);
            else if (width == 8)
                total += fma_avx2(n);
            else
                total += fma_scalar(n);
#else
            total += fma_scalar(n);
#endif
        }
        double dt = kva_cli_now() - t0;
        sink += total;
        double flops = 2.0 * width * CHAINS * (double)n * used;
        if (dt > 0 && flops / dt / 1e9 > best)
            best = flops / dt / 1e9;
    }
    (void)sink;
    return best;
}
