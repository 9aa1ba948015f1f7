/*
 * dcp_nccl_lsa.cu - KVA_DCP_COMBINE_LSA, the NCCL combine as ONE kernel over
 * NCCL's device API (nccl_device.h, NCCL >= 2.28), compiled into kvattn_nccl.
 * Without nccl_device.h it builds a stub whose setup reports the mode as
 * unsupported (dcp_nccl.c turns that into KVA_STATUS_UNSUPPORTED), and so
 * does the setup when the libnccl loaded is not the headers' version.
 *
 * Setup (kva__dcp_lsa_create, collective over the communicator): one buffer
 * from ncclMemAlloc registered as a symmetric window
 * (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) that holds this rank's
 * partials [max_tokens][H][Dv] in the output dtype, then their lses
 * [max_tokens][H] float32 at lse_off, then two receive areas (parity 0 and
 * 1) at recv_off: slot p of an area holds the rows rank p pushed here,
 * [max_tokens][Hn][Dv], then the slots' lses [max_tokens][Hn]; a device
 * communicator (ncclDevCommCreate) with one LSA barrier per CTA the kernels
 * can keep resident (grid_max), no multimem (NVLink multicast stays off);
 * ctl, two local counters: the receive parity of the next push and a CTA
 * ticket. One rank: NCCL makes no device communicator, so a plain buffer
 * and lsa_solo_kernel.
 *
 * Both kernels: CTA b's warps own destination rows n = t*Hn + j (token t,
 * head j of a rank's Hn = H / N heads), n = warp, warp + W, ... (W warps in
 * the grid), on every rank alike (every rank launches the same grid for T).
 *
 * Push (lsa_push_kernel: partials in the caller's buffer, or in the window
 * up to KVA_LSA_PULL_BYTES; one barrier):
 *   1. Each warp stores the rows (t, k*Hn + j) of its n and their lses from
 *      the caller's partial into slot `rank` of rank k's receive area of
 *      the current parity, over NVLink through k's LSA pointer, for every
 *      other rank k.
 *   2. LSA barrier b (acq_rel): CTA b of every rank has pushed its rows.
 *   3. Merge: each warp merges row n over the N parts with kva__lse_merge
 *      (lse_merge.cuh), all local reads: this rank's own part from the
 *      caller's partial, part p from slot p; one rounding to dtype.
 *   4. The CTA that took the last ticket (every CTA takes one after reading
 *      the parity) flips the parity for the next push.
 *   No second barrier: a peer's next push goes to the other area; the one
 *   after it (this area again) starts only once the peer's kernel in between
 *   has passed its barrier with this rank's kernel in between, which started
 *   after this kernel ended (kernels of one stream run in order). The parity
 *   lives on the device, so a captured graph replays it right.
 * Pull (lsa_pull_kernel: partials in the window, as the attention wrote
 * them, above KVA_LSA_PULL_BYTES, where reading them in place beat pushing
 * in dcp_nccl_bench (docs/dcp.md); two barriers):
 *   1. LSA barrier b: every rank's partials are complete (CTA b of every
 *      rank has reached the combine, after its attention).
 *   2. Merge: part p's row (t, rank*Hn + j) is read over NVLink from rank
 *      p's window through its LSA pointer (this rank's own from the window).
 *   3. LSA barrier b again: every rank's CTA b has finished reading the rows
 *      this rank's CTA b exposed, so once the kernel ends no peer reads this
 *      rank's partials any more and the next attention may overwrite them.
 * Either way every byte of a peer's rows crosses NVLink once; no state
 * changes on the host between calls, so the kernels can be captured in a
 * CUDA graph and replayed.
 */
#include "kvattn.h"

#include "dcp_nccl_lsa.h"

#include <cuda_runtime.h>
#include <new>
#include <stdint.h>
#include <stdio.h>

#if __has_include(<nccl_device.h>)
#include "lse_merge.cuh"

#include <nccl_device.h>

#define KVA_LSA_THREADS 256
/* Partials in the window of more bytes than this are pulled, fewer pushed:
 * 4 x H200, H 32, Dv 128 bf16, push faster up to T 512 (4.2 MB), pull at
 * T 4096 (34 MB); between them not measured. */
#define KVA_LSA_PULL_BYTES ((size_t)8 << 20)

/* The receive areas in the window (bytes): parity e's at recv_off + e *
 * area; in an area, slot p's rows at slot * p and its lses at slot_lse_off +
 * slot_lse * p. */
struct kva__lsa_recv {
    size_t recv_off, area, slot, slot_lse_off, slot_lse;
};

struct kva__dcp_lsa {
    ncclComm_t comm;
    void *buf; /* the window: partials, lses, two receive areas */
    size_t bytes, lse_off;
    kva__lsa_recv rv;
    unsigned *ctl; /* device: the parity of the next push, the CTA ticket */
    ncclWindow_t win;
    ncclDevComm dc;
    int win_made, dc_made;
    int solo;     /* one rank: buf from cudaMalloc, no window, lsa_solo_kernel */
    int grid_max; /* the LSA barriers: one per CTA */
};

/* The parts of one destination row: part p's out row and lse at vals[p] /
 * lses[p] (shared memory), row index rt in [T][H] for this rank's own part
 * (the caller's partial), rp for the others' (rt when pulling from the
 * peers' partials, n when reading the receive slots), and channel d. */
template <typename E> struct lsa_parts {
    const E *const *vals;
    const float *const *lses;
    int64_t rt, rp;
    int32_t Dv, parts, own;
    __device__ __forceinline__ float lse(int32_t p) const
    {
        return lses[p][p == own ? rt : rp];
    }
    __device__ __forceinline__ float val(int32_t p, int32_t d) const
    {
        return load_f(vals[p], (p == own ? rt : rp) * Dv + d);
    }
};

/* Copies Dv elements of E from src to dst (16 bytes at a time when both are
 * 16-byte aligned) with the 32 lanes of a warp. */
template <typename E>
static __device__ __forceinline__ void copy_row(E *dst, const E *src, int32_t Dv, int lane)
{
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        const int32_t n = Dv * (int32_t)sizeof(E) / 16;
        for (int32_t i = lane; i < n; i += 32)
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    } else {
        for (int32_t i = lane; i < Dv; i += 32)
            dst[i] = src[i];
    }
}

/* The merge (see the top): warp w0, w0 + W, ... merges destination row n
 * of this rank's heads over the N parts (vals / lses in shared memory; push:
 * the peers' parts are receive slots [max_tokens][Hn], row n) into out
 * [T][Hn][Dv] and lse_out [T][Hn] (or NULL). */
template <typename E>
static __device__ __forceinline__ void merge_rows(const E *const *vals, const float *const *lses,
                                                  int32_t N, int64_t rows, int32_t Hn, int32_t H,
                                                  int32_t Dv, int32_t rank, int push, int64_t w0,
                                                  int64_t W, E *out, float *lse_out)
{
    const int lane = threadIdx.x & 31;
    for (int64_t n = w0; n < rows; n += W) {
        const int64_t t = n / Hn, j = n % Hn, rt = t * H + (int64_t)rank * Hn + j;
        const lsa_parts<E> r = {vals, lses, rt, push ? n : rt, Dv, N, rank};
        for (int32_t d0 = 0; d0 < Dv; d0 += 128) {
            float o[4], lv;
            kva__lse_merge<4>(r, -INFINITY, d0, Dv, o, lv);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int32_t d = d0 + lane + 32 * i;
                if (d < Dv)
                    store_f(out, n * Dv + d, o[i]);
            }
            if (lse_out && d0 == 0 && lane == 0)
                lse_out[n] = lv;
        }
    }
}

/* Push (see the top). part [T][H][Dv] / lse_part [T][H]: this rank's
 * partial (anywhere but the receive areas); out [T][Hn][Dv], lse_out
 * [T][Hn] (or NULL). The prologue issues its independent loads (the
 * barrier's state, the parity, the window's base pointers) before one CTA
 * barrier, and the ticket's atomic right after it, so their latencies
 * overlap; one CTA needs no ticket. */
template <typename E>
__global__ void __launch_bounds__(KVA_LSA_THREADS)
    lsa_push_kernel(ncclDevComm dc, ncclWindow_t win, kva__lsa_recv rv, unsigned *ctl, int32_t N,
                    int32_t T, int32_t H, int32_t Dv, int32_t rank, const E *part,
                    const float *lse_part, E *out, float *lse_out)
{
    __shared__ const E *vals[KVA_MAX_DCP];
    __shared__ const float *lses[KVA_MAX_DCP];
    __shared__ char *base[KVA_MAX_DCP]; /* rank p's window */
    __shared__ unsigned parity;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int64_t W = (int64_t)gridDim.x * warps,
                  w0 = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5);
    const int32_t Hn = H / N;
    const int64_t rows = (int64_t)T * Hn;
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa(), blockIdx.x);
    if (threadIdx.x == 0)
        parity = *(volatile unsigned *)ctl;
    for (int32_t p = threadIdx.x; p < N; p += blockDim.x)
        base[p] = (char *)ncclGetLsaPointer(win, 0, p);
    __syncthreads();
    unsigned ticket = 0;
    if (threadIdx.x == 0 && gridDim.x > 1) /* the value is used at the end */
        ticket = atomicAdd(ctl + 1, 1u);
    const size_t area = rv.recv_off + parity * rv.area;
    for (int32_t p = threadIdx.x; p < N; p += blockDim.x) { /* read after bar.sync */
        vals[p] = p == rank ? part : (const E *)(base[rank] + area + rv.slot * p);
        lses[p] = p == rank
                      ? lse_part
                      : (const float *)(base[rank] + area + rv.slot_lse_off + rv.slot_lse * p);
    }
    for (int64_t n = w0; n < rows; n += W) {
        const int64_t t = n / Hn, j = n % Hn;
        for (int32_t k = 0; k < N; k++) {
            if (k == rank)
                continue;
            const int64_t rt = t * H + (int64_t)k * Hn + j;
            char *slot = base[k] + area + rv.slot * rank;
            copy_row((E *)slot + n * Dv, part + rt * Dv, Dv, lane);
            if (lane == 0)
                ((float *)(base[k] + area + rv.slot_lse_off + rv.slot_lse * rank))[n] =
                    lse_part[rt];
        }
    }
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
    merge_rows(vals, lses, N, rows, Hn, H, Dv, rank, 1, w0, W, out, lse_out);
    /* Every CTA read the parity before its ticket: the last one flips it. */
    if (threadIdx.x == 0 && (gridDim.x == 1 || ticket == gridDim.x - 1)) {
        ctl[1] = 0;
        ctl[0] = parity ^ 1u;
    }
}

/* Pull (see the top): part / lse_part are this rank's partials in the
 * window; out [T][Hn][Dv], lse_out [T][Hn] (or NULL). */
template <typename E>
__global__ void __launch_bounds__(KVA_LSA_THREADS)
    lsa_pull_kernel(ncclDevComm dc, ncclWindow_t win, size_t lse_off, int32_t N, int32_t T,
                    int32_t H, int32_t Dv, int32_t rank, const E *part, const float *lse_part,
                    E *out, float *lse_out)
{
    __shared__ const E *vals[KVA_MAX_DCP];
    __shared__ const float *lses[KVA_MAX_DCP];
    const int warps = blockDim.x >> 5;
    const int64_t W = (int64_t)gridDim.x * warps,
                  w0 = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5);
    for (int32_t p = threadIdx.x; p < N; p += blockDim.x) {
        vals[p] = p == rank ? part : (const E *)ncclGetLsaPointer(win, 0, p);
        lses[p] = p == rank ? lse_part : (const float *)ncclGetLsaPointer(win, lse_off, p);
    }
    ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa(), blockIdx.x);
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
    merge_rows(vals, lses, N, (int64_t)T * (H / N), H / N, H, Dv, rank, 0, w0, W, out, lse_out);
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

/* One rank (NCCL makes no device communicator for it): the merge of the one
 * part, no barrier. */
template <typename E>
__global__ void __launch_bounds__(KVA_LSA_THREADS)
    lsa_solo_kernel(int32_t T, int32_t H, int32_t Dv, const E *part, const float *lse_part, E *out,
                    float *lse_out)
{
    __shared__ const E *vals[1];
    __shared__ const float *lses[1];
    if (threadIdx.x == 0)
        vals[0] = part, lses[0] = lse_part;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    merge_rows(vals, lses, 1, (int64_t)T * H, H, H, Dv, 0, 0,
               (int64_t)blockIdx.x * warps + (threadIdx.x >> 5), (int64_t)gridDim.x * warps, out,
               lse_out);
}

/* The kernel for dtype dt (F32, F16 or BF16) as a plain function pointer,
 * for the occupancy query (the push kernel: it has the more shared memory). */
template <typename E> static const void *kernel_of()
{
    return (const void *)lsa_push_kernel<E>;
}
static const void *kernel_for(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32   ? kernel_of<float>()
           : dt == KVA_DTYPE_F16 ? kernel_of<__half>()
                                 : kernel_of<__nv_bfloat16>();
}

extern "C" int kva__dcp_lsa_create(ncclComm_t comm, kva_dtype dt, size_t part_bytes,
                                   size_t lse_bytes, kva__dcp_lsa **out, char *msg, size_t msg_len)
{
    kva__dcp_lsa *l = new (std::nothrow) kva__dcp_lsa();
    if (!l) {
        snprintf(msg, msg_len, "out of memory");
        return 1;
    }
    l->comm = comm;
    l->lse_off = (part_bytes + 255) & ~(size_t)255;
    l->bytes = l->lse_off + lse_bytes;
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce == cudaSuccess)
        ce = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (ce == cudaSuccess)
        ce = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(dt), KVA_LSA_THREADS,
                                                           0);
    if (ce != cudaSuccess) {
        snprintf(msg, msg_len, "the occupancy query failed: %s", cudaGetErrorString(ce));
        delete l;
        return 1;
    }
    /* Every CTA resident at once, so a CTA waiting at its barrier never keeps
     * a peer's CTA of the same index from running. */
    l->grid_max = sms * (per_sm > 0 ? per_sm : 1);
    int nranks = 0;
    ncclCommCount(comm, &nranks);
    if (nranks == 1) {
        l->solo = 1;
        ce = cudaMalloc(&l->buf, l->bytes);
        if (ce != cudaSuccess) {
            snprintf(msg, msg_len, "cudaMalloc of %zu bytes failed: %s", l->bytes,
                     cudaGetErrorString(ce));
            delete l;
            return 1;
        }
        *out = l;
        return 0;
    }
    /* The device API's structures (ncclDevComm, the window) are compiled in
     * from nccl_device.h and filled by the library: they must be one
     * version (2.28.9 headers over the system's 2.28.3 library faulted). */
    int version = 0;
    ncclGetVersion(&version);
    if (version != NCCL_VERSION_CODE) {
        snprintf(msg, msg_len,
                 "kvattn_nccl was compiled with NCCL %d's nccl_device.h but runs with libnccl %d "
                 "(put the matching libnccl.so.2 first on the loader's path)",
                 (int)NCCL_VERSION_CODE, version);
        delete l;
        return 1;
    }
    /* The receive areas (H divides by N, so the slots split the partials). */
    l->rv.slot = (part_bytes / nranks + 255) & ~(size_t)255;
    l->rv.slot_lse_off = (size_t)nranks * l->rv.slot;
    l->rv.slot_lse = (lse_bytes / nranks + 255) & ~(size_t)255;
    l->rv.area = l->rv.slot_lse_off + (size_t)nranks * l->rv.slot_lse;
    l->rv.recv_off = (l->bytes + 255) & ~(size_t)255;
    l->bytes = l->rv.recv_off + 2 * l->rv.area;
    ce = cudaMalloc((void **)&l->ctl, 2 * sizeof(unsigned));
    if (ce == cudaSuccess)
        ce = cudaMemset(l->ctl, 0, 2 * sizeof(unsigned));
    if (ce == cudaSuccess) /* the context's stream does not wait for the legacy one */
        ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        snprintf(msg, msg_len, "the LSA counters: %s", cudaGetErrorString(ce));
        kva__dcp_lsa_destroy(l);
        return 1;
    }
    const char *what = "ncclMemAlloc";
    ncclResult_t r = ncclMemAlloc(&l->buf, l->bytes);
    if (r == ncclSuccess) {
        what = "ncclCommWindowRegister";
        r = ncclCommWindowRegister(comm, l->buf, l->bytes, &l->win, NCCL_WIN_COLL_SYMMETRIC);
        l->win_made = r == ncclSuccess;
    }
    if (r == ncclSuccess) {
        what = "ncclDevCommCreate";
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
        ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
        ncclDevCommRequirements reqs = {};
#endif
        reqs.lsaMultimem = false;
        reqs.lsaBarrierCount = l->grid_max;
        r = ncclDevCommCreate(comm, &reqs, &l->dc);
        l->dc_made = r == ncclSuccess;
    }
    if (r != ncclSuccess) {
        snprintf(msg, msg_len, "%s failed: %s", what, ncclGetErrorString(r));
        kva__dcp_lsa_destroy(l);
        return 1;
    }
    if (l->dc.lsaSize != nranks) {
        snprintf(msg, msg_len,
                 "only %d of the communicator's %d ranks can load and store each other's memory "
                 "(LSA team); the LSA combine needs all of them on one NVLink domain",
                 l->dc.lsaSize, nranks);
        kva__dcp_lsa_destroy(l);
        return 1;
    }
    *out = l;
    return 0;
}

extern "C" void kva__dcp_lsa_destroy(kva__dcp_lsa *l)
{
    if (!l)
        return;
    if (l->solo) {
        cudaFree(l->buf);
        delete l;
        return;
    }
    if (l->dc_made)
        ncclDevCommDestroy(l->comm, &l->dc);
    if (l->win_made)
        ncclCommWindowDeregister(l->comm, l->win);
    if (l->buf)
        ncclMemFree(l->buf);
    cudaFree(l->ctl);
    delete l;
}

extern "C" void kva__dcp_lsa_partials(const kva__dcp_lsa *l, void **part, float **lse,
                                      size_t *bytes)
{
    *part = l->buf;
    *lse = (float *)((char *)l->buf + l->lse_off);
    *bytes = l->bytes;
}

/* Launches the solo, push or pull kernel for element type E (in_window:
 * the partials are the window's own). */
template <typename E>
static void launch(const kva__dcp_lsa *l, cudaStream_t s, int grid, int32_t N, int32_t T, int32_t H,
                   int32_t Dv, int32_t rank, int in_window, const E *part, const float *lse_part,
                   E *out, float *lse_out)
{
    if (l->solo)
        lsa_solo_kernel<E><<<grid, KVA_LSA_THREADS, 0, s>>>(T, H, Dv, part, lse_part, out, lse_out);
    else if (!in_window || (size_t)T * H * Dv * sizeof(E) <= KVA_LSA_PULL_BYTES)
        lsa_push_kernel<E><<<grid, KVA_LSA_THREADS, 0, s>>>(l->dc, l->win, l->rv, l->ctl, N, T, H,
                                                            Dv, rank, part, lse_part, out, lse_out);
    else
        lsa_pull_kernel<E><<<grid, KVA_LSA_THREADS, 0, s>>>(l->dc, l->win, l->lse_off, N, T, H, Dv,
                                                            rank, part, lse_part, out, lse_out);
}

extern "C" cudaError_t kva__dcp_lsa_combine(const kva__dcp_lsa *l, cudaStream_t s, kva_dtype dt,
                                            int32_t N, int32_t T, int32_t H, int32_t Dv,
                                            int32_t rank, int in_window, const void *part,
                                            const float *lse_part, void *out, float *lse_out)
{
    const int64_t rows = (int64_t)T * (H / N), per_cta = KVA_LSA_THREADS / 32;
    const int64_t want = (rows + per_cta - 1) / per_cta;
    const int grid = want < 1 ? 1 : want > l->grid_max ? l->grid_max : (int)want;
    if (dt == KVA_DTYPE_F32)
        launch(l, s, grid, N, T, H, Dv, rank, in_window, (const float *)part, lse_part,
               (float *)out, lse_out);
    else if (dt == KVA_DTYPE_F16)
        launch(l, s, grid, N, T, H, Dv, rank, in_window, (const __half *)part, lse_part,
               (__half *)out, lse_out);
    else
        launch(l, s, grid, N, T, H, Dv, rank, in_window, (const __nv_bfloat16 *)part, lse_part,
               (__nv_bfloat16 *)out, lse_out);
    return cudaGetLastError();
}

#else /* no nccl_device.h: the mode is unsupported */

extern "C" int kva__dcp_lsa_create(ncclComm_t, kva_dtype, size_t, size_t, kva__dcp_lsa **out,
                                   char *msg, size_t msg_len)
{
    *out = NULL;
    snprintf(msg, msg_len,
             "kvattn_nccl was built with an NCCL without the device API (nccl_device.h, "
             "NCCL >= 2.28)");
    return 1;
}
extern "C" void kva__dcp_lsa_destroy(kva__dcp_lsa *) {}
extern "C" void kva__dcp_lsa_partials(const kva__dcp_lsa *, void **part, float **lse, size_t *bytes)
{
    *part = NULL, *lse = NULL, *bytes = 0;
}
extern "C" cudaError_t kva__dcp_lsa_combine(const kva__dcp_lsa *, cudaStream_t, kva_dtype, int32_t,
                                            int32_t, int32_t, int32_t, int32_t, int, const void *,
                                            const float *, void *, float *)
{
    return cudaErrorNotSupported;
}

#endif
