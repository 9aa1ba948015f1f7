/*
 * mla_portable.c - the layer-level MLA items (mla_items.inc) for the
 * baseline ISA: the fallback on every CPU.
 */
#include "mla_cpu.h"

#include <math.h>
#include <string.h>

#define KVA_MLA_ITEM kva__cpu_mla_item_portable
#include "mla_items.inc"
