/*
 * test_cuda_graph.c - CUDA graph capture and replay of a 32-layer decode
 * step. A graph captured over kva_attention_run for 32 layers (each with its
 * own cache, q and out) on the context's stream must be replayable after a
 * new kva_plan_create of the same shape: the plan's metadata lives in the
 * context's fixed device buffers. Capture itself proves the run path makes
 * no host synchronization (a synchronizing call invalidates the capture).
 * Step A is decodes only; step B adds two prefills that run on the
 * tensor-core prefill kernel (its launch is in the graph with 0 tiles for A);
 * then A is planned again and the graph replayed a third time.
 * Every layer's output of every replay is compared with the reference
 * (the layers' reference runs in parallel: OpenMP threads).
 * Then a capture on a stream other than the one the context planned on.
 * Progress lines go to stdout, line-buffered.
 * Exits 77 without a GPU.
 */
#include "batchgen.h"
#include "cuda_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

enum { L = 32, H = 16, HKV = 4, D = 128, BS = 16 };
#define DT KVA_DTYPE_BF16

typedef struct layer {
    kva_cache *hc, *dc; /* host (reference) and device cache */
    void *q, *dq;       /* [Tmax, H, D] */
    void *dout;         /* [Tmax, H, D] */
} layer;

/* Compares every layer's device output with the reference for batch b. The
 * outputs come to the host first; then the layers' reference runs (scalar
 * fp64, seconds per layer for step B's prefills) run in parallel, each on
 * its own reference context and plan. */
static void compare_layers(layer *ly, int nl, const kva_test_batch *b, const char *label, int mma)
{
    /* Rows from prefill_mma or the tensor-core decode (the default for this
     * shape): P rounded to bf16 for P V, + 2^-8 * max|v|. */
    const double atol = kva_test_atol(DT) + (mma ? 0x1p-8 * 1.7320508 : 0.0);
    const kva_plan_desc pd = kva_test_batch_plan_desc(b, H, HKV, D, D, DT);
    const size_t n = (size_t)b->T * H * D, es = 2;
    char *got = malloc(n * es * (size_t)nl);
    for (int l = 0; l < nl; l++)
        to_host(got + n * es * (size_t)l, ly[l].dout, n * es);
    size_t bad = 0;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bad, failed)
    for (int l = 0; l < nl; l++) {
        const kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
        kva_context *ref = NULL;
        kva_plan *pr = NULL;
        void *want = malloc(n * es);
        kva_test_poison(want, DT, n);
        if (kva_context_create(&rd, &ref) == KVA_STATUS_OK &&
            kva_plan_create(ref, &pd, &pr) == KVA_STATUS_OK &&
            kva_attention_run(ref, pr, ly[l].q, ly[l].hc, NULL, want, NULL) == KVA_STATUS_OK)
            bad += kva_test_compare(label, got + n * es * (size_t)l, want, DT, n, atol,
                                    kva_test_rtol(DT));
        else
            failed++;
        free(want);
        kva_plan_destroy(pr);
        kva_context_destroy(ref);
    }
    CHECK_MSG(failed == 0, "%s: %d reference runs failed", label, failed);
    CHECK_MSG(bad == 0, "%s: %zu mismatches over %d layers", label, bad, nl);
    printf("%s: %d layers compared, %zu mismatches\n", label, nl, bad);
    free(got);
}

static void test_graph_replay(void)
{
    kva_rng rng = {123};
    /* Step A: 12 decodes. Step B: decodes, a spec decode, a chunked prefill and
     * one long context (split-KV) - more items and tasks than A. */
    const int32_t qa[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int32_t sa[12] = {40, 300, 17, 90, 1000, 5, 64, 65, 128, 700, 33, 250};
    const int32_t qb[6] = {1, 3, 1, 40, 1, 130}, sb[6] = {3000, 90, 200, 160, 12, 400};
    kva_test_batch ba, bb;
    kva_test_batch_init(&ba, &rng, 12, qa, sa, BS, 2, 0);
    kva_test_batch_init(&bb, &rng, 6, qb, sb, BS, 2, 1);
    const int32_t NB = ba.num_blocks > bb.num_blocks ? ba.num_blocks : bb.num_blocks;
    const int32_t Tmax = ba.T > bb.T ? ba.T : bb.T;

    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ref = NULL, *gpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&gd, &gpu));
    cudaStream_t stream = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, stream));
    kva_cuda_capacity cap = {16, 256, 16 * 256, H, HKV, D};
    CHECK_OK(kva_cuda_context_reserve(gpu, &cap));

    layer ly[L];
    kva_cache_desc cd = {NB, BS, HKV, D, D, DT, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    const size_t nq = (size_t)Tmax * H * D;
    for (int l = 0; l < L; l++) {
        CHECK_OK(kva_cache_create(ref, &cd, &ly[l].hc));
        CHECK_OK(kva_cache_create(gpu, &cd, &ly[l].dc));
        void *k, *v;
        kva_cache_data(ly[l].hc, &k, &v);
        size_t rows = (size_t)NB * BS * HKV;
        kva_test_fill_uniform(k, DT, rows * D, &rng);
        kva_test_fill_uniform(v, DT, rows * D, &rng);
        cache_upload(ly[l].dc, ly[l].hc);
        ly[l].q = malloc(nq * 2);
        kva_test_fill_uniform(ly[l].q, DT, nq, &rng);
        ly[l].dq = dev_from(ly[l].q, nq * 2);
        ly[l].dout = dev_poisoned(nq * 2);
    }

    kva_plan_desc pa = kva_test_batch_plan_desc(&ba, H, HKV, D, D, DT);
    kva_plan *plan_a = NULL;
    CHECK_OK(kva_plan_create(gpu, &pa, &plan_a));
    CUDA_OK(cudaStreamSynchronize(stream));

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < L; l++)
        CHECK_OK(kva_attention_run(gpu, plan_a, ly[l].dq, ly[l].dc, NULL, ly[l].dout, NULL));
    /* Creating a plan during capture is refused (it would upload and may grow). */
    kva_plan *refused = NULL;
    CHECK_STATUS(kva_plan_create(gpu, &pa, &refused), KVA_STATUS_INVALID_ARGUMENT);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    printf("graph replay: %d layers captured\n", L);

    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    /* The shape's default decode kernel is the tensor-core one. */
    const int mma_dec =
        plan_a && ((const kva__cuda_plan *)plan_a->device)->decode_kernel == KVA__CUDA_K_DECODE_MMA;
    CHECK(mma_dec);
    compare_layers(ly, L, &ba, "replay A", mma_dec);

    /* New plan, same shape: the same graph now computes step B. */
    kva_plan_destroy(plan_a);
    kva_plan_desc pb = kva_test_batch_plan_desc(&bb, H, HKV, D, D, DT);
    kva_plan *plan_b = NULL;
    CHECK_OK(kva_plan_create(gpu, &pb, &plan_b));
    kva_plan_info info;
    kva_plan_get_info(plan_b, &info);
    /* Both prefills (40 and 130 tokens x G = 4 rows) go to prefill_mma. */
    CHECK(plan_b && ((const kva__cuda_plan *)plan_b->device)->num_prefills == 2);
    for (int l = 0; l < L; l++)
        CUDA_OK(cudaMemsetAsync(ly[l].dout, 0xff, nq * 2, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    compare_layers(ly, L, &bb, "replay B", 1);

    /* Back to decodes only: the prefill kernel's tile count returns to 0. */
    kva_plan_destroy(plan_b);
    plan_b = NULL;
    CHECK_OK(kva_plan_create(gpu, &pa, &plan_b));
    for (int l = 0; l < L; l++)
        CUDA_OK(cudaMemsetAsync(ly[l].dout, 0xff, nq * 2, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    compare_layers(ly, L, &ba, "replay A again", mma_dec);

    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    kva_plan_destroy(plan_b);
    for (int l = 0; l < L; l++) {
        kva_cache_destroy(ly[l].hc);
        kva_cache_destroy(ly[l].dc);
        free(ly[l].q);
        cudaFree(ly[l].dq);
        cudaFree(ly[l].dout);
    }
    kva_context_destroy(gpu);
    kva_context_destroy(ref);
    cudaStreamDestroy(stream);
    kva_test_batch_free(&ba);
    kva_test_batch_free(&bb);
}

/* A graph captured on a stream of its own over a context planned on another
 * (what torch.cuda.graph does: it captures on a side stream): moving the
 * context onto the capturing stream must not wait on the host (that would end
 * the capture), and the planning stream's uploads stay safe: the drain runs at
 * the next plan. Then plan B on the planning stream, replay there. */
static void test_capture_on_other_stream(void)
{
    enum { NL = 2 };
    kva_rng rng = {321};
    const int32_t qa[4] = {1, 1, 1, 1}, sa[4] = {40, 300, 1000, 5};
    const int32_t qb[4] = {1, 1, 1, 1}, sb[4] = {700, 2, 90, 2500};
    kva_test_batch ba, bb;
    kva_test_batch_init(&ba, &rng, 4, qa, sa, BS, 2, 0);
    kva_test_batch_init(&bb, &rng, 4, qb, sb, BS, 2, 1);
    const int32_t NB = ba.num_blocks > bb.num_blocks ? ba.num_blocks : bb.num_blocks;
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ref = NULL, *gpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&gd, &gpu));
    cudaStream_t main_s = NULL, cap_s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&cap_s, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, main_s));
    kva_cuda_capacity cap = {4, 4, 4 * 512, H, HKV, D};
    CHECK_OK(kva_cuda_context_reserve(gpu, &cap));
    layer ly[NL];
    kva_cache_desc cd = {NB, BS, HKV, D, D, DT, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MHA};
    const size_t nq = (size_t)4 * H * D;
    for (int l = 0; l < NL; l++) {
        CHECK_OK(kva_cache_create(ref, &cd, &ly[l].hc));
        CHECK_OK(kva_cache_create(gpu, &cd, &ly[l].dc));
        void *k, *v;
        kva_cache_data(ly[l].hc, &k, &v);
        size_t rows = (size_t)NB * BS * HKV;
        kva_test_fill_uniform(k, DT, rows * D, &rng);
        kva_test_fill_uniform(v, DT, rows * D, &rng);
        cache_upload(ly[l].dc, ly[l].hc);
        ly[l].q = malloc(nq * 2);
        kva_test_fill_uniform(ly[l].q, DT, nq, &rng);
        ly[l].dq = dev_from(ly[l].q, nq * 2);
        ly[l].dout = dev_poisoned(nq * 2);
    }
    CUDA_OK(cudaDeviceSynchronize());
    kva_plan_desc pa = kva_test_batch_plan_desc(&ba, H, HKV, D, D, DT);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(gpu, &pa, &plan)); /* its upload is pending on main_s */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(cap_s, cudaStreamCaptureModeGlobal));
    CHECK_OK(kva_cuda_context_set_stream(gpu, cap_s));
    for (int l = 0; l < NL; l++)
        CHECK_OK(kva_attention_run(gpu, plan, ly[l].dq, ly[l].dc, NULL, ly[l].dout, NULL));
    CUDA_OK(cudaStreamEndCapture(cap_s, &graph)); /* fails if the capture was invalidated */
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    printf("other-stream capture: captured and instantiated\n");
    CHECK_OK(kva_cuda_context_set_stream(gpu, main_s)); /* the deferred drain */
    printf("other-stream capture: moved back (deferred drain)\n");
    CUDA_OK(cudaGraphLaunch(exec, main_s));
    CUDA_OK(cudaStreamSynchronize(main_s));
    compare_layers(ly, NL, &ba, "other-stream capture, A", 1);
    kva_plan_destroy(plan);
    plan = NULL;
    kva_plan_desc pb = kva_test_batch_plan_desc(&bb, H, HKV, D, D, DT);
    CHECK_OK(kva_plan_create(gpu, &pb, &plan));
    for (int l = 0; l < NL; l++)
        CUDA_OK(cudaMemsetAsync(ly[l].dout, 0xff, nq * 2, main_s));
    CUDA_OK(cudaGraphLaunch(exec, main_s));
    CUDA_OK(cudaStreamSynchronize(main_s));
    compare_layers(ly, NL, &bb, "other-stream capture, B", 1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    kva_plan_destroy(plan);
    for (int l = 0; l < NL; l++) {
        kva_cache_destroy(ly[l].hc);
        kva_cache_destroy(ly[l].dc);
        free(ly[l].q);
        cudaFree(ly[l].dq);
        cudaFree(ly[l].dout);
    }
    kva_context_destroy(gpu);
    kva_context_destroy(ref);
    cudaStreamDestroy(main_s);
    cudaStreamDestroy(cap_s);
    kva_test_batch_free(&ba);
    kva_test_batch_free(&bb);
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a log before a time limit */
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_graph_replay);
    RUN(test_capture_on_other_stream);
#endif
    return kva_test_finish();
}
