/*
 * prefill_mma_quant.h - the tensor-core paged prefill kernel (prefill_mma.h)
 * over quantized caches: KVA_QUANT_INT8_CHANNEL, INT8_TOKEN_K, FP8_E4M3
 * (1-byte K and V codes) and INT8_TOKEN_K_V16 (int8 K codes, V in the q
 * dtype). Same tiles, masks and outputs as prefill_mma.h; the codes are
 * converted exactly to f16 in shared memory and the scales are applied
 * outside the mma (prefill_mma_quant.cuh describes how and the error bound).
 *
 * Self-contained C interface (no CUDA types; stream is a cudaStream_t).
 */
#ifndef KVA_CUDA_PREFILL_MMA_QUANT_H
#define KVA_CUDA_PREFILL_MMA_QUANT_H

#include "prefill_mma.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kva__cuda_qprefill_args {
    /* p.k, p.v: the codes (V in p.dtype for INT8_TOKEN_K_V16); p.dtype: the q
     * (and out) dtype; everything else as for prefill_mma.h. */
    kva__cuda_prefill_args p;
    kva_quant quant;
    const float *kts;     /* [NB, Hkv, B] per-token key scales (INT8_TOKEN_K*), else NULL */
    const float *ks, *ko; /* [Hkv, D] static K scale / offset (the cache's expanded arrays) */
    const float *vs, *vo; /* [Hkv, Dv] static V scale / offset */
    /* 1: ks[h, c] is one value per kv head h (per-tensor or per-head scales,
     * unit scales of the per-token formats): it is applied to the scores
     * and Q is only scaled by a power of two (exact); 0: per-channel scales,
     * folded into Q as an f16 pair hi + lo (two mma passes for S). */
    int32_t k_uniform;
} kva__cuda_qprefill_args;

/* 1 if the kernel covers the quantized cache format: quant INT8_CHANNEL,
 * INT8_TOKEN_K or FP8_E4M3, or INT8_TOKEN_K_V16 with its V dtype
 * (cache_dtype) equal to q_dtype; q_dtype F16 or BF16; D = Dv in
 * {64, 128, 256}. */
int kva__cuda_qprefill_supported(kva_quant quant, kva_dtype cache_dtype, int32_t head_dim,
                                 int32_t head_dim_v, kva_dtype q_dtype);

/* Launches the kernel over the tiles, in the configuration of the format and
 * head size (prefill_mma_quant.cuh, qp_launch_d), as kva__cuda_prefill_launch_kernel
 * does: never synchronizes, CTAs past *num_tiles exit.
 * KVA_STATUS_UNSUPPORTED for shapes _supported rejects,
 * KVA_STATUS_INVALID_ARGUMENT for bad arguments (q, k, v not 16-byte
 * aligned), KVA_STATUS_DEVICE_ERROR on a launch failure. */
kva_status kva__cuda_qprefill_launch(const kva__cuda_qprefill_args *args, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVA_CUDA_PREFILL_MMA_QUANT_H */
