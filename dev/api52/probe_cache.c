/* Probe of kvattn_cache.h's read / write / copy promises (dev, not a test). */
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include "kvattn.h"
#define P(name, call) do { kva_status s_ = (call); printf("%-48s %s %s\n", name, kva_status_name(s_), s_ ? kva_last_error() : ""); } while (0)
int main(void)
{
    kva_context *ctx;
    kva_context_desc cdsc = {0};
    cdsc.backend = KVA_BACKEND_CPU;
    kva_context_create(&cdsc, &ctx);
    kva_cache_desc d = {4, 4, 2, 8, 8, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    kva_cache *c;
    P("create", kva_cache_create(ctx, &d, &c));
    float k[16 * 16], v[16 * 16], buf[64 * 16];
    for (int i = 0; i < 256; i++) k[i] = (float)i, v[i] = -(float)i;
    int64_t slots[4] = {0, 1, 5, 6};
    P("write 4", kva_cache_write(ctx, c, 4, k, 0, v, 0, KVA_DTYPE_F32, slots));
    P("read k stride 1 (rows overlap each other)", kva_cache_read(ctx, c, 2, slots, buf, 1, NULL, 0, KVA_DTYPE_F32));
    P("read k stride -16", kva_cache_read(ctx, c, 2, slots, buf + 32, -16, NULL, 0, KVA_DTYPE_F32));
    P("read k,v interleaved stride 32", kva_cache_read(ctx, c, 2, slots, buf, 32, buf + 16, 32, KVA_DTYPE_F32));
    P("read k,v interleaved stride 16 (overlap)", kva_cache_read(ctx, c, 2, slots, buf, 32, buf + 8, 32, KVA_DTYPE_F32));
    P("read 0 tokens NULL map", kva_cache_read(ctx, c, 0, NULL, buf, 0, buf + 16, 0, KVA_DTYPE_F32));
    P("read both NULL", kva_cache_read(ctx, c, 1, slots, NULL, 0, NULL, 0, KVA_DTYPE_F32));
    P("read dst I8", kva_cache_read(ctx, c, 1, slots, buf, 0, NULL, 0, KVA_DTYPE_I8));
    int64_t bad[1] = {16};
    P("read slot NB*B", kva_cache_read(ctx, c, 1, bad, buf, 0, NULL, 0, KVA_DTYPE_F32));
    int64_t neg[2] = {-1, -7};
    buf[0] = 12345.f;
    P("read negative slots", kva_cache_read(ctx, c, 2, neg, buf, 0, NULL, 0, KVA_DTYPE_F32));
    printf("  buf[0] after = %g (12345 expected)\n", buf[0]);
    P("write stride 1 (overlapping src rows)", kva_cache_write(ctx, c, 2, k, 1, v, 1, KVA_DTYPE_F32, slots));
    P("write stride -16", kva_cache_write(ctx, c, 2, k + 32, -16, v + 32, -16, KVA_DTYPE_F32, slots));
    P("write 0 tokens NULL", kva_cache_write(ctx, c, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
    P("write k NULL 1 token", kva_cache_write(ctx, c, 1, NULL, 0, v, 0, KVA_DTYPE_F32, slots));
    int32_t pairs[6] = {0, 0};
    P("copy (0,0)", kva_cache_copy_blocks(ctx, c, pairs, 1));
    int32_t ch[4] = {0, 1, 1, 2};
    P("copy chain (0,1),(1,2)", kva_cache_copy_blocks(ctx, c, ch, 2));
    int32_t sw[4] = {0, 1, 1, 0};
    P("copy swap (0,1),(1,0)", kva_cache_copy_blocks(ctx, c, sw, 2));
    int32_t neg2[2] = {-1, 1};
    P("copy src -1", kva_cache_copy_blocks(ctx, c, neg2, 1));
    P("copy 0 pairs NULL", kva_cache_copy_blocks(ctx, c, NULL, 0));
    /* create_from_interleaved: Dv != D */
    kva_cache_desc di = {2, 4, 1, 8, 16, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    kva_cache *ci = NULL;
    P("interleaved Dv != D", kva_cache_create_from_interleaved(ctx, &di, buf, &ci));
    di.head_dim_v = 0; di.quant = KVA_QUANT_FP8_E4M3; di.dtype = KVA_DTYPE_FP8_E4M3;
    P("interleaved quant", kva_cache_create_from_interleaved(ctx, &di, buf, &ci));
    di.quant = KVA_QUANT_NONE; di.dtype = KVA_DTYPE_F32; di.kind = KVA_ATTN_MLA; di.head_dim_v = 0;
    P("interleaved MLA", kva_cache_create_from_interleaved(ctx, &di, buf, &ci));
    /* create_quant with params for NONE */
    float one = 1.0f;
    kva_quant_params qp = {&one, 1, NULL, 0, &one, 1, NULL, 0};
    kva_cache *cq = NULL;
    P("create_quant NONE with params", kva_cache_create_quant(ctx, &d, &qp, &cq));
    kva_cache_desc d8 = d; d8.quant = KVA_QUANT_FP8_E4M3; d8.dtype = KVA_DTYPE_FP8_E4M3;
    float sc3[3] = {1, 1, 1};
    kva_quant_params q3 = {sc3, 3, NULL, 0, &one, 1, NULL, 0};
    P("fp8 k_scale len 3 (Hkv 2)", kva_cache_create_quant(ctx, &d8, &q3, &cq));
    float scz = 0.f;
    kva_quant_params qz = {&scz, 1, NULL, 0, &one, 1, NULL, 0};
    P("fp8 k_scale 0", kva_cache_create_quant(ctx, &d8, &qz, &cq));
    kva_quant_params qo = {&one, 1, &one, 1, &one, 1, NULL, 0};
    P("fp8 with k_offset", kva_cache_create_quant(ctx, &d8, &qo, &cq));
    kva_quant_params qhd = {k, 16, NULL, 0, &one, 1, NULL, 0};
    for (int i = 0; i < 16; i++) k[i] = 1.0f;
    P("fp8 k_scale len Hkv*D (per channel)", kva_cache_create_quant(ctx, &d8, &qhd, &cq));
    kva_cache_desc dt = d; dt.quant = KVA_QUANT_INT8_TOKEN_K_V16; dt.dtype = KVA_DTYPE_F32;
    P("int8_token_k_v16 dtype f32", kva_cache_create(ctx, &dt, &cq));
    dt.dtype = KVA_DTYPE_F16;
    kva_quant_params qv = {NULL, 0, NULL, 0, &one, 1, NULL, 0};
    P("int8_token_k_v16 with v_scale", kva_cache_create_quant(ctx, &dt, &qv, &cq));
    kva_cache_desc dk = d; dk.quant = KVA_QUANT_INT8_TOKEN_K; dk.dtype = KVA_DTYPE_I8;
    kva_quant_params qk = {&one, 1, NULL, 0, &one, 1, NULL, 0};
    P("int8_token_k with k_scale", kva_cache_create_quant(ctx, &dk, &qk, &cq));
    kva_cache_desc dn = d; dn.num_blocks = 0;
    P("NB 0", kva_cache_create(ctx, &dn, &cq));
    dn = d; dn.layout = (kva_layout)2;
    P("layout 2", kva_cache_create(ctx, &dn, &cq));
    dn = d; dn.kind = KVA_ATTN_INDEX; dn.head_dim_v = 16;
    P("index Dv 16 != D 8", kva_cache_create(ctx, &dn, &cq));
    dn = d; dn.kind = KVA_ATTN_INDEX; dn.num_kv_heads = 1;
    P("index Dv = D", kva_cache_create(ctx, &dn, &cq));
    dn = d; dn.kind = KVA_ATTN_MLA; dn.num_kv_heads = 1; dn.head_dim = 16; dn.head_dim_v = 8;
    P("MLA Dc 8 Dr 8", kva_cache_create(ctx, &dn, &cq));
    dn.head_dim = 24; dn.head_dim_v = 8;
    P("MLA Dc 8 Dr 16", kva_cache_create(ctx, &dn, &cq));
    dn.head_dim = 16; dn.head_dim_v = 16;
    P("MLA Dv = D", kva_cache_create(ctx, &dn, &cq));
    dn.head_dim = 16; dn.head_dim_v = 0;
    P("MLA Dv 0", kva_cache_create(ctx, &dn, &cq));
    return 0;
}
