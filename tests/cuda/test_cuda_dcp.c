/*
 * test_cuda_dcp.c - decode context parallelism on one GPU: N ranks emulated
 * in one process. For N = 1, 2, 3, 4, 8 and I = 1 and B, each rank's sharded
 * cache (filled on the host through kva_dcp_slots, uploaded with its
 * per-token scales) is read by its sharded plan on the CUDA backend, and
 * kva_merge_states_n on the device combines the N partials; the result must
 * equal the reference's unsharded run. Cases: causal decodes, and a mixed
 * batch (decodes, spec decodes, a prefill chunk, requests shorter than N * I)
 * under every mask: causal, sliding window, ALiBi + soft-cap, sinks,
 * non-causal, a local chunk (its start taken on global positions). Rows that do not see every local
 * key take global positions (dcp_pos.cuh); the others run as non-causal plans. Every case runs on
 * the dispatcher's kernels (D = Dv = 64: the tensor-core decode, prefill tiles where rows see all
 * keys) and with decode_simt forced; f16 and bf16 caches, plus fp8 and int8 keys + f16 values under
 * causal, ALiBi and the chunk. The merge is also captured in a CUDA graph and replayed into a
 * poisoned output. Exits 77 without a GPU.
 */
#define KVA_DCP_D 64
#define KVA_DCP_DV 64
#include "dcp_util.h"
#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

/* The rank's host cache on the GPU: created with the same static scales
 * (setup_rank's), its K/V codes and per-token scales copied. */
static kva_cache *upload_rank_cache(kva_context *gpu, const fmt *f, const kva_cache *hc)
{
    kva_cache_desc cd;
    CHECK_OK(kva_cache_get_desc(hc, &cd));
    kva_rng pr = {1234};
    float pbuf[2 * HKV * (D + DV)];
    kva_quant_params qp;
    make_params(f->quant, HKV, D, DV, 0, &pr, pbuf, &qp);
    kva_cache *dc = NULL;
    CHECK_OK(kva_cache_create_quant(gpu, &cd, f->quant == KVA_QUANT_NONE ? NULL : &qp, &dc));
    cache_upload(dc, hc);
    return dc;
}

static void check_case(kva_context *ref, kva_context *gpu, cudaStream_t stream, const fmt *f,
                       const mask *m, const char *kernel)
{
    kva_rng rng = {99};
    dcp_data dd;
    dcp_data_make(f, &rng, &dd);
    const int32_t T = dd.T;
    const size_t es = dd.es, on = dd.on;
    const float *k = dd.k, *v = dd.v;
    const void *q = dd.q;
    void *dq = dev_from(q, es * T * H * D);
    const float slopes[H] = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
    float sinks[H];
    for (int h = 0; h < H; h++)
        sinks[h] = (float)(kva_rng_unit(&rng) * 4.0 - 2.0);
    const float *hs = m->sinks ? sinks : NULL;
    float *dsinks = m->sinks ? dev_from(sinks, sizeof sinks) : NULL;

    rank_run full;
    void *want = malloc(es * on), *parts = malloc(es * on * 8), *got = malloc(es * on);
    float *want_lse = malloc(sizeof(float) * T * H);
    CHECK_OK(setup_rank(ref, f, m, 0, 0, 0, k, v, slopes, &full, NULL));
    CHECK_OK(kva_attention_run(ref, full.plan, q, full.cache, hs, want, want_lse));
    free_rank(&full);
    static const int32_t Ns[] = {1, 2, 3, 4, 8};
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
        for (int32_t I = 1; I <= B; I += B - 1) {
            const int32_t N = Ns[ni];
            void *dparts = dev_poisoned(es * on * N), *dout = dev_poisoned(es * on);
            float *dlses = dev_poisoned(sizeof(float) * T * H * N);
            for (int32_t rank = 0; rank < N; rank++) {
                rank_run rr;
                CHECK_OK(setup_rank(ref, f, m, N, rank, I, k, v, slopes, &rr, gpu));
                kva_cache *dc = upload_rank_cache(gpu, f, rr.cache);
                CHECK_OK(kva_attention_run(gpu, rr.plan, dq, dc, dsinks,
                                           (char *)dparts + es * on * rank, dlses + T * H * rank));
                CUDA_OK(cudaStreamSynchronize(stream));
                kva_cache_destroy(dc);
                free_rank(&rr);
            }
            CHECK_OK(
                kva_merge_states_n(gpu, N, T, H, DV, f->q_dt, dparts, 0, dlses, 0, dout, NULL));
            to_host(parts, dparts, es * on * N);
            char label[160];
            snprintf(label, sizeof label, "cuda %s %s %s N=%d I=%d", kernel, f->name, m->name,
                     (int)N, (int)I);
            for (int replay = 0; replay < 2; replay++) {
                to_host(got, dout, es * on);
                /* + the tensor-core decode's P rounding (2^-8 * max|v|). */
                const size_t bad = dcp_compare(replay ? "graph" : label, f->q_dt, got, want, parts,
                                               N, on, 0x1p-8 * 1.7320508);
                CHECK_MSG(bad == 0, "%s%s: %zu elements differ", label, replay ? " (graph)" : "",
                          bad);
                if (replay)
                    break;
                /* The merge captured in a graph with fixed buffers, replayed into a
                 * poisoned output. */
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                dev_fill(dout, 0xff, es * on);
                CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
                CHECK_OK(
                    kva_merge_states_n(gpu, N, T, H, DV, f->q_dt, dparts, 0, dlses, 0, dout, NULL));
                CUDA_OK(cudaStreamEndCapture(stream, &graph));
                CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
                CUDA_OK(cudaGraphLaunch(exec, stream));
                CUDA_OK(cudaStreamSynchronize(stream));
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
            }
            cudaFree(dparts);
            cudaFree(dout);
            cudaFree(dlses);
        }
    }
    free(want), free(parts), free(got), free(want_lse);
    dcp_data_free(&dd);
    cudaFree(dq);
    cudaFree(dsinks);
}

static void test_emulated_ranks(void)
{
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ref = NULL, *gpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&gd, &gpu));
    cudaStream_t stream = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, stream));
    const int32_t mixed[R] = {1, 3, 9, 1, 1, 2};
    const fmt *fs[] = {&fmts[1], &fmts[2], &fmts[6], &fmts[5]}; /* f16, bf16, fp8, int8 + f16 V */
    static const char *kernels[] = {"auto", "decode_simt"};
    for (int ki = 0; ki < 2; ki++) {
        CHECK_OK(kva__context_force_kernel(gpu, ki ? kernels[ki] : NULL));
        for (int fi = 0; fi < 4; fi++) {
            /* Causal decodes: every row sees all of its rank's keys. */
            for (int32_t r = 0; r < R; r++)
                q_lens[r] = 1;
            check_case(ref, gpu, stream, fs[fi], &masks[0], kernels[ki]);
            /* The mixed batch under every mask (the quantized formats: causal, ALiBi). */
            memcpy(q_lens, mixed, sizeof mixed);
            for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++)
                if (fi < 2 || mi == 0 || mi == 2 || masks[mi].chunk > 0)
                    check_case(ref, gpu, stream, fs[fi], &masks[mi], kernels[ki]);
        }
    }
    kva_context_destroy(gpu);
    kva_context_destroy(ref);
    cudaStreamDestroy(stream);
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_emulated_ranks);
#endif
    return kva_test_finish();
}
