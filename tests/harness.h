/*
 * harness.h - the tiny test harness every kvattn test uses.
 *
 * Each test file defines checks with CHECK()/CHECK_STATUS() inside functions
 * and calls them from main() through RUN(); main returns kva_test_finish().
 * The last line printed is "N passed, N failed" (the plain closing line CI reads).
 * The data helpers (seeded RNG, random fills in any float dtype, NaN
 * poisoning, the per-dtype tolerances and tolerance-checked comparison) are
 * bench/data.h's, which the benchmarks and the CLI share without the checks.
 */
#ifndef KVA_TEST_HARNESS_H
#define KVA_TEST_HARNESS_H

/* The cache formats of MHA caches (kind KVA_ATTN_MHA): kva_quant values
 * below this. FP8_DS_MLA and FP8_TOKEN belong to MLA and index-key caches. */
#define KVA_TEST_MHA_QUANTS (KVA_QUANT_FP8_E4M3 + 1)

#include "../bench/data.h"
#include "kvattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int kva_test_checks_failed_;
static int kva_test_cases_passed_;
static int kva_test_cases_failed_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            kva_test_checks_failed_++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            kva_test_checks_failed_++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Checks that expr returns the expected status. */
#define CHECK_STATUS(expr, expected)                                                               \
    do {                                                                                           \
        kva_status got_ = (expr);                                                                  \
        if (got_ != (expected)) {                                                                  \
            kva_test_checks_failed_++;                                                             \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__,     \
                    __LINE__, #expr, kva_status_name(got_), kva_status_name(expected),             \
                    kva_last_error());                                                             \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, KVA_STATUS_OK)

/* Checks that the last error message mentions a substring (the argument name). */
#define CHECK_ERROR_MENTIONS(substr)                                                               \
    CHECK_MSG(strstr(kva_last_error(), (substr)) != NULL, "message '%s' lacks '%s'",               \
              kva_last_error(), (substr))

/* 1 under KVA_TEST_QUICK (the sanitizer stage of scripts/test.sh, the GPU
 * machine's quick sets): slow tests run a subset of their cases, chosen so
 * that every axis value still occurs; the Release run covers them all. */
static inline int kva_test_quick(void)
{
    return getenv("KVA_TEST_QUICK") != NULL;
}

/* RUN(case): runs one test case (if selected: KVA_TEST_ONLY below) and counts it passed or
 * failed. With the
 * environment variable KVA_TEST_TIMES set, each case's wall time and the
 * process's CPU time (all threads) go to stderr (to find what makes a test
 * slow, e.g. under the sanitizers; CPU seconds stay comparable on a loaded
 * machine, wall seconds do not). */
static inline double kva_test_now_(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC); /* C11 */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* Whether case `name` runs: all cases, or with KVA_TEST_ONLY set to a comma-separated list
 * of case names, those (so one test binary's cases can run in several processes at once,
 * e.g. under a sanitizer on a machine with many cores). */
static inline int kva_test_selected_(const char *name)
{
    const char *only = getenv("KVA_TEST_ONLY");
    if (!only || !*only)
        return 1;
    const size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        const size_t m = e ? (size_t)(e - p) : strlen(p);
        if (m == n && !strncmp(p, name, n))
            return 1;
        p += m + (e ? 1 : 0);
    }
    return 0;
}
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        if (!kva_test_selected_(#fn))                                                              \
            break;                                                                                 \
        int before_ = kva_test_checks_failed_;                                                     \
        const double t0_ = kva_test_now_();                                                        \
        const clock_t c0_ = clock();                                                               \
        fn();                                                                                      \
        if (getenv("KVA_TEST_TIMES"))                                                              \
            fprintf(stderr, "%8.2f s wall %8.2f s cpu  %s\n", kva_test_now_() - t0_,               \
                    (double)(clock() - c0_) / CLOCKS_PER_SEC, #fn);                                \
        if (kva_test_checks_failed_ == before_) {                                                  \
            kva_test_cases_passed_++;                                                              \
        } else {                                                                                   \
            kva_test_cases_failed_++;                                                              \
            fprintf(stderr, "FAILED: %s\n", #fn);                                                  \
        }                                                                                          \
    } while (0)

static inline int kva_test_finish(void)
{
    printf("%d passed, %d failed\n", kva_test_cases_passed_, kva_test_cases_failed_);
    return kva_test_cases_failed_ ? 1 : 0;
}

#endif /* KVA_TEST_HARNESS_H */
