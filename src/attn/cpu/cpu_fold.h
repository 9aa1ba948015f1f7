/*
 * cpu_fold.h - row formats and static-scale folding shared by the decode
 * kernels decode_avx2 and decode_avx512(bf16), which read quantized K/V rows in
 * their storage format and keep the static scales out of their loops.
 *
 * Row formats the loops read in registers: the cache's float formats, and the
 * quantized ones read in their storage format (scales folded, see
 * kva__cpu_fold_begin):
 *   FMT_I8   int8 with per-channel scale s and offset o (INT8_CHANNEL K/V,
 *            INT8_TOKEN_K V): the loads give q, the loops subtract o;
 *   FMT_I8S  int8 with per-channel scale and all offsets of the kv head 0
 *            (symmetric): FMT_I8 without the subtraction;
 *   FMT_I8T  int8 keys with a per-token scale (INT8_TOKEN_K*): the loads give
 *            q, the scores are multiplied by the token's scale;
 *   FMT_FP8  e4m3 with per-channel scale s: the loads give the code's value /
 *            2^8 (an f16 built from the code's bits), 2^8 s is folded;
 *   FMT_FP8N the same for a chunk that holds a NaN code (the kernels' chunk
 *            loaders look): the loads also map |code| 0x7f to NaN.
 */
#ifndef KVA_CPU_FOLD_H
#define KVA_CPU_FOLD_H

#include "cpu_attn.h"

#include <stdint.h>

enum { FMT_F32, FMT_F16, FMT_BF16, FMT_I8, FMT_I8S, FMT_I8T, FMT_FP8, FMT_FP8N };

/*
 * Format pairs: the decode kernels instantiate their chunk step once per
 * (K, V) row-format pair that occurs, with both formats as compile-time
 * constants, in small files per pair (or group of pairs) and ISA, so the
 * build compiles them in parallel. An item's pair is fixed but for fp8 (a
 * chunk with NaN codes reads as FMT_FP8N); kva__cpu_fmt_pair says which pair
 * the formats kf, vf of a chunk are.
 */
enum {
    PAIR_F32,      /* float32 rows (and rows a kernel converted to fp32) */
    PAIR_F16,      /* f16 K and V */
    PAIR_BF16,     /* bf16 K and V */
    PAIR_I8,       /* INT8_CHANNEL with offsets */
    PAIR_I8S,      /* INT8_CHANNEL, symmetric */
    PAIR_I8T_I8,   /* INT8_TOKEN_K keys, int8 values with offsets */
    PAIR_I8T_I8S,  /* INT8_TOKEN_K keys, symmetric int8 values */
    PAIR_I8T_F16,  /* INT8_TOKEN_K_V16 keys, f16 values */
    PAIR_I8T_BF16, /* INT8_TOKEN_K_V16 keys, bf16 values */
    PAIR_FP8,      /* FP8_E4M3 */
    PAIR_FP8N,     /* FP8_E4M3, a chunk that holds NaN codes */
    PAIR_COUNT
};

static inline int kva__cpu_fmt_pair(int kf, int vf)
{
    switch (kf) {
    case FMT_F16:
        return PAIR_F16;
    case FMT_BF16:
        return PAIR_BF16;
    case FMT_I8:
        return PAIR_I8;
    case FMT_I8S:
        return PAIR_I8S;
    case FMT_I8T:
        return vf == FMT_I8    ? PAIR_I8T_I8
               : vf == FMT_I8S ? PAIR_I8T_I8S
               : vf == FMT_F16 ? PAIR_I8T_F16
                               : PAIR_I8T_BF16;
    case FMT_FP8:
        return PAIR_FP8;
    case FMT_FP8N:
        return PAIR_FP8N;
    default:
        return PAIR_F32;
    }
}

/* Row formats of one item and the offsets its loops subtract. */
typedef struct kva__cpu_fold {
    int kf, vf;        /* row formats of K and V */
    const float *koff; /* [D] key offsets of the item's kv head (FMT_I8 keys), or NULL */
    const float *voff; /* [Dv] value offsets (FMT_I8 values), or NULL */
} kva__cpu_fold;

/* Formats of item it's rows; for a quantized cache the static key scales are
 * folded into the query tile: q [M, D] *= s_k (times 2^8 for fp8), so the
 * scores are sum_d (q_d s_d) (k_d - o_d). */
void kva__cpu_fold_begin(const kva__cpu_run *run, const kva__work_item *it, float *q, int32_t M,
                         kva__cpu_fold *f);

/* The values' static scale, once per item: acc [M, Dv] *= s_v (times 2^8 for
 * fp8) when vf is a quantized format. P.V, the normalization, the split
 * partials and their merge are linear in V, so this equals scaling every
 * value row. */
void kva__cpu_fold_end(const kva__cpu_run *run, const kva__work_item *it, float *acc, int32_t M,
                       int vf);

#endif /* KVA_CPU_FOLD_H */
