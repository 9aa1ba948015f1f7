/*
 * py_step.c - the C side of bench/py_overhead.py: times one decode step
 * (kva_plan_create + kva_attention_run + kva_plan_destroy) of R requests of
 * seq_len S (H 8, Hkv 2, D 64, f16, B 16) on the CPU backend with 1 thread,
 * the same loop the Python script times through the kvattn package. Built
 * as a shared library by the script, which calls py_step_us once per round,
 * alternating with its Python rounds (the same load for both).
 */
#define _POSIX_C_SOURCE 200809L

#include <kvattn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 8, HKV = 2, D = 64, B = 16 };

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Microseconds per step, averaged over iters steps; < 0 on an error. */
double py_step_us(int r, int s, int iters)
{
    int nbr = (s + B - 1) / B, nb = r * nbr;
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx;
    kva_cache_desc desc = {nb, B, HKV, D, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD, KVA_QUANT_NONE};
    kva_cache *cache;
    if (kva_context_create(&cd, &ctx) || kva_cache_create(ctx, &desc, &cache))
        return -1;
    void *kd, *vd;
    kva_cache_data(cache, &kd, &vd);
    memset(kd, 0x11, (size_t)nb * B * HKV * D * 2); /* small finite f16 values */
    memset(vd, 0x11, (size_t)nb * B * HKV * D * 2);
    int32_t *qsl = malloc(sizeof(int32_t) * (r + 1)), *sl = malloc(sizeof(int32_t) * r);
    int32_t *bt = malloc(sizeof(int32_t) * nb);
    uint16_t *q = calloc((size_t)r * H * D, 2), *out = calloc((size_t)r * H * D, 2);
    for (int i = 0; i <= r; i++)
        qsl[i] = i;
    for (int i = 0; i < r; i++)
        sl[i] = s;
    for (int i = 0; i < nb; i++)
        bt[i] = i;
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = r;
    pd.query_start_loc = qsl;
    pd.seq_lens = sl;
    pd.block_table = bt;
    pd.block_table_stride = nbr;
    pd.block_size = B;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F16;
    pd.causal = 1;
    pd.window_left = -1;
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        kva_plan *plan;
        if (kva_plan_create(ctx, &pd, &plan) ||
            kva_attention_run(ctx, plan, q, cache, NULL, out, NULL))
            return -1;
        kva_plan_destroy(plan);
    }
    double t = (now_us() - t0) / iters;
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(qsl);
    free(sl);
    free(bt);
    free(q);
    free(out);
    return t;
}
