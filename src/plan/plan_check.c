/*
 * plan_check.c - kva_plan_create's and kva_plan_update's validation of a
 * kva_plan_desc against its context: the scalars, the kinds' relations (MLA,
 * indexer, sparse), the backend's capabilities and the batch arrays. A
 * descriptor that fails gets a status and a kva_last_error message naming the
 * field; nothing is built (plan.c builds only what passed).
 *
 * Requests with q_len == 0 (padding, or requests that only hold context)
 * produce no output rows: their block ids are not checked (no kernel reads
 * them). Their seq_lens must still be non-negative and fit the block table,
 * since that is a property of the metadata's shape, not of the work.
 *
 * q_len <= seq_len is required of causal plans only: a non-causal plan may
 * describe cross-attention, where a request's queries (decoder tokens) can
 * outnumber its keys (encoder tokens), including seq_len 0 (an empty encoder
 * output), whose rows see no key.
 */
#include "internal.h"
#include "plan_scan.h"

#include <math.h>
#include <stdint.h>

/* The relations of an MLA plan (kind KVA_ATTN_MLA): the latent cache's
 * shape (Hkv 1, Dc = head_dim_v given and below head_dim), the model's scale
 * given explicitly (1/sqrt(Dc + Dr) is never right for MLA), none of the
 * masks MLA models do not use, and the layer-level head sizes both 0 or both
 * valid. */
static kva_status check_mla(const kva_plan_desc *d)
{
    static const char fn[] = "kva_plan_create";
    if (d->num_kv_heads != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_kv_heads = %d, but an MLA plan (kind KVA_ATTN_MLA) reads one "
                         "latent row per token: num_kv_heads must be 1",
                         fn, (int)d->num_kv_heads);
    if (d->head_dim_v == 0 || d->head_dim_v >= d->head_dim)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: head_dim_v = %d, but an MLA plan needs head_dim_v = Dc given and "
                         "below head_dim = Dc + Dr = %d",
                         fn, (int)d->head_dim_v, (int)d->head_dim);
    if (!(d->scale > 0.0f))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: scale = %g: an MLA plan needs the model's softmax scale (DeepSeek: "
                         "1/sqrt(Dn + Dr) times mscale^2), not the default 1/sqrt(D)",
                         fn, (double)d->scale);
    if (d->window_left >= 0 || d->softcap > 0.0f || d->alibi_slopes || d->attention_chunk > 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: window_left = %d, softcap = %g, alibi_slopes = %p, attention_chunk "
                         "= %d: MLA plans take no window, soft-cap, ALiBi or local chunk",
                         fn, (int)d->window_left, (double)d->softcap, (const void *)d->alibi_slopes,
                         (int)d->attention_chunk);
    const int32_t dn = d->mla_qk_nope_head_dim, dv = d->mla_v_head_dim;
    /* A rank's partial must be combined before W_UV: sharded MLA is the
     * absorbed attention of kva_attention_run, combined with Dv = Dc. */
    if (d->dcp_size > 1 && dn != 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: dcp_size = %d with mla_qk_nope_head_dim = %d: a sharded MLA plan "
                         "serves kva_attention_run (absorbed; combine the ranks with Dv = Dc, "
                         "then apply W_UV), not kva_mla_run",
                         fn, (int)d->dcp_size, (int)dn);
    if ((dn == 0) != (dv == 0))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: mla_qk_nope_head_dim = %d, mla_v_head_dim = %d: give both (for "
                         "kva_mla_run) or neither",
                         fn, (int)dn, (int)dv);
    if (dn != 0 && (!kva__head_dim_ok(dn) || !kva__head_dim_ok(dv)))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: mla_qk_nope_head_dim = %d, mla_v_head_dim = %d: each must be a "
                         "multiple of 8 from 8 to %d",
                         fn, (int)dn, (int)dv, KVA_MAX_HEAD_DIM);
    if (dn != 0 && !kva__head_dim_ok(dn + d->head_dim - d->head_dim_v))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: mla_qk_nope_head_dim + Dr = %d + %d exceeds %d (KVA_MAX_HEAD_DIM)",
                         fn, (int)dn, (int)(d->head_dim - d->head_dim_v), KVA_MAX_HEAD_DIM);
    return KVA_STATUS_OK;
}

/* The relations of an indexer plan (kind KVA_ATTN_INDEX, kva_indexer_run):
 * one index-key row per token, K = sparse_topk keys per query token, causal,
 * and none of the masks or plan modes attention plans take. */
static kva_status check_index(const kva_plan_desc *d)
{
    static const char fn[] = "kva_plan_create";
    if (d->num_kv_heads != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_kv_heads = %d, but an indexer plan (kind KVA_ATTN_INDEX) reads "
                         "one key row per token: num_kv_heads must be 1",
                         fn, (int)d->num_kv_heads);
    if (d->head_dim_v != 0 && d->head_dim_v != d->head_dim)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: head_dim_v = %d: an indexer plan has no values; give 0 or head_dim "
                         "= %d",
                         fn, (int)d->head_dim_v, (int)d->head_dim);
    if (d->sparse_topk < 1 || d->sparse_topk > KVA_MAX_TOPK)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_topk = %d: an indexer plan needs K in [1, %d] "
                         "(KVA_MAX_TOPK)",
                         fn, (int)d->sparse_topk, KVA_MAX_TOPK);
    if (d->sparse_mode != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_mode = %d is for sparse MLA plans; an indexer plan takes 0",
                         fn, (int)d->sparse_mode);
    if (d->index_q_quant != KVA_QUANT_NONE && d->index_q_quant != KVA_QUANT_FP8_TOKEN)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: index_q_quant = %d: an indexer plan takes KVA_QUANT_NONE (0) or "
                         "KVA_QUANT_FP8_TOKEN (%d)",
                         fn, (int)d->index_q_quant, (int)KVA_QUANT_FP8_TOKEN);
    if (!d->causal)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: causal = 0: the indexer scores the keys up to each token's own "
                         "position; an indexer plan needs causal = 1",
                         fn);
    /* The cascade mode is validated as in every plan (kva__cascade_plan,
     * which indexer plans skip). */
    if ((unsigned)d->cascade >= (unsigned)KVA_CASCADE_MODE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: cascade = %d is not a kva_cascade_mode (0 .. %d)", fn,
                         (int)d->cascade, (int)KVA_CASCADE_MODE_COUNT_ - 1);
    if (d->window_left >= 0 || d->softcap != 0.0f || d->alibi_slopes || d->attention_chunk != 0 ||
        d->tree_parents || d->tree_mask || d->cascade_group || d->num_cascade_groups != 0 ||
        d->cascade == KVA_CASCADE_ON || d->dcp_size > 1)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: an indexer plan takes no window (%d), soft-cap (%g), ALiBi (%p), "
                         "chunk (%d), tree, cascade grouping or DCP (dcp_size %d)",
                         fn, (int)d->window_left, (double)d->softcap, (const void *)d->alibi_slopes,
                         (int)d->attention_chunk, (int)d->dcp_size);
    return KVA_STATUS_OK;
}

/* The relations of a sparse MLA plan (sparse_topk > 0, kvattn_mla.h): K
 * within KVA_MAX_TOPK, kind KVA_ATTN_MLA, a kva_sparse_mode, and none of the
 * features the index list replaces or the sparse kernels do not take (the
 * MLA masks are refused by check_mla). */
static kva_status check_sparse(const kva_plan_desc *d)
{
    static const char fn[] = "kva_plan_create";
    if (d->sparse_topk < 0 || d->sparse_topk > KVA_MAX_TOPK)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_topk = %d is outside [0, %d] (KVA_MAX_TOPK; 0 = dense)", fn,
                         (int)d->sparse_topk, KVA_MAX_TOPK);
    if (d->sparse_topk == 0) {
        if (d->sparse_mode != 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: sparse_mode = %d on a dense plan (sparse_topk = 0): must be 0",
                             fn, (int)d->sparse_mode);
        return KVA_STATUS_OK;
    }
    if (d->kind != KVA_ATTN_MLA)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_topk = %d with kind = %d: sparse attention plans have kind "
                         "KVA_ATTN_MLA",
                         fn, (int)d->sparse_topk, (int)d->kind);
    if ((unsigned)d->sparse_mode >= (unsigned)KVA_SPARSE_MODE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_mode = %d is not a kva_sparse_mode (0 .. %d)", fn,
                         (int)d->sparse_mode, (int)KVA_SPARSE_MODE_COUNT_ - 1);
    if (d->mla_qk_nope_head_dim != 0 || d->mla_v_head_dim != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: sparse_topk = %d with mla_qk_nope_head_dim = %d, mla_v_head_dim = "
                         "%d: sparse plans run the absorbed call only (both must be 0)",
                         fn, (int)d->sparse_topk, (int)d->mla_qk_nope_head_dim,
                         (int)d->mla_v_head_dim);
    if (d->dcp_size > 1 || d->tree_parents || d->tree_mask || d->cascade == KVA_CASCADE_ON ||
        d->num_cascade_groups != 0 || d->cascade_group)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: sparse_topk = %d: sparse plans take no DCP sharding (dcp_size = "
                         "%d), draft tree or cascade",
                         fn, (int)d->sparse_topk, (int)d->dcp_size);
    return KVA_STATUS_OK;
}

/* Checks the attention shape and semantics (everything but the batch arrays). */
static kva_status check_scalars(const kva_plan_desc *d)
{
    if (d->num_requests < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: num_requests = %d is negative", (int)d->num_requests);
    if (d->num_heads < 1 || d->num_heads > KVA_MAX_HEADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: num_heads = %d is outside [1, %d]", (int)d->num_heads,
                         KVA_MAX_HEADS);
    if (d->num_kv_heads < 1 || d->num_kv_heads > KVA_MAX_HEADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: num_kv_heads = %d is outside [1, %d]",
                         (int)d->num_kv_heads, KVA_MAX_HEADS);
    if (d->num_heads % d->num_kv_heads != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: num_heads = %d is not a multiple of num_kv_heads = %d",
                         (int)d->num_heads, (int)d->num_kv_heads);
    if (d->head_dim <= 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: head_dim = %d, must be positive", (int)d->head_dim);
    if (d->head_dim_v < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: head_dim_v = %d is negative (0 means head_dim)",
                         (int)d->head_dim_v);
    if (!kva__head_dim_ok(d->head_dim))
        return kva__fail(
            KVA_STATUS_UNSUPPORTED,
            "kva_plan_create: head_dim = %d is unsupported (multiples of 8 from 8 to %d)",
            (int)d->head_dim, KVA_MAX_HEAD_DIM);
    if (d->head_dim_v != 0 && !kva__head_dim_ok(d->head_dim_v))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: head_dim_v = %d is unsupported (0, or multiples of 8 "
                         "from 8 to %d)",
                         (int)d->head_dim_v, KVA_MAX_HEAD_DIM);
    if ((unsigned)d->kind >= (unsigned)KVA_ATTN_KIND_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: kind = %d is not a kva_attn_kind (0 .. %d)",
                         (int)d->kind, (int)KVA_ATTN_KIND_COUNT_ - 1);
    if (d->kind == KVA_ATTN_INDEX)
        KVA_TRY(check_index(d));
    else
        KVA_TRY(check_sparse(d));
    if (d->kind != KVA_ATTN_INDEX && d->index_q_quant != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: index_q_quant = %d is for indexer plans (kind "
                         "KVA_ATTN_INDEX) only; must be 0",
                         (int)d->index_q_quant);
    if (d->kind == KVA_ATTN_MLA)
        KVA_TRY(check_mla(d));
    else if (d->mla_qk_nope_head_dim != 0 || d->mla_v_head_dim != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: mla_qk_nope_head_dim = %d, mla_v_head_dim = %d: MLA "
                         "head sizes are for kind KVA_ATTN_MLA only (must be 0)",
                         (int)d->mla_qk_nope_head_dim, (int)d->mla_v_head_dim);
    if (!kva__dtype_is_float(d->q_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: q_dtype %d (%s) is not f32, f16 or bf16",
                         (int)d->q_dtype, kva_dtype_name(d->q_dtype));
    if (!isfinite(d->scale) || d->scale < 0.0f)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: scale = %g, must be finite and >= 0 (0 means 1/sqrt(D))",
                         (double)d->scale);
    if (!isfinite(d->softcap) || d->softcap < 0.0f)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: softcap = %g, must be finite and >= 0 (0 means none)",
                         (double)d->softcap);
    if (d->window_left < -1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: window_left = %d, must be >= -1 (-1 means no window)",
                         (int)d->window_left);
    if (d->attention_chunk < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: attention_chunk = %d is negative (0 means off)",
                         (int)d->attention_chunk);
    /* Local attention is a decoder's causal self-attention (Llama 4): a
     * non-causal row may sit before its request's first key (cross-attention),
     * where a chunk has no meaning. */
    if (d->attention_chunk > 0 && !d->causal)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: attention_chunk = %d needs causal = 1 (local "
                         "attention is defined for causal self-attention only)",
                         (int)d->attention_chunk);
    if (d->decode_threshold < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: decode_threshold = %d is negative",
                         (int)d->decode_threshold);
    if (d->alibi_slopes) {
        for (int32_t h = 0; h < d->num_heads; h++)
            if (!isfinite(d->alibi_slopes[h]))
                return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                 "kva_plan_create: alibi_slopes[%d] = %g is not finite", (int)h,
                                 (double)d->alibi_slopes[h]);
    }
    if (d->dcp_size < 0 || d->dcp_size > KVA_MAX_DCP)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: dcp_size = %d is outside [0, %d] (0 or 1 = unsharded)",
                         (int)d->dcp_size, KVA_MAX_DCP);
    if (d->dcp_rank < 0 || d->dcp_rank >= (d->dcp_size > 1 ? d->dcp_size : 1))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: dcp_rank = %d is outside [0, dcp_size = %d)",
                         (int)d->dcp_rank, (int)(d->dcp_size > 1 ? d->dcp_size : 1));
    if (d->dcp_interleave < 0 || d->dcp_interleave > KVA_MAX_SEQ_LEN)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: dcp_interleave = %d is outside [0, %d] (0 means 1)",
                         (int)d->dcp_interleave, KVA_MAX_SEQ_LEN);
    if (d->block_table) {
        if (d->block_size < 1)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_plan_create: block_size = %d, must be >= 1 with a block_table",
                             (int)d->block_size);
        if (d->block_table_stride < 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_plan_create: block_table_stride = %d is negative",
                             (int)d->block_table_stride);
    }
    return KVA_STATUS_OK;
}

/*
 * Checks query_start_loc [R+1], seq_lens [R] and block_table [R, stride]
 * (dcp: the descriptor with its DCP fields resolved, kva__dcp_local_count) and
 * returns, through *max_block_id, the largest block id any request with
 * queries reads (-1 if none).
 */
static kva_status check_batch(const kva_plan_desc *d, const kva_plan_desc *dcp, int avx2,
                              int32_t *max_block_id)
{
    const int32_t R = d->num_requests;
    /* Blocks per request: a shift for the usual power-of-two block sizes
     * (a 64-bit division per request cost more than its row's scan), else
     * a 32-bit division (local + B - 1 < 2^32: local <= KVA_MAX_SEQ_LEN). */
    const uint32_t bs = d->block_table ? (uint32_t)d->block_size : 1u;
    const int bs_shift = (bs & (bs - 1)) == 0 ? __builtin_ctz(bs) : -1;
#if !KVA_X86_SIMD
    (void)avx2;
#endif
    const int32_t *qsl = d->query_start_loc;
    *max_block_id = -1;
    int32_t max_id = -1;
    if (R > 0) {
        if (!qsl)
            return kva__fail(
                KVA_STATUS_NULL_POINTER,
                "kva_plan_create: desc->query_start_loc is NULL with num_requests = %d", (int)R);
        if (!d->seq_lens)
            return kva__fail(KVA_STATUS_NULL_POINTER,
                             "kva_plan_create: desc->seq_lens is NULL with num_requests = %d",
                             (int)R);
    }
    if (qsl && qsl[0] != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: query_start_loc[0] = %d, must be 0", (int)qsl[0]);
    for (int32_t r = 0; r < R; r++) {
        if (qsl[r + 1] < qsl[r])
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_plan_create: query_start_loc decreases at index %d (%d after %d)",
                             (int)(r + 1), (int)qsl[r + 1], (int)qsl[r]);
        int32_t s = d->seq_lens[r];
        if (s < 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_plan_create: seq_lens[%d] = %d is negative", (int)r, (int)s);
        if (s > KVA_MAX_SEQ_LEN)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_plan_create: seq_lens[%d] = %d is above KVA_MAX_SEQ_LEN = %d",
                             (int)r, (int)s, KVA_MAX_SEQ_LEN);
        if (qsl[r + 1] > KVA_MAX_SEQ_LEN)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_plan_create: query_start_loc[%d] = %d: more query tokens than "
                             "KVA_MAX_SEQ_LEN = %d",
                             (int)(r + 1), (int)qsl[r + 1], KVA_MAX_SEQ_LEN);
        int64_t q = (int64_t)qsl[r + 1] - qsl[r];
        /* Causal self-attention places query i at s - q + i, so q <= s. Non-causal
         * calls (encoder, cross-attention) may have more queries than keys. */
        if (d->causal && q > s)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_plan_create: request %d has q_len = %lld (from query_start_loc) "
                             "greater than seq_lens[%d] = %d with causal = 1",
                             (int)r, (long long)q, (int)r, (int)s);
        if (!d->block_table)
            continue;
        /* A sharded plan's block table covers the rank's local tokens only
         * (the count's divisions skipped when unsharded: every token is local). */
        const int64_t local = dcp->dcp_size > 1 ? kva__dcp_local_count(dcp, s) : s;
        const uint32_t up = (uint32_t)local + (bs - 1);
        const int64_t need = bs_shift >= 0 ? (int64_t)(up >> bs_shift) : (int64_t)(up / bs);
        if (need > d->block_table_stride)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "kva_plan_create: block table too short for seq_len: request %d has "
                             "seq_lens = %d (%lld tokens on this rank), needing %lld blocks of "
                             "block_size %d, but block_table_stride = %d",
                             (int)r, (int)s, (long long)local, (long long)need, (int)d->block_size,
                             (int)d->block_table_stride);
        if (q == 0)
            continue; /* No kernel reads this request's blocks. */
        /* The row's largest id and whether any is negative (the sign bit of
         * their OR) in one branch-free pass (it vectorizes: a 64 x 4k decode
         * batch has 16k entries to check every step; AVX2 where the CPU has
         * it, plan_scan_avx2.c); the negative entry is looked up only to
         * name it. */
        const int32_t *row = d->block_table + (int64_t)r * d->block_table_stride;
        int32_t any = 0, hi = -1;
#if KVA_X86_SIMD
        if (avx2)
            kva__plan_scan_row_avx2(row, need, &any, &hi);
        else
#endif
            for (int64_t j = 0; j < need; j++) {
                any |= row[j];
                hi = row[j] > hi ? row[j] : hi;
            }
        if (any < 0)
            for (int64_t j = 0; j < need; j++)
                if (row[j] < 0)
                    return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                                     "kva_plan_create: block_table entry %lld of request %d is %d "
                                     "(negative), but seq_lens[%d] = %d needs it",
                                     (long long)j, (int)r, (int)row[j], (int)r, (int)s);
        max_id = hi > max_id ? hi : max_id;
    }
    *max_block_id = max_id;
    return KVA_STATUS_OK;
}

/*
 * Everything kva_plan_create and kva_plan_update check of ctx and desc
 * before they build anything: the scalars, the backend's capabilities, the
 * batch arrays; on success *dcp holds desc with the DCP fields resolved, *max_block_id the
 * largest block id read and *tree_bits a tree plan's mask words (or NULL; the
 * caller owns them).
 */
kva_status kva__plan_check_desc(kva_context *ctx, const kva_plan_desc *given, kva_plan_desc *dcp,
                                int32_t *max_block_id, uint64_t **tree_bits)
{
    /* A window_left of KVA_MAX_SEQ_LEN or more excludes nothing: it is no
     * window (kvattn.h), for the plans that take none (MLA, indexer, tree)
     * as for the others. */
    const kva_plan_desc *desc = given;
    kva_plan_desc wide;
    if (given->window_left >= KVA_MAX_SEQ_LEN) {
        wide = *given;
        wide.window_left = -1;
        desc = &wide;
    }
    KVA_TRY(check_scalars(desc));
    KVA_TRY(kva__head_dim_check("kva_plan_create", ctx, "head_dim", desc->head_dim));
    if (desc->head_dim_v != 0)
        KVA_TRY(kva__head_dim_check("kva_plan_create", ctx, "head_dim_v", desc->head_dim_v));
    /* The DCP fields resolved (0 means 1), as the plan keeps them. */
    *dcp = *desc;
    if (dcp->dcp_size <= 1) {
        dcp->dcp_size = 1;
        dcp->dcp_rank = 0;
        dcp->dcp_interleave = 1;
    } else if (dcp->dcp_interleave == 0) {
        dcp->dcp_interleave = 1;
    }
    if (desc->kind == KVA_ATTN_MLA && (!ctx->ops || !ctx->ops->mla_attention_paged))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: kind = KVA_ATTN_MLA: backend '%s' has no MLA kernels",
                         kva_backend_name(ctx->backend));
    if (desc->sparse_topk > 0 && (!ctx->ops || !ctx->ops->mla_sparse))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: sparse_topk = %d: backend '%s' has no sparse MLA "
                         "kernels",
                         (int)desc->sparse_topk, kva_backend_name(ctx->backend));
    /* The index list is a sparse plan's mask: causal is ignored, so q_len
     * may exceed seq_len as in a non-causal plan. */
    if (desc->sparse_topk > 0)
        dcp->causal = 0;
    if (desc->kind == KVA_ATTN_MLA && desc->mla_qk_nope_head_dim != 0 &&
        (!ctx->ops || !ctx->ops->mla_run))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: mla_qk_nope_head_dim = %d: backend '%s' has no "
                         "layer-level MLA (kva_mla_run); plan with 0 head sizes for "
                         "kva_attention_run",
                         (int)desc->mla_qk_nope_head_dim, kva_backend_name(ctx->backend));
    if (desc->kind == KVA_ATTN_INDEX && (!ctx->ops || !ctx->ops->indexer))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: kind = KVA_ATTN_INDEX: backend '%s' has no indexer",
                         kva_backend_name(ctx->backend));
    KVA_TRY(check_batch(dcp, dcp, ctx->cpu_features.avx2, max_block_id));
    return kva__plan_tree_bits(desc, tree_bits);
}
