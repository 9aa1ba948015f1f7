/*
 * prefill_wgmma_d128x.cu - EXPERIMENT (branch pf8, issue 23; not for main):
 * variants of the narrow D 128 wgmma prefill (bf16, TMA) that
 * kva__wg_launch_d128n runs instead of its default when KVA_PF8_EXP is set:
 *   1: ring of 2 stages, P V under the softmax (INTRA; main's narrow kernel)
 *   2: ring of 2 stages, P V issued with the next S (no INTRA)
 *   3: ring of 3 stages, no INTRA
 * (0 or unset: the default, a ring of 3 stages with INTRA.)
 */
#include "prefill_wgmma_kernel.cuh"

kva_status kva__wg_launch_d128x(const kva__cuda_prefill_args *a, cudaStream_t st, int v)
{
    if (v == 1)
        return launch_ws<true, true, kva__mma_bf16, 128, 128, 1, 64, 8, 2>(a, st);
    if (v == 2)
        return launch_ws<false, true, kva__mma_bf16, 128, 128, 1, 64, 9, 2>(a, st);
    return launch_ws<false, true, kva__mma_bf16, 128, 128, 1, 64, 10, 3>(a, st);
}
