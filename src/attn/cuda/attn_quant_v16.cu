/*
 * attn_quant_v16.cu - the CUDA-core attention kernel over quantized caches
 * (simt_kernel.cuh with attn_quant.cuh's policy) instantiated for
 * int8 K codes with f16 or bf16 V (KVA_QUANT_INT8_TOKEN_K_V16): ROWS 4 with 16-byte chunks, ROWS 8
 * with 8-byte ones.
 */
#include "attn_quant.cuh"

qa_launch kva__qa_pick_v16(int fmt, int rows16, int lk)
{
    return fmt == QF_I8_BF16 ? qa_pick_fmt<QF_I8_BF16>(rows16, lk)
                             : qa_pick_fmt<QF_I8_F16>(rows16, lk);
}
