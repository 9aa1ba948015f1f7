/*
 * quant_args.cuh - host side: the kernel arguments that the attention
 * launchers share (cuda_dispatch.cu: attn_args; attn_quant.cu: qa_args, the
 * quantized CUDA-core kernel; decode_mma_quant.cu: kva__cuda_quant_mma_args,
 * the quantized tensor-core decode), filled from the plan, the cache (NULL
 * for ragged K/V) and the run's outputs. A: any struct with these fields.
 */
#ifndef KVA_CUDA_QUANT_ARGS_CUH
#define KVA_CUDA_QUANT_ARGS_CUH

/* Outputs, workspace, shape, masks and scales of the run. */
template <typename A>
static void kva__attn_args_common(A &a, kva_context *ctx, const kva_plan *plan,
                                   const kva_cache *cache, const float *sinks, void *out,
                                   float *lse)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    a.sinks = sinks;
    a.out = out;
    a.lse = lse;
    a.ws = (float *)ctx->workspace;
    a.H = d->num_heads;
    a.Hkv = d->num_kv_heads;
    a.G = d->num_heads / d->num_kv_heads;
    a.D = d->head_dim;
    a.Dv = d->head_dim_v;
    a.B = cache ? cache->desc.block_size : 1;
    a.causal = d->causal;
    a.window_left = d->window_left;
    a.chunk = d->attention_chunk;
    a.has_alibi = cp->has_alibi;
    a.scale = d->scale;
    a.softcap = d->softcap;
}

/* The cache's scales: per-token key scales [NB, Hkv, B] or NULL; dev_scales
 * holds K scale [Hkv, D], K offset [Hkv, D], V scale, V offset [Hkv, Dv]. */
template <typename S> static void kva__quant_args_scales(S &s, const kva_cache *cache)
{
    const kva_cache_desc *cd = &cache->desc;
    const int64_t hkv = cd->num_kv_heads;
    s.kts = cache->k_token_scale;
    s.ks = cache->dev_scales;
    s.ko = s.ks + hkv * cd->head_dim;
    s.vs = s.ko + hkv * cd->head_dim;
    s.vo = s.vs + hkv * cd->head_dim_v;
}

#endif
