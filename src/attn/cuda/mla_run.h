/*
 * mla_run.h - the CUDA backend's layer-level MLA (kva_mla_run): its plan
 * (built by cuda_plan_build into the context's workspace), its run, and the
 * GEMM and row-copy kernels it launches (mla_gemm.cu). C declarations; the
 * .cu files include it in extern "C".
 *
 * Shapes: T tokens, H heads, Dc latent width, Dr rotary width, Dn nope width,
 * Dv value width; Td / Tp the tokens of the absorbed / compute-friendly
 * requests.
 */
#ifndef KVA_CUDA_MLA_RUN_H
#define KVA_CUDA_MLA_RUN_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* Batched GEMM C[h][m, n] = sum_k A[h][m, k] B[h][k, n], h < heads, f16/bf16
 * in and out, fp32 accumulation (mla_gemm.cu). Element offsets:
 *   A (m, k) at a[a_row(m) * lda + h * a_head + k], a_row(m) = a_rows[m]
 *     (negative: a zero row) or m when a_rows is NULL;
 *   B (k, n) at b[h * b_head + k * ldb + n] (b_kn = 1) or
 *     b[h * b_head + n * ldb + k] (b_kn = 0);
 *   C (m, n) at c[c_row(m) * ldc + h * c_head + n] (negative c_row: skipped).
 * K, N, ld*, *_head multiples of 8; a, b 16-byte aligned, c 4-byte aligned.
 * Row maps are device arrays [M]. a_fp8: A holds FP8 E4M3 codes (1-byte
 * elements, converted exactly to the dtype in shared memory) and
 * C = c_scale * A B (in fp32, rounded once); otherwise c_scale is unused.
 * b2 non-NULL: a second product on the same A rows, C2 = (c_scale) A B2 with
 * B2, C2 laid out as B, C by ldb2, b2_head, b2_kn, ldc2, c2_head (same M, N,
 * K, row maps; the decompression's K and V halves), run in one launch by the
 * sm_90a form where it fits (B2 of the other majorness than B), else as two
 * products. Never synchronizes. */
typedef struct kva__cuda_mla_gemm_args {
    const void *a;
    const int32_t *a_rows;
    int64_t lda, a_head;
    const void *b;
    int64_t ldb, b_head;
    int b_kn;
    void *c;
    const int32_t *c_rows;
    int64_t ldc, c_head;
    int32_t M, N, K, heads;
    kva_dtype dtype;
    int a_fp8;
    float c_scale;
    const void *b2; /* NULL: one product */
    int64_t ldb2, b2_head;
    int b2_kn;
    void *c2;
    int64_t ldc2, c2_head;
    int mma_only; /* run the mma.sync form even where the wgmma one fits */
    int max_ctas; /* > 0: the wgmma form's persistent grid at most this many CTAs (tests) */
} kva__cuda_mla_gemm_args;
kva_status kva__cuda_mla_gemm(const kva__cuda_mla_gemm_args *g, void *stream);
/* The sm_90a wgmma form (mla_gemm_wgmma.cu): whether it takes g (an sm_90a
 * build on a compute capability 9.0 device, K % 64 == 0, N % 128 == 0, C and
 * C2 16-byte aligned; the other requirements are kva__cuda_mla_gemm's,
 * checked there), and its launch (called by kva__cuda_mla_gemm only). */
int kva__cuda_mla_gemm_wgmma_fits(const kva__cuda_mla_gemm_args *g);
kva_status kva__cuda_mla_gemm_wgmma(const kva__cuda_mla_gemm_args *g, void *stream);

/* Row copy of 2-byte elements: dst[d_row(m) * ldd + h * dst_head + e] =
 * src[s_row(m) * lds + h * src_head + e] for m < M, h < heads, e < width
 * (width, strides and heads' offsets multiples of 8, pointers 16-byte
 * aligned; src_fp8: 8-byte aligned); a negative source row writes zeros, a
 * negative destination row nothing; NULL maps are the identity. src_fp8:
 * the source holds FP8 E4M3 codes (1-byte elements), stored as
 * code * src_scale rounded once to dtype. */
typedef struct kva__cuda_mla_copy {
    const void *src;
    const int32_t *src_rows;
    int64_t lds, src_head;
    void *dst;
    const int32_t *dst_rows;
    int64_t ldd, dst_head;
    int32_t M, heads, width;
    int src_fp8;
    float src_scale;
    kva_dtype dtype; /* the destination's (src_fp8 only) */
} kva__cuda_mla_copy;
kva_status kva__cuda_mla_copy_rows(const kva__cuda_mla_copy *c, void *stream);

/* One attention pass of the compute-friendly path over decompressed keys:
 * round 0 the new tokens' keys (the plan's mask), rounds 1.. the cached
 * context in chunks (non-causal). Offsets are bytes into the MLA workspace. */
typedef struct kva__cuda_mla_round {
    int32_t keys;      /* workspace key rows decompressed (multiple of 64) */
    int32_t ntiles;    /* prefill tiles */
    int32_t bt_stride; /* block-table row length (64-key blocks) */
    int32_t causal;
    size_t off_seq, off_bt, off_tiles, off_ntiles, off_src;
} kva__cuda_mla_round;

/* The host side of a layer-level plan (kva__cuda_plan.mla). */
typedef struct kva__cuda_mla_plan {
    int32_t Dn, Dv, Dc, Dr;
    int32_t Td, Tp, rounds;
    int32_t kw;   /* key rows of the K / V workspace */
    size_t base;  /* byte offset of the MLA region in ctx->workspace */
    size_t bytes; /* its size */
    /* Byte offsets in the region: metadata, then the buffers. */
    size_t off_qsl_d, off_dtok, off_ptok, off_preq;
    size_t off_qabs, off_olat, off_lsed, off_kws, off_vws, off_part, off_plse, off_acc, off_lacc;
    kva__cuda_mla_round *round; /* [rounds] */
} kva__cuda_mla_plan;

/* Marks in skip [R] (host) the requests with q_len above the plan's decode
 * threshold (the compute-friendly ones, which leave the decode partition);
 * KVA_STATUS_UNSUPPORTED when there are some and no prefill kernel takes
 * D = Dn + Dr, Dv (called before anything is uploaded). */
kva_status kva__cuda_mla_split(const kva_plan *plan, uint8_t *skip);

/* The longest q_len the MLA decode kernel sees in plan: every request's for
 * a kernel-level plan, the absorbed requests' for a layer-level one (1 if
 * none); it sizes the decode kernel's items. */
int32_t kva__cuda_mla_decode_q_len(const kva_plan *plan);

/* Builds the layer-level plan of an MLA plan with mla head sizes (the
 * partition, for the absorbed requests only, is built already): chooses the
 * chunking, lays out the region at byte offset base of the workspace,
 * reserves it through reserve(ctx, base + bytes) and uploads the metadata on
 * stream. chunk_keys > 0 forces the context chunk (tests). *out is freed by
 * kva__cuda_mla_plan_free. */
kva_status kva__cuda_mla_plan_build(kva_context *ctx, const kva_plan *plan, size_t base,
                                    int32_t chunk_keys,
                                    kva_status (*reserve)(kva_context *, size_t), void *stream,
                                    kva__cuda_mla_plan **out);
void kva__cuda_mla_plan_free(kva__cuda_mla_plan *mp);

/* kva_mla_run on the CUDA backend (the table's mla_run). */
kva_status kva__cuda_mla_run(kva_context *ctx, const kva_plan *plan, const void *q,
                             const void *w_uk, const void *w_uv, const kva_cache *cache, void *out,
                             float *lse);

/* Benchmarks: kva_mla_run (arguments as its; no argument checks beyond the
 * context and plan) with CUDA events between its phases; synchronizes, then
 * ms[] holds each phase's milliseconds: the absorbed requests (projections,
 * decode, merge), and the compute-friendly requests' decompression,
 * attention (the prefill kernel) and LSE merges (zero where absent). */
enum {
    KVA__CUDA_MLA_PHASE_ABSORBED = 0,
    KVA__CUDA_MLA_PHASE_DECOMPRESS,
    KVA__CUDA_MLA_PHASE_ATTENTION,
    KVA__CUDA_MLA_PHASE_MERGE,
    KVA__CUDA_MLA_PHASES
};
kva_status kva__cuda_mla_run_timed(kva_context *ctx, const kva_plan *plan, const void *q,
                                   const void *w_uk, const void *w_uv, const kva_cache *cache,
                                   void *out, float *lse, float ms[KVA__CUDA_MLA_PHASES]);

#endif /* KVA_CUDA_MLA_RUN_H */
