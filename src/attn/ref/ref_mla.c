/*
 * ref_mla.c - the reference backend's layer-level MLA (kva_mla_run): the
 * naive, non-absorbed math in fp64, the truth the CPU and CUDA backends'
 * absorbed and compute-friendly paths are tested against.
 *
 * For every request and query head h the cached latent rows [c_kv | k_pe]
 * are decompressed into per-head keys and values exactly as the model
 * defines them (DeepSeek-V2's kv_b_proj split into W_UK and W_UV):
 *   k_h(j) = [w_uk[h] . c_kv(j) (Dn), k_pe(j) (Dr)],  v_h(j) = c_kv(j) . w_uv[h] (Dv),
 * then attention is the plain two-pass softmax of kva_attention_run's
 * definition (bottom-right aligned causal mask, no window, soft-cap or ALiBi:
 * MLA plans refuse them). No absorption happens here, so agreement with the
 * absorbed path is evidence that the absorption is right.
 *
 * Memory: the decompressed keys and values of one (request, head), [s, Dn +
 * Dr + Dv] doubles, live in the context workspace that ref_mla_workspace
 * sized at plan time (max_seq_len rows), so the run never allocates.
 */
#include "ref_mla.h"

#include <math.h>

size_t kva__ref_mla_workspace(const kva_plan *plan)
{
    const kva_plan_desc *d = &plan->d;
    if (d->kind != KVA_ATTN_MLA || d->mla_qk_nope_head_dim == 0)
        return 0;
    const size_t Dr = (size_t)(d->head_dim - d->head_dim_v);
    const size_t width = (size_t)d->mla_qk_nope_head_dim + Dr + (size_t)d->mla_v_head_dim;
    return (size_t)plan->info.max_seq_len * width * sizeof(double);
}

/* Channel ch of the latent row of key j of a request (block table row bt), in double. */
static double latent(const kva_cache *c, const int32_t *bt, int64_t j, int64_t ch)
{
    const kva_cache_desc *cd = &c->desc;
    const int64_t B = cd->block_size, block = bt[j / B], off = j % B;
    if (cd->quant != KVA_QUANT_NONE)
        return kva__quant_load(c, 0, block, off, 0, ch);
    return (double)kva__load_f(c->k, cd->dtype,
                               (size_t)(kva__cache_row(cd, block, off, 0, cd->head_dim) + ch));
}

kva_status kva__ref_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                            const void *w_uv, const kva_cache *cache, void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    const kva_dtype dt = d->q_dtype;
    const int64_t H = d->num_heads, Dc = d->head_dim_v, Dr = d->head_dim - d->head_dim_v;
    const int64_t Dn = d->mla_qk_nope_head_dim, Dv = d->mla_v_head_dim, Dq = Dn + Dr;
    double *kh = ctx->workspace; /* [s, Dq]: the head's decompressed keys */
    double *vh = kh;             /* [s, Dv]: its values, after the keys (set per request) */
    double c[KVA_MAX_HEAD_DIM], qv[KVA_MAX_HEAD_DIM], acc[KVA_MAX_HEAD_DIM];
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q_begin = plan->query_start_loc[r];
        const int32_t q_len = plan->query_start_loc[r + 1] - q_begin;
        const int64_t s = plan->seq_lens[r];
        if (q_len == 0)
            continue;
        const int32_t *bt = plan->block_table + (int64_t)r * d->block_table_stride;
        vh = kh + s * Dq;
        for (int64_t h = 0; h < H; h++) {
            /* Decompress every key of the request for head h. */
            for (int64_t j = 0; j < s; j++) {
                for (int64_t ch = 0; ch < Dc; ch++)
                    c[ch] = latent(cache, bt, j, ch);
                for (int64_t n = 0; n < Dn; n++) {
                    double x = 0.0;
                    for (int64_t ch = 0; ch < Dc; ch++)
                        x +=
                            (double)kva__load_f(w_uk, dt, (size_t)((h * Dn + n) * Dc + ch)) * c[ch];
                    kh[j * Dq + n] = x;
                }
                for (int64_t e = 0; e < Dr; e++)
                    kh[j * Dq + Dn + e] = latent(cache, bt, j, Dc + e);
                for (int64_t e = 0; e < Dv; e++) {
                    double x = 0.0;
                    for (int64_t ch = 0; ch < Dc; ch++)
                        x +=
                            c[ch] * (double)kva__load_f(w_uv, dt, (size_t)((h * Dc + ch) * Dv + e));
                    vh[j * Dv + e] = x;
                }
            }
            for (int32_t i = 0; i < q_len; i++) {
                const int64_t t = (int64_t)q_begin + i, row = t * H + h;
                const int64_t pos = s - q_len + i; /* bottom-right aligned */
                const int64_t end = d->causal ? (pos + 1 < s ? pos + 1 : s) : s;
                for (int64_t e = 0; e < Dq; e++)
                    qv[e] = (double)kva__load_f(q, dt, (size_t)(row * Dq + e));
                /* Pass 1: the largest score; pass 2: the weighted sum. */
                double m = -INFINITY;
                for (int64_t j = 0; j < end; j++) {
                    double x = 0.0;
                    for (int64_t e = 0; e < Dq; e++)
                        x += qv[e] * kh[j * Dq + e];
                    x *= (double)d->scale;
                    if (x > m || isnan(x))
                        m = isnan(m) ? m : x;
                }
                for (int64_t e = 0; e < Dv; e++)
                    acc[e] = 0.0;
                double denom = 0.0;
                if (m != -INFINITY) {
                    for (int64_t j = 0; j < end; j++) {
                        double x = 0.0;
                        for (int64_t e = 0; e < Dq; e++)
                            x += qv[e] * kh[j * Dq + e];
                        const double p = exp((double)d->scale * x - m);
                        denom += p;
                        for (int64_t e = 0; e < Dv; e++)
                            acc[e] += p * vh[j * Dv + e];
                    }
                }
                /* A NaN score made m and denom NaN: the row is NaN (out
                 * and lse), as kva_attention_run's; denom 0 is a row
                 * without keys. */
                const int weigh = denom > 0.0 || isnan(denom);
                for (int64_t e = 0; e < Dv; e++)
                    kva__store_f(out, dt, (size_t)(row * Dv + e),
                                 weigh ? (float)(acc[e] / denom) : 0.0f);
                if (lse)
                    lse[row] = weigh ? (float)(m + log(denom)) : -INFINITY;
            }
        }
    }
    return KVA_STATUS_OK;
}
