/*
 * test_dcp_nccl.c - the DCP combine over NCCL (kvattn_nccl.h) with one rank
 * on one GPU: random partials (bf16 out, lse with -inf rows) go through
 * every mode (A2A: pack, no peer to send to, merge; AG_RS: all-gather,
 * rescale, reduce-scatter, convert; LSA: the one kernel with its barriers,
 * from the caller's buffer and from the window) directly, captured in a
 * CUDA graph and on tensors 2 bytes off 16-byte alignment (the kernels'
 * element-wise path); with one rank the result must be the partial itself,
 * bit for bit, and the lse equal. Bad arguments fail before anything is
 * enqueued.
 * N ranks on N GPUs: test_dcp_nccl_ranks.c. Exits 77 without NCCL or a GPU.
 */
#include <stdio.h>

#ifndef KVA_HAVE_NCCL
int main(void)
{
    printf("test_dcp_nccl: skipped: kvattn was built without NCCL (CUDA build with nccl.h and "
           "libnccl found: NCCL_ROOT or pip install nvidia-nccl-cu13)\n");
    return 77;
}
#else
#include "cuda/cuda_util.h"
#include "kvattn_nccl.h"

static void test_single_rank(void)
{
    enum { T = 9, H = 8, DV = 64 };
    ncclUniqueId id;
    ncclComm_t comm;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    cudaStream_t stream = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, stream));

    kva_rng rng = {17};
    const size_t on = (size_t)T * H * DV;
    uint16_t part[T * H * DV], got[T * H * DV];
    float lse[T * H], got_lse[T * H];
    kva_test_fill(part, KVA_DTYPE_BF16, on, &rng, 1.0);
    for (int i = 0; i < T * H; i++)
        lse[i] = i % 5 == 0 ? -INFINITY : (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
    for (int i = 0; i < DV; i++)
        part[5 * DV + i] = 0; /* an empty row (lse -inf) holds zeros, as attention writes */
    void *dpart = dev_from(part, sizeof part), *dout = dev_poisoned(sizeof part);
    float *dlse = dev_from(lse, sizeof lse), *dgl = dev_poisoned(sizeof lse);
    /* The same partial and an output 2 bytes past cudaMalloc's alignment. */
    char *mpart = dev_poisoned(sizeof part + 16), *mout = dev_poisoned(sizeof part + 16);
    CUDA_OK(cudaMemcpy(mpart + 2, part, sizeof part, cudaMemcpyHostToDevice));

    kva_dcp_nccl *dcp = NULL;
    CHECK_OK(kva_dcp_nccl_create(gpu, comm, T, H, DV, KVA_DTYPE_BF16, &dcp));
    /* LSA before its window exists: refused, nothing enqueued. */
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, T, dpart, dlse, dout, dgl),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("kva_dcp_nccl_partials");
    void *wpart = NULL;
    float *wlse = NULL;
    CHECK_OK(kva_dcp_nccl_partials(dcp, &wpart, &wlse));
    /* The window's partials (LSA reads them in place). */
    CUDA_OK(cudaMemcpy(wpart, part, sizeof part, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(wlse, lse, sizeof lse, cudaMemcpyHostToDevice));
    static const struct {
        kva_dcp_combine mode;
        int graph, mis, win;
    } cases[] = {
        {KVA_DCP_COMBINE_A2A, 0, 0, 0},   {KVA_DCP_COMBINE_A2A, 1, 0, 0},
        {KVA_DCP_COMBINE_AG_RS, 0, 0, 0}, {KVA_DCP_COMBINE_AG_RS, 1, 0, 0},
        {KVA_DCP_COMBINE_A2A, 0, 1, 0},   {KVA_DCP_COMBINE_AG_RS, 0, 1, 0},
        {KVA_DCP_COMBINE_LSA, 0, 0, 0},   {KVA_DCP_COMBINE_LSA, 1, 0, 0},
        {KVA_DCP_COMBINE_LSA, 0, 1, 0},   {KVA_DCP_COMBINE_LSA, 0, 0, 1},
        {KVA_DCP_COMBINE_LSA, 1, 0, 1},
    };
    for (size_t it = 0; it < sizeof cases / sizeof cases[0]; it++) {
        const kva_dcp_combine mode = cases[it].mode;
        const int graph = cases[it].graph, mis = cases[it].mis;
        const void *src = mis ? (void *)(mpart + 2) : cases[it].win ? wpart : dpart;
        const float *slse = cases[it].win ? wlse : dlse;
        void *dst = mis ? (void *)(mout + 2) : dout;
        CUDA_OK(cudaMemset(dst, 0xff, sizeof part));
        CUDA_OK(cudaMemset(dgl, 0xff, sizeof lse));
        if (!graph) {
            CHECK_OK(kva_dcp_nccl_combine(dcp, mode, T, src, slse, dst, dgl));
        } else {
            cudaGraph_t g;
            cudaGraphExec_t exec;
            CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            CHECK_OK(kva_dcp_nccl_combine(dcp, mode, T, src, slse, dst, dgl));
            CUDA_OK(cudaStreamEndCapture(stream, &g));
            CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
            CUDA_OK(cudaGraphLaunch(exec, stream));
            CUDA_OK(cudaStreamSynchronize(stream));
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(g);
        }
        to_host(got, dst, sizeof got);
        to_host(got_lse, dgl, sizeof got_lse);
        size_t bad = 0;
        for (size_t i = 0; i < on; i++) {
            const float w = lse[i / DV] == -INFINITY ? 0.0f : kva_bf16_to_f32(part[i]);
            bad += kva_bf16_to_f32(got[i]) != w;
        }
        CHECK_MSG(bad == 0,
                  "mode %d graph %d misaligned %d window %d: %zu elements differ from the partial",
                  (int)mode, graph, mis, cases[it].win, bad);
        for (int i = 0; i < T * H; i++)
            CHECK_MSG(got_lse[i] == lse[i] || fabsf(got_lse[i] - lse[i]) <= 1e-6f,
                      "mode %d lse %d: %g vs %g", (int)mode, i, got_lse[i], lse[i]);
    }
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, (kva_dcp_combine)7, T, dpart, dlse, dout, dgl),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_A2A, T + 1, dpart, dlse, dout, dgl),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_A2A, T, NULL, dlse, dout, dgl),
                 KVA_STATUS_NULL_POINTER);
    /* LSA: partials inside the window but not at its partials, an output
     * inside it; refused before anything runs, the output left as it was. */
    CUDA_OK(cudaMemset(dout, 0x7f, sizeof part));
    CHECK_STATUS(
        kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, T, (char *)wpart + 2, dlse, dout, dgl),
        KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, T, dpart, wlse + 1, dout, dgl),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_nccl_combine(dcp, KVA_DCP_COMBINE_LSA, T, dpart, dlse, wpart, dgl),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("window");
    CHECK_STATUS(kva_dcp_nccl_partials(dcp, NULL, &wlse), KVA_STATUS_NULL_POINTER);
    to_host(got, dout, sizeof got);
    size_t changed = 0;
    for (size_t i = 0; i < on; i++)
        changed += got[i] != 0x7f7f;
    CHECK_MSG(changed == 0, "a refused LSA combine wrote %zu output elements", changed);
    kva_dcp_nccl_destroy(dcp);
    cudaFree(dpart), cudaFree(dout), cudaFree(dlse), cudaFree(dgl), cudaFree(mpart), cudaFree(mout);
    kva_context_destroy(gpu);
    cudaStreamDestroy(stream);
    ncclCommDestroy(comm);
}

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
    RUN(test_single_rank);
    return kva_test_finish();
}
#endif
