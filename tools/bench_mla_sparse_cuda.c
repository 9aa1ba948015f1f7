/*
 * bench_mla_sparse_cuda.c - `kvattn bench --mla-sparse --backend cuda`:
 * times the sparse MLA (kva_mla_sparse_run, DeepSeek V3.2's top-k attention
 * over FlashMLA's fp8_ds_mla rows) on the CUDA backend with CUDA events.
 * Without shape options it runs the suite below (the issue-17 targets in
 * one run); with them, one shape (bench_mla_sparse.c maps the options: R
 * requests of Q query tokens, seq_len S, H heads, top-K, fp8_ds_mla or bf16
 * cache rows, mixed or separate). Builds without the CUDA backend compile
 * the stub at the end.
 *
 * Suite: decode batch 128, q_len 2, H 128, top-2048 over fp8_ds_mla rows
 * (seq_len 8k); the same at H 16 and at H 64 (H 16 padded to 64, FlashMLA's
 * way: the ratio is the "no padding" target); the bf16 cache; sparse prefill
 * of 4k tokens (one request, seq_len 8k, H 128, top-2048) in both modes and
 * over a bf16 cache; then H 16 forced onto the wgmma body (64-row tiles) and
 * the shapes that moved to it with the mma.sync kernel forced (the previous
 * default: before / after in one run); last the H 16 decode with f16 q
 * (the fp8_ds_mla codes become f16 in one conversion per pair, bf16 in
 * four). Index lists are random positions of the request (all valid), so
 * every token gathers K scattered rows.
 * Counts: FLOPs as FlashMLA does, 2 * H * K * (576 + 512) per query token;
 * gathered bytes K * row bytes (656 fp8, 1152 bf16) per token (each head
 * tile's CTA reads them; H > 64 reads them twice). Before timing, one token's
 * first heads are checked against an fp64 computation over the rows read
 * back with kva_cache_read (out within 1e-3 + 2^-8 sqrt 3 + 2/128 |ref|).
 * Median of N runs, each between its own pair of events.
 */
#include "bench_mla_sparse.h"

#include <stdio.h>

#ifdef KVA_HAVE_CUDA

#define BENCH_NAME "kvattn: bench --mla-sparse (cuda)"
#include "../bench/bench_cuda_util.h"
#include "../bench/data.h"
#include "internal.h"
#include "kvattn_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DC 512
#define DR 64
#define DL 576

typedef bench_sp_shape shape;

/* Checks token 0, heads 0 .. 3 against fp64 over the read-back rows; 1 if ok.
 * q and out in dt (bf16 or f16). */
static int check(kva_context *ctx, const kva_cache *cache, const shape *sh, const int32_t *bt,
                 int32_t stride, const uint16_t *q, const int32_t *idx, const void *d_out,
                 float scale, kva_dtype dt)
{
    const int32_t K = sh->K, B = cache->desc.block_size;
    int64_t *slots = malloc(sizeof(int64_t) * K);
    for (int32_t j = 0; j < K; j++)
        slots[j] = (int64_t)bt[idx[j] / B] * B + idx[j] % B;
    int64_t *d_slots = NULL;
    float *d_rows = NULL;
    CU(cudaMalloc((void **)&d_slots, sizeof(int64_t) * K));
    CU(cudaMalloc((void **)&d_rows, sizeof(float) * (size_t)K * DL));
    CU(cudaMemcpy(d_slots, slots, sizeof(int64_t) * K, cudaMemcpyHostToDevice));
    KV(kva_cache_read(ctx, cache, K, d_slots, d_rows, DL, d_rows + DC, DL, KVA_DTYPE_F32));
    float *rows = malloc(sizeof(float) * (size_t)K * DL);
    uint16_t *out = malloc(2 * (size_t)4 * DC);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(rows, d_rows, sizeof(float) * (size_t)K * DL, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(out, d_out, 2 * (size_t)4 * DC, cudaMemcpyDeviceToHost));
    int bad = 0;
    double *sc = malloc(sizeof(double) * K);
    for (int h = 0; h < 4 && h < sh->H; h++) {
        double m = -INFINITY, l = 0;
        for (int32_t j = 0; j < K; j++) {
            double a = 0;
            for (int c = 0; c < DL; c++)
                a += (double)kva__load_f(q, dt, (size_t)h * DL + c) * rows[(size_t)j * DL + c];
            sc[j] = a * scale;
            m = sc[j] > m ? sc[j] : m;
        }
        for (int32_t j = 0; j < K; j++)
            l += exp(sc[j] - m);
        for (int c = 0; c < DC; c++) {
            double o = 0;
            for (int32_t j = 0; j < K; j++)
                o += exp(sc[j] - m) * rows[(size_t)j * DL + c];
            o /= l;
            const double got = kva__load_f(out, dt, (size_t)h * DC + c);
            bad += !(fabs(got - o) <= 1e-3 + 0x1p-8 * 1.7320508 + 2.0 / 128 * fabs(o));
        }
    }
    free(sc), free(rows), free(out), free(slots);
    cudaFree(d_slots), cudaFree(d_rows);
    return bad == 0;
}

/* Runs one shape; prints a line and returns the median ms (negative on a failed check). */
static double run_shape(const shape *sh, int iters)
{
    kva_rng rng = {1234};
    const int32_t R = sh->R, Q = sh->Q, S = sh->S, H = sh->H, K = sh->K, B = 64;
    const int32_t T = R * Q, nbr = (S + B - 1) / B, NB = R * nbr;
    const kva_dtype qdt = sh->f16 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16; /* q and out */
    int32_t *qsl = malloc(sizeof(int32_t) * (R + 1)), *sl = malloc(sizeof(int32_t) * R);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)R * nbr), *perm = malloc(sizeof(int32_t) * NB);
    for (int32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int32_t r = 0; r <= R; r++)
        qsl[r] = r * Q;
    for (int32_t r = 0; r < R; r++) {
        sl[r] = S;
        for (int32_t k = 0; k < nbr; k++)
            bt[(size_t)r * nbr + k] = perm[r * nbr + k];
    }
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ctx = NULL;
    KV(kva_context_create(&gd, &ctx));
    if (sh->kernel)
        KV(kva__context_force_kernel(ctx, sh->kernel));
    kva_cache_desc cd = {NB,
                         B,
                         1,
                         DL,
                         DC,
                         sh->fp8 ? KVA_DTYPE_FP8_E4M3 : KVA_DTYPE_BF16,
                         KVA_LAYOUT_NHD,
                         sh->fp8 ? KVA_QUANT_FP8_DS_MLA : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    kva_cache *cache = NULL;
    KV(kva_cache_create(ctx, &cd, &cache));
    /* Every slot written (random bf16 c_kv / k_pe), in chunks of 64k tokens. */
    const int64_t slots_n = (int64_t)NB * B, chunk = 65536;
    uint16_t *src = malloc(2 * (size_t)chunk * DL);
    int64_t *sl64 = malloc(sizeof(int64_t) * chunk);
    void *d_src = NULL, *d_sl = NULL;
    CU(cudaMalloc(&d_src, 2 * (size_t)chunk * DL));
    CU(cudaMalloc(&d_sl, sizeof(int64_t) * chunk));
    kva_test_fill_uniform(src, KVA_DTYPE_BF16, (size_t)chunk * DL, &rng);
    CU(cudaMemcpy(d_src, src, 2 * (size_t)chunk * DL, cudaMemcpyHostToDevice));
    for (int64_t s0 = 0; s0 < slots_n; s0 += chunk) { /* the same 64k rows over and over */
        const int64_t n = slots_n - s0 < chunk ? slots_n - s0 : chunk;
        for (int64_t i = 0; i < n; i++)
            sl64[i] = s0 + i;
        CU(cudaMemcpy(d_sl, sl64, sizeof(int64_t) * n, cudaMemcpyHostToDevice));
        KV(kva_cache_write(ctx, cache, (int32_t)n, d_src, DL, (uint16_t *)d_src + DC, DL,
                           KVA_DTYPE_BF16, d_sl));
    }
    uint16_t *q = malloc(2 * (size_t)T * H * DL);
    kva_test_fill(q, qdt, (size_t)T * H * DL, &rng, 1.0);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * K);
    for (size_t i = 0; i < (size_t)T * K; i++)
        idx[i] = kva_rng_int(&rng, 0, S - 1);
    void *d_q = NULL, *d_idx = NULL, *d_out = NULL;
    float *d_lse = NULL;
    CU(cudaMalloc(&d_q, 2 * (size_t)T * H * DL));
    CU(cudaMalloc(&d_idx, sizeof(int32_t) * (size_t)T * K));
    CU(cudaMalloc(&d_out, 2 * (size_t)T * H * DC));
    CU(cudaMalloc((void **)&d_lse, sizeof(float) * (size_t)T * H));
    CU(cudaMemcpy(d_q, q, 2 * (size_t)T * H * DL, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_idx, idx, sizeof(int32_t) * (size_t)T * K, cudaMemcpyHostToDevice));
    kva_plan_desc pd =
        kva_test_mla_desc(R, qsl, sl, bt, nbr, B, H, DL, DC, qdt, 1.0 / sqrt(192.0), 0);
    pd.sparse_topk = K;
    pd.sparse_mode = sh->separate ? KVA_SPARSE_SEPARATE : KVA_SPARSE_MIXED;
    kva_plan *plan = NULL;
    KV(kva_plan_create(ctx, &pd, &plan));
    CU(cudaMemset(d_out, 0xff, 2 * (size_t)T * H * DC));
    KV(kva_mla_sparse_run(ctx, plan, d_q, cache, d_idx, K, NULL, NULL, d_out, d_lse));
    const int ok = check(ctx, cache, sh, bt, nbr, q, idx, d_out, pd.scale, qdt);
    for (int w = 0; w < 3; w++)
        KV(kva_mla_sparse_run(ctx, plan, d_q, cache, d_idx, K, NULL, NULL, d_out, d_lse));
    float *ms = malloc(sizeof(float) * iters);
    BENCH_TIME_EVENTS(
        ms, iters, 0,
        KV(kva_mla_sparse_run(ctx, plan, d_q, cache, d_idx, K, NULL, NULL, d_out, d_lse)));
    const double med = bench_median(ms, iters);
    const double flops = 2.0 * H * (double)K * (DL + DC) * T;
    const double bytes = (double)T * K * (sh->fp8 ? 656 : 1152);
    printf("%-34s R=%-4d Q=%-5d S=%-5d H=%-3d K=%-4d %-4s %-8s%s %9.4f ms %7.1f TFLOP/s %6.2f TB/s "
           "gathered  check %s\n",
           sh->name, R, Q, S, H, K, sh->fp8 ? "fp8" : "bf16", sh->separate ? "separate" : "mixed",
           sh->f16 ? " f16q" : "", med, flops / med * 1e-9, bytes / med * 1e-9,
           ok ? "ok" : "FAILED");
    fflush(stdout);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    cudaFree(d_q), cudaFree(d_idx), cudaFree(d_out), cudaFree(d_lse), cudaFree(d_src),
        cudaFree(d_sl);
    free(ms), free(q), free(idx), free(src), free(sl64), free(qsl), free(sl), free(bt), free(perm);
    return ok ? med : -med;
}

int bench_mla_sparse_cuda(const bench_sp_shape *one, int iters)
{
    if (iters < 1)
        iters = 1;
    if (!kva_backend_available(KVA_BACKEND_CUDA)) {
        fprintf(stderr, "kvattn: bench --mla-sparse: no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    if (one)
        return run_shape(one, iters) < 0;
    /* The default kernels (wgmma for H > 32 on sm_90a), then the shapes whose
     * kernel changed with mma.sync forced (the previous default) and H 16 on
     * the wgmma body (its 64-row tile: the padding the H 64 row measures). */
    static const char *const mma = "mla_decode_mma_sm80", *const wg = "mla_decode_wgmma_sm90";
    const shape suite[] = {
        {"decode H128 (target >= 350)", 128, 2, 8192, 128, 2048, 1, 0, NULL, 0},
        {"decode H128 bf16 cache", 128, 2, 8192, 128, 2048, 0, 0, NULL, 0},
        {"decode H16", 128, 2, 8192, 16, 2048, 1, 0, NULL, 0},
        {"decode H64 (H16 padded to 64)", 128, 2, 8192, 64, 2048, 1, 0, NULL, 0},
        {"prefill 4k (target >= 500)", 1, 4096, 8192, 128, 2048, 1, 0, NULL, 0},
        {"prefill 4k separate", 1, 4096, 8192, 128, 2048, 1, 1, NULL, 0},
        {"prefill 4k bf16 cache", 1, 4096, 8192, 128, 2048, 0, 0, NULL, 0},
        {"decode H16 on wgmma (64-row tile)", 128, 2, 8192, 16, 2048, 1, 0, wg, 0},
        {"decode H128 mma.sync", 128, 2, 8192, 128, 2048, 1, 0, mma, 0},
        {"decode H128 bf16 cache mma.sync", 128, 2, 8192, 128, 2048, 0, 0, mma, 0},
        {"decode H64 mma.sync", 128, 2, 8192, 64, 2048, 1, 0, mma, 0},
        {"prefill 4k mma.sync", 1, 4096, 8192, 128, 2048, 1, 0, mma, 0},
        {"prefill 4k separate mma.sync", 1, 4096, 8192, 128, 2048, 1, 1, mma, 0},
        {"decode H16 f16 q", 128, 2, 8192, 16, 2048, 1, 0, NULL, 1},
    };
    const int n = (int)(sizeof suite / sizeof suite[0]);
    double t[sizeof suite / sizeof suite[0]];
    int fails = 0;
    for (int i = 0; i < n; i++) {
        t[i] = run_shape(&suite[i], iters);
        fails += t[i] < 0;
        t[i] = fabs(t[i]);
    }
    printf("H16 vs H16 padded to 64: %.2fx faster (target >= 2x)\n", t[3] / t[2]);
    printf("H16 f16 q vs bf16 q: %.2fx faster\n", t[2] / t[n - 1]);
    return fails != 0;
}

#else

int bench_mla_sparse_cuda(const bench_sp_shape *one, int iters)
{
    (void)one, (void)iters;
    fprintf(stderr, "kvattn: bench --mla-sparse: this build has no CUDA backend\n");
    return 2;
}

#endif
