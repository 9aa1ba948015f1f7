/*
 * cuda_prefill_bench.c - times the tensor-core paged prefill kernel
 * (src/attn/cuda/prefill_mma.cu) with CUDA events.
 *
 * Shapes (causal, bf16 unless named): one 4k-token prefill with H/Hkv 32/8 and
 * 32/32 at D = 128, eight 1k-token prefills at 32/8, and D = 64 / 256 points.
 * Every prefill kernel that exists on the device is timed (mma.sync; on
 * sm_90a at D 128 the wgmma kernel with and without TMA); each point is checked first against an
 * fp64 computation of 24 sampled rows (token, head) done here on the host. Inputs are random
 * (uniform, unit variance). The paged cache has B = 64 unless named, with a shuffled block table.
 *
 * TFLOP/s = 4 * D * H * (visible query-key pairs) / time, the causal half
 * only (q * (q + 1) / 2 pairs for a fresh prefill). Prints one line per point:
 *   shape kernel median_ms TFLOP/s
 * Median of 30 timed launches after 5 warm-up launches. Arguments (optional):
 * a shape index and a kernel (kva__cuda_prefill_kernel: 1 mma.sync, 2 wgmma,
 * 3 wgmma with TMA), to time one point (e.g. under ncu).
 */
#include "data.h"
#include "prefill_mma.h"

#include <cuda_runtime.h>

#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define REPS 30

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct shape {
    const char *name;
    int32_t R, q_len, H, Hkv, D, B;
    kva_dtype dt;
} shape;

/* fp64 attention of one row (token t of request r, head h), causal, no extras. */
static void host_row(const shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                     const int32_t *bt, int32_t stride, int32_t r, int32_t i, int32_t h, double *o,
                     double *lse)
{
    const int32_t D = s->D, G = s->H / s->Hkv, kvh = h / G, S = s->q_len;
    const double scale = 1.0 / sqrt((double)D);
    const uint16_t *qr = q + ((size_t)(r * S + i) * s->H + h) * D;
    double m = -INFINITY, *p = malloc(sizeof(double) * (size_t)(i + 1));
    for (int32_t j = 0; j <= i; j++) {
        const int64_t blk = bt[r * stride + j / s->B];
        const uint16_t *kr = k + (((size_t)blk * s->B + j % s->B) * s->Hkv + kvh) * D;
        double dot = 0;
        for (int32_t c = 0; c < D; c++)
            dot += (double)kva_bf16_to_f32(qr[c]) * kva_bf16_to_f32(kr[c]);
        p[j] = dot * scale;
        m = p[j] > m ? p[j] : m;
    }
    double l = 0;
    for (int32_t c = 0; c < D; c++)
        o[c] = 0;
    for (int32_t j = 0; j <= i; j++) {
        const int64_t blk = bt[r * stride + j / s->B];
        const uint16_t *vr = v + (((size_t)blk * s->B + j % s->B) * s->Hkv + kvh) * D;
        const double w = exp(p[j] - m);
        l += w;
        for (int32_t c = 0; c < D; c++)
            o[c] += w * kva_bf16_to_f32(vr[c]);
    }
    for (int32_t c = 0; c < D; c++)
        o[c] /= l;
    *lse = m + log(l);
    free(p);
}

static int bench_shape(const shape *s, kva_rng *rng, int only_var)
{
    const int32_t R = s->R, S = s->q_len, H = s->H, Hkv = s->Hkv, D = s->D, B = s->B;
    const int32_t T = R * S, nbr = (S + B - 1) / B, NB = R * nbr + 1;
    const size_t nq = (size_t)T * H * D, nkv = (size_t)NB * B * Hkv * D;
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2), *o = malloc(nq * 2);
    float *lse = malloc(sizeof(float) * (size_t)T * H);
    kva_test_fill_uniform(q, s->dt, nq, rng);
    kva_test_fill_uniform(k, s->dt, nkv, rng);
    kva_test_fill_uniform(v, s->dt, nkv, rng);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)NB), *bt = malloc(sizeof(int32_t) * R * nbr);
    for (int32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        int32_t j = kva_rng_int(rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int32_t i = 0; i < R * nbr; i++)
        bt[i] = perm[i];
    int32_t *qsl = malloc(sizeof(int32_t) * (size_t)(R + 1)), *sl = malloc(sizeof(int32_t) * R);
    for (int32_t r = 0; r <= R; r++)
        qsl[r] = r * S;
    for (int32_t r = 0; r < R; r++)
        sl[r] = S;
    const int64_t count = kva__cuda_prefill_tiles_count_subset(R, qsl, NULL, H, Hkv);
    int32_t *tiles = malloc(sizeof(int32_t) * 4 * (size_t)count), ntiles = 0;
    if (kva__cuda_prefill_tiles_build_sections(R, qsl, sl, NULL, H, Hkv, 1, -1, 0, 0, tiles,
                                               (int32_t)count, &ntiles) != KVA_STATUS_OK) {
        fprintf(stderr, "tiles_build: %s\n", kva_last_error());
        return 1;
    }
    void *dq, *dk, *dv, *dout, *dqsl, *dsl, *dbt, *dtiles, *dn;
    float *dlse;
    CUDA_OK(cudaMalloc(&dq, nq * 2));
    CUDA_OK(cudaMalloc(&dk, nkv * 2));
    CUDA_OK(cudaMalloc(&dv, nkv * 2));
    CUDA_OK(cudaMalloc(&dout, nq * 2));
    CUDA_OK(cudaMalloc((void **)&dlse, sizeof(float) * (size_t)T * H));
    CUDA_OK(cudaMalloc(&dqsl, sizeof(int32_t) * (size_t)(R + 1)));
    CUDA_OK(cudaMalloc(&dsl, sizeof(int32_t) * (size_t)R));
    CUDA_OK(cudaMalloc(&dbt, sizeof(int32_t) * (size_t)R * nbr));
    CUDA_OK(cudaMalloc(&dtiles, sizeof(int32_t) * 4 * (size_t)count));
    CUDA_OK(cudaMalloc(&dn, sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, k, nkv * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v, nkv * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dqsl, qsl, sizeof(int32_t) * (size_t)(R + 1), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dsl, sl, sizeof(int32_t) * (size_t)R, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dbt, bt, sizeof(int32_t) * (size_t)R * nbr, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dtiles, tiles, sizeof(int32_t) * 4 * (size_t)count, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dn, &ntiles, sizeof(int32_t), cudaMemcpyHostToDevice));

    kva__cuda_prefill_args a;
    memset(&a, 0, sizeof a);
    a.q = dq;
    a.k = dk;
    a.v = dv;
    a.out = dout;
    a.lse = dlse;
    a.query_start_loc = dqsl;
    a.seq_lens = dsl;
    a.block_table = dbt;
    a.tiles = dtiles;
    a.num_tiles = dn;
    a.grid_tiles = (int32_t)count;
    a.block_table_stride = nbr;
    a.block_size = B;
    a.num_blocks = NB;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = a.head_dim_v = D;
    a.dtype = s->dt;
    a.layout = KVA_LAYOUT_NHD;
    a.scale = (float)(1.0 / sqrt((double)D));
    a.causal = 1;
    a.window_left = -1;

    const double flops = 4.0 * D * H * (double)R * ((double)S * (S + 1) / 2);
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    int fails = 0;
    double *orow = malloc(sizeof(double) * (size_t)D);
    static const char *const kname[] = {"auto", "mma_sm80", "wgmma_sm90", "wgmma_tma_sm90"};
    for (int var = KVA__CUDA_PREFILL_MMA; var <= KVA__CUDA_PREFILL_WGMMA_TMA; var++) {
        const kva__cuda_prefill_kernel kern = (kva__cuda_prefill_kernel)var;
        if ((only_var && var != only_var) || !kva__cuda_prefill_kernel_exists(D, D, kern))
            continue;
        /* Correctness first: 24 sampled rows against fp64. */
        CUDA_OK(cudaMemset(dout, 0xff, nq * 2));
        if (kva__cuda_prefill_launch_kernel(&a, NULL, kern) != KVA_STATUS_OK) {
            fprintf(stderr, "launch: %s\n", kva_last_error());
            return 1;
        }
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(o, dout, nq * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse, dlse, sizeof(float) * (size_t)T * H, cudaMemcpyDeviceToHost));
        double max_err = 0, max_lse_err = 0;
        for (int smp = 0; smp < 24; smp++) {
            const int32_t r = kva_rng_int(rng, 0, R - 1), h = kva_rng_int(rng, 0, H - 1);
            const int32_t i = smp < 4 ? S - 1 - smp : kva_rng_int(rng, 0, S - 1);
            double l;
            host_row(s, q, k, v, bt, nbr, r, i, h, orow, &l);
            const size_t row = (size_t)(r * S + i) * H + h;
            for (int32_t c = 0; c < D; c++) {
                const double e = fabs(kva_bf16_to_f32(o[row * D + c]) - orow[c]);
                max_err = e > max_err || isnan(e) ? e : max_err;
            }
            const double le = fabs(lse[row] - l);
            max_lse_err = le > max_lse_err || isnan(le) ? le : max_lse_err;
        }
        const int ok = max_err <= 1e-2 && max_lse_err <= 1e-3;
        fails += !ok;
        float ms[REPS];
        for (int w = 0; w < 5; w++)
            (void)kva__cuda_prefill_launch_kernel(&a, NULL, kern);
        for (int rep = 0; rep < REPS; rep++) {
            CUDA_OK(cudaEventRecord(e0, NULL));
            (void)kva__cuda_prefill_launch_kernel(&a, NULL, kern);
            CUDA_OK(cudaEventRecord(e1, NULL));
            CUDA_OK(cudaEventSynchronize(e1));
            CUDA_OK(cudaEventElapsedTime(&ms[rep], e0, e1));
        }
        qsort(ms, REPS, sizeof(float), cmp_float);
        const double med = ms[REPS / 2];
        /* Back to back: REPS launches between one pair of events (no host
         * gap), per launch; median of 5 such batches. */
        float b2b[5];
        for (int rep = 0; rep < 5; rep++) {
            CUDA_OK(cudaEventRecord(e0, NULL));
            for (int it = 0; it < REPS; it++)
                (void)kva__cuda_prefill_launch_kernel(&a, NULL, kern);
            CUDA_OK(cudaEventRecord(e1, NULL));
            CUDA_OK(cudaEventSynchronize(e1));
            CUDA_OK(cudaEventElapsedTime(&b2b[rep], e0, e1));
            b2b[rep] /= REPS;
        }
        qsort(b2b, 5, sizeof(float), cmp_float);
        printf("%-28s %-14s %8.3f ms  %7.1f TFLOP/s  (spread %.3f-%.3f ms, check %s: out err "
               "%.2g, lse err %.2g; back to back %.3f ms = %.1f TFLOP/s)\n",
               s->name, kname[var], med, flops / (med * 1e-3) / 1e12, ms[0], ms[REPS - 1],
               ok ? "ok" : "FAILED", max_err, max_lse_err, (double)b2b[2],
               flops / (b2b[2] * 1e-3) / 1e12);
        fflush(stdout);
    }
    free(orow);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    CUDA_OK(cudaFree(dq));
    CUDA_OK(cudaFree(dk));
    CUDA_OK(cudaFree(dv));
    CUDA_OK(cudaFree(dout));
    CUDA_OK(cudaFree(dlse));
    CUDA_OK(cudaFree(dqsl));
    CUDA_OK(cudaFree(dsl));
    CUDA_OK(cudaFree(dbt));
    CUDA_OK(cudaFree(dtiles));
    CUDA_OK(cudaFree(dn));
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    free(perm);
    free(bt);
    free(qsl);
    free(sl);
    free(tiles);
    return fails;
}

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    static const shape shapes[] = {
        {"1x4096 H32/8 D128 B64", 1, 4096, 32, 8, 128, 64, KVA_DTYPE_BF16},
        {"1x4096 H32/32 D128 B64", 1, 4096, 32, 32, 128, 64, KVA_DTYPE_BF16},
        {"8x1024 H32/8 D128 B64", 8, 1024, 32, 8, 128, 64, KVA_DTYPE_BF16},
        {"1x4096 H32/8 D128 B16", 1, 4096, 32, 8, 128, 16, KVA_DTYPE_BF16},
        {"1x4096 H32/8 D64 B64", 1, 4096, 32, 8, 64, 64, KVA_DTYPE_BF16},
        {"1x4096 H16/4 D256 B64", 1, 4096, 16, 4, 256, 64, KVA_DTYPE_BF16},
    };
    kva_rng rng = {12345};
    int fails = 0;
    /* Optional arguments: a shape index and a kernel (e.g. for ncu). */
    const int only_shape = argc > 1 ? atoi(argv[1]) : -1, only_var = argc > 2 ? atoi(argv[2]) : 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (only_shape < 0 || (size_t)only_shape == i)
            fails += bench_shape(&shapes[i], &rng, only_var);
    return fails ? 1 : 0;
}
