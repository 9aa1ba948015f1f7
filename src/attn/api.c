/*
 * api.c - the public attention entry points: argument validation, then dispatch
 * to the context's backend (kva__backend_ops).
 *
 * Everything about the batch was checked by kva_plan_create, so the checks here
 * are O(1): pointers, the plan against the context, and the plan against the
 * cache's shape and memory space. The run path never loops over the batch on
 * the host and never reads tensor data here, so the CUDA backend can run it
 * under graph capture. On any failure nothing has been written.
 *
 * Empty tensors: when the plan has no query tokens (T == 0), q, out and the
 * ragged k/v may be NULL and the call returns OK after validation without
 * calling the backend. Likewise for kva_merge_states with T == 0 (H, Dv are
 * shape dimensions and must be valid even then: the header's zero-size rule).
 */
#include "internal.h"

/* The failure of a call whose operation op the context's backend lacks. */
static kva_status not_implemented(const char *fn, const char *op, const kva_context *ctx)
{
    return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: %s is not implemented by backend '%s'", fn, op,
                     ctx->ops && ctx->ops->name ? ctx->ops->name : kva_backend_name(ctx->backend));
}

/* Checks shared by the paged and the ragged run: the plan belongs to ctx's
 * backend and ctx holds the workspace the plan reserved. */
static kva_status check_plan_for_context(const char *fn, const kva_context *ctx,
                                         const kva_plan *plan)
{
    if (plan->backend != ctx->backend)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: plan was built by backend '%s', but the context's backend is '%s'",
                         fn, kva_backend_name(plan->backend), kva_backend_name(ctx->backend));
    if (ctx->workspace_bytes < plan->workspace_bytes)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: plan needs %zu workspace bytes but the context has %zu: the plan "
                         "was built with another context; run it on a context that created it "
                         "or a plan from the same descriptor with the same thread count",
                         fn, plan->workspace_bytes, ctx->workspace_bytes);
    return KVA_STATUS_OK;
}

/* Checks the plan against ctx (check_plan_for_context), then that the cache
 * has the shape, dtype, block ids and memory space the plan expects. */
static kva_status check_cache_for_plan(const char *fn, const kva_context *ctx, const kva_plan *plan,
                                       const kva_cache *cache)
{
    const kva_cache_desc *c = &cache->desc;
    const kva_plan_desc *d = &plan->d;
    KVA_TRY(check_plan_for_context(fn, ctx, plan));
    /* A plan of no request may come without arrays (kvattn.h, Zero sizes:
     * its empty block table may be NULL); it runs nothing either way. */
    if (!plan->block_table && d->num_requests > 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: plan has no block_table (it was built for kva_attention_run_ragged)",
                         fn);
    if (c->kind != d->kind)
        return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                         "%s: cache kind = %d but plan kind = %d (kva_attn_kind)", fn, (int)c->kind,
                         (int)d->kind);
    const struct {
        const char *name;
        int32_t cache, plan;
    } dims[] = {{"num_kv_heads", c->num_kv_heads, d->num_kv_heads},
                {"head_dim", c->head_dim, d->head_dim},
                {"head_dim_v", c->head_dim_v, d->head_dim_v},
                {"block_size", c->block_size, d->block_size}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].cache != dims[i].plan)
            return kva__fail(KVA_STATUS_SHAPE_MISMATCH, "%s: cache %s = %d but plan %s = %d", fn,
                             dims[i].name, (int)dims[i].cache, dims[i].name, (int)dims[i].plan);
    /* Quantized caches are dequantized inside the kernels, so they serve any
     * q_dtype; unquantized caches are read as q_dtype. */
    if (c->quant == KVA_QUANT_NONE && c->dtype != d->q_dtype)
        return kva__fail(KVA_STATUS_DTYPE_MISMATCH,
                         "%s: cache dtype %s differs from plan q_dtype %s (unquantized caches "
                         "must match)",
                         fn, kva_dtype_name(c->dtype), kva_dtype_name(d->q_dtype));
    if (plan->max_block_id >= c->num_blocks)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                         "%s: block table references block %d but cache has %d blocks (num_blocks)",
                         fn, (int)plan->max_block_id, (int)c->num_blocks);
    /* Kernels read the cache where it lives: in the context's own memory
     * space (ref and CPU share host memory), on the context's device. */
    return kva__cache_check_space(fn, ctx, cache);
}

/* Checks that every tensor pointer given is aligned to its element size (q, k,
 * v and out: the plan's q_dtype; sinks and lse: float32). NULL optional ones pass. */
static kva_status check_aligned_tensors(const kva_plan *plan, const void *q, const void *k,
                                        const void *v, const float *sinks, const void *out,
                                        const float *lse)
{
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    KVA_CHECK_ALIGNED(q, es);
    KVA_CHECK_ALIGNED(k, es);
    KVA_CHECK_ALIGNED(v, es);
    KVA_CHECK_ALIGNED(out, es);
    KVA_CHECK_ALIGNED(sinks, sizeof(float));
    KVA_CHECK_ALIGNED(lse, sizeof(float));
    return KVA_STATUS_OK;
}

/* out [T, H, Dv] and lse [T, H] of an attention run, against its inputs:
 * q [T, H, Dq], sinks [H], extra (the ragged k / v, MLA weights, sparse
 * indices) and the cache's storage when cache is given. */
static kva_status check_run_aliasing(const char *fn, const kva_plan *plan, const void *q,
                                     int64_t Dq, const kva_cache *cache, const float *sinks,
                                     const kva__span *extra, int n_extra, const void *out,
                                     int64_t Dv, const float *lse)
{
    const int64_t T = plan->info.num_tokens, H = plan->d.num_heads;
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    kva__span ins[8] = {{"q", q, kva__span_bytes(T * H, Dq, es), 0, 0},
                        {"sinks", sinks, kva__span_bytes(H, 1, sizeof(float)), 0, 0}};
    int ni = 2;
    if (cache) {
        kva__cache_spans(cache, &ins[2]);
        ni = 5;
    }
    for (int i = 0; i < n_extra && ni < 8; i++)
        ins[ni++] = extra[i];
    const kva__span outs[2] = {{"out", out, kva__span_bytes(T * H, Dv, es), 0, 0},
                               {"lse", lse, kva__span_bytes(T * H, 1, sizeof(float)), 0, 0}};
    return kva__check_disjoint(fn, outs, 2, ins, ni);
}

/* The dense runs (kva_attention_run, kva_mla_run) refuse indexer plans
 * (kva_indexer_run's), sparse plans and fp8_ds_mla caches, which only
 * kva_mla_sparse_run reads. */
static kva_status check_dense(const char *fn, const kva_plan *plan, const kva_cache *cache)
{
    if (plan->d.kind == KVA_ATTN_INDEX)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: the plan is an indexer plan (kind KVA_ATTN_INDEX): run it with "
                         "kva_indexer_run",
                         fn);
    if (plan->d.sparse_topk > 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: the plan is a sparse MLA plan (sparse_topk = %d): run it with "
                         "kva_mla_sparse_run",
                         fn, (int)plan->d.sparse_topk);
    if (cache->desc.quant == KVA_QUANT_FP8_DS_MLA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: the cache is an fp8_ds_mla cache, which sparse MLA plans read "
                         "(kva_mla_sparse_run) and dense plans do not",
                         fn);
    return KVA_STATUS_OK;
}

kva_status kva_attention_run(kva_context *ctx, const kva_plan *plan, const void *q,
                             const kva_cache *cache, const float *sinks, void *out, float *lse)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(cache);
    const int32_t T = plan->info.num_tokens;
    if (T > 0) {
        KVA_CHECK_PTR(q);
        KVA_CHECK_PTR(out);
    }
    KVA_TRY(check_cache_for_plan(__func__, ctx, plan, cache));
    KVA_TRY(check_dense(__func__, plan, cache));
    if (T == 0)
        return KVA_STATUS_OK;
    KVA_TRY(check_aligned_tensors(plan, q, NULL, NULL, sinks, out, lse));
    KVA_TRY(check_run_aliasing(__func__, plan, q, plan->d.head_dim, cache, sinks, NULL, 0, out,
                               plan->d.head_dim_v, lse));
    /* A sharded plan's partials are combined: the sink joins on rank 0 only
     * (MHA and MLA plans alike). */
    if (plan->d.dcp_rank != 0)
        sinks = NULL;
    /* MLA plans were refused at plan time by a backend without MLA kernels. */
    if (plan->d.kind == KVA_ATTN_MLA)
        return ctx->ops->mla_attention_paged(ctx, plan, q, cache, sinks, out, lse);
    if (!ctx->ops || !ctx->ops->attention_paged)
        return not_implemented(__func__, "attention_paged", ctx);
    if (plan->cascade)
        return kva__cascade_run(ctx, plan, q, cache, sinks, out, lse);
    return ctx->ops->attention_paged(ctx, plan, q, cache, sinks, out, lse);
}

kva_status kva_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                       const void *w_uv, const kva_cache *cache, void *out, float *lse)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(cache);
    if (plan->d.kind != KVA_ATTN_MLA)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: plan kind = %d is not KVA_ATTN_MLA", (int)plan->d.kind);
    if (plan->d.sparse_topk > 0)
        return check_dense(__func__, plan, cache);
    if (plan->d.mla_qk_nope_head_dim == 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: the plan was built without mla_qk_nope_head_dim / "
                         "mla_v_head_dim (a kernel-level plan for kva_attention_run)");
    const int32_t T = plan->info.num_tokens;
    if (T > 0) {
        KVA_CHECK_PTR(q);
        KVA_CHECK_PTR(w_uk);
        KVA_CHECK_PTR(w_uv);
        KVA_CHECK_PTR(out);
    }
    KVA_TRY(check_cache_for_plan(__func__, ctx, plan, cache));
    KVA_TRY(check_dense(__func__, plan, cache));
    if (T == 0)
        return KVA_STATUS_OK;
    KVA_TRY(check_aligned_tensors(plan, q, w_uk, w_uv, NULL, out, lse));
    /* q [T, H, Dn + Dr], w_uk [H, Dn, Dc], w_uv [H, Dc, Dv], out [T, H, Dv]. */
    const int64_t H = plan->d.num_heads, Dc = plan->d.head_dim_v,
                  Dr = plan->d.head_dim - plan->d.head_dim_v, Dn = plan->d.mla_qk_nope_head_dim,
                  Dv = plan->d.mla_v_head_dim;
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    const kva__span w[2] = {{"w_uk", w_uk, kva__span_bytes(H * Dn, Dc, es), 0, 0},
                            {"w_uv", w_uv, kva__span_bytes(H * Dc, Dv, es), 0, 0}};
    KVA_TRY(check_run_aliasing(__func__, plan, q, Dn + Dr, cache, NULL, w, 2, out, Dv, lse));
    /* Plans with MLA head sizes were refused at plan time by a backend
     * without the layer-level call. */
    return ctx->ops->mla_run(ctx, plan, q, w_uk, w_uv, cache, out, lse);
}

/* Host backends read indices and topk_length in host memory: every row a
 * run reads is checked before anything is written. Row t of request r
 * reads its first topk_length[t] entries (all K without topk_length), each
 * -1 or a position below seq_len. */
static kva_status check_sparse_indices(const kva_plan *plan, const int32_t *indices, int64_t stride,
                                       const int32_t *topk_length)
{
    const int32_t K = plan->d.sparse_topk;
    for (int32_t r = 0; r < plan->d.num_requests; r++) {
        const int32_t s = plan->seq_lens[r];
        for (int32_t t = plan->query_start_loc[r]; t < plan->query_start_loc[r + 1]; t++) {
            int32_t n = K;
            if (topk_length) {
                n = topk_length[t];
                if (n < 0 || n > K)
                    return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                                     "kva_mla_sparse_run: topk_length[%d] = %d is outside [0, "
                                     "%d] (sparse_topk); nothing was written",
                                     (int)t, (int)n, (int)K);
            }
            const int32_t *row = indices + (int64_t)t * stride;
            for (int32_t e = 0; e < n; e++)
                if (row[e] < -1 || row[e] >= s)
                    return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                                     "kva_mla_sparse_run: indices[token %d, entry %d] = %d is "
                                     "outside [-1, %d) (request %d's seq_len %d; -1 = unused); "
                                     "nothing was written",
                                     (int)t, (int)e, (int)row[e], (int)s, (int)r, (int)s);
        }
    }
    return KVA_STATUS_OK;
}

kva_status kva_mla_sparse_run(kva_context *ctx, const kva_plan *plan, const void *q,
                              const kva_cache *cache, const int32_t *indices,
                              int64_t indices_stride, const int32_t *topk_length,
                              const float *sinks, void *out, float *lse)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(cache);
    if (plan->d.kind != KVA_ATTN_MLA || plan->d.sparse_topk <= 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_sparse_run: plan kind = %d, sparse_topk = %d: a sparse MLA plan "
                         "has kind KVA_ATTN_MLA and sparse_topk > 0 (dense plans run with "
                         "kva_attention_run)",
                         (int)plan->d.kind, (int)plan->d.sparse_topk);
    const int32_t T = plan->info.num_tokens, K = plan->d.sparse_topk;
    KVA_TRY(kva__resolve_token_stride(__func__, "indices_stride", indices_stride, K, T,
                                      sizeof(int32_t), &indices_stride));
    if (T > 0) {
        KVA_CHECK_PTR(q);
        KVA_CHECK_PTR(indices);
        KVA_CHECK_PTR(out);
    }
    KVA_TRY(check_cache_for_plan(__func__, ctx, plan, cache));
    if (T == 0)
        return KVA_STATUS_OK;
    KVA_TRY(check_aligned_tensors(plan, q, NULL, NULL, sinks, out, lse));
    KVA_CHECK_ALIGNED(indices, sizeof(int32_t));
    KVA_CHECK_ALIGNED(topk_length, sizeof(int32_t));
    /* indices [T, K] at row stride indices_stride, topk_length [T]. */
    const kva__span ix[2] = {
        {"indices", indices,
         kva__span_bytes(1, (int64_t)(T - 1) * indices_stride + K, sizeof(int32_t)), 0, 0},
        {"topk_length", topk_length, kva__span_bytes(T, 1, sizeof(int32_t)), 0, 0}};
    KVA_TRY(check_run_aliasing(__func__, plan, q, plan->d.head_dim, cache, sinks, ix, 2, out,
                               plan->d.head_dim_v, lse));
    /* Device backends cannot read device indices here; their kernels treat
     * out-of-range entries as unused (kvattn_mla.h). */
    if (ctx->ops->memory->host)
        KVA_TRY(check_sparse_indices(plan, indices, indices_stride, topk_length));
    /* Sparse plans were refused at plan time by a backend without the kernel. */
    return ctx->ops->mla_sparse(ctx, plan, q, cache, indices, indices_stride, topk_length, sinks,
                                out, lse);
}

kva_status kva_attention_run_ragged(kva_context *ctx, const kva_plan *plan, const void *q,
                                    const void *k, const void *v, const float *sinks, void *out,
                                    float *lse)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    const int32_t T = plan->info.num_tokens;
    if (T > 0) {
        KVA_CHECK_PTR(q);
        KVA_CHECK_PTR(k);
        KVA_CHECK_PTR(v);
        KVA_CHECK_PTR(out);
    }
    KVA_TRY(check_plan_for_context(__func__, ctx, plan));
    if (plan->d.kind != KVA_ATTN_MHA)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run_ragged: plan kind is %s: MLA runs over a latent cache "
                         "(kva_attention_run, kva_mla_run), the indexer over an index-key cache "
                         "(kva_indexer_run)",
                         plan->d.kind == KVA_ATTN_MLA ? "KVA_ATTN_MLA" : "KVA_ATTN_INDEX");
    if (plan->cascade)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run_ragged: the plan is a cascade plan (it reads shared "
                         "blocks of a paged cache): run it with kva_attention_run");
    if (T == 0)
        return KVA_STATUS_OK;
    KVA_TRY(check_aligned_tensors(plan, q, k, v, sinks, out, lse));
    /* k [N, Hkv, D], v [N, Hkv, Dv], N = the plan's key rows (sum of its kv lengths). */
    const int64_t N = plan->kv_start[plan->d.num_requests], Hkv = plan->d.num_kv_heads;
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    const kva__span kv[2] = {{"k", k, kva__span_bytes(N, Hkv * plan->d.head_dim, es), 0, 0},
                             {"v", v, kva__span_bytes(N, Hkv * plan->d.head_dim_v, es), 0, 0}};
    KVA_TRY(check_run_aliasing(__func__, plan, q, plan->d.head_dim, NULL, sinks, kv, 2, out,
                               plan->d.head_dim_v, lse));
    if (!ctx->ops || !ctx->ops->attention_ragged)
        return not_implemented(__func__, "attention_ragged", ctx);
    if (plan->d.dcp_rank != 0)
        sinks = NULL; /* as in kva_attention_run */
    return ctx->ops->attention_ragged(ctx, plan, q, k, v, sinks, out, lse);
}

/* The shape checks of kva_merge_states and kva_merge_states_n (fn names the
 * caller): T >= 0, H a shape dimension, Dv a head size of ctx's backend,
 * dtype a float dtype. */
static kva_status check_merge_shape(const char *fn, const kva_context *ctx, int32_t num_tokens,
                                    int32_t num_heads, int32_t head_dim_v, kva_dtype dtype)
{
    if (num_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: num_tokens = %d is negative", fn,
                         (int)num_tokens);
    if (num_heads < 1 || num_heads > KVA_MAX_HEADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_heads = %d is outside [1, %d] (KVA_MAX_HEADS; "
                         "a shape dimension, never 0)",
                         fn, (int)num_heads, KVA_MAX_HEADS);
    if (!kva__head_dim_ok(head_dim_v))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: head_dim_v = %d is unsupported (multiples of 8 from 8 to %d)", fn,
                         (int)head_dim_v, KVA_MAX_HEAD_DIM);
    KVA_TRY(kva__head_dim_check(fn, ctx, "head_dim_v", head_dim_v));
    if (!kva__dtype_is_float(dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: dtype %d (%s) is not f32, f16 or bf16", fn,
                         (int)dtype, kva_dtype_name(dtype));
    return KVA_STATUS_OK;
}

kva_status kva_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                            int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                            const float *lse_a, const void *out_b, const float *lse_b, void *out,
                            float *lse_out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_TRY(check_merge_shape("kva_merge_states", ctx, num_tokens, num_heads, head_dim_v, dtype));
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(out_a);
    KVA_CHECK_PTR(lse_a);
    KVA_CHECK_PTR(out_b);
    KVA_CHECK_PTR(lse_b);
    KVA_CHECK_PTR(out);
    KVA_CHECK_PTR(lse_out);
    const size_t es = kva_dtype_size(dtype);
    KVA_CHECK_ALIGNED(out_a, es);
    KVA_CHECK_ALIGNED(out_b, es);
    KVA_CHECK_ALIGNED(out, es);
    KVA_CHECK_ALIGNED(lse_a, sizeof(float));
    KVA_CHECK_ALIGNED(lse_b, sizeof(float));
    KVA_CHECK_ALIGNED(lse_out, sizeof(float));
    /* In place means the same pointer: out may be out_a or out_b, lse_out
     * lse_a or lse_b (kvattn_merge.h); an input it equals leaves the check
     * (its range is the output's, checked against the rest), every other
     * overlap is refused. */
    const size_t out_bytes = (size_t)num_tokens * (size_t)num_heads * (size_t)head_dim_v * es;
    const size_t lse_bytes = (size_t)num_tokens * (size_t)num_heads * sizeof(float);
    const kva__span outs[2] = {{"out", out, out_bytes, 0, 0},
                               {"lse_out", lse_out, lse_bytes, 0, 0}};
    const kva__span ins[4] = {{"out_a", out_a == out ? NULL : out_a, out_bytes, 0, 0},
                              {"out_b", out_b == out ? NULL : out_b, out_bytes, 0, 0},
                              {"lse_a", lse_a == lse_out ? NULL : lse_a, lse_bytes, 0, 0},
                              {"lse_b", lse_b == lse_out ? NULL : lse_b, lse_bytes, 0, 0}};
    KVA_TRY(kva__check_disjoint("kva_merge_states", outs, 2, ins, 4));
    if (!ctx->ops || !ctx->ops->merge_states)
        return not_implemented(__func__, "merge_states", ctx);
    return ctx->ops->merge_states(ctx, num_tokens, num_heads, head_dim_v, dtype, out_a, lse_a,
                                  out_b, lse_b, out, lse_out);
}

kva_status kva_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                              int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                              const void *outs, int64_t out_stride, const float *lses,
                              int64_t lse_stride, void *out, float *lse_out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    if (num_parts < 1 || num_parts > KVA_MAX_DCP)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_merge_states_n: num_parts = %d is outside [1, %d] (KVA_MAX_DCP)",
                         (int)num_parts, KVA_MAX_DCP);
    KVA_TRY(check_merge_shape("kva_merge_states_n", ctx, num_tokens, num_heads, head_dim_v, dtype));
    const int64_t rows = (int64_t)num_tokens * num_heads, part = rows * head_dim_v;
    if (out_stride == 0)
        out_stride = part;
    if (lse_stride == 0)
        lse_stride = rows;
    if (out_stride < part || lse_stride < rows)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_merge_states_n: out_stride = %lld / lse_stride = %lld elements, must "
                         "be 0 or at least one part (%lld / %lld)",
                         (long long)out_stride, (long long)lse_stride, (long long)part,
                         (long long)rows);
    /* The last part ends at (P-1)*stride + part elements; its byte offset must
     * fit a signed 64-bit integer (as kva_cache_write's token strides). */
    const int64_t es64 = (int64_t)kva_dtype_size(dtype);
    if (num_parts > 1 &&
        (out_stride > (PTRDIFF_MAX / es64 - part) / (num_parts - 1) ||
         lse_stride > ((int64_t)(PTRDIFF_MAX / sizeof(float)) - rows) / (num_parts - 1)))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_merge_states_n: out_stride = %lld / lse_stride = %lld elements with "
                         "num_parts = %d overflows the address space",
                         (long long)out_stride, (long long)lse_stride, (int)num_parts);
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(outs);
    KVA_CHECK_PTR(lses);
    KVA_CHECK_PTR(out);
    const size_t es = kva_dtype_size(dtype);
    KVA_CHECK_ALIGNED(outs, es);
    KVA_CHECK_ALIGNED(out, es);
    KVA_CHECK_ALIGNED(lses, sizeof(float));
    KVA_CHECK_ALIGNED(lse_out, sizeof(float));
    /* The spans the inputs cover (first to last element, gaps included). */
    const size_t out_bytes = (size_t)part * es, lse_bytes = (size_t)rows * sizeof(float);
    const size_t outs_span = ((size_t)(num_parts - 1) * (size_t)out_stride + (size_t)part) * es;
    const size_t lses_span =
        ((size_t)(num_parts - 1) * (size_t)lse_stride + (size_t)rows) * sizeof(float);
    if (kva__overlaps(out, out_bytes, outs, outs_span) ||
        kva__overlaps(out, out_bytes, lses, lses_span))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_merge_states_n: out overlaps the inputs outs or lses");
    if (lse_out && (kva__overlaps(lse_out, lse_bytes, outs, outs_span) ||
                    kva__overlaps(lse_out, lse_bytes, lses, lses_span) ||
                    kva__overlaps(lse_out, lse_bytes, out, out_bytes)))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_merge_states_n: lse_out overlaps outs, lses or out");
    if (!ctx->ops || !ctx->ops->merge_states_n)
        return not_implemented(__func__, "merge_states_n", ctx);
    return ctx->ops->merge_states_n(ctx, num_parts, num_tokens, num_heads, head_dim_v, dtype, outs,
                                    out_stride, lses, lse_stride, out, lse_out);
}

/* The indexer (kvattn_mla.h): O(1) checks as every run, then the backend.
 * Nothing is written on failure. */
kva_status kva_indexer_run(kva_context *ctx, const kva_plan *plan, const void *q,
                           const float *weights, const kva_cache *cache, int32_t *indices,
                           int64_t indices_stride, int32_t *topk_length)
{
    static const char fn[] = "kva_indexer_run";
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(cache);
    if (plan->d.kind != KVA_ATTN_INDEX)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: plan kind = %d is not KVA_ATTN_INDEX",
                         fn, (int)plan->d.kind);
    const int32_t T = plan->info.num_tokens, K = plan->d.sparse_topk;
    KVA_TRY(kva__resolve_token_stride(fn, "indices_stride", indices_stride, K, T, sizeof(int32_t),
                                      &indices_stride));
    if (T > 0) {
        KVA_CHECK_PTR(q);
        KVA_CHECK_PTR(weights);
        KVA_CHECK_PTR(indices);
    }
    KVA_TRY(check_cache_for_plan(fn, ctx, plan, cache));
    if (T == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_ALIGNED(q, kva_dtype_size(plan->d.q_dtype));
    KVA_CHECK_ALIGNED(weights, sizeof(float));
    KVA_CHECK_ALIGNED(indices, sizeof(int32_t));
    KVA_CHECK_ALIGNED(topk_length, sizeof(int32_t));
    /* q [T, Hi, D], weights [T, Hi] and the cache in; indices [T, K] at row
     * stride indices_stride and topk_length [T] out. */
    const int64_t Hi = plan->d.num_heads;
    kva__span ins[5] = {
        {"q", q, kva__span_bytes(T * Hi, plan->d.head_dim, kva_dtype_size(plan->d.q_dtype)), 0, 0},
        {"weights", weights, kva__span_bytes(T, Hi, sizeof(float)), 0, 0}};
    kva__cache_spans(cache, &ins[2]);
    const kva__span outs[2] = {
        {"indices", indices,
         kva__span_bytes(1, (int64_t)(T - 1) * indices_stride + K, sizeof(int32_t)), 0, 0},
        {"topk_length", topk_length, kva__span_bytes(T, 1, sizeof(int32_t)), 0, 0}};
    KVA_TRY(kva__check_disjoint(fn, outs, 2, ins, 5));
    /* Indexer plans were refused at plan time by a backend without one. */
    return ctx->ops->indexer(ctx, plan, q, weights, cache, indices, indices_stride, topk_length);
}
