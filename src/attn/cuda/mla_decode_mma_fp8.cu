/*
 * mla_decode_mma_fp8.cu - the instantiations of the absorbed MLA decode on
 * mma.sync (mla_decode_mma.cuh) over FP8 E4M3 latent caches, in a file of
 * their own so that the build compiles them beside the 16-bit ones.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "mla_decode_mma.cuh"

template <typename Ty> static ml_pick_t pick_fp8(int rows, bool qr)
{
    ml_pick_t k = {NULL, 0};
    if (rows == 16 && qr)
        k = {mla_decode_mma_kernel<Ty, 1, true, ml_dense<Ty, true>>, ml_cfg<1, true, true>::SMEM};
    else if (rows == 16)
        k = {mla_decode_mma_kernel<Ty, 1, false, ml_dense<Ty, true>>, ml_cfg<1, false, true>::SMEM};
    else if (rows == 32)
        k = {mla_decode_mma_kernel<Ty, 2, false, ml_dense<Ty, true>>, ml_cfg<2, false, true>::SMEM};
    else if (rows == 64)
        k = {mla_decode_mma_kernel<Ty, 4, false, ml_dense<Ty, true>>, ml_cfg<4, false, true>::SMEM};
    return k;
}

ml_pick_t kva__cuda_mla_mma_pick_fp8(kva_dtype dt, int rows, bool qr)
{
    if (dt == KVA_DTYPE_BF16)
        return pick_fp8<kva__mma_bf16>(rows, qr);
    if (dt == KVA_DTYPE_F16)
        return pick_fp8<kva__mma_f16>(rows, qr);
    ml_pick_t none = {NULL, 0};
    return none;
}
