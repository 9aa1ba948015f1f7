/*
 * test_dcp_nccl_ranks.c - decode context parallelism over NCCL on N GPUs of
 * one host, N processes (argument 1, default 2): rank r runs on GPU r.
 *
 * The parent forks the ranks before any CUDA or NCCL call (a process that
 * touched CUDA cannot fork a child that uses it); rank 0 makes the
 * ncclUniqueId and hands it to the others through pipes, and each rank
 * joins with ncclCommInitRank. Every rank builds the same random K/V (fixed
 * seed), keeps its own tokens in its cache through kva_dcp_slots (shuffled
 * block tables; the host cache's codes and per-token scales are uploaded to
 * the GPU cache, so the GPU reads the codes the reference reads), runs its
 * sharded plan on the CUDA backend and combines with every
 * kva_dcp_nccl_combine mode (A2A, AG_RS and LSA, the last on the caller's
 * partials (pushed to the peers) and with the attention writing into the
 * LSA window (read in place by the peers)). Each rank checks the output
 * and lse of its H / N heads against the reference backend's unsharded run
 * on the same inputs: bf16, fp8 and int8 (per-token keys) caches, bf16
 * queries and outputs, interleave I = 1 and I = B, a causal decode batch and
 * a non-causal mixed batch (spec decodes and a prefill chunk); the first
 * case also replays every combine from a CUDA graph into poisoned outputs
 * (twice: the push's receive parity lives on the device), runs them on
 * tensors 2 bytes off 16-byte alignment (the combine kernels' element-wise
 * path) and runs a burst of LSA pushes back to back with no host wait
 * (ranks drift apart; each output must still be exact). Then large()
 * combines partials big enough that the window's are pulled, not pushed.
 * Rank 0 prints the NCCL library's and headers' versions; where they differ
 * (another libnccl.so.2 first on the loader's path) the LSA setup must
 * refuse with UNSUPPORTED and a message naming both, and the other modes
 * must still pass.
 * Exits 77 without NCCL, without the CUDA backend or with fewer than N GPUs.
 */
#define _POSIX_C_SOURCE 200809L /* fork, pipe, setenv */
#include <stdio.h>

#ifndef KVA_HAVE_NCCL
int main(void)
{
    printf("test_dcp_nccl_ranks: skipped: kvattn was built without NCCL\n");
    return 77;
}
#else
#include "cache_util.h"
#include "cuda/cuda_util.h"
#include "kvattn_nccl.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { R = 6, H = 8, HKV = 2, D = 64, B = 16, BURST = 6 };
static const int32_t seq_lens[R] = {37, 300, 5, 1200, 64, 2};
static const int32_t decode_q[R] = {1, 1, 1, 1, 1, 1}, mixed_q[R] = {1, 3, 9, 1, 2, 1};

/* vmax bounds |v| as the cache stores it: the input's sqrt(3), fp8's
 * rounding on top, int8 codes times make_params' scales plus its offsets. */
typedef struct fmt {
    const char *name;
    kva_quant quant;
    kva_dtype cache_dt;
    double vmax;
} fmt;
static const fmt fmts[] = {
    {"bf16", KVA_QUANT_NONE, KVA_DTYPE_BF16, 1.7320508},
    {"fp8", KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 1.85},
    {"int8_token_k", KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, 5.5},
};

/* A cache on ctx holding the tokens of rank `rank` of N (N = 1: all), filled
 * from every token's K/V [sum(seq_lens), Hkv, D] float32 through
 * kva_dcp_slots, and its block table (*bt, R x *stride). */
static kva_cache *make_cache(kva_context *ctx, const fmt *f, int32_t N, int32_t rank, int32_t I,
                             const float *k, const float *v, int32_t **bt, int32_t *stride)
{
    int32_t local[R], nb = 1;
    *stride = 1;
    CHECK_OK(kva_dcp_local_lens(R, seq_lens, N, rank, I, local));
    for (int32_t r = 0; r < R; r++) {
        const int32_t need = (local[r] + B - 1) / B;
        *stride = need > *stride ? need : *stride;
        nb += need;
    }
    *bt = malloc(sizeof(int32_t) * R * *stride);
    int32_t next = 0;
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < *stride; j++)
            (*bt)[r * *stride + j] = j < (local[r] + B - 1) / B
                                         ? 1 + (int32_t)(((int64_t)next++ * 7919) % (nb - 1))
                                         : -1;
    kva_cache_desc cd = make_desc(nb, B, HKV, D, D, f->cache_dt, KVA_LAYOUT_NHD);
    cd.quant = f->quant;
    kva_rng pr = {1234}; /* the same static scales on every rank */
    float pbuf[4 * HKV * D];
    kva_quant_params qp;
    make_params(f->quant, HKV, D, D, 0, &pr, pbuf, &qp);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, f->quant == KVA_QUANT_NONE ? NULL : &qp, &c));
    int64_t row0 = 0;
    for (int32_t r = 0; r < R; r++) {
        int64_t *slots = malloc(sizeof(int64_t) * seq_lens[r]);
        CHECK_OK(kva_dcp_slots(N, rank, I, B, *bt + r * *stride, *stride, 0, seq_lens[r], slots));
        CHECK_OK(kva_cache_write(ctx, c, seq_lens[r], k + row0 * HKV * D, 0, v + row0 * HKV * D, 0,
                                 KVA_DTYPE_F32, slots));
        free(slots);
        row0 += seq_lens[r];
    }
    return c;
}

/* The same cache on the GPU context: created with the same static scales,
 * its K/V codes and per-token scales copied from the host cache. */
static kva_cache *upload(kva_context *gpu, const fmt *f, const kva_cache *hc)
{
    kva_cache_desc cd;
    CHECK_OK(kva_cache_get_desc(hc, &cd));
    kva_rng pr = {1234};
    float pbuf[4 * HKV * D];
    kva_quant_params qp;
    make_params(f->quant, HKV, D, D, 0, &pr, pbuf, &qp);
    kva_cache *dc = NULL;
    CHECK_OK(kva_cache_create_quant(gpu, &cd, f->quant == KVA_QUANT_NONE ? NULL : &qp, &dc));
    cache_upload(dc, hc);
    return dc;
}

static kva_plan *make_plan(kva_context *ctx, const int32_t *q_lens, int causal, int32_t N,
                           int32_t rank, int32_t I, const int32_t *bt, int32_t stride)
{
    int32_t qsl[R + 1] = {0};
    for (int32_t r = 0; r < R; r++)
        qsl[r + 1] = qsl[r] + q_lens[r];
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = bt;
    pd.block_table_stride = stride;
    pd.block_size = B;
    pd.decode_threshold = 3;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.head_dim_v = D;
    pd.q_dtype = KVA_DTYPE_BF16;
    pd.causal = causal;
    pd.window_left = -1;
    pd.dcp_size = N;
    pd.dcp_rank = rank;
    pd.dcp_interleave = I;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    return p;
}

/* Elements of this rank's heads (out [T, Hn, D], lse [T, Hn]) that differ
 * from the unsharded want [T, H, D] / want_lse [T, H] beyond bf16's
 * tolerance plus the P rounding of the tensor-core paths (P is rounded to
 * bf16 before P V: up to 2^-8 * max|v|); prints the first three. */
static size_t compare_heads(const char *label, double vmax, int32_t T, int32_t N, int32_t rank,
                            const uint16_t *got, const float *got_lse, const uint16_t *want,
                            const float *want_lse)
{
    const int32_t Hn = H / N;
    size_t bad = 0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t j = 0; j < Hn; j++) {
            const size_t w0 = ((size_t)t * H + rank * Hn + j) * D, g0 = ((size_t)t * Hn + j) * D;
            for (int32_t x = 0; x < D; x++) {
                const double a = kva_bf16_to_f32(got[g0 + x]), w = kva_bf16_to_f32(want[w0 + x]);
                const double tol = kva_test_atol(KVA_DTYPE_BF16) + 0x1p-8 * vmax +
                                   kva_test_rtol(KVA_DTYPE_BF16) * (fabs(w) + vmax);
                if (!(fabs(a - w) <= tol) && bad++ < 3)
                    fprintf(stderr, "  %s: token %d head %d [%d]: got %.6g, want %.6g\n", label,
                            (int)t, (int)(rank * Hn + j), (int)x, a, w);
            }
            const double la = got_lse[(size_t)t * Hn + j],
                         lw = want_lse[(size_t)t * H + rank * Hn + j];
            if (!(fabs(la - lw) <= 1e-3 + 1e-4 * fabs(lw)) && bad++ < 3)
                fprintf(stderr, "  %s: token %d head %d lse: got %.8g, want %.8g\n", label, (int)t,
                        (int)(rank * Hn + j), la, lw);
        }
    return bad;
}

/* One combine into poisoned outputs, directly or replayed from a graph. */
static void combine(kva_dcp_nccl *dcp, cudaStream_t s, kva_dcp_combine mode, int graph, int32_t T,
                    const void *dpart, const float *dlse, void *dout, float *dlo, size_t obytes)
{
    CUDA_OK(cudaMemset(dout, 0xff, obytes));
    CUDA_OK(cudaMemset(dlo, 0xff, sizeof(float) * T * H));
    CUDA_OK(cudaDeviceSynchronize()); /* the poison lands before s (non-blocking) runs */
    if (!graph) {
        CHECK_OK(kva_dcp_nccl_combine(dcp, mode, T, dpart, dlse, dout, dlo));
        return;
    }
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_OK(kva_dcp_nccl_combine(dcp, mode, T, dpart, dlse, dout, dlo));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    /* Again into fresh poison: the replay must not depend on host state. */
    CUDA_OK(cudaMemset(dout, 0xff, obytes));
    CUDA_OK(cudaMemset(dlo, 0xff, sizeof(float) * T * H));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
}

/* BURST LSA combines of the same partials (the caller's: pushed) enqueued
 * back to back into their own poisoned outputs, one wait at the end; each
 * output is checked against the unsharded run. */
static void burst(kva_dcp_nccl *dcp, int32_t N, int32_t rank, double vmax, int32_t T,
                  const void *dpart, const float *dlse, char *bout, float *blo,
                  const uint16_t *want, const float *want_lse)
{
    const int32_t Hn = H / N;
    const size_t ob = 2 * (size_t)T * Hn * D;
    uint16_t *got = malloc(ob);
    float *got_lse = malloc(sizeof(float) * T * Hn);
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < BURST; i++)
        CHECK_OK(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, T, dpart, dlse, bout + i * ob,
                                      blo + (size_t)i * T * Hn));
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < BURST; i++) {
        to_host(got, bout + i * ob, ob);
        to_host(got_lse, blo + (size_t)i * T * Hn, sizeof(float) * T * Hn);
        char label[64];
        snprintf(label, sizeof label, "rank %d/%d LSA burst %d", (int)rank, (int)N, i);
        const size_t bad = compare_heads(label, vmax, T, N, rank, got, got_lse, want, want_lse);
        CHECK_MSG(bad == 0, "%s: %zu values differ", label, bad);
    }
    free(got), free(got_lse);
}

/* Large partials (TL tokens: more bytes than the LSA combine pushes from
 * its window, so those are pulled; from the caller's buffer pushed, over
 * the full grid): random partials of every rank (seeded by rank, so each
 * rank makes all of them), the reference kva_merge_states_n of all of them
 * on the host, each LSA combine checked on this rank's heads. */
static void large(ncclComm_t comm, kva_context *gpu, kva_context *ref, int32_t N, int32_t rank)
{
    enum { TL = 8448 }; /* 8448 * 8 * 64 * 2 bytes: 8.25 MiB */
    const size_t pe = (size_t)TL * H * D, le = (size_t)TL * H;
    kva_dcp_nccl *dcp = NULL;
    CHECK_OK(kva_dcp_nccl_create(gpu, comm, TL, H, D, KVA_DTYPE_BF16, &dcp));
    void *wpart = NULL;
    float *wlse = NULL;
    CHECK_OK(kva_dcp_nccl_partials(dcp, &wpart, &wlse));
    uint16_t *parts = malloc(2 * pe * N), *want = malloc(2 * pe), *got = malloc(2 * pe / N);
    float *lses = malloc(sizeof(float) * le * N), *want_lse = malloc(sizeof(float) * le),
          *got_lse = malloc(sizeof(float) * le / N);
    for (int32_t p = 0; p < N; p++) {
        kva_rng rng = {900 + (uint64_t)p};
        kva_test_fill(parts + pe * p, KVA_DTYPE_BF16, pe, &rng, 1.0);
        for (size_t i = 0; i < le; i++)
            lses[le * p + i] = (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
    }
    CHECK_OK(
        kva_merge_states_n(ref, N, TL, H, D, KVA_DTYPE_BF16, parts, 0, lses, 0, want, want_lse));
    void *dpart = dev_poisoned(2 * pe), *dout = dev_poisoned(2 * pe / N);
    float *dlse = dev_poisoned(sizeof(float) * le), *dlo = dev_poisoned(sizeof(float) * le / N);
    if (wpart && dpart && dout && dlse && dlo) {
        CUDA_OK(cudaMemcpy(dpart, parts + pe * rank, 2 * pe, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dlse, lses + le * rank, sizeof(float) * le, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(wpart, dpart, 2 * pe, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaMemcpy(wlse, dlse, sizeof(float) * le, cudaMemcpyDeviceToDevice));
        for (int win = 0; win < 2; win++) {
            CUDA_OK(cudaMemset(dout, 0xff, 2 * pe / N));
            CUDA_OK(cudaMemset(dlo, 0xff, sizeof(float) * le / N));
            CUDA_OK(cudaDeviceSynchronize());
            CHECK_OK(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, TL, win ? wpart : dpart,
                                          win ? wlse : dlse, dout, dlo));
            CUDA_OK(cudaDeviceSynchronize());
            to_host(got, dout, 2 * pe / N);
            to_host(got_lse, dlo, sizeof(float) * le / N);
            char label[64];
            snprintf(label, sizeof label, "rank %d/%d LSA T=%d %s", (int)rank, (int)N, (int)TL,
                     win ? "window (pulled)" : "pushed");
            const size_t bad = compare_heads(label, 1.0, TL, N, rank, got, got_lse, want, want_lse);
            CHECK_MSG(bad == 0, "%s: %zu values differ", label, bad);
        }
    }
    kva_dcp_nccl_destroy(dcp);
    cudaFree(dpart), cudaFree(dout), cudaFree(dlse), cudaFree(dlo);
    free(parts), free(want), free(got), free(lses), free(want_lse), free(got_lse);
}

static void run_rank(int32_t N, int32_t rank, ncclUniqueId id)
{
    CUDA_OK(cudaSetDevice(rank));
    ncclComm_t comm;
    const ncclResult_t nr = ncclCommInitRank(&comm, N, id, rank);
    CHECK_MSG(nr == ncclSuccess, "rank %d: ncclCommInitRank: %s", (int)rank,
              ncclGetErrorString(nr));
    if (nr != ncclSuccess)
        return;
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, rank}, rd = {KVA_BACKEND_REF, 0, 0};
    kva_context *gpu = NULL, *ref = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    CHECK_OK(kva_context_create(&rd, &ref));
    cudaStream_t s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, s));
    int64_t rows = 0;
    for (int32_t r = 0; r < R; r++)
        rows += seq_lens[r];
    const int32_t TMAX = 32, Hn = H / N;
    kva_dcp_nccl *dcp = NULL;
    CHECK_OK(kva_dcp_nccl_create(gpu, comm, TMAX, H, D, KVA_DTYPE_BF16, &dcp));
    void *wpart = NULL; /* the LSA combine's window: the attention writes there */
    float *wlse = NULL;
    int lib = 0;
    CHECK(ncclGetVersion(&lib) == ncclSuccess);
    if (rank == 0)
        printf("NCCL: library %d, headers %d\n", lib, (int)NCCL_VERSION_CODE);
    const kva_status ps = kva_dcp_nccl_partials(dcp, &wpart, &wlse);
    /* One rank needs no device API: its LSA combine is a local merge. */
    const int lsa = lib == NCCL_VERSION_CODE || N == 1;
    if (lsa) {
        CHECK_OK(ps);
        if (!wpart)
            return;
    } else {
        CHECK_MSG(ps == KVA_STATUS_UNSUPPORTED && strstr(kva_last_error(), "runs with libnccl"),
                  "rank %d: library %d, headers %d: LSA setup gave %d (%s)", (int)rank, lib,
                  (int)NCCL_VERSION_CODE, (int)ps, kva_last_error());
    }
    float *k = malloc(sizeof(float) * rows * HKV * D), *v = malloc(sizeof(float) * rows * HKV * D);
    uint16_t *q = malloc(2 * TMAX * H * D), *want = malloc(2 * TMAX * H * D);
    uint16_t *got = malloc(2 * TMAX * Hn * D);
    float *want_lse = malloc(sizeof(float) * TMAX * H), *got_lse = malloc(sizeof(float) * TMAX * H);
    void *dq = dev_poisoned(2 * TMAX * H * D), *dpart = dev_poisoned(2 * TMAX * H * D);
    void *dout = dev_poisoned(2 * TMAX * Hn * D);
    float *dlse = dev_poisoned(sizeof(float) * TMAX * H),
          *dlo = dev_poisoned(sizeof(float) * TMAX * H);
    char *mpart = dev_poisoned(2 * TMAX * H * D + 16), *mout = dev_poisoned(2 * TMAX * Hn * D + 16);
    char *bout = dev_poisoned(BURST * 2 * TMAX * Hn * D);
    float *blo = dev_poisoned(BURST * sizeof(float) * TMAX * Hn);
    int first = 1;
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
        for (int mixed = 0; mixed < 2; mixed++)
            for (int32_t I = 1; I <= B; I += B - 1) {
                const fmt *f = &fmts[fi];
                const int32_t *q_lens = mixed ? mixed_q : decode_q;
                int32_t T = 0;
                for (int32_t r = 0; r < R; r++)
                    T += q_lens[r];
                kva_rng rng = {4242 + fi * 10 + (uint64_t)mixed}; /* the same on every rank */
                kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)rows * HKV * D, &rng);
                kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)rows * HKV * D, &rng);
                kva_test_fill(q, KVA_DTYPE_BF16, (size_t)T * H * D, &rng, 1.5);
                /* The reference's unsharded run. */
                int32_t *bt = NULL, stride = 0;
                kva_cache *full = make_cache(ref, f, 1, 0, 1, k, v, &bt, &stride);
                kva_plan *fp = make_plan(ref, q_lens, !mixed, 1, 0, 1, bt, stride);
                CHECK_OK(kva_attention_run(ref, fp, q, full, NULL, want, want_lse));
                kva_plan_destroy(fp), kva_cache_destroy(full), free(bt);
                /* This rank's shard on its GPU. */
                kva_cache *hc = make_cache(ref, f, N, rank, I, k, v, &bt, &stride);
                kva_cache *dc = upload(gpu, f, hc);
                kva_plan *sp = make_plan(gpu, q_lens, !mixed, N, rank, I, bt, stride);
                CUDA_OK(cudaMemcpy(dq, q, 2 * (size_t)T * H * D, cudaMemcpyHostToDevice));
                CHECK_OK(kva_attention_run(gpu, sp, dq, dc, NULL, dpart, dlse));
                static const kva_dcp_combine modes[3] = {KVA_DCP_COMBINE_A2A, KVA_DCP_COMBINE_AG_RS,
                                                         KVA_DCP_COMBINE_LSA};
                static const char *mnames[3] = {"A2A", "AG_RS", "LSA"};
                static const char *vnames[5] = {"", " graph", " misaligned", " window",
                                                " window graph"};
                if (lsa && first) /* before the others: ranks start apart */
                    burst(dcp, N, rank, f->vmax, T, dpart, dlse, bout, blo, want, want_lse);
                for (int m = 0; m < 3; m++)
                    for (int var = 0; var < 5; var++) {
                        /* 1, 2, 4 on the first case only; 3, 4 (the window's
                         * partials, written by the attention) for LSA only. */
                        if ((var >= 3 && m != 2) ||
                            (!first && (var == 1 || var == 2 || var == 4)) || (m == 2 && !lsa))
                            continue;
                        const kva_dcp_combine mode = modes[m];
                        const int graph = var == 1 || var == 4, mis = var == 2, win = var >= 3;
                        const void *src = dpart;
                        const float *slse = dlse;
                        void *dst = dout;
                        if (mis) {
                            CUDA_OK(cudaDeviceSynchronize());
                            CUDA_OK(cudaMemcpy(mpart + 2, dpart, 2 * (size_t)T * H * D,
                                               cudaMemcpyDeviceToDevice));
                            src = mpart + 2, dst = mout + 2;
                        }
                        if (win) {
                            /* The last combine's kernel has ended on this rank,
                             * so no peer reads the window any more. */
                            CUDA_OK(cudaDeviceSynchronize());
                            CUDA_OK(cudaMemset(wpart, 0xff, 2 * (size_t)T * H * D));
                            CUDA_OK(cudaMemset(wlse, 0xff, sizeof(float) * T * H));
                            CUDA_OK(cudaDeviceSynchronize());
                            CHECK_OK(kva_attention_run(gpu, sp, dq, dc, NULL, wpart, wlse));
                            src = wpart, slse = wlse;
                        }
                        combine(dcp, s, mode, graph, T, src, slse, dst, dlo,
                                2 * (size_t)T * Hn * D);
                        to_host(got, dst, 2 * (size_t)T * Hn * D);
                        to_host(got_lse, dlo, sizeof(float) * T * Hn);
                        char label[128];
                        snprintf(label, sizeof label, "rank %d/%d %s %s I=%d %s%s", (int)rank,
                                 (int)N, f->name, mixed ? "mixed" : "decode", (int)I, mnames[m],
                                 vnames[var]);
                        const size_t bad =
                            compare_heads(label, f->vmax, T, N, rank, got, got_lse, want, want_lse);
                        CHECK_MSG(bad == 0, "%s: %zu values differ", label, bad);
                    }
                first = 0;
                kva_plan_destroy(sp), kva_cache_destroy(dc), kva_cache_destroy(hc), free(bt);
            }
    kva_dcp_nccl_destroy(dcp);
    if (lsa && N > 1)
        large(comm, gpu, ref, N, rank);
    cudaFree(dq), cudaFree(dpart), cudaFree(dout), cudaFree(dlse), cudaFree(dlo);
    cudaFree(mpart), cudaFree(mout), cudaFree(bout), cudaFree(blo);
    free(k), free(v), free(q), free(want), free(got), free(want_lse), free(got_lse);
    kva_context_destroy(gpu);
    kva_context_destroy(ref);
    cudaStreamDestroy(s);
    ncclCommDestroy(comm);
}

/* This process's rank and the pipes the id goes through, for RUN's
 * argument-less test function. */
static int32_t g_n, g_rank;
static int g_fds[KVA_MAX_DCP][2];

static void test_rank(void)
{
    ncclUniqueId id;
    if (g_rank == 0) {
        CHECK(ncclGetUniqueId(&id) == ncclSuccess);
        for (int p = 1; p < g_n; p++)
            CHECK(write(g_fds[p][1], &id, sizeof id) == (ssize_t)sizeof id);
    } else if (read(g_fds[g_rank][0], &id, sizeof id) != (ssize_t)sizeof id) {
        CHECK_MSG(0, "rank %d: no id from rank 0", (int)g_rank);
        return;
    }
    run_rank(g_n, g_rank, id);
}

int main(int argc, char **argv)
{
    const int N = argc > 1 ? atoi(argv[1]) : 2;
    if (N < 1 || N > KVA_MAX_DCP || H % N != 0) {
        fprintf(stderr, "test_dcp_nccl_ranks: N = %d must divide %d heads\n", N, (int)H);
        return 2;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast unless asked for */
    fflush(NULL);
    /* GPUs, counted in a child: the parent must not touch CUDA before it forks. */
    pid_t probe = fork();
    if (probe == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int st = 0;
    waitpid(probe, &st, 0);
    const int gpus = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (gpus < N) {
        printf("test_dcp_nccl_ranks: skipped: %d GPU(s), %d ranks need %d\n", gpus, N, N);
        return 77;
    }
    for (int r = 1; r < N; r++)
        if (pipe(g_fds[r]) != 0)
            return 2;
    pid_t pids[KVA_MAX_DCP];
    for (int r = 0; r < N; r++) {
        pids[r] = fork();
        if (pids[r] != 0)
            continue;
        alarm(300); /* a rank stuck in a collective whose peer died ends */
        g_n = N, g_rank = r;
        RUN(test_rank);
        printf("rank %d: ", r);
        fflush(stdout);
        const int rc = kva_test_finish();
        fflush(NULL);
        _exit(rc);
    }
    int failed = 0;
    for (int r = 0; r < N; r++) {
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "rank %d failed (%s %d)\n", r, WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed = 1;
        }
    }
    printf("%d ranks: %s\n", N, failed ? "FAILED" : "all passed");
    return failed;
}
#endif
