/*
 * kvattn_mla.h - multi-head latent attention beyond the absorbed kernel-level
 * call (kva_attention_run on an MLA plan, kvattn.h): the layer-level
 * kva_mla_run, sparse MLA over indexed keys, and the indexer that picks them.
 * Included by kvattn.h; may be included on its own.
 */
#ifndef KVATTN_MLA_H
#define KVATTN_MLA_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Multi-head latent attention: the layer-level call                          */
/* ------------------------------------------------------------------------ */

/*
 * Multi-head latent attention for one layer (kind KVA_ATTN_MLA), from the
 * un-absorbed query, as vLLM's MLA common backend computes it. With
 * Dc = the plan's head_dim_v, Dr = head_dim - head_dim_v, Dn =
 * mla_qk_nope_head_dim and Dv = mla_v_head_dim (both given to the plan):
 *   q:     [T, H, Dn + Dr] in q_dtype: each head's q_nope [Dn] then q_pe [Dr]
 *          (RoPE already applied; k_pe in the cache likewise).
 *   w_uk:  [H, Dn, Dc] in q_dtype: head h's key up-projection,
 *          k_nope_h(j) = w_uk[h] . c_kv(j)   (vLLM's W_UK_T).
 *   w_uv:  [H, Dc, Dv] in q_dtype: head h's value up-projection,
 *          v_h(j) = c_kv(j) . w_uv[h]        (vLLM's W_UV).
 *   cache: an MLA cache holding [c_kv | k_pe] for every key the plan covers
 *          (unquantized rows in q_dtype, else KVA_STATUS_DTYPE_MISMATCH, as
 *          in kva_attention_run; FP8 rows serve any q_dtype).
 *   out:   [T, H, Dv] in q_dtype; lse: [T, H] float32 or NULL.
 * Semantics: for each head h, ordinary attention (kva_attention_run's masks:
 * causal or not, bottom-right aligned) with key k_h(j) = [k_nope_h(j), k_pe(j)]
 * (Dn + Dr), value v_h(j) (Dv) and score_j = scale * <q_h, k_h(j)>, the plan's
 * scale being the model's (DeepSeek: 1/sqrt(Dn + Dr), times its YaRN mscale^2).
 * lse is that softmax's natural-log sum-exp. Rows that see no key write 0 and
 * lse = -inf; a NaN score (a NaN in q, in w_uk or in a latent row the row
 * sees) makes the row's out and lse NaN on both paths and every backend,
 * as in kva_attention_run.
 * Paths (the result is the same up to rounding): requests with q_len <=
 * decode_threshold take the absorbed path (q_nope . w_uk -> [Dc], attention
 * over the latent rows with D = Dc + Dr, Dv = Dc, then . w_uv -> [Dv]); the
 * others take the compute-friendly path (the context's latent rows are
 * decompressed per head into the workspace in bounded chunks, attention with
 * D = Dn + Dr, Dv = Dv per chunk, chunks merged by their LSE). One plan may
 * mix both. The reference backend computes the naive, non-absorbed math in
 * fp64 for every request: the truth both paths are tested against.
 */
KVA_API kva_status kva_mla_run(kva_context *ctx, const kva_plan *plan, const void *q,
                               const void *w_uk, const void *w_uv, const kva_cache *cache,
                               void *out, float *lse);

/* ------------------------------------------------------------------------ */
/* Sparse MLA (DeepSeek V3.2 DSA) and its lightning indexer                 */
/* ------------------------------------------------------------------------ */

/*
 * Sparse absorbed MLA for one layer (FlashMLA's sparse kernels, as vLLM's
 * FlashMLA-sparse backend calls them): every query token attends only the
 * K = plan sparse_topk key positions of its own index list. The plan is of
 * kind KVA_ATTN_MLA with sparse_topk > 0 (Hkv 1, D = Dc + Dr, Dv = Dc, an
 * explicit scale); any H from 1 to KVA_MAX_HEADS, no padding of the heads.
 *   q:           [T, H, Dc + Dr] in q_dtype, absorbed (as kva_attention_run's
 *                MLA call).
 *   cache:       an MLA cache (bf16/f16/f32 rows, FP8_E4M3, or FP8_DS_MLA;
 *                unquantized rows in q_dtype, else
 *                KVA_STATUS_DTYPE_MISMATCH; FP8 rows serve any q_dtype).
 *   indices:     [T, K] int32, row t at indices + t * indices_stride (0
 *                means K): token t's key positions within its own request
 *                (0 .. seq_len - 1), turned into cache slots through the
 *                plan's block table as vLLM does before calling FlashMLA;
 *                -1 marks an unused entry (anywhere in the row).
 *   topk_length: [T] int32 or NULL: token t reads only its first
 *                topk_length[t] entries (0 .. K); NULL means all K.
 *   sinks:       [H] float32 per-head sink logits or NULL (as
 *                kva_attention_run's: in the denominator only).
 *   out:         [T, H, Dc] in q_dtype; lse: [T, H] float32 or NULL.
 * Semantics: for token t of request r, with J(t) the listed entries p of its
 * row (p >= 0, counted as often as listed: a position listed twice counts
 * twice, as in FlashMLA's kernels; the indexer never lists one twice),
 * score_p = scale * <q, latent(p)>, out = sum softmax_p * c_kv(p), lse the
 * natural-log sum-exp including the sink. No other mask applies (causal,
 * window: the index list is the mask). A token with no listed entry writes
 * out 0 and lse -inf (the sink logit with a sink). A NaN score (a NaN in q
 * or in a listed latent row, an fp8_ds_mla NaN code included) makes the
 * token's out and lse NaN on every backend, as in kva_attention_run.
 * Index values: an entry < -1 or >= the request's seq_len is an error.
 * The reference and CPU backends check every row first (indices and
 * topk_length are host memory there): KVA_STATUS_OUT_OF_RANGE naming the
 * token, entry and value, nothing written. The CUDA backend (device
 * memory, which the host does not read) treats such an entry as unused
 * (-1), and a topk_length outside 0 .. K as K.
 * FP8_DS_MLA values: code * scale exactly, except on the CUDA backend's
 * sm_90a kernel (H > 32 on an sm_90a build and device), which, as
 * FlashMLA's sparse kernels, rounds code * scale (an fp32 product) to the
 * q dtype before the products (bf16: a relative 2^-9 per value).
 * kva_sparse_mode MIXED and SEPARATE give the same result up to rounding.
 */
KVA_API kva_status kva_mla_sparse_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                      const kva_cache *cache, const int32_t *indices,
                                      int64_t indices_stride, const int32_t *topk_length,
                                      const float *sinks, void *out, float *lse);

/*
 * DeepSeek V3.2's lightning indexer: picks the K = plan sparse_topk keys
 * each query token will attend (the indices of kva_mla_sparse_run). The
 * plan is of kind KVA_ATTN_INDEX with num_heads = Hi index heads (DeepSeek:
 * 64), num_kv_heads 1, head_dim D (128), sparse_topk K; the same batch
 * metadata as the step's MLA plan (query_start_loc, seq_lens, block_table).
 *   q:       [T, Hi, D] in q_dtype: the index queries (RoPE applied).
 *   weights: [T, Hi] float32: each head's weight for this token (DeepSeek
 *            folds the softmax scale and Hi^-1/2 in here).
 *   cache:   a KVA_ATTN_INDEX cache holding every key the plan covers
 *            (unquantized keys in q_dtype, else KVA_STATUS_DTYPE_MISMATCH;
 *            FP8_TOKEN keys serve any q_dtype).
 *   indices: [T, K] int32 out, row t at indices + t * indices_stride (0
 *            means K); topk_length: [T] int32 out, or NULL.
 * Semantics: token t of request r (q_len q, seq_len s) at pos = s - q + i
 * scores every key j <= pos (causal, bottom-right aligned; the plan needs
 * causal = 1) as
 *     logit_j = sum_h weights[t, h] * max(0, <q[t, h], k_j>)
 * (in float32: the index keys dequantized, products accumulated in fp32;
 * the reference in fp64). A plan with index_q_quant = KVA_QUANT_FP8_TOKEN
 * (kvattn.h) first quantizes each row q[t, h] to e4m3 codes and a scale s,
 * and scores with code * s in place of q (DeepSeek V3.2's FP8 indexer).
 * Row t lists the min(K, pos + 1) keys of the
 * largest logits, ordered by logit, descending, ties broken by the lower
 * position first, then -1 up to K; topk_length[t] = min(K, pos + 1). A
 * NaN logit sorts below every other (it is listed last, if at all); ReLU
 * keeps NaN, so a key holding NaN gets a NaN logit. Backends other than the
 * reference may order keys whose float32 logits tie by rounding
 * differently. The CUDA backend takes f16/bf16 q, Hi and D multiples of 16
 * and K <= 4096 (else KVA_STATUS_UNSUPPORTED at plan time), q 16-byte
 * aligned; indices, topk_length, q and weights are device memory there.
 */
KVA_API kva_status kva_indexer_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                   const float *weights, const kva_cache *cache, int32_t *indices,
                                   int64_t indices_stride, int32_t *topk_length);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_MLA_H */
