/*
 * bench_cuda_mla.c - times the absorbed MLA decode (kva_attention_run on a
 * KVA_ATTN_MLA plan, FlashMLA's flash_mla_with_kvcache) on the CUDA backend
 * with CUDA events.
 *
 *   bench_cuda_mla [--batch R] [--context S] [--q-len Q] [--heads H]
 *                  [--block-size B] [--dtype bf16|f16] [--kv-quant none|fp8]
 *                  [--iters N] [--splits N] [--kernel NAME] [--check 0|1]
 *
 * R requests of Q new tokens after S cached ones (seq_len S + Q, causal),
 * latent rows of 576 (c_kv 512 | k_pe 64) in a paged cache of B-token blocks
 * with a shuffled block table (--kv-quant fp8: an FP8 E4M3 latent cache of
 * 576 bytes per row with k_scale 1/128, the codes of the same uniform fill).
 * Before timing, request 0's out is checked
 * against the reference backend (fp64 math) on an f32 copy of its blocks and
 * q (exact: every bf16/f16 value is an f32), under test_cuda_mla's bound:
 * every element within 8e-4 + u max|v| + 2.01/128 |ref| (FlashMLA's
 * tolerance plus the rounding of P to the input dtype, u = 2^-8 bf16, 2^-11
 * f16, max|v| = sqrt 3 of the uniform fill); the first bad elements are
 * printed. (The CPU backend's own bf16 output, the earlier reference, has
 * its own error, so two outputs each within the bound could differ by more
 * than it.) The median of N timed runs
 * (each between its own pair of events) is reported with the latent bytes read
 * (every request's S + Q rows once: 1152 bytes each in bf16, 576 in fp8) in
 * TB/s and the
 * FLOPs (2 * (576 + 512) per visible query-key pair and head) in TFLOP/s.
 * --splits N forces N key chunks per unit (kva__cuda_context_force_splits);
 * --kernel NAME forces an MLA kernel of the registry (mla_decode_mma_sm80,
 * mla_decode_wgmma_sm90) through kva__context_force_kernel.
 * --check 0 skips the check (check_bad -1: repeated timing runs of a shape).
 * The last line is one JSON object (bench/peer_mla.py reads it).
 */
#define BENCH_NAME "bench_cuda_mla"
#include "bench_cuda_util.h"
#include "internal.h"
#include "kvattn_cuda.h"
#include "../src/plan/partition.h"
#include "cuda_backend.h"
#include "data.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DC 512
#define DL 576

/* The causal plan of the benchmark's batches (DeepSeek's scale 1/sqrt(128 + 64)). */
static kva_plan_desc mla_desc(int32_t R, const int32_t *qsl, const int32_t *sl, const int32_t *bt,
                              int32_t stride, int32_t B, int32_t H, kva_dtype dt)
{
    return kva_test_mla_desc(R, qsl, sl, bt, stride, B, H, DL, DC, dt, 1.0 / sqrt(192.0), 1);
}

/* k_scale of the FP8 cache: a power of two, so code * scale is exact in f32. */
#define FP8_SCALE (1.0f / 128)

/* Request 0 on the reference backend, in f32 (the q and latent values of
 * dtype dt widened exactly; fp8: code * FP8_SCALE, exact), from a host copy
 * of its blocks; returns the number of out elements outside the bound, or -1
 * when the reference cannot run the plan (the check is then skipped). */
static long check_request0(const void *dcache, const int32_t *bt, int32_t nblk, int32_t B,
                           int32_t H, int32_t Q, int32_t s, kva_dtype dt, int fp8, const void *q,
                           const void *dout)
{
    kva_context_desc cd_ = {KVA_BACKEND_REF, 0, 0};
    kva_context *ref = NULL;
    KV(kva_context_create(&cd_, &ref));
    kva_cache_desc cd = {nblk,           B,           1, DL, DC, KVA_DTYPE_F32, KVA_LAYOUT_NHD,
                         KVA_QUANT_NONE, KVA_ATTN_MLA};
    kva_cache *hc = NULL;
    long bad = -1;
    if (kva_cache_create(ref, &cd, &hc) == KVA_STATUS_OK) {
        float *hk = NULL;
        kva_cache_data(hc, (void **)&hk, NULL);
        const size_t be = (size_t)B * DL, ce = fp8 ? 1 : 2; /* elements per block, bytes */
        uint16_t *blk = malloc(be * 2);
        for (int32_t k = 0; k < nblk; k++) {
            CU(cudaMemcpy(blk, (const char *)dcache + (size_t)bt[k] * be * ce, be * ce,
                          cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < be; i++)
                hk[(size_t)k * be + i] =
                    fp8 ? kva_fp8_e4m3_to_f32(((const uint8_t *)blk)[i]) * FP8_SCALE
                        : (float)kva_test_get(blk, dt, i);
        }
        free(blk);
        int32_t *lbt = malloc(sizeof(int32_t) * (size_t)nblk), qsl[2] = {0, Q}, sl[1] = {s};
        for (int32_t k = 0; k < nblk; k++)
            lbt[k] = k;
        kva_plan_desc pd = mla_desc(1, qsl, sl, lbt, nblk, B, H, KVA_DTYPE_F32);
        kva_plan *p = NULL;
        const size_t nq = (size_t)Q * H * DL, no = (size_t)Q * H * DC;
        float *qf = malloc(nq * 4), *want = malloc(no * 4);
        uint16_t *got = malloc(no * 2);
        for (size_t i = 0; i < nq; i++)
            qf[i] = (float)kva_test_get(q, dt, i);
        if (kva_plan_create(ref, &pd, &p) == KVA_STATUS_OK &&
            kva_attention_run(ref, p, qf, hc, NULL, want, NULL) == KVA_STATUS_OK) {
            CU(cudaMemcpy(got, dout, no * 2, cudaMemcpyDeviceToHost));
            const double atol = 8e-4 + (dt == KVA_DTYPE_F16 ? 0x1p-11 : 0x1p-8) * 1.7320508;
            bad = 0;
            for (size_t i = 0; i < no; i++) {
                const double a = kva_test_get(got, dt, i), b = want[i];
                if (!(fabs(a - b) <= atol + 2.01 / 128 * fabs(b)) && bad++ < 5)
                    fprintf(stderr,
                            "bench_cuda_mla: out[%zu] (token %zu, head %zu, col %zu): "
                            "got %.6g, reference %.6g\n",
                            i, i / ((size_t)H * DC), i / DC % H, i % DC, a, b);
            }
        } else {
            fprintf(stderr, "bench_cuda_mla: check skipped: %s\n", kva_last_error());
        }
        kva_plan_destroy(p);
        free(lbt), free(qf), free(want), free(got);
    }
    kva_cache_destroy(hc);
    kva_context_destroy(ref);
    return bad;
}

int main(int argc, char **argv)
{
    int32_t R = 128, S = 4096, Q = 1, H = 16, B = 64, iters = 30, splits = 0, check = 1;
    const char *dts = "bf16", *kernel = NULL, *kvq = "none";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--batch"))
            R = atoi(v);
        else if (!strcmp(f, "--context"))
            S = atoi(v);
        else if (!strcmp(f, "--q-len"))
            Q = atoi(v);
        else if (!strcmp(f, "--heads"))
            H = atoi(v);
        else if (!strcmp(f, "--block-size"))
            B = atoi(v);
        else if (!strcmp(f, "--dtype"))
            dts = v;
        else if (!strcmp(f, "--kv-quant"))
            kvq = v;
        else if (!strcmp(f, "--iters"))
            iters = atoi(v);
        else if (!strcmp(f, "--splits"))
            splits = atoi(v);
        else if (!strcmp(f, "--kernel"))
            kernel = v;
        else if (!strcmp(f, "--check"))
            check = atoi(v);
        else
            DIE("unknown flag %s", f);
    }
    if (R < 1 || S < 0 || Q < 1 || H < 1 || B < 1 || iters < 1 ||
        (strcmp(kvq, "none") && strcmp(kvq, "fp8")))
        DIE("bad arguments");
    const int fp8 = !strcmp(kvq, "fp8");
    const kva_dtype dt = !strcmp(dts, "f16") ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
    if (kva__backend_device_count(KVA_BACKEND_CUDA) == 0) {
        printf("{\"skipped\": \"no CUDA device\"}\n");
        return 0;
    }
    kva_rng rng = {2026};
    const int32_t s = S + Q, nblk = (s + B - 1) / B, NB = R * nblk;
    int32_t *qsl = malloc(sizeof(int32_t) * (R + 1)), *sl = malloc(sizeof(int32_t) * R);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)NB);
    for (int32_t r = 0; r <= R; r++)
        qsl[r] = r * Q;
    for (int32_t r = 0; r < R; r++)
        sl[r] = s;
    for (int32_t i = 0; i < NB; i++)
        bt[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }

    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    KV(kva_context_create(&gd, &gpu));
    KV(kva__cuda_context_force_splits(gpu, splits));
    if (kernel)
        KV(kva__context_force_kernel(gpu, kernel));
    kva_cache_desc cd = {NB,
                         B,
                         1,
                         DL,
                         DC,
                         fp8 ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    const float ksc = FP8_SCALE;
    const kva_quant_params qp = {.k_scale = &ksc, .k_scale_len = 1};
    kva_cache *dc = NULL;
    KV(kva_cache_create_quant(gpu, &cd, fp8 ? &qp : NULL, &dc));
    void *dk = NULL;
    kva_cache_data(dc, &dk, NULL);
    /* Random latent rows: a 32 MiB random pattern tiled over the cache (fp8:
     * the codes of uniform values, fp8(x / scale)). */
    const size_t ce = fp8 ? 1 : 2;
    const size_t cbytes = (size_t)NB * B * DL * ce, pat = (size_t)1 << 25;
    void *hp = malloc(pat);
    if (fp8) {
        float *u = malloc(sizeof(float) * pat);
        kva_test_fill_uniform(u, KVA_DTYPE_F32, pat, &rng);
        for (size_t i = 0; i < pat; i++)
            ((uint8_t *)hp)[i] = kva_f32_to_fp8_e4m3(u[i] / FP8_SCALE);
        free(u);
    } else {
        kva_test_fill_uniform(hp, dt, pat / 2, &rng);
    }
    for (size_t off = 0; off < cbytes; off += pat)
        CU(cudaMemcpy((char *)dk + off, hp, cbytes - off < pat ? cbytes - off : pat,
                      cudaMemcpyHostToDevice));
    free(hp);
    const size_t nq = (size_t)R * Q * H * DL, no = (size_t)R * Q * H * DC;
    void *q = malloc(nq * 2), *dout = NULL;
    kva_test_fill(q, dt, nq, &rng, 1.0);
    void *dq = bench_upload(q, nq * 2);
    CU(cudaMalloc(&dout, no * 2));

    kva_plan_desc pd = mla_desc(R, qsl, sl, bt, nblk, B, H, dt);
    kva_plan *plan = NULL;
    KV(kva_plan_create(gpu, &pd, &plan));
    CU(cudaMemset(dout, 0xff, no * 2));
    KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
    CU(cudaDeviceSynchronize());
    const long bad = check ? check_request0(dk, bt, nblk, B, H, Q, s, dt, fp8, q, dout) : -1;

    for (int w = 0; w < 3; w++)
        KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
    float *ms = malloc(sizeof(float) * (size_t)iters);
    BENCH_TIME_EVENTS(ms, iters, 0, KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL)));
    const double med = bench_median(ms, iters);
    double pairs = 0;
    for (int32_t i = 0; i < Q; i++)
        pairs += (double)R * (s - Q + i + 1);
    const double kv_bytes = (double)R * s * DL * ce, flops = pairs * H * 2.0 * (DL + DC);
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    fprintf(stderr,
            "bench_cuda_mla: R=%d S=%d Q=%d H=%d B=%d %s%s: median %.4f ms, %.3f TB/s latent, "
            "%.1f TFLOP/s, rows %d, %d items, %d split tasks, kernel %s, check %s\n",
            R, S, Q, H, B, dts, fp8 ? " fp8 latent" : "", med, kv_bytes / (med * 1e-3) * 1e-12, flops / (med * 1e-3) * 1e-12,
            cp->rows, plan->part->num_items, plan->part->num_tasks,
            kva__cuda_kernels[cp->decode_kernel].name,
            bad < 0 ? "skipped"
            : bad   ? "FAILED"
                    : "ok");
    printf("{\"mode\": \"mla\", \"device\": \"%s\", \"R\": %d, \"S\": %d, \"Q\": %d, \"H\": %d, "
           "\"B\": %d, \"dtype\": \"%s\", \"kv_quant\": \"%s\", \"ms\": %.5f, \"kv_bytes\": "
           "%.0f, \"flops\": %.0f, \"rows\": %d, \"items\": %d, \"tasks\": %d, \"check_bad\": "
           "%ld}\n",
           prop.name, R, S, Q, H, B, dts, kvq, med, kv_bytes, flops, cp->rows, plan->part->num_items,
           plan->part->num_tasks, bad);
    kva_plan_destroy(plan);
    kva_cache_destroy(dc);
    kva_context_destroy(gpu);
    cudaFree(dq), cudaFree(dout);
    free(q), free(ms), free(qsl), free(sl), free(bt);
    return bad > 0 ? 1 : 0;
}
