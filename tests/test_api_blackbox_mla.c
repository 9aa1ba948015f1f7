/*
 * test_api_blackbox_mla.c - black-box audit, round three (session 37, task
 * api37): kvattn_mla.h on the reference and CPU backends, against oracles
 * built from the public API and the header's formulas alone:
 *   - kva_mla_run (layer level) against the header's naive math in double,
 *     computed here from the latent rows the cache holds (kva_cache_read),
 *     and the absorbed call over the same rows; H 1 / 17, B 1 / 64, Dn, Dv,
 *     Dc, Dr all different, 16-bit and FP8 latent caches, decode and
 *     compute-friendly paths in one plan, contexts longer than a chunk;
 *   - kva_mla_sparse_run against a dense absorbed plan over a block-size-1
 *     copy of the rows that lists exactly each token's entries (duplicates
 *     twice, -1 dropped, topk_length's prefix): K not a multiple of B, K
 *     above seq_len, rows of -1 only, requests with no keys, sinks, strides
 *     wider than K, MIXED and SEPARATE, 16-bit and fp8_ds_mla caches;
 *   - kva_indexer_run against the header's logits and order in double: ties
 *     (identical keys, zero weights) by position, K above pos + 1, NaN keys
 *     last, FP8_TOKEN keys and FP8 index queries, entries past K of a wide
 *     stride untouched.
 * Outputs are poisoned before every run.
 */
#include "blackbox_util.h"

#include <float.h>

/* The latent rows [NB * B, Dc + Dr] a cache holds, as float (kva_cache_read). */
static float *bm_rows(kva_context *ctx, const kva_cache *c, int32_t n, int32_t Dc, int32_t Dr)
{
    float *rows = malloc(sizeof(float) * (size_t)n * (Dc + Dr));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_read(ctx, c, n, slots, rows, Dc + Dr, rows + Dc, Dc + Dr, KVA_DTYPE_F32));
    free(slots);
    return rows;
}

/* A checksum of a cache's key storage (MLA and index-key caches hold no
 * separate V), every byte of every block whatever the format. */
static uint64_t bm_cache_sum(const kva_cache *c)
{
    kva_cache_desc d;
    void *k = NULL;
    if (kva_cache_get_desc(c, &d) != KVA_STATUS_OK || kva_cache_data(c, &k, NULL) != KVA_STATUS_OK)
        return 0;
    return bb_sum(k, (size_t)d.num_blocks * kva_cache_block_bytes_k(c));
}

/* A batch of R requests (q_lens ql, seq_lens sl, blocks of B): qsl [R + 1]
 * from ql, a shuffled block table [R, stride] (returned) in *bt, and in *nb
 * the cache's block count (every id the table holds, and one more). */
static int32_t bm_table(int32_t R, const int32_t *ql, const int32_t *sl, int32_t B, kva_rng *rng,
                        int32_t **bt, int32_t *qsl, int32_t *nb_out)
{
    int32_t stride = 1, nb = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t n = (sl[r] + B - 1) / B;
        stride = n > stride ? n : stride;
        nb += n;
    }
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)(nb + 1));
    for (int32_t i = 0; i <= nb; i++)
        perm[i] = i;
    for (int32_t i = nb; i > 0; i--) {
        const int32_t j = kva_rng_int(rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    *bt = malloc(sizeof(int32_t) * (size_t)R * stride);
    int32_t used = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t n = (sl[r] + B - 1) / B;
        for (int32_t j = 0; j < stride; j++)
            (*bt)[r * stride + j] = j < n ? perm[used + j] : -1;
        used += n;
    }
    free(perm);
    qsl[0] = 0;
    for (int32_t r = 0; r < R; r++)
        qsl[r + 1] = qsl[r] + ql[r];
    *nb_out = nb + 1;
    return stride;
}

/* The slot of position p of request r. */
static int64_t bm_slot(const int32_t *bt, int32_t stride, int32_t B, int32_t r, int32_t p)
{
    return (int64_t)bt[r * stride + p / B] * B + p % B;
}

/* ---- layer-level MLA ---------------------------------------------------- */

typedef struct bm_mla {
    const char *name;
    int32_t R, ql[4], sl[4];
    int32_t H, Dc, Dr, Dn, Dv, B;
    kva_dtype dt;
    int fp8, causal;
    int32_t thr;
} bm_mla;

/* kvattn_mla.h's semantics in double: out [T, H, Dv], lse [T, H]. */
static void bm_mla_oracle(const bm_mla *c, const int32_t *qsl, const int32_t *bt, int32_t stride,
                          const float *rows, const void *q, const void *wuk, const void *wuv,
                          float scale, double *out, double *lse)
{
    const int32_t H = c->H, Dc = c->Dc, Dr = c->Dr, Dn = c->Dn, Dv = c->Dv, W = Dc + Dr;
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t s = c->sl[r], ql = c->ql[r];
        double *kn = malloc(sizeof(double) * (size_t)(s ? s : 1) * Dn);
        double *vv = malloc(sizeof(double) * (size_t)(s ? s : 1) * Dv);
        double *sc = malloc(sizeof(double) * (size_t)(s ? s : 1));
        for (int32_t h = 0; h < H; h++) {
            for (int32_t j = 0; j < s; j++) {
                const float *row = rows + bm_slot(bt, stride, c->B, r, j) * W;
                for (int32_t n = 0; n < Dn; n++) {
                    double a = 0;
                    for (int32_t e = 0; e < Dc; e++)
                        a += kva_test_get(wuk, c->dt, ((size_t)h * Dn + n) * Dc + e) * row[e];
                    kn[(size_t)j * Dn + n] = a;
                }
                for (int32_t n = 0; n < Dv; n++) {
                    double a = 0;
                    for (int32_t e = 0; e < Dc; e++)
                        a += row[e] * kva_test_get(wuv, c->dt, ((size_t)h * Dc + e) * Dv + n);
                    vv[(size_t)j * Dv + n] = a;
                }
            }
            for (int32_t i = 0; i < ql; i++) {
                const int32_t t = qsl[r] + i, pos = s - ql + i;
                const size_t qo = ((size_t)t * H + h) * (Dn + Dr);
                double m = -INFINITY, sum = 0;
                int32_t n = 0;
                for (int32_t j = 0; j < s && (!c->causal || j <= pos); j++, n++) {
                    const float *row = rows + bm_slot(bt, stride, c->B, r, j) * W;
                    double a = 0;
                    for (int32_t e = 0; e < Dn; e++)
                        a += kva_test_get(q, c->dt, qo + e) * kn[(size_t)j * Dn + e];
                    for (int32_t e = 0; e < Dr; e++)
                        a += kva_test_get(q, c->dt, qo + Dn + e) * row[Dc + e];
                    sc[j] = a * scale;
                    m = sc[j] > m ? sc[j] : m;
                }
                double *o = out + ((size_t)t * H + h) * Dv;
                for (int32_t e = 0; e < Dv; e++)
                    o[e] = 0;
                for (int32_t j = 0; j < n; j++) {
                    const double p = exp(sc[j] - m);
                    sum += p;
                    for (int32_t e = 0; e < Dv; e++)
                        o[e] += p * vv[(size_t)j * Dv + e];
                }
                for (int32_t e = 0; e < Dv && n; e++)
                    o[e] /= sum;
                lse[(size_t)t * H + h] = n ? m + log(sum) : -INFINITY;
            }
        }
        free(kn);
        free(vv);
        free(sc);
    }
}

/* Runs a layer-level case on backend be; compares with the oracle (the
 * reference backend within rounding of the output dtype, the CPU within the
 * bounds test_mla.c states for its bf16 kernels). */
static void bm_mla_run(const bm_mla *c, kva_backend be, uint64_t seed)
{
    kva_rng rng = {seed};
    const int32_t H = c->H, Dc = c->Dc, Dr = c->Dr, Dn = c->Dn, Dv = c->Dv;
    int32_t *bt = NULL, qsl[5] = {0};
    int32_t nb = 0;
    const int32_t stride = bm_table(c->R, c->ql, c->sl, c->B, &rng, &bt, qsl, &nb);
    const int32_t T = qsl[c->R], NS = nb * c->B;
    const size_t es = kva_dtype_size(c->dt);
    kva_context *ctx = new_ctx(be, 3);
    kva_cache_desc cd = {nb,
                         c->B,
                         1,
                         Dc + Dr,
                         Dc,
                         c->fp8 ? KVA_DTYPE_FP8_E4M3 : c->dt,
                         KVA_LAYOUT_NHD,
                         c->fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    const float ks = 0.011f;
    kva_quant_params qp = {&ks, 1, NULL, 0, NULL, 0, NULL, 0};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, c->fp8 ? &qp : NULL, &cache));
    float *ckv = malloc(sizeof(float) * (size_t)NS * Dc), *kpe = malloc(sizeof(float) * NS * Dr);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)NS);
    kva_test_fill(ckv, KVA_DTYPE_F32, (size_t)NS * Dc, &rng, 1.0);
    kva_test_fill(kpe, KVA_DTYPE_F32, (size_t)NS * Dr, &rng, 1.0);
    for (int32_t i = 0; i < NS; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ctx, cache, NS, ckv, 0, kpe, 0, KVA_DTYPE_F32, slots));
    float *rows = bm_rows(ctx, cache, NS, Dc, Dr);
    void *q = malloc(es * (size_t)(T ? T : 1) * H * (Dn + Dr));
    void *wuk = malloc(es * (size_t)H * Dn * Dc), *wuv = malloc(es * (size_t)H * Dc * Dv);
    kva_test_fill(q, c->dt, (size_t)T * H * (Dn + Dr), &rng, 1.0);
    kva_test_fill(wuk, c->dt, (size_t)H * Dn * Dc, &rng, 1.0 / sqrt(Dc));
    kva_test_fill(wuv, c->dt, (size_t)H * Dc * Dv, &rng, 1.0 / sqrt(Dc));
    const float scale = (float)(1.0 / sqrt(Dn + Dr));
    kva_plan_desc pd = kva_test_mla_desc(c->R, qsl, c->sl, bt, stride, c->B, H, Dc + Dr, Dc, c->dt,
                                         scale, c->causal);
    pd.decode_threshold = c->thr;
    pd.mla_qk_nope_head_dim = Dn;
    pd.mla_v_head_dim = Dv;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    const size_t on = (size_t)T * H * Dv;
    void *out = malloc(es * (on ? on : 1));
    float *lse = malloc(sizeof(float) * (size_t)(T ? T : 1) * H);
    double *wo = malloc(sizeof(double) * (on ? on : 1));
    double *wl = malloc(sizeof(double) * (size_t)(T ? T : 1) * H);
    kva_test_poison(out, c->dt, on);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    const uint64_t sum_in = bb_sum(q, es * (size_t)T * H * (Dn + Dr)) ^
                            bb_sum(wuk, es * (size_t)H * Dn * Dc) ^
                            bb_sum(wuv, es * (size_t)H * Dc * Dv) ^ bm_cache_sum(cache);
    if (p)
        CHECK_OK(kva_mla_run(ctx, p, q, wuk, wuv, cache, out, lse));
    CHECK((bb_sum(q, es * (size_t)T * H * (Dn + Dr)) ^ bb_sum(wuk, es * (size_t)H * Dn * Dc) ^
           bb_sum(wuv, es * (size_t)H * Dc * Dv) ^ bm_cache_sum(cache)) == sum_in);
    bm_mla_oracle(c, qsl, bt, stride, rows, q, wuk, wuv, scale, wo, wl);
    /* Reference: fp64, one rounding to the output dtype. CPU: bf16 parts of q
     * and P on its bf16 kernels (test_mla.c's bounds), fp32 otherwise. */
    const int lowp = c->dt == KVA_DTYPE_BF16 || c->fp8;
    const double at = be == KVA_BACKEND_REF ? 1e-5 : lowp ? KVA_TEST_MLA_BF16DOT_ATOL : 2e-4;
    const double rt = be == KVA_BACKEND_REF ? 1.5 * kva_test_rtol(c->dt) + 1e-6
                      : lowp                ? 2 * kva_test_rtol(KVA_DTYPE_BF16)
                                            : 2 * kva_test_rtol(c->dt) + 2e-4;
    const double lat = be == KVA_BACKEND_REF ? 2e-6 : lowp ? KVA_TEST_MLA_BF16DOT_LSE_ATOL : 1e-4;
    size_t bad = 0;
    for (size_t i = 0; i < on; i++) {
        const double a = kva_test_get(out, c->dt, i), b = wo[i];
        if (!(fabs(a - b) <= at + rt * fabs(b)) && bad++ < 4)
            fprintf(stderr, "  %s: out %zu got %.8g want %.8g\n", c->name, i, a, b);
    }
    for (size_t i = 0; i < (size_t)T * H; i++) {
        const double a = lse[i], b = wl[i];
        const int ok = isinf(b) ? a == b : fabs(a - b) <= lat + 1e-6 * fabs(b);
        if (!ok && bad++ < 8)
            fprintf(stderr, "  %s: lse %zu got %.8g want %.8g\n", c->name, i, a, b);
    }
    CHECK_MSG(bad == 0, "%s on %s: %zu mismatches", c->name, kva_backend_name(be), bad);
    /* lse NULL is allowed and changes nothing else. */
    void *out2 = malloc(es * (on ? on : 1));
    kva_test_poison(out2, c->dt, on);
    if (p)
        CHECK_OK(kva_mla_run(ctx, p, q, wuk, wuv, cache, out2, NULL));
    CHECK_MSG(memcmp(out, out2, es * on) == 0, "%s: lse NULL changed out", c->name);
    free(out2);
    kva_plan_destroy(p);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(ckv), free(kpe), free(slots), free(rows), free(q), free(wuk), free(wuv);
    free(out), free(lse), free(wo), free(wl), free(bt);
}

/* Layer-level MLA: one head and 17, blocks of 1 and 64, every head size
 * different, decode and compute-friendly requests in one plan, a long
 * context, FP8 latent rows, non-causal rows without keys. */
static void test_mla_layer(void)
{
    /* clang-format off */
    static const bm_mla cs[] = {
        {"mla H1 B1", 3, {1, 5, 0}, {9, 12, 4}, 1, 32, 16, 24, 8, 1, KVA_DTYPE_F32, 0, 1, 2},
        {"mla H17 B64", 3, {2, 40, 1}, {64, 700, 65}, 17, 16, 8, 40, 24, 64, KVA_DTYPE_F32, 0, 1,
         2},
        {"mla H17 bf16", 2, {1, 9}, {130, 129}, 17, 32, 16, 8, 16, 16, KVA_DTYPE_BF16, 0, 1, 4},
        {"mla fp8 f16", 3, {3, 1, 7}, {3, 50, 20}, 3, 24, 8, 16, 40, 3, KVA_DTYPE_F16, 1, 1, 1},
        {"mla long decode", 2, {1, 2}, {3000, 2047}, 3, 16, 8, 8, 16, 16, KVA_DTYPE_F32, 0, 1, 2},
        {"mla noncausal", 4, {3, 2, 6, 1}, {0, 5, 2, 1}, 5, 16, 8, 8, 8, 3, KVA_DTYPE_F32, 0, 0, 2},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int bi = 0; bi < 2; bi++)
            bm_mla_run(&cs[i], kBk[bi], 3800 + i);
}

/* ---- sparse MLA ----------------------------------------------------------- */

typedef struct bm_sp {
    const char *name;
    int32_t R, ql[4], sl[4];
    int32_t H, Dc, Dr, B, K;
    kva_dtype dt;
    int ds;        /* 1: an fp8_ds_mla cache (Dc a multiple of 128); 2: FP8_E4M3 rows */
    int32_t mode;  /* kva_sparse_mode */
    int32_t thr;   /* decode_threshold */
    int len;       /* 1: topk_length given */
    int sinks;     /* 1: sinks given */
    double unused; /* fraction of -1 entries (1: every entry) */
    int32_t pad;   /* indices_stride = K + pad */
} bm_sp;

/* Runs a sparse case on backend be and compares it with the dense oracle. */
static void bm_sp_run(const bm_sp *c, kva_backend be, uint64_t seed)
{
    kva_rng rng = {seed};
    const int32_t H = c->H, Dc = c->Dc, Dr = c->Dr, W = Dc + Dr, K = c->K, ST = K + c->pad;
    int32_t *bt = NULL, qsl[5] = {0};
    int32_t nb = 0;
    const int32_t stride = bm_table(c->R, c->ql, c->sl, c->B, &rng, &bt, qsl, &nb);
    const int32_t T = qsl[c->R], NS = nb * c->B;
    const size_t es = kva_dtype_size(c->dt);
    kva_context *ctx = new_ctx(be, 3);
    const kva_quant qf8 = c->ds == 1 ? KVA_QUANT_FP8_DS_MLA : KVA_QUANT_FP8_E4M3;
    kva_cache_desc cd = {nb,
                         c->B,
                         1,
                         W,
                         Dc,
                         c->ds ? KVA_DTYPE_FP8_E4M3 : c->dt,
                         KVA_LAYOUT_NHD,
                         c->ds ? qf8 : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    const float ks = 0.0123f;
    kva_quant_params qp = {&ks, 1, NULL, 0, NULL, 0, NULL, 0};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, c->ds == 2 ? &qp : NULL, &cache));
    float *lat = malloc(sizeof(float) * (size_t)NS * W);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)NS);
    kva_test_fill(lat, KVA_DTYPE_F32, (size_t)NS * W, &rng, 1.0);
    for (int32_t i = 0; i < NS; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ctx, cache, NS, lat, W, lat + Dc, W, KVA_DTYPE_F32, slots));
    float *rows = bm_rows(ctx, cache, NS, Dc, Dr);
    /* Index rows: -1, repeats, positions; garbage past topk_length and K. */
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(T ? T : 1) * ST), len[64];
    int32_t maxn = 1;
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t t = qsl[r]; t < qsl[r + 1]; t++) {
            int32_t *row = idx + (size_t)t * ST;
            len[t] = c->len ? kva_rng_int(&rng, 0, K) : K;
            for (int32_t e = 0; e < ST; e++) {
                const double u = kva_rng_unit(&rng);
                if (e >= len[t])
                    row[e] = e % 2 ? -1000 : 1 << 30; /* never read */
                else if (c->sl[r] == 0 || u < c->unused)
                    row[e] = -1;
                else if (e > 0 && u < c->unused + 0.2)
                    row[e] = row[kva_rng_int(&rng, 0, e - 1)];
                else
                    row[e] = kva_rng_int(&rng, 0, c->sl[r] - 1);
            }
            maxn = len[t] > maxn ? len[t] : maxn;
        }
    void *q = malloc(es * (size_t)(T ? T : 1) * H * W);
    float *qf = malloc(sizeof(float) * (size_t)(T ? T : 1) * H * W), sinks[64];
    kva_test_fill(q, c->dt, (size_t)T * H * W, &rng, 1.0);
    for (size_t i = 0; i < (size_t)T * H * W; i++)
        qf[i] = (float)kva_test_get(q, c->dt, i);
    kva_test_fill(sinks, KVA_DTYPE_F32, 64, &rng, 1.0);
    const float scale = (float)(1.0 / sqrt(128.0 + Dr));
    kva_plan_desc pd =
        kva_test_mla_desc(c->R, qsl, c->sl, bt, stride, c->B, H, W, Dc, c->dt, scale, 1);
    pd.decode_threshold = c->thr;
    pd.sparse_topk = K;
    pd.sparse_mode = c->mode;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    const size_t on = (size_t)T * H * Dc;
    void *out = malloc(es * (on ? on : 1));
    float *lse = malloc(sizeof(float) * (size_t)(T ? T : 1) * H);
    kva_test_poison(out, c->dt, on);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)T * H);
    /* The run reads indices, q, the sinks and the cache only. */
    const uint64_t sum_in = bb_sum(idx, sizeof(int32_t) * (size_t)T * ST) ^
                            bb_sum(q, es * (size_t)T * H * W) ^ bb_sum(sinks, sizeof sinks) ^
                            bb_sum(len, sizeof len) ^ bm_cache_sum(cache);
    if (p)
        CHECK_OK(kva_mla_sparse_run(ctx, p, q, cache, idx, ST, c->len ? len : NULL,
                                    c->sinks ? sinks : NULL, out, lse));
    void *out2 = malloc(es * (on ? on : 1)); /* lse NULL: the same out */
    kva_test_poison(out2, c->dt, on);
    if (p)
        CHECK_OK(kva_mla_sparse_run(ctx, p, q, cache, idx, ST, c->len ? len : NULL,
                                    c->sinks ? sinks : NULL, out2, NULL));
    CHECK_MSG(memcmp(out, out2, es * on) == 0, "%s: lse NULL changed out", c->name);
    free(out2);
    CHECK((bb_sum(idx, sizeof(int32_t) * (size_t)T * ST) ^ bb_sum(q, es * (size_t)T * H * W) ^
           bb_sum(sinks, sizeof sinks) ^ bb_sum(len, sizeof len) ^ bm_cache_sum(cache)) == sum_in);
    /* The oracle: token t as a one-token non-causal request over its listed
     * rows (a block-size-1 f32 copy, one block per listed entry). */
    int32_t *oqsl = malloc(sizeof(int32_t) * (size_t)(T + 1)), *osl = malloc(sizeof(int32_t) * T);
    int32_t *obt = malloc(sizeof(int32_t) * (size_t)T * maxn);
    float *orow = malloc(sizeof(float) * (size_t)(T * maxn + 1) * W);
    int32_t n_all = 0;
    oqsl[0] = 0;
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t t = qsl[r]; t < qsl[r + 1]; t++) {
            int32_t n = 0;
            for (int32_t e = 0; e < len[t]; e++) {
                const int32_t j = idx[(size_t)t * ST + e];
                if (j < 0)
                    continue;
                memcpy(orow + (size_t)n_all * W, rows + bm_slot(bt, stride, c->B, r, j) * W,
                       sizeof(float) * W);
                obt[(size_t)t * maxn + n++] = n_all++;
            }
            for (int32_t e = n; e < maxn; e++)
                obt[(size_t)t * maxn + e] = -1;
            osl[t] = n;
            oqsl[t + 1] = t + 1;
        }
    kva_context *oc = new_ctx(KVA_BACKEND_REF, 1);
    kva_cache_desc od = {n_all ? n_all : 1, 1,           1, W, Dc, KVA_DTYPE_F32, KVA_LAYOUT_NHD,
                         KVA_QUANT_NONE,    KVA_ATTN_MLA};
    kva_cache *ocache = NULL;
    CHECK_OK(kva_cache_create(oc, &od, &ocache));
    int64_t *os = malloc(sizeof(int64_t) * (size_t)(n_all + 1));
    for (int32_t i = 0; i < n_all; i++)
        os[i] = i;
    CHECK_OK(kva_cache_write(oc, ocache, n_all, orow, W, orow + Dc, W, KVA_DTYPE_F32, os));
    free(os);
    kva_plan_desc opd =
        kva_test_mla_desc(T, oqsl, osl, obt, maxn, 1, H, W, Dc, KVA_DTYPE_F32, scale, 0);
    kva_plan *op = NULL;
    CHECK_OK(kva_plan_create(oc, &opd, &op));
    float *wo = malloc(sizeof(float) * (on ? on : 1)),
          *wl = malloc(sizeof(float) * (T ? T : 1) * H);
    kva_test_poison(wo, KVA_DTYPE_F32, on);
    if (op)
        CHECK_OK(kva_attention_run(oc, op, qf, ocache, c->sinks ? sinks : NULL, wo, wl));
    /* Reference: one rounding to the output dtype. CPU: fp32 products; its
     * SEPARATE prefills read rows back as bf16 (kvattn.h, kva_sparse_mode),
     * and bf16 queries run bf16 dot products (test_mla_sparse.c's bounds). */
    const int loose =
        be == KVA_BACKEND_CPU && (c->mode == KVA_SPARSE_SEPARATE || c->dt == KVA_DTYPE_BF16);
    const double at = loose ? 2e-2 : be == KVA_BACKEND_REF ? 1e-5 : 1e-3;
    const double rt = loose ? 9e-3 : 1.5 * kva_test_rtol(c->dt) + 1e-5;
    size_t bad = 0;
    for (size_t i = 0; i < on; i++) {
        const double a = kva_test_get(out, c->dt, i), b = wo[i];
        if (!(fabs(a - b) <= at + rt * fabs(b)) && bad++ < 4)
            fprintf(stderr, "  %s: out %zu got %.8g want %.8g\n", c->name, i, a, b);
    }
    for (size_t i = 0; i < (size_t)T * H; i++) {
        const double a = lse[i], b = wl[i];
        const int ok = isinf(b) ? a == b : fabs(a - b) <= (loose ? 2e-2 : 1e-4) + 1e-6 * fabs(b);
        if (!ok && bad++ < 8)
            fprintf(stderr, "  %s: lse %zu got %.8g want %.8g\n", c->name, i, a, b);
    }
    CHECK_MSG(bad == 0, "%s on %s: %zu mismatches", c->name, kva_backend_name(be), bad);
    kva_plan_destroy(op);
    kva_cache_destroy(ocache);
    kva_context_destroy(oc);
    kva_plan_destroy(p);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(lat), free(slots), free(rows), free(idx), free(q), free(qf), free(out), free(lse);
    free(oqsl), free(osl), free(obt), free(orow), free(wo), free(wl), free(bt);
}

/* Sparse MLA: H 1 / 3 / 17, B 1 / 3 / 16 / 64, K not a multiple of B and
 * above seq_len, requests without keys (q_len > seq_len: causal is
 * ignored), rows of -1 only, repeats, sinks, wide strides, both modes,
 * 16-bit and fp8_ds_mla caches. */
static void test_sparse_oracle(void)
{
    /* clang-format off */
    static const bm_sp cs[] = {
        {"sp H1 B1", 2, {1, 3}, {4, 9}, 1, 16, 8, 1, 5, KVA_DTYPE_F32, 0, 0, 1, 1, 0, 0.25, 0},
        {"sp H17 B16 sep", 3, {1, 4, 2}, {50, 40, 3}, 17, 32, 16, 16, 37, KVA_DTYPE_F16, 0, 1, 1,
         0, 1, 0.25, 2},
        {"sp H17 B16 mixed", 3, {1, 4, 2}, {50, 40, 3}, 17, 32, 16, 16, 37, KVA_DTYPE_F16, 0, 0, 1,
         1, 1, 0.25, 0},
        {"sp ds B64", 2, {1, 5}, {130, 64}, 3, 128, 16, 64, 70, KVA_DTYPE_F32, 1, 0, 1, 1, 1, 0.2,
         3},
        {"sp ds B64 sep", 2, {1, 5}, {130, 64}, 3, 128, 16, 64, 70, KVA_DTYPE_F16, 1, 1, 1, 0, 0,
         0.2, 0},
        {"sp no keys sep", 3, {2, 3, 1}, {0, 2, 5}, 5, 16, 8, 3, 4, KVA_DTYPE_F32, 0, 1, 1, 1, 1,
         0.25, 1},
        {"sp no keys mixed", 3, {2, 3, 1}, {0, 2, 5}, 5, 16, 8, 3, 4, KVA_DTYPE_F32, 0, 0, 1, 0, 0,
         0.25, 0},
        {"sp fp8 rows bf16", 3, {1, 2, 3}, {9, 30, 17}, 4, 24, 8, 3, 13, KVA_DTYPE_BF16, 2, 0, 1,
         1, 1, 0.25, 0},
        {"sp fp8 rows sep", 3, {1, 2, 3}, {9, 30, 17}, 4, 24, 8, 3, 13, KVA_DTYPE_F32, 2, 1, 1, 0,
         1, 0.25, 0},
        {"sp ds Dc256 Dr8", 2, {2, 1}, {20, 5}, 2, 256, 8, 16, 9, KVA_DTYPE_BF16, 1, 0, 1, 1, 1,
         0.25, 0},
        {"sp long", 2, {1, 3}, {3000, 2100}, 3, 16, 8, 64, 700, KVA_DTYPE_F32, 0, 0, 1, 1, 1, 0.1,
         0},
        {"sp long sep", 2, {1, 3}, {3000, 2100}, 3, 16, 8, 64, 700, KVA_DTYPE_F32, 0, 1, 1, 1, 0,
         0.1, 0},
        {"sp all -1", 2, {1, 6}, {7, 20}, 3, 24, 8, 3, 6, KVA_DTYPE_F32, 0, 1, 1, 0, 1, 1.0, 0},
        {"sp all -1 no sink", 2, {1, 6}, {7, 20}, 3, 24, 8, 3, 6, KVA_DTYPE_F16, 0, 0, 1, 1, 0, 1.0,
         0},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int bi = 0; bi < 2; bi++)
            bm_sp_run(&cs[i], kBk[bi], 3820 + i);
}

/* ---- the indexer ------------------------------------------------------------ */

typedef struct bm_ix {
    const char *name;
    int32_t R, ql[4], sl[4];
    int32_t Hi, D, B, K;
    kva_dtype dt;
    int fp8k, fp8q; /* FP8_TOKEN keys; index_q_quant = FP8_TOKEN */
    int data;       /* 0 random; 1 every key of a request the same; 2 zero weights; 3 a NaN key;
                       4 a NaN in one query row of every other token (all its logits NaN) */
    int32_t pad;    /* indices_stride = K + pad */
    int len;        /* 1: topk_length given */
} bm_ix;

/* ReLU that keeps NaN (kvattn_mla.h). */
static double bm_relu(double x)
{
    return x != x ? x : x > 0 ? x : 0.0;
}

/* Checks row t (pos, listed row, length) against the logits L [pos + 1]:
 * min(K, pos + 1) distinct keys <= pos, in descending logit order within
 * tol (exact ties by position), none left out that beats the last listed,
 * NaN last, then -1 up to K. Returns 1 if it holds. */
static int bm_ix_row(const bm_ix *c, int32_t t, int32_t pos, const int32_t *row, int32_t len,
                     const double *L, double tol)
{
    const int32_t n = c->K < pos + 1 ? c->K : pos + 1;
    char *seen = calloc((size_t)pos + 1, 1);
    int ok = len == n;
    for (int32_t e = 0; e < c->K && ok; e++) {
        if (e >= n) {
            ok = row[e] == -1;
            continue;
        }
        const int32_t j = row[e];
        ok = j >= 0 && j <= pos && !seen[j];
        if (!ok)
            break;
        seen[j] = 1;
        if (e > 0) {
            const int32_t i = row[e - 1];
            const double a = L[i], b = L[j];
            if (a != a)
                ok = b != b && i < j; /* NaN last, among themselves by position */
            else if (b == b)
                ok = a >= b - tol && !(a == b && i > j);
        }
    }
    /* A key left out beats no listed one. */
    for (int32_t j = 0; j <= pos && ok && n > 0; j++)
        if (!seen[j]) {
            const double last = L[row[n - 1]];
            ok = L[j] != L[j] ||
                 (last == last && L[j] <= last + tol && !(L[j] == last && j < row[n - 1]));
        }
    free(seen);
    if (!ok) {
        fprintf(stderr, "  %s: token %d (pos %d) row wrong (len %d, want %d):", c->name, (int)t,
                (int)pos, (int)len, (int)n);
        for (int32_t e = 0; e < c->K && e < 12; e++)
            fprintf(stderr, " %d (%g)", (int)row[e],
                    row[e] >= 0 && row[e] <= pos ? L[row[e]] : 0.0);
        fputc('\n', stderr);
    }
    return ok;
}

static void bm_ix_run(const bm_ix *c, kva_backend be, uint64_t seed)
{
    kva_rng rng = {seed};
    const int32_t Hi = c->Hi, D = c->D, K = c->K, ST = K + c->pad;
    int32_t *bt = NULL, qsl[5] = {0};
    int32_t nb = 0;
    const int32_t stride = bm_table(c->R, c->ql, c->sl, c->B, &rng, &bt, qsl, &nb);
    const int32_t T = qsl[c->R], NS = nb * c->B;
    kva_context *ctx = new_ctx(be, 3);
    kva_cache_desc cd = {nb,
                         c->B,
                         1,
                         D,
                         0,
                         c->fp8k ? KVA_DTYPE_FP8_E4M3 : c->dt,
                         KVA_LAYOUT_NHD,
                         c->fp8k ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE,
                         KVA_ATTN_INDEX};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    float *keys = malloc(sizeof(float) * (size_t)NS * D);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)NS);
    kva_test_fill(keys, KVA_DTYPE_F32, (size_t)NS * D, &rng, 1.0);
    for (int32_t i = 0; i < NS; i++)
        slots[i] = i;
    for (int32_t r = 0; r < c->R && c->data == 1; r++) /* one key for the whole request */
        for (int32_t p = 1; p < c->sl[r]; p++)
            memcpy(keys + bm_slot(bt, stride, c->B, r, p) * D,
                   keys + bm_slot(bt, stride, c->B, r, 0) * D, sizeof(float) * D);
    if (c->data == 3)
        for (int32_t r = 0; r < c->R; r++)
            if (c->sl[r] > 2)
                keys[bm_slot(bt, stride, c->B, r, 1) * D + D / 2] = NAN;
    CHECK_OK(kva_cache_write(ctx, cache, NS, keys, 0, NULL, 0, KVA_DTYPE_F32, slots));
    float *kf = malloc(sizeof(float) * (size_t)NS * D);
    CHECK_OK(kva_cache_read(ctx, cache, NS, slots, kf, 0, NULL, 0, KVA_DTYPE_F32));
    const size_t es = kva_dtype_size(c->dt), qn = (size_t)T * Hi * D;
    void *q = malloc(es * (qn ? qn : 1));
    float *w = malloc(sizeof(float) * (size_t)(T ? T : 1) * Hi);
    kva_test_fill(q, c->dt, qn, &rng, 1.0);
    kva_test_fill(w, KVA_DTYPE_F32, (size_t)T * Hi, &rng, 1.0);
    if (c->data == 2)
        memset(w, 0, sizeof(float) * (size_t)T * Hi);
    for (int32_t t = 0; t < T && c->data == 4; t += 2) {
        const size_t e = ((size_t)t * Hi + (size_t)t % Hi) * D + (size_t)t % D;
        if (c->dt == KVA_DTYPE_F32)
            ((float *)q)[e] = NAN;
        else
            ((uint16_t *)q)[e] = c->dt == KVA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
    }
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = c->R;
    pd.query_start_loc = qsl;
    pd.seq_lens = c->sl;
    pd.block_table = bt;
    pd.block_table_stride = stride;
    pd.block_size = c->B;
    pd.num_heads = Hi;
    pd.num_kv_heads = 1;
    pd.head_dim = D;
    pd.head_dim_v = seed % 2 ? D : 0; /* 0 or D: the same plan */
    pd.q_dtype = c->dt;
    pd.causal = 1;
    pd.window_left = -1;
    pd.kind = KVA_ATTN_INDEX;
    pd.sparse_topk = K;
    pd.index_q_quant = c->fp8q ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    int32_t *ind = malloc(sizeof(int32_t) * (size_t)(T ? T : 1) * ST), len[128];
    for (size_t i = 0; i < (size_t)T * ST; i++)
        ind[i] = 0x5a5a5a5a;
    for (int32_t t = 0; t < T; t++)
        len[t] = 0x5a5a5a5a;
    const uint64_t sum_in =
        bb_sum(q, es * qn) ^ bb_sum(w, sizeof(float) * (size_t)T * Hi) ^ bm_cache_sum(cache);
    if (p)
        CHECK_OK(kva_indexer_run(ctx, p, q, w, cache, ind, ST, c->len ? len : NULL));
    CHECK((bb_sum(q, es * qn) ^ bb_sum(w, sizeof(float) * (size_t)T * Hi) ^ bm_cache_sum(cache)) ==
          sum_in);
    /* The header's logits in double from the stored keys and (FP8 q) the
     * quantized queries. */
    int bad = 0;
    double *qv = malloc(sizeof(double) * D), *L = malloc(sizeof(double) * (size_t)NS);
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t i = 0; i < c->ql[r]; i++) {
            const int32_t t = qsl[r] + i, pos = c->sl[r] - c->ql[r] + i;
            double mag = 0;
            for (int32_t j = 0; j <= pos; j++)
                L[j] = 0;
            for (int32_t h = 0; h < Hi; h++) {
                const size_t qo = ((size_t)t * Hi + h) * D;
                float amax = 0;
                for (int32_t d = 0; d < D; d++) {
                    qv[d] = kva_test_get(q, c->dt, qo + d);
                    amax = fabsf((float)qv[d]) > amax ? fabsf((float)qv[d]) : amax;
                }
                if (c->fp8q) {
                    float s = amax / 448.0f;
                    s = s > FLT_MIN ? s : FLT_MIN;
                    for (int32_t d = 0; d < D; d++)
                        qv[d] =
                            (double)kva_fp8_e4m3_to_f32(kva_f32_to_fp8_e4m3((float)qv[d] / s)) * s;
                }
                for (int32_t j = 0; j <= pos; j++) {
                    const float *k = kf + bm_slot(bt, stride, c->B, r, j) * D;
                    double a = 0, m = 0;
                    for (int32_t d = 0; d < D; d++) {
                        a += qv[d] * k[d];
                        m += fabs(qv[d] * k[d]);
                    }
                    L[j] += (double)w[(size_t)t * Hi + h] * bm_relu(a);
                    mag = fmax(mag, fabs(w[(size_t)t * Hi + h]) * m);
                }
            }
            const double tol = (be == KVA_BACKEND_REF ? 1e-12 : 1e-5) * mag * Hi;
            const int32_t n = c->K < pos + 1 ? c->K : pos + 1;
            bad += !bm_ix_row(c, t, pos, ind + (size_t)t * ST, c->len ? len[t] : n, L, tol);
            for (int32_t e = K; e < ST; e++)
                bad += ind[(size_t)t * ST + e] != 0x5a5a5a5a; /* past K: untouched */
            /* Exact ties: every key of the request the same, or zero weights. */
            if (c->data == 1 || c->data == 2)
                for (int32_t e = 0; e < n; e++)
                    bad += ind[(size_t)t * ST + e] != e;
        }
    CHECK_MSG(bad == 0, "%s on %s: %d bad rows", c->name, kva_backend_name(be), bad);
    kva_plan_destroy(p);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(keys), free(slots), free(kf), free(q), free(w), free(ind), free(qv), free(L), free(bt);
}

/* The indexer: one head and 17, D 8 / 24 / 128, blocks of 1, 3 and 64, K 1,
 * K above pos + 1, FP8_TOKEN keys and FP8 queries, exact ties by position,
 * NaN keys, wide strides, topk_length NULL. */
static void test_indexer_oracle(void)
{
    /* clang-format off */
    static const bm_ix cs[] = {
        {"ix H1 D8 B1 K1", 2, {3, 1}, {3, 10}, 1, 8, 1, 1, KVA_DTYPE_F32, 0, 0, 0, 0, 1},
        {"ix H3 D24 B3 K7", 3, {5, 0, 2}, {5, 4, 30}, 3, 24, 3, 7, KVA_DTYPE_F16, 0, 0, 0, 2, 1},
        {"ix H17 D128 fp8", 2, {1, 70}, {200, 70}, 17, 128, 64, 100, KVA_DTYPE_BF16, 1, 1, 0, 5,
         1},
        {"ix fp8 q f32 keys", 2, {4, 9}, {40, 9}, 4, 32, 16, 12, KVA_DTYPE_F32, 0, 1, 0, 0, 0},
        {"ix same keys", 2, {4, 2}, {10, 20}, 3, 16, 3, 6, KVA_DTYPE_F32, 0, 0, 1, 1, 1},
        {"ix same keys fp8", 2, {4, 2}, {10, 20}, 16, 16, 3, 6, KVA_DTYPE_BF16, 1, 1, 1, 0, 1},
        {"ix zero weights", 2, {3, 1}, {30, 70}, 5, 40, 16, 40, KVA_DTYPE_F16, 0, 0, 2, 0, 1},
        {"ix long", 2, {2, 1}, {3000, 1500}, 4, 32, 64, 2048, KVA_DTYPE_F32, 0, 0, 0, 0, 1},
        {"ix long ties", 2, {2, 1}, {3000, 1500}, 4, 32, 64, 100, KVA_DTYPE_F32, 0, 0, 1, 0, 1},
        {"ix long zero w fp8", 2, {2, 1}, {3000, 1500}, 4, 32, 64, 1000, KVA_DTYPE_BF16, 1, 1, 2,
         0, 1},
        {"ix NaN q", 3, {3, 2, 1}, {6, 40, 300}, 3, 16, 3, 9, KVA_DTYPE_F32, 0, 0, 4, 0, 1},
        {"ix NaN q fp8", 3, {3, 2, 1}, {6, 40, 300}, 5, 16, 16, 9, KVA_DTYPE_BF16, 1, 1, 4, 0, 1},
        {"ix NaN key", 2, {3, 2}, {6, 40}, 3, 16, 3, 9, KVA_DTYPE_F32, 0, 0, 3, 0, 1},
        {"ix NaN key fp8", 2, {3, 2}, {6, 40}, 3, 16, 3, 9, KVA_DTYPE_BF16, 1, 0, 3, 0, 1},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int bi = 0; bi < 2; bi++)
            bm_ix_run(&cs[i], kBk[bi], 3840 + i);
}

int main(void)
{
    RUN(test_mla_layer);
    RUN(test_sparse_oracle);
    RUN(test_indexer_oracle);
    return kva_test_finish();
}
