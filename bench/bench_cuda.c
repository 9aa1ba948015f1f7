/*
 * bench_cuda.c - times kva_attention_run on the CUDA backend with CUDA events.
 *
 *   bench_cuda --mode decode|prefill|copy [--batch R] [--context S] [--q-len Q]
 *              [--heads H] [--kv-heads Hkv] [--head-dim D] [--head-dim-v Dv]
 *              [--block-size B]
 *              [--dtype bf16|f16|f32] [--layout nhd|hnd] [--iters N]
 *              [--graph-layers L] [--kernel NAME]... [--plan-iters N] [--splits N]
 *              [--balanced 0|1]
 *              [--quant none|int8|int8-token|int8-token-v16|fp8] [--context-min M]
 *              [--copy-bytes N]
 *
 * decode: R requests of q_len Q (1 = decode, >1 = speculative) after S cached
 * tokens; prefill: R causal prompts of Q tokens after S cached tokens. Block
 * tables are shuffled. Before timing, the first requests' outputs are checked
 * against the CPU backend. The median of N timed runs (each between its own
 * pair of events) is reported with the KV bytes read (every visible key's K
 * and V once per kv head) and the attention FLOPs (2*(D + Dv) per visible
 * query-key pair and head; Dv defaults to D, and D != Dv needs --quant
 * none). With --graph-layers L, L runs over the same cache are captured in
 * one CUDA graph and the median replay time per layer is reported too.
 * --kernel NAME (once per kernel family) forces a kernel of the CUDA
 * backend's registry (src/attn/cuda/cuda_kernels.cu: decode_mma_sm80,
 * decode_simt, prefill_wgmma_tma_sm90, prefill_wgmma_sm90, prefill_wgmma_tma_narrow_sm90,
 * prefill_wgmma_narrow_sm90, prefill_mma_sm80,
 * prefill_items) through kva__context_force_kernel, so one build compares
 * the kernels on the public path; without it the dispatcher chooses.
 * --mode copy times a 1 GiB device-to-device copy (the bandwidth ceiling, in
 * the same run); --copy-bytes N copies N bytes instead (one call of a small
 * shape's traffic carries the same launch and ramp-up cost as a decode of it:
 * the per-call ceiling of that shape), per call and back to back. --quant reads a quantized cache instead (int8: INT8_CHANNEL
 * with per-channel scales and offsets; int8-token: INT8_TOKEN_K; int8-token-
 * v16: INT8_TOKEN_K_V16 with V in the q dtype; fp8: FP8_E4M3 with per-head
 * scales): random codes (no fp8 NaN codes) and per-token scales are filled on
 * the host and uploaded, q and out stay in --dtype; the KV bytes then count
 * the 1-byte codes (2-byte V for int8-token-v16) and the per-token scales.
 * --context-min M draws every request's cached tokens uniformly from [M, S]
 * (fixed seed; default M = S: all equal), for ragged batches.
 * --splits N cuts every partition unit into N key chunks (at most one per
 * 256 keys; counts above the plan's own cap of 32 too)
 * (kva__cuda_context_force_splits; 0, the default, keeps the plan's choice;
 * -1 makes the former choice: four candidates by makespan alone),
 * to time split counts the plan does not pick; the line reports the split
 * tasks and the plan's candidate (partition.h pick). --balanced 1 runs the
 * split tasks of the tensor-core decode on its balanced schedule
 * (kva__cuda_context_balanced; 0, the default: each split item on its own
 * key chunk).
 * --plan-iters N times N kva_plan_create + kva_plan_destroy of the batch on
 * the host (median, microseconds) and one uncached occupancy query.
 * The last line is one JSON object for bench/peer_cuda.py.
 */
#define BENCH_NAME "bench_cuda"
#include "batches.h"
#include "bench_cuda_util.h"
#include "internal.h"
#include "kvattn_cuda.h"
#include "../src/plan/partition.h"
#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Host wall clock in microseconds. */
static double host_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Fills n elements by tiling a random pattern of 16M elements (never zeros). */
static void fill_big(void *p, kva_dtype dt, size_t n, kva_rng *rng)
{
    const size_t es = kva_dtype_size(dt), tile = (size_t)1 << 24;
    size_t first = n < tile ? n : tile;
    kva_test_fill_uniform(p, dt, first, rng);
    for (size_t off = first; off < n; off += first) {
        size_t m = n - off < first ? n - off : first;
        memcpy((char *)p + off * es, p, m * es);
    }
}

/* --mode copy: the ceiling in the same run as the attention lines: a
 * device-to-device cudaMemcpy of n bytes (1 GiB by default), bytes read +
 * written per second (as bench/peer_cuda.py's torch copy), per call (each
 * between its own events) and back to back (iters copies between one pair). */
static int copy_bench(int iters, size_t n)
{
    if (kva__backend_device_count(KVA_BACKEND_CUDA) == 0) {
        printf("{\"skipped\": \"no CUDA device\"}\n");
        return 0;
    }
    void *x = NULL, *y = NULL;
    CU(cudaMalloc(&x, n));
    CU(cudaMalloc(&y, n));
    CU(cudaMemset(x, 0x5a, n));
    float *ms = malloc(sizeof(float) * (size_t)iters), warm[3], all;
    BENCH_TIME_EVENTS(warm, 3, 0, CU(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, 0)));
    BENCH_TIME_EVENTS(ms, iters, 0, CU(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, 0)));
    BENCH_TIME_EVENTS(&all, 1, 0, for (int i = 0; i < iters; i++)
        CU(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, 0)));
    const float med = bench_median(ms, iters), b2b = all / (float)iters;
    const double tbs = 2.0 * (double)n / (med * 1e-3) * 1e-12;
    fprintf(stderr,
            "bench_cuda: copy %.1f MiB device to device: median %.4f ms, %.3f TB/s (read + "
            "write); back to back %.4f ms = %.3f TB/s\n",
            (double)n / (1 << 20), (double)med, tbs, (double)b2b,
            2.0 * (double)n / (b2b * 1e-3) * 1e-12);
    printf("{\"mode\": \"copy\", \"bytes\": %zu, \"ms\": %.5f, \"copy_tbs\": %.4f, "
           "\"b2b_ms\": %.5f}\n",
           n, (double)med, tbs, (double)b2b);
    free(ms);
    cudaFree(x);
    cudaFree(y);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = "decode", *dts = "bf16", *lays = "nhd", *quants = "none";
    int32_t R = 64, S = 4096, Q = -1, H = 32, Hkv = 8, D = 128, Dv = -1, B = 16, iters = 30,
            layers = 0, plan_iters = 0, splits = 0, smin = -1, balanced = 0;
    long long copy_bytes = 1LL << 30;
    const char *kernels[2] = {NULL, NULL};
    int nkern = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--mode"))
            mode = v;
        else if (!strcmp(f, "--batch"))
            R = atoi(v);
        else if (!strcmp(f, "--context"))
            S = atoi(v);
        else if (!strcmp(f, "--q-len"))
            Q = atoi(v);
        else if (!strcmp(f, "--heads"))
            H = atoi(v);
        else if (!strcmp(f, "--kv-heads"))
            Hkv = atoi(v);
        else if (!strcmp(f, "--head-dim"))
            D = atoi(v);
        else if (!strcmp(f, "--head-dim-v"))
            Dv = atoi(v);
        else if (!strcmp(f, "--block-size"))
            B = atoi(v);
        else if (!strcmp(f, "--dtype"))
            dts = v;
        else if (!strcmp(f, "--layout"))
            lays = v;
        else if (!strcmp(f, "--iters"))
            iters = atoi(v);
        else if (!strcmp(f, "--graph-layers"))
            layers = atoi(v);
        else if (!strcmp(f, "--context-min"))
            smin = atoi(v);
        else if (!strcmp(f, "--splits"))
            splits = atoi(v);
        else if (!strcmp(f, "--balanced"))
            balanced = atoi(v);
        else if (!strcmp(f, "--kernel") && nkern < 2)
            kernels[nkern++] = v;
        else if (!strcmp(f, "--quant"))
            quants = v;
        else if (!strcmp(f, "--plan-iters"))
            plan_iters = atoi(v);
        else if (!strcmp(f, "--copy-bytes"))
            copy_bytes = atoll(v);
        else
            DIE("unknown flag %s", f);
    }
    if (!strcmp(mode, "copy")) {
        if (copy_bytes < 1)
            DIE("--copy-bytes %lld must be positive", copy_bytes);
        return copy_bench(iters, (size_t)copy_bytes);
    }
    const int prefill = !strcmp(mode, "prefill");
    if (Q < 0)
        Q = prefill ? 4096 : 1;
    const kva_dtype dt = !strcmp(dts, "f32")   ? KVA_DTYPE_F32
                         : !strcmp(dts, "f16") ? KVA_DTYPE_F16
                                               : KVA_DTYPE_BF16;
    const kva_layout layout = !strcmp(lays, "hnd") ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
    const kva_quant quant = !strcmp(quants, "int8")             ? KVA_QUANT_INT8_CHANNEL
                            : !strcmp(quants, "int8-token")     ? KVA_QUANT_INT8_TOKEN_K
                            : !strcmp(quants, "int8-token-v16") ? KVA_QUANT_INT8_TOKEN_K_V16
                            : !strcmp(quants, "fp8")            ? KVA_QUANT_FP8_E4M3
                                                                : KVA_QUANT_NONE;
    if (quant == KVA_QUANT_NONE && strcmp(quants, "none"))
        DIE("unknown --quant %s", quants);
    if (Dv < 0)
        Dv = D;
    if (Dv != D && quant != KVA_QUANT_NONE)
        DIE("--head-dim-v %d != --head-dim %d needs --quant none", (int)Dv, (int)D);
    if (kva__backend_device_count(KVA_BACKEND_CUDA) == 0) {
        printf("{\"skipped\": \"no CUDA device\"}\n");
        return 0;
    }
    kva_rng rng = {2026};
    int32_t *ql = malloc(sizeof(int32_t) * (size_t)R), *sl = malloc(sizeof(int32_t) * (size_t)R);
    for (int32_t r = 0; r < R; r++) {
        ql[r] = Q;
        sl[r] = (smin >= 0 && smin < S ? kva_rng_int(&rng, smin, S) : S) + Q;
    }
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, R, ql, sl, B, 1, 0);
    const size_t es = kva_dtype_size(dt);

    kva_context_desc cpud = {KVA_BACKEND_CPU, 0, 0}, gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *cpu = NULL, *gpu = NULL;
    KV(kva_context_create(&cpud, &cpu));
    KV(kva_context_create(&gd, &gpu));
    /* --kernel NAME: plans are partitioned for and run with that kernel. */
    for (int k = 0; k < nkern; k++)
        KV(kva__context_force_kernel(gpu, kernels[k]));
    KV(kva__cuda_context_force_splits(gpu, splits));
    KV(kva__cuda_context_balanced(gpu, balanced));
    const kva_dtype cdt = quant == KVA_QUANT_NONE || quant == KVA_QUANT_INT8_TOKEN_K_V16 ? dt
                          : quant == KVA_QUANT_FP8_E4M3 ? KVA_DTYPE_FP8_E4M3
                                                        : KVA_DTYPE_I8;
    if (quant == KVA_QUANT_INT8_TOKEN_K_V16 && dt == KVA_DTYPE_F32)
        DIE("--quant int8-token-v16 needs --dtype f16 or bf16 (the V dtype)");
    kva_cache_desc cd = {b.num_blocks, B, Hkv, D, Dv, cdt, layout, quant, KVA_ATTN_MHA};
    /* Static scales: codes of unit-range data (int8 per channel with offsets, fp8 per head). */
    float *sbuf = malloc(sizeof(float) * 4 * (size_t)Hkv * D);
    for (int32_t i = 0; i < 4 * Hkv * D; i++)
        sbuf[i] = i % (2 * Hkv * D) < Hkv * D ? (float)(0.012 + 0.004 * kva_rng_unit(&rng))
                                              : (float)(4.0 * kva_rng_unit(&rng) - 2.0);
    kva_quant_params qp;
    memset(&qp, 0, sizeof qp);
    if (quant == KVA_QUANT_INT8_CHANNEL)
        qp = (kva_quant_params){sbuf,
                                Hkv * D,
                                sbuf + Hkv * D,
                                Hkv * D,
                                sbuf + 2 * Hkv * D,
                                Hkv * D,
                                sbuf + 3 * Hkv * D,
                                Hkv * D};
    else if (quant == KVA_QUANT_INT8_TOKEN_K)
        qp.v_scale = sbuf + 2 * Hkv * D, qp.v_scale_len = Hkv * D, qp.v_offset = sbuf + 3 * Hkv * D,
        qp.v_offset_len = Hkv * D;
    else if (quant == KVA_QUANT_FP8_E4M3)
        qp.k_scale = sbuf, qp.k_scale_len = Hkv, qp.v_scale = sbuf + 2 * Hkv * D,
        qp.v_scale_len = Hkv;
    kva_cache *hc = NULL, *dc = NULL;
    const kva_quant_params *qpp = quant == KVA_QUANT_NONE ? NULL : &qp;
    KV(kva_cache_create_quant(cpu, &cd, qpp, &hc));
    KV(kva_cache_create_quant(gpu, &cd, qpp, &dc));
    void *hk, *hv, *dk, *dv;
    kva_cache_data(hc, &hk, &hv);
    kva_cache_data(dc, &dk, &dv);
    const size_t kbytes = (size_t)b.num_blocks * kva_cache_block_bytes_k(hc);
    const size_t vbytes = (size_t)b.num_blocks * kva_cache_block_bytes_v(hc);
    const size_t tbytes = (size_t)b.num_blocks * kva_cache_block_bytes_scales(hc);
    if (quant == KVA_QUANT_NONE) {
        const size_t cache_rows = (size_t)b.num_blocks * B * Hkv;
        fill_big(hk, dt, cache_rows * D, &rng);
        fill_big(hv, dt, cache_rows * Dv, &rng);
    } else {
        /* Random codes (fp8 NaN codes 0x7f / 0xff replaced), per-token scales ~1/127. */
        unsigned char *kc = hk, *vc = hv;
        for (size_t i = 0; i < kbytes; i++) {
            kc[i] = (unsigned char)(kva_rng_u64(&rng) >> 56);
            if (quant == KVA_QUANT_FP8_E4M3 && (kc[i] & 0x7f) == 0x7f)
                kc[i] ^= 0x01;
        }
        if (quant == KVA_QUANT_INT8_TOKEN_K_V16)
            fill_big(hv, dt, (size_t)b.num_blocks * B * Hkv * D, &rng);
        else
            for (size_t i = 0; i < vbytes; i++) {
                vc[i] = (unsigned char)(kva_rng_u64(&rng) >> 56);
                if (quant == KVA_QUANT_FP8_E4M3 && (vc[i] & 0x7f) == 0x7f)
                    vc[i] ^= 0x01;
            }
        float *hts = NULL, *dts_ = NULL;
        kva_cache_token_scales(hc, &hts);
        kva_cache_token_scales(dc, &dts_);
        for (size_t i = 0; hts && i < tbytes / 4; i++)
            hts[i] = (float)((0.8 + 0.4 * kva_rng_unit(&rng)) / 127.0);
        if (hts)
            CU(cudaMemcpy(dts_, hts, tbytes, cudaMemcpyHostToDevice));
    }
    CU(cudaMemcpy(dk, hk, kbytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, hv, vbytes, cudaMemcpyHostToDevice));

    const size_t nq = (size_t)b.T * H * D, no = (size_t)b.T * H * Dv;
    void *q = malloc(nq * es), *out_cpu = malloc(no * es), *out_gpu = malloc(no * es);
    kva_test_fill_uniform(q, dt, nq, &rng);
    void *dq = bench_upload(q, nq * es), *dout = NULL;
    CU(cudaMalloc(&dout, no * es));

    /* Check the first requests (a prefix of the same batch) against the CPU backend. */
    kva_test_batch chk = b;
    chk.R = R < 2 ? R : 2;
    chk.T = b.query_start_loc[chk.R];
    kva_plan_desc pc = kva_test_batch_plan_desc(&chk, H, Hkv, D, Dv, dt);
    kva_plan *pcpu = NULL, *pchk = NULL;
    KV(kva_plan_create(cpu, &pc, &pcpu));
    KV(kva_plan_create(gpu, &pc, &pchk));
    KV(kva_attention_run(cpu, pcpu, q, hc, NULL, out_cpu, NULL));
    CU(cudaMemset(dout, 0xff, no * es));
    KV(kva_attention_run(gpu, pchk, dq, dc, NULL, dout, NULL));
    CU(cudaMemcpy(out_gpu, dout, (size_t)chk.T * H * Dv * es, cudaMemcpyDeviceToHost));
    /* Prefill tiles and the tensor-core decode round P to the input dtype for
     * P V: out may differ by u * max|v| more (u = 2^-8 bf16, 2^-11 f16;
     * uniform fill). */
    const kva__cuda_plan *gcp = (const kva__cuda_plan *)pchk->device;
    const int mma = gcp->num_ptiles > 0 || gcp->decode_kernel == KVA__CUDA_K_DECODE_MMA;
    const double atol =
        kva_test_atol(dt) +
        (mma && dt != KVA_DTYPE_F32 ? (dt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11) * 1.7320508 : 0.0);
    size_t bad = kva_test_compare("bench check", out_gpu, out_cpu, dt, (size_t)chk.T * H * Dv, atol,
                                  kva_test_rtol(dt));
    kva_plan_destroy(pcpu);
    kva_plan_destroy(pchk);

    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, dt);
    kva_plan *plan = NULL;
    KV(kva_plan_create(gpu, &pd, &plan));
    kva_plan_info info;
    kva_plan_get_info(plan, &info);

    /* Work: visible keys per row (causal, bottom-right aligned). */
    double pairs = 0;
    for (int32_t r = 0; r < R; r++)
        for (int32_t i = 0; i < Q; i++)
            pairs += (double)(sl[r] - Q + i + 1);
    /* Bytes per visible key and kv head: K + V codes (+ a per-token scale). */
    const double key_bytes = (double)(kva_cache_block_bytes_k(hc) + kva_cache_block_bytes_v(hc) +
                                      kva_cache_block_bytes_scales(hc)) /
                             ((double)B * Hkv);
    double kv_bytes = 0;
    for (int32_t r = 0; r < R; r++)
        kv_bytes += (double)sl[r] * Hkv * key_bytes;
    const double flops = pairs * H * 2.0 * (D + Dv);

    cudaEvent_t ev[2];
    CU(cudaEventCreate(&ev[0]));
    CU(cudaEventCreate(&ev[1]));
    for (int w = 0; w < 3; w++)
        KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
    float *ms = malloc(sizeof(float) * (size_t)iters), *enq = malloc(sizeof(float) * (size_t)iters);
    for (int it = 0; it < iters; it++) {
        CU(cudaEventRecord(ev[0], 0));
        const double t0 = host_us();
        KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
        enq[it] = (float)(host_us() - t0);
        CU(cudaEventRecord(ev[1], 0));
        CU(cudaEventSynchronize(ev[1]));
        CU(cudaEventElapsedTime(&ms[it], ev[0], ev[1]));
    }
    const float med = bench_median(ms, iters), enq_us = bench_median(enq, iters);
    /* Back to back: `iters` runs queued between one pair of events (the
     * stream never waits for the host), per run; median of 5 such batches. */
    float b2b[5];
    for (int rep = 0; rep < 5; rep++) {
        CU(cudaEventRecord(ev[0], 0));
        for (int it = 0; it < iters; it++)
            KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
        CU(cudaEventRecord(ev[1], 0));
        CU(cudaEventSynchronize(ev[1]));
        CU(cudaEventElapsedTime(&b2b[rep], ev[0], ev[1]));
        b2b[rep] /= (float)iters;
    }
    const float b2b_ms = bench_median(b2b, 5);

    float graph_ms = 0.f;
    if (layers > 0) {
        /* L layers captured in one graph on a private stream; replays only. */
        cudaStream_t s;
        CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        KV(kva_cuda_context_set_stream(gpu, s));
        kva_plan_destroy(plan);
        KV(kva_plan_create(gpu, &pd, &plan));
        CU(cudaStreamSynchronize(s));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < layers; l++)
            KV(kva_attention_run(gpu, plan, dq, dc, NULL, dout, NULL));
        CU(cudaStreamEndCapture(s, &g));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphLaunch(ge, s));
        CU(cudaStreamSynchronize(s));
        int reps = iters < 10 ? iters : 10;
        float *gm = malloc(sizeof(float) * (size_t)reps);
        for (int it = 0; it < reps; it++) {
            CU(cudaEventRecord(ev[0], s));
            CU(cudaGraphLaunch(ge, s));
            CU(cudaEventRecord(ev[1], s));
            CU(cudaEventSynchronize(ev[1]));
            CU(cudaEventElapsedTime(&gm[it], ev[0], ev[1]));
        }
        graph_ms = bench_median(gm, reps) / (float)layers;
        free(gm);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        KV(kva_cuda_context_set_stream(gpu, NULL));
        cudaStreamDestroy(s);
    }

    if (plan_iters > 0) {
        /* Host cost of kva_plan_create (+ destroy) for this batch, and of one
         * uncached occupancy query (what the context's cache saves per shape). */
        float *pt = malloc(sizeof(float) * (size_t)plan_iters * 2);
        for (int it = 0; it < plan_iters; it++) {
            const double t0 = host_us();
            kva_plan *p2 = NULL;
            KV(kva_plan_create(gpu, &pd, &p2));
            kva_plan_destroy(p2);
            pt[it] = (float)(host_us() - t0);
            const double t1 = host_us();
            (void)kva__cuda_simt_ctas_per_sm(dt, D, 8);
            pt[plan_iters + it] = (float)(host_us() - t1);
        }
        fprintf(stderr,
                "bench_cuda: plan create + destroy median %.1f us (%d runs); one uncached "
                "occupancy query %.1f us\n",
                (double)bench_median(pt, plan_iters), plan_iters,
                (double)bench_median(pt + plan_iters, plan_iters));
        free(pt);
    }

    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    const double sec = med * 1e-3;
    fprintf(
        stderr,
        "bench_cuda: %s R=%d S=%d Q=%d H=%d Hkv=%d D=%d Dv=%d B=%d %s kv %s: median %.4f ms, %.3f "
        "TB/s KV, %.1f TFLOP/s, %d items, %d split tasks (candidate %d), kernels %s + %s, "
        "check %s; host enqueue median %.1f us; back to back "
        "%.4f ms = %.1f TFLOP/s\n",
        mode, R, S, Q, H, Hkv, D, Dv, B, dts, kva_quant_name(quant), (double)med,
        kv_bytes / sec * 1e-12, flops / sec * 1e-12, (int)info.num_work_items,
        (int)plan->part->num_tasks, (int)plan->part->pick,
        kva__cuda_kernels[((const kva__cuda_plan *)plan->device)->decode_kernel].name,
        ((const kva__cuda_plan *)plan->device)->num_ptiles > 0 ? "prefill tiles" : "no tiles",
        bad ? "FAILED" : "ok", (double)enq_us, (double)b2b_ms, flops / (b2b_ms * 1e-3) * 1e-12);
    printf("{\"mode\": \"%s\", \"device\": \"%s\", \"R\": %d, \"S\": %d, \"Q\": %d, \"H\": %d, "
           "\"Hkv\": %d, \"D\": %d, \"Dv\": %d, \"B\": %d, \"dtype\": \"%s\", \"kv_quant\": "
           "\"%s\", \"ms\": %.5f, "
           "\"kv_bytes\": %.0f, \"flops\": %.0f, \"items\": %d, \"graph_ms_per_layer\": %.5f, "
           "\"check_bad\": %zu, \"host_enqueue_us\": %.2f, \"b2b_ms\": %.5f}\n",
           mode, prop.name, R, S, Q, H, Hkv, D, Dv, B, dts, kva_quant_name(quant), (double)med,
           kv_bytes, flops, (int)info.num_work_items, (double)graph_ms, bad, (double)enq_us,
           (double)b2b_ms);
    kva_plan_destroy(plan);
    cudaFree(dq);
    cudaFree(dout);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_context_destroy(cpu);
    kva_context_destroy(gpu);
    free(q);
    free(out_cpu);
    free(out_gpu);
    free(ms);
    free(enq);
    free(sbuf);
    free(ql);
    free(sl);
    kva_test_batch_free(&b);
    return bad ? 1 : 0;
}
