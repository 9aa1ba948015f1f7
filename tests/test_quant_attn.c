/*
 * test_quant_attn.c - attention over quantized caches on the reference and the
 * CPU backend (every kernel that runs here), for every format, through the
 * public API:
 *
 *   1. equals the reference run on the dequantized cache (an f32 cache holding
 *      the values the format defines) to float tolerance, for mixed batches
 *      (decodes, spec decodes, chunked prefill, fresh prefill), decode-only
 *      batches with long (split) contexts, GQA/MQA, D != Dv, both layouts,
 *      window, soft-cap, ALiBi, sinks and LSE;
 *   2. stays within a stated bound of attention over the unquantized values;
 *   3. with f16/bf16 queries, the CPU backend equals the reference on the same
 *      quantized cache to the q dtype's tolerance;
 *   4. PrefillNoCache: ragged attention over the float K/V (no int8 round trip)
 *      equals the reference while the cache receives the quantized copy.
 * KVA_TEST_QUICK=1 (the sanitizer run) runs the symmetric configurations
 * only for the formats that have offsets to leave out (INT8_CHANNEL,
 * INT8_TOKEN_K): for the others they repeat the asymmetric paths, in a
 * layout (HND) and head sizes (runtime D) that all-masks-hnd and mqa-dv96
 * run.
 */
#include "batchgen.h"
#include "cache_util.h"
#include "cpu_kernels.h"
#include "../src/attn/cpu/cpu_attn.h"
#include "../src/attn/cpu/cpu_dequant.h"
#include "internal.h"

typedef struct qcfg {
    const char *name;
    int32_t H, Hkv, D, Dv, B;
    kva_layout layout;
    int32_t window;
    float softcap;
    int alibi, sinks, lse;
    int decode_long; /* decode-only batch with long contexts (split-KV) */
    int sym;         /* int8 formats without offsets (symmetric: the v3/v4 FMT_I8S path) */
} qcfg;

static const qcfg cfgs[] = {
    {"gqa-nhd", 8, 2, 64, 64, 16, KVA_LAYOUT_NHD, -1, 0.0f, 0, 0, 1, 0, 0},
    {"all-masks-hnd", 6, 3, 128, 64, 5, KVA_LAYOUT_HND, 23, 20.0f, 1, 1, 1, 0, 0},
    {"mqa-dv96", 4, 1, 32, 96, 7, KVA_LAYOUT_NHD, -1, 0.0f, 0, 1, 1, 0, 0},
    {"decode-long", 8, 2, 128, 128, 16, KVA_LAYOUT_NHD, -1, 0.0f, 0, 1, 1, 1, 0},
    {"sym-long-hnd", 8, 2, 128, 128, 16, KVA_LAYOUT_HND, -1, 0.0f, 0, 1, 1, 1, 1},
    {"sym-masks-dv40", 6, 3, 56, 40, 5, KVA_LAYOUT_NHD, 23, 20.0f, 1, 1, 1, 0, 1},
};

/* Max |attention over quantized - over unquantized| per format (unit-variance
 * uniform K/V, scales calibrated to the data range); measured values are
 * printed, the bounds are ~2x above the largest measured. */
static const double vs_float_bound[KVA_TEST_MHA_QUANTS] = {0, 0.03, 0.03, 0.03, 0.15};

static kva_context *ctx_of(kva_backend b)
{
    kva_context_desc cd = {b, b == KVA_BACKEND_CPU ? 2 : 1, 0};
    kva_context *c = NULL;
    CHECK_OK(kva_context_create(&cd, &c));
    return c;
}

/* f32 cache of the same shape holding either the dequantized values of qc or
 * the float data (k, v: [NB*B, Hkv, D/Dv]). */
static kva_cache *float_cache(kva_context *ctx, const kva_cache *qc, const float *k, const float *v)
{
    const kva_cache_desc *d = &qc->desc;
    kva_cache_desc fd = *d;
    fd.dtype = KVA_DTYPE_F32;
    fd.quant = KVA_QUANT_NONE;
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &fd, &c));
    const int64_t n = (int64_t)d->num_blocks * d->block_size, Hkv = d->num_kv_heads;
    const int64_t D = d->head_dim, Dv = d->head_dim_v;
    float *kk = malloc(sizeof(float) * (size_t)(n * Hkv * D));
    float *vv = malloc(sizeof(float) * (size_t)(n * Hkv * Dv));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        slots[i] = i;
        for (int64_t h = 0; h < Hkv; h++) {
            for (int64_t ch = 0; ch < D; ch++)
                kk[(i * Hkv + h) * D + ch] =
                    k ? k[(i * Hkv + h) * D + ch]
                      : (float)kva__quant_load(qc, 0, i / d->block_size, i % d->block_size, h, ch);
            for (int64_t ch = 0; ch < Dv; ch++)
                vv[(i * Hkv + h) * Dv + ch] =
                    v ? v[(i * Hkv + h) * Dv + ch]
                      : (float)kva__quant_load(qc, 1, i / d->block_size, i % d->block_size, h, ch);
        }
    }
    CHECK_OK(kva_cache_write(ctx, c, (int32_t)n, kk, 0, vv, 0, KVA_DTYPE_F32, slots));
    free(kk);
    free(vv);
    free(slots);
    return c;
}

typedef struct run_out {
    void *out;
    float *lse;
} run_out;

/* Plans and runs attention on ctx over cache; out poisoned first. With a
 * kernel name (CPU backend) the plan runs that registry kernel on the items
 * of its family (forced on ctx for this plan only). */
static void run(kva_context *ctx, const kva_plan_desc *pd, const void *q, const kva_cache *cache,
                const float *sinks, const char *kernel, run_out *o, size_t out_n, size_t lse_n)
{
    kva_test_poison(o->out, pd->q_dtype, out_n);
    kva_test_poison(o->lse, KVA_DTYPE_F32, lse_n);
    kva_plan *plan = NULL;
    if (kernel)
        CHECK_OK(kva__context_force_kernel(ctx, kernel));
    CHECK_OK(kva_plan_create(ctx, pd, &plan));
    if (kernel)
        CHECK_OK(kva__context_force_kernel(ctx, NULL));
    if (!plan)
        return;
    CHECK_OK(kva_attention_run(ctx, plan, q, cache, sinks, o->out, o->lse));
    kva_plan_destroy(plan);
}

static void test_case(kva_quant fmt, const qcfg *cf, kva_rng *rng)
{
    kva_test_batch b;
    if (cf->decode_long) {
        const int32_t ql[4] = {1, 1, 1, 1}, sl[4] = {900, 1, 333, 2048};
        kva_test_batch_init(&b, rng, 4, ql, sl, cf->B, 3, 1);
    } else {
        kva_test_batch_random(&b, rng, 7, cf->B, 90, 0xf, 1);
    }
    const int32_t H = cf->H, Hkv = cf->Hkv, D = cf->D, Dv = cf->Dv;
    kva_context *ref = ctx_of(KVA_BACKEND_REF), *cpu = ctx_of(KVA_BACKEND_CPU);

    /* The quantized cache, every slot written from float data. */
    float *pbuf = malloc(sizeof(float) * (size_t)(2 * Hkv * (D + Dv)));
    kva_quant_params params;
    make_params(fmt, Hkv, D, Dv, 0, rng, pbuf, &params);
    if (cf->sym) {
        params.k_offset = params.v_offset = NULL;
        params.k_offset_len = params.v_offset_len = 0;
    }
    kva_cache_desc qd = {b.num_blocks,
                         cf->B,
                         Hkv,
                         D,
                         Dv,
                         fmt == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
                         : fmt == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_F16
                                                             : KVA_DTYPE_I8,
                         cf->layout,
                         fmt,
                         KVA_ATTN_MHA};
    kva_cache *qc = NULL;
    CHECK_OK(kva_cache_create_quant(cpu, &qd, &params, &qc));
    const int64_t n = (int64_t)b.num_blocks * cf->B;
    float *k = malloc(sizeof(float) * (size_t)(n * Hkv * D));
    float *v = malloc(sizeof(float) * (size_t)(n * Hkv * Dv));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)(n * Hkv * D), rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)(n * Hkv * Dv), rng);
    for (int64_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(cpu, qc, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    kva_cache *deq = float_cache(ref, qc, NULL, NULL);
    kva_cache *orig = float_cache(ref, qc, k, v);

    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, KVA_DTYPE_F32);
    pd.window_left = cf->window;
    pd.softcap = cf->softcap;
    float slopes[16], sinks[16];
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)(0.05 * (h + 1));
        sinks[h] = (float)(kva_rng_unit(rng) * 2.0 - 0.5);
    }
    pd.alibi_slopes = cf->alibi ? slopes : NULL;
    const float *sk = cf->sinks ? sinks : NULL;
    const size_t out_n = (size_t)b.T * H * Dv, lse_n = (size_t)b.T * H;
    void *q = malloc(sizeof(float) * (size_t)b.T * H * D);
    kva_test_fill(q, KVA_DTYPE_F32, (size_t)b.T * H * D, rng, 1.0);
    run_out want = {malloc(out_n * 4), cf->lse ? malloc(lse_n * 4) : NULL};
    run_out got = {malloc(out_n * 4), cf->lse ? malloc(lse_n * 4) : NULL};
    run_out fl = {malloc(out_n * 4), cf->lse ? malloc(lse_n * 4) : NULL};
    const size_t ln = cf->lse ? lse_n : 0;

    /* 1. Over the quantized cache == ref over the dequantized cache. */
    run(ref, &pd, q, deq, sk, NULL, &want, out_n, ln);
    char label[96];
    const double atol = kva_test_atol(KVA_DTYPE_F32), rtol = kva_test_rtol(KVA_DTYPE_F32);
    run(ref, &pd, q, qc, sk, NULL, &got, out_n, ln);
    snprintf(label, sizeof label, "%s %s ref", kva_quant_name(fmt), cf->name);
    CHECK_MSG(kva_test_compare(label, got.out, want.out, KVA_DTYPE_F32, out_n, atol, rtol) == 0,
              "%s", label);
    if (cf->lse)
        CHECK(kva_test_compare_f32(label, got.lse, want.lse, lse_n, atol, rtol) == 0);
    kva_test_kernel kern[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(kern);
    for (int32_t var = 0; var < nk; var++) {
        if (!kern[var].runs)
            continue;
        run(cpu, &pd, q, qc, sk, kern[var].name, &got, out_n, ln);
        snprintf(label, sizeof label, "%s %s cpu %s", kva_quant_name(fmt), cf->name,
                 kern[var].name);
        CHECK_MSG(kva_test_compare(label, got.out, want.out, KVA_DTYPE_F32, out_n, atol, rtol) == 0,
                  "%s", label);
        if (cf->lse)
            CHECK(kva_test_compare_f32(label, got.lse, want.lse, lse_n, atol, rtol) == 0);
    }

    /* 2. Against the unquantized values. */
    run(ref, &pd, q, orig, sk, NULL, &fl, out_n, ln);
    double maxd = 0;
    for (size_t i = 0; i < out_n; i++)
        maxd = fmax(maxd, fabs((double)((float *)want.out)[i] - ((float *)fl.out)[i]));
    printf("  %-17s %-14s max |quantized - float| = %.4f (bound %.3f)\n", kva_quant_name(fmt),
           cf->name, maxd, vs_float_bound[fmt]);
    CHECK_MSG(maxd <= vs_float_bound[fmt], "%s %s: %g", kva_quant_name(fmt), cf->name, maxd);

    /* 3. f16 and bf16 queries: CPU == ref over the same quantized cache. */
    const kva_dtype qdts[2] = {KVA_DTYPE_F16, KVA_DTYPE_BF16};
    void *q16 = malloc(2 * (size_t)b.T * H * D);
    for (int i = 0; i < 2; i++) {
        kva_plan_desc p16 = pd;
        p16.q_dtype = qdts[i];
        CHECK_OK(kva_convert(q, KVA_DTYPE_F32, q16, qdts[i], (size_t)b.T * H * D));
        run(ref, &p16, q16, qc, sk, NULL, &want, out_n, ln);
        run(cpu, &p16, q16, qc, sk, NULL, &got, out_n, ln);
        snprintf(label, sizeof label, "%s %s q %s", kva_quant_name(fmt), cf->name,
                 kva_dtype_name(qdts[i]));
        CHECK_MSG(kva_test_compare(label, got.out, want.out, qdts[i], out_n, kva_test_atol(qdts[i]),
                                   kva_test_rtol(qdts[i])) == 0,
                  "%s", label);
    }

    free(q16);
    free(q);
    free(want.out), free(want.lse), free(got.out), free(got.lse), free(fl.out), free(fl.lse);
    free(k), free(v), free(slots), free(pbuf);
    kva_cache_destroy(qc), kva_cache_destroy(deq), kva_cache_destroy(orig);
    kva_context_destroy(ref), kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

static void test_formats(void)
{
    kva_rng rng = {2024};
    for (int f = 1; f < KVA_TEST_MHA_QUANTS; f++)
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            const int offsets = f == KVA_QUANT_INT8_CHANNEL || f == KVA_QUANT_INT8_TOKEN_K;
            if (kva_test_quick() && cfgs[c].sym && !offsets)
                continue;
            test_case((kva_quant)f, &cfgs[c], &rng);
        }
}

/*
 * PrefillNoCache: attention runs over the incoming float K/V with
 * kva_attention_run_ragged (equal to the reference), and kva_cache_write
 * stores the quantized copy; a following decode step over the cache (the
 * PrefillCacheHit / DecodeOnly path) equals the reference over the
 * dequantized cache.
 */
static void test_prefill_no_cache(void)
{
    kva_rng rng = {31337};
    const int32_t H = 4, Hkv = 2, D = 64, Dv = 64, B = 16;
    const int32_t R = 3, ql[3] = {37, 64, 5};
    for (int f = 1; f < KVA_TEST_MHA_QUANTS; f++) {
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, R, ql, ql, B, 2, 0);
        kva_context *ref = ctx_of(KVA_BACKEND_REF), *cpu = ctx_of(KVA_BACKEND_CPU);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, KVA_DTYPE_F32);
        const size_t out_n = (size_t)b.T * H * Dv;
        float *q = malloc(sizeof(float) * (size_t)b.T * H * D);
        float *k = malloc(sizeof(float) * (size_t)b.T * Hkv * D);
        float *v = malloc(sizeof(float) * (size_t)b.T * Hkv * Dv);
        float *o_ref = malloc(out_n * 4), *o_cpu = malloc(out_n * 4);
        kva_test_fill(q, KVA_DTYPE_F32, (size_t)b.T * H * D, &rng, 1.0);
        kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)b.T * Hkv * D, &rng);
        kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)b.T * Hkv * Dv, &rng);
        kva_plan *pr = NULL, *pc = NULL;
        CHECK_OK(kva_plan_create(ref, &pd, &pr));
        CHECK_OK(kva_plan_create(cpu, &pd, &pc));
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(pc, &info));
        CHECK(info.state == KVA_STATE_PREFILL_NO_CACHE);
        kva_test_poison(o_ref, KVA_DTYPE_F32, out_n);
        kva_test_poison(o_cpu, KVA_DTYPE_F32, out_n);
        CHECK_OK(kva_attention_run_ragged(ref, pr, q, k, v, NULL, o_ref, NULL));
        CHECK_OK(kva_attention_run_ragged(cpu, pc, q, k, v, NULL, o_cpu, NULL));
        CHECK(kva_test_compare("ragged", o_cpu, o_ref, KVA_DTYPE_F32, out_n, 2e-5, 2e-5) == 0);

        /* The quantized copy: token t of request r goes to its block-table slot. */
        float pbuf[2 * 2 * (64 + 64)];
        kva_quant_params params;
        make_params((kva_quant)f, Hkv, D, Dv, 0, &rng, pbuf, &params);
        kva_cache_desc qd = {b.num_blocks,
                             B,
                             Hkv,
                             D,
                             Dv,
                             f == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
                             : f == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_BF16
                                                               : KVA_DTYPE_I8,
                             KVA_LAYOUT_NHD,
                             (kva_quant)f,
                             KVA_ATTN_MHA};
        kva_cache *qc = NULL;
        CHECK_OK(kva_cache_create_quant(cpu, &qd, &params, &qc));
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)b.T);
        for (int32_t r = 0; r < R; r++)
            for (int32_t i = 0; i < ql[r]; i++)
                slots[b.query_start_loc[r] + i] =
                    (int64_t)b.block_table[r * b.stride + i / B] * B + i % B;
        CHECK_OK(kva_cache_write(cpu, qc, b.T, k, 0, v, 0, KVA_DTYPE_F32, slots));
        /* Every stored value is the quantization of its float input. */
        double maxerr = 0;
        for (int32_t t = 0; t < b.T; t++)
            for (int32_t h = 0; h < Hkv; h++)
                for (int32_t ch = 0; ch < D; ch++) {
                    double x = kva__quant_load(qc, 0, slots[t] / B, slots[t] % B, h, ch);
                    maxerr = fmax(maxerr, fabs(x - k[((size_t)t * Hkv + h) * D + ch]));
                }
        CHECK_MSG(maxerr < (f == KVA_QUANT_FP8_E4M3 ? 0.11 : 0.011), "%s: key error %g",
                  kva_quant_name((kva_quant)f), maxerr);
        /* Paged attention over the quantized copy == ref over its dequantized
         * values, and close to the float prefill. */
        kva_cache *deq = float_cache(ref, qc, NULL, NULL);
        float *o_q = malloc(out_n * 4);
        run(ref, &pd, q, deq, NULL, NULL, &(run_out){o_ref, NULL}, out_n, 0);
        run(cpu, &pd, q, qc, NULL, NULL, &(run_out){o_q, NULL}, out_n, 0);
        CHECK(kva_test_compare("paged quant", o_q, o_ref, KVA_DTYPE_F32, out_n, 2e-5, 2e-5) == 0);
        double maxd = 0;
        for (size_t i = 0; i < out_n; i++)
            maxd = fmax(maxd, fabs((double)o_q[i] - o_cpu[i]));
        CHECK_MSG(maxd <= vs_float_bound[f], "%s: %g", kva_quant_name((kva_quant)f), maxd);
        free(o_q);
        kva_cache_destroy(deq);
        kva_cache_destroy(qc);
        free(slots);
        kva_plan_destroy(pr);
        kva_plan_destroy(pc);
        free(q), free(k), free(v), free(o_ref), free(o_cpu);
        kva_context_destroy(ref), kva_context_destroy(cpu);
        kva_test_batch_free(&b);
    }
}

/*
 * The chunk converter alone, portable and AVX2 (when the CPU has it), against
 * the format's definition in double: every int8 and fp8 code appears, rows
 * come from scattered pointers, widths 8..256.
 */
static void test_converter(void)
{
    kva_rng rng = {99};
    kva__cpu_features feat;
    kva__cpu_features_get(&feat);
    const int simd_ok = kva__cpu_dequant_simd(&feat);
    printf("converter paths: portable%s\n", simd_ok ? " + avx2" : " (no avx2 on this CPU)");
    const int32_t widths[3] = {8, 96, 256};
    for (int w = 0; w < 3; w++) {
        const int32_t W = widths[w], n = 13;
        unsigned char *store = malloc((size_t)n * W * 4 + 64);
        const unsigned char *rows[13];
        float ts_val[13], scale[256], offset[256];
        const float *ts[13];
        for (int32_t t = 0; t < n; t++) {
            rows[t] = store + (size_t)((t * 7) % n) * W * 4 + 1; /* odd addresses */
            ts_val[t] = (float)(kva_rng_unit(&rng) * 0.1 + 1e-3);
            ts[t] = &ts_val[t];
        }
        for (size_t i = 0; i < (size_t)n * W * 4 + 64; i++)
            store[i] = (unsigned char)(i * 37 + 11); /* every byte value */
        for (int32_t c = 0; c < W; c++) {
            scale[c] = (float)(kva_rng_unit(&rng) * 0.05 + 1e-3);
            offset[c] = (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
        }
        const kva_dtype dts[5] = {KVA_DTYPE_I8, KVA_DTYPE_I8, KVA_DTYPE_I8, KVA_DTYPE_FP8_E4M3,
                                  KVA_DTYPE_F16};
        for (int m = 0; m < 5; m++) {
            const int tok = m == 0, off = m == 1;
            const float *sc = (m == 0 || m == 4) ? NULL : scale;
            float *out = malloc(sizeof(float) * (size_t)n * W);
            for (int simd = 0; simd <= simd_ok; simd++) {
                kva_test_poison(out, KVA_DTYPE_F32, (size_t)n * W);
                /* F16 rows must be 2-byte aligned: use even addresses. */
                const unsigned char *r2[13];
                for (int32_t t = 0; t < n; t++)
                    r2[t] = m == 4 ? rows[t] - 1 : rows[t];
                kva__cpu_dequant_rows(n, W, dts[m], r2, tok ? ts : NULL, sc, off ? offset : NULL,
                                      simd, out);
                size_t bad = 0;
                for (int32_t t = 0; t < n; t++)
                    for (int32_t c = 0; c < W; c++) {
                        double want;
                        const unsigned char byte = r2[t][m == 4 ? 0 : c];
                        if (m == 4)
                            want = kva_f16_to_f32(((const uint16_t *)r2[t])[c]);
                        else if (m == 3)
                            want = (double)kva_fp8_e4m3_to_f32(r2[t][c]) * scale[c];
                        else if (tok)
                            want = (double)(int8_t)byte * ts_val[t];
                        else if (off)
                            want = ((double)(int8_t)byte - offset[c]) * scale[c];
                        else
                            want = (double)(int8_t)byte * scale[c];
                        const double got = out[(size_t)t * W + c];
                        /* A few float roundings (q*s - o*s): 4 ulp of the
                         * largest term. */
                        const double mag =
                            off ? fabs(offset[c] * scale[c]) + 128 * scale[c] : fabs(want);
                        const int ok = isnan(want) ? kva_test_nan_written(out, KVA_DTYPE_F32,
                                                                          (size_t)t * W + c)
                                                   : fabs(got - want) <= 5e-7 * mag;
                        bad += !ok;
                    }
                CHECK_MSG(bad == 0, "width %d mode %d simd %d: %zu bad", (int)W, m, simd, bad);
            }
            free(out);
        }
        free(store);
    }
}

/* A NaN stored in an fp8 cache (code 0x7f) reaches the outputs of the
 * queries that see it, on both backends, as in an unquantized cache: a NaN key
 * makes whole rows NaN, a NaN value only its channel. */
static void test_fp8_nan_propagates(void)
{
    kva_rng rng = {4242};
    const int32_t ql[2] = {1, 1}, sl[2] = {50, 50};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 2, ql, sl, 16, 2, 0);
    kva_context *ref = ctx_of(KVA_BACKEND_REF), *cpu = ctx_of(KVA_BACKEND_CPU);
    kva_cache_desc qd = {
        b.num_blocks,       16,          1, 32, 32, KVA_DTYPE_FP8_E4M3, KVA_LAYOUT_NHD,
        KVA_QUANT_FP8_E4M3, KVA_ATTN_MHA};
    kva_cache *qc = NULL;
    CHECK_OK(kva_cache_create(cpu, &qd, &qc));
    const int64_t n = (int64_t)b.num_blocks * 16;
    float *k = malloc(sizeof(float) * (size_t)n * 32), *v = malloc(sizeof(float) * (size_t)n * 32);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * 32, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * 32, &rng);
    for (int64_t i = 0; i < n; i++)
        slots[i] = i;
    /* Request 0's key 7: NaN in K channel 3 (its score is NaN: whole rows);
     * request 1's key 9: NaN in V channel 5 (that output channel only). */
    k[((int64_t)b.block_table[0] * 16 + 7) * 32 + 3] = NAN;
    v[((int64_t)b.block_table[b.stride] * 16 + 9) * 32 + 5] = NAN;
    CHECK_OK(kva_cache_write(cpu, qc, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 2, 1, 32, 32, KVA_DTYPE_F32);
    float out[2 * 2 * 32];
    /* be 0: ref; be 1: the CPU dispatcher; be 2 + i: CPU registry kernel i forced. */
    kva_test_kernel kern[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(kern);
    for (int be = 0; be < 2 + nk; be++) {
        if (be > 1 && !kern[be - 2].runs)
            continue;
        run(be ? cpu : ref, &pd, k, qc, NULL, be > 1 ? kern[be - 2].name : NULL,
            &(run_out){out, NULL}, 2 * 2 * 32, 0);
        int nan0 = 0, nan1 = 0;
        for (int i = 0; i < 2 * 32; i++) {
            /* Written NaNs: the poison (a NaN too) left in place fails. */
            nan0 += kva_test_nan_written(out, KVA_DTYPE_F32, (size_t)i);
            nan1 += kva_test_nan_written(out, KVA_DTYPE_F32, 2 * 32 + (size_t)i)
                        ? (i % 32 == 5 ? 1 : 100)
                    : isnan(out[2 * 32 + i]) ? 100
                                             : 0;
        }
        CHECK_MSG(nan0 == 2 * 32 && nan1 == 2, "backend %d: %d NaN in request 0, %d in request 1",
                  be, nan0, nan1);
    }
    free(k), free(v), free(slots);
    kva_cache_destroy(qc);
    kva_context_destroy(ref), kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

/* Every finite fp8 code, subnormals (|code| 1..7) and -0 included, in an fp8
 * cache read by every CPU kernel == ref over the same cache. Scales are
 * powers of 2, so x / s is the code's value and the write stores that code.
 * V (scale 1) and the keys of kv head 0 (scale 2^-8) hold every code; the
 * keys of kv head 1 (scale 2^-2) only magnitudes < 0x40, so that their
 * subnormals weigh in the scores while the softmax stays well conditioned.
 * D = Dv = 128 (the specialized copies) and D = 40, Dv = 24 (runtime shapes,
 * 8-byte row tails), both layouts, decode and prefill rows. */
static void test_fp8_all_codes(void)
{
    kva_rng rng = {777};
    const int32_t ql[3] = {1, 1, 19}, sl[3] = {75, 33, 60};
    const int32_t shapes[2][2] = {{128, 128}, {40, 24}};
    kva_context *ref = ctx_of(KVA_BACKEND_REF), *cpu = ctx_of(KVA_BACKEND_CPU);
    for (int sh = 0; sh < 2; sh++) {
        const int32_t D = shapes[sh][0], Dv = shapes[sh][1], Hkv = 2, H = 8;
        const kva_layout lay = sh ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 3, ql, sl, 16, 2, 0);
        const float sc[2] = {0x1p-8f, 0x1p-2f}, sv = 1.0f;
        const kva_quant_params qp = {sc, 2, NULL, 0, &sv, 1, NULL, 0};
        kva_cache_desc qd = {b.num_blocks,       16,          Hkv, D, Dv, KVA_DTYPE_FP8_E4M3, lay,
                             KVA_QUANT_FP8_E4M3, KVA_ATTN_MHA};
        kva_cache *qc = NULL;
        CHECK_OK(kva_cache_create_quant(cpu, &qd, &qp, &qc));
        const int64_t n = (int64_t)b.num_blocks * 16;
        float *k = malloc(sizeof(float) * (size_t)(n * Hkv * D));
        float *v = malloc(sizeof(float) * (size_t)(n * Hkv * Dv));
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            slots[i] = i;
            for (int32_t h = 0; h < Hkv; h++) {
                for (int32_t c = 0; c < D; c++) {
                    unsigned code = (unsigned)(i * 131 + h * 17 + c * 37) & 0xffu;
                    code = (code & 0x7fu) == 0x7fu ? code ^ 1u : code; /* no NaN */
                    code = h ? (code & 0x80u) | ((code & 0x7fu) % 0x40u) : code;
                    k[(i * Hkv + h) * D + c] = kva_fp8_e4m3_to_f32((uint8_t)code) * sc[h];
                }
                for (int32_t c = 0; c < Dv; c++) {
                    unsigned code = (unsigned)(i * 29 + h * 101 + c * 53 + 5) & 0xffu;
                    code = (code & 0x7fu) == 0x7fu ? code ^ 1u : code;
                    v[(i * Hkv + h) * Dv + c] = kva_fp8_e4m3_to_f32((uint8_t)code) * sv;
                }
            }
        }
        CHECK_OK(kva_cache_write(cpu, qc, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
        /* The write stored exactly the codes above. */
        int mism = 0;
        for (int64_t i = 0; i < n; i++)
            for (int32_t c = 0; c < D; c++)
                mism +=
                    (float)kva__quant_load(qc, 0, i / 16, i % 16, 1, c) != k[(i * Hkv + 1) * D + c];
        CHECK_MSG(mism == 0, "fp8 codes: %d keys not stored exactly", mism);

        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, KVA_DTYPE_F32);
        const size_t out_n = (size_t)b.T * H * Dv, lse_n = (size_t)b.T * H;
        float *q = malloc(sizeof(float) * (size_t)b.T * H * D);
        kva_test_fill(q, KVA_DTYPE_F32, (size_t)b.T * H * D, &rng, 1.0);
        run_out want = {malloc(out_n * 4), malloc(lse_n * 4)};
        run_out got = {malloc(out_n * 4), malloc(lse_n * 4)};
        run(ref, &pd, q, qc, NULL, NULL, &want, out_n, lse_n);
        const double atol = kva_test_atol(KVA_DTYPE_F32), rtol = kva_test_rtol(KVA_DTYPE_F32);
        kva_test_kernel kern[KVA_TEST_MAX_KERNELS];
        const int32_t nk = kva_test_cpu_kernels(kern);
        for (int32_t var = 0; var < nk; var++) {
            if (!kern[var].runs)
                continue;
            run(cpu, &pd, q, qc, NULL, kern[var].name, &got, out_n, lse_n);
            char label[80];
            snprintf(label, sizeof label, "fp8 all codes D%d/%d %s", D, Dv, kern[var].name);
            CHECK_MSG(
                kva_test_compare(label, got.out, want.out, KVA_DTYPE_F32, out_n, atol, rtol) == 0,
                "%s", label);
            CHECK(kva_test_compare_f32(label, got.lse, want.lse, lse_n, atol, rtol) == 0);
        }
        free(q), free(k), free(v), free(slots);
        free(want.out), free(want.lse), free(got.out), free(got.lse);
        kva_cache_destroy(qc);
        kva_test_batch_free(&b);
    }
    kva_context_destroy(ref), kva_context_destroy(cpu);
}

int main(void)
{
    RUN(test_converter);
    printf("attention over quantized caches vs unquantized values:\n");
    RUN(test_formats);
    RUN(test_prefill_no_cache);
    RUN(test_fp8_nan_propagates);
    RUN(test_fp8_all_codes);
    return kva_test_finish();
}
