/*
 * mla_cg.c - a fixed kva_mla_run workload on the CPU backend (one thread)
 * for callgrind instruction counts (tail43): f32 latent cache, Dc 512,
 * Dr 64, H 8, Dn 128, Dv 128; argv[1] = "prefill" (one causal prefill of 128
 * rows over 256 keys: the compute-friendly path) or "spec" (four requests of
 * q_len 2 over 512 keys: the absorbed path), run twice (the first call warms
 * up).  Build: cc -O2 -Iinclude -Ibench dev/tail43/mla_cg.c -Lbuild-cpu -lkvattn -lm
 */
#include "kvattn.h"
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const int spec = argc > 1 && !strcmp(argv[1], "spec");
    enum { Dc = 512, Dr = 64, H = 8, Dn = 128, Dv = 128, B = 16 };
    const int R = spec ? 4 : 1, ql = spec ? 2 : 128, sl = spec ? 512 : 256;
    const int nbr = sl / B, NB = R * nbr;
    kva_context_desc cdsc = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    if (kva_context_create(&cdsc, &ctx))
        return 1;
    kva_cache_desc cd = {NB, B, 1, Dc + Dr, Dc, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    kva_cache *cache = NULL;
    if (kva_cache_create(ctx, &cd, &cache))
        return 1;
    void *k = NULL;
    kva_cache_data(cache, &k, NULL);
    kva_rng rng = {5};
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)NB * B * (Dc + Dr), &rng, 1.0);
    int32_t qsl[5], sls[4], bt[4 * 64];
    for (int r = 0; r <= R; r++)
        qsl[r] = r * ql;
    for (int r = 0; r < R; r++) {
        sls[r] = sl;
        for (int b = 0; b < nbr; b++)
            bt[r * nbr + b] = r * nbr + b;
    }
    kva_plan_desc pd = kva_test_mla_desc(R, qsl, sls, bt, nbr, B, H, Dc + Dr, Dc, KVA_DTYPE_F32,
                                         0.05, 1);
    pd.mla_qk_nope_head_dim = Dn;
    pd.mla_v_head_dim = Dv;
    kva_plan *plan = NULL;
    if (kva_plan_create(ctx, &pd, &plan))
        return 1;
    const int T = R * ql;
    float *q = malloc(sizeof(float) * T * H * (Dn + Dr));
    float *wuk = malloc(sizeof(float) * H * Dn * Dc), *wuv = malloc(sizeof(float) * H * Dc * Dv);
    float *out = malloc(sizeof(float) * T * H * Dv), *lse = malloc(sizeof(float) * T * H);
    kva_test_fill(q, KVA_DTYPE_F32, (size_t)T * H * (Dn + Dr), &rng, 1.0);
    kva_test_fill(wuk, KVA_DTYPE_F32, (size_t)H * Dn * Dc, &rng, 0.05);
    kva_test_fill(wuv, KVA_DTYPE_F32, (size_t)H * Dc * Dv, &rng, 0.05);
    double sum = 0;
    for (int it = 0; it < 2; it++) {
        if (kva_mla_run(ctx, plan, q, wuk, wuv, cache, out, lse))
            return 1;
    }
    for (int i = 0; i < T * H * Dv; i++)
        sum += out[i];
    printf("%s: checksum %.9g\n", spec ? "spec" : "prefill", sum);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    return 0;
}
