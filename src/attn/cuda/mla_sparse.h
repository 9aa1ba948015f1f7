/*
 * mla_sparse.h - the CUDA backend's sparse MLA (mla_sparse.cu) and the
 * device fp8_ds_mla cache and read-back (cache_ds_mla.cu), as C
 * declarations for cuda_ctx.cu and cache_ops.cu.
 */
#ifndef KVA_CUDA_MLA_SPARSE_H
#define KVA_CUDA_MLA_SPARSE_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* kva_cache_write into an FP8_DS_MLA device cache (arguments as
 * kva__memory_ops.cache_write): byte-identical to the host writer. */
kva_status kva__cuda_ds_mla_write(kva_context *ctx, kva_cache *cache, int32_t n, const void *k,
                                  int64_t ks, const void *v, int64_t vs, kva_dtype src_dtype,
                                  const int64_t *slots);
/* kva__memory_ops.cache_read of the CUDA space: index-key caches (index_cache.cu), MLA caches
 * (f32/f16/bf16, FP8_DS_MLA) and unquantized MHA caches; quantized MHA caches get
 * KVA_STATUS_UNSUPPORTED. */
kva_status kva__cuda_cache_read(kva_context *ctx, const kva_cache *cache, int32_t n,
                                const int64_t *slots, void *k, int64_t ks, void *v, int64_t vs,
                                kva_dtype dst_dtype);
/* Rows 0 .. s - 1 of one request of MLA cache `cache` (bt_row: its
 * block-table row, device) dequantized into rows [s, Dc + Dr] in dt, on the
 * context's stream (the sparse MLA's separate mode). */
kva_status kva__cuda_mla_gather_rows(kva_context *ctx, const kva_cache *cache,
                                     const int32_t *bt_row, int32_t s, void *rows, kva_dtype dt);

/* The kernel a sparse plan of ctx runs (kva__cuda_kernel): the sm_90a wgmma
 * MLA body ("mla_decode_wgmma_sm90", mla_sparse_wgmma.cu) for H > 32 where
 * this build and device have it, else mma.sync ("mla_decode_mma_sm80",
 * mla_sparse.cu: 16- and 32-row head tiles); a forced MLA kernel wins. */
int kva__cuda_sparse_kernel(const kva_context *ctx, const kva_plan *plan);
/* 1 if the CUDA sparse MLA covers the plan's shape (D 576, Dv 512, f16/bf16 q). */
int kva__cuda_sparse_supported(const kva_plan *plan);
/* Workspace bytes a sparse plan's run needs on ctx, and the offset of the
 * separate mode's dense rows in it. */
kva_status kva__cuda_sparse_workspace(const kva_context *ctx, const kva_plan *plan, size_t *bytes,
                                      size_t *rows_off);
/* kva__backend_ops.mla_sparse of the CUDA backend (the plan uploaded and
 * current, its workspace reserved). */
kva_status kva__cuda_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                                const kva_cache *cache, const int32_t *indices,
                                int64_t indices_stride, const int32_t *topk_length,
                                const float *sinks, void *out, float *lse);

#endif /* KVA_CUDA_MLA_SPARSE_H */
