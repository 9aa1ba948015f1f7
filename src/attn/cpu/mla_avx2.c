/*
 * mla_avx2.c - the MLA items (mla_items.inc: layer-level and sparse) for
 * AVX2 + FMA, auto-vectorized (CMakeLists.txt gives *_avx2.c its flags).
 * Called only after run-time detection (cpu_ops.c); elsewhere it compiles
 * to nothing.
 */
#include "mla_cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <math.h>
#include <string.h>

#define KVA_MLA_ITEM kva__cpu_mla_item_avx2
#include "mla_items.inc"
#endif
