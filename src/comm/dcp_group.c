/*
 * dcp_group.c - validation shared by the DCP combines over MPI and NCCL
 * (dcp_group.h).
 */
#include "dcp_group.h"

kva_status kva__dcp_group_init(const char *fn, kva_context *ctx, int size, int rank,
                               int32_t max_tokens, int32_t num_heads, int32_t head_dim_v,
                               int32_t max_dv, kva_dtype dtype, kva__dcp_group *g)
{
    if (size < 1 || size > KVA_MAX_DCP)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: the communicator has %d ranks, outside [1, KVA_MAX_DCP = %d]", fn,
                         size, KVA_MAX_DCP);
    if (max_tokens < 1 || max_tokens > KVA_MAX_SEQ_LEN)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: max_tokens = %d is outside [1, %d]", fn,
                         (int)max_tokens, KVA_MAX_SEQ_LEN);
    if (num_heads < 1 || num_heads > KVA_MAX_HEADS || num_heads % size != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_heads = %d must be in [1, %d] and a multiple of the "
                         "communicator's size %d (each rank gets H / N heads)",
                         fn, (int)num_heads, KVA_MAX_HEADS, size);
    if (head_dim_v < 8 || head_dim_v > max_dv || head_dim_v % 8 != 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: head_dim_v = %d is unsupported (multiples of 8 from 8 to %d)", fn,
                         (int)head_dim_v, (int)max_dv);
    if (dtype != KVA_DTYPE_F32 && dtype != KVA_DTYPE_F16 && dtype != KVA_DTYPE_BF16)
        return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: dtype %d (%s) is not f32, f16 or bf16", fn,
                         (int)dtype, kva_dtype_name(dtype));
    *g = (kva__dcp_group){ctx,       size,       rank,  max_tokens,
                          num_heads, head_dim_v, dtype, kva_dtype_size(dtype)};
    return KVA_STATUS_OK;
}

kva_status kva__dcp_group_check(const char *fn, const kva__dcp_group *g, kva_dcp_combine mode,
                                int32_t num_tokens, const void *out_part, const float *lse_part,
                                const void *out)
{
    if ((unsigned)mode >= (unsigned)KVA_DCP_COMBINE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: mode = %d is not a kva_dcp_combine", fn,
                         (int)mode);
    if (num_tokens < 0 || num_tokens > g->max_tokens)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_tokens = %d is outside [0, max_tokens = %d]", fn, (int)num_tokens,
                         (int)g->max_tokens);
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(out_part);
    KVA_CHECK_PTR(lse_part);
    KVA_CHECK_PTR(out);
    if ((int64_t)num_tokens * g->num_heads * g->head_dim_v > INT32_MAX / 4)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: %d tokens x %d heads x %d exceed the collectives' int counts", fn,
                         (int)num_tokens, (int)g->num_heads, (int)g->head_dim_v);
    return KVA_STATUS_OK;
}
