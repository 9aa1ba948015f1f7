/*
 * attn_simt.cu - the host side of the CUDA-core attention kernel
 * ("decode_simt", cuda_kernels.cu) over f32/f16/bf16 caches: the portable
 * kernel of the decode family (f32, head sizes the tensor-core decode
 * (decode_mma.cu) does not cover, ragged K/V, and the prefills of shapes
 * without a prefill tile kernel; cuda_dispatch.cu chooses between them). The
 * kernel is simt_kernel.cuh's body with attn_simt.cuh's load policy,
 * instantiated per dtype in attn_simt_{f32,f16,bf16}.cu.
 */
#include "attn_simt.cuh"

/* ---- dispatch ---- */

extern "C" int kva__cuda_rows_for_group(int32_t group)
{
    return group <= 4 ? 4 : 8;
}

static attn_launch pick_kernel(kva_dtype dt, int32_t dmax, int rows)
{
    if (dt == KVA_DTYPE_F32)
        return kva__simt_pick_f32(dmax, rows);
    if (dt == KVA_DTYPE_F16)
        return kva__simt_pick_f16(dmax, rows);
    return kva__simt_pick_bf16(dmax, rows);
}

extern "C" int kva__cuda_simt_ctas_per_sm(kva_dtype dtype, int32_t dmax, int rows)
{
    attn_launch k = pick_kernel(dtype, dmax, rows);
    int n = 0;
    if (k.smem > 48 * 1024 &&
        cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k.fn, KVA_SIMT_NW * 32, k.smem) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" kva_status kva__cuda_simt_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int rows,
                                            int grid, void *stream)
{
    const int32_t dmax = a->D > a->Dv ? a->D : a->Dv;
    attn_launch kl = pick_kernel(dtype, dmax, rows);
    kl.fn<<<grid, KVA_SIMT_NW * 32, kl.smem, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("attn_kernel");
    return KVA_STATUS_OK;
}
