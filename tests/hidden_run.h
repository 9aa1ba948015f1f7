/*
 * hidden_run.h - runs one hidden-slot case (hidden_util.h) on a host cache:
 * builds the cache (garbage pattern or zeros), writes the keys, overwrites
 * the hidden keys, runs the case's entry point and returns out and lse. The
 * CUDA test uses the same steps with a device copy of the storage
 * (hc_build's storage pointers may be host mirrors: hc_sync then copies).
 */
#ifndef KVA_TEST_HIDDEN_RUN_H
#define KVA_TEST_HIDDEN_RUN_H

#include "hidden_util.h"

/* Static scales of the quantized formats (fixed values: the twin caches and
 * every backend get the same). */
static inline void hc_params(const kva_cache_desc *d, float *buf, kva_quant_params *p)
{
    memset(p, 0, sizeof *p);
    if (d->kind == KVA_ATTN_MLA) {
        if (d->quant == KVA_QUANT_FP8_E4M3) {
            buf[0] = 0.01f;
            p->k_scale = buf, p->k_scale_len = 1;
        }
        return;
    }
    kva_rng r = {77};
    make_params(d->quant, d->num_kv_heads, d->head_dim, d->head_dim_v, 1, &r, buf, p);
}

/* Output sizes of a case: elements of out per token, out dtype. */
static inline int32_t hc_out_dim(const hc_case *c)
{
    if (c->api == HC_MLA_RUN)
        return c->pd.num_heads * c->pd.mla_v_head_dim;
    return c->pd.num_heads * c->pd.head_dim_v;
}

/* The slot of request r's key at global position p on this plan's rank, or -1. */
static inline int64_t hc_slot(const hc_case *c, int r, int32_t p)
{
    int64_t s = -1;
    const int32_t B = c->pd.block_size;
    if (c->pd.dcp_size > 1) {
        CHECK_OK(kva_dcp_slots(c->pd.dcp_size, c->pd.dcp_rank,
                               c->pd.dcp_interleave ? c->pd.dcp_interleave : 1, B,
                               &c->bt[r * HC_MAXBT], HC_MAXBT, p, 1, &s));
        return s;
    }
    return (int64_t)c->bt[r * HC_MAXBT + p / B] * B + p % B;
}

/* Which hidden keys a run overwrites: every one (1), or only those no row
 * of the request sees (0: the CUDA test's default, kvattn.h asking that
 * backend for finite values where other rows see the key). */
static int hc_all_hidden = 1;

/* Writes every key of the requests with q_len > 0 (values by slot, so that
 * shared blocks get the same rows from every request), then, when pat >= 0,
 * overwrites the hidden keys (hc_all_hidden) with hc_hidden_value rows and
 * their per-token key scales (if any: ts, host) with the pattern. */
static inline void hc_write(kva_context *ctx, const hc_case *c, kva_cache *cache, int pat,
                            float *ts)
{
    const kva_cache_desc *d = &c->cd;
    const int mla = d->kind == KVA_ATTN_MLA;
    const int32_t kw = mla ? d->head_dim_v : d->num_kv_heads * d->head_dim;
    const int32_t vw = mla ? d->head_dim - d->head_dim_v : d->num_kv_heads * d->head_dim_v;
    const int64_t nslots = (int64_t)d->num_blocks * d->block_size;
    float *k = malloc(sizeof(float) * (size_t)nslots * kw);
    float *v = malloc(sizeof(float) * (size_t)nslots * vw);
    int64_t *map = malloc(sizeof(int64_t) * (size_t)nslots);
    kva_rng rng = {1234};
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)nslots * kw, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, (size_t)nslots * vw, &rng, 1.0);
    for (int64_t i = 0; i < nslots; i++)
        map[i] = -1;
    for (int r = 0; r < c->pd.num_requests; r++)
        if (c->qsl[r + 1] > c->qsl[r])
            for (int32_t p = 0; p < c->sl[r]; p++) {
                const int64_t s = hc_slot(c, r, p);
                if (s >= 0)
                    map[s] = s;
            }
    CHECK_OK(kva_cache_write(ctx, cache, (int32_t)nslots, k, 0, v, 0, KVA_DTYPE_F32, map));
    if (pat >= 0) {
        const float x = hc_hidden_value(d, pat);
        for (int64_t i = 0; i < nslots; i++)
            map[i] = -1;
        for (int64_t i = 0; i < (int64_t)nslots * kw; i++)
            k[i] = x;
        for (int64_t i = 0; i < (int64_t)nslots * vw; i++)
            v[i] = x;
        for (int r = 0; r < c->pd.num_requests; r++)
            for (int h = 0; h < c->nhid[r]; h++) {
                const int64_t s = hc_slot(c, r, c->hid[r][h]);
                if (s < 0 || (!hc_all_hidden && hc_seen(c, r, c->hid[r][h])))
                    continue;
                map[s] = s;
                if (ts) { /* [NB, Hkv, B] */
                    const int64_t b = s / d->block_size, o = s % d->block_size;
                    for (int32_t kh = 0; kh < d->num_kv_heads; kh++)
                        hc_fill32(&ts[(b * d->num_kv_heads + kh) * d->block_size + o], 4,
                                  pat == HC_NAN    ? NAN
                                  : pat == HC_PINF ? INFINITY
                                                   : -INFINITY);
                }
            }
        CHECK_OK(kva_cache_write(ctx, cache, (int32_t)nslots, k, 0, v, 0, KVA_DTYPE_F32, map));
    }
    free(k);
    free(v);
    free(map);
}

/* Inputs of a case's run (same for every backend): q, and for kva_mla_run
 * w_uk, w_uv; idx: the sparse index rows when they live elsewhere (device
 * memory), else NULL (the case's own). */
typedef struct hc_inputs {
    void *q, *w_uk, *w_uv;
    int32_t *idx;
} hc_inputs;

static inline void hc_inputs_make(const hc_case *c, hc_inputs *in)
{
    const kva_plan_desc *p = &c->pd;
    const size_t es = kva_dtype_size(p->q_dtype);
    kva_rng rng = {99};
    const int32_t Dr = p->head_dim - p->head_dim_v;
    const size_t nq =
        (size_t)c->T * p->num_heads *
        (c->api == HC_MLA_RUN ? (size_t)(p->mla_qk_nope_head_dim + Dr) : (size_t)p->head_dim);
    in->q = malloc(nq * es);
    kva_test_fill(in->q, p->q_dtype, nq, &rng, 1.0);
    in->w_uk = in->w_uv = NULL;
    in->idx = NULL;
    if (c->api == HC_MLA_RUN) {
        const size_t nk = (size_t)p->num_heads * p->mla_qk_nope_head_dim * p->head_dim_v;
        const size_t nv = (size_t)p->num_heads * p->head_dim_v * p->mla_v_head_dim;
        in->w_uk = malloc(nk * es);
        in->w_uv = malloc(nv * es);
        kva_test_fill(in->w_uk, p->q_dtype, nk, &rng, 0.2);
        kva_test_fill(in->w_uv, p->q_dtype, nv, &rng, 0.2);
    }
}

static inline void hc_inputs_free(hc_inputs *in)
{
    free(in->q);
    free(in->w_uk);
    free(in->w_uv);
}

/* Runs the case's entry point on a plan and cache of ctx into out / lse
 * (poisoned first). */
static inline kva_status hc_call(kva_context *ctx, const hc_case *c, const kva_plan *plan,
                                 const hc_inputs *in, const kva_cache *cache, void *out, float *lse)
{
    const int32_t *idx = in->idx ? in->idx : c->idx;
    if (c->api == HC_MLA_RUN)
        return kva_mla_run(ctx, plan, in->q, in->w_uk, in->w_uv, cache, out, lse);
    if (c->api == HC_SPARSE)
        return kva_mla_sparse_run(ctx, plan, in->q, cache, idx, 0, NULL, NULL, out, lse);
    return kva_attention_run(ctx, plan, in->q, cache, NULL, out, lse);
}

/* A host cache of the case's desc (created on ctx, a host backend) whose
 * storage holds pattern pat (zeros for pat < 0), with the keys written and
 * the hidden keys overwritten (hc_write); NULL on failure. */
static inline kva_cache *hc_host_cache(kva_context *ctx, const hc_case *c, int pat)
{
    /* make_params fills k / v scales and offsets of every channel: 2 Hkv (D + Dv)
     * (the cache copies them). */
    const kva_cache_desc *d = &c->cd;
    const int32_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    float *buf = malloc(sizeof(float) * (2 * (size_t)d->num_kv_heads * (d->head_dim + dv) + 8));
    kva_quant_params qp;
    hc_params(&c->cd, buf, &qp);
    kva_cache *cache = NULL;
    CHECK_OK(
        kva_cache_create_quant(ctx, &c->cd, c->cd.quant == KVA_QUANT_NONE ? NULL : &qp, &cache));
    free(buf);
    if (!cache)
        return NULL;
    void *k = NULL, *v = NULL;
    float *ts = NULL;
    CHECK_OK(kva_cache_data(cache, &k, &v));
    CHECK_OK(kva_cache_token_scales(cache, &ts));
    hc_fill_storage(cache, pat, k, v, ts);
    hc_write(ctx, c, cache, pat, ts);
    return cache;
}

/* One host run: hc_host_cache's cache, the case run on ctx. out [T,
 * out_dim] q_dtype, lse [T, H], both poisoned first. */
static inline void hc_host_run(kva_context *ctx, const hc_case *c, int pat, const hc_inputs *in,
                               void *out, float *lse)
{
    kva_cache *cache = hc_host_cache(ctx, c, pat);
    if (!cache)
        return;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &c->pd, &plan));
    kva_test_poison(out, c->pd.q_dtype, (size_t)c->T * hc_out_dim(c));
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)c->T * c->pd.num_heads);
    if (plan)
        CHECK_OK(hc_call(ctx, c, plan, in, cache, out, lse));
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
}

/* Compares the rows of a garbage run (got) with the clean run (want) that
 * see no hidden key: equal up to rounding, out and lse; the clean rows must be
 * written and finite. Returns the number of differing (token, head) rows;
 * prints the first. */
static inline int hc_compare(const hc_case *c, const char *who, int pat, const void *got,
                             const float *glse, const void *want, const float *wlse)
{
    const kva_dtype dt = c->pd.q_dtype;
    const int32_t H = c->pd.num_heads, dv = hc_out_dim(c) / H;
    int bad = 0, checked = 0;
    for (int r = 0; r < c->pd.num_requests; r++)
        for (int32_t t = c->qsl[r]; t < c->qsl[r + 1]; t++) {
            if (!hc_row_checked(c, r, t - c->qsl[r]))
                continue;
            for (int32_t h = 0; h < H; h++) {
                const size_t o = ((size_t)t * H + h) * dv;
                int fin = isfinite(wlse[t * H + h]) || wlse[t * H + h] == -INFINITY;
                for (int32_t e = 0; e < dv; e++)
                    fin &= isfinite(kva_test_get(want, dt, o + e));
                CHECK_MSG(fin, "%s: %s, clean run: token %d head %d not finite", c->name, who, t,
                          h);
                checked++;
                /* Equal up to rounding: keys hidden from the row may still
                 * take part in a tile's running max (a different, equally
                 * valid rounding); garbage that reaches the row is NaN, inf
                 * or far off. */
                int ok = 1;
                for (int32_t e = 0; e < dv && ok; e++) {
                    const double g = kva_test_get(got, dt, o + e),
                                 w = kva_test_get(want, dt, o + e);
                    ok = fabs(g - w) <= 2 * (kva_test_atol(dt) + kva_test_rtol(dt) * fabs(w));
                }
                const double gl = glse[t * H + h], wl = wlse[t * H + h];
                ok &= gl == wl || fabs(gl - wl) <= 1e-5 * (1 + fabs(wl));
                if (ok)
                    continue;
                if (!bad)
                    fprintf(stderr,
                            "  %s: %s, garbage %s: token %d (request %d) head %d: out[0] %g "
                            "(clean %g), lse %g (clean %g)\n",
                            c->name, who,
                            pat == HC_NAN    ? "NaN"
                            : pat == HC_PINF ? "+inf"
                                             : "-inf",
                            t, r, h, kva_test_get(got, dt, o), kva_test_get(want, dt, o),
                            glse[t * H + h], wlse[t * H + h]);
                bad++;
            }
        }
    CHECK_MSG(checked > 0, "%s: no row to check", c->name);
    return bad;
}

#endif /* KVA_TEST_HIDDEN_RUN_H */
