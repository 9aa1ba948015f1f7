/*
 * test_cuda_dcp.c - decode context parallelism on one GPU: N ranks emulated
 * in one process. For N = 1, 2, 3, 4, 8 and I = 1 and B, each rank's sharded
 * cache (filled on the host through kva_dcp_slots, uploaded) is read by its
 * sharded plan on the CUDA backend, and kva_merge_states_n on the device
 * combines the N partials; the result must equal the reference's unsharded
 * run (bf16 and f16), for a causal decode-only batch and a non-causal mixed
 * one. The merge is then captured in a CUDA graph and replayed into a
 * poisoned output. A causal sharded plan whose rows do not all see every
 * local key (spec decodes, prefills) is refused with KVA_STATUS_UNSUPPORTED.
 * Exits 77 without a GPU.
 */
#include "dcp_util.h"
#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

static void check_case(kva_context *ref, kva_context *gpu, cudaStream_t stream, const fmt *f,
                       const mask *m)
{
    kva_rng rng = {99};
    dcp_data dd;
    dcp_data_make(f, &rng, &dd);
    const int32_t T = dd.T;
    const size_t es = dd.es, on = dd.on;
    const float *k = dd.k, *v = dd.v;
    const void *q = dd.q;
    void *dq = dev_from(q, es * T * H * D);

    rank_run full;
    void *want = malloc(es * on), *parts = malloc(es * on * 8), *got = malloc(es * on);
    float *want_lse = malloc(sizeof(float) * T * H);
    CHECK_OK(setup_rank(ref, f, m, 0, 0, 0, k, v, NULL, &full, NULL));
    CHECK_OK(kva_attention_run(ref, full.plan, q, full.cache, NULL, want, want_lse));
    free_rank(&full);

    static const int32_t Ns[] = {1, 2, 3, 4, 8};
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
        for (int32_t I = 1; I <= B; I += B - 1) {
            const int32_t N = Ns[ni];
            void *dparts = dev_poisoned(es * on * N), *dout = dev_poisoned(es * on);
            float *dlses = dev_poisoned(sizeof(float) * T * H * N);
            for (int32_t rank = 0; rank < N; rank++) {
                rank_run rr;
                CHECK_OK(setup_rank(ref, f, m, N, rank, I, k, v, NULL, &rr, gpu));
                kva_cache_desc cd;
                kva_cache *dc = NULL;
                CHECK_OK(kva_cache_get_desc(rr.cache, &cd));
                CHECK_OK(kva_cache_create(gpu, &cd, &dc));
                cache_upload(dc, rr.cache);
                CHECK_OK(kva_attention_run(gpu, rr.plan, dq, dc, NULL,
                                           (char *)dparts + es * on * rank, dlses + T * H * rank));
                CUDA_OK(cudaStreamSynchronize(stream));
                kva_cache_destroy(dc);
                free_rank(&rr);
            }
            CHECK_OK(
                kva_merge_states_n(gpu, N, T, H, DV, f->q_dt, dparts, 0, dlses, 0, dout, NULL));
            to_host(parts, dparts, es * on * N);
            char label[160];
            snprintf(label, sizeof label, "cuda %s %s N=%d I=%d", f->name, m->name, (int)N, (int)I);
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
                CUDA_OK(cudaMemset(dout, 0xff, es * on));
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
    const fmt *fs[] = {&fmts[1], &fmts[2]}; /* f16, bf16 */
    const int32_t mixed[R] = {1, 3, 9, 1, 1, 2};
    for (int fi = 0; fi < 2; fi++) {
        /* Causal decodes: every row sees all of its rank's keys. */
        for (int32_t r = 0; r < R; r++)
            q_lens[r] = 1;
        check_case(ref, gpu, stream, fs[fi], &masks[0]);
        /* Non-causal mixed batch. */
        memcpy(q_lens, mixed, sizeof mixed);
        check_case(ref, gpu, stream, fs[fi], &masks[4]);
    }
    /* Causal mixed batch, window, ALiBi: refused on the GPU for N > 1. */
    kva_rng rng = {5};
    float kv[4096];
    kva_test_fill_uniform(kv, KVA_DTYPE_F32, 4096, &rng);
    for (int mi = 0; mi < 3; mi++) {
        rank_run rr;
        float *big_k = malloc(sizeof(float) * 900 * HKV * D),
              *big_v = malloc(sizeof(float) * 900 * HKV * DV);
        for (size_t i = 0; i < (size_t)900 * HKV * D; i++)
            big_k[i] = kv[i % 4096];
        for (size_t i = 0; i < (size_t)900 * HKV * DV; i++)
            big_v[i] = kv[(i * 7) % 4096];
        float slopes[H] = {0.1f, 0.2f, 0.3f, 0.4f};
        CHECK_STATUS(setup_rank(ref, &fmts[2], &masks[mi], 2, 1, 1, big_k, big_v, slopes, &rr, gpu),
                     KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("sharded");
        kva_cache_destroy(rr.cache);
        free(rr.bt);
        free(big_k), free(big_v);
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
