/*
 * dcp_nccl.c - the decode-context-parallel combine over NCCL (kvattn_nccl.h).
 *
 * A2A, as dcp_mpi.c's: per destination k the rank packs [its out rows of
 * k's heads (T*Hn*Dv in dtype) | their lse (T*Hn float32)] into one block of
 * a device buffer with two strided copies (cudaMemcpy2DAsync: T rows of Hn
 * heads out of H); a grouped ncclSend/ncclRecv per peer exchanges the
 * blocks (NCCL has no all-to-all call; this is how its docs build one); and
 * kva_merge_states_n merges the N received blocks in place (part stride = one
 * block). Everything runs on the context's stream, with no allocation and no
 * host synchronization, so it can be graph-captured.
 */
#include "internal.h"
#include "kvattn_cuda.h"
#include "kvattn_nccl.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

struct kva_dcp_nccl {
    kva_context *ctx;
    ncclComm_t comm;
    int32_t size, rank;
    int32_t max_tokens, num_heads, head_dim_v;
    kva_dtype dtype;
    size_t es;
    void *send, *recv; /* N packed blocks each, device memory */
};

kva_status kva_dcp_nccl_create(kva_context *ctx, ncclComm_t comm, int32_t max_tokens,
                               int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                               kva_dcp_nccl **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(comm);
    KVA_CHECK_PTR(out);
    if (kva_context_backend(ctx) != KVA_BACKEND_CUDA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_create: the NCCL combine needs a CUDA context (host "
                         "contexts combine with kvattn_mpi.h)");
    int size = 0, rank = 0;
    if (ncclCommCount(comm, &size) != ncclSuccess || ncclCommUserRank(comm, &rank) != ncclSuccess)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_create: comm is not a valid NCCL communicator");
    if (size > KVA_MAX_DCP)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_create: %d ranks, more than KVA_MAX_DCP = %d", size,
                         KVA_MAX_DCP);
    if (max_tokens < 1 || max_tokens > KVA_MAX_SEQ_LEN)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_create: max_tokens = %d is outside [1, %d]", (int)max_tokens,
                         KVA_MAX_SEQ_LEN);
    if (num_heads < 1 || num_heads > KVA_MAX_HEADS || num_heads % size != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_create: num_heads = %d must be in [1, %d] and a multiple "
                         "of the communicator's size %d",
                         (int)num_heads, KVA_MAX_HEADS, size);
    if (head_dim_v < 8 || head_dim_v > 256 || head_dim_v % 8 != 0)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_create: head_dim_v = %d is unsupported (multiples of 8 "
                         "from 8 to 256 on CUDA)",
                         (int)head_dim_v);
    if (dtype != KVA_DTYPE_F32 && dtype != KVA_DTYPE_F16 && dtype != KVA_DTYPE_BF16)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_create: dtype %d (%s) is not f32, f16 or bf16", (int)dtype,
                         kva_dtype_name(dtype));
    kva_dcp_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_nccl_create: out of memory");
    c->ctx = ctx;
    c->comm = comm;
    c->size = size;
    c->rank = rank;
    c->max_tokens = max_tokens;
    c->num_heads = num_heads;
    c->head_dim_v = head_dim_v;
    c->dtype = dtype;
    c->es = kva_dtype_size(dtype);
    const size_t bytes = (size_t)max_tokens * num_heads * ((size_t)head_dim_v * c->es + 4);
    if (cudaMalloc(&c->send, bytes) != cudaSuccess || cudaMalloc(&c->recv, bytes) != cudaSuccess) {
        kva_dcp_nccl_destroy(c);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_dcp_nccl_create: cudaMalloc of 2 x %zu bytes failed", bytes);
    }
    *out = c;
    return KVA_STATUS_OK;
}

void kva_dcp_nccl_destroy(kva_dcp_nccl *c)
{
    if (!c)
        return;
    cudaFree(c->send);
    cudaFree(c->recv);
    free(c);
}

kva_status kva_dcp_nccl_combine(kva_dcp_nccl *c, kva_dcp_combine mode, int32_t num_tokens,
                                const void *out_part, const float *lse_part, void *out,
                                float *lse_out)
{
    kva__clear_error();
    KVA_CHECK_PTR(c);
    if (mode == KVA_DCP_COMBINE_AG_RS)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_combine: KVA_DCP_COMBINE_AG_RS over NCCL is planned; use "
                         "KVA_DCP_COMBINE_A2A");
    if (mode != KVA_DCP_COMBINE_A2A)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_combine: mode = %d is not a kva_dcp_combine", (int)mode);
    if (num_tokens < 0 || num_tokens > c->max_tokens)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_combine: num_tokens = %d is outside [0, max_tokens = %d]",
                         (int)num_tokens, (int)c->max_tokens);
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(out_part);
    KVA_CHECK_PTR(lse_part);
    KVA_CHECK_PTR(out);
    const int32_t N = c->size, H = c->num_heads, Hn = H / N, Dv = c->head_dim_v, T = num_tokens;
    const size_t out_bytes = (size_t)T * Hn * Dv * c->es, lse_bytes = (size_t)T * Hn * 4;
    const size_t block = out_bytes + lse_bytes, hrow = (size_t)Hn * Dv * c->es;
    void *stream = NULL;
    KVA_TRY(kva_cuda_context_get_stream(c->ctx, &stream));
    cudaStream_t s = (cudaStream_t)stream;
    for (int32_t k = 0; k < N; k++) {
        char *b = (char *)c->send + (size_t)k * block;
        cudaError_t e =
            cudaMemcpy2DAsync(b, hrow, (const char *)out_part + (size_t)k * hrow,
                              (size_t)H * Dv * c->es, hrow, (size_t)T, cudaMemcpyDeviceToDevice, s);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(b + out_bytes, (size_t)Hn * 4, lse_part + (size_t)k * Hn,
                                  (size_t)H * 4, (size_t)Hn * 4, (size_t)T,
                                  cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess)
            return kva__fail(KVA_STATUS_DEVICE_ERROR,
                             "kva_dcp_nccl_combine: packing block %d failed: %s", (int)k,
                             cudaGetErrorString(e));
    }
    ncclResult_t r = ncclGroupStart();
    for (int32_t k = 0; k < N && r == ncclSuccess; k++) {
        r = ncclSend((const char *)c->send + (size_t)k * block, block, ncclUint8, k, c->comm, s);
        if (r == ncclSuccess)
            r = ncclRecv((char *)c->recv + (size_t)k * block, block, ncclUint8, k, c->comm, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess)
        r = end;
    if (r != ncclSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_dcp_nccl_combine: the grouped send/recv failed: %s",
                         ncclGetErrorString(r));
    return kva_merge_states_n(c->ctx, N, T, Hn, Dv, c->dtype, c->recv, (int64_t)(block / c->es),
                              (const float *)((const char *)c->recv + out_bytes),
                              (int64_t)(block / 4), out, lse_out);
}
