/* dev/mlacpu29/chunk_bench.c - the bf16 MLA chunk body (src/attn/cpu/mla_bf16dot.inc, its
 * chunk functions extracted by chunk_bench.sh) timed phase by phase at H 16 on one thread:
 * R requests x N keys of DeepSeek rows (D 576, Dc 512) in one array larger than the caches,
 * chunks of 64 keys, next chunk prefetched as the item does. Prints ns per key of each phase
 * and the vdpbf16ps rate (544 per key and 16 rows) against the probe dp_peak.c. Args: R N [Mp 16]. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define KVA_MAX_HEAD_DIM 576
#include "chunk_body.inc"
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv)
{
    const int R = argc > 1 ? atoi(argv[1]) : 16, N = argc > 2 ? atoi(argv[2]) : 4096;
    const int Mp = argc > 3 ? atoi(argv[3]) : 16, M = Mp, D = 576, D2 = 288, Dc = 512, C = 64;
    const double dpk = Mp / 16 * 544.0; /* vdpbf16ps per key */
    uint16_t *rows = aligned_alloc(64, (size_t)R * N * D * 2);
    for (size_t i = 0; i < (size_t)R * N * D; i++)
        rows[i] = (uint16_t)(0x3c00 + (rand() & 0x7ff)) ^ (rand() & 1 ? 0x8000 : 0);
    float *qa = malloc(sizeof(float) * Mp * 576);
    for (int i = 0; i < Mp * 576; i++) qa[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.2f;
    uint32_t *qw = aligned_alloc(64, (size_t)Mp * 288 * 4 * 2);
#ifdef QW_MP
    for (int r = 0; r < Mp; r++) mla_bf16_qw_row(qa + r * D, r, Mp, D2, qw);
#else
    for (int r = 0; r < Mp; r++) mla_bf16_qw_row(qa + r * D, r, D2, qw);
#endif
    float *ST = aligned_alloc(64, (size_t)C * Mp * 4 * 2), *o = aligned_alloc(64, (size_t)Mp * Dc * 4);
    uint32_t *vw = aligned_alloc(64, (size_t)C / 2 * Dc * 4 + 4096);
    float mx[128], l[128];
    const int NC = R * (N / C);
    double *pt = malloc(sizeof(double) * 4 * NC);
    const uint32_t *rp[2][C + 8];
    for (int rep = 0; rep < 3; rep++) {
        double ph[4] = {0}, t0 = now(), cpu0;
        {
            struct timespec ct;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ct);
            cpu0 = ct.tv_sec + 1e-9 * ct.tv_nsec;
        }
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < Mp; i++) mx[i] = -INFINITY, l[i] = 0;
            memset(o, 0, (size_t)Mp * Dc * 4);
#ifdef NEW_PV
            mla_bf16_o_order(o, Mp, Dc, 0);
#endif
            for (int c0 = 0; c0 < N; c0 += C) {
                const uint32_t **kp = rp[(c0 / C) & 1], **nx = rp[((c0 / C) & 1) ^ 1];
                for (int j = 0; j < C + 8; j++) {
                    kp[j] = j < C ? (const uint32_t *)(rows + ((size_t)r * N + c0 + j) * D) : mla_bf16_zero_row;
                    nx[j] = j < C && c0 + C < N ? (const uint32_t *)(rows + ((size_t)r * N + c0 + C + j) * D) : mla_bf16_zero_row;
                }
                double a = now();
                mla_bf16_scores(kp, C, qw, D2, Mp, ST, c0 + C < N ? nx : NULL);
                double b = now();
                mla_bf16_softmax(ST, Mp, M, C, c0, 0, 1, 0, 0.0417f, mx, l, o, Dc);
                double c = now();
#ifdef NEW_PV
                double d = now();
                mla_bf16_pv((const uint32_t *)ST, kp, C / 2, Mp, Dc, o);
#else
                mla_bf16_interleave(kp, C, Dc, vw);
                double d = now();
                mla_bf16_pv((const uint32_t *)ST, vw, C / 2, Mp, Dc, o);
#endif
                double e = now();
#ifdef NEW_PV
                if (c0 + C >= N)
                    mla_bf16_o_order(o, Mp, Dc, 1);
#endif
                ph[0] += b - a; ph[1] += c - b; ph[2] += d - c; ph[3] += e - d;
                const int ci = r * (N / C) + c0 / C;
                pt[ci] = b - a; pt[NC + ci] = c - b; pt[2 * NC + ci] = d - c; pt[3 * NC + ci] = e - d;
            }
        }
        double t = now() - t0, keys = (double)R * N;
        printf("R %d N %d: %.3f ms total, ns/key: scores %.2f softmax %.2f interleave %.2f pv %.2f | vdpbf16ps %.2f G/s (scores %.2f, pv %.2f), latent %.1f GB/s, o[0]=%g\n",
               R, N, t * 1e3, ph[0] / keys * 1e9, ph[1] / keys * 1e9, ph[2] / keys * 1e9, ph[3] / keys * 1e9,
               dpk * keys / t / 1e9, dpk * 288 / 544 * keys / ph[0] / 1e9, dpk * 256 / 544 * keys / ph[3] / 1e9, keys * 1152 / t / 1e9, o[0]);
        struct timespec ct;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ct);
        const double cpu = ct.tv_sec + 1e-9 * ct.tv_nsec - cpu0;
        printf("  thread CPU time %.3f ms = %.2f ns per key\n", cpu * 1e3, cpu / ((double)R * N) * 1e9);
        double md[4];
        for (int p = 0; p < 4; p++) {
            qsort(pt + p * NC, NC, sizeof(double), cmpd);
            md[p] = pt[p * NC + NC / 4] / C * 1e9; /* lower quartile over chunks: the undisturbed speed */
        }
        const double sum = md[0] + md[1] + md[2] + md[3];
        printf("  per chunk, lower quartile, ns/key: scores %.2f softmax %.2f interleave %.2f pv %.2f = %.2f"
               " | vdpbf16ps %.2f G/s (scores %.2f, pv %.2f), latent %.1f GB/s\n",
               md[0], md[1], md[2], md[3], sum, dpk / sum, dpk * 288 / 544 / md[0], dpk * 256 / 544 / md[3], 1152 / sum);
    }
    return 0;
}
