/*
 * prefill_wgmma_d128n.cu - the sm_90a wgmma prefill kernel
 * (prefill_wgmma_kernel.cuh) instantiated for D 128 / Dv 128 in the narrow
 * tile shape (64 rows and 64 keys per CTA tile, two CTAs per SM: wg_dims),
 * which the plan picks for batches of short requests
 * (kva__cuda_prefill_args.narrow): TMA and cp.async forms, f16 and bf16.
 */
#include "prefill_wgmma_kernel.cuh"

kva_status kva__wg_launch_d128n(const kva__cuda_prefill_args *a, cudaStream_t st, int tma)
{
    return launch_dims<128, 128, 3, 1, 64>(a, st, tma);
}
