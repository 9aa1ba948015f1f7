/*
 * bench_mla_sparse.h - `kvattn bench --mla-sparse` on CUDA
 * (bench_mla_sparse_cuda.c), called by bench_mla_sparse.c.
 */
#ifndef KVA_TOOLS_BENCH_MLA_SPARSE_H
#define KVA_TOOLS_BENCH_MLA_SPARSE_H

#include <stdint.h>

/* One CUDA shape: R requests of Q query tokens, seq_len S, H heads, top-K
 * random positions per token; fp8: fp8_ds_mla rows (else bf16); separate:
 * KVA_SPARSE_SEPARATE (else MIXED); kernel: the MLA registry kernel forced
 * (NULL: the dispatcher's choice); f16: q and out are f16 (else bf16;
 * fp8_ds_mla rows only: the CUDA kernel reads a 16-bit cache of q's dtype). */
typedef struct bench_sp_shape {
    const char *name;
    int32_t R, Q, S, H, K;
    int fp8, separate;
    const char *kernel;
    int f16;
} bench_sp_shape;

/* Times `one` (checked first against fp64 over the rows read back), or the
 * issue-17 suite when one is NULL, with medians of iters CUDA-event timings.
 * Returns a KVA_EXIT_* status: 1 when a check or call fails, 2 without CUDA. */
int bench_mla_sparse_cuda(const bench_sp_shape *one, int iters);

#endif
