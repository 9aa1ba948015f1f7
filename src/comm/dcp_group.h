/*
 * dcp_group.h - what the communicator-backed DCP combines (dcp_mpi.c,
 * dcp_nccl.c) share: the group's shape, its validation at create, and the
 * argument checks of a combine. Compiled into each of their libraries.
 */
#ifndef KVA_DCP_GROUP_H
#define KVA_DCP_GROUP_H

#include "internal.h"

typedef struct kva__dcp_group {
    kva_context *ctx;
    int32_t size, rank; /* N and this rank, from the communicator */
    int32_t max_tokens, num_heads, head_dim_v;
    kva_dtype dtype;
    size_t es; /* bytes of a dtype element */
} kva__dcp_group;

/* Validates a create call's arguments (fn names it; max_dv is the backend's
 * head-size limit) for a communicator of size ranks and fills *g. */
kva_status kva__dcp_group_init(const char *fn, kva_context *ctx, int size, int rank,
                               int32_t max_tokens, int32_t num_heads, int32_t head_dim_v,
                               int32_t max_dv, kva_dtype dtype, kva__dcp_group *g);

/* Validates a combine call's arguments before any collective: a known mode,
 * T <= max_tokens, the tensors given when T > 0. */
kva_status kva__dcp_group_check(const char *fn, const kva__dcp_group *g, kva_dcp_combine mode,
                                int32_t num_tokens, const void *out_part, const float *lse_part,
                                const void *out);

#endif /* KVA_DCP_GROUP_H */
