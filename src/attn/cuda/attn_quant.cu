/*
 * attn_quant.cu - paged attention over quantized caches on CUDA
 * (KVA_QUANT_INT8_CHANNEL, INT8_TOKEN_K, INT8_TOKEN_K_V16, FP8_E4M3), the
 * host side: kva__cuda_attention() sends a quantized cache here. The work
 * items of the plan (decodes, speculative decodes, chunked prefills) that
 * decode_mma_quant.cu does not take, and the prefill tiles that the quantized
 * tensor-core prefill (prefill_mma_quant.h, launched from here) does not
 * cover (kva__cuda_qprefill_usable: other head sizes, FP8 with per-channel
 * key scales, a V16 V dtype other than q's, unaligned pointers), run on the
 * CUDA-core kernel: simt_kernel.cuh's body with attn_quant.cuh's load
 * policy, instantiated per format family in attn_quant_{i8,fp8,v16}.cu.
 */
#include "attn_quant.cuh"
#include "quant_args.cuh"

#include <stdlib.h>
#include <string.h>

/*
 * The instantiation for a cache and the plan's rows per item: ROWS = 4 with
 * 16-byte chunks when items hold at most 4 rows and the rows are 16-byte
 * aligned (D, and Dv for 1-byte V, multiples of 16), else ROWS = 8 with
 * 8-byte chunks; LK lanes cover D (one chunk) and Dv (VB chunks). The loads
 * go through registers (attn_quant.cuh).
 */
static qa_launch pick(const kva_cache *c, int plan_rows, int *rows)
{
    const kva_cache_desc *d = &c->desc;
    const int fmt = d->quant == KVA_QUANT_FP8_E4M3 ? QF_FP8
                    : d->quant == KVA_QUANT_INT8_TOKEN_K_V16
                        ? (d->dtype == KVA_DTYPE_BF16 ? QF_I8_BF16 : QF_I8_F16)
                        : QF_I8;
    const int vb = fmt >= QF_I8_F16 ? 2 : 1;
    const int rows16 =
        plan_rows <= 4 && d->head_dim % 16 == 0 && (vb == 2 || d->head_dim_v % 16 == 0);
    const int cb = rows16 ? 16 : 8, vv = cb / vb;
    *rows = rows16 ? 4 : 8;
    const int nk = d->head_dim / cb;
    const int nv = (d->head_dim_v / vv + vb - 1) / vb;
    const int lk = nk > nv ? nk : nv;
    if (fmt == QF_FP8)
        return kva__qa_pick_fp8(rows16, lk);
    if (fmt == QF_I8)
        return kva__qa_pick_i8(rows16, lk);
    return kva__qa_pick_v16(fmt, rows16, lk);
}

extern "C" kva_status kva__cuda_attention_quant(kva_context *ctx, const kva_plan *plan,
                                                const void *q, const kva_cache *cache,
                                                const float *sinks, void *out, float *lse)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    cudaStream_t stream = (cudaStream_t)st->stream;
    qa_args a;
    memset(&a, 0, sizeof a);
    a.meta = st->meta;
    a.ptiles = cp->mma && st->caps.ptiles > 0 ? st->meta.ptiles : NULL;
    a.q = q;
    a.k = (const uint8_t *)cache->k;
    a.v = (const uint8_t *)cache->v;
    kva__quant_args_scales(a, cache);
    kva__attn_args_common(a, ctx, plan, cache, sinks, out, lse);
    a.layout_hnd = cd->layout == KVA_LAYOUT_HND;
    a.qdt = (int)d->q_dtype;
    if ((uintptr_t)q % kva_dtype_size(d->q_dtype) != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run: q = %p is not aligned to its %s elements", q,
                         kva_dtype_name(d->q_dtype));

    /* ROWS from the rows the plan's items actually hold (a plan partitioned
     * for the tensor-core decode may hold up to 16 per item, a GQA-4 decode
     * batch 4);
     * every item is cut into isub units of ROWS rows, isub from the plan's
     * bound cp->rows, so a captured graph replaying a later plan of the
     * same shape (larger items) still covers every row. */
    int32_t item_rows = 1;
    for (int32_t i = 0; i < plan->part->num_items; i++) {
        const kva__work_item *it = &plan->part->items[i];
        if (it->nq * it->nh > item_rows)
            item_rows = it->nq * it->nh;
    }
    int rows = 8;
    const qa_launch kl = pick(cache, item_rows < cp->rows ? item_rows : cp->rows, &rows);
    a.isub = (cp->rows + rows - 1) / rows;
    /* A plan partitioned for the tensor-core decode (16-row items) over 1-byte
     * K and V: its items run on decode_mma_quant.cu, the prefill tiles (if
     * any) stay here; both write disjoint rows (or split partials) and the
     * merge below covers both. */
    const int mma =
        cp->decode_kernel == KVA__CUDA_K_DECODE_MMA && cp->rows == KVA__CUDA_MMA_DECODE_ROWS &&
        kva__cuda_decode_mma_quant_supported(cd->quant, cd->dtype, a.D, a.Dv, d->q_dtype);
    if (mma) {
        KVA_TRY(kva__cuda_decode_mma_quant_run(ctx, plan, q, cache, sinks, out, lse));
        a.isub = 0; /* the kernel below runs only the prefill tiles */
    }
    /* Prefill tiles over covered formats and shapes run on the tensor-core
     * kernel (prefill_mma_quant.h) with the same tile list; rows disjoint
     * from the items'. A forced wgmma prefill has no quantized K/V path. */
    if (a.ptiles && cp->prefill_kernel != KVA__CUDA_PREFILL_AUTO &&
        cp->prefill_kernel != KVA__CUDA_PREFILL_MMA)
        return kva__fail(
            KVA_STATUS_UNSUPPORTED,
            "kva_attention_run: the forced prefill kernel %s does not read %s caches",
            kva__cuda_kernels[(cp->prefill_narrow ? KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW
                                                  : KVA__CUDA_K_PREFILL_WGMMA_TMA) +
                              (cp->prefill_kernel == KVA__CUDA_PREFILL_WGMMA)]
                .name,
            kva_quant_name(cd->quant));
    if (a.ptiles && kva__cuda_qprefill_usable(ctx, plan, q, cache)) {
        KVA_TRY(kva__cuda_qprefill_run(ctx, plan, q, cache, sinks, out, lse));
        a.ptiles = NULL;
    }
    /* A launch for the prefill tiles alone is left out of an eager run (the
     * stream is not capturing) of a plan without tiles: a context that
     * reserved tile capacity (kva_cuda_context_reserve) would otherwise launch
     * an empty kernel in every quantized decode step. Under capture it is
     * launched, so the graph replays later plans that have tiles. */
    if (a.isub == 0 && a.ptiles && cp->num_ptiles == 0) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        KVA_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
        if (cs == cudaStreamCaptureStatusNone)
            a.ptiles = NULL;
    }
    if (a.isub > 0 || a.ptiles) {
        /* Asked only when this kernel runs (its occupancy query is a runtime
         * call; a quantized decode on the tensor-core kernel never needs it). */
        int per_sm = 0;
        KVA_CUDA_TRY(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kl.fn, KVA_SIMT_NW * 32, 0));
        if (per_sm < 1)
            return kva__fail(KVA_STATUS_DEVICE_ERROR,
                             "kva_attention_run: the quantized attention kernel (%s, D/Dv %d/%d) "
                             "cannot be resident on device %d",
                             kva_quant_name(cd->quant), (int)a.D, (int)a.Dv, (int)st->device);
        kl.fn<<<st->num_sms * per_sm, KVA_SIMT_NW * 32, 0, stream>>>(a);
        KVA_CUDA_LAUNCHED("qa_kernel");
    }
    /* Always launched (it exits when the plan has no split task: graph
     * replay), except after the tensor-core decode, which merged every split
     * task itself (the prefill tiles write no partials). */
    if (mma)
        return KVA_STATUS_OK;
    return kva__cuda_split_merge_launch(&a.meta, a.ws, sinks, out, lse, a.H, a.G, a.Dv, d->q_dtype,
                                        st->num_sms * 2, stream);
}
