/*
 * mla_util.h - one MLA test case (tests/test_mla.c, tests/test_mla_errors.c):
 * a latent cache with random contents behind shuffled block tables, random
 * queries and W_UK / W_UV, and the plan descriptor of a batch.
 *
 * Magnitudes keep every score O(1): c_kv and k_pe have unit variance, the
 * weights variance 1/Dc (so k_nope and v have unit variance), q unit
 * variance and the scale 1/sqrt(Dn + Dr), as DeepSeek's.
 */
#ifndef KVA_TEST_MLA_UTIL_H
#define KVA_TEST_MLA_UTIL_H

#include "harness.h"
#include "internal.h"

#define MLA_MAX_REQ 8

typedef struct mla_case {
    int32_t H, Dc, Dr, Dn, Dv, B;
    kva_dtype dt;   /* q, out, weights, and the cache when unquantized */
    int fp8;        /* 1: FP8 E4M3 latent cache with a per-tensor scale */
    int32_t causal; /* 0 for a non-causal batch (seq_len 0 allowed) */
    int32_t thr;    /* decode_threshold */
    int32_t R;      /* requests */
    int32_t q_len[MLA_MAX_REQ], seq_len[MLA_MAX_REQ];
    uint64_t seed;
} mla_case;

/* A case of R requests with q_len ql [R] and seq_len sl [R] (R <= MLA_MAX_REQ). */
static inline mla_case mla_case_of(int32_t H, int32_t Dc, int32_t Dr, int32_t Dn, int32_t Dv,
                                   int32_t B, kva_dtype dt, int32_t causal, int32_t thr, int32_t R,
                                   const int32_t *ql, const int32_t *sl, uint64_t seed)
{
    mla_case c = {.H = H,
                  .Dc = Dc,
                  .Dr = Dr,
                  .Dn = Dn,
                  .Dv = Dv,
                  .B = B,
                  .dt = dt,
                  .causal = causal,
                  .thr = thr,
                  .R = R,
                  .seed = seed};
    memcpy(c.q_len, ql, (size_t)R * sizeof *ql);
    memcpy(c.seq_len, sl, (size_t)R * sizeof *sl);
    return c;
}

/* The data of one case; every buffer is owned. */
typedef struct mla_data {
    kva_cache *cache;
    int32_t T, nb, stride;
    int32_t qsl[MLA_MAX_REQ + 1];
    int32_t *bt;
    void *q, *w_uk, *w_uv;
} mla_data;

static inline size_t mla_es(kva_dtype dt)
{
    return kva_dtype_size(dt);
}

/* The cache descriptor of the case (NB from the block count of the batch). */
static inline kva_cache_desc mla_cache_desc(const mla_case *c, int32_t nb)
{
    kva_cache_desc d = {.num_blocks = nb,
                        .block_size = c->B,
                        .num_kv_heads = 1,
                        .head_dim = c->Dc + c->Dr,
                        .head_dim_v = c->Dc,
                        .dtype = c->fp8 ? KVA_DTYPE_FP8_E4M3 : c->dt,
                        .layout = KVA_LAYOUT_NHD,
                        .quant = c->fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                        .kind = KVA_ATTN_MLA};
    return d;
}

/* The plan descriptor; layer = 1 gives it the layer-level head sizes. */
static inline kva_plan_desc mla_plan_desc(const mla_case *c, const mla_data *m, int layer)
{
    kva_plan_desc p =
        kva_test_mla_desc(c->R, m->qsl, c->seq_len, m->bt, m->stride, c->B, c->H, c->Dc + c->Dr,
                          c->Dc, c->dt, 1.0 / sqrt((double)(c->Dn + c->Dr)), c->causal);
    p.decode_threshold = c->thr;
    p.mla_qk_nope_head_dim = layer ? c->Dn : 0;
    p.mla_v_head_dim = layer ? c->Dv : 0;
    return p;
}

/* The block tables of R requests of q_len [R] queries and seq_len [R] keys
 * over a shuffled block order (block 0 left unused): fills qsl [R + 1], the
 * block count *nb (two spare) and the row stride *stride; returns the table
 * [R, *stride] (calloc). Shared with sparse_util.h. */
static inline int32_t *mla_block_tables(kva_rng *rng, int32_t R, const int32_t *q_len,
                                        const int32_t *seq_len, int32_t B, int32_t *qsl,
                                        int32_t *nb, int32_t *stride)
{
    int32_t blocks = 0, maxb = 1;
    qsl[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t nbr = (seq_len[r] + B - 1) / B;
        blocks += nbr;
        maxb = nbr > maxb ? nbr : maxb;
        qsl[r + 1] = qsl[r] + q_len[r];
    }
    *nb = blocks + 2;
    *stride = maxb;
    int32_t *bt = calloc((size_t)(R > 0 ? R : 1) * (size_t)maxb, sizeof(int32_t));
    int32_t *perm = malloc((size_t)*nb * sizeof(int32_t));
    for (int32_t i = 0; i < *nb; i++)
        perm[i] = i;
    for (int32_t i = *nb - 1; i > 1; i--) { /* shuffle blocks 1 .. nb-1 */
        int32_t j = kva_rng_int(rng, 1, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 1;
    for (int32_t r = 0; r < R; r++)
        for (int32_t b = 0; b < (seq_len[r] + B - 1) / B; b++)
            bt[(size_t)r * maxb + b] = perm[next++];
    free(perm);
    return bt;
}

/* Builds the case on ctx: block tables over a shuffled block order (block 0
 * left unused), every slot of the batch written through kva_cache_write
 * from random c_kv / k_pe in the case's dtype (f32 for FP8 caches). */
static inline int mla_data_make(kva_context *ctx, const mla_case *c, mla_data *m)
{
    memset(m, 0, sizeof *m);
    kva_rng rng = {c->seed};
    m->bt = mla_block_tables(&rng, c->R, c->q_len, c->seq_len, c->B, m->qsl, &m->nb, &m->stride);
    m->T = m->qsl[c->R];
    const int32_t maxb = m->stride;

    kva_cache_desc cd = mla_cache_desc(c, m->nb);
    const float fp8_scale = 0.02f;
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    if (kva_cache_create_quant(ctx, &cd, c->fp8 ? &qp : NULL, &m->cache) != KVA_STATUS_OK)
        return 0;
    /* Write every slot of the batch (one token per call keeps it simple). */
    const kva_dtype src = c->fp8 ? KVA_DTYPE_F32 : c->dt;
    void *ckv = malloc((size_t)c->Dc * 4), *kpe = malloc((size_t)c->Dr * 4);
    int ok = 1;
    for (int32_t r = 0; r < c->R && ok; r++)
        for (int32_t j = 0; j < c->seq_len[r]; j++) {
            kva_test_fill_uniform(ckv, src, (size_t)c->Dc, &rng);
            kva_test_fill_uniform(kpe, src, (size_t)c->Dr, &rng);
            int64_t slot = (int64_t)m->bt[(size_t)r * maxb + j / c->B] * c->B + j % c->B;
            ok &= kva_cache_write(ctx, m->cache, 1, ckv, 0, kpe, 0, src, &slot) == KVA_STATUS_OK;
        }
    free(ckv);
    free(kpe);
    const size_t Dq = (size_t)(c->Dn + c->Dr), es = mla_es(c->dt);
    m->q = malloc((size_t)(m->T > 0 ? m->T : 1) * c->H * Dq * es);
    m->w_uk = malloc((size_t)c->H * c->Dn * c->Dc * es);
    m->w_uv = malloc((size_t)c->H * c->Dc * c->Dv * es);
    kva_test_fill_uniform(m->q, c->dt, (size_t)m->T * c->H * Dq, &rng);
    kva_test_fill(m->w_uk, c->dt, (size_t)c->H * c->Dn * c->Dc, &rng, 1.0 / sqrt((double)c->Dc));
    kva_test_fill(m->w_uv, c->dt, (size_t)c->H * c->Dc * c->Dv, &rng, 1.0 / sqrt((double)c->Dc));
    return ok;
}

static inline void mla_data_free(mla_data *m)
{
    kva_cache_destroy(m->cache);
    free(m->bt);
    free(m->q);
    free(m->w_uk);
    free(m->w_uv);
    memset(m, 0, sizeof *m);
}

#endif /* KVA_TEST_MLA_UTIL_H */
