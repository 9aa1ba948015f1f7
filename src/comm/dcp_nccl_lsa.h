/*
 * dcp_nccl_lsa.h - the one-kernel NCCL combine (KVA_DCP_COMBINE_LSA) that
 * dcp_nccl.c drives: its window, device communicator and kernel live in
 * dcp_nccl_lsa.cu (a stub when NCCL has no device API).
 */
#ifndef KVA_DCP_NCCL_LSA_H
#define KVA_DCP_NCCL_LSA_H

#include "kvattn.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kva__dcp_lsa kva__dcp_lsa;

/* Collective over comm (every rank, the same sizes): allocates the
 * symmetric window for partials of part_bytes ([max_tokens][H][Dv] in dtype
 * dt) and lse_bytes ([max_tokens][H] float32) and the device communicator.
 * Returns 0, or 1 with the reason in msg (nothing left allocated). */
int kva__dcp_lsa_create(ncclComm_t comm, kva_dtype dt, size_t part_bytes, size_t lse_bytes,
                        kva__dcp_lsa **out, char *msg, size_t msg_len);
/* Collective too (the window's deregistration); NULL is a no-op. */
void kva__dcp_lsa_destroy(kva__dcp_lsa *l);
/* This rank's partials in the window: out [max_tokens][H][Dv] at *part, lse
 * [max_tokens][H] at *lse; *bytes: the window's size (both lie inside it). */
void kva__dcp_lsa_partials(const kva__dcp_lsa *l, void **part, float **lse, size_t *bytes);
/* The combine kernel on stream s (dcp_nccl_lsa.cu's top): part [T][H][Dv]
 * and lse_part [T][H] are this rank's partial (in_window = 1: the window's
 * own, pulled by the peers above KVA_LSA_PULL_BYTES, else pushed; 0:
 * elsewhere, pushed); out [T][H/N][Dv], lse_out [T][H/N] (or NULL). */
cudaError_t kva__dcp_lsa_combine(const kva__dcp_lsa *l, cudaStream_t s, kva_dtype dt, int32_t N,
                                 int32_t T, int32_t H, int32_t Dv, int32_t rank, int in_window,
                                 const void *part, const float *lse_part, void *out,
                                 float *lse_out);

#ifdef __cplusplus
}
#endif

#endif /* KVA_DCP_NCCL_LSA_H */
