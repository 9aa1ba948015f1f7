/*
 * mla_avx512.c - the layer-level MLA items (mla_items.inc) compiled for
 * AVX-512 (CMakeLists.txt gives *_avx512.c its flags); called only after
 * run-time detection (mla_cpu.c). Elsewhere it compiles to nothing.
 */
#include "mla_cpu.h"

#if defined(__AVX512F__)
#include <math.h>
#include <string.h>

#define KVA_MLA_ITEM kva__cpu_mla_item_avx512
#include "mla_items.inc"
#endif
