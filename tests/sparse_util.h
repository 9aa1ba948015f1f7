/*
 * sparse_util.h - one sparse MLA test case (tests/test_mla_sparse.c,
 * tests/test_mla_sparse_errors.c): a latent cache of any MLA format with
 * random rows behind shuffled block tables, random absorbed queries, index
 * lists with unused (-1) and repeated entries, optional topk_length and
 * sinks, and the sparse plan descriptor of the batch.
 *
 * Magnitudes keep every score O(1): latents and queries have unit variance
 * and the scale is DeepSeek's 1/sqrt(Dn + Dr) with Dn = 128.
 */
#ifndef KVA_TEST_SPARSE_UTIL_H
#define KVA_TEST_SPARSE_UTIL_H

#include "mla_util.h" /* mla_block_tables */

#define SP_MAX_REQ 8

typedef struct sp_case {
    int32_t H, Dc, Dr, B, K;
    kva_dtype dt;    /* q and out, and the cache when unquantized */
    kva_quant quant; /* NONE, FP8_E4M3 or FP8_DS_MLA */
    int32_t mode;    /* kva_sparse_mode */
    int32_t thr;     /* decode_threshold */
    int32_t R;
    int32_t q_len[SP_MAX_REQ], seq_len[SP_MAX_REQ];
    int use_len;        /* 1: a topk_length array with values in 0 .. K */
    int sinks;          /* 1: per-head sinks */
    double unused;      /* fraction of -1 entries */
    double dup;         /* fraction of entries repeating an earlier one */
    int32_t stride_pad; /* indices_stride = K + stride_pad */
    uint64_t seed;
} sp_case;

/* The data of one case; every buffer is owned. */
typedef struct sp_data {
    kva_cache *cache;
    int32_t T, nb, stride;
    int32_t qsl[SP_MAX_REQ + 1];
    int32_t *bt;
    void *q;
    int32_t *idx, *len; /* [T, K + stride_pad], [T] or NULL */
    float *sinks;       /* [H] or NULL */
} sp_data;

static inline kva_plan_desc sp_plan_desc(const sp_case *c, const sp_data *m)
{
    kva_plan_desc p = {.num_requests = c->R,
                       .query_start_loc = m->qsl,
                       .seq_lens = c->seq_len,
                       .block_table = m->bt,
                       .block_table_stride = m->stride,
                       .block_size = c->B,
                       .decode_threshold = c->thr,
                       .num_heads = c->H,
                       .num_kv_heads = 1,
                       .head_dim = c->Dc + c->Dr,
                       .head_dim_v = c->Dc,
                       .q_dtype = c->dt,
                       .scale = (float)(1.0 / sqrt(128.0 + c->Dr)),
                       .causal = 1,
                       .window_left = -1,
                       .kind = KVA_ATTN_MLA,
                       .sparse_topk = c->K,
                       .sparse_mode = c->mode};
    return p;
}

/* Builds the case on ctx (0 on failure). */
static inline int sp_data_make(kva_context *ctx, const sp_case *c, sp_data *m)
{
    memset(m, 0, sizeof *m);
    kva_rng rng = {c->seed};
    m->bt = mla_block_tables(&rng, c->R, c->q_len, c->seq_len, c->B, m->qsl, &m->nb, &m->stride);
    m->T = m->qsl[c->R];
    const int32_t maxb = m->stride;

    const int fp8 = c->quant == KVA_QUANT_FP8_E4M3;
    kva_cache_desc cd = {.num_blocks = m->nb,
                         .block_size = c->B,
                         .num_kv_heads = 1,
                         .head_dim = c->Dc + c->Dr,
                         .head_dim_v = c->Dc,
                         .dtype = c->quant == KVA_QUANT_NONE ? c->dt : KVA_DTYPE_FP8_E4M3,
                         .quant = c->quant,
                         .kind = KVA_ATTN_MLA};
    const float fp8_scale = 0.01f;
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    if (kva_cache_create_quant(ctx, &cd, fp8 ? &qp : NULL, &m->cache) != KVA_STATUS_OK)
        return 0;
    /* Every slot of the batch, one request at a time. */
    const kva_dtype src = c->quant == KVA_QUANT_NONE ? c->dt : KVA_DTYPE_F32;
    int ok = 1;
    for (int32_t r = 0; r < c->R && ok; r++) {
        const int32_t s = c->seq_len[r];
        if (s == 0)
            continue;
        void *ckv = malloc((size_t)s * c->Dc * 4), *kpe = malloc((size_t)s * c->Dr * 4);
        int64_t *slots = malloc((size_t)s * sizeof(int64_t));
        kva_test_fill(ckv, src, (size_t)s * c->Dc, &rng, 1.0);
        kva_test_fill(kpe, src, (size_t)s * c->Dr, &rng, 1.0);
        for (int32_t j = 0; j < s; j++)
            slots[j] = (int64_t)m->bt[(size_t)r * maxb + j / c->B] * c->B + j % c->B;
        ok &= kva_cache_write(ctx, m->cache, s, ckv, 0, kpe, 0, src, slots) == KVA_STATUS_OK;
        free(ckv);
        free(kpe);
        free(slots);
    }
    const size_t D = (size_t)(c->Dc + c->Dr), T = (size_t)m->T, ks = (size_t)(c->K + c->stride_pad);
    m->q = malloc((T > 0 ? T : 1) * c->H * D * kva_dtype_size(c->dt));
    kva_test_fill(m->q, c->dt, T * c->H * D, &rng, 1.0);
    /* Index lists: positions of the token's own request, some unused, some
     * repeated; the padding past K is garbage no reader may use. */
    m->idx = malloc((T > 0 ? T : 1) * ks * sizeof(int32_t));
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t t = m->qsl[r]; t < m->qsl[r + 1]; t++) {
            int32_t *row = m->idx + (size_t)t * ks;
            for (int32_t e = 0; e < (int32_t)ks; e++) {
                const double u = kva_rng_unit(&rng);
                if (e >= c->K)
                    row[e] = -7;
                else if (c->seq_len[r] == 0 || u < c->unused)
                    row[e] = -1;
                else if (e > 0 && u < c->unused + c->dup)
                    row[e] = row[kva_rng_int(&rng, 0, e - 1)];
                else
                    row[e] = kva_rng_int(&rng, 0, c->seq_len[r] - 1);
            }
        }
    if (c->use_len) {
        m->len = malloc((T > 0 ? T : 1) * sizeof(int32_t));
        for (size_t t = 0; t < T; t++)
            m->len[t] = t % 5 == 1 ? 0 : t % 5 == 2 ? c->K : kva_rng_int(&rng, 0, c->K);
    }
    if (c->sinks) {
        m->sinks = malloc((size_t)c->H * sizeof(float));
        for (int32_t h = 0; h < c->H; h++)
            m->sinks[h] = (float)(4.0 * kva_rng_unit(&rng) - 1.0);
    }
    return ok;
}

static inline void sp_data_free(sp_data *m)
{
    kva_cache_destroy(m->cache);
    free(m->bt);
    free(m->q);
    free(m->idx);
    free(m->len);
    free(m->sinks);
    memset(m, 0, sizeof *m);
}

#endif /* KVA_TEST_SPARSE_UTIL_H */
