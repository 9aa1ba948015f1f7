/*
 * kvattn_merge.h - merging partial attention results over disjoint key sets
 * (split-KV, cascade, decode context parallelism in one process).
 * Included by kvattn.h; may be included on its own.
 */
#ifndef KVATTN_MERGE_H
#define KVATTN_MERGE_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Merge two partial attention results over disjoint key sets:
 *   out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / (exp(lse_a) + exp(lse_b)),
 *   lse = log(exp(lse_a) + exp(lse_b)), computed stably; a side whose lse is
 *   -inf contributes nothing; both -inf gives out 0 and lse -inf; a NaN or
 *   +inf lse (whose weight exp(+inf) / exp(+inf) is undefined) makes the
 *   row's out and lse NaN, on every backend.
 *   out_a, out_b, out: [T, H, Dv] in dtype (F32, F16 or BF16); lse_*: [T, H] float32.
 *   T = num_tokens may be 0 (nothing to merge, tensors may be NULL); H =
 *   num_heads is 1..KVA_MAX_HEADS and Dv = head_dim_v a valid head size even then.
 * out may alias out_a or out_b, lse_out may alias lse_a or lse_b (in-place:
 * the same pointer). Any other overlap of out or lse_out with an input or
 * with each other is refused with KVA_STATUS_INVALID_ARGUMENT naming both,
 * nothing written (kvattn.h, Aliasing).
 */
KVA_API kva_status kva_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                    int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                    const float *lse_a, const void *out_b, const float *lse_b,
                                    void *out, float *lse_out);

/*
 * Merge P partial attention results over disjoint key sets (the DCP combine
 * when every rank's partial is in one process; kva_merge_states is P = 2):
 *   out = sum_p exp(lse_p) * out_p / sum_p exp(lse_p), lse = log(sum_p exp(lse_p)),
 *   computed stably with one rounding to dtype; a part whose lse is -inf
 *   contributes nothing (its out rows are not read); all -inf gives out 0
 *   and lse -inf; a NaN or +inf lse makes the row NaN (out and lse).
 *   outs: P parts of [T, H, Dv] in dtype (F32, F16 or BF16), part p at
 *         element p * out_stride (0 means T*H*Dv: dense [P, T, H, Dv]);
 *   lses: P parts of [T, H] float32, part p at element p * lse_stride (0
 *         means T*H), so a collective's packed [out | lse] blocks merge in place;
 *   out: [T, H, Dv] in dtype; lse_out: [T, H] float32, or NULL.
 * P = num_parts is 1..KVA_MAX_DCP; strides are 0 or at least the part size;
 * out and lse_out may not overlap the inputs. Graph-capture safe on CUDA (no
 * allocation, no synchronization).
 */
#define KVA_MAX_DCP 256 /* most ranks of a sharded plan, and most parts of a merge */
KVA_API kva_status kva_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                      int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                      const void *outs, int64_t out_stride, const float *lses,
                                      int64_t lse_stride, void *out, float *lse_out);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_MERGE_H */
