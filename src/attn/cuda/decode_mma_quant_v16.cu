/*
 * decode_mma_quant_v16.cu - the quantized tensor-core decode
 * (decode_mma_quant.cuh) instantiated for int8 K codes with V in the q dtype
 * (KVA_QUANT_INT8_TOKEN_K_V16), f16 and bf16 q, D 64 / 128 / 256.
 */
#include "decode_mma_quant.cuh"

qm_launch kva__dmma_quant_pick_v16(kva_dtype dt, int32_t D)
{
    if (dt == KVA_DTYPE_BF16)
        return qm_pick_d<QM_V16, __nv_bfloat16>(D);
    if (dt == KVA_DTYPE_F16)
        return qm_pick_d<QM_V16, __half>(D);
    return qm_launch{NULL, 0};
}
