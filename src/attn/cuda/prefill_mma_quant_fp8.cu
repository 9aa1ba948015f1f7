/*
 * prefill_mma_quant_fp8.cu - the quantized tensor-core prefill kernel
 * (prefill_mma_quant.cuh) instantiated for KVA_QUANT_FP8_E4M3 (per-head or per-tensor K scales),
 * f16 and bf16 q, D 64 / 128 / 256.
 */
#include "prefill_mma_quant.cuh"

kva_status kva__qp_launch_fp8(const kva__cuda_qprefill_args *qa, cudaStream_t st)
{
    return qa->p.dtype == KVA_DTYPE_BF16 ? qp_launch_d<QP_FP8, false, kva__mma_bf16>(qa, st)
                                         : qp_launch_d<QP_FP8, false, kva__mma_f16>(qa, st);
}
