/*
 * prefill_avx512.c - CPU attention kernel prefill_avx512: the tiled
 * prefill kernel (prefill_tiled.inc) with AVX-512 vectors of 16 rows
 * (primitives in prefill_avx512.h).
 *
 * Register blocks: scores 6 keys x 4 vectors (64 rows: 24 accumulators, 4
 * loads of QT and 6 broadcasts of K per step of D), outputs 6 elements of Dv
 * x 4 vectors (4 loads of P, 6 broadcasts of V per key). Tiles of 96 keys.
 * Needs AVX-512 F/BW/VL/DQ (only called after run-time detection).
 * Measured: bench/results/2026-11-22_performance-journal.md (prefill section).
 */
#if defined(__x86_64__) && defined(__AVX512F__)

#define PF_FN kva__cpu_prefill_avx512
#include "prefill_avx512.h"

#include "prefill_tiled.inc"

#endif
