/*
 * paged_read.c - how fast can one or two cores read a buffer cut into pieces
 * at random places, as a paged KV cache is? No attention: only reads.
 *
 *   paged_read THREADS PIECE_BYTES PREFETCH
 *
 * A 1 GiB buffer (transparent huge pages asked for) is cut into pieces of
 * PIECE_BYTES (a multiple of 64); the pieces are read in a random order, each
 * from its first to its last line with 64-byte vector loads, the threads
 * taking equal shares of the order. PREFETCH: 0 = hardware prefetchers only;
 * N > 0 = every line of the piece N places ahead in the order is prefetched
 * into L2 (prefetcht2) while the current piece is read, one line per line
 * read, as the decode kernels do. PIECE_BYTES = 1 GiB / THREADS is the plain
 * sequential read `kvattn bench` takes as its read ceiling (one contiguous
 * share per thread). Prints the median GB/s of 7
 * passes. What it showed on the dev VM is in bench/results/2026-11-22_performance-journal.md ("Why a
 * paged decode reads slower than a plain read").
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T2)
#else
#define PREFETCH_L2(p) __builtin_prefetch((p), 0, 1)
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct share {
    const unsigned char *buf;
    const uint32_t *order;
    size_t piece, first, last; /* pieces order[first..last) */
    int prefetch;
    uint64_t sum;
} share;

static void *read_share(void *arg)
{
    share *s = arg;
    uint64_t acc[8] = {0};
    for (size_t i = s->first; i < s->last; i++) {
        const uint64_t *p = (const uint64_t *)(s->buf + (size_t)s->order[i] * s->piece);
        const unsigned char *ahead = s->prefetch > 0 && i + (size_t)s->prefetch < s->last
                                         ? s->buf + (size_t)s->order[i + s->prefetch] * s->piece
                                         : NULL;
        for (size_t l = 0; l < s->piece / 64; l++) {
            if (ahead)
                PREFETCH_L2(ahead + 64 * l);
            for (int w = 0; w < 8; w++) /* one line: the compiler makes it vector loads */
                acc[w] += p[8 * l + (size_t)w];
        }
    }
    uint64_t t = 0;
    for (int w = 0; w < 8; w++)
        t += acc[w];
    s->sum = t;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: paged_read THREADS PIECE_BYTES PREFETCH\n");
        return 2;
    }
    const int threads = atoi(argv[1]);
    const size_t piece = (size_t)strtoull(argv[2], NULL, 10);
    const int prefetch = atoi(argv[3]);
    const size_t bytes = (size_t)1 << 30;
    if (threads < 1 || threads > 64 || piece < 64 || piece % 64 || piece > bytes / threads ||
        prefetch < 0) {
        fprintf(stderr, "paged_read: THREADS 1..64, PIECE_BYTES a multiple of 64 up to "
                        "1 GiB / THREADS, PREFETCH >= 0\n");
        return 2;
    }
    const size_t n = bytes / piece;
    unsigned char *buf = aligned_alloc((size_t)2 << 20, bytes);
    uint32_t *order = malloc(n * sizeof *order);
    if (!buf || !order) {
        fprintf(stderr, "paged_read: out of memory\n");
        return 1;
    }
    (void)madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t j = (size_t)(x % (i + 1));
        uint32_t t = order[i];
        order[i] = order[j], order[j] = t;
    }
    double gbps[7];
    static volatile uint64_t sink;
    for (int pass = 0; pass < 7; pass++) {
        pthread_t th[64];
        share sh[64];
        double t0 = now();
        for (int k = 0; k < threads; k++) {
            sh[k] = (share){.buf = buf, .order = order, .piece = piece, .prefetch = prefetch};
            sh[k].first = n * (size_t)k / (size_t)threads;
            sh[k].last = n * (size_t)(k + 1) / (size_t)threads;
            if (pthread_create(&th[k], NULL, read_share, &sh[k]) != 0) {
                fprintf(stderr, "paged_read: cannot start thread %d\n", k);
                return 1;
            }
        }
        for (int k = 0; k < threads; k++) {
            pthread_join(th[k], NULL);
            sink += sh[k].sum;
        }
        gbps[pass] = (double)(n * piece) / (now() - t0) / 1e9;
    }
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (gbps[j] < gbps[i]) {
                double t = gbps[i];
                gbps[i] = gbps[j], gbps[j] = t;
            }
    printf("threads %d piece %zu prefetch %d: median %.1f GB/s (min %.1f, max %.1f)\n", threads,
           piece, prefetch, gbps[3], gbps[0], gbps[6]);
    free(order);
    free(buf);
    return 0;
}
