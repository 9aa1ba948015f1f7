/*
 * test_cuda_quant_prefill.c - prefill and chunked prefill over quantized
 * caches on the tensor-core kernel (src/attn/cuda/prefill_mma_quant.h):
 *   1. attention over the device cache equals the reference backend over the
 *      same host cache (= attention over the dequantized cache), every
 *      format (INT8_CHANNEL, INT8_TOKEN_K, INT8_TOKEN_K_V16 f16/bf16,
 *      FP8_E4M3) x f16/bf16 q x D 64/128/256 x causal/none x window x
 *      soft-cap x ALiBi x sinks x LSE x GQA 1..8 x NHD/HND x block sizes
 *      1, 3, 7, 16, 32, 64, per-channel / per-head / per-tensor scales,
 *      over fresh prefills, chunked prefills after
 *      cached context, and mixed batches of decodes, speculative decodes and
 *      prefills (decode items on decode_mma_quant.cu, prefill tiles here);
 *      every case checks that the tiles do run on the tensor-core kernel;
 *      outputs poisoned with NaN, unread cache slots 0xff and their token
 *      scales NaN;
 *   2. Q'' range: q scaled by 1e7 (bf16: |q s| far above the f16 maximum
 *      65504, also for the per-token formats whose Q'' is q itself) and by
 *      1e-6 (below the f16 normal range), the softmax scale scaled back;
 *   3. the CUDA-core paths still agree: the prefill tiles on attn_quant.cu
 *      (q not 16-byte aligned, so the tensor-core kernel cannot take them)
 *      and the prefills as work items (prefill_items forced); a forced
 *      wgmma prefill (no quantized K/V path) is rejected with a status;
 *   4. a kernel-level argument check (misaligned q) returns a status.
 * Tolerances: run_case. KVA_TEST_QUICK=1 runs a subset. Exits 77 without a
 * GPU.
 */
#include "cuda_quant_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"
#include "../../src/attn/cuda/prefill_mma_quant.h"

#ifdef KVA_HAVE_CUDA

typedef struct qcfg {
    int f; /* index into fmts */
    int32_t H, Hkv, D, B;
    kva_dtype qdt;
    kva_layout layout;
    int32_t causal, window;
    float softcap;
    int alibi, sinks, lse, gran;
    int kind; /* 0 fresh prefills, 1 chunked prefills after cached context, 2 mixed
                 decodes + prefills, 3 random batch */
    int path; /* 0: the tensor-core prefill; 1: the tiles on CUDA cores (q not 16-byte
                 aligned); 2: prefill_items forced (no tiles) */
    int qmag; /* 0: unit q; 1: q * 1e7 (bf16 only); 2: q * 1e-6 (softmax scale inverse) */
} qcfg;

static void print_cfg(const qcfg *c)
{
    fprintf(stderr,
            "  case %s/%s H=%d Hkv=%d D=%d B=%d q %s %s causal=%d window=%d softcap=%g alibi=%d "
            "sinks=%d lse=%d gran=%d kind=%d path=%d qmag=%d\n",
            kva_quant_name(fmts[c->f]), kva_dtype_name(fmt_dtype(c->f)), c->H, c->Hkv, c->D, c->B,
            kva_dtype_name(c->qdt), c->layout == KVA_LAYOUT_HND ? "HND" : "NHD", c->causal,
            c->window, (double)c->softcap, c->alibi, c->sinks, c->lse, c->gran, c->kind, c->path,
            c->qmag);
}

static void make_batch(const qcfg *c, kva_rng *rng, kva_test_batch *b)
{
    if (c->kind == 0) {
        const int32_t ql[3] = {257, 64, 130}, sl[3] = {257, 64, 130};
        kva_test_batch_init(b, rng, 3, ql, sl, c->B, 2, 0);
    } else if (c->kind == 1) {
        const int32_t ql[3] = {200, 129, 33}, sl[3] = {900, 129 + 417, 33 + 64};
        kva_test_batch_init(b, rng, 3, ql, sl, c->B, 2, 1);
    } else if (c->kind == 2) {
        const int32_t ql[7] = {1, 200, 3, 77, 1, 130, 2}, sl[7] = {500, 200, 900, 300, 37, 400, 65};
        kva_test_batch_init(b, rng, 7, ql, sl, c->B, 2, 1);
    } else {
        kva_test_batch_random(b, rng, 6, c->B, 300, 0xf, 1);
    }
}

/* 1-3. One case: device vs reference over the same quantized bytes. */
static int run_case(const qcfg *c, uint64_t seed)
{
    kva_rng rng = {seed};
    kva_test_batch b;
    make_batch(c, &rng, &b);
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    if (c->path == 2)
        CHECK_OK(kva__context_force_kernel(gpu, "prefill_items"));
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, T = b.T;
    kva_cache_desc cd = {b.num_blocks, c->B, Hkv, D, D, fmt_dtype(c->f), c->layout, fmts[c->f]};
    float *buf = malloc(sizeof(float) * 4 * Hkv * D);
    kva_quant_params p;
    make_params(cd.quant, Hkv, D, D, c->gran, &rng, buf, &p);
    kva_cache *hc = NULL, *dc = NULL;
    CHECK_OK(kva_cache_create_quant(href, &cd, &p, &hc));
    CHECK_OK(kva_cache_create_quant(gpu, &cd, &p, &dc));
    int ok = 0;
    if (hc && dc) {
        const int32_t n = b.num_blocks * c->B;
        float *k = malloc(sizeof(float) * (size_t)n * Hkv * D);
        float *v = malloc(sizeof(float) * (size_t)n * Hkv * D);
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
        kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
        for (int32_t i = 0; i < n; i++)
            slots[i] = i;
        CHECK_OK(kva_cache_write(href, hc, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
        poison_unread(hc, &b);
        upload_quant(dc, hc);
        free(k), free(v), free(slots);

        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, c->qdt);
        pd.causal = c->causal;
        pd.window_left = c->window;
        pd.softcap = c->softcap;
        const double qmul = c->qmag == 1 ? 1e7 : c->qmag == 2 ? 1e-6 : 1.0;
        pd.scale = (float)(1.0 / sqrt((double)D) / qmul);
        float *slopes = malloc(sizeof(float) * (size_t)H), *sinks = malloc(sizeof(float) * H);
        for (int32_t h = 0; h < H; h++) {
            slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
            sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
        }
        pd.alibi_slopes = c->alibi ? slopes : NULL;
        kva_plan *pr = NULL, *pg = NULL;
        CHECK_OK(kva_plan_create(href, &pd, &pr));
        CHECK_OK(kva_plan_create(gpu, &pd, &pg));
        const size_t es = kva_dtype_size(c->qdt);
        const size_t nq = (size_t)T * H * D, nl = (size_t)T * H;
        void *q = malloc(nq * es), *want = malloc(nq * es), *got = malloc(nq * es);
        float *qf = malloc(nq * sizeof(float)), *lw = malloc(nl * 4), *lg = malloc(nl * 4);
        kva_test_fill_uniform(qf, KVA_DTYPE_F32, nq, &rng);
        for (size_t i = 0; i < nq; i++)
            qf[i] = (float)(qf[i] * qmul);
        kva_convert(qf, KVA_DTYPE_F32, q, c->qdt, nq);
        /* path 1: q one element past a 16-byte boundary. */
        char *dq_base = NULL;
        if (c->path == 1) {
            CUDA_OK(cudaMalloc((void **)&dq_base, nq * es + 16));
            CUDA_OK(cudaMemcpy(dq_base + es, q, nq * es, cudaMemcpyHostToDevice));
        } else {
            dq_base = dev_from(q, nq * es);
        }
        void *dq = dq_base + (c->path == 1 ? es : 0), *dout = dev_poisoned(nq * es);
        float *dl = c->lse ? dev_poisoned(nl * 4) : NULL;
        float *ds = c->sinks ? dev_from(sinks, (size_t)H * 4) : NULL;
        kva_test_poison(want, c->qdt, nq);
        kva_test_poison(got, c->qdt, nq);
        kva_test_poison(lw, KVA_DTYPE_F32, nl);
        kva_test_poison(lg, KVA_DTYPE_F32, nl);
        const int tiles = pg ? ((const kva__cuda_plan *)pg->device)->num_ptiles : 0;
        /* The prefills must take the path under test. */
        if (pg && c->path == 2) {
            CHECK_MSG(tiles == 0, "prefill_items forced but the plan has %d tiles", tiles);
        } else if (pg) {
            if (c->kind != 3) /* a random batch may hold no long prefill */
                CHECK_MSG(tiles > 0, "no prefill tiles in the plan");
            const int tc = kva__cuda_qprefill_usable(gpu, pg, dq, dc);
            CHECK_MSG(tc == (c->path == 0), "tensor-core path usable = %d", tc);
        }
        CHECK_OK(
            kva_attention_run(href, pr, q, hc, c->sinks ? sinks : NULL, want, c->lse ? lw : NULL));
        CHECK_OK(kva_attention_run(gpu, pg, dq, dc, ds, dout, dl));
        to_host(got, dout, nq * es);
        /* out: the q dtype's tolerance plus P's rounding (f16: 2^-11; bf16
         * P with the bf16 V of INT8_TOKEN_K_V16: 2^-8) times max|v| <= 2
         * (uniform fill plus the quantization step), as the tensor-core
         * decode (test_cuda_quant.c). lse: scores are exact to ~2^-22
         * (docs/quant.md), so lse keeps the decode test's tolerance, in units
         * of the scores (qmag only rescales q and the softmax scale). */
        const double pu =
            cd.quant == KVA_QUANT_INT8_TOKEN_K_V16 && c->qdt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        const double atol = kva_test_atol(c->qdt) + pu * 2.0;
        size_t bad = kva_test_compare("out", got, want, c->qdt, nq, atol, kva_test_rtol(c->qdt));
        if (c->lse) {
            to_host(lg, dl, nl * 4);
            bad += kva_test_compare_f32("lse", lg, lw, nl, 1e-4, 2e-5);
        }
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d, %d prefill tiles)", bad, (int)T, tiles);
        if (bad)
            print_cfg(c);
        ok = bad == 0;
        kva_plan_destroy(pr);
        kva_plan_destroy(pg);
        cudaFree(dq_base), cudaFree(dout), cudaFree(dl), cudaFree(ds);
        free(q), free(want), free(got), free(qf), free(lw), free(lg), free(slopes), free(sinks);
    }
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    free(buf);
    kva_context_destroy(href);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
    return ok;
}

/* 1. Random cases over the whole grid of options. */
static void test_grid(void)
{
    static const int32_t heads[][2] = {{8, 2}, {16, 2}, {4, 4}, {12, 4}, {8, 1}, {6, 3}};
    static const int32_t dims[] = {128, 64, 256};
    static const int32_t bsz[] = {16, 1, 3, 64, 7, 32};
    static const int32_t windows[] = {-1, -1, 0, 7, 100};
    kva_rng rng = {2026};
    int failed = 0;
    const int n = quick() ? 2 * NFMT : 16 * NFMT;
    for (int i = 0; i < n && failed < 6; i++) {
        qcfg c;
        memset(&c, 0, sizeof c);
        c.f = i % NFMT;
        const int hi = kva_rng_int(&rng, 0, 5);
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.D = dims[(i / NFMT) % 3];
        c.B = bsz[kva_rng_int(&rng, 0, 5)];
        c.qdt = (i / NFMT) % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        if (fmts[c.f] == KVA_QUANT_INT8_TOKEN_K_V16) /* V's dtype is q's */
            c.qdt = fmt_dtype(c.f);
        c.layout = kva_rng_int(&rng, 0, 1) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = kva_rng_int(&rng, 0, 4) != 0;
        c.window = windows[kva_rng_int(&rng, 0, 4)];
        c.softcap = kva_rng_int(&rng, 0, 3) == 0 ? 5.0f : 0.0f;
        c.alibi = kva_rng_int(&rng, 0, 3) == 0;
        c.sinks = kva_rng_int(&rng, 0, 2) == 0;
        c.lse = kva_rng_int(&rng, 0, 3) != 0;
        c.gran = kva_rng_int(&rng, 0, 2);
        c.kind = (i / 3) % 4;
        if (!run_case(&c, 5000 + (uint64_t)i))
            failed++;
    }
}

/* 2. Q'' range: q far above and far below the f16 range. */
static void test_q_range(void)
{
    int failed = 0;
    for (int i = 0; i < 2 * NFMT && failed < 4; i++) {
        qcfg c;
        memset(&c, 0, sizeof c);
        c.f = i % NFMT;
        c.H = 8, c.Hkv = 2, c.D = 128, c.B = 16;
        c.qmag = 1 + i / NFMT;
        /* 1e7 needs bf16 q (f16 tops out at 65504); V16 with f16 V then takes 1e-6. */
        c.qdt = c.qmag == 1 ? KVA_DTYPE_BF16 : KVA_DTYPE_F16;
        if (fmts[c.f] == KVA_QUANT_INT8_TOKEN_K_V16) {
            c.qdt = fmt_dtype(c.f);
            c.qmag = c.qdt == KVA_DTYPE_BF16 ? 1 : 2;
        }
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = 1, c.window = -1, c.lse = 1, c.sinks = i % 2;
        c.gran = i % 3;
        c.kind = 1;
        if (!run_case(&c, 700 + (uint64_t)i))
            failed++;
    }
}

/* 3. The CUDA-core paths over the same cases; a forced wgmma prefill refused. */
static void test_cuda_core_and_errors(void)
{
    for (int f = 0; f < NFMT; f++)
        for (int path = 1; path <= 2; path++) {
            qcfg c;
            memset(&c, 0, sizeof c);
            c.f = f;
            c.H = 8, c.Hkv = 2, c.D = 64, c.B = 16;
            c.qdt = fmts[f] == KVA_QUANT_INT8_TOKEN_K_V16 ? fmt_dtype(f) : KVA_DTYPE_BF16;
            c.causal = 1, c.window = -1, c.lse = 1, c.kind = 2, c.path = path;
            run_case(&c, 40 + (uint64_t)f);
            if (quick() && f > 0)
                break;
        }
    /* A wgmma prefill has no quantized K/V path: the run fails, out untouched. */
    kva_context *gpu = make_ctx(KVA_BACKEND_CUDA);
    if (kva__context_force_kernel(gpu, "prefill_wgmma_sm90") == KVA_STATUS_OK) {
        const int32_t ql[2] = {200, 1}, sl[2] = {200, 50};
        kva_rng rng = {77};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 2, ql, sl, 16, 2, 0);
        kva_cache_desc cd = {b.num_blocks,          16, 2, 128, 128, KVA_DTYPE_I8, KVA_LAYOUT_NHD,
                             KVA_QUANT_INT8_TOKEN_K};
        static float buf[4 * 2 * 128];
        kva_quant_params p;
        make_params(cd.quant, 2, 128, 128, 1, &rng, buf, &p);
        kva_cache *dc = NULL;
        CHECK_OK(kva_cache_create_quant(gpu, &cd, &p, &dc));
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 128, 128, KVA_DTYPE_BF16);
        kva_plan *pg = NULL;
        CHECK_OK(kva_plan_create(gpu, &pd, &pg));
        const size_t nq = (size_t)b.T * 8 * 128 * 2;
        void *dq = dev_poisoned(nq), *dout = dev_poisoned(nq);
        if (pg && dc) {
            CHECK_STATUS(kva_attention_run(gpu, pg, dq, dc, NULL, dout, NULL),
                         KVA_STATUS_UNSUPPORTED);
            CHECK_ERROR_MENTIONS("prefill_wgmma_sm90");
        }
        CHECK(dev_untouched(dout));
        kva_plan_destroy(pg);
        kva_cache_destroy(dc);
        cudaFree(dq), cudaFree(dout);
        kva_test_batch_free(&b);
    }
    kva_context_destroy(gpu);
    /* 4. Kernel-level checks: q not 16-byte aligned; an uncovered shape. Nothing is launched
     * (grid_tiles > 0, pointers never dereferenced on the host). */
    static _Alignas(16) float dummy[64];
    int32_t one = 1;
    kva__cuda_qprefill_args qa;
    memset(&qa, 0, sizeof qa);
    qa.p.q = (const char *)dummy + 2;
    qa.p.k = qa.p.v = dummy;
    qa.p.out = dummy;
    qa.p.query_start_loc = qa.p.seq_lens = qa.p.block_table = qa.p.tiles = qa.p.num_tiles = &one;
    qa.p.grid_tiles = 1;
    qa.p.block_size = 16, qa.p.num_heads = 8, qa.p.num_kv_heads = 2;
    qa.p.head_dim = qa.p.head_dim_v = 128;
    qa.p.dtype = KVA_DTYPE_BF16;
    qa.p.layout = KVA_LAYOUT_NHD;
    qa.quant = KVA_QUANT_INT8_CHANNEL;
    qa.ks = qa.ko = qa.vs = qa.vo = dummy;
    CHECK_STATUS(kva__cuda_qprefill_launch(&qa, NULL), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("a->q");
    qa.p.q = dummy;
    qa.p.head_dim = qa.p.head_dim_v = 96;
    CHECK_STATUS(kva__cuda_qprefill_launch(&qa, NULL), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("D = 96");
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_cuda_core_and_errors);
    RUN(test_q_range);
    RUN(test_grid);
#endif
    return kva_test_finish();
}
