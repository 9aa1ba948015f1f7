/*
 * attn_quant_fp8.cu - the CUDA-core attention kernel over quantized caches
 * (simt_kernel.cuh with attn_quant.cuh's policy) instantiated for
 * fp8 e4m3 K and V codes (KVA_QUANT_FP8_E4M3): ROWS 4 with 16-byte chunks, ROWS 8 with 8-byte ones.
 */
#include "attn_quant.cuh"

qa_launch kva__qa_pick_fp8(int rows16, int lk)
{
    return qa_pick_fmt<QF_FP8>(rows16, lk);
}
