/*
 * ref_sparse.c - the reference backend's sparse MLA (kva_mla_sparse_run):
 * scalar C, fp64, the truth the CPU and CUDA kernels are tested against.
 *
 * One output row (token, query head) at a time, as ref_ops.c: pass 1 finds
 * the largest logit over the row's listed entries (sink included), pass 2
 * recomputes the logits and sums the exponentials and the weighted c_kv
 * values. Every latent value is dequantized in fp64 exactly as its format
 * defines it (fp8_ds_mla: code * tile scale). An entry listed twice counts
 * twice. The separate mode (KVA_SPARSE_SEPARATE) first gathers each prefill
 * request's rows into the workspace as float32 through the cache-read path
 * and reads them from there.
 */
#include "ref_mla.h"

#include <math.h>
#include <string.h>

/* Where the latent row of key position p of one request lives: the paged
 * cache through the request's block-table row, or gathered float32 rows
 * dense [seq_len, D]. */
typedef struct sparse_rows {
    const kva_cache *cache;
    const int32_t *blocks; /* the request's block-table row */
    const float *dense;    /* gathered rows, or NULL: read the cache */
    int64_t D, Dc;
} sparse_rows;

/* Loads the latent row [c_kv | k_pe] of key position p into x [D], fp64. */
static void load_row(const sparse_rows *s, int64_t p, double *x)
{
    if (s->dense) {
        for (int64_t i = 0; i < s->D; i++)
            x[i] = s->dense[p * s->D + i];
        return;
    }
    const kva_cache *c = s->cache;
    const kva_cache_desc *d = &c->desc;
    const int64_t block = s->blocks[p / d->block_size], off = p % d->block_size;
    if (d->quant == KVA_QUANT_FP8_DS_MLA) {
        const int64_t rb = kva__ds_mla_row_bytes(s->D, s->Dc);
        const uint8_t *row = (const uint8_t *)c->k + (block * d->block_size + off) * rb;
        for (int64_t i = 0; i < s->Dc; i++) {
            float sc;
            memcpy(&sc, row + s->Dc + 4 * (i / KVA__DS_MLA_TILE), sizeof sc);
            x[i] = (double)kva_fp8_e4m3_to_f32(row[i]) * (double)sc;
        }
        const uint8_t *pe = row + s->Dc + 4 * (s->Dc / KVA__DS_MLA_TILE);
        for (int64_t i = s->Dc; i < s->D; i++) {
            uint16_t h;
            memcpy(&h, pe + 2 * (i - s->Dc), sizeof h);
            x[i] = kva_bf16_to_f32(h);
        }
    } else if (d->quant != KVA_QUANT_NONE) {
        kva__quant_load_row(c, 0, block, off, 0, s->D, x);
    } else {
        const int64_t e = kva__cache_row(d, block, off, 0, s->D);
        for (int64_t i = 0; i < s->D; i++)
            x[i] = kva__load_f(c->k, d->dtype, (size_t)(e + i));
    }
}

/* Loads key position p's row into x [D] and returns scale * <q, x>. */
static double score(const sparse_rows *s, const double *q, int64_t p, double scale, double *x)
{
    load_row(s, p, x);
    double dot = 0.0;
    for (int64_t i = 0; i < s->D; i++)
        dot += q[i] * x[i];
    return scale * dot;
}

/* One output row: query q [D] (fp64) against entries idx [n] of request
 * rows s; writes out [Dc] and *lse. */
static void attend_row(const sparse_rows *s, const double *q, const int32_t *idx, int32_t n,
                       double scale, const float *sink, void *out, kva_dtype dt, float *lse)
{
    double x[KVA_MAX_HEAD_DIM], acc[KVA_MAX_HEAD_DIM];
    double m = sink ? (double)*sink : -INFINITY;
    int any = 0;
    for (int32_t e = 0; e < n; e++) {
        if (idx[e] < 0)
            continue;
        m = fmax(m, score(s, q, idx[e], scale, x));
        any = 1;
    }
    for (int64_t i = 0; i < s->Dc; i++)
        acc[i] = 0.0;
    double w = sink ? exp((double)*sink - m) : 0.0;
    for (int32_t e = 0; e < n && any; e++) {
        if (idx[e] < 0)
            continue;
        const double pe = exp(score(s, q, idx[e], scale, x) - m);
        w += pe;
        for (int64_t i = 0; i < s->Dc; i++)
            acc[i] += pe * x[i];
    }
    for (int64_t i = 0; i < s->Dc; i++)
        kva__store_f(out, dt, (size_t)i, any ? (float)(acc[i] / w) : 0.0f);
    if (lse)
        *lse = !any ? (sink ? *sink : -INFINITY) : (float)(m + log(w));
}

size_t kva__ref_sparse_workspace(const kva_plan *plan)
{
    return (size_t)kva__sparse_gather_rows(plan) * (size_t)plan->d.head_dim * sizeof(float);
}

kva_status kva__ref_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                               const kva_cache *cache, const int32_t *indices,
                               int64_t indices_stride, const int32_t *topk_length,
                               const float *sinks, void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    const int64_t H = d->num_heads, D = d->head_dim, Dc = d->head_dim_v;
    const kva_dtype dt = d->q_dtype;
    const size_t es = kva_dtype_size(dt);
    const int separate = d->sparse_mode == KVA_SPARSE_SEPARATE;
    double qd[KVA_MAX_HEAD_DIM];
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t t0 = plan->query_start_loc[r], t1 = plan->query_start_loc[r + 1];
        const int32_t s = plan->seq_lens[r];
        sparse_rows rows = {cache, plan->block_table + (int64_t)r * d->block_table_stride, NULL, D,
                            Dc};
        if (t1 == t0)
            continue;
        if (separate && t1 - t0 > d->decode_threshold && s > 0) {
            /* The request's rows 0 .. s - 1, gathered as float32 [s, D]
             * (c_kv then k_pe of each row) in the workspace. */
            float *ws = ctx->workspace;
            const int64_t B = d->block_size;
            for (int64_t p0 = 0; p0 < s; p0 += 1024) {
                int64_t slots[1024];
                const int32_t n = (int32_t)(s - p0 < 1024 ? s - p0 : 1024);
                for (int32_t i = 0; i < n; i++)
                    slots[i] = (int64_t)rows.blocks[(p0 + i) / B] * B + (p0 + i) % B;
                KVA_TRY(kva__host_cache_read(ctx, cache, n, slots, ws + p0 * D, D, ws + p0 * D + Dc,
                                             D, KVA_DTYPE_F32));
            }
            rows.dense = ws;
        }
        for (int32_t t = t0; t < t1; t++) {
            const int32_t *idx = indices + (int64_t)t * indices_stride;
            const int32_t n = topk_length ? topk_length[t] : d->sparse_topk;
            for (int64_t h = 0; h < H; h++) {
                const size_t row = (size_t)t * (size_t)H + (size_t)h;
                for (int64_t i = 0; i < D; i++)
                    qd[i] = kva__load_f(q, dt, row * (size_t)D + (size_t)i);
                attend_row(&rows, qd, idx, n, d->scale, sinks ? &sinks[h] : NULL,
                           (char *)out + row * (size_t)Dc * es, dt, lse ? &lse[row] : NULL);
            }
        }
    }
    return KVA_STATUS_OK;
}
