/*
 * cuda_kernels.cu - the CUDA backend's kernel registry (kva__backend_ops.kernels,
 * src/core/internal.h): every kernel the dispatcher chooses among, named by
 * family and arch, in the order of kva__cuda_kernel (cuda_backend.h). Tests
 * and benchmarks force one with kva__context_force_kernel; cuda_plan_build
 * (cuda_ctx.cu) reads the forcing when it partitions a plan.
 */
extern "C" {
#include "cuda_backend.h"
}

/* The sm_90a kernels need a build with sm_90a code and a compute capability
 * 9.0 device (the context's current device). */
static int wgmma_usable(const kva_context *ctx)
{
    (void)ctx;
    return kva__cuda_prefill_wgmma_ready();
}

extern "C" const kva__kernel_info kva__cuda_kernels[KVA__CUDA_KERNELS] = {
    /* Work items on tensor cores (mma.sync m16n8k16), f16/bf16, D = Dv in
     * {64, 128, 256}; quantized caches through decode_mma_quant.cu. */
    {"decode_mma_sm80", KVA__KERNEL_DECODE, NULL},
    /* Work items on CUDA cores: every dtype, head size and cache format. */
    {"decode_simt", KVA__KERNEL_DECODE, NULL},
    /* Prefill tiles on wgmma with TMA loads of in-range K/V tiles (D/Dv 64/64, 128/128,
     * 192/128, 256/256). */
    {"prefill_wgmma_tma_sm90", KVA__KERNEL_PREFILL, wgmma_usable},
    /* The same kernel with every K/V tile gathered by cp.async. */
    {"prefill_wgmma_sm90", KVA__KERNEL_PREFILL, wgmma_usable},
    /* The two above in the narrow tile shape (64 rows and 64 keys per CTA tile,
     * two CTAs per SM) at D 128, which the plan picks when every prefill is
     * short; forcing one of the two above runs the wide shape (the other head
     * sizes have one shape, which all four names run). */
    {"prefill_wgmma_tma_narrow_sm90", KVA__KERNEL_PREFILL, wgmma_usable},
    {"prefill_wgmma_narrow_sm90", KVA__KERNEL_PREFILL, wgmma_usable},
    /* Prefill tiles on mma.sync, D in {64, 128, 256}, float and quantized caches. */
    {"prefill_mma_sm80", KVA__KERNEL_PREFILL, NULL},
    /* No prefill tiles: prefills run as work items of the plan's decode-family
     * kernel (the portable path of shapes without a tile kernel). */
    {"prefill_items", KVA__KERNEL_PREFILL, NULL},
    /* Absorbed MLA over a latent cache (D 576, Dv 512) on mma.sync: the work
     * items of KVA_ATTN_MLA plans of 16 or 32 rows (H * q_len <= 32), and of
     * any plan when forced; sparse MLA plans of H <= 32 (mla_sparse.cu). */
    {"mla_decode_mma_sm80", KVA__KERNEL_DECODE, NULL},
    /* The same on sm_90a wgmma, items of 64 rows: the default where H * q_len
     * fills them (> 32 rows); sparse MLA plans of H > 32 (mla_sparse_wgmma.cu). */
    {"mla_decode_wgmma_sm90", KVA__KERNEL_DECODE, wgmma_usable},
};
