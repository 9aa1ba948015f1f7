/*
 * attn_simt_bf16.cu - the CUDA-core attention kernel (simt_kernel.cuh with
 * attn_simt.cuh's policy) instantiated for bf16 caches: ROWS 4 and 8, LK 8, 16, 32.
 */
#include "attn_simt.cuh"

attn_launch kva__simt_pick_bf16(int32_t dmax, int rows)
{
    return simt_pick<__nv_bfloat16>(dmax, rows);
}
