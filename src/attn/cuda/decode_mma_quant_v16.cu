/*
 * decode_mma_quant_v16.cu - the quantized tensor-core decode
 * (decode_mma_quant.cuh) instantiated for int8 K codes with V in the q dtype
 * (KVA_QUANT_INT8_TOKEN_K_V16), f16 and bf16 q, D 64 / 128 / 256.
 */
#include "decode_mma_quant.cuh"

qm_launch kva__dmma_quant_pick_v16(kva_dtype dt, int32_t D)
{
    return qm_pick_dt<QM_V16>(dt, D);
}
