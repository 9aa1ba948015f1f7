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
#include "quant_args.cuh"

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
    KVA_TRY(kva__cuda_prefill_check(a, "kva__cuda_qprefill_launch"));
    if (a->grid_tiles == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(qa->ks);
    KVA_CHECK_PTR(qa->ko);
    KVA_CHECK_PTR(qa->vs);
    KVA_CHECK_PTR(qa->vo);
    if (qa->quant == KVA_QUANT_INT8_TOKEN_K || qa->quant == KVA_QUANT_INT8_TOKEN_K_V16)
        KVA_CHECK_PTR(qa->kts);
    if (qa->quant == KVA_QUANT_FP8_E4M3 && !qa->k_uniform)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva__cuda_qprefill_launch: FP8_E4M3 with per-channel key scales");
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
    kva__cuda_qprefill_args qa;
    memset(&qa, 0, sizeof qa);
    kva__cuda_prefill_args_init(&qa.p, ctx, plan, cache, q, cache->k, cache->v, sinks, out, lse);
    qa.quant = cache->desc.quant;
    kva__quant_args_scales(qa, cache);
    qa.k_uniform = k_scale_uniform(cache);
    return kva__cuda_qprefill_launch(&qa, st->stream);
}
