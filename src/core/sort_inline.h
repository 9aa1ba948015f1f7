/*
 * sort_inline.h - a stable sort with its comparison inlined, for the plan's
 * small arrays of records (the partition's cost runs, the prefill tile list),
 * where qsort's indirect comparisons and byte-wise moves cost more than the
 * sorting itself.
 *
 * KVA__DEFINE_SORT(name, type, before, run) defines
 *   static void name(type *a, type *tmp, int32_t n)
 * which sorts a[0..n) so that x comes before y where before(&x, &y) (a strict
 * order; equal records keep their input order): insertion-sorted runs of
 * `run` records, then bottom-up merges through tmp [n] (the result ends in a).
 */
#ifndef KVA_SORT_INLINE_H
#define KVA_SORT_INLINE_H

#include <stdint.h>
#include <string.h>

#define KVA__DEFINE_SORT(name, type, before, run)                                                  \
    static void name(type *a, type *tmp, int32_t n)                                                \
    {                                                                                              \
        for (int32_t lo = 0; lo < n; lo += (run)) {                                                \
            const int32_t hi = lo + (run) < n ? lo + (run) : n;                                    \
            for (int32_t i = lo + 1; i < hi; i++) {                                                \
                const type x = a[i];                                                               \
                int32_t j = i;                                                                     \
                while (j > lo && before(&x, &a[j - 1])) {                                          \
                    a[j] = a[j - 1];                                                               \
                    j--;                                                                           \
                }                                                                                  \
                a[j] = x;                                                                          \
            }                                                                                      \
        }                                                                                          \
        type *src = a, *dst = tmp;                                                                 \
        for (int32_t w = (run); w < n; w *= 2) {                                                   \
            for (int32_t lo = 0; lo < n; lo += 2 * w) {                                            \
                const int32_t mid = lo + w < n ? lo + w : n;                                       \
                const int32_t hi = lo + 2 * w < n ? lo + 2 * w : n;                                \
                int32_t i = lo, j = mid, k = lo;                                                   \
                while (i < mid && j < hi)                                                          \
                    dst[k++] = before(&src[j], &src[i]) ? src[j++] : src[i++];                     \
                while (i < mid)                                                                    \
                    dst[k++] = src[i++];                                                           \
                while (j < hi)                                                                     \
                    dst[k++] = src[j++];                                                           \
            }                                                                                      \
            type *t_ = src;                                                                        \
            src = dst;                                                                             \
            dst = t_;                                                                              \
        }                                                                                          \
        if (src != a)                                                                              \
            memcpy(a, src, (size_t)n * sizeof *a);                                                 \
    }

#endif /* KVA_SORT_INLINE_H */
