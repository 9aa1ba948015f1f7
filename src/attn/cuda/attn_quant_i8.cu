/*
 * attn_quant_i8.cu - the CUDA-core attention kernel over quantized caches
 * (simt_kernel.cuh with attn_quant.cuh's policy) instantiated for
 * 1-byte int8 K and V codes (KVA_QUANT_INT8_CHANNEL, INT8_TOKEN_K): ROWS 4 with 16-byte chunks,
 * ROWS 8 with 8-byte ones.
 */
#include "attn_quant.cuh"

qa_launch kva__qa_pick_i8(int rows16, int lk)
{
    return qa_pick_fmt<QF_I8>(rows16, lk);
}
