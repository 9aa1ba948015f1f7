/*
 * test_cuda_indexer.c - the CUDA lightning indexer (kva_indexer_run) and
 * index-key caches in device memory, against the test's fp64 reference
 * (tests/indexer_util.h: same set and order except between logits within
 * float rounding of each other).
 *
 * Cases: DeepSeek's 64 heads of 128 over FP8_TOKEN keys (bf16 q), decodes,
 * a speculative decode, prefills with and without context, key chunks
 * crossed, K above pos + 1, K = 1, repeated keys (exact ties) and a NaN key
 * on f16 caches; the FP8_TOKEN bytes written on the device equal the test's
 * quantizer (after a swap to a host cache); read-back; bad input gets a
 * status and leaves outputs untouched; every run also captured in a CUDA
 * graph and replayed (same bits); the multi-pass path (a small per-pass
 * logits limit set by kva__cuda_context_indexer_test) and the mma.sync
 * logits kernel where the sm_90a one is the default, the top-K's
 * whole-row passes (forced, and for a tie bin past its buffer); the FP8-q mode
 * (index_q_quant, e4m3 products on sm_90a: the warp-specialized kernel,
 * on 2 CTAs too, and the other wgmma kernel forced). KVA_TEST_QUICK=1 runs
 * the small cases only. Exits 77 without a GPU.
 */
#include "../indexer_util.h"
#include "cuda_util.h"
#include "../../src/attn/cuda/cuda_backend.h" /* kva__cuda_context_indexer_test */

#ifdef KVA_HAVE_CUDA

/* A device cache holding the case's keys, written on the device. */
static kva_cache *make_dev_cache(kva_context *gpu, const idx_case *c, const idx_data *x)
{
    kva_cache_desc cd = idx_cache_desc(c, x);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &cache));
    if (!cache)
        return NULL;
    void *dk = dev_from(x->keys, (size_t)x->total * c->D * sizeof(float));
    void *ds = dev_from(x->slots, (size_t)x->total * sizeof(int64_t));
    CHECK_OK(kva_cache_write(gpu, cache, x->total, dk, 0, NULL, 0, KVA_DTYPE_F32, ds));
    CUDA_OK(cudaDeviceSynchronize());
    cudaFree(dk);
    cudaFree(ds);
    return cache;
}

/* The run captured in a CUDA graph (capture fails on a host sync) and
 * replayed into poisoned outputs: the bits of the eager run (ind, len). */
static void check_graph(kva_context *gpu, const kva_plan *plan, const idx_case *c,
                        const idx_data *x, const void *dq, const void *dw, const kva_cache *cache,
                        int32_t *di, int32_t *dl, int64_t stride, const int32_t *ind,
                        const int32_t *len)
{
    const size_t ni = (size_t)x->T * stride;
    cu_graph g;
    graph_begin(gpu, &g);
    CHECK_OK(kva_indexer_run(gpu, plan, dq, dw, cache, di, stride, dl));
    graph_end(gpu, &g);
    dev_fill(di, 0x5a, ni * 4);
    dev_fill(dl, 0xff, (size_t)x->T * 4);
    graph_replay(&g);
    int32_t *ind2 = malloc(ni * 4), *len2 = malloc((size_t)x->T * 4);
    to_host(ind2, di, ni * 4);
    to_host(len2, dl, (size_t)x->T * 4);
    CHECK_MSG(memcmp(ind2, ind, ni * 4) == 0 && memcmp(len2, len, (size_t)x->T * 4) == 0,
              "indexer Hi %d K %d: graph replay differs from the eager run", (int)c->Hi, (int)c->K);
    free(ind2), free(len2);
    graph_free(&g);
}

/* Runs case c against the reference; multipass: the plan must hold fewer
 * tokens' logits than the whole batch (kva__cuda_context_indexer_test). */
static void run_case(kva_context *gpu, const idx_case *c, int multipass)
{
    idx_data x;
    idx_build(c, &x);
    kva_cache *cache = make_dev_cache(gpu, c, &x);
    kva_plan_desc pd = idx_plan_desc(c, &x);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &plan));
    if (plan && multipass) {
        /* A one-pass plan's workspace: every token's logits, then for the
         * FP8-q mode q's codes (2 bytes each at most) and the scaled
         * weights, 256-byte aligned (indexer.cu). */
        size_t all = (size_t)x.T * plan->info.max_seq_len * sizeof(float);
        if (c->qfp8)
            all = ((all + 255) & ~(size_t)255) +
                  (((size_t)x.T * c->Hi * c->D * 2 + 255) & ~(size_t)255) +
                  (size_t)x.T * c->Hi * sizeof(float);
        CHECK_MSG(plan->workspace_bytes < all,
                  "multi-pass plan: workspace %zu bytes holds every token's logits",
                  plan->workspace_bytes);
    }
    if (cache && plan) {
        const int64_t stride = c->K + 1;
        const size_t ni = (size_t)x.T * stride, qb = (size_t)x.T * c->Hi * c->D * 2;
        void *dq = dev_from(x.q, qb), *dw = dev_from(x.w, (size_t)x.T * c->Hi * sizeof(float));
        /* 0x5a5a5a5a in every entry: -1 padding must be written. */
        int32_t *di = dev_poisoned(ni * 4), *dl = dev_poisoned((size_t)x.T * 4);
        dev_fill(di, 0x5a, ni * 4);
        CHECK_OK(kva_indexer_run(gpu, plan, dq, dw, cache, di, stride, dl));
        int32_t *ind = malloc(ni * 4), *len = malloc((size_t)x.T * 4);
        to_host(ind, di, ni * 4);
        to_host(len, dl, (size_t)x.T * 4);
        int pad = 0;
        for (int32_t t = 0; t < x.T; t++)
            pad += ind[t * stride + c->K] != 0x5a5a5a5a; /* past K: untouched */
        char label[96];
        snprintf(label, sizeof label, "cuda Hi %d D %d K %d fp8 %d %s%s", (int)c->Hi, (int)c->D,
                 (int)c->K, c->fp8, kva_dtype_name(c->dt), c->qfp8 ? " fp8 q" : "");
        const int bad = idx_check(label, c, &x, ind, stride, len, 0);
        CHECK_MSG(pad == 0 && bad == 0, "%s: %d of %d rows differ, %d pads written", label, bad,
                  (int)x.T, pad);
        check_graph(gpu, plan, c, &x, dq, dw, cache, di, dl, stride, ind, len);
        free(ind);
        free(len);
        cudaFree(dq), cudaFree(dw), cudaFree(di), cudaFree(dl);
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    idx_free(&x);
}

static void test_grid(void)
{
    kva_context *gpu = idx_ctx(KVA_BACKEND_CUDA, 1);
    const int quick = getenv("KVA_TEST_QUICK") != NULL;
    /* DeepSeek's shape, FP8 keys, a mixed batch whose prefill crosses a chunk. */
    idx_case a =
        idx_case_of(64, 128, 64, 128, KVA_DTYPE_BF16, 1, 4, (const int32_t[]){1, 3, 24, 17},
                    (const int32_t[]){3000, 700, 2100, 17}, 41);
    a.ties = 1;
    run_case(gpu, &a, 0);
    /* f16 q and cache, 16 heads of 64, K above most rows, ties and a NaN key. */
    idx_case b = idx_case_of(16, 64, 16, 200, KVA_DTYPE_F16, 0, 3, (const int32_t[]){6, 1, 2},
                             (const int32_t[]){300, 1, 150}, 42);
    b.ties = 1;
    b.nan_key = 1;
    run_case(gpu, &b, 0);
    /* K = 1, 48 heads (a partial head group), bf16 cache. */
    idx_case c = idx_case_of(48, 32, 7, 1, KVA_DTYPE_BF16, 0, 2, (const int32_t[]){9, 1},
                             (const int32_t[]){90, 40}, 43);
    run_case(gpu, &c, 0);
    /* FP8 blocks of 5 rows: B (D + 4) bytes, not a multiple of 16. */
    idx_case f = idx_case_of(16, 48, 5, 10, KVA_DTYPE_BF16, 1, 2, (const int32_t[]){4, 1},
                             (const int32_t[]){60, 33}, 46);
    run_case(gpu, &f, 0);
    if (!quick) {
        /* The shape, smaller: top-2048 of 8k keys, 128 heads. */
        idx_case d = idx_case_of(64, 128, 64, 2048, KVA_DTYPE_BF16, 1, 1, (const int32_t[]){40},
                                 (const int32_t[]){8192}, 44);
        run_case(gpu, &d, 0);
        idx_case e = idx_case_of(128, 128, 32, 4096, KVA_DTYPE_F16, 1, 2, (const int32_t[]){1, 8},
                                 (const int32_t[]){5000, 4100}, 45);
        e.ties = 1;
        run_case(gpu, &e, 0);
    }
    /* The multi-pass path (plans whose logits exceed the workspace limit):
     * at most 1000 logits per pass, so 4 tokens (one tile) per pass here. */
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 1000, 0));
    run_case(gpu, &a, 1);
    run_case(gpu, &b, 1);
    /* The mma.sync logits kernel on DeepSeek's shape (where the sm_90a
     * kernel takes it by default), also over passes. */
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 1));
    run_case(gpu, &a, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 1000, 1));
    run_case(gpu, &a, 1);
    /* Every key of request 0 equal (all its logits tie at the K-th: the
     * top-K ranks the equal keys by position): mma.sync over passes, then
     * the default kernel in one pass. */
    idx_case s = idx_case_of(64, 128, 64, 100, KVA_DTYPE_BF16, 1, 2, (const int32_t[]){5, 2},
                             (const int32_t[]){700, 300}, 47);
    s.same = 1;
    run_case(gpu, &s, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 0));
    run_case(gpu, &s, 0);
    /* The top-K reading the whole row in every radix pass (flag 2), and by
     * default a tie bin larger than its shared-memory buffer (5000 equal
     * keys: the whole-row passes). */
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 2));
    run_case(gpu, &a, 0);
    run_case(gpu, &s, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 0));
    idx_case s2 = s;
    s2.R = 1;
    s2.q_len[0] = 3;
    s2.seq_len[0] = 5000;
    s2.seed = 48;
    run_case(gpu, &s2, 0);
    CHECK_STATUS(kva__cuda_context_indexer_test(gpu, -1, 0), KVA_STATUS_INVALID_ARGUMENT);
    kva_context_destroy(gpu);
}

/*
 * index_q_quant = FP8_TOKEN against the test's quantized fp64 logits. On
 * sm_90a, DeepSeek's shape over FP8_TOKEN keys runs e4m3 x e4m3 wgmma,
 * whose accumulation keeps fewer bits than fp32: those cases allow swaps
 * within 2^-10 M (indexer_util.h's M); the 16-bit kernels (bf16 keys, the
 * mma.sync kernel forced) multiply the codes' exact values and keep the
 * fp32 bound. Also over passes, with f16 q and a NaN key, and graph replay
 * (run_case). Prints the share of the bf16-q top K the FP8-q top K keeps.
 */
static void test_fp8_q(void)
{
    kva_context *gpu = idx_ctx(KVA_BACKEND_CUDA, 1);
    const double tc = ldexp(1.0, -10);
    idx_case a =
        idx_case_of(64, 128, 64, 128, KVA_DTYPE_BF16, 1, 4, (const int32_t[]){1, 3, 24, 17},
                    (const int32_t[]){3000, 700, 2100, 17}, 71);
    a.qfp8 = 1;
    a.tol_rel = tc;
    a.ties = 1;
    run_case(gpu, &a, 0);
    idx_data x;
    idx_build(&a, &x);
    printf("  fp8 q: %.1f%% of the bf16-q top-%d kept (random data, %d tokens)\n",
           100.0 * idx_fp8q_overlap(&a, &x), (int)a.K, (int)x.T);
    idx_free(&x);
    idx_case b = a; /* bf16 keys: the bf16 wgmma kernel on the codes' values */
    b.fp8 = 0;
    b.tol_rel = 0.0;
    b.seed = 72;
    run_case(gpu, &b, 0);
    /* not DeepSeek's shape: mma.sync, f16 q, a NaN key */
    idx_case f = idx_case_of(16, 64, 16, 20, KVA_DTYPE_F16, 1, 2, (const int32_t[]){6, 1},
                             (const int32_t[]){300, 90}, 73);
    f.qfp8 = 1;
    f.nan_key = 1;
    run_case(gpu, &f, 0);
    if (!getenv("KVA_TEST_QUICK")) {
        /* top-2048 of 8k keys, f16 q */
        idx_case d = idx_case_of(64, 128, 64, 2048, KVA_DTYPE_F16, 1, 1, (const int32_t[]){24},
                                 (const int32_t[]){8192}, 74);
        d.qfp8 = 1;
        d.tol_rel = tc;
        run_case(gpu, &d, 0);
    }
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 1000, 0)); /* passes */
    run_case(gpu, &a, 1);
    /* The warp-specialized kernel (sm_90a, B a multiple of 64) on 2 CTAs:
     * each takes many tiles (both q buffers, the key ring across tiles);
     * then B 128 with a NaN key; then the other wgmma kernel forced. */
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 8));
    run_case(gpu, &a, 0);
    idx_case n = a;
    n.B = 128;
    n.nan_key = 1;
    n.seed = 75;
    run_case(gpu, &n, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 4));
    run_case(gpu, &a, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 1)); /* mma.sync on the codes' values */
    a.tol_rel = 0.0;
    run_case(gpu, &a, 0);
    CHECK_OK(kva__cuda_context_indexer_test(gpu, 0, 0));
    kva_context_destroy(gpu);
}

/* FP8_TOKEN bytes written on the device, swapped to a host cache, equal
 * the test's quantizer; kva_cache_read gives code * scale. */
static void test_cache_bytes(void)
{
    kva_context *gpu = idx_ctx(KVA_BACKEND_CUDA, 1), *cpu = idx_ctx(KVA_BACKEND_CPU, 1);
    idx_case c = idx_case_of(16, 128, 16, 8, KVA_DTYPE_BF16, 1, 2, (const int32_t[]){1, 1},
                             (const int32_t[]){40, 33}, 51);
    idx_data x;
    idx_build(&c, &x);
    for (int32_t i = 0; i < c.D; i++) { /* a zero row: scale FLT_MIN */
        x.keys[(size_t)5 * c.D + i] = 0.0f;
        x.keys[(size_t)6 * c.D + i] *= 1000.0f;
    }
    for (int32_t t = 5; t <= 6; t++) { /* the values those rows now hold */
        uint8_t codes[KVA_MAX_HEAD_DIM];
        const float s = idx_quant_row(x.keys + (size_t)t * c.D, c.D, codes);
        for (int32_t i = 0; i < c.D; i++)
            x.kval[(size_t)t * c.D + i] = idx_e4m3_value(codes[i]) * (double)s;
    }
    kva_cache *dev = make_dev_cache(gpu, &c, &x);
    kva_cache_desc cd = idx_cache_desc(&c, &x);
    kva_cache *host = NULL;
    CHECK_OK(kva_cache_create(cpu, &cd, &host));
    if (dev && host) {
        int32_t *pairs = malloc((size_t)x.nb * 2 * sizeof *pairs);
        for (int32_t b = 0; b < x.nb; b++)
            pairs[2 * b] = pairs[2 * b + 1] = b;
        CHECK_OK(kva_cache_swap_blocks(gpu, dev, host, pairs, x.nb));
        CUDA_OK(cudaDeviceSynchronize());
        free(pairs);
        void *hk = NULL;
        kva_cache_data(host, &hk, NULL);
        const unsigned char *bytes = hk;
        int bad = 0;
        for (int32_t t = 0; t < x.total; t++) {
            uint8_t want[KVA_MAX_HEAD_DIM];
            const float s = idx_quant_row(x.keys + (size_t)t * c.D, c.D, want);
            const int64_t b = x.slots[t] / c.B, o = x.slots[t] % c.B;
            const unsigned char *blk = bytes + b * (int64_t)c.B * (c.D + 4);
            float got;
            memcpy(&got, blk + (int64_t)c.B * c.D + o * 4, 4);
            bad += memcmp(blk + o * c.D, want, (size_t)c.D) != 0 || memcmp(&got, &s, 4) != 0;
        }
        CHECK_MSG(bad == 0, "%d device-written FP8_TOKEN rows differ from the quantizer", bad);
        /* Read-back on the device. */
        float *dback = dev_poisoned((size_t)x.total * c.D * 4);
        void *ds = dev_from(x.slots, (size_t)x.total * 8);
        CHECK_OK(kva_cache_read(gpu, dev, x.total, ds, dback, 0, NULL, 0, KVA_DTYPE_F32));
        float *back = malloc((size_t)x.total * c.D * 4);
        to_host(back, dback, (size_t)x.total * c.D * 4);
        bad = 0;
        for (size_t i = 0; i < (size_t)x.total * c.D; i++)
            bad += back[i] != (float)x.kval[i];
        CHECK_MSG(bad == 0, "kva_cache_read on CUDA: %d values differ from code * scale", bad);
        free(back);
        cudaFree(dback);
        cudaFree(ds);
    }
    kva_cache_destroy(host);
    kva_cache_destroy(dev);
    idx_free(&x);
    kva_context_destroy(cpu);
    kva_context_destroy(gpu);
}

/* Shapes the CUDA indexer refuses, and bad runs: a status, nothing written. */
static void test_bad_input(void)
{
    kva_context *gpu = idx_ctx(KVA_BACKEND_CUDA, 1);
    idx_case c = idx_case_of(16, 64, 16, 8, KVA_DTYPE_BF16, 1, 1, (const int32_t[]){3},
                             (const int32_t[]){30}, 61);
    idx_data x;
    idx_build(&c, &x);
    kva_plan_desc pd = idx_plan_desc(&c, &x);
    kva_plan *plan = NULL;
    kva_plan_desc p = pd;
    p.q_dtype = KVA_DTYPE_F32;
    CHECK_STATUS(kva_plan_create(gpu, &p, &plan), KVA_STATUS_UNSUPPORTED);
    p = pd;
    p.num_heads = 8;
    CHECK_STATUS(kva_plan_create(gpu, &p, &plan), KVA_STATUS_UNSUPPORTED);
    p = pd;
    p.sparse_topk = 5000;
    CHECK_STATUS(kva_plan_create(gpu, &p, &plan), KVA_STATUS_UNSUPPORTED);
    p = pd;
    p.index_q_quant = KVA_QUANT_FP8_E4M3;
    CHECK_STATUS(kva_plan_create(gpu, &p, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(plan == NULL);
    kva_cache *cache = make_dev_cache(gpu, &c, &x);
    CHECK_OK(kva_plan_create(gpu, &pd, &plan));
    if (cache && plan) {
        const size_t qb = (size_t)x.T * c.Hi * c.D * 2;
        char *dq = dev_poisoned(qb + 16);
        CUDA_OK(cudaMemcpy(dq, x.q, qb, cudaMemcpyHostToDevice));
        void *dw = dev_from(x.w, (size_t)x.T * c.Hi * 4);
        int32_t *di = dev_poisoned((size_t)x.T * c.K * 4);
        CHECK_STATUS(kva_indexer_run(gpu, plan, dq + 2, dw, cache, di, 0, NULL),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(kva_indexer_run(gpu, plan, dq, dw, cache, di, 3, NULL),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK(dev_untouched(di));
        float *dk = dev_from(x.keys, (size_t)c.D * 4);
        void *ds = dev_from(x.slots, 8);
        CHECK_STATUS(kva_cache_write(gpu, cache, 1, dk, 0, dk, 0, KVA_DTYPE_F32, ds),
                     KVA_STATUS_INVALID_ARGUMENT);
        cudaFree(dq), cudaFree(dw), cudaFree(di), cudaFree(dk), cudaFree(ds);
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    idx_free(&x);
    kva_context_destroy(gpu);
}
#endif

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_bad_input);
    RUN(test_cache_bytes);
    RUN(test_grid);
    RUN(test_fp8_q);
#endif
    return kva_test_finish();
}
