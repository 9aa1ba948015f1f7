/*
 * attn_simt_f32.cu - the CUDA-core attention kernel (simt_kernel.cuh with
 * attn_simt.cuh's policy) instantiated for f32 caches: ROWS 4 and 8, LK 8, 16, 32 (and 2 chunks per
 * lane past D 128).
 */
#include "attn_simt.cuh"

attn_launch kva__simt_pick_f32(int32_t dmax, int rows)
{
    return simt_pick<float>(dmax, rows);
}
