/* probe14: copy / swap move every format's block bytes, per-token scales and packed scales included:
 * a block read back after copy / swap equals its source read back (kvattn_cache.h). */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { kva_attn_kind kind; kva_quant q; kva_dtype dt; int32_t hkv, d, dv; kva_layout lay; } F;
int main(void)
{
    static const F fs[] = {
        {0, KVA_QUANT_NONE, KVA_DTYPE_BF16, 2, 16, 8, KVA_LAYOUT_HND},
        {0, KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, 2, 16, 8, KVA_LAYOUT_NHD},
        {0, KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, 2, 16, 8, KVA_LAYOUT_HND},
        {0, KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_F16, 2, 16, 8, KVA_LAYOUT_NHD},
        {0, KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 2, 16, 8, KVA_LAYOUT_HND},
        {KVA_ATTN_MLA, KVA_QUANT_NONE, KVA_DTYPE_F32, 1, 80, 64, 0},
        {KVA_ATTN_MLA, KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 1, 80, 64, 0},
        {KVA_ATTN_MLA, KVA_QUANT_FP8_DS_MLA, KVA_DTYPE_FP8_E4M3, 1, 192, 128, 0},
        {KVA_ATTN_INDEX, KVA_QUANT_NONE, KVA_DTYPE_F16, 1, 32, 0, 0},
        {KVA_ATTN_INDEX, KVA_QUANT_FP8_TOKEN, KVA_DTYPE_FP8_E4M3, 1, 32, 0, 0},
    };
    kva_context_desc cds[2] = {{KVA_BACKEND_REF, 1, 0}, {KVA_BACKEND_CPU, 2, 0}};
    kva_context *ctx[2]; kva_context_create(&cds[0], &ctx[0]); kva_context_create(&cds[1], &ctx[1]);
    int bad = 0;
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++)
        for (int b = 0; b < 2; b++) {
            const F *x = &fs[f];
            enum { NB = 6, B = 3 };
            kva_cache_desc d = {NB, B, x->hkv, x->d, x->dv, x->dt, x->lay, x->q, x->kind};
            float one = 0.05f; kva_quant_params qp = {&one, 1, NULL, 0, &one, 1, NULL, 0};
            kva_quant_params *pp = x->q == KVA_QUANT_INT8_CHANNEL ? &qp : x->q == KVA_QUANT_INT8_TOKEN_K ? &(kva_quant_params){NULL, 0, NULL, 0, &one, 1, NULL, 0} : x->q == KVA_QUANT_FP8_E4M3 ? &(kva_quant_params){&one, 1, NULL, 0, x->kind ? NULL : &one, x->kind ? 0 : 1, NULL, 0} : NULL;
            kva_cache *c, *c2; 
            if (kva_cache_create_quant(ctx[b], &d, pp, &c) || kva_cache_create_quant(ctx[1 - b], &d, pp, &c2)) { printf("%zu create %s\n", f, kva_last_error()); bad++; continue; }
            const int32_t kw = x->kind == KVA_ATTN_MLA ? x->dv : x->hkv * x->d, vw = x->kind == KVA_ATTN_MLA ? x->d - x->dv : x->kind == KVA_ATTN_INDEX ? 0 : x->hkv * x->dv;
            float *k = malloc(NB * B * kw * 4), *v = malloc(NB * B * (vw ? vw : 1) * 4);
            for (int i = 0; i < NB * B * kw; i++) k[i] = sinf(i * 0.7f) * (1 + i % 5);
            for (int i = 0; i < NB * B * vw; i++) v[i] = cosf(i * 0.3f);
            int64_t sl[NB * B]; for (int i = 0; i < NB * B; i++) sl[i] = i;
            if (kva_cache_write(ctx[b], c, NB * B, k, 0, vw ? v : NULL, 0, KVA_DTYPE_F32, sl)) { printf("write %s\n", kva_last_error()); bad++; }
            float *r0k = calloc(NB * B * kw, 4), *r0v = calloc(NB * B * (vw ? vw : 1), 4), *r1k = calloc(NB * B * kw, 4), *r1v = calloc(NB * B * (vw ? vw : 1), 4);
            kva_cache_read(ctx[b], c, NB * B, sl, r0k, 0, vw ? r0v : NULL, 0, KVA_DTYPE_F32);
            int32_t pairs[4] = {1, 4, 2, 2};
            if (kva_cache_copy_blocks(ctx[b], c, pairs, 2)) { printf("copy %s\n", kva_last_error()); bad++; }
            kva_cache_read(ctx[b], c, NB * B, sl, r1k, 0, vw ? r1v : NULL, 0, KVA_DTYPE_F32);
            int okc = memcmp(r1k + 4 * B * kw, r0k + 1 * B * kw, B * kw * 4) == 0 && (!vw || memcmp(r1v + 4 * B * vw, r0v + B * vw, B * vw * 4) == 0)
                && memcmp(r1k, r0k, 4 * B * kw * 4) == 0;
            /* swap block 5 of c into block 0 of c2 (other backend's context performing it) */
            int32_t sp[2] = {5, 0};
            if (kva_cache_swap_blocks(ctx[1 - b], c, c2, sp, 1)) { printf("swap %s\n", kva_last_error()); bad++; }
            kva_cache_read(ctx[1 - b], c2, B, sl, r1k, 0, vw ? r1v : NULL, 0, KVA_DTYPE_F32);
            int oks = memcmp(r1k, r0k + 5 * B * kw, B * kw * 4) == 0 && (!vw || memcmp(r1v, r0v + 5 * B * vw, B * vw * 4) == 0);
            if (!okc || !oks) { printf("format %zu (%s kind %d) ctx %s: copy %s swap %s\n", f, kva_quant_name(x->q), x->kind, kva_backend_name(cds[b].backend), okc ? "ok" : "BAD", oks ? "ok" : "BAD"); bad++; }
            free(k); free(v); free(r0k); free(r0v); free(r1k); free(r1v);
            kva_cache_destroy(c); kva_cache_destroy(c2);
        }
    printf("%d bad\n", bad);
    return 0;
}
