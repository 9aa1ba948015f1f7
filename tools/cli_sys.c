/* cli_sys.c - the monotonic clock and the machine's measured memory read bandwidth. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

double kva_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sums n 64-bit words with four independent accumulators, so the loop is
 * limited by loads, not by the add latency. */
static uint64_t sum_words(const uint64_t *p, size_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < n; i++)
        a += p[i];
    return a + b + c + d;
}

int kva_cli_reader_open(kva_cli_reader *r, int num_threads)
{
    /* 256 MiB: 8x the largest last-level caches of the machines we run on, so
     * the passes measure DRAM, not cache. */
    return kva_cli_reader_open_bytes(r, num_threads, (size_t)256 << 20);
}

int kva_cli_reader_open_bytes(kva_cli_reader *r, int num_threads, size_t bytes)
{
    bytes = bytes < 4096 ? 4096 : bytes;
    r->words = bytes / sizeof(uint64_t);
    r->threads = num_threads < 1 ? 1 : num_threads;
    r->buf = malloc(bytes);
    if (!r->buf)
        return -1;
    uint64_t *buf = r->buf;
    const size_t words = r->words;
    /* Touch every page from the threads that will read them (first touch). */
#ifdef _OPENMP
#pragma omp parallel for num_threads(r->threads) schedule(static)
#endif
    for (size_t i = 0; i < words; i++)
        buf[i] = i;
    return 0;
}

double kva_cli_reader_pass(kva_cli_reader *r)
{
    static volatile uint64_t sink;
    const uint64_t *buf = r->buf;
    const size_t words = r->words;
    uint64_t total = 0;
    double t0 = kva_cli_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(r->threads) reduction(+ : total)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t chunk = (words + (size_t)nt - 1) / (size_t)nt;
        size_t lo = chunk * (size_t)id;
        size_t hi = lo + chunk < words ? lo + chunk : words;
        if (lo < hi)
            total += sum_words(buf + lo, hi - lo);
    }
#else
    total = sum_words(buf, words);
#endif
    double dt = kva_cli_now() - t0;
    sink += total;
    return dt > 0 ? (double)(words * sizeof(uint64_t)) / dt / 1e9 : 0.0;
}

void kva_cli_reader_close(kva_cli_reader *r)
{
    free(r->buf);
    r->buf = NULL;
}

double kva_cli_measure_read_bw(int num_threads)
{
    kva_cli_reader r;
    if (kva_cli_reader_open(&r, num_threads) != 0)
        return 0.0;
    double best = 0.0;
    for (int pass = 0; pass < 4; pass++) {
        double bw = kva_cli_reader_pass(&r);
        if (bw > best)
            best = bw;
    }
    kva_cli_reader_close(&r);
    return best;
}
