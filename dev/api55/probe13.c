/* probe13: kva_cache_create_quant's static-scale rules (kvattn_cache.h). */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#define P(expr) do { kva_cache *c_ = NULL; kva_status s_ = (expr); printf("%-4d %-24s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); kva_cache_destroy(c_); } while (0)
int main(void)
{
    kva_context *ctx; kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0}; kva_context_create(&cd, &ctx);
    enum { HKV = 2, D = 16, DV = 8 };
    float s1[1] = {0.1f}, sh[HKV] = {0.1f, 0.2f}, sc[HKV * D], scv[HKV * DV], bad0[1] = {0}, badn[1] = {NAN}, badneg[1] = {-1}, badinf[1] = {INFINITY};
    for (int i = 0; i < HKV * D; i++) sc[i] = 0.01f * (i + 1);
    for (int i = 0; i < HKV * DV; i++) scv[i] = 0.02f * (i + 1);
    kva_cache_desc d = {4, 4, HKV, D, DV, KVA_DTYPE_I8, 0, KVA_QUANT_INT8_CHANNEL, 0};
    kva_quant_params p;
    p = (kva_quant_params){s1, 1, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sc, HKV * D, NULL, 0, scv, HKV * DV, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sc, HKV * D, NULL, 0, sc, HKV * D, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_)); /* V with Hkv*D: Dv != D */
    p = (kva_quant_params){sc, HKV * DV, NULL, 0, scv, HKV * DV, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sh, HKV, NULL, 0, sh, HKV, sh, HKV}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sh, HKV, NULL, 3, sh, HKV, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sh, HKV, sh, 0, sh, HKV, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sh, 3, NULL, 0, sh, HKV, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){bad0, 1, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){badn, 1, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, 1, NULL, 0, badneg, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, 1, badinf, 1, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, 1, NULL, 0, NULL, 0, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, -1, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    P(kva_cache_create_quant(ctx, &d, NULL, &c_));
    P(kva_cache_create(ctx, &d, &c_));
    d.quant = KVA_QUANT_INT8_TOKEN_K;
    p = (kva_quant_params){NULL, 0, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, 1, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){NULL, 0, NULL, 0, scv, HKV * DV, scv, HKV * DV}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    d.quant = KVA_QUANT_INT8_TOKEN_K_V16; d.dtype = KVA_DTYPE_BF16;
    P(kva_cache_create_quant(ctx, &d, NULL, &c_));
    P(kva_cache_create(ctx, &d, &c_));
    p = (kva_quant_params){NULL, 0, NULL, 0, s1, 1, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    d.dtype = KVA_DTYPE_F32; P(kva_cache_create(ctx, &d, &c_));
    d.quant = KVA_QUANT_FP8_E4M3; d.dtype = KVA_DTYPE_FP8_E4M3;
    P(kva_cache_create(ctx, &d, &c_));
    p = (kva_quant_params){sh, HKV, NULL, 0, NULL, 0, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){sc, HKV * D, NULL, 0, NULL, 0, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    p = (kva_quant_params){s1, 1, s1, 1, NULL, 0, NULL, 0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    d.quant = KVA_QUANT_NONE; d.dtype = KVA_DTYPE_F32;
    p = (kva_quant_params){0}; P(kva_cache_create_quant(ctx, &d, &p, &c_));
    P(kva_cache_create_quant(ctx, &d, NULL, &c_));
    return 0;
}
