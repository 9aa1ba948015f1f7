/*
 * kvattn_mpi.h - the decode-context-parallel combine over MPI, for the
 * reference and CPU backends (library kvattn_mpi, built when CMake finds
 * MPI; docs/dcp.md).
 *
 * The engine owns its process group: it passes the MPI communicator of its
 * DCP group once, at kva_dcp_mpi_create; kvattn only issues collectives on
 * it (never duplicates, splits or frees it; the A2A combine of ranks on one
 * host makes an MPI shared-memory window over it at its first call). The communicator's size is N
 * (dcp_size) and each process's rank in it must be the dcp_rank of its plans.
 * Every rank calls kva_dcp_mpi_combine for the same step in the same order,
 * like any MPI collective.
 *
 *   kva_dcp_mpi_create(ctx, comm, max_tokens, H, Dv, dtype, &dcp);   once
 *   each layer:
 *     kva_dcp_mpi_partials(dcp, T, &part, &part_lse);   optional: no copy
 *     kva_attention_run(ctx, sharded_plan, q, cache, sinks, part, part_lse);
 *     kva_dcp_mpi_combine(dcp, KVA_DCP_COMBINE_A2A, T, part, part_lse, out, lse);
 *   kva_dcp_mpi_destroy(dcp);
 */
#ifndef KVATTN_MPI_H
#define KVATTN_MPI_H

#include "kvattn.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kva_dcp_mpi kva_dcp_mpi;

/*
 * Makes the combine of one DCP group: its buffers for up to max_tokens query
 * tokens of H heads (H a multiple of the communicator's size N) and head
 * size Dv, outputs in dtype (F32, F16 or BF16). ctx is a host context (ref
 * or CPU: KVA_STATUS_UNSUPPORTED for CUDA) that runs the local merge. Not a
 * collective: ranks may create theirs at different times.
 */
KVA_API kva_status kva_dcp_mpi_create(kva_context *ctx, MPI_Comm comm, int32_t max_tokens,
                                      int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                      kva_dcp_mpi **out);
/* NULL is a no-op. A collective (every rank, before MPI_Finalize) once an
 * A2A combine ran with every rank on one host: it frees the shared-memory
 * window of that path (MPI_Win_free). */
KVA_API void kva_dcp_mpi_destroy(kva_dcp_mpi *dcp);

/*
 * The combine (a collective over the communicator). out_part: [T, H, Dv] in
 * dtype and lse_part: [T, H] float32, this rank's kva_attention_run of its
 * sharded plan; out: [T, H/N, Dv] in dtype and lse_out: [T, H/N] float32 (or
 * NULL) receive the full attention of this rank's heads k*H/N .. (k+1)*H/N - 1
 * (kva_merge_states_n's semantics for empty and NaN parts). T = num_tokens
 * <= max_tokens. An MPI error returns KVA_STATUS_DEVICE_ERROR with MPI's
 * message (MPI's default error handler aborts before that: set
 * MPI_ERRORS_RETURN on the communicator to get it).
 */
/*
 * Where the sharded kva_attention_run of this rank writes its partial for the
 * next combine of num_tokens tokens, so that the A2A combine need not copy
 * it: *out_part [T, H, Dv] in dtype and *lse_part [T, H] float32. With every
 * rank on one host they lie in the combine's shared-memory window, and an A2A
 * combine given exactly these two pointers skips its pack (the ranks merge
 * each other's rows in place); otherwise they are a buffer of the combine's,
 * packed as any other. Valid until that combine ran: each A2A combine on the
 * window moves to the other of two buffers, so ask again for the next step.
 * Every rank of a combine passes its partials buffer, or none does (the
 * merge reads the peers' buffers in the layout of its own choice). The first
 * call is a collective (it makes the window, as the first A2A combine
 * would); later calls are local.
 */
KVA_API kva_status kva_dcp_mpi_partials(kva_dcp_mpi *dcp, int32_t num_tokens, void **out_part,
                                        float **lse_part);

KVA_API kva_status kva_dcp_mpi_combine(kva_dcp_mpi *dcp, kva_dcp_combine mode, int32_t num_tokens,
                                       const void *out_part, const float *lse_part, void *out,
                                       float *lse_out);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_MPI_H */
