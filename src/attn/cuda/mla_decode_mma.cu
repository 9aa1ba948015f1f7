/*
 * mla_decode_mma.cu - the host side of the absorbed MLA decode on mma.sync
 * ("mla_decode_mma_sm80", the kernel in mla_decode_mma.cuh) and its
 * instantiations over 16-bit latent caches (FP8 ones: mla_decode_mma_fp8.cu).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "mla_decode_mma.cuh"

/* ---- host side ---- */

/* Whether the current device gives a CTA the shared memory of the 16-row
 * kernel with Q in registers and three stages, or (FP8) four raw stages
 * (sm_90: 227 KB; sm_80: 163 KB, which keeps the two-stage kernel). */
static bool ml_qr_fits(void)
{
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return optin >= ml_cfg<1, true>::SMEM && optin >= ml_cfg<1, true, true>::SMEM;
}

template <typename Ty> static ml_pick_t ml_pick_mt(int rows)
{
    ml_pick_t k = {NULL, 0};
    if (rows == 16 && ml_qr_fits())
        k = {mla_decode_mma_kernel<Ty, 1, true, ml_dense<Ty, false>>, ml_cfg<1, true>::SMEM};
    else if (rows == 16)
        k = {mla_decode_mma_kernel<Ty, 1, false, ml_dense<Ty, false>>, ml_cfg<1>::SMEM};
    else if (rows == 32)
        k = {mla_decode_mma_kernel<Ty, 2, false, ml_dense<Ty, false>>, ml_cfg<2>::SMEM};
    else if (rows == 64)
        k = {mla_decode_mma_kernel<Ty, 4, false, ml_dense<Ty, false>>, ml_cfg<4>::SMEM};
    return k;
}

/* The kernel for q dtype dt, items of `rows` rows, over a 16-bit or (fp8)
 * an FP8 E4M3 latent cache. */
static ml_pick_t ml_pick(kva_dtype dt, int rows, int fp8)
{
    if (fp8)
        return kva__cuda_mla_mma_pick_fp8(dt, rows, rows == 16 && ml_qr_fits());
    if (dt == KVA_DTYPE_BF16)
        return ml_pick_mt<kva__mma_bf16>(rows);
    if (dt == KVA_DTYPE_F16)
        return ml_pick_mt<kva__mma_f16>(rows);
    ml_pick_t none = {NULL, 0};
    return none;
}

extern "C" int kva__cuda_mla_decode_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype)
{
    return head_dim == ML_D && head_dim_v == ML_DV &&
           (dtype == KVA_DTYPE_BF16 || dtype == KVA_DTYPE_F16);
}

extern "C" int kva__cuda_mla_decode_rows(int32_t num_heads, int32_t max_q_len)
{
    const int64_t rows = (int64_t)num_heads * (max_q_len > 0 ? max_q_len : 1);
    return rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
}

extern "C" int kva__cuda_mla_decode_ctas_per_sm(kva_dtype dtype, int rows)
{
    const ml_pick_t k = ml_pick(dtype, rows, 0);
    return ml_ctas_per_sm(k.fn, k.smem);
}

extern "C" kva_status kva__cuda_mla_decode_launch(const kva__cuda_attn_args *a, kva_dtype dtype,
                                                  int rows, int grid, void *stream)
{
    const ml_pick_t k = ml_pick(dtype, rows, a->kv_fp8);
    if (!k.fn || !kva__cuda_mla_decode_supported(a->D, a->Dv, dtype) || a->Hkv != 1 || a->ragged)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: the MLA decode covers D = 576, Dv = 512, Hkv = 1, a "
                         "paged f16/bf16 or fp8_e4m3 latent cache with f16/bf16 q and items of "
                         "16, 32 or 64 rows (got D = %d, Dv = %d, Hkv = %d, q dtype = %s, rows = "
                         "%d)",
                         (int)a->D, (int)a->Dv, (int)a->Hkv, kva_dtype_name(dtype), rows);
    return ml_launch(k.fn, k.smem, a, grid, stream);
}
