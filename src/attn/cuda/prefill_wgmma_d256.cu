/*
 * prefill_wgmma_d256.cu - the sm_90a wgmma prefill kernel
 * (prefill_wgmma_kernel.cuh) instantiated for D 256 / Dv 256 in its one tile
 * shape (two consumer warpgroups of 64 rows, 64-key K/V tiles, two stages:
 * wg_dims): TMA and cp.async forms, f16 and bf16.
 */
#include "prefill_wgmma_kernel.cuh"

kva_status kva__wg_launch_d256(const kva__cuda_prefill_args *a, cudaStream_t st, int tma)
{
    return launch_dims<256, 256, 4, 2, 64>(a, st, tma);
}
