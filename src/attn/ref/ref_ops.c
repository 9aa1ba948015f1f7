/*
 * ref_ops.c - the reference backend: scalar C, fp64 accumulation.
 *
 * These kernels are the truth every other backend is tested against, so they
 * are written to be obviously right rather than fast: one output row (token,
 * query head) at a time, every key tested against the mask exactly as the
 * comment above kva_attention_run states it, and a two-pass softmax in double
 * (pass 1 finds the maximum logit, sink included; pass 2 sums the
 * exponentials and the weighted values). Scores are recomputed in pass 2
 * instead of stored, so a run needs no memory beyond a few head-sized arrays
 * on the stack: the reference backend never allocates, and reserves
 * workspace only for the layer-level MLA call (ref_mla.c).
 *
 * The paged and the ragged kernel share attend_row(); they differ only in
 * where key j of a request lives (kv_rows_offsets()). Quantized caches are
 * dequantized row by row in fp64 exactly as the format defines it
 * (kva__quant_load_row, src/cache/quant.c).
 *
 * Rows that see no key (impossible through the public API, which requires
 * q_len <= seq_len so that key pos is always visible, but handled all the
 * same) write 0 and lse = -inf, or lse = sink when a sink is given.
 */
#include "ref_mla.h"

#include <math.h>
#include <string.h>

/* Where the keys and values of one (request, kv head) pair live. Exactly one
 * of the two addressing modes is used: the paged cache (cache != NULL) or
 * ragged packed rows. */
typedef struct kv_rows {
    const void *k;               /* paged: cache K base; ragged: [sum(seq_lens), Hkv, D] */
    const void *v;               /* paged: cache V base; ragged: [sum(seq_lens), Hkv, Dv] */
    kva_dtype dtype;             /* dtype of k and v */
    int32_t head;                /* kv head */
    int32_t head_dim;            /* D */
    int32_t head_dim_v;          /* Dv */
    int32_t v_row_dim;           /* paged: width of the rows V lives in (D for MLA caches) */
    const kva_cache_desc *cache; /* paged: the cache's descriptor, else NULL */
    const kva_cache *quant;      /* paged quantized cache (dequantized in fp64), else NULL */
    const int32_t *blocks;       /* paged: the request's block table row */
    int64_t first_row;           /* ragged: kv_start[r] */
    int32_t num_kv_heads;        /* ragged: Hkv */
} kv_rows;

/* Element offsets of key j's K row and V row from the k and v base pointers. */
static void kv_rows_offsets(const kv_rows *s, int64_t j, int64_t *k_off, int64_t *v_off)
{
    if (s->cache) {
        const int64_t B = s->cache->block_size;
        const int64_t block = s->blocks[j / B];
        *k_off = kva__cache_row(s->cache, block, j % B, s->head, s->head_dim);
        *v_off = kva__cache_row(s->cache, block, j % B, s->head, s->v_row_dim);
    } else {
        const int64_t row = (s->first_row + j) * s->num_kv_heads + s->head;
        *k_off = row * s->head_dim;
        *v_off = row * s->head_dim_v;
    }
}

/* 1 if the key at (global) position j is visible to the query at position
 * pos of a request with seq_len s, following kva_attention_run's definition
 * clause by clause; a tree plan's row sees tree key tree0 + k only if bit k
 * of its word tree is set (tree0 = s - q_len; beyond every key otherwise). */
static int key_visible(const kva_plan_desc *d, int64_t j, int64_t pos, int64_t s, int64_t tree0,
                       uint64_t tree)
{
    if (j >= s)
        return 0;
    if (d->causal && j > pos)
        return 0;
    if (d->window_left >= 0 && pos - j > d->window_left)
        return 0;
    if (d->attention_chunk > 0 && j / d->attention_chunk != pos / d->attention_chunk)
        return 0;
    if (j >= tree0 && !((tree >> (j - tree0)) & 1))
        return 0;
    return 1;
}

/* The logit of key j for query qv [D] (as double) of head h at position pos:
 * scale * <q, k_j>, then the soft-cap, then the ALiBi bias. */
static double key_score(const kva_plan *plan, const kv_rows *kv, const double *qv, int32_t h,
                        int64_t pos, int64_t j)
{
    const kva_plan_desc *d = &plan->d;
    int64_t k_off, v_off;
    kv_rows_offsets(kv, j, &k_off, &v_off);
    double dot = 0.0;
    if (kv->quant) {
        const int64_t B = kv->cache->block_size;
        double kr[KVA_MAX_HEAD_DIM];
        kva__quant_load_row(kv->quant, 0, kv->blocks[j / B], j % B, kv->head, d->head_dim, kr);
        for (int32_t c = 0; c < d->head_dim; c++)
            dot += qv[c] * kr[c];
    } else {
        for (int32_t c = 0; c < d->head_dim; c++)
            dot += qv[c] * (double)kva__load_f(kv->k, kv->dtype, (size_t)(k_off + c));
    }
    double score = (double)d->scale * dot;
    if (d->softcap > 0.0f) {
        const double cap = (double)d->softcap;
        score = cap * tanh(score / cap);
    }
    if (plan->alibi_slopes)
        score += (double)plan->alibi_slopes[h] * (double)(kva__key_pos(d, j) - pos);
    return score;
}

/*
 * One output row: query head h of the token whose query is qv [D] (as double),
 * at position pos of a request with seq_len s, over its n keys (n = s, or the
 * rank's local keys of a sharded plan, whose key j sits at global position
 * kva__key_pos(j)); tree0 and tree: the row's tree mask (key_visible).
 * Writes Dv elements of out at element offset out_off in the plan's
 * q_dtype, and *lse when lse is not NULL. has_sink says whether sink holds
 * the head's sink logit.
 */
static void attend_row(const kva_plan *plan, const kv_rows *kv, const double *qv, int32_t h,
                       int64_t pos, int64_t s, int64_t n, int64_t tree0, uint64_t tree,
                       int has_sink, double sink, void *out, size_t out_off, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t Dv = d->head_dim_v;

    /* Pass 1: the largest logit, the sink included, for a stable softmax. A NaN
     * score makes m NaN, so it reaches the output and the LSE. */
    double m = has_sink ? sink : -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        if (!key_visible(d, kva__key_pos(d, j), pos, s, tree0, tree))
            continue;
        const double sc = key_score(plan, kv, qv, h, pos, j);
        if (sc > m || isnan(sc))
            m = isnan(m) ? m : sc;
    }

    double acc[KVA_MAX_HEAD_DIM];
    for (int32_t c = 0; c < Dv; c++)
        acc[c] = 0.0;
    /* No visible key and no sink, or every weight exp(-inf) = 0: an empty row. */
    if (m == -INFINITY) {
        for (int32_t c = 0; c < Dv; c++)
            kva__store_f(out, d->q_dtype, out_off + (size_t)c, 0.0f);
        if (lse)
            *lse = -INFINITY;
        return;
    }

    /* Pass 2: the denominator (sink included) and the weighted sum of values. */
    double denom = has_sink ? exp(sink - m) : 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (!key_visible(d, kva__key_pos(d, j), pos, s, tree0, tree))
            continue;
        const double p = exp(key_score(plan, kv, qv, h, pos, j) - m);
        int64_t k_off, v_off;
        kv_rows_offsets(kv, j, &k_off, &v_off);
        denom += p;
        if (kv->quant) {
            const int64_t B = kv->cache->block_size;
            double vr[KVA_MAX_HEAD_DIM];
            kva__quant_load_row(kv->quant, 1, kv->blocks[j / B], j % B, kv->head, Dv, vr);
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += p * vr[c];
        } else {
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += p * (double)kva__load_f(kv->v, kv->dtype, (size_t)(v_off + c));
        }
    }
    for (int32_t c = 0; c < Dv; c++)
        kva__store_f(out, d->q_dtype, out_off + (size_t)c, (float)(acc[c] / denom));
    if (lse)
        *lse = (float)(m + log(denom));
}

/*
 * Runs every (token, query head) row of the plan. kv is a template filled in
 * per request and head: for the paged kernel its cache/k/v are set and blocks
 * is taken from the plan's block table; for the ragged kernel first_row is
 * taken from the plan's kv_start.
 *   q: [T, H, D], out: [T, H, Dv] in q_dtype; sinks: [H] or NULL; lse: [T, H] or NULL.
 */
static void attend_all(const kva_plan *plan, kv_rows kv, const void *q, const float *sinks,
                       void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t H = d->num_heads, D = d->head_dim, Dv = d->head_dim_v;
    const int32_t group = H / d->num_kv_heads;
    double qv[KVA_MAX_HEAD_DIM];
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q_begin = plan->query_start_loc[r];
        const int32_t q_len = plan->query_start_loc[r + 1] - q_begin;
        const int64_t s = plan->seq_lens[r];
        if (kv.cache)
            kv.blocks = plan->block_table + (int64_t)r * d->block_table_stride;
        else
            kv.first_row = plan->kv_start[r];
        for (int32_t i = 0; i < q_len; i++) {
            const int64_t t = (int64_t)q_begin + i;
            const int64_t pos = s - q_len + i; /* bottom-right aligned */
            /* A tree plan's row sees the tree tokens its word names. */
            const int64_t tree0 = plan->tree_bits ? s - q_len : INT64_MAX;
            const uint64_t tree = plan->tree_bits ? plan->tree_bits[t] : 0;
            for (int32_t h = 0; h < H; h++) {
                const int64_t row = t * H + h;
                for (int32_t c = 0; c < D; c++)
                    qv[c] = (double)kva__load_f(q, d->q_dtype, (size_t)(row * D + c));
                kv.head = h / group;
                attend_row(plan, &kv, qv, h, pos, s, plan->kv_lens[r], tree0, tree, sinks != NULL,
                           sinks ? (double)sinks[h] : -INFINITY, out, (size_t)(row * Dv),
                           lse ? lse + row : NULL);
            }
        }
    }
}

static kva_status ref_attention_paged(kva_context *ctx, const kva_plan *plan, const void *q,
                                      const kva_cache *cache, const float *sinks, void *out,
                                      float *lse)
{
    kv_rows kv;
    memset(&kv, 0, sizeof kv);
    kv.k = cache->k;
    kv.v = cache->v;
    kv.dtype = cache->desc.dtype;
    kv.head_dim = cache->desc.head_dim;
    kv.head_dim_v = cache->desc.head_dim_v;
    kv.v_row_dim = (int32_t)kva__cache_v_dim(&cache->desc);
    kv.cache = &cache->desc;
    kv.quant = cache->desc.quant != KVA_QUANT_NONE ? cache : NULL;
    attend_all(plan, kv, q, sinks, out, lse);
    return KVA_STATUS_OK;
}

static kva_status ref_attention_ragged(kva_context *ctx, const kva_plan *plan, const void *q,
                                       const void *k, const void *v, const float *sinks, void *out,
                                       float *lse)
{
    kv_rows kv;
    memset(&kv, 0, sizeof kv);
    kv.k = k;
    kv.v = v;
    kv.dtype = plan->d.q_dtype;
    kv.head_dim = plan->d.head_dim;
    kv.head_dim_v = plan->d.head_dim_v;
    kv.num_kv_heads = plan->d.num_kv_heads;
    attend_all(plan, kv, q, sinks, out, lse);
    return KVA_STATUS_OK;
}

/*
 * Merges two partial states row by row (row = token, head). Both input rows
 * are read into doubles before the output row is written, so out may alias
 * out_a or out_b and lse_out may alias lse_a or lse_b. A side whose weight is
 * zero (lse -inf, or so far below the other that exp underflows) is skipped
 * entirely, so whatever its out row holds (even NaN) contributes nothing.
 */
static kva_status ref_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                   int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                   const float *lse_a, const void *out_b, const float *lse_b,
                                   void *out, float *lse_out)
{
    const int64_t rows = (int64_t)num_tokens * num_heads;
    const int32_t Dv = head_dim_v;
    double a[KVA_MAX_HEAD_DIM], b[KVA_MAX_HEAD_DIM];
    for (int64_t n = 0; n < rows; n++) {
        const size_t base = (size_t)(n * Dv);
        const double la = lse_a[n], lb = lse_b[n];
        for (int32_t c = 0; c < Dv; c++) {
            a[c] = (double)kva__load_f(out_a, dtype, base + (size_t)c);
            b[c] = (double)kva__load_f(out_b, dtype, base + (size_t)c);
        }
        if (la == -INFINITY && lb == -INFINITY) {
            for (int32_t c = 0; c < Dv; c++)
                kva__store_f(out, dtype, base + (size_t)c, 0.0f);
            lse_out[n] = -INFINITY;
            continue;
        }
        const double m = la > lb ? la : lb;
        const double wa = exp(la - m), wb = exp(lb - m); /* exp(-inf) == 0 */
        const double w = wa + wb;
        for (int32_t c = 0; c < Dv; c++) {
            double x = 0.0;
            if (wa > 0.0)
                x += wa * a[c];
            if (wb > 0.0)
                x += wb * b[c];
            kva__store_f(out, dtype, base + (size_t)c, (float)(x / w));
        }
        lse_out[n] = (float)(m + log(w));
    }
    return KVA_STATUS_OK;
}

/*
 * Merges P partial states row by row in double: part p of row n has out row
 * outs + p * out_stride + n * Dv and lse lses[p * lse_stride + n]. A part of weight zero
 * is not read; a NaN lse makes the row NaN (out and lse).
 */
static kva_status ref_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                     int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                     const void *outs, int64_t out_stride, const float *lses,
                                     int64_t lse_stride, void *out, float *lse_out)
{
    const int64_t rows = (int64_t)num_tokens * num_heads;
    const int32_t Dv = head_dim_v;
    double acc[KVA_MAX_HEAD_DIM];
    for (int64_t n = 0; n < rows; n++) {
        const size_t base = (size_t)(n * Dv);
        double m = -INFINITY;
        int nan = 0;
        for (int32_t p = 0; p < num_parts; p++) {
            const double l = lses[p * lse_stride + n];
            nan |= isnan(l);
            m = l > m ? l : m;
        }
        if (nan || m == -INFINITY) {
            for (int32_t c = 0; c < Dv; c++)
                kva__store_f(out, dtype, base + (size_t)c, nan ? NAN : 0.0f);
            if (lse_out)
                lse_out[n] = nan ? NAN : -INFINITY;
            continue;
        }
        double w = 0.0;
        for (int32_t c = 0; c < Dv; c++)
            acc[c] = 0.0;
        for (int32_t p = 0; p < num_parts; p++) {
            const double wp = exp((double)lses[p * lse_stride + n] - m);
            if (wp == 0.0)
                continue;
            const size_t off = (size_t)(p * out_stride) + base;
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += wp * (double)kva__load_f(outs, dtype, off + (size_t)c);
            w += wp;
        }
        for (int32_t c = 0; c < Dv; c++)
            kva__store_f(out, dtype, base + (size_t)c, (float)(acc[c] / w));
        if (lse_out)
            lse_out[n] = (float)(m + log(w));
    }
    return KVA_STATUS_OK;
}

/* The reference backend partitions nothing; it reports one work item per
 * (token, query head) row, the unit attend_all() iterates over. */
static kva_status ref_plan_build(kva_context *ctx, kva_plan *plan)
{
    const int64_t rows = (int64_t)plan->info.num_tokens * plan->d.num_heads;
    plan->info.num_work_items = rows > INT32_MAX ? INT32_MAX : (int32_t)rows;
    /* Only the layer-level MLA call needs memory, one request's
     * decompressed keys and values of one head (ref_mla.c), the sparse
     * separate mode its gathered rows (ref_sparse.c), and the indexer its
     * logits (ref_indexer.c); a plan is one of these. */
    size_t bytes = kva__ref_mla_workspace(plan);
    const size_t sparse = kva__ref_sparse_workspace(plan);
    bytes = sparse > bytes ? sparse : bytes;
    bytes += kva__ref_indexer_workspace(plan);
    KVA_TRY(kva__context_reserve_workspace(ctx, bytes));
    plan->workspace_bytes = bytes;
    return KVA_STATUS_OK;
}

const kva__backend_ops kva__ref_ops = {
    .name = "ref",
    .plan_build = ref_plan_build,
    .plan_release = NULL,
    .attention_paged = ref_attention_paged,
    .attention_ragged = ref_attention_ragged,
    .merge_states = ref_merge_states,
    /* An MLA cache's V rows alias its K rows (kv_rows.v_row_dim): the paged
     * kernel runs the absorbed math as it is. */
    .mla_attention_paged = ref_attention_paged,
    .mla_run = kva__ref_mla_run,
    .max_head_dim = KVA_MAX_HEAD_DIM,
    .max_threads = 1, /* the reference runs single-threaded */
    .memory = &kva__host_memory,
    .merge_states_n = ref_merge_states_n,
    /* Cascade plans run on request (KVA_CASCADE_ON) only: no cost model. */
    .cascade_gather = kva__host_cascade_gather,
    .cascade_merge = kva__host_cascade_merge,
    .indexer = kva__ref_indexer,
    .mla_sparse = kva__ref_mla_sparse,
};
