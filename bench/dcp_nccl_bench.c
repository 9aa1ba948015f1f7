/*
 * dcp_nccl_bench.c - decode context parallelism over NCCL on N GPUs of one
 * host, N processes (rank r on GPU r; forked before any CUDA call, rank 0
 * hands the ncclUniqueId to the others through pipes):
 *
 *   dcp_nccl_bench [N R S H Hkv D I iters]   (defaults 2 8 131072 32 8 128 1 50)
 *
 * Attention: every rank holds the whole bf16 cache of R requests of S tokens
 * (the unsharded baseline, on its own GPU) and its shard (kva_dcp_slots
 * layout with interleave I, shuffled block tables; token g of request r has
 * the same K/V rows in both). It checks the combine of the sharded decode
 * (every kva_dcp_nccl_combine mode, LSA also from the window) against its heads of the unsharded
 * decode, then times the unsharded and the sharded decode: the median of
 * iters runs, each between its own CUDA events ("stream"), and the median
 * of 9 replays of a CUDA graph of 10 runs, per run ("graph": no launch
 * latency between runs, as an engine's captured decode step runs).
 * Combine: for T in {R, 64, 512, 4096} query tokens of H heads and head size
 * D (random bf16 partials and lses), each mode against the bare NCCL
 * collectives that move the same bytes (A2A and LSA: the grouped
 * ncclSend/ncclRecv of the packed blocks to the N - 1 peers, and, as "a2a",
 * with the block to itself too, as an all-to-all call moves; AG_RS:
 * ncclAllGather of T*H floats and ncclReduceScatter of T*H*D floats; LSA is
 * the LSA combine on the caller's partials (the kernel pushes them to the
 * peers, one barrier), LSA_win on partials already in its window (the peers
 * pull them, two barriers)): iters back-to-back calls
 * between two events after a barrier ("stream"), and the same iters calls
 * captured in one CUDA graph and replayed ("graph"), the mean per call.
 * Floor: the bare collectives with an empty kernel (dcp_nccl_nop.cu) in each
 * place where the combine runs a kernel (A2A: before and after the
 * send/recv; AG_RS: after each collective), what any combine made of
 * kernels around the collectives costs at least.
 * Every rank prints its lines; rank 0 first the NCCL library's and
 * headers' versions.
 * NCCL_NVLS_ENABLE is set to 0 unless the environment sets it.
 */
#define _POSIX_C_SOURCE 200809L /* fork, pipe, setenv */
#include <unistd.h>

#define BENCH_NAME "dcp_nccl_bench"
#define BENCH_EXIT _exit /* ranks are forked processes */
#include "bench_cuda_util.h"
#include "data.h"
#include "kvattn_cuda.h"
#include "kvattn_nccl.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* dcp_nccl_nop.cu: one empty kernel on s. */
cudaError_t dcp_bench_nop(cudaStream_t s);

#define NC(x)                                                                                      \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess)                                                                     \
            DIE("%s: %s", #x, ncclGetErrorString(r_));                                             \
    } while (0)

typedef struct cfg {
    int N, R, S, H, Hkv, D, I, iters, rank;
} cfg;

/* Rows of the pattern the K/V of every token is drawn from: token g of
 * request r has row (g + 1021 r) mod P, the same on every rank. */
enum { P = 4099, B = 16 };

/* A block table of R rows of nblk[r] blocks, ids 0 .. sum-1 shuffled. */
static int32_t *shuffled_table(int R, const int32_t *nblk, int32_t *stride, int32_t *total)
{
    int32_t s = 1, n = 0;
    for (int r = 0; r < R; r++)
        s = nblk[r] > s ? nblk[r] : s, n += nblk[r];
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1)), *bt = malloc(sizeof(int32_t) * R * s);
    kva_rng rng = {77};
    for (int32_t i = 0; i < n; i++)
        ids[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    int32_t next = 0;
    for (int r = 0; r < R; r++)
        for (int32_t j = 0; j < s; j++)
            bt[r * s + j] = j < nblk[r] ? ids[next++] : -1;
    free(ids);
    *stride = s, *total = n;
    return bt;
}

/* A bf16 cache on gpu holding rank `rank` of N's tokens (N = 1: all) of R
 * requests of S tokens, from the pattern pk / pv [P][Hkv*D]; its plan for
 * decodes of q_len 1. */
static void build(const cfg *c, kva_context *gpu, int N, int rank, const uint16_t *pk,
                  const uint16_t *pv, kva_cache **cache, kva_plan **plan)
{
    const size_t row = (size_t)c->Hkv * c->D;
    int32_t *seq = malloc(sizeof(int32_t) * c->R), *local = malloc(sizeof(int32_t) * c->R),
            *nblk = malloc(sizeof(int32_t) * c->R), *qsl = malloc(sizeof(int32_t) * (c->R + 1));
    for (int r = 0; r < c->R; r++)
        seq[r] = c->S;
    KV(kva_dcp_local_lens(c->R, seq, N, rank, c->I, local));
    for (int r = 0; r < c->R; r++)
        nblk[r] = (local[r] + B - 1) / B;
    int32_t stride, nb;
    int32_t *bt = shuffled_table(c->R, nblk, &stride, &nb);
    kva_cache_desc cd = {
        nb, B, c->Hkv, c->D, c->D, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    KV(kva_cache_create(gpu, &cd, cache));
    uint16_t *hk = malloc((size_t)nb * B * row * 2), *hv = malloc((size_t)nb * B * row * 2);
    int64_t *slots = malloc(sizeof(int64_t) * c->S);
    for (int r = 0; r < c->R; r++) {
        KV(kva_dcp_slots(N, rank, c->I, B, bt + (size_t)r * stride, stride, 0, c->S, slots));
        for (int32_t g = 0; g < c->S; g++) {
            if (slots[g] < 0)
                continue;
            const size_t src = (size_t)((g + 1021 * r) % P) * row;
            memcpy(hk + (size_t)slots[g] * row, pk + src, row * 2);
            memcpy(hv + (size_t)slots[g] * row, pv + src, row * 2);
        }
    }
    void *dk, *dv;
    kva_cache_data(*cache, &dk, &dv);
    CU(cudaMemcpy(dk, hk, (size_t)nb * B * row * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, hv, (size_t)nb * B * row * 2, cudaMemcpyHostToDevice));
    for (int r = 0; r <= c->R; r++)
        qsl[r] = r;
    kva_plan_desc pd = {0};
    pd.num_requests = c->R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq;
    pd.block_table = bt;
    pd.block_table_stride = stride;
    pd.block_size = B;
    pd.decode_threshold = 1;
    pd.num_heads = c->H;
    pd.num_kv_heads = c->Hkv;
    pd.head_dim = c->D;
    pd.head_dim_v = c->D;
    pd.q_dtype = KVA_DTYPE_BF16;
    pd.causal = 1;
    pd.window_left = -1;
    pd.dcp_size = N;
    pd.dcp_rank = rank;
    pd.dcp_interleave = c->I;
    KV(kva_plan_create(gpu, &pd, plan));
    free(hk), free(hv), free(slots), free(seq), free(local), free(nblk), free(qsl), free(bt);
}

/* Median time (ms) of iters runs of the plan, each between its own events. */
static float time_run(kva_context *gpu, cudaStream_t s, kva_plan *p, const void *q,
                      const kva_cache *cache, void *out, float *lse, int iters)
{
    float *t = malloc(sizeof(float) * iters);
    for (int i = 0; i < 3; i++)
        KV(kva_attention_run(gpu, p, q, cache, NULL, out, lse));
    BENCH_TIME_EVENTS(t, iters, s, KV(kva_attention_run(gpu, p, q, cache, NULL, out, lse)));
    const float m = bench_median(t, iters);
    free(t);
    return m;
}

/* Median time (ms) per run of 9 replays of a CUDA graph of 10 runs of the plan. */
static float time_run_graph(kva_context *gpu, cudaStream_t s, kva_plan *p, const void *q,
                            const kva_cache *cache, void *out, float *lse)
{
    enum { RUNS = 10, REPLAYS = 9 };
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < RUNS; i++)
        KV(kva_attention_run(gpu, p, q, cache, NULL, out, lse));
    CU(cudaStreamEndCapture(s, &g));
    CU(cudaGraphInstantiate(&exec, g, 0));
    CU(cudaGraphLaunch(exec, s)); /* warm-up */
    float t[REPLAYS];
    BENCH_TIME_EVENTS(t, REPLAYS, s, CU(cudaGraphLaunch(exec, s)));
    cudaGraphExecDestroy(exec), cudaGraphDestroy(g);
    return bench_median(t, REPLAYS) / RUNS;
}

/* What a timed loop runs: the combine in a mode, or the bare collectives. */
typedef struct op {
    kva_dcp_nccl *dcp;
    ncclComm_t comm;
    cudaStream_t s;
    int mode, bare, T, N, rank, H, D; /* bare: 0 the combine, 1 the bare collectives, 2
                                         (A2A) the bare all-to-all with the self block, 3
                                         the floor: 1 with empty kernels where the
                                         combine's are; LSA's bare ones are A2A's */
    void *part, *out, *sbuf, *rbuf;
    float *lse, *lse_out;
} op;

static void op_run(const op *o)
{
    if (!o->bare) {
        KV(kva_dcp_nccl_combine(o->dcp, (kva_dcp_combine)o->mode, o->T, o->part, o->lse, o->out,
                                o->lse_out));
        return;
    }
    const size_t Hn = (size_t)o->H / o->N;
    const int nop = o->bare == 3;
    if (o->mode != KVA_DCP_COMBINE_AG_RS) {
        const size_t block = (size_t)o->T * Hn * (o->D * 2 + 4);
        if (nop)
            CU(dcp_bench_nop(o->s)); /* the pack */
        NC(ncclGroupStart());
        for (int k = 0; k < o->N; k++) {
            if (k == o->rank && o->bare != 2)
                continue;
            NC(ncclSend((char *)o->sbuf + k * block, block, ncclUint8, k, o->comm, o->s));
            NC(ncclRecv((char *)o->rbuf + k * block, block, ncclUint8, k, o->comm, o->s));
        }
        NC(ncclGroupEnd());
        if (nop)
            CU(dcp_bench_nop(o->s)); /* the merge */
    } else {
        NC(ncclAllGather(o->lse, o->rbuf, (size_t)o->T * o->H, ncclFloat32, o->comm, o->s));
        if (nop)
            CU(dcp_bench_nop(o->s)); /* the rescale */
        NC(ncclReduceScatter(o->sbuf, o->rbuf, (size_t)o->T * Hn * o->D, ncclFloat32, ncclSum,
                             o->comm, o->s));
        if (nop)
            CU(dcp_bench_nop(o->s)); /* the conversion */
    }
}

/* Mean ms per call of iters back-to-back calls after a barrier, enqueued one
 * by one or (graph) captured in one CUDA graph. */
static float time_op(const op *o, int iters, int graph, float *barrier)
{
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++)
        op_run(o);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    if (graph) {
        CU(cudaStreamBeginCapture(o->s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < iters; i++)
            op_run(o);
        CU(cudaStreamEndCapture(o->s, &g));
        CU(cudaGraphInstantiate(&exec, g, 0));
        CU(cudaGraphLaunch(exec, o->s)); /* warm-up */
    }
    NC(ncclAllReduce(barrier, barrier, 1, ncclFloat32, ncclSum, o->comm, o->s));
    CU(cudaStreamSynchronize(o->s));
    CU(cudaEventRecord(e0, o->s));
    if (graph)
        CU(cudaGraphLaunch(exec, o->s));
    else
        for (int i = 0; i < iters; i++)
            op_run(o);
    CU(cudaEventRecord(e1, o->s));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (graph)
        cudaGraphExecDestroy(exec), cudaGraphDestroy(g);
    return ms / iters;
}

static void rank_main(const cfg *c, ncclUniqueId id)
{
    const int N = c->N, rank = c->rank, H = c->H, D = c->D, R = c->R, Hn = H / N;
    CU(cudaSetDevice(rank));
    int lib = 0;
    NC(ncclGetVersion(&lib));
    if (rank == 0)
        printf("NCCL: library %d, headers %d\n", lib, (int)NCCL_VERSION_CODE);
    ncclComm_t comm;
    NC(ncclCommInitRank(&comm, N, id, rank));
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, rank};
    /* Two contexts: a CUDA context's newest plan owns its device metadata,
     * and the unsharded and the sharded plan run in turn. */
    kva_context *gpu = NULL, *gfull = NULL;
    KV(kva_context_create(&gd, &gpu));
    KV(kva_context_create(&gd, &gfull));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    KV(kva_cuda_context_set_stream(gpu, s));
    KV(kva_cuda_context_set_stream(gfull, s));
    const int TMAX = 4096 > R ? 4096 : R;
    kva_dcp_nccl *dcp = NULL;
    KV(kva_dcp_nccl_create(gpu, comm, TMAX, H, D, KVA_DTYPE_BF16, &dcp));

    /* Attention: unsharded and sharded decode, checked, then timed. */
    const size_t row = (size_t)c->Hkv * D;
    uint16_t *pk = malloc(P * row * 2), *pv = malloc(P * row * 2);
    kva_rng rng = {2026};
    kva_test_fill_uniform(pk, KVA_DTYPE_BF16, P * row, &rng);
    kva_test_fill_uniform(pv, KVA_DTYPE_BF16, P * row, &rng);
    kva_cache *full, *shard;
    kva_plan *pfull, *pshard;
    build(c, gfull, 1, 0, pk, pv, &full, &pfull);
    build(c, gpu, N, rank, pk, pv, &shard, &pshard);
    free(pk), free(pv);
    const size_t nq = (size_t)R * H * D;
    uint16_t *q = malloc(nq * 2), *want = malloc(nq * 2), *got = malloc(nq * 2);
    kva_test_fill(q, KVA_DTYPE_BF16, nq, &rng, 1.5);
    void *dq, *dfull, *dpart, *dout;
    float *dlse, *dlo;
    CU(cudaMalloc(&dq, nq * 2));
    CU(cudaMalloc(&dfull, nq * 2));
    CU(cudaMalloc(&dpart, nq * 2));
    CU(cudaMalloc(&dout, nq * 2));
    CU(cudaMalloc((void **)&dlse, sizeof(float) * R * H));
    CU(cudaMalloc((void **)&dlo, sizeof(float) * R * H));
    CU(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(dfull, 0xff, nq * 2));
    CU(cudaMemset(dpart, 0xff, nq * 2));
    KV(kva_attention_run(gfull, pfull, dq, full, NULL, dfull, NULL));
    KV(kva_attention_run(gpu, pshard, dq, shard, NULL, dpart, dlse));
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(want, dfull, nq * 2, cudaMemcpyDeviceToHost));
    /* LSA_win: the LSA combine on partials the attention wrote into the
     * window (kva_dcp_nccl_partials), pulled by the peers; LSA: on the
     * caller's partials, pushed to the peers. */
    static const kva_dcp_combine modes[4] = {KVA_DCP_COMBINE_A2A, KVA_DCP_COMBINE_AG_RS,
                                             KVA_DCP_COMBINE_LSA, KVA_DCP_COMBINE_LSA};
    static const char *names[4] = {"A2A", "AG_RS", "LSA", "LSA_win"};
    void *wpart = NULL;
    float *wlse = NULL;
    const int nmodes = kva_dcp_nccl_partials(dcp, &wpart, &wlse) == KVA_STATUS_OK ? 4 : 2;
    if (nmodes == 2)
        printf("rank %d: no LSA combine: %s\n", rank, kva_last_error());
    for (int m = 0; m < nmodes; m++) {
        CU(cudaMemset(dout, 0xff, nq * 2));
        if (m == 3) {
            KV(kva_attention_run(gpu, pshard, dq, shard, NULL, wpart, wlse));
            KV(kva_dcp_nccl_combine(dcp, modes[m], R, wpart, wlse, dout, dlo));
        } else {
            KV(kva_dcp_nccl_combine(dcp, modes[m], R, dpart, dlse, dout, dlo));
        }
        CU(cudaStreamSynchronize(s));
        CU(cudaMemcpy(got, dout, (size_t)R * Hn * D * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        double worst = 0;
        for (int t = 0; t < R; t++)
            for (int j = 0; j < Hn * D; j++) {
                const double a = kva_bf16_to_f32(got[(size_t)t * Hn * D + j]);
                const double w = kva_bf16_to_f32(want[((size_t)t * H + rank * Hn) * D + j]);
                const double err = fabs(a - w);
                /* bf16 tolerance + the P rounding of the tensor-core decode (|v| < sqrt 3). */
                bad += !(err <= kva_test_atol(KVA_DTYPE_BF16) + 0x1p-8 * 1.7320508 +
                                    kva_test_rtol(KVA_DTYPE_BF16) * (fabs(w) + 1.7320508));
                worst = err > worst || err != err ? err : worst;
            }
        printf("rank %d: check %s: combined sharded decode vs unsharded: max |diff| %.3g, %s\n",
               rank, names[m], worst, bad ? "FAILED" : "ok");
        if (bad)
            DIE("rank %d: %zu values differ", rank, bad);
    }
    const float tf = time_run(gfull, s, pfull, dq, full, dfull, NULL, c->iters);
    const float ts = time_run(gpu, s, pshard, dq, shard, dpart, dlse, c->iters);
    const float gf = time_run_graph(gfull, s, pfull, dq, full, dfull, NULL);
    const float gs = time_run_graph(gpu, s, pshard, dq, shard, dpart, dlse);
    printf("rank %d: decode R=%d S=%d H=%d Hkv=%d D=%d bf16: stream: unsharded %.4f ms, rank's "
           "shard (N=%d I=%d) %.4f ms: ratio %.3f; graph: %.4f ms, %.4f ms: ratio %.3f\n",
           rank, R, c->S, H, c->Hkv, D, tf, N, c->I, ts, ts / tf, gf, gs, gs / gf);
    fflush(stdout);
    kva_plan_destroy(pfull), kva_plan_destroy(pshard);
    kva_cache_destroy(full), kva_cache_destroy(shard);

    /* Combine against the bare collectives. */
    const size_t pe = (size_t)TMAX * H * D;
    void *part, *out, *sbuf, *rbuf;
    float *lse, *lse_out, *barrier;
    CU(cudaMalloc(&part, pe * 2));
    CU(cudaMalloc(&out, pe * 2));
    CU(cudaMalloc(&sbuf, pe * 4 + (size_t)TMAX * H * 4));
    CU(cudaMalloc(&rbuf, pe * 4 * N + (size_t)TMAX * H * 4 * N));
    CU(cudaMalloc((void **)&lse, sizeof(float) * TMAX * H));
    CU(cudaMalloc((void **)&lse_out, sizeof(float) * TMAX * H));
    CU(cudaMalloc((void **)&barrier, sizeof(float)));
    CU(cudaMemset(barrier, 0, sizeof(float)));
    uint16_t *hp = malloc(pe * 2);
    float *hl = malloc(sizeof(float) * TMAX * H);
    kva_test_fill(hp, KVA_DTYPE_BF16, pe, &rng, 1.0);
    for (size_t i = 0; i < (size_t)TMAX * H; i++)
        hl[i] = (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
    CU(cudaMemcpy(part, hp, pe * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(lse, hl, sizeof(float) * TMAX * H, cudaMemcpyHostToDevice));
    free(hp), free(hl);
    const int Ts[] = {R, 64, 512, 4096};
    /* The window's partials for LSA_win (the same random rows). */
    if (wpart) {
        CU(cudaMemcpy(wpart, part, pe * 2, cudaMemcpyDeviceToDevice));
        CU(cudaMemcpy(wlse, lse, sizeof(float) * TMAX * H, cudaMemcpyDeviceToDevice));
    }
    for (int ti = 0; ti < 4; ti++)
        for (int m = 0; m < nmodes; m++) {
            const int win = m == 3, lsa = modes[m] == KVA_DCP_COMBINE_LSA;
            op o = {dcp,
                    comm,
                    s,
                    modes[m],
                    0,
                    Ts[ti],
                    N,
                    rank,
                    H,
                    D,
                    win ? wpart : part,
                    out,
                    sbuf,
                    rbuf,
                    win ? wlse : lse,
                    lse_out};
            const int a2a = modes[m] != KVA_DCP_COMBINE_AG_RS;
            const double mb = a2a ? (double)Ts[ti] * H * (D * 2 + 4) / 1e6
                                  : ((double)Ts[ti] * H * 4 + (double)Ts[ti] * H * D * 4) / 1e6;
            for (int graph = 0; graph < 2; graph++) {
                o.bare = 0;
                const float tc = time_op(&o, c->iters, graph, barrier);
                o.bare = 1;
                const float tb = time_op(&o, c->iters, graph, barrier);
                o.bare = 2;
                const float ta = a2a ? time_op(&o, c->iters, graph, barrier) : 0.f;
                o.bare = 3;
                const float tn = lsa ? 0.f : time_op(&o, c->iters, graph, barrier);
                printf("rank %d: combine %-5s T=%-5d H=%d Dv=%d bf16 (%.2f MB) %s: %.4f "
                       "ms, bare collective %.4f ms: ratio %.2f",
                       rank, names[m], Ts[ti], H, D, mb, graph ? "graph " : "stream", tc, tb,
                       tc / tb);
                if (a2a)
                    printf(" (bare a2a with self %.4f ms: ratio %.2f)", ta, tc / ta);
                if (lsa)
                    printf("; one kernel\n");
                else
                    printf("; floor (bare + empty kernels) %.4f ms: %.2f x bare\n", tn, tn / tb);
                fflush(stdout);
            }
        }
    cudaFree(part), cudaFree(out), cudaFree(sbuf), cudaFree(rbuf), cudaFree(lse);
    cudaFree(lse_out), cudaFree(barrier), cudaFree(dq), cudaFree(dfull), cudaFree(dpart);
    cudaFree(dout), cudaFree(dlse), cudaFree(dlo);
    free(q), free(want), free(got);
    kva_dcp_nccl_destroy(dcp);
    kva_context_destroy(gpu);
    kva_context_destroy(gfull);
    cudaStreamDestroy(s);
    ncclCommDestroy(comm);
}

int main(int argc, char **argv)
{
    cfg c = {2, 8, 131072, 32, 8, 128, 1, 50, 0};
    int *f[] = {&c.N, &c.R, &c.S, &c.H, &c.Hkv, &c.D, &c.I, &c.iters};
    for (int i = 1; i < argc && i <= 8; i++)
        *f[i - 1] = atoi(argv[i]);
    if (c.N < 1 || c.N > KVA_MAX_DCP || c.H % c.N || c.R < 1 || c.S < 1 || c.iters < 1 || c.I < 1) {
        fprintf(stderr, "usage: dcp_nccl_bench [N R S H Hkv D I iters] (H a multiple of N)\n");
        return 2;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    fflush(NULL);
    int fds[KVA_MAX_DCP][2];
    for (int r = 1; r < c.N; r++)
        if (pipe(fds[r]) != 0)
            return 2;
    pid_t pids[KVA_MAX_DCP];
    for (int r = 0; r < c.N; r++) {
        pids[r] = fork();
        if (pids[r] != 0)
            continue;
        alarm(500);
        ncclUniqueId id;
        if (r == 0) {
            NC(ncclGetUniqueId(&id));
            for (int p = 1; p < c.N; p++)
                if (write(fds[p][1], &id, sizeof id) != (ssize_t)sizeof id)
                    DIE("pipe write");
        } else if (read(fds[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
            DIE("pipe read");
        }
        c.rank = r;
        rank_main(&c, id);
        fflush(NULL);
        _exit(0);
    }
    int failed = 0, st;
    for (int r = 0; r < c.N; r++) {
        waitpid(pids[r], &st, 0);
        failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return failed;
}
