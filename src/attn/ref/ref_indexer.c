/*
 * ref_indexer.c - the reference lightning indexer (kva_indexer_run on the
 * reference backend): every logit in fp64 from the dequantized keys (and,
 * with index_q_quant FP8_TOKEN, the dequantized index queries), then an
 * exact stable sort of all the token's keys. The CPU and CUDA indexers are
 * tested against it.
 */
#include "ref_mla.h"

#include <math.h>
#include <string.h>

size_t kva__ref_indexer_workspace(const kva_plan *plan)
{
    if (plan->d.kind != KVA_ATTN_INDEX)
        return 0;
    /* logits [S] doubles, one token's q [Hi, D] doubles, order and merge
     * scratch [S] int32 each. */
    const size_t S = (size_t)plan->info.max_seq_len;
    const size_t QD = (size_t)plan->d.num_heads * (size_t)plan->d.head_dim;
    return (S + QD) * sizeof(double) + S * 2 * sizeof(int32_t);
}

/* 1 if key a is listed before key b: the larger logit first, NaN after
 * every number; equal logits (and two NaNs) keep their position order
 * (the sort is stable and starts in position order). */
static int before(const double *L, int32_t a, int32_t b)
{
    return !isnan(L[a]) && (isnan(L[b]) || L[a] > L[b]);
}

/* Stable bottom-up merge sort of idx [n] by before(); tmp [n] scratch. */
static void sort_keys(const double *L, int32_t *idx, int32_t *tmp, int32_t n)
{
    for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            const int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int32_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                tmp[o++] = before(L, idx[j], idx[i]) ? idx[j++] : idx[i++];
            while (i < mid)
                tmp[o++] = idx[i++];
            while (j < hi)
                tmp[o++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

kva_status kva__ref_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                            const float *weights, const kva_cache *cache, int32_t *indices,
                            int64_t indices_stride, int32_t *topk_length)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t Hi = d->num_heads, D = d->head_dim, K = d->sparse_topk, B = d->block_size;
    const size_t S = (size_t)plan->info.max_seq_len;
    double *L = ctx->workspace, *qd = L + S;
    int32_t *idx = (int32_t *)(qd + (size_t)Hi * D), *tmp = idx + S;
    float key[KVA_MAX_HEAD_DIM], qf[KVA_MAX_HEAD_DIM];
    double kd[KVA_MAX_HEAD_DIM];
    uint8_t codes[KVA_MAX_HEAD_DIM];
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q0 = plan->query_start_loc[r], ql = plan->query_start_loc[r + 1] - q0;
        const int32_t s = plan->seq_lens[r];
        const int32_t *bt = plan->block_table + (int64_t)r * d->block_table_stride;
        for (int32_t i = 0; i < ql; i++) {
            const int64_t t = q0 + i;
            const int32_t n = s - ql + i + 1; /* keys 0 .. pos */
            const float *w = weights + t * Hi;
            /* The token's q [Hi, D]: as given, or each head's row quantized
             * (index_q_quant FP8_TOKEN) and dequantized, code * s (exact). */
            for (int32_t h = 0; h < Hi; h++) {
                for (int32_t c = 0; c < D; c++)
                    qf[c] = kva__load_f(q, d->q_dtype, (size_t)((t * Hi + h) * D + c));
                double *qh = qd + (size_t)h * D;
                if (d->index_q_quant == KVA_QUANT_FP8_TOKEN) {
                    const float qs = kva__index_fp8_quant_row(qf, D, codes);
                    for (int32_t c = 0; c < D; c++)
                        qh[c] = (double)kva_fp8_e4m3_to_f32(codes[c]) * (double)qs;
                } else {
                    for (int32_t c = 0; c < D; c++)
                        qh[c] = (double)qf[c];
                }
            }
            for (int32_t j = 0; j < n; j++) {
                const float sc = kva__index_load_key(cache, bt[j / B], j % B, key);
                for (int32_t c = 0; c < D; c++)
                    kd[c] = (double)key[c] * (double)sc;
                double logit = 0.0;
                for (int32_t h = 0; h < Hi; h++) {
                    double dot = 0.0;
                    for (int32_t c = 0; c < D; c++)
                        dot += qd[(size_t)h * D + c] * kd[c];
                    /* ReLU keeps NaN (a NaN key gives a NaN logit). */
                    logit += (double)w[h] * (dot < 0.0 ? 0.0 : dot);
                }
                L[j] = logit;
                idx[j] = j;
            }
            sort_keys(L, idx, tmp, n);
            int32_t *row = indices + t * indices_stride;
            const int32_t m = n < K ? n : K;
            for (int32_t k = 0; k < K; k++)
                row[k] = k < m ? idx[k] : -1;
            if (topk_length)
                topk_length[t] = m;
        }
    }
    return KVA_STATUS_OK;
}
