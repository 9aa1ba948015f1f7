/*
 * decode_mma_quant.cu - host side of the tensor-core decode over quantized
 * caches (decode_mma_quant.cuh: the kernel and how it computes; its
 * instantiations per format family: decode_mma_quant_{i8,fp8,v16}.cu):
 * which kernel serves a format, q dtype and head size, and its launch.
 */
#include "decode_mma_quant.cuh"
extern "C" {
#include "partition.h"
}

/* The kernel for the format, q dtype, cache dtype (V's for
 * INT8_TOKEN_K_V16, which must be the q dtype) and D; fn NULL if none. */
static qm_launch qm_pick(kva_quant quant, kva_dtype dt, kva_dtype cache_dt, int32_t D)
{
    switch (quant) {
    case KVA_QUANT_INT8_CHANNEL:
    case KVA_QUANT_INT8_TOKEN_K:
        return kva__dmma_quant_pick_i8(dt, D);
    case KVA_QUANT_FP8_E4M3:
        return kva__dmma_quant_pick_fp8(dt, D);
    case KVA_QUANT_INT8_TOKEN_K_V16:
        if (cache_dt == dt)
            return kva__dmma_quant_pick_v16(dt, D);
        break;
    default:
        break;
    }
    return qm_launch{NULL, 0};
}

/* The kernel family of a format (qm_pick's switch): 0 int8 codes, 1 FP8, 2
 * int8 K with 16-bit V; -1 none. */
static int qm_family_of(kva_quant quant)
{
    return quant == KVA_QUANT_INT8_CHANNEL || quant == KVA_QUANT_INT8_TOKEN_K ? 0
           : quant == KVA_QUANT_FP8_E4M3                                      ? 1
           : quant == KVA_QUANT_INT8_TOKEN_K_V16                              ? 2
                                                                              : -1;
}

/*
 * Resident CTAs per SM of kernel k (family fam, q dtype dt, head size D) on
 * the current device, raising its dynamic shared-memory limit first; asked
 * once per kernel and device and kept (as the 16-bit decode's dm_smem_limit
 * keeps its attribute): the attribute call and the occupancy query are
 * runtime calls whose answer is fixed per kernel and device, and a per-call
 * decode time includes the run path's host time. *per_sm = 0 with
 * cudaSuccess: the kernel cannot be resident. Failures are not kept.
 */
static cudaError_t qm_ctas_per_sm(int fam, kva_dtype dt, int32_t D, const qm_launch &k, int *per_sm)
{
    static std::atomic<int> known[64][3 * 2 * 3]; /* resident CTAs + 1; 0: not asked */
    const int di = D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1;
    const int slot = fam >= 0 && di >= 0 ? (fam * 2 + (dt == KVA_DTYPE_F16)) * 3 + di : -1;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    const bool keep = slot >= 0 && dev >= 0 && dev < 64;
    if (keep && known[dev][slot].load() > 0) {
        *per_sm = known[dev][slot].load() - 1;
        return cudaSuccess;
    }
    e = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem);
    int n = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k.fn, DM_NW * 32, (size_t)k.smem);
    if (e != cudaSuccess)
        return e;
    if (keep)
        known[dev][slot].store(n + 1);
    *per_sm = n;
    return cudaSuccess;
}

extern "C" int kva__cuda_decode_mma_quant_supported(kva_quant quant, kva_dtype cache_dtype,
                                                    int32_t head_dim, int32_t head_dim_v,
                                                    kva_dtype q_dtype)
{
    return head_dim == head_dim_v && qm_pick(quant, q_dtype, cache_dtype, head_dim).fn != NULL;
}

extern "C" kva_status kva__cuda_decode_mma_quant_run(kva_context *ctx, const kva_plan *plan,
                                                     const void *q, const kva_cache *cache,
                                                     const float *sinks, void *out, float *lse)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    kva__cuda_quant_mma_args qa;
    memset(&qa, 0, sizeof qa);
    kva__cuda_attn_args &a = qa.a;
    a.meta = st->meta;
    a.q = q;
    a.k = cache->k;
    a.v = cache->v;
    a.layout_hnd = cd->layout == KVA_LAYOUT_HND;
    kva__attn_args_common(a, ctx, plan, cache, sinks, out, lse);
    kva__quant_args_scales(qa, cache);
    qa.q16 = (uintptr_t)q % 16 == 0;
    const qm_launch k = qm_pick(cd->quant, d->q_dtype, cd->dtype, a.D);
    if (!k.fn || a.Dv != a.D)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: the quantized tensor-core decode does not cover %s, "
                         "D = %d, Dv = %d, q dtype %s",
                         kva_quant_name(cd->quant), (int)a.D, (int)a.Dv,
                         kva_dtype_name(d->q_dtype));
    if (((uintptr_t)a.k | (uintptr_t)a.v) % 16 != 0)
        return kva__fail(
            KVA_STATUS_INVALID_ARGUMENT,
            "kva_attention_run: the quantized tensor-core decode needs 16-byte aligned "
            "k (%p) and v (%p)",
            a.k, a.v);
    int per_sm = 0;
    KVA_CUDA_TRY(qm_ctas_per_sm(qm_family_of(cd->quant), d->q_dtype, a.D, k, &per_sm));
    if (per_sm < 1)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_attention_run: the quantized tensor-core decode (D %d) cannot be "
                         "resident on device %d",
                         (int)a.D, (int)st->device);
    cudaError_t e = cudaSuccess;
    int eager = 0;
    const int pdl = dm_pdl_ok((cudaStream_t)st->stream, &e, &eager);
    KVA_CUDA_TRY(e);
    const int grid = kva__cuda_decode_grid(st->num_sms * per_sm, plan->part->num_items, eager);
    KVA_CUDA_TRY(dm_launch_go(k.fn, grid, k.smem, (cudaStream_t)st->stream, qa, pdl));
    KVA_CUDA_LAUNCHED("decode_mma_kernel (quantized)");
    return KVA_STATUS_OK;
}
