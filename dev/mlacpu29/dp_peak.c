/* dev/mlacpu29/dp_peak.c - one core's vdpbf16ps rate (instructions per ns), 16 independent
 * accumulators: operands in registers; the second operand a dword broadcast from memory by
 * vpbroadcastd (what gcc emits for _mm512_set1_epi32(*p)); the same by the instruction's embedded
 * {1to16} broadcast (inline asm); and the fp32 FMA for comparison. Thread CPU time, five rounds.
 * gcc -O3 -mavx512f -mavx512bf16 dp_peak.c -o /tmp/dp_peak && /tmp/dp_peak */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define DPB(acc, q, p) __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(p)))
int main(void)
{
    const long N = 100000000 / 16;
    static unsigned int mem[64] __attribute__((aligned(64)));
    for (int i = 0; i < 64; i++) mem[i] = 0x3f803f80u;
    for (int rep = 0; rep < 5; rep++) {
        __m512 a[16], f[16];
        __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x00010001);
        double t[5];
        t[0] = now();
        for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
        for (long n = 0; n < N; n++) {
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
            __asm__ volatile("" : "+v"(x));
        }
        t[1] = now();
        const unsigned int *m = mem;
        for (long n = 0; n < N; n++) {
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                a[i] = _mm512_dpbf16_ps(a[i], x, (__m512bh)_mm512_set1_epi32((int)m[i]));
            __asm__ volatile("" : "+r"(m));
        }
        t[2] = now();
        for (long n = 0; n < N; n++) {
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) DPB(a[i], x, m + i);
            __asm__ volatile("" : "+r"(m));
        }
        t[3] = now();
        __m512 fx = _mm512_set1_ps(1.0f), fy = _mm512_set1_ps(1e-9f);
        for (int i = 0; i < 16; i++) f[i] = _mm512_set1_ps((float)i);
        for (long n = 0; n < N; n++) {
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) f[i] = _mm512_fmadd_ps(fx, fy, f[i]);
            __asm__ volatile("" : "+v"(fx));
        }
        t[4] = now();
        float s = 0;
        for (int i = 0; i < 16; i++) s += _mm512_reduce_add_ps(a[i]) + _mm512_reduce_add_ps(f[i]);
        printf("G instr/s: vdpbf16ps reg %.2f, vpbroadcastd m32 + vdpbf16ps %.2f, vdpbf16ps m32{1to16} %.2f; "
               "vfmadd231ps %.2f (%g)\n", 16.0 * N / (t[1] - t[0]) / 1e9, 16.0 * N / (t[2] - t[1]) / 1e9,
               16.0 * N / (t[3] - t[2]) / 1e9, 16.0 * N / (t[4] - t[3]) / 1e9, s);
    }
    return 0;
}
