/*
 * attn_simt_f16.cu - the CUDA-core attention kernel (simt_kernel.cuh with
 * attn_simt.cuh's policy) instantiated for f16 caches: ROWS 4 and 8, LK 8, 16, 32.
 */
#include "attn_simt.cuh"

attn_launch kva__simt_pick_f16(int32_t dmax, int rows)
{
    return simt_pick<__half>(dmax, rows);
}
