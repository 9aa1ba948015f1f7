/*
 * attn_cg.c - a fixed kva_attention_run workload on the CPU backend (one
 * thread) for callgrind instruction counts (tail43): bf16 MHA cache, NHD,
 * H 8, Hkv 2, D 128, B 16; argv[1] = "decode" (8 requests, q_len 3, seq_len
 * 1024, causal: the decode kernels' multi-row path), "prefill" (one causal
 * prefill of 256 over 512 keys) or "tree" (the decode batch as draft trees,
 * chains 0-1-2), run twice.
 * Build: cc -O2 -fopenmp -Iinclude -Ibench dev/tail43/attn_cg.c build-cpu/libkvattn.a -lm
 */
#include "kvattn.h"
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *w = argc > 1 ? argv[1] : "decode";
    const int pre = !strcmp(w, "prefill"), tree = !strcmp(w, "tree");
    enum { H = 8, Hkv = 2, D = 128, B = 16 };
    const int R = pre ? 1 : 8, ql = pre ? 256 : 3, sl = pre ? 512 : 1024;
    const int nbr = sl / B, NB = R * nbr;
    kva_context_desc cdsc = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    if (kva_context_create(&cdsc, &ctx))
        return 1;
    kva_cache_desc cd = {NB, B, Hkv, D, D, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MHA};
    kva_cache *cache = NULL;
    if (kva_cache_create(ctx, &cd, &cache))
        return 1;
    void *k = NULL, *v = NULL;
    kva_cache_data(cache, &k, &v);
    kva_rng rng = {5};
    kva_test_fill(k, KVA_DTYPE_BF16, (size_t)NB * B * Hkv * D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_BF16, (size_t)NB * B * Hkv * D, &rng, 1.0);
    int32_t qsl[9], sls[8], bt[8 * 64] = {0}, par[8 * 256];
    for (int r = 0; r <= R; r++)
        qsl[r] = r * ql;
    for (int r = 0; r < R; r++) {
        sls[r] = sl;
        for (int b = 0; b < nbr; b++)
            bt[r * nbr + b] = r * nbr + b;
    }
    for (int t = 0; t < R * ql; t++)
        par[t] = t % ql == 0 ? -1 : t % ql - 1;
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = sls;
    pd.block_table = bt;
    pd.block_table_stride = nbr;
    pd.block_size = B;
    pd.decode_threshold = pre ? 1 : 3;
    pd.num_heads = H;
    pd.num_kv_heads = Hkv;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_BF16;
    pd.causal = 1;
    pd.window_left = -1;
    pd.cascade = KVA_CASCADE_OFF;
    if (tree)
        pd.tree_parents = par;
    kva_plan *plan = NULL;
    if (kva_plan_create(ctx, &pd, &plan)) {
        fprintf(stderr, "plan: %s\n", kva_last_error());
        return 1;
    }
    const int T = R * ql;
    uint16_t *q = malloc(2 * (size_t)T * H * D), *out = malloc(2 * (size_t)T * H * D);
    float *lse = malloc(sizeof(float) * T * H);
    kva_test_fill(q, KVA_DTYPE_BF16, (size_t)T * H * D, &rng, 1.0);
    for (int it = 0; it < 2; it++)
        if (kva_attention_run(ctx, plan, q, cache, NULL, out, lse)) {
            fprintf(stderr, "run: %s\n", kva_last_error());
            return 1;
        }
    double sum = 0;
    for (int i = 0; i < T * H; i++)
        sum += lse[i];
    printf("%s: checksum %.9g\n", w, sum);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    return 0;
}
