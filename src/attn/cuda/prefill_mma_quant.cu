/*
 * prefill_mma_quant.cu - host side of the quantized tensor-core prefill
 * kernel (prefill_mma_quant.h): shape support, argument checks, dispatch to
 * the per-format instantiations (prefill_mma_quant_<fmt>.cu), and the run
 * path's entry (kva__cuda_qprefill_run, called by attn_quant.cu for the
 * plan's prefill tiles).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "prefill_mma_quant.cuh"

#include <string.h>

extern "C" int kva__cuda_qprefill_supported(kva_quant quant, kva_dtype cache_dtype,
                                            int32_t head_dim, int32_t head_dim_v, kva_dtype q_dtype)
{
    if (head_dim != head_dim_v || (head_dim != 64 && head_dim != 128 && head_dim != 256))
        return 0;
    if (q_dtype != KVA_DTYPE_F16 && q_dtype != KVA_DTYPE_BF16)
        return 0;
    switch (quant) {
    case KVA_QUANT_INT8_CHANNEL:
    case KVA_QUANT_INT8_TOKEN_K:
    case KVA_QUANT_FP8_E4M3:
        return 1;
    case KVA_QUANT_INT8_TOKEN_K_V16:
        return cache_dtype == q_dtype;
    default:
        return 0;
    }
}

extern "C" kva_status kva__cuda_qprefill_launch(const kva__cuda_qprefill_args *qa, void *stream)
{
    KVA_CHECK_PTR(qa);
    const kva__cuda_prefill_args *a = &qa->p;
    const kva_dtype cdt = qa->quant == KVA_QUANT_INT8_TOKEN_K_V16 ? a->dtype : KVA_DTYPE_I8;
    if (!kva__cuda_qprefill_supported(qa->quant, cdt, a->head_dim, a->head_dim_v, a->dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva__cuda_qprefill_launch: %s, D = %d, Dv = %d, q dtype %s not supported",
                         kva_quant_name(qa->quant), (int)a->head_dim, (int)a->head_dim_v,
                         kva_dtype_name(a->dtype));
    if (a->grid_tiles < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "kva__cuda_qprefill_launch: grid_tiles = %d",
                         (int)a->grid_tiles);
    if (a->grid_tiles == 0)
        return KVA_STATUS_OK;
    KVA__CUDA_PREFILL_CHECK_PTRS(a);
    KVA_CHECK_PTR(qa->ks);
    KVA_CHECK_PTR(qa->ko);
    KVA_CHECK_PTR(qa->vs);
    KVA_CHECK_PTR(qa->vo);
    if (qa->quant == KVA_QUANT_INT8_TOKEN_K || qa->quant == KVA_QUANT_INT8_TOKEN_K_V16)
        KVA_CHECK_PTR(qa->kts);
    if (qa->quant == KVA_QUANT_FP8_E4M3 && !qa->k_uniform)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva__cuda_qprefill_launch: FP8_E4M3 with per-channel key scales");
    /* 16-byte loads of q rows, 16-byte cp.async of K/V rows (D >= 64). */
    KVA__CUDA_PREFILL_CHECK_SHAPE(a, "kva__cuda_qprefill_launch");
    cudaStream_t st = (cudaStream_t)stream;
    switch (qa->quant) {
    case KVA_QUANT_INT8_CHANNEL:
        return kva__qp_launch_i8(qa, st);
    case KVA_QUANT_INT8_TOKEN_K:
        return kva__qp_launch_i8t(qa, st);
    case KVA_QUANT_FP8_E4M3:
        return kva__qp_launch_fp8(qa, st);
    default:
        return kva__qp_launch_v16(qa, st);
    }
}

/* 1 if k_scale [Hkv, D] (host copy) holds one value per kv head. */
static int k_scale_uniform(const kva_cache *cache)
{
    const kva_cache_desc *cd = &cache->desc;
    const float *ks = cache->k_scale;
    if (!ks)
        return 0;
    for (int64_t h = 0; h < cd->num_kv_heads; h++)
        for (int64_t c = 1; c < cd->head_dim; c++)
            if (ks[h * cd->head_dim + c] != ks[h * cd->head_dim])
                return 0;
    return 1;
}

extern "C" int kva__cuda_qprefill_usable(const kva_context *ctx, const kva_plan *plan,
                                         const void *q, const kva_cache *cache)
{
    (void)ctx;
    const kva_cache_desc *cd = &cache->desc;
    if (!kva__cuda_qprefill_supported(cd->quant, cd->dtype, plan->d.head_dim, plan->d.head_dim_v,
                                      plan->d.q_dtype))
        return 0;
    if (cd->quant == KVA_QUANT_FP8_E4M3 && !k_scale_uniform(cache))
        return 0;
    return ((uintptr_t)q | (uintptr_t)cache->k | (uintptr_t)cache->v) % 16 == 0;
}

extern "C" kva_status kva__cuda_qprefill_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                             const kva_cache *cache, const float *sinks, void *out,
                                             float *lse)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    kva__cuda_qprefill_args qa;
    memset(&qa, 0, sizeof qa);
    kva__cuda_prefill_args *pa = &qa.p;
    pa->q = q;
    pa->k = cache->k;
    pa->v = cache->v;
    pa->out = out;
    pa->lse = lse;
    pa->sinks = sinks;
    pa->alibi_slopes = cp->has_alibi ? st->meta.alibi : NULL;
    pa->query_start_loc = st->meta.qsl;
    pa->seq_lens = st->meta.seq_lens;
    pa->block_table = st->meta.block_table;
    pa->tiles = st->meta.ptiles;
    pa->num_tiles = st->meta.hdr + KVA_CUDA_HDR_PTILES;
    pa->grid_tiles = (int32_t)st->caps.ptiles;
    /* Per-plan values come from the device header (graph replay). */
    pa->block_table_stride_dev = st->meta.hdr + KVA_CUDA_HDR_BT_STRIDE;
    pa->tree = st->meta.tree;
    pa->tree_on = st->meta.hdr + KVA_CUDA_HDR_TREE;
    pa->block_size = cd->block_size;
    pa->num_heads = d->num_heads;
    pa->num_kv_heads = d->num_kv_heads;
    pa->head_dim = d->head_dim;
    pa->head_dim_v = d->head_dim_v;
    pa->dtype = d->q_dtype;
    pa->layout = cd->layout;
    pa->scale = d->scale;
    pa->causal = d->causal;
    pa->window_left = d->window_left;
    pa->attention_chunk = d->attention_chunk;
    pa->softcap = d->softcap;
    qa.quant = cd->quant;
    qa.kts = cache->k_token_scale;
    const int64_t hkv = cd->num_kv_heads;
    qa.ks = cache->dev_scales;
    qa.ko = qa.ks + hkv * cd->head_dim;
    qa.vs = qa.ko + hkv * cd->head_dim;
    qa.vo = qa.vs + hkv * cd->head_dim_v;
    qa.k_uniform = k_scale_uniform(cache);
    return kva__cuda_qprefill_launch(&qa, st->stream);
}
