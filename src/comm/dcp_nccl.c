/*
 * dcp_nccl.c - the decode-context-parallel combine over NCCL (kvattn_nccl.h).
 *
 * A2A, as dcp_mpi.c's: one kernel (dcp_nccl_kernels.cu) packs, for every
 * other rank k, [its out rows of k's heads (T*Hn*Dv in dtype) | their lse
 * (T*Hn float32)] into block k of a device buffer; a grouped
 * ncclSend/ncclRecv per peer exchanges the blocks (NCCL has no all-to-all
 * call; this is how its docs build one; no send to itself); and one merge
 * kernel combines the N - 1 received blocks with this rank's own rows, read
 * in place from the partial. Three operations on the context's stream, no
 * allocation and no host synchronization, so it can be graph-captured.
 *
 * AG_RS, as dcp_mpi.c's (vLLM's cp_lse_ag_out_rs): ncclAllGather of the LSEs
 * [N, T, H]; a kernel weights each row of this rank's partial by
 * exp(lse_part - lse) into float32 [N][T][Hn][Dv] (block k = rank k's heads)
 * and writes lse_out; ncclReduceScatter sums block k on rank k (straight into
 * out for F32 outputs); a kernel converts to F16 / BF16.
 *
 * LSA (dcp_nccl_lsa.cu): one kernel over NCCL's device API and the
 * symmetric window set up by the first kva_dcp_nccl_partials: partials in
 * the caller's buffer are pushed (each rank stores the peers' rows into
 * their windows, one device barrier, a local merge); partials in the
 * window are pulled (after a barrier each rank reads its heads' rows from
 * the peers' windows and merges; a second barrier).
 *
 * The kernels use 16-byte accesses when the caller's out_part and out are
 * 16-byte aligned (cudaMalloc's are), element accesses otherwise.
 */
#include "dcp_group.h"
#include "dcp_nccl_lsa.h"
#include "kvattn_cuda.h"
#include "kvattn_nccl.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>

/* dcp_nccl_kernels.cu (shapes there). */
cudaError_t kva__dcp_nccl_a2a_pack(cudaStream_t s, size_t es, int vec, int32_t N, int32_t Tn,
                                   int32_t H, int32_t Dv, int32_t rank, size_t block,
                                   size_t out_bytes, const void *out_part, const float *lse_part,
                                   void *send);
cudaError_t kva__dcp_nccl_a2a_merge(cudaStream_t s, kva_dtype dt, int vec, int32_t N, int32_t Tn,
                                    int32_t H, int32_t Dv, int32_t rank, size_t block,
                                    size_t out_bytes, const void *out_part, const float *lse_part,
                                    const void *recv, void *out, float *lse_out);
cudaError_t kva__dcp_nccl_rescale(cudaStream_t s, kva_dtype dt, int vec, int32_t N, int32_t Tn,
                                  int32_t H, int32_t Dv, int32_t rank, const float *lses,
                                  const float *lse_part, const void *out_part, float *send,
                                  float *lse_out);
cudaError_t kva__dcp_nccl_convert(cudaStream_t s, kva_dtype dt, int vec, int64_t n,
                                  const float *src, void *dst);

/* A2A's block stride for T tokens: [T*Hn*Dv in dtype | T*Hn float32], rounded
 * up to 16 bytes so every block starts 16-byte aligned (*used: the bytes
 * sent, *out_bytes: where the lses start). */
static size_t a2a_block(const kva__dcp_group *g, int32_t T, size_t *used, size_t *out_bytes)
{
    const size_t Hn = (size_t)(g->num_heads / g->size);
    *out_bytes = (size_t)T * Hn * g->head_dim_v * g->es;
    *used = *out_bytes + (size_t)T * Hn * 4;
    return (*used + 15) & ~(size_t)15;
}

/* Whether p is 16-byte aligned. */
static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

struct kva_dcp_nccl {
    kva__dcp_group g;
    ncclComm_t comm;
    /* Device memory: A2A: N packed blocks each; AG_RS: send [N][T][Hn][Dv] and
     * recv [T][Hn][Dv] float32, lses [N][T][H] float32. */
    void *send, *recv;
    float *lses;
    /* LSA: the window (made by the first kva_dcp_nccl_partials) and this
     * rank's partials in it: [max_tokens][H][Dv] at win_part, [max_tokens][H]
     * at win_lse, win_bytes in all. */
    kva__dcp_lsa *lsa;
    void *win_part;
    float *win_lse;
    size_t win_bytes;
};

kva_status kva_dcp_nccl_create(kva_context *ctx, ncclComm_t comm, int32_t max_tokens,
                               int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                               kva_dcp_nccl **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(comm);
    KVA_CHECK_PTR(out);
    if (kva_context_backend(ctx) != KVA_BACKEND_CUDA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_nccl_create: the NCCL combine needs a CUDA context (host "
                         "contexts combine with kvattn_mpi.h)");
    int size = 0, rank = 0;
    if (ncclCommCount(comm, &size) != ncclSuccess || ncclCommUserRank(comm, &rank) != ncclSuccess)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_nccl_create: comm is not a valid NCCL communicator");
    kva__dcp_group g;
    KVA_TRY(kva__dcp_group_init("kva_dcp_nccl_create", ctx, size, rank, max_tokens, num_heads,
                                head_dim_v, 256, dtype, &g)); /* 256: the CUDA backend's Dv */
    kva_dcp_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_nccl_create: out of memory");
    c->g = g;
    c->comm = comm;
    /* The larger of the modes' buffers: A2A's N blocks (a2a_block), AG_RS's
     * T*H*Dv float32 (send; recv needs 1/N of it). */
    size_t used, ob;
    const size_t a2a = (size_t)size * a2a_block(&c->g, max_tokens, &used, &ob);
    const size_t agrs = (size_t)max_tokens * num_heads * head_dim_v * sizeof(float);
    const size_t bytes = a2a > agrs ? a2a : agrs;
    const size_t lbytes = (size_t)size * max_tokens * num_heads * sizeof(float);
    if (cudaMalloc(&c->send, bytes) != cudaSuccess || cudaMalloc(&c->recv, bytes) != cudaSuccess ||
        cudaMalloc((void **)&c->lses, lbytes) != cudaSuccess) {
        kva_dcp_nccl_destroy(c);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_dcp_nccl_create: cudaMalloc of 2 x %zu + %zu bytes failed", bytes,
                         lbytes);
    }
    *out = c;
    return KVA_STATUS_OK;
}

void kva_dcp_nccl_destroy(kva_dcp_nccl *c)
{
    if (!c)
        return;
    kva__dcp_lsa_destroy(c->lsa);
    cudaFree(c->send);
    cudaFree(c->recv);
    cudaFree(c->lses);
    free(c);
}

/* A status for a failed NCCL call. */
static kva_status nccl_fail(const char *what, ncclResult_t r)
{
    return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_dcp_nccl_combine: %s failed: %s", what,
                     ncclGetErrorString(r));
}

/* A status for a failed CUDA call. */
static kva_status cuda_fail(const char *what, cudaError_t e)
{
    return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_dcp_nccl_combine: %s failed: %s", what,
                     cudaGetErrorString(e));
}

/* AG_RS (see the top of the file). */
static kva_status combine_ag_rs(kva_dcp_nccl *c, cudaStream_t s, int32_t T, const void *out_part,
                                const float *lse_part, void *out, float *lse_out)
{
    const int32_t N = c->g.size, H = c->g.num_heads, Hn = H / N, Dv = c->g.head_dim_v;
    ncclResult_t r = ncclAllGather(lse_part, c->lses, (size_t)T * H, ncclFloat32, c->comm, s);
    if (r != ncclSuccess)
        return nccl_fail("ncclAllGather of the LSEs", r);
    const int vec = aligned16(out_part) && aligned16(out);
    cudaError_t e = kva__dcp_nccl_rescale(s, c->g.dtype, vec, N, T, H, Dv, c->g.rank, c->lses,
                                          lse_part, out_part, c->send, lse_out);
    if (e != cudaSuccess)
        return cuda_fail("the rescale kernel", e);
    const size_t count = (size_t)T * Hn * Dv;
    float *red = c->g.dtype == KVA_DTYPE_F32 ? out : c->recv;
    r = ncclReduceScatter(c->send, red, count, ncclFloat32, ncclSum, c->comm, s);
    if (r != ncclSuccess)
        return nccl_fail("ncclReduceScatter of the rescaled outputs", r);
    if (c->g.dtype != KVA_DTYPE_F32) {
        e = kva__dcp_nccl_convert(s, c->g.dtype, vec, (int64_t)count, red, out);
        if (e != cudaSuccess)
            return cuda_fail("the conversion kernel", e);
    }
    return KVA_STATUS_OK;
}

/* A2A (see the top of the file). */
static kva_status combine_a2a(kva_dcp_nccl *c, cudaStream_t s, int32_t T, const void *out_part,
                              const float *lse_part, void *out, float *lse_out)
{
    const int32_t N = c->g.size, H = c->g.num_heads, Dv = c->g.head_dim_v, rank = c->g.rank;
    size_t used, out_bytes;
    const size_t block = a2a_block(&c->g, T, &used, &out_bytes);
    const int vec = aligned16(out_part) && aligned16(out);
    cudaError_t e = kva__dcp_nccl_a2a_pack(s, c->g.es, vec, N, T, H, Dv, rank, block, out_bytes,
                                           out_part, lse_part, c->send);
    if (e != cudaSuccess)
        return cuda_fail("the pack kernel", e);
    if (N > 1) {
        ncclResult_t r = ncclGroupStart();
        for (int32_t k = 0; k < N && r == ncclSuccess; k++) {
            if (k == rank)
                continue;
            r = ncclSend((const char *)c->send + (size_t)k * block, used, ncclUint8, k, c->comm, s);
            if (r == ncclSuccess)
                r = ncclRecv((char *)c->recv + (size_t)k * block, used, ncclUint8, k, c->comm, s);
        }
        const ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess)
            r = end;
        if (r != ncclSuccess)
            return nccl_fail("the grouped send/recv", r);
    }
    e = kva__dcp_nccl_a2a_merge(s, c->g.dtype, vec, N, T, H, Dv, rank, block, out_bytes, out_part,
                                lse_part, c->recv, out, lse_out);
    if (e != cudaSuccess)
        return cuda_fail("the merge kernel", e);
    return KVA_STATUS_OK;
}

/* Runs A2A's and AG_RS's collectives once at max_tokens and once at one
 * token on zeroed scratch partials and waits for them, so the LSA window is
 * never the communicator's first operation and NCCL has connected its peers
 * (it does so lazily) before it: a precaution (PyTorch reports a window
 * registration failing as a communicator's first NCCL call, NCCL 2.29). */
static kva_status warm_collectives(kva_dcp_nccl *c, cudaStream_t s)
{
    const size_t rows = (size_t)c->g.max_tokens * c->g.num_heads;
    const size_t pb = rows * c->g.head_dim_v * c->g.es;
    void *part = NULL, *out = NULL;
    float *lse = NULL;
    kva_status st = KVA_STATUS_OK;
    if (cudaMalloc(&part, pb) != cudaSuccess ||
        cudaMalloc((void **)&lse, rows * 4) != cudaSuccess || cudaMalloc(&out, pb) != cudaSuccess) {
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                       "kva_dcp_nccl_partials: cudaMalloc of the warm-up partials failed");
    } else if (cudaMemsetAsync(part, 0, pb, s) != cudaSuccess ||
               cudaMemsetAsync(lse, 0, rows * 4, s) != cudaSuccess) {
        st = kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_dcp_nccl_partials: cudaMemsetAsync failed");
    }
    const int32_t Ts[2] = {c->g.max_tokens, 1};
    for (int i = 0; i < 2 && st == KVA_STATUS_OK; i++) {
        st = combine_a2a(c, s, Ts[i], part, lse, out, NULL);
        if (st == KVA_STATUS_OK)
            st = combine_ag_rs(c, s, Ts[i], part, lse, out, NULL);
    }
    if (st == KVA_STATUS_OK && cudaStreamSynchronize(s) != cudaSuccess)
        st = kva__fail(KVA_STATUS_DEVICE_ERROR,
                       "kva_dcp_nccl_partials: the warm-up collectives failed");
    cudaFree(part), cudaFree(lse), cudaFree(out);
    return st;
}

kva_status kva_dcp_nccl_partials(kva_dcp_nccl *c, void **out_part, float **lse_part)
{
    kva__clear_error();
    KVA_CHECK_PTR(c);
    KVA_CHECK_PTR(out_part);
    KVA_CHECK_PTR(lse_part);
    if (!c->lsa) {
        void *stream = NULL;
        KVA_TRY(kva_cuda_context_get_stream(c->g.ctx, &stream));
        if (c->g.size > 1)
            KVA_TRY(warm_collectives(c, (cudaStream_t)stream));
        const size_t rows = (size_t)c->g.max_tokens * c->g.num_heads;
        char msg[256];
        if (kva__dcp_lsa_create(c->comm, c->g.dtype, rows * c->g.head_dim_v * c->g.es,
                                rows * sizeof(float), &c->lsa, msg, sizeof msg) != 0)
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "kva_dcp_nccl_partials: the LSA combine's window: %s", msg);
        kva__dcp_lsa_partials(c->lsa, &c->win_part, &c->win_lse, &c->win_bytes);
    }
    *out_part = c->win_part;
    *lse_part = c->win_lse;
    return KVA_STATUS_OK;
}

/* Whether [p, p + n) overlaps the window. */
static int in_window(const kva_dcp_nccl *c, const void *p, size_t n)
{
    const uintptr_t a = (uintptr_t)p, w = (uintptr_t)c->win_part;
    return a < w + c->win_bytes && w < a + n;
}

/* LSA (see the top of the file): partials in the window are pulled by the
 * peers when large (dcp_nccl_lsa.cu's KVA_LSA_PULL_BYTES), else every
 * partial is pushed to them. */
static kva_status combine_lsa(kva_dcp_nccl *c, cudaStream_t s, int32_t T, const void *out_part,
                              const float *lse_part, void *out, float *lse_out)
{
    const char *fn = "kva_dcp_nccl_combine";
    if (!c->lsa)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: KVA_DCP_COMBINE_LSA needs the window: call kva_dcp_nccl_partials "
                         "first (on every rank, outside graph capture)",
                         fn);
    const int32_t N = c->g.size, H = c->g.num_heads, Hn = H / N, Dv = c->g.head_dim_v;
    const int own = out_part == c->win_part && lse_part == c->win_lse;
    const size_t rows = (size_t)T * H, pb = rows * Dv * c->g.es;
    if (!own && ((out_part != c->win_part && in_window(c, out_part, pb)) ||
                 (lse_part != c->win_lse && in_window(c, lse_part, rows * sizeof(float)))))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: out_part / lse_part point inside the LSA window but not at the "
                         "partials kva_dcp_nccl_partials gave",
                         fn);
    if (in_window(c, out, (size_t)T * Hn * Dv * c->g.es) ||
        (lse_out && in_window(c, lse_out, (size_t)T * Hn * sizeof(float))))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: out / lse_out must not lie in the LSA window (peers read it)", fn);
    const cudaError_t e = kva__dcp_lsa_combine(c->lsa, s, c->g.dtype, N, T, H, Dv, c->g.rank, own,
                                               out_part, lse_part, out, lse_out);
    if (e != cudaSuccess)
        return cuda_fail("the LSA combine kernel", e);
    return KVA_STATUS_OK;
}

kva_status kva_dcp_nccl_combine(kva_dcp_nccl *c, kva_dcp_combine mode, int32_t num_tokens,
                                const void *out_part, const float *lse_part, void *out,
                                float *lse_out)
{
    kva__clear_error();
    KVA_CHECK_PTR(c);
    KVA_TRY(kva__dcp_group_check("kva_dcp_nccl_combine", &c->g, mode, num_tokens, out_part,
                                 lse_part, out));
    /* Every rank returns here for T = 0 alike, so no collective is skipped on one only. */
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    void *stream = NULL;
    KVA_TRY(kva_cuda_context_get_stream(c->g.ctx, &stream));
    if (mode == KVA_DCP_COMBINE_AG_RS)
        return combine_ag_rs(c, (cudaStream_t)stream, num_tokens, out_part, lse_part, out, lse_out);
    if (mode == KVA_DCP_COMBINE_LSA)
        return combine_lsa(c, (cudaStream_t)stream, num_tokens, out_part, lse_part, out, lse_out);
    return combine_a2a(c, (cudaStream_t)stream, num_tokens, out_part, lse_part, out, lse_out);
}
