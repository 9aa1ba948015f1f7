/*
 * decode_mma_quant_fp8.cu - the quantized tensor-core decode
 * (decode_mma_quant.cuh) instantiated for fp8 e4m3 K and V codes
 * (KVA_QUANT_FP8_E4M3), f16 and bf16 q, D 64 / 128 / 256.
 */
#include "decode_mma_quant.cuh"

qm_launch kva__dmma_quant_pick_fp8(kva_dtype dt, int32_t D)
{
    return qm_pick_dt<QM_FP8>(dt, D);
}
