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
#include "dcp_group.h"
#include "kvattn_cuda.h"
#include "kvattn_nccl.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

struct kva_dcp_nccl {
    kva__dcp_group g;
    ncclComm_t comm;
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
    kva__dcp_group g;
    KVA_TRY(kva__dcp_group_init("kva_dcp_nccl_create", ctx, size, rank, max_tokens, num_heads,
                                head_dim_v, 256, dtype, &g)); /* 256: the CUDA backend's Dv */
    kva_dcp_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_nccl_create: out of memory");
    c->g = g;
    c->comm = comm;
    const size_t bytes = (size_t)max_tokens * num_heads * ((size_t)head_dim_v * c->g.es + 4);
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
    KVA_TRY(
        kva__dcp_group_check("kva_dcp_nccl_combine", &c->g, num_tokens, out_part, lse_part, out));
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    const int32_t N = c->g.size, H = c->g.num_heads, Hn = H / N, Dv = c->g.head_dim_v,
                  T = num_tokens;
    const size_t out_bytes = (size_t)T * Hn * Dv * c->g.es, lse_bytes = (size_t)T * Hn * 4;
    const size_t block = out_bytes + lse_bytes, hrow = (size_t)Hn * Dv * c->g.es;
    void *stream = NULL;
    KVA_TRY(kva_cuda_context_get_stream(c->g.ctx, &stream));
    cudaStream_t s = (cudaStream_t)stream;
    for (int32_t k = 0; k < N; k++) {
        char *b = (char *)c->send + (size_t)k * block;
        cudaError_t e = cudaMemcpy2DAsync(b, hrow, (const char *)out_part + (size_t)k * hrow,
                                          (size_t)H * Dv * c->g.es, hrow, (size_t)T,
                                          cudaMemcpyDeviceToDevice, s);
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
    return kva_merge_states_n(
        c->g.ctx, N, T, Hn, Dv, c->g.dtype, c->recv, (int64_t)(block / c->g.es),
        (const float *)((const char *)c->recv + out_bytes), (int64_t)(block / 4), out, lse_out);
}
