/*
 * cuda_quant_util.h - helpers of the CUDA tests over quantized caches
 * (test_cuda_quant.c, test_cuda_quant_attn.c, test_cuda_quant_prefill.c):
 * the formats under test, contexts, a host (REF) and a device cache of one
 * desc, their storage sizes, the upload of a host cache's bytes and the
 * poisoning of the slots no request reads; make_params (random static
 * scales) is in cache_util.h. Needs the CUDA build (KVA_HAVE_CUDA).
 */
#ifndef KVA_TEST_CUDA_QUANT_UTIL_H
#define KVA_TEST_CUDA_QUANT_UTIL_H

#include "batchgen.h"
#include "cache_util.h"
#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

static const kva_quant fmts[] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                                 KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_INT8_TOKEN_K_V16,
                                 KVA_QUANT_FP8_E4M3};
/* The storage dtype of fmts[i] (V16: f16 then bf16 V). */
static inline kva_dtype fmt_dtype(int i)
{
    return fmts[i] == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
           : fmts[i] == KVA_QUANT_INT8_TOKEN_K_V16 ? (i == 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16)
                                                   : KVA_DTYPE_I8;
}
#define NFMT ((int)(sizeof fmts / sizeof fmts[0]))

static inline int quick(void)
{
    return getenv("KVA_TEST_QUICK") != NULL;
}

/* A context of backend b (CPU: 2 threads; REF and CUDA take none). */
static inline kva_context *make_ctx(kva_backend b)
{
    kva_context_desc cd = {b, b == KVA_BACKEND_CPU ? 2 : 0, 0};
    kva_context *c = NULL;
    CHECK_OK(kva_context_create(&cd, &c));
    return c;
}

/* A host (REF context) and a device cache of the same quantized desc. */
typedef struct qpair {
    kva_cache *hc, *dc;
} qpair;

static inline void qpair_create(kva_context *href, kva_context *gpu, const kva_cache_desc *cd,
                                const kva_quant_params *p, qpair *qp)
{
    qp->hc = qp->dc = NULL;
    CHECK_OK(kva_cache_create_quant(href, cd, p, &qp->hc));
    CHECK_OK(kva_cache_create_quant(gpu, cd, p, &qp->dc));
}

static inline void qpair_destroy(qpair *qp)
{
    kva_cache_destroy(qp->hc);
    kva_cache_destroy(qp->dc);
}

static inline size_t bytes_k(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_k(c);
}
static inline size_t bytes_v(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_v(c);
}
static inline size_t bytes_ts(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_scales(c);
}

/* Uploads a host quantized cache's bytes (K, V, token scales) to the device
 * cache of the same desc and scales. */
static inline void upload_quant(kva_cache *dc, const kva_cache *hc)
{
    cache_upload(dc, hc);
}

/* Makes every slot no request reads unreadable: token scales NaN, and the
 * slots' bytes 0xff (NaN for fp8 and 16-bit V; -1 for int8). */
static inline void poison_unread(kva_cache *hc, const kva_test_batch *b)
{
    const kva_cache_desc *d = &hc->desc;
    const int32_t B = d->block_size, Hkv = d->num_kv_heads;
    int32_t *used = calloc((size_t)d->num_blocks, sizeof(int32_t));
    for (int32_t r = 0; r < b->R; r++)
        for (int32_t j = 0; (int64_t)j * B < b->seq_lens[r]; j++) {
            const int32_t blk = b->block_table[(size_t)r * b->stride + j];
            const int32_t n = b->seq_lens[r] - j * B < B ? b->seq_lens[r] - j * B : B;
            if (n > used[blk])
                used[blk] = n;
        }
    for (int32_t blk = 0; blk < d->num_blocks; blk++)
        for (int32_t o = used[blk]; o < B; o++)
            for (int32_t h = 0; h < Hkv; h++) {
                const int64_t rk = kva__cache_row(d, blk, o, h, d->head_dim);
                const int64_t rv = kva__cache_row(d, blk, o, h, d->head_dim_v);
                memset((char *)hc->k + rk * (int64_t)hc->elem_size, 0xff,
                       (size_t)d->head_dim * hc->elem_size);
                memset((char *)hc->v + rv * (int64_t)hc->v_elem, 0xff,
                       (size_t)d->head_dim_v * hc->v_elem);
                if (hc->k_token_scale)
                    hc->k_token_scale[kva__token_scale_index(d, blk, o, h)] = NAN;
            }
    free(used);
}

#endif /* KVA_HAVE_CUDA */

#endif /* KVA_TEST_CUDA_QUANT_UTIL_H */
