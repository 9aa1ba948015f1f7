/*
 * dcp_util.h - the batch, formats and masks the DCP tests share
 * (test_dcp.c, mpi/test_dcp_mpi.c), and one rank's cache and plan for it:
 * the rank's cache is filled through kva_dcp_slots from every token's K/V.
 */
#ifndef KVA_TEST_DCP_UTIL_H
#define KVA_TEST_DCP_UTIL_H

#include "cache_util.h"

typedef struct fmt {
    const char *name;
    kva_quant quant;
    kva_dtype cache_dt, q_dt;
} fmt;

static const fmt fmts[] = {
    {"f32", KVA_QUANT_NONE, KVA_DTYPE_F32, KVA_DTYPE_F32},
    {"f16", KVA_QUANT_NONE, KVA_DTYPE_F16, KVA_DTYPE_F16},
    {"bf16", KVA_QUANT_NONE, KVA_DTYPE_BF16, KVA_DTYPE_BF16},
    {"int8_channel", KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_F32},
    {"int8_token_k", KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_F32},
    {"int8_token_k_v16", KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_F16, KVA_DTYPE_F16},
    {"fp8", KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, KVA_DTYPE_BF16},
};

typedef struct mask {
    const char *name;
    int causal, window, alibi, sinks;
    float softcap;
} mask;

static const mask masks[] = {
    {"causal", 1, -1, 0, 0, 0.0f},         {"window", 1, 21, 0, 0, 0.0f},
    {"alibi-softcap", 1, -1, 1, 0, 15.0f}, {"sinks", 1, -1, 0, 1, 0.0f},
    {"non-causal", 0, -1, 0, 0, 0.0f},
};

/* The batch: q_lens and global seq_lens (decodes, a spec decode, a prefill
 * chunk, a long decode, and requests shorter than some N * I). */
#define R 6
/* Not const: the CUDA test also runs the batch as decodes only (all 1). */
static int32_t q_lens[R] = {1, 3, 9, 1, 1, 2};
static const int32_t seq_lens[R] = {37, 20, 41, 700, 2, 5};
/* Head sizes: a test may set KVA_DCP_D / KVA_DCP_DV before the include (the
 * CUDA test takes 64, which its tensor-core and quantized kernels cover). */
#ifndef KVA_DCP_D
#define KVA_DCP_D 32
#define KVA_DCP_DV 24
#endif
enum { H = 4, HKV = 2, D = KVA_DCP_D, DV = KVA_DCP_DV, B = 8 };

/* One rank's cache (on ctx) and plan (on plan_ctx, or ctx when NULL) for
 * the batch: a block-table row per request over blocks handed out in a
 * scrambled order. */
typedef struct rank_run {
    kva_cache *cache;
    kva_plan *plan;
    int32_t *bt;
    int32_t stride;
} rank_run;

static inline kva_status setup_rank(kva_context *ctx, const fmt *f, const mask *m, int32_t N,
                                    int32_t rank, int32_t I, const float *k, const float *v,
                                    const float *slopes, rank_run *rr, kva_context *plan_ctx)
{
    int32_t local[R];
    CHECK_OK(kva_dcp_local_lens(R, seq_lens, N, rank, I, local));
    int32_t stride = 1, nb = 1;
    for (int32_t r = 0; r < R; r++) {
        const int32_t need = (local[r] + B - 1) / B;
        stride = need > stride ? need : stride;
        nb += need;
    }
    rr->stride = stride;
    rr->bt = malloc(sizeof(int32_t) * R * stride);
    /* Block ids 1 .. nb-1 in a scrambled order (7 is prime to most nb). */
    int32_t next = 0;
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < stride; j++)
            rr->bt[r * stride + j] = j < (local[r] + B - 1) / B
                                         ? 1 + (int32_t)(((int64_t)next++ * 7919) % (nb - 1))
                                         : -1;
    kva_cache_desc cd = make_desc(nb, B, HKV, D, DV, f->cache_dt, KVA_LAYOUT_NHD);
    cd.quant = f->quant;
    kva_rng pr = {1234}; /* the same static scales on every rank */
    float pbuf[2 * HKV * (D + DV)];
    kva_quant_params qp;
    make_params(f->quant, HKV, D, DV, 0, &pr, pbuf, &qp);
    CHECK_OK(kva_cache_create_quant(ctx, &cd, f->quant == KVA_QUANT_NONE ? NULL : &qp, &rr->cache));
    /* Every request's tokens go to every rank; each keeps its own. */
    int64_t row0 = 0;
    for (int32_t r = 0; r < R; r++) {
        int64_t *slots = malloc(sizeof(int64_t) * seq_lens[r]);
        CHECK_OK(kva_dcp_slots(N, rank, I, B, rr->bt + r * stride, stride, 0, seq_lens[r], slots));
        CHECK_OK(kva_cache_write(ctx, rr->cache, seq_lens[r], k + row0 * HKV * D, 0,
                                 v + row0 * HKV * DV, 0, KVA_DTYPE_F32, slots));
        free(slots);
        row0 += seq_lens[r];
    }
    int32_t qsl[R + 1] = {0};
    for (int32_t r = 0; r < R; r++)
        qsl[r + 1] = qsl[r] + q_lens[r];
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = rr->bt;
    pd.block_table_stride = stride;
    pd.block_size = B;
    pd.decode_threshold = 3;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.head_dim_v = DV;
    pd.q_dtype = f->q_dt;
    pd.causal = m->causal;
    pd.window_left = m->window;
    pd.softcap = m->softcap;
    pd.alibi_slopes = m->alibi ? slopes : NULL;
    pd.dcp_size = N;
    pd.dcp_rank = rank;
    pd.dcp_interleave = I;
    return kva_plan_create(plan_ctx ? plan_ctx : ctx, &pd, &rr->plan);
}

static inline void free_rank(rank_run *rr)
{
    kva_plan_destroy(rr->plan);
    kva_cache_destroy(rr->cache);
    free(rr->bt);
}

static inline int32_t total_tokens(void)
{
    int32_t t = 0;
    for (int32_t r = 0; r < R; r++)
        t += q_lens[r];
    return t;
}

/* The batch's data: every token's K/V rows [sum(seq_lens), Hkv, D / Dv]
 * float32 and the queries [T, H, D] in the format's q dtype (fixed seed). */
typedef struct dcp_data {
    float *k, *v;
    void *q;
    int32_t T;
    size_t es, on; /* bytes of a q/out element; elements of one output [T, H, Dv] */
} dcp_data;

static inline void dcp_data_make(const fmt *f, kva_rng *rng, dcp_data *d)
{
    int64_t rows = 0;
    for (int32_t r = 0; r < R; r++)
        rows += seq_lens[r];
    d->T = total_tokens();
    d->es = kva_dtype_size(f->q_dt);
    d->on = (size_t)d->T * H * DV;
    d->k = malloc(sizeof(float) * rows * HKV * D);
    d->v = malloc(sizeof(float) * rows * HKV * DV);
    kva_test_fill_uniform(d->k, KVA_DTYPE_F32, (size_t)rows * HKV * D, rng);
    kva_test_fill_uniform(d->v, KVA_DTYPE_F32, (size_t)rows * HKV * DV, rng);
    d->q = malloc(d->es * d->T * H * D);
    kva_test_fill(d->q, f->q_dt, (size_t)d->T * H * D, rng, 1.5);
}

static inline void dcp_data_free(dcp_data *d)
{
    free(d->k), free(d->v), free(d->q);
}

/* Elements of the combined output got [on] that differ from the unsharded
 * want beyond the tolerance: the dtype's, + extra_atol, + since every
 * partial is rounded to the dtype before the combine, the dtype's relative
 * tolerance times the element's largest |partial| (parts [N, on]; a convex
 * combination carries at most their largest rounding error). Prints the
 * first three with label. */
static inline size_t dcp_compare(const char *label, kva_dtype dt, const void *got, const void *want,
                                 const void *parts, int32_t N, size_t on, double extra_atol)
{
    size_t bad = 0;
    for (size_t i = 0; i < on; i++) {
        double big = 0.0;
        for (int32_t p = 0; p < N; p++) {
            const double x = fabs(kva_test_get(parts, dt, on * p + i));
            big = x > big ? x : big; /* NaN partials are skipped */
        }
        const double a = kva_test_get(got, dt, i), w = kva_test_get(want, dt, i);
        const double tol = kva_test_atol(dt) + extra_atol + kva_test_rtol(dt) * (fabs(w) + big);
        if (!(fabs(a - w) <= tol) && bad++ < 3)
            fprintf(stderr, "  %s: element %zu: got %.8g, want %.8g\n", label, i, a, w);
    }
    return bad;
}

#endif /* KVA_TEST_DCP_UTIL_H */
