/*
 * step.cu - one DCP rank's decode step on one GPU, the other ranks'
 * partials precomputed (dev/dcp62/run.sh builds it against a base and a new
 * tree): rank 0's sharded decode over its shard, then kva_merge_states_n of
 * the N ranks' partials (P split partials per rank with
 * kva_plan_desc.dcp_parts, built with -DHAVE_PARTS), timed per call (CUDA
 * events around the step, medians) and replayed from a CUDA graph (10 steps
 * per graph), against the unsharded decode timed the same ways. The step's
 * output is checked against the unsharded run first.
 *
 * usage: step N L R P iters   (bf16, H 32, Hkv 8, D 128, B 16, I 1)
 */
#include "kvattn.h"
#include "kvattn_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H 32
#define HKV 8
#define D 128
#define BS 16

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define KO(x)                                                                                      \
    do {                                                                                           \
        kva_status s_ = (x);                                                                       \
        if (s_ != KVA_STATUS_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, kva_last_error());         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A value in [-1, 1) for channel e of the K (w 0) or V row of request r at
 * global position g. */
__device__ float kv_val(int r, long long g, int e, int w)
{
    unsigned long long x = ((unsigned long long)g * 0x9e3779b97f4a7c15ull) ^
                           ((unsigned long long)e << 20) ^ ((unsigned long long)r << 50) ^
                           ((unsigned long long)w << 63);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1ull << 23) - 1.0);
}

/* Rank `rank` of N's tokens (N 1: all) of R requests of `local` tokens each,
 * request r's local token j at slot (r * nbr + j / BS) * BS + j % BS. */
__global__ void fill(__nv_bfloat16 *k, __nv_bfloat16 *v, int R, int local, int nbr, int N,
                     int rank)
{
    const long long n = (long long)R * local * HKV * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int e = (int)(i % (HKV * D));
        const long long t = i / (HKV * D);
        const int r = (int)(t / local), j = (int)(t % local);
        const long long g = (long long)j * N + rank;
        const long long slot = ((long long)r * nbr + j / BS) * BS + j % BS;
        k[slot * HKV * D + e] = __float2bfloat16(kv_val(r, g, e, 0));
        v[slot * HKV * D + e] = __float2bfloat16(kv_val(r, g, e, 1));
    }
}

typedef struct shard {
    kva_cache *cache;
    kva_plan *plan;
    int32_t *bt;
} shard;

static void make_shard(kva_context *ctx, int N, int rank, int L, int R, int P, shard *s)
{
    int32_t lens[64], local = 0, qsl[65];
    for (int r = 0; r < R; r++)
        lens[r] = L;
    for (int r = 0; r <= R; r++)
        qsl[r] = r;
    KO(kva_dcp_local_lens(1, lens, N, rank, 1, &local));
    const int nbr = (local + BS - 1) / BS;
    s->bt = (int32_t *)malloc(sizeof(int32_t) * R * nbr);
    for (int i = 0; i < R * nbr; i++)
        s->bt[i] = i;
    kva_cache_desc cd = {R * nbr, BS, HKV, D, D, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MHA};
    KO(kva_cache_create(ctx, &cd, &s->cache));
    void *k, *v;
    KO(kva_cache_data(s->cache, &k, &v));
    fill<<<1024, 256>>>((__nv_bfloat16 *)k, (__nv_bfloat16 *)v, R, local, nbr, N > 1 ? N : 1,
                        N > 1 ? rank : 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = lens;
    pd.block_table = s->bt;
    pd.block_table_stride = nbr;
    pd.block_size = BS;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_BF16;
    pd.causal = 1;
    pd.window_left = -1;
    pd.dcp_size = N > 1 ? N : 0;
    pd.dcp_rank = rank;
#ifdef HAVE_PARTS
    pd.dcp_parts = N > 1 ? P : 0;
#else
    (void)P;
#endif
    KO(kva_plan_create(ctx, &pd, &s->plan));
}

static void free_shard(shard *s)
{
    kva_plan_destroy(s->plan);
    kva_cache_destroy(s->cache);
    free(s->bt);
}

static int cmp_f(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct step_args {
    kva_context *ctx;
    shard *s;
    const void *q;
    void *out;
    float *lse;
    /* the combine (NULL parts: none) */
    int np, R;
    const void *parts;
    const float *lses;
    void *fin;
} step_args;

static void step(const step_args *a)
{
    KO(kva_attention_run(a->ctx, a->s->plan, a->q, a->s->cache, NULL, a->out, a->lse));
    if (a->parts)
        KO(kva_merge_states_n(a->ctx, a->np, a->R, H, D, KVA_DTYPE_BF16, a->parts, 0, a->lses, 0,
                              a->fin, NULL));
}

/* Median per-call time (us) over iters calls, and the graph-replayed time per
 * step (10 steps per graph, 20 replays). */
static void time_step(const step_args *a, cudaStream_t st, int iters, float *eager, float *graph)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *t = (float *)malloc(sizeof(float) * iters);
    for (int i = -3; i < iters; i++) {
        CK(cudaEventRecord(e0, st));
        step(a);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0)
            t[i] = ms * 1000.f;
    }
    qsort(t, iters, sizeof(float), cmp_f);
    *eager = t[iters / 2];
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 10; i++)
        step(a);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++)
        CK(cudaGraphLaunch(ge, st));
    float gt[5];
    for (int rep = 0; rep < 5; rep++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 4; i++)
            CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        gt[rep] = ms * 1000.f / 40.f;
    }
    qsort(gt, 5, sizeof(float), cmp_f);
    *graph = gt[2];
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: step N L R P iters\n");
        return 2;
    }
    const int N = atoi(argv[1]), L = atoi(argv[2]), R = atoi(argv[3]), iters = atoi(argv[5]);
    int P = atoi(argv[4]);
#ifndef HAVE_PARTS
    P = 0;
#endif
    const int Pe = P > 1 ? P : 1, np = N * Pe;
    kva_context_desc cdsc = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ctx;
    KO(kva_context_create(&cdsc, &ctx));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KO(kva_cuda_context_set_stream(ctx, st));
    const size_t rows = (size_t)R * H, on = rows * D;
    __nv_bfloat16 *qh = (__nv_bfloat16 *)malloc(on * 2);
    unsigned s = 2026;
    for (size_t i = 0; i < on; i++) {
        s = s * 1664525u + 1013904223u;
        qh[i] = __float2bfloat16((float)((s >> 8) * (1.0 / 16777216.0)) * 2.f - 1.f);
    }
    void *q, *out_full, *parts, *fin;
    float *lse_full, *lses;
    CK(cudaMalloc(&q, on * 2));
    CK(cudaMemcpy(q, qh, on * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out_full, on * 2));
    CK(cudaMalloc(&lse_full, rows * 4));
    CK(cudaMalloc(&parts, on * 2 * np));
    CK(cudaMalloc(&lses, rows * 4 * np));
    CK(cudaMalloc(&fin, on * 2));

    /* The unsharded decode. */
    shard full;
    make_shard(ctx, 1, 0, L, R, 0, &full);
    step_args fa = {ctx, &full, q, out_full, lse_full, 0, R, NULL, NULL, NULL};
    float fe, fg;
    time_step(&fa, st, iters, &fe, &fg);
    CK(cudaStreamSynchronize(st));
    free_shard(&full);
    /* Ranks N-1 .. 1 precomputed into their slots; rank 0 is the step's. */
    for (int k = N - 1; k >= 1; k--) {
        shard sk;
        make_shard(ctx, N, k, L, R, P, &sk);
        KO(kva_attention_run(ctx, sk.plan, q, sk.cache, NULL, (char *)parts + on * 2 * Pe * k,
                             lses + rows * Pe * k));
        CK(cudaStreamSynchronize(st));
        free_shard(&sk);
    }
    shard r0;
    make_shard(ctx, N, 0, L, R, P, &r0);
    step_args sa = {ctx, &r0, q, parts, lses, np, R, parts, lses, fin};
    step(&sa);
    CK(cudaStreamSynchronize(st));
    /* Correctness first: the step's output against the unsharded one. */
    __nv_bfloat16 *a = (__nv_bfloat16 *)malloc(on * 2), *b = (__nv_bfloat16 *)malloc(on * 2);
    CK(cudaMemcpy(a, fin, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b, out_full, on * 2, cudaMemcpyDeviceToHost));
    double maxe = 0;
    size_t bad = 0;
    for (size_t i = 0; i < on; i++) {
        const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
        const double e = fabs(x - y);
        maxe = e > maxe || e != e ? e : maxe;
        bad += !(e <= 1e-2 + 1e-2 * fabs(y));
    }
    float se, sg, ae, ag, ce = 0;
    time_step(&sa, st, iters, &se, &sg);
    step_args aa = sa;
    aa.parts = NULL;
    time_step(&aa, st, iters, &ae, &ag);
    /* the combine alone (the rank's parts as last written) */
    {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float t[64];
        for (int i = -3; i < 31; i++) {
            CK(cudaEventRecord(e0, st));
            KO(kva_merge_states_n(ctx, np, R, H, D, KVA_DTYPE_BF16, parts, 0, lses, 0, fin, NULL));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 0)
                t[i] = ms * 1000.f;
        }
        qsort(t, 31, sizeof(float), cmp_f);
        ce = t[15];
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    printf("step N %d R %d L %d P %d: check %s (max |err| %.3g, %zu bad) | unsharded eager %.2f "
           "graph %.2f us | step eager %.2f graph %.2f us (attention %.2f / %.2f, combine "
           "%.2f) | ratio eager %.3f graph %.3f\n",
           N, R, L, P, bad ? "FAILED" : "ok", maxe, bad, fe, fg, se, sg, ae, ag, ce, se / fe,
           sg / fg);
    free_shard(&r0);
    kva_context_destroy(ctx);
    return bad ? 1 : 0;
}
