/*
 * plan.c - builds one step's kva_plan from its checked batch metadata.
 *
 * kva_plan_create checks the whole kva_plan_desc (plan_check.c), copies its
 * host arrays into the plan, classifies the step (kva_attn_state, vLLM-Ascend
 * semantics), and lets the context's backend partition the work
 * (ops->plan_build). Everything the run path needs later is checked once at
 * plan time, so kva_attention_run only compares a few scalars against the
 * cache (O(1), graph-capture friendly).
 *
 * Requests with q_len == 0 (padding, or requests that only hold context)
 * produce no output rows. They are ignored by the classification, the
 * decode/prefill counts, decode_first, max_q_len and max_seq_len (and by the
 * block id check: plan_check.c).
 */
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *kva_attn_state_name(kva_attn_state state)
{
    switch (state) {
    case KVA_STATE_PREFILL_NO_CACHE:
        return "prefill_no_cache";
    case KVA_STATE_PREFILL_CACHE_HIT:
        return "prefill_cache_hit";
    case KVA_STATE_DECODE_ONLY:
        return "decode_only";
    case KVA_STATE_CHUNKED_PREFILL:
        return "chunked_prefill";
    case KVA_STATE_SPEC_DECODING:
        return "spec_decoding";
    case KVA_STATE_EMPTY:
        return "empty";
    default:
        return "invalid";
    }
}

/* Fills plan->info from the copied metadata (decode_threshold already resolved). */
static void classify(kva_plan *p)
{
    kva_plan_info *in = &p->info;
    const int32_t R = p->d.num_requests;
    const int32_t thr = p->d.decode_threshold;
    int any_spec = 0, any_context = 0, seen_prefill = 0;
    memset(in, 0, sizeof *in);
    in->num_tokens = R > 0 ? p->query_start_loc[R] : 0;
    in->decode_first = 1;
    for (int32_t r = 0; r < R; r++) {
        int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        int32_t s = p->seq_lens[r];
        if (q == 0)
            continue;
        if (q <= thr) {
            in->num_decodes++;
            in->num_decode_tokens += q;
            any_spec |= q > 1;
            if (seen_prefill)
                in->decode_first = 0;
        } else {
            in->num_prefills++;
            in->num_prefill_tokens += q;
            seen_prefill = 1;
            any_context |= s > q;
        }
        if (q > in->max_q_len)
            in->max_q_len = q;
        if (s > in->max_seq_len)
            in->max_seq_len = s;
    }
    if (in->num_tokens == 0)
        in->state = KVA_STATE_EMPTY;
    else if (in->num_prefills == 0)
        in->state = any_spec ? KVA_STATE_SPEC_DECODING : KVA_STATE_DECODE_ONLY;
    else if (in->num_decodes == 0)
        in->state = any_context ? KVA_STATE_PREFILL_CACHE_HIT : KVA_STATE_PREFILL_NO_CACHE;
    else
        in->state = KVA_STATE_CHUNKED_PREFILL;
}

/* Frees the host copies and the plan; the backend part must be released first. */
static void free_plan(kva_plan *p)
{
    kva__cascade_free(p);
    free(p->query_start_loc);
    free(p->seq_lens);
    free(p->kv_lens);
    free(p->kv_start);
    free(p->block_table);
    free(p->alibi_slopes);
    free(p->tree_bits);
    free(p);
}

/* Releases a plan's backend part and frees it (and its spare, if any). */
static void destroy_plan(kva_plan *p)
{
    if (!p)
        return;
    destroy_plan(p->spare);
    p->spare = NULL;
    if (p->ops && p->ops->plan_release)
        p->ops->plan_release(p);
    free_plan(p);
}

/* Grows *a to n elements of size sz (at least one), keeping *cap; 0 when out
 * of memory (*a unchanged). The contents are not kept. */
static int grow_array(void **a, int64_t *cap, int64_t n, size_t sz)
{
    if (n < 1)
        n = 1;
    if (*a && n <= *cap)
        return 1;
    if ((uint64_t)n > SIZE_MAX / sz)
        return 0;
    void *q = malloc((size_t)n * sz);
    if (!q)
        return 0;
    free(*a);
    *a = q;
    *cap = n;
    return 1;
}

/*
 * Builds the plan of a checked desc (kva__plan_check_desc's dcp,
 * max_block_id and tree_bits, which p takes over) in p: p's host arrays are
 * reused where large enough, and a backend part left in p by plan_recycle
 * is rebuilt in place. On failure p keeps only memory (arrays, no backend
 * part, no cascade) and is to be freed by the caller.
 */
static kva_status build_plan(kva_context *ctx, const kva_plan_desc *desc, const kva_plan_desc *dcp,
                             int32_t max_block_id, uint64_t *tree_bits, kva_plan *p)
{
    const int32_t R = desc->num_requests;
    const int32_t H = desc->num_heads;
    const int64_t bt_elems = desc->block_table ? (int64_t)R * desc->block_table_stride : 0;
    free(p->tree_bits);
    p->tree_bits = tree_bits;
    p->ops = ctx->ops;
    p->backend = ctx->backend;
    int64_t cap_qsl = p->cap_reqs, cap_sl = p->cap_reqs, cap_kvl = p->cap_reqs,
            cap_kvs = p->cap_reqs, cap_al = p->cap_heads;
    int ok = grow_array((void **)&p->query_start_loc, &cap_qsl, (int64_t)R + 1, sizeof(int32_t)) &&
             grow_array((void **)&p->seq_lens, &cap_sl, (int64_t)R + 1, sizeof(int32_t)) &&
             grow_array((void **)&p->kv_lens, &cap_kvl, (int64_t)R + 1, sizeof(int32_t)) &&
             grow_array((void **)&p->kv_start, &cap_kvs, (int64_t)R + 1, sizeof(int64_t));
    if (ok)
        p->cap_reqs = cap_qsl;
    if (ok && desc->block_table)
        ok = grow_array((void **)&p->block_table, &p->cap_bt, bt_elems, sizeof(int32_t));
    if (ok && desc->alibi_slopes) {
        ok = grow_array((void **)&p->alibi_slopes, &cap_al, H, sizeof(float));
        if (ok)
            p->cap_heads = cap_al;
    }
    if (!ok) {
        if (p->ops && p->ops->plan_release)
            p->ops->plan_release(p);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory copying the metadata of %d requests "
                         "(block_table_stride = %d)",
                         (int)R, (int)desc->block_table_stride);
    }

    /* Host copies; an empty batch may come without arrays at all. */
    p->query_start_loc[0] = 0;
    if (R > 0) {
        memcpy(p->query_start_loc, desc->query_start_loc, ((size_t)R + 1) * sizeof(int32_t));
        memcpy(p->seq_lens, desc->seq_lens, (size_t)R * sizeof(int32_t));
    }
    p->kv_start[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        p->kv_lens[r] =
            dcp->dcp_size > 1 ? (int32_t)kva__dcp_local_count(dcp, p->seq_lens[r]) : p->seq_lens[r];
        p->kv_start[r + 1] = p->kv_start[r] + p->kv_lens[r];
    }
    /* A plan without a block table (ragged) or ALiBi has NULL there. */
    if (!desc->block_table) {
        free(p->block_table);
        p->block_table = NULL;
        p->cap_bt = 0;
    } else if (bt_elems > 0) {
        memcpy(p->block_table, desc->block_table, (size_t)bt_elems * sizeof(int32_t));
    }
    if (!desc->alibi_slopes) {
        free(p->alibi_slopes);
        p->alibi_slopes = NULL;
        p->cap_heads = 0;
    } else {
        memcpy(p->alibi_slopes, desc->alibi_slopes, (size_t)H * sizeof(float));
    }
    p->max_block_id = max_block_id;
    p->workspace_bytes = 0;

    /* Resolved scalars; the pointer fields stay NULL so nobody reads the caller's arrays. */
    p->d = *dcp;
    p->d.query_start_loc = NULL;
    p->d.seq_lens = NULL;
    p->d.block_table = NULL;
    p->d.alibi_slopes = NULL;
    p->d.tree_parents = NULL;
    p->d.tree_mask = NULL;
    p->d.cascade_group = NULL; /* read by kva__cascade_plan from desc */
    p->d.cascade_prefix_len = NULL;
    if (!desc->block_table) {
        p->d.block_table_stride = 0;
    }
    if (p->d.head_dim_v == 0)
        p->d.head_dim_v = p->d.head_dim;
    if (p->d.scale == 0.0f)
        p->d.scale = (float)(1.0 / sqrt((double)p->d.head_dim));
    if (p->d.window_left >= KVA_MAX_SEQ_LEN)
        p->d.window_left = -1; /* wider than any sequence: excludes nothing */
    if (p->d.decode_threshold == 0)
        p->d.decode_threshold = 1;
    p->d.causal = dcp->causal != 0;
    classify(p);

    /* A cascade plan runs as two plans of its own (src/plan/cascade.c). */
    /* Indexer plans never cascade (check_index); backends build them in
     * their plan_build like any plan. */
    kva_status st = desc->kind == KVA_ATTN_INDEX ? KVA_STATUS_OK : kva__cascade_plan(ctx, desc, p);
    if (st == KVA_STATUS_OK && !p->cascade && ctx->ops && ctx->ops->plan_build)
        st = ctx->ops->plan_build(ctx, p);
    else if (p->ops && p->ops->plan_release)
        p->ops->plan_release(p); /* a recycled part a cascade plan does not use */
    if (st != KVA_STATUS_OK) {
        /* plan_release accepts a partly built plan (part/device NULL or valid). */
        if (ctx->ops && ctx->ops->plan_release)
            ctx->ops->plan_release(p);
        kva__cascade_free(p);
    }
    return st;
}

kva_status kva_plan_create(kva_context *ctx, const kva_plan_desc *desc, kva_plan **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(out);
    kva_plan_desc dcp;
    int32_t max_block_id = -1;
    uint64_t *tree_bits = NULL;
    KVA_TRY(kva__plan_check_desc(ctx, desc, &dcp, &max_block_id, &tree_bits));
    kva_plan *p = calloc(1, sizeof *p);
    if (!p) {
        free(tree_bits);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
    }
    const kva_status st = build_plan(ctx, desc, &dcp, max_block_id, tree_bits, p);
    if (st != KVA_STATUS_OK) {
        free_plan(p);
        return st;
    }
    *out = p;
    return KVA_STATUS_OK;
}

kva_status kva_plan_update(kva_context *ctx, kva_plan *plan, const kva_plan_desc *desc)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(desc);
    if (plan->ops != ctx->ops)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_update: the plan was built by backend '%s', the context is "
                         "backend '%s'",
                         kva_backend_name(plan->backend), kva_backend_name(ctx->backend));
    kva_plan_desc dcp;
    int32_t max_block_id = -1;
    uint64_t *tree_bits = NULL;
    KVA_TRY(kva__plan_check_desc(ctx, desc, &dcp, &max_block_id, &tree_bits));
    /* The new plan is built in the spare (the plan before last's memory),
     * so that a failure leaves the plan as it was; then the two swap. */
    kva_plan *n = plan->spare ? plan->spare : calloc(1, sizeof *n);
    plan->spare = NULL;
    if (!n) {
        free(tree_bits);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_update: out of memory");
    }
    const kva_status st = build_plan(ctx, desc, &dcp, max_block_id, tree_bits, n);
    if (st != KVA_STATUS_OK) {
        free_plan(n);
        return st;
    }
    const kva_plan old = *plan;
    *plan = *n;
    *n = old;
    /* The old plan becomes the spare: its cascade and tree words go, its
     * arrays stay, and its backend part is kept for reuse where the backend
     * can rebuild in place (plan_recycle) or released. */
    kva__cascade_free(n);
    free(n->tree_bits);
    n->tree_bits = NULL;
    if (n->ops && n->ops->plan_recycle)
        n->ops->plan_recycle(n);
    else if (n->ops && n->ops->plan_release)
        n->ops->plan_release(n);
    plan->spare = n;
    return KVA_STATUS_OK;
}

void kva_plan_destroy(kva_plan *plan)
{
    destroy_plan(plan);
}

int64_t kva__sparse_gather_rows(const kva_plan *p)
{
    if (p->d.sparse_topk <= 0 || p->d.sparse_mode != KVA_SPARSE_SEPARATE)
        return 0;
    int64_t rows = 0;
    for (int32_t r = 0; r < p->d.num_requests; r++) {
        const int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        if (q > p->d.decode_threshold && p->seq_lens[r] > rows)
            rows = p->seq_lens[r];
    }
    return rows;
}

kva_status kva_plan_get_info(const kva_plan *plan, kva_plan_info *out)
{
    kva__clear_error();
    KVA_CHECK_PTR(plan);
    KVA_CHECK_PTR(out);
    *out = plan->info;
    return KVA_STATUS_OK;
}

kva_status kva_batch_reorder_decode_first(int32_t num_requests, const int32_t *q_lens,
                                          int32_t decode_threshold, int32_t *perm,
                                          int32_t *num_decodes)
{
    kva__clear_error();
    if (num_requests < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_batch_reorder_decode_first: num_requests = %d is negative",
                         (int)num_requests);
    if (decode_threshold < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_batch_reorder_decode_first: decode_threshold = %d is negative",
                         (int)decode_threshold);
    if (num_requests > 0) {
        KVA_CHECK_PTR(q_lens);
        KVA_CHECK_PTR(perm);
    }
    /* Two passes read q_lens while perm fills: no output may overlap it
     * (kvattn.h, Aliasing). */
    const size_t rb = (size_t)num_requests * sizeof(int32_t);
    const kva__span outs[2] = {{"perm", perm, rb, 0, 0},
                               {"num_decodes", num_decodes, sizeof(int32_t), 0, 0}};
    const kva__span ins[1] = {{"q_lens", q_lens, rb, 0, 0}};
    KVA_TRY(kva__check_disjoint("kva_batch_reorder_decode_first", outs, 2, ins, 1));
    for (int32_t r = 0; r < num_requests; r++)
        if (q_lens[r] < 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_batch_reorder_decode_first: q_lens[%d] = %d is negative", (int)r,
                             (int)q_lens[r]);
    const int32_t thr = decode_threshold == 0 ? 1 : decode_threshold;
    /* Two stable passes: decodes (q_len <= thr, q_len 0 included), then prefills. */
    int32_t n = 0;
    for (int32_t r = 0; r < num_requests; r++)
        if (q_lens[r] <= thr)
            perm[n++] = r;
    const int32_t nd = n;
    for (int32_t r = 0; r < num_requests; r++)
        if (q_lens[r] > thr)
            perm[n++] = r;
    if (num_decodes)
        *num_decodes = nd;
    return KVA_STATUS_OK;
}
