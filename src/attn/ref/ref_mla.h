/*
 * ref_mla.h - the reference backend's layer-level MLA (ref_mla.c), used by
 * its operation table (ref_ops.c).
 */
#ifndef KVA_REF_MLA_H
#define KVA_REF_MLA_H

#include "internal.h"

/* Workspace bytes kva__ref_mla_run needs for plan: [max_seq_len, Dn + Dr +
 * Dv] doubles for a plan with MLA head sizes, else 0. */
size_t kva__ref_mla_workspace(const kva_plan *plan);
/* kva__backend_ops.mla_run of the reference backend (arguments there). */
kva_status kva__ref_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                            const void *w_uv, const kva_cache *cache, void *out, float *lse);

/* Workspace bytes kva__ref_mla_sparse needs for plan: the separate mode's
 * gathered rows [kva__sparse_gather_rows, D] float32 (ref_sparse.c). */
size_t kva__ref_sparse_workspace(const kva_plan *plan);
/* kva__backend_ops.mla_sparse of the reference backend (ref_sparse.c). */
kva_status kva__ref_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                               const kva_cache *cache, const int32_t *indices,
                               int64_t indices_stride, const int32_t *topk_length,
                               const float *sinks, void *out, float *lse);
/* The reference indexer (ref_indexer.c): workspace bytes for an indexer
 * plan ([max_seq_len] doubles and two int32 arrays; 0 for other kinds) and
 * kva__backend_ops.indexer (arguments there). */
size_t kva__ref_indexer_workspace(const kva_plan *plan);
kva_status kva__ref_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                            const float *weights, const kva_cache *cache, int32_t *indices,
                            int64_t indices_stride, int32_t *topk_length);

#endif /* KVA_REF_MLA_H */
