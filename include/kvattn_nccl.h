/*
 * kvattn_nccl.h - the decode-context-parallel combine over NCCL, for the
 * CUDA backend (library kvattn_nccl, built when CMake finds NCCL, e.g. the
 * PyPI nvidia-nccl-cu13 wheel; docs/dcp.md).
 *
 * The engine owns its process group: it passes the ncclComm_t of its DCP
 * group once, at kva_dcp_nccl_create; kvattn only enqueues NCCL calls on it
 * (never creates, splits or destroys it). The communicator's size is N
 * (dcp_size), each rank's NCCL rank must be the dcp_rank of its plans, and
 * every call is enqueued on the CUDA context's stream (kva_cuda_context_set_stream),
 * so a combine can be captured in a CUDA graph with the attention.
 */
#ifndef KVATTN_NCCL_H
#define KVATTN_NCCL_H

#include "kvattn.h"

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kva_dcp_nccl kva_dcp_nccl;

/*
 * Makes the combine of one DCP group on CUDA context ctx: device buffers for
 * up to max_tokens query tokens of H heads (a multiple of N) and head size Dv,
 * outputs in dtype (F32, F16 or BF16). Allocates (not on the run path).
 */
KVA_API kva_status kva_dcp_nccl_create(kva_context *ctx, ncclComm_t comm, int32_t max_tokens,
                                       int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                       kva_dcp_nccl **out);
/* NULL is a no-op. Collective (every rank) once kva_dcp_nccl_partials made
 * the LSA window: its deregistration is. */
KVA_API void kva_dcp_nccl_destroy(kva_dcp_nccl *dcp);

/*
 * The LSA combine's window (KVA_DCP_COMBINE_LSA, kvattn_dcp.h): this rank's
 * partials inside it, out_part [max_tokens, H, Dv] in dtype and lse_part
 * [max_tokens, H] float32 (fixed addresses: a T-token step uses the first T
 * rows of each). The first call allocates the window with ncclMemAlloc,
 * registers it as a symmetric window and makes NCCL's device communicator:
 * a collective (every rank, in the same order as the other NCCL calls),
 * outside graph capture; later calls return the same pointers. Write the
 * sharded kva_attention_run's out and lse there and the LSA combine lets
 * the peers read large ones in place (kvattn_dcp.h). KVA_STATUS_UNSUPPORTED
 * (nothing allocated) when NCCL has no device API, the ranks cannot load and
 * store each other's memory, or the libnccl loaded is not the version of the
 * headers kvattn_nccl was built with (the message names both).
 */
KVA_API kva_status kva_dcp_nccl_partials(kva_dcp_nccl *dcp, void **out_part, float **lse_part);

/*
 * The combine, enqueued on the context's stream (no host synchronization).
 * Device tensors: out_part [T, H, Dv] in dtype and lse_part [T, H] float32
 * (this rank's sharded kva_attention_run); out [T, H/N, Dv] and lse_out
 * [T, H/N] (or NULL) receive the full attention of this rank's heads, as
 * kvattn_mpi.h's. Modes: KVA_DCP_COMBINE_A2A (a pack kernel, grouped
 * ncclSend/ncclRecv of the packed blocks with the other ranks, a merge
 * kernel) and KVA_DCP_COMBINE_AG_RS (ncclAllGather of the LSEs, a rescale
 * kernel, ncclReduceScatter of the float32 rescaled rows, a conversion
 * kernel), and KVA_DCP_COMBINE_LSA (one kernel over NCCL's device API,
 * kvattn_dcp.h: the rows pushed into the peers' windows and one device-side
 * barrier, or large partials in the window pulled between two; needs
 * kva_dcp_nccl_partials first; out_part / lse_part either the window's
 * partials or outside the window; out and lse_out outside it). An NCCL error returns
 * KVA_STATUS_DEVICE_ERROR with ncclGetErrorString's text.
 */
KVA_API kva_status kva_dcp_nccl_combine(kva_dcp_nccl *dcp, kva_dcp_combine mode, int32_t num_tokens,
                                        const void *out_part, const float *lse_part, void *out,
                                        float *lse_out);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_NCCL_H */
