/*
 * kvattn_dcp.h - decode context parallelism helpers: the local lengths and cache slots of a rank
 * of a sharded cache (docs/dcp.md). The combines are kva_merge_states_n
 * (kvattn.h), kvattn_mpi.h and kvattn_nccl.h.
 * Included by kvattn.h; may be included on its own.
 */
#ifndef KVATTN_DCP_H
#define KVATTN_DCP_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Decode context parallelism helpers (docs/dcp.md)                          */
/* ------------------------------------------------------------------------ */

/*
 * How the communicator-backed combines (kvattn_mpi.h, kvattn_nccl.h) move
 * the ranks' partials; every mode leaves rank k with the exact result for its
 * H / N heads [k * H/N, (k+1) * H/N), as vLLM's DCP does.
 */
typedef enum kva_dcp_combine {
    /* All-gather the LSEs [N, T, H], rescale the rank's partial by its
     * weight, reduce-scatter (sum) the rescaled partials over the heads in
     * float32 (vLLM's cp_lse_ag_out_rs). */
    KVA_DCP_COMBINE_AG_RS = 0,
    /* One all-to-all of packed [out | lse] blocks (each rank sends rank k
     * its partial for k's heads, in the output dtype), then a local
     * kva_merge_states_n of the N received blocks (vLLM's packed all-to-all). */
    KVA_DCP_COMBINE_A2A = 1,
    /* NCCL only (kvattn_nccl.h; the MPI combine returns UNSUPPORTED): one
     * kernel over NCCL's device API (NCCL >= 2.28, symmetric memory, all
     * ranks load/store accessible, e.g. one NVLink domain). kvattn allocates
     * the window (ncclMemAlloc + ncclCommWindowRegister, collective) at the
     * first kva_dcp_nccl_partials, which must come before any LSA combine,
     * outside graph capture. Partials in the caller's own buffer are pushed:
     * the kernel stores each peer's rows into that peer's window over NVLink,
     * waits at one device-side barrier and merges the rows it received as
     * kva_merge_states_n (two receive areas alternate between calls; the
     * parity lives on the device). Partials given in the window
     * (kva_dcp_nccl_partials' pointers, written by kva_attention_run) are
     * pushed the same way up to 8 MiB (T * H * Dv * element size) and pulled
     * above it: after a barrier each rank reads its heads' rows from the
     * peers' windows, then a second barrier (no peer reads this rank's
     * partials after it). Either way graph-capturable and replayable. */
    KVA_DCP_COMBINE_LSA = 2,
    KVA_DCP_COMBINE_COUNT_
} kva_dcp_combine;

/*
 * The tokens rank dcp_rank holds of each request: local_lens[r] = the number
 * of positions i < seq_lens[r] with (i / I) mod N == rank (at most
 * ceil(seq_len / (N * I)) * I). Local token k of the rank is global position
 * ((k / I) * N + rank) * I + k % I, and it lives at local slot
 * block_table_row[k / B] * B + k % B of the rank's cache. dcp_size 0 or 1 and
 * dcp_interleave 0 mean 1, as in kva_plan_desc. local_lens may be seq_lens
 * itself (in place); any other overlap is refused (KVA_STATUS_INVALID_ARGUMENT).
 */
KVA_API kva_status kva_dcp_local_lens(int32_t num_requests, const int32_t *seq_lens,
                                      int32_t dcp_size, int32_t dcp_rank, int32_t dcp_interleave,
                                      int32_t *local_lens);

/*
 * The slot mapping for kva_cache_write on rank dcp_rank of count new tokens
 * of one request at global positions first_pos .. first_pos + count - 1:
 * slots [count] int64 receives the local slot of each token the rank holds
 * (through the rank's block-table row [row_len], block size B) and -1 for the
 * others, which kva_cache_write skips. Every rank is given the same K/V rows
 * and keeps its own. The row must cover every local token named
 * (KVA_STATUS_OUT_OF_RANGE otherwise, nothing written); slots must not
 * overlap the row (KVA_STATUS_INVALID_ARGUMENT).
 */
KVA_API kva_status kva_dcp_slots(int32_t dcp_size, int32_t dcp_rank, int32_t dcp_interleave,
                                 int32_t block_size, const int32_t *block_table_row,
                                 int32_t row_len, int32_t first_pos, int32_t count, int64_t *slots);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_DCP_H */
