/*
 * prefill_mma_quant_i8t.cu - the quantized tensor-core prefill kernel
 * (prefill_mma_quant.cuh) instantiated for KVA_QUANT_INT8_TOKEN_K,
 * f16 and bf16 q, D 64 / 128 / 256.
 */
#include "prefill_mma_quant.cuh"

kva_status kva__qp_launch_i8t(const kva__cuda_qprefill_args *qa, cudaStream_t st)
{
    return qa->p.dtype == KVA_DTYPE_BF16 ? qp_launch_d<QP_I8T, false, kva__mma_bf16>(qa, st)
                                         : qp_launch_d<QP_I8T, false, kva__mma_f16>(qa, st);
}
