/*
 * plan_scan.h - the plan check's block-table row scan (internal; plan_check.c
 * check_batch, plan_scan_avx2.c).
 */
#ifndef KVA_PLAN_SCAN_H
#define KVA_PLAN_SCAN_H

#include <stdint.h>

/* Folds the n ids of row (int32 [n]) into *any (their bitwise OR: negative
 * when some id is) and *hi (their maximum, if larger). AVX2; call only where
 * the CPU has it (kva__cpu_features.avx2) and KVA_X86_SIMD is 1. */
void kva__plan_scan_row_avx2(const int32_t *row, int64_t n, int32_t *any, int32_t *hi);

#endif /* KVA_PLAN_SCAN_H */
