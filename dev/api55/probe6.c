/* probe6: cache descriptors of the other kinds, sparse / indexer strides. */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    kva_context *ctx; kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0}; kva_context_create(&cd, &ctx);
    kva_cache *c = NULL; kva_cache_desc g;
    kva_cache_desc ix = {4, 4, 1, 32, 0, KVA_DTYPE_F32, 0, 0, KVA_ATTN_INDEX};
    P(kva_cache_create(ctx, &ix, &c)); kva_cache_get_desc(c, &g); printf("  index Dv %d bytes_v %zu\n", g.head_dim_v, kva_cache_block_bytes_v(c)); kva_cache_destroy(c); c = NULL;
    ix.head_dim_v = 16; P(kva_cache_create(ctx, &ix, &c)); kva_cache_destroy(c); c = NULL;
    ix.head_dim_v = 32; P(kva_cache_create(ctx, &ix, &c)); kva_cache_destroy(c); c = NULL;
    ix.head_dim_v = 0; ix.num_kv_heads = 2; P(kva_cache_create(ctx, &ix, &c)); kva_cache_destroy(c); c = NULL;
    ix.num_kv_heads = 1; ix.quant = KVA_QUANT_FP8_TOKEN; ix.dtype = KVA_DTYPE_FP8_E4M3; P(kva_cache_create(ctx, &ix, &c));
    if (c) printf("  fp8_token bytes_k %zu (want %d)\n", kva_cache_block_bytes_k(c), 4 * (32 + 4));
    kva_cache_destroy(c); c = NULL;
    ix.dtype = KVA_DTYPE_F16; P(kva_cache_create(ctx, &ix, &c)); kva_cache_destroy(c); c = NULL;
    float buf[4096];
    kva_cache_desc ml = {4, 4, 1, 80, 64, KVA_DTYPE_F32, 0, 0, KVA_ATTN_MLA};
    P(kva_cache_create_from(ctx, &ml, buf, buf + 2000, &c)); kva_cache_destroy(c); c = NULL;
    P(kva_cache_create_from(ctx, &ml, buf, NULL, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim_v = 80; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim_v = 0; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim_v = 72; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim_v = 88; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim_v = 64; ml.num_kv_heads = 2; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.num_kv_heads = 1; ml.quant = KVA_QUANT_FP8_DS_MLA; ml.dtype = KVA_DTYPE_FP8_E4M3; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    ml.head_dim = 128 + 64; ml.head_dim_v = 128; P(kva_cache_create(ctx, &ml, &c));
    if (c) printf("  ds_mla bytes_k %zu (want %d) v %zu\n", kva_cache_block_bytes_k(c), 4 * (128 + 4 + 128), kva_cache_block_bytes_v(c));
    kva_cache_destroy(c); c = NULL;
    ml.quant = KVA_QUANT_INT8_CHANNEL; ml.dtype = KVA_DTYPE_I8; P(kva_cache_create(ctx, &ml, &c)); kva_cache_destroy(c); c = NULL;
    kva_cache_desc mh = {4, 4, 2, 16, 0, KVA_DTYPE_F32, 0, KVA_QUANT_FP8_TOKEN, 0};
    mh.dtype = KVA_DTYPE_FP8_E4M3; P(kva_cache_create(ctx, &mh, &c)); kva_cache_destroy(c); c = NULL;
    mh.quant = KVA_QUANT_FP8_DS_MLA; P(kva_cache_create(ctx, &mh, &c)); kva_cache_destroy(c); c = NULL;
    kva_cache_desc iv = {3, 4, 2, 16, 8, KVA_DTYPE_F32, 0, 0, 0};
    P(kva_cache_create_from_interleaved(ctx, &iv, buf, &c)); kva_cache_destroy(c); c = NULL;
    iv.head_dim_v = 0; iv.num_blocks = 1; P(kva_cache_create_from_interleaved(ctx, &iv, buf, &c));
    if (c) { kva_cache_get_desc(c, &g); printf("  interleaved NP 1: NB %d\n", g.num_blocks); } kva_cache_destroy(c); c = NULL;
    iv.kind = KVA_ATTN_MLA; iv.num_kv_heads = 1; iv.head_dim = 24; iv.head_dim_v = 16; P(kva_cache_create_from_interleaved(ctx, &iv, buf, &c)); kva_cache_destroy(c); c = NULL;
    iv.kind = 0; iv.num_kv_heads = 2; iv.head_dim = 16; iv.head_dim_v = 0; iv.num_blocks = (1 << 30); P(kva_cache_create_from_interleaved(ctx, &iv, buf, &c)); kva_cache_destroy(c); c = NULL;
    /* a cache of num_blocks * block_size > INT32_MAX slots (caller storage) */
    kva_cache_desc hg = {1 << 20, 4096, 1, 8, 0, KVA_DTYPE_F32, 0, 0, 0};
    P(kva_cache_create_from(ctx, &hg, buf, buf + 8, &c));
    if (c) { int64_t s = (int64_t)(1 << 20) * 4096; float kk[8] = {0}; P(kva_cache_write(ctx, c, 1, kk, 0, kk, 0, KVA_DTYPE_F32, &s)); kva_cache_destroy(c); c = NULL; }
    kva_context_destroy(ctx);
    return 0;
}
