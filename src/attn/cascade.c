/*
 * cascade.c - the run of a cascade (shared-prefix) plan, and the host
 * backends' index passes (the plan and its layout: src/plan/cascade.c and
 * kva__cascade in src/core/internal.h).
 *
 * A run is 3 + L launches on the context's stream, none of which reads
 * anything on the host: the gather of the groups' query rows, the prefix
 * plan on the aux context (non-causal, LSE kept), the suffix plan on the
 * context (the sinks join here, so they count once), and per level of
 * nested groups the merge of each grouped row with its prefix rows. Everything was validated at
 * plan time and by kva_attention_run, so this is graph-capture safe on CUDA.
 */
#include "internal.h"

#include <string.h>

kva_status kva__cascade_run(kva_context *ctx, const kva_plan *plan, const void *q,
                            const kva_cache *cache, const float *sinks, void *out, float *lse)
{
    const kva__cascade *c = plan->cascade;
    kva_context *aux = c->aux;
    if (ctx->aux != aux || aux->workspace_bytes < c->aux_bytes)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run: a cascade plan runs on the context that created it "
                         "(its prefix pass lives in that context's auxiliary context)");
    unsigned char *ws = aux->workspace;
    void *q_pref = ws + c->off_q, *out_pref = ws + c->off_out;
    float *lse_pref = (float *)(ws + c->off_lse);
    float *lse_suf = lse ? lse : (float *)(ws + c->off_lse_suf);
    const kva__backend_ops *ops = ctx->ops;
    KVA_TRY(ops->cascade_gather(ctx, plan, q, q_pref));
    KVA_TRY(ops->attention_paged(aux, c->prefix, q_pref, cache, NULL, out_pref, lse_pref));
    KVA_TRY(ops->attention_paged(ctx, c->suffix, q, cache, sinks, out, lse_suf));
    for (int32_t l = 0; l < c->num_levels; l++)
        KVA_TRY(ops->cascade_merge(ctx, plan, l, out_pref, lse_pref, out, lse_suf));
    return KVA_STATUS_OK;
}

kva_status kva__host_cascade_gather(kva_context *ctx, const kva_plan *plan, const void *q,
                                    void *q_pref)
{
    (void)ctx;
    const kva__cascade *c = plan->cascade;
    const size_t row =
        (size_t)plan->d.num_heads * (size_t)plan->d.head_dim * kva_dtype_size(plan->d.q_dtype);
    unsigned char *dst = q_pref;
    for (int32_t k = 0; k < c->num_chunks; k++)
        for (int32_t i = 0; i < c->rows; i++, dst += row)
            memcpy(dst, (const unsigned char *)q + (size_t)c->gather[i] * row, row);
    return KVA_STATUS_OK;
}

/* Row t of out/lse merged in place with its prefix row of one level: the C
 * chunks are first merged into the aux workspace's scratch row (C > 1), then
 * with the suffix row, by the backend's own merges (in-place is allowed). */
kva_status kva__host_cascade_merge(kva_context *ctx, const kva_plan *plan, int32_t level,
                                   const void *out_pref, const float *lse_pref, void *out,
                                   float *lse)
{
    const kva__cascade *c = plan->cascade;
    const int32_t H = plan->d.num_heads, Dv = plan->d.head_dim_v, T = plan->info.num_tokens;
    const kva_dtype dt = plan->d.q_dtype;
    const size_t row = (size_t)H * (size_t)Dv * kva_dtype_size(dt);
    unsigned char *tmp = (unsigned char *)c->aux->workspace + c->off_tmp;
    float *tmp_lse = (float *)(tmp + ((row + 255) & ~(size_t)255));
    const int64_t part = (int64_t)c->rows * H;
    for (int32_t t = 0; t < T; t++) {
        const int32_t m = c->merge[(int64_t)level * T + t];
        if (m < 0)
            continue;
        const void *po = (const unsigned char *)out_pref + (size_t)m * row;
        const float *pl = lse_pref + (int64_t)m * H;
        if (c->num_chunks > 1) {
            KVA_TRY(ctx->ops->merge_states_n(ctx, c->num_chunks, 1, H, Dv, dt, po, part * Dv, pl,
                                             part, tmp, tmp_lse));
            po = tmp;
            pl = tmp_lse;
        }
        void *o = (unsigned char *)out + (size_t)t * row;
        float *l = lse + (int64_t)t * H;
        KVA_TRY(ctx->ops->merge_states(ctx, 1, H, Dv, dt, po, pl, o, l, o, l));
    }
    return KVA_STATUS_OK;
}
