/*
 * indexer_cpu.h - the CPU lightning indexer (indexer_cpu.c) and its SIMD
 * tile kernels (indexer_avx2.c, indexer_avx512.c), chosen by ISA level at
 * run time (kva__cpu_isa_of: KVA_CPU_ISA lowers it for tests).
 */
#ifndef KVA_INDEXER_CPU_H
#define KVA_INDEXER_CPU_H

#include "internal.h"

/* Keys per tile of the widest kernel (AVX-512: 16 floats). */
#define KVA_INDEX_TILE_MAX 16

/*
 * The logits of one tile of W keys for one query token:
 *   q:   [Hi, D] float32, the token's index queries;
 *   w:   [Hi] float32, the head weights;
 *   kt:  [D, W] float32, the tile's key values (FP8_TOKEN: the codes),
 *        transposed so a vector load reads one channel of W keys;
 *   sc:  [W] float32, each key's scale (1 for unquantized caches);
 *   out: [W] float32: out[j] = sc[j] * sum_h w[h] * relu(<q[h], kt[:, j]>),
 *        ReLU keeping NaN, fp32 accumulation.
 */
typedef void (*kva__index_tile_fn)(const float *q, const float *w, const float *kt, const float *sc,
                                   int32_t Hi, int32_t D, float *out);

void kva__index_tile_avx2(const float *q, const float *w, const float *kt, const float *sc,
                          int32_t Hi, int32_t D, float *out); /* W = 8 */
void kva__index_tile_avx512(const float *q, const float *w, const float *kt, const float *sc,
                            int32_t Hi, int32_t D, float *out); /* W = 16 */

/* Workspace bytes of an indexer plan on nt threads; kva__backend_ops.indexer. */
size_t kva__cpu_indexer_workspace(const kva_plan *plan, int32_t nt);
kva_status kva__cpu_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                            const float *weights, const kva_cache *cache, int32_t *indices,
                            int64_t indices_stride, int32_t *topk_length);

#endif /* KVA_INDEXER_CPU_H */
