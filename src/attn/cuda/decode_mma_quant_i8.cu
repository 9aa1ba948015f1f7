/*
 * decode_mma_quant_i8.cu - the quantized tensor-core decode
 * (decode_mma_quant.cuh) instantiated for 1-byte int8 K and V codes
 * (KVA_QUANT_INT8_CHANNEL, INT8_TOKEN_K), f16 and bf16 q, D 64 / 128 / 256.
 */
#include "decode_mma_quant.cuh"

qm_launch kva__dmma_quant_pick_i8(kva_dtype dt, int32_t D)
{
    return qm_pick_dt<QM_I8>(dt, D);
}
