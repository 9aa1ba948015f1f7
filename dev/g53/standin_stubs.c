/* VM-only stubs: the CUDA backend's symbols test_cuda_nan.c references, so its
 * stand-in mode (KVA_TEST_NAN_CPU=1, KVA_TEST_HIDDEN_CPU=1) links against the CPU library. Never
 * called there. */
#include "internal.h"
#include "cuda_backend.h"
const kva__kernel_info kva__cuda_kernels[KVA__CUDA_KERNELS];
int kva__cuda_decode_mma_quant_supported(kva_quant q, kva_dtype c, int32_t d, int32_t dv,
                                         kva_dtype qd)
{
    return 0;
}
int kva__cuda_qprefill_usable(const kva_context *ctx, const kva_plan *p, const void *q,
                              const kva_cache *c)
{
    return 0;
}
kva_status kva__cuda_context_force_splits(kva_context *ctx, int s)
{
    return KVA_STATUS_OK;
}
