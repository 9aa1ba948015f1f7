/*
 * prefill_wgmma_d64.cu - the sm_90a wgmma prefill kernel
 * (prefill_wgmma_kernel.cuh) instantiated for D 64 / Dv 64: TMA and
 * cp.async forms, f16 and bf16.
 */
#include "prefill_wgmma_kernel.cuh"

kva_status kva__wg_launch_d64(const kva__cuda_prefill_args *a, cudaStream_t st, int tma)
{
    return launch_dims<64, 64, 1>(a, st, tma);
}
