/*
 * test_cuda_qmag.c - CUDA results over every cache format do not depend on
 * the magnitude of q (issue #22: the quantized tensor-core decode lost q * s
 * to f16 subnormals): the q-magnitude sweep of qmag_sweep.h (q from ~1e-6 to
 * ~1e3, the softmax scale keeping the logits O(1); decode items of q_len 1-4
 * and prefill items) against the reference backend over the same cache
 * bytes, in three modes (kva__context_force_kernel): the default kernels
 * (tensor-core decode and prefill), prefills as work items of the
 * tensor-core decode kernel (prefill_items), and everything on CUDA cores
 * (decode_simt + prefill_items). KVA_TEST_QUICK=1 runs
 * three magnitudes (2^-20, 1, 2^10). Exits 77 without a GPU.
 */
#include "cuda_quant_util.h"

#ifdef KVA_HAVE_CUDA
#include "qmag_sweep.h"
#include "../../src/attn/cuda/cuda_backend.h"

typedef struct cuda_be {
    kva_context *ctx;
    kva_cache *dc; /* the device copy of the case's host cache */
} cuda_be;

static void cuda_prepare(void *ud, const kva_cache_desc *cd, const kva_quant_params *p,
                         const kva_cache *hc)
{
    cuda_be *c = ud;
    kva_cache_destroy(c->dc);
    c->dc = NULL;
    CHECK_OK(kva_cache_create_quant(c->ctx, cd, p, &c->dc));
    if (c->dc)
        upload_quant(c->dc, hc);
}

static kva_status cuda_run(void *ud, const kva_plan_desc *pd, const void *q, void *out, float *lse)
{
    cuda_be *c = ud;
    const size_t T = (size_t)pd->query_start_loc[pd->num_requests];
    const size_t nq = T * pd->num_heads * pd->head_dim, nl = T * pd->num_heads;
    const size_t es = kva_dtype_size(pd->q_dtype);
    void *dq = dev_from(q, nq * es), *dout = dev_poisoned(nq * es);
    float *dl = dev_poisoned(nl * 4);
    kva_plan *plan = NULL;
    kva_status s = c->dc ? kva_plan_create(c->ctx, pd, &plan) : KVA_STATUS_INTERNAL;
    if (s == KVA_STATUS_OK)
        s = kva_attention_run(c->ctx, plan, dq, c->dc, NULL, dout, dl);
    to_host(out, dout, nq * es);
    to_host(lse, dl, nl * 4);
    kva_plan_destroy(plan);
    cudaFree(dq), cudaFree(dout), cudaFree(dl);
    return s;
}

static void test_sweep(void)
{
    /* Modes: the dispatcher's kernels; prefills as work items of the
     * tensor-core decode kernel; everything on CUDA cores (the fallback). */
    static const char *modes[3] = {"default kernels", "prefill_items",
                                   "decode_simt + prefill_items"};
    for (int mode = 0; mode < 3; mode++) {
        cuda_be cb = {make_ctx(KVA_BACKEND_CUDA), NULL};
        if (mode >= 1)
            CHECK_OK(kva__context_force_kernel(cb.ctx, "prefill_items"));
        if (mode == 2)
            CHECK_OK(kva__context_force_kernel(cb.ctx, "decode_simt"));
        for (int i = 0; i < QMAG_NFORMATS; i++) {
            if (!qmag_formats[i].cuda)
                continue;
            const struct qmag_format *f = &qmag_formats[i];
            /* Tensor-core kernels round P to f16 (bf16 where V is bf16) for
             * P V: 2^-11 (2^-8) max|v| more on out, |v| < 2; the CUDA-core
             * kernels do not. */
            const int bfp = f->qdt == KVA_DTYPE_BF16 &&
                            (f->quant == KVA_QUANT_NONE || f->quant == KVA_QUANT_INT8_TOKEN_K_V16);
            qmag_backend be = {"cuda",     &cb, cuda_prepare,
                               cuda_run,   0,   mode == 2 ? 0.0 : 2.0 * (bfp ? 0x1p-8 : 0x1p-11),
                               modes[mode]};
            /* The shape (GQA 4, D 128, B 16, HND), and MHA D 64 B 5 NHD;
             * D 256 in the default mode. */
            const qmag_case c0 = {f->quant, f->cache_dt, f->qdt, 16, 4, 128, 16, KVA_LAYOUT_HND};
            const qmag_case c1 = {f->quant, f->cache_dt, f->qdt, 4, 4, 64, 5, KVA_LAYOUT_NHD};
            const qmag_case c2 = {f->quant, f->cache_dt, f->qdt, 8, 1, 256, 16, KVA_LAYOUT_NHD};
            qmag_run_case(&c0, &be, 0x9a9u + (uint64_t)i);
            qmag_run_case(&c1, &be, 0x9b9u + (uint64_t)i);
            if (mode == 0)
                qmag_run_case(&c2, &be, 0x9c9u + (uint64_t)i);
        }
        kva_cache_destroy(cb.dc);
        kva_context_destroy(cb.ctx);
    }
}
#endif

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_sweep);
#endif
    return kva_test_finish();
}
