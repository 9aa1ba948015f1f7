/*
 * qmag_sweep.h - the q-magnitude sweep (issue #22), shared by test_qmag.c
 * (reference and CPU backends) and cuda/test_cuda_qmag.c.
 *
 * q = sigma * z with z ~ N(0, 1) in the q dtype and sigma a power of two from
 * 2^-20 (~1e-6) to 2^10 (~1e3); the softmax scale is 1 / (sqrt(D) sigma), so
 * the logits stay O(1) and the exact result does not depend on sigma
 * (scaling by a power of two is exact in bf16 and f32, and in f16 where no
 * element leaves the normal range: checked per sigma). Per case (cache
 * format, cache dtype, q dtype) and sigma, over a batch of decodes (q_len
 * 1-4, one split-KV length) and prefill items:
 *   - the reference at sigma equals the reference at sigma 1 (when q is
 *     exactly sigma z), to the q dtype's tolerance;
 *   - the backend under test equals the reference at the same sigma (out
 *     and lse; the reference at sigma 1 where q is exactly sigma z and the
 *     backend asks so), outputs poisoned with NaN before each run.
 * KVA_TEST_QUICK=1 (the sanitizer run) keeps the extremes, sigma 2^-20 and
 * 2^10 (sigma 1 itself is what every other test runs).
 * The backend is reached through two callbacks (qmag_backend) so that the
 * CUDA test can keep its own device cache.
 */
#ifndef KVA_TEST_QMAG_SWEEP_H
#define KVA_TEST_QMAG_SWEEP_H

#include "batchgen.h"
#include "cache_util.h"

/* A cache format and the dtypes under test. */
typedef struct qmag_case {
    kva_quant quant;
    kva_dtype cache_dt; /* the cache desc's dtype */
    kva_dtype qdt;      /* q and out */
    int32_t H, Hkv, D, B;
    kva_layout layout;
} qmag_case;

/* The backend under test: prepare() receives the host (REF) cache once per
 * case, after it was written (hc's desc and params are those given); run()
 * plans pd on the backend and runs it over its copy of the cache, q, out and
 * lse being host buffers. */
typedef struct qmag_backend {
    const char *name;
    void *ud;
    void (*prepare)(void *ud, const kva_cache_desc *cd, const kva_quant_params *p,
                    const kva_cache *hc);
    kva_status (*run)(void *ud, const kva_plan_desc *pd, const void *q, void *out, float *lse);
    int ref_each_sigma;    /* 1: run the reference at every sigma and check it against sigma 1;
                              0: only where q is not exactly sigma z (the backend is compared
                              with the reference at sigma 1 otherwise) */
    double out_atol_extra; /* added to the q dtype's atol (e.g. f16 P of tensor-core kernels) */
    const char *mode;      /* printed with a failure */
} qmag_backend;

/* The formats under test: cache format, cache dtype, q dtype, and whether
 * the CUDA backend serves it (f32 q and f32 caches run on ref/CPU only). */
static const struct qmag_format {
    kva_quant quant;
    kva_dtype cache_dt, qdt;
    int cuda;
} qmag_formats[] = {
    {KVA_QUANT_NONE, KVA_DTYPE_F32, KVA_DTYPE_F32, 0},
    {KVA_QUANT_NONE, KVA_DTYPE_F16, KVA_DTYPE_F16, 1},
    {KVA_QUANT_NONE, KVA_DTYPE_BF16, KVA_DTYPE_BF16, 1},
    {KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_BF16, 1},
    {KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_F16, 1},
    {KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_F32, 0},
    {KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_BF16, 1},
    {KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_F16, 1},
    {KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_F32, 0},
    {KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_F16, KVA_DTYPE_F16, 1},
    {KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_BF16, KVA_DTYPE_BF16, 1},
    {KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, KVA_DTYPE_BF16, 1},
    {KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, KVA_DTYPE_F16, 1},
};
#define QMAG_NFORMATS ((int)(sizeof qmag_formats / sizeof qmag_formats[0]))

#define QMAG_NSIGMA 7
static const int qmag_log2_sigma[QMAG_NSIGMA] = {-20, -14, -10, -4, 0, 4, 10};

/* Decodes of q_len 1..4 (one long enough to split), and prefills. */
#define QMAG_R 6
static const int32_t qmag_ql[QMAG_R] = {1, 4, 3, 2, 61, 37};
static const int32_t qmag_sl[QMAG_R] = {700, 64, 300, 2100, 200, 37};

/* q = 2^e z element-wise in dt; returns 1 if every element is exactly 2^e z
 * (no rounding, no subnormal, no overflow), else 0. */
static inline int qmag_scale_q(void *q, const void *z, kva_dtype dt, size_t n, int e)
{
    int exact = 1;
    for (size_t i = 0; i < n; i++) {
        const float x = (float)ldexp(kva_test_get(z, dt, i), e);
        float back;
        if (dt == KVA_DTYPE_F32) {
            ((float *)q)[i] = x;
            back = x;
        } else if (dt == KVA_DTYPE_F16) {
            ((uint16_t *)q)[i] = kva_f32_to_f16(x);
            back = kva_f16_to_f32(((uint16_t *)q)[i]);
        } else {
            ((uint16_t *)q)[i] = kva_f32_to_bf16(x);
            back = kva_bf16_to_f32(((uint16_t *)q)[i]);
        }
        if (back != x || (dt == KVA_DTYPE_F16 && fabsf(back) < 0x1p-14f))
            exact = 0;
    }
    return exact;
}

/* Runs the sweep of one case; returns the number of failed comparisons. */
static inline int qmag_run_case(const qmag_case *c, const qmag_backend *be, uint64_t seed)
{
    kva_rng rng = {seed};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, QMAG_R, qmag_ql, qmag_sl, c->B, 2, 1);
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, T = b.T;
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 0);
    kva_cache_desc cd = {b.num_blocks, c->B, Hkv, D, D, c->cache_dt, c->layout, c->quant};
    float *pbuf = malloc(sizeof(float) * 4 * Hkv * D);
    kva_quant_params p;
    make_params(c->quant, Hkv, D, D, 0, &rng, pbuf, &p);
    kva_cache *hc = NULL;
    CHECK_OK(kva_cache_create_quant(ref, &cd, c->quant == KVA_QUANT_NONE ? NULL : &p, &hc));
    int fails = 0;
    if (!hc) {
        fails = 1;
        goto out_cache;
    }
    const int32_t n = b.num_blocks * c->B;
    const size_t nkv = (size_t)n * Hkv * D;
    /* Unquantized caches are written in their own dtype, the others from f32. */
    const kva_dtype src_dt = c->quant == KVA_QUANT_NONE ? c->cache_dt : KVA_DTYPE_F32;
    void *k = malloc(nkv * 4), *v = malloc(nkv * 4);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(k, src_dt, nkv, &rng);
    kva_test_fill_uniform(v, src_dt, nkv, &rng);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ref, hc, n, k, 0, v, 0, src_dt, slots));
    free(k), free(v), free(slots);
    be->prepare(be->ud, &cd, c->quant == KVA_QUANT_NONE ? NULL : &p, hc);

    const size_t nq = (size_t)T * H * D, nl = (size_t)T * H, es = kva_dtype_size(c->qdt);
    void *z = malloc(nq * es), *q = malloc(nq * es);
    void *want1 = malloc(nq * es), *want = malloc(nq * es), *got = malloc(nq * es);
    float *lw1 = malloc(nl * 4), *lw = malloc(nl * 4), *lg = malloc(nl * 4);
    kva_test_fill(z, c->qdt, nq, &rng, 1.0);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, c->qdt);
    kva_plan *pr = NULL;
    const int quick_sweep = getenv("KVA_TEST_QUICK") != NULL;
    for (int si = -1; si < QMAG_NSIGMA; si++) {
        /* si = -1: the reference at sigma 1, the target of the others. */
        const int e = si < 0 ? 0 : qmag_log2_sigma[si];
        if (si >= 0 && quick_sweep && e != -20 && e != 10)
            continue;
        const int exact = qmag_scale_q(q, z, c->qdt, nq, e);
        pd.scale = (float)ldexp(1.0 / sqrt((double)D), -e);
        const double atol = kva_test_atol(c->qdt), rtol = kva_test_rtol(c->qdt);
        size_t bad = 0;
        void *wo = want1;
        float *wl = lw1;
        if (si < 0 || !exact || be->ref_each_sigma) {
            kva_plan_destroy(pr);
            pr = NULL;
            CHECK_OK(kva_plan_create(ref, &pd, &pr));
            wo = si < 0 ? want1 : want;
            wl = si < 0 ? lw1 : lw;
            kva_test_poison(wo, c->qdt, nq);
            kva_test_poison(wl, KVA_DTYPE_F32, nl);
            CHECK_OK(kva_attention_run(ref, pr, q, hc, NULL, wo, wl));
            if (si < 0)
                continue;
            if (exact) {
                bad += kva_test_compare("ref vs ref(sigma 1) out", want, want1, c->qdt, nq, atol,
                                        rtol);
                bad += kva_test_compare_f32("ref vs ref(sigma 1) lse", lw, lw1, nl, 1e-4, 2e-5);
            }
        }
        kva_test_poison(got, c->qdt, nq);
        kva_test_poison(lg, KVA_DTYPE_F32, nl);
        CHECK_OK(be->run(be->ud, &pd, q, got, lg));
        bad += kva_test_compare("out", got, wo, c->qdt, nq, atol + be->out_atol_extra, rtol);
        bad += kva_test_compare_f32("lse", lg, wl, nl, 1e-4, 2e-5);
        CHECK_MSG(bad == 0,
                  "%s (%s): %s cache %s, q %s, H %d Hkv %d D %d B %d %s, sigma 2^%d: %zu bad",
                  be->name, be->mode ? be->mode : "default", kva_quant_name(c->quant),
                  kva_dtype_name(c->cache_dt), kva_dtype_name(c->qdt), (int)H, (int)Hkv, (int)D,
                  (int)c->B, c->layout == KVA_LAYOUT_HND ? "HND" : "NHD", e, bad);
        fails += bad != 0;
    }
    kva_plan_destroy(pr);
    free(z), free(q), free(want1), free(want), free(got), free(lw1), free(lw), free(lg);
    kva_cache_destroy(hc);
out_cache:
    free(pbuf);
    kva_context_destroy(ref);
    kva_test_batch_free(&b);
    return fails;
}

#endif /* KVA_TEST_QMAG_SWEEP_H */
