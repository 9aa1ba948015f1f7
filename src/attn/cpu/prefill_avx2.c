/*
 * prefill_avx2.c - CPU attention kernel prefill_avx2: the tiled
 * prefill kernel (prefill_tiled.inc) with AVX2+FMA vectors of 8 rows.
 *
 * Register blocks (16 ymm registers): scores 6 keys x 2 vectors (16 rows: 12
 * accumulators, 2 loads of QT and 6 broadcasts of K per step of D), outputs
 * 6 elements of Dv x 2 vectors. Tiles of 96 keys. Needs AVX2, FMA and F16C
 * (only called after run-time detection). Primitives in prefill_avx2.h.
 * Measured: bench/results/2026-11-22_performance-journal.md (prefill section).
 */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)

#define PF_FN kva__cpu_prefill_avx2
#include "prefill_avx2.h"

#include "prefill_tiled.inc"

#endif
