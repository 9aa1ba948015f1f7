/*
 * dcp_mpi.c - the decode-context-parallel combine over MPI (kvattn_mpi.h).
 *
 * Rank k of N ends with the exact attention of its heads [k*Hn, (k+1)*Hn),
 * Hn = H / N, from every rank's partial (out_p, lse_p) over its keys:
 *   out = sum_p w_p out_p, w_p = exp(lse_p - lse), lse = log sum_p exp(lse_p).
 *
 * AG_RS: MPI_Allgather of the LSEs [N, T, H]; each rank computes lse and its
 *   own weight w_rank per (token, head), packs w_rank * out_rank in float32
 *   as [N][T][Hn][Dv] (destination-major, so block k holds rank k's heads),
 *   and MPI_Reduce_scatter_block sums block k on rank k. Moves T*H*Dv floats
 *   per rank plus the LSEs.
 * A2A: each rank packs, per destination k, [out rows of k's heads (T*Hn*Dv
 *   in dtype) | their lse (T*Hn float32)]; one MPI_Alltoall of those blocks;
 *   kva_merge_states_n merges the N received blocks in place (part stride =
 *   block). Moves T*H*Dv dtype elements per rank plus the LSEs, in one
 *   collective.
 *   When every rank runs on one host (the processor names agree), the first
 *   A2A combine makes an MPI shared-memory window instead (MPI-3
 *   MPI_Win_allocate_shared: one segment per rank, two buffers each): each
 *   rank packs its blocks into its own segment, publishes them by storing
 *   its combine count in a flag of its segment (a release store; readers
 *   spin on every peer's flag with acquire loads: a handshake of one cache
 *   line per peer instead of an MPI_Barrier's message rounds), and
 *   kva_merge_states_n reads rank k's block of every segment in place (part
 *   stride = segment). The pack and the merge are the whole data movement:
 *   the all-to-all's two copies through shared memory are gone.
 *   Combine i writes buffer i % 2, so a rank rewrites a buffer only after
 *   every rank published combine i + 1, that is, finished reading it.
 *   Zero-copy: kva_dcp_mpi_partials hands out the rank's next buffer as
 *   [T, H, Dv] out | [T, H] lse (the lse at a 64-byte boundary), where the
 *   sharded attention writes its partial; a combine given those pointers
 *   skips the pack, and the merge reads its heads' rows of every rank's
 *   buffer in place (token stride H * Dv) on the context's threads.
 * Buffers are made once for max_tokens at create (the window at the first
 * A2A combine); a combine never allocates after that.
 */
#include "dcp_group.h"
#include "kvattn_mpi.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

struct kva_dcp_mpi {
    kva__dcp_group g;
    MPI_Comm comm;
    float *lses;  /* [N, max_tokens, H] gathered LSEs (AG_RS) */
    float *row;   /* [Dv] one partial row in float32 */
    void *send;   /* AG_RS: [N, T, Hn, Dv] float32; A2A: N packed blocks */
    void *recv;   /* AG_RS: [T, Hn, Dv] float32; A2A: N packed blocks */
    size_t bytes; /* of send and of recv */
    /* A2A over shared memory: shm 0 = not tried yet, 1 = in use, -1 = the
     * ranks are not on one host (MPI_Alltoall). The window's segments are
     * contiguous in rank order: rank p's buffer b at seg0 + p * seg + b * buf,
     * its flag (the count of combines it published) at seg0 + p * seg +
     * 2 * buf, on a 128-byte line pair of its own. */
    int shm;
    MPI_Win win;
    char *seg0;
    size_t seg, buf;
    int64_t calls; /* shared-memory combines so far */
    void *part;    /* kva_dcp_mpi_partials without the window: [T, H, Dv] | lse */
};

/* Bytes of a zero-copy partial's out rows, where its lse starts. */
static size_t part_lse_offset(const kva_dcp_mpi *c, int32_t T)
{
    return ((size_t)T * c->g.num_heads * c->g.head_dim_v * c->g.es + 63) & ~(size_t)63;
}

/* Bytes of a segment's flag area: two cache lines, so that the adjacent-line
 * prefetch of a reader spinning on one flag never pulls a neighbour's data. */
#define FLAG_BYTES 128

/* Rank p's flag: how many shared-memory combines it has published. */
static _Atomic int64_t *flag_of(const kva_dcp_mpi *c, int p)
{
    return (_Atomic int64_t *)(c->seg0 + (size_t)p * c->seg + 2 * c->buf);
}

/* Publishes this rank's part of combine c->calls (its partial or packed
 * blocks are written) and waits until every rank has published it too. This
 * is the barrier of the shared-memory combines: each rank stores its count
 * once and reads every peer's flag, one cache line each, where MPI_Barrier
 * exchanges messages through the transport. Safe to reuse the buffers with
 * two of them (see the top of the file): a peer publishes combine i + 1 only
 * after it finished reading combine i. Spins with a pause, and yields the
 * core after a while so that oversubscribed ranks (more ranks than cores)
 * still make progress. */
static void shm_sync(kva_dcp_mpi *c)
{
    const int64_t want = c->calls;
    MPI_Win_sync(c->win); /* the partials' stores before the flag's */
    atomic_store_explicit(flag_of(c, c->g.rank), want, memory_order_release);
    for (int p = 0; p < c->g.size; p++) {
        const _Atomic int64_t *f = flag_of(c, p);
        for (unsigned spin = 0; atomic_load_explicit(f, memory_order_acquire) < want; spin++) {
            if (spin < 4096) {
#if defined(__x86_64__) || defined(__i386__)
                _mm_pause();
#endif
            } else {
                sched_yield();
            }
        }
    }
    MPI_Win_sync(c->win); /* the peers' partials after their flags */
}

/* A status for a failed MPI call, with MPI's message. */
static kva_status mpi_fail(const char *what, int err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "error %d", err);
    return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_dcp_mpi_combine: %s failed: %s", what, msg);
}

kva_status kva_dcp_mpi_create(kva_context *ctx, MPI_Comm comm, int32_t max_tokens,
                              int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                              kva_dcp_mpi **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(out);
    if (kva_context_backend(ctx) == KVA_BACKEND_CUDA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_mpi_create: the MPI combine works on host memory (ref or CPU "
                         "context); CUDA contexts combine with kvattn_nccl.h");
    int size = 0, rank = 0;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS ||
        MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_mpi_create: comm is MPI_COMM_NULL or not a valid communicator");
    kva__dcp_group g;
    KVA_TRY(kva__dcp_group_init("kva_dcp_mpi_create", ctx, size, rank, max_tokens, num_heads,
                                head_dim_v, KVA_MAX_HEAD_DIM, dtype, &g));
    kva_dcp_mpi *c = calloc(1, sizeof *c);
    if (!c)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_mpi_create: out of memory");
    c->g = g;
    c->comm = comm;
    c->win = MPI_WIN_NULL;
    /* The larger of the two modes' buffers: T*H*Dv float32 (AG_RS send) or N
     * blocks of T*Hn*(Dv*es + 4) bytes (A2A). */
    const size_t elems = (size_t)max_tokens * (size_t)num_heads * (size_t)head_dim_v;
    const size_t a2a = (size_t)max_tokens * (size_t)num_heads * ((size_t)head_dim_v * c->g.es + 4);
    c->bytes = elems * sizeof(float) > a2a ? elems * sizeof(float) : a2a;
    c->bytes += 64; /* a zero-copy partial's lse starts at a 64-byte boundary */
    c->lses = malloc((size_t)size * (size_t)max_tokens * (size_t)num_heads * sizeof(float));
    c->row = malloc((size_t)head_dim_v * sizeof(float));
    c->send = malloc(c->bytes);
    c->recv = malloc(c->bytes);
    if (!c->lses || !c->row || !c->send || !c->recv) {
        kva_dcp_mpi_destroy(c);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_dcp_mpi_create: out of memory for 2 x %zu bytes of buffers",
                         c->bytes);
    }
    *out = c;
    return KVA_STATUS_OK;
}

void kva_dcp_mpi_destroy(kva_dcp_mpi *c)
{
    if (!c)
        return;
    if (c->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(c->win);
        MPI_Win_free(&c->win);
    }
    free(c->lses);
    free(c->row);
    free(c->send);
    free(c->recv);
    free(c->part);
    free(c);
}

/* AG_RS (see the top of the file). */
static kva_status combine_ag_rs(kva_dcp_mpi *c, int32_t T, const void *out_part,
                                const float *lse_part, void *out, float *lse_out)
{
    const int32_t N = c->g.size, H = c->g.num_heads, Hn = H / N, Dv = c->g.head_dim_v;
    const int64_t rows = (int64_t)T * H;
    int err = MPI_Allgather(lse_part, (int)rows, MPI_FLOAT, c->lses, (int)rows, MPI_FLOAT, c->comm);
    if (err != MPI_SUCCESS)
        return mpi_fail("MPI_Allgather of the LSEs", err);
    float *send = c->send;
    for (int64_t n = 0; n < rows; n++) {
        const int32_t t = (int32_t)(n / H), h = (int32_t)(n % H);
        float m = -INFINITY;
        int nan = 0;
        for (int32_t p = 0; p < N; p++) {
            const float l = c->lses[p * rows + n];
            nan |= l != l;
            m = l > m ? l : m;
        }
        float lse = -INFINITY, w = 0.0f;
        if (nan) {
            lse = w = NAN;
        } else if (m != -INFINITY) {
            float sum = 0.0f;
            for (int32_t p = 0; p < N; p++)
                sum += expf(c->lses[p * rows + n] - m);
            lse = m + logf(sum);
            w = expf(lse_part[n] - lse);
        }
        /* Destination k = h / Hn holds row (t, h % Hn) of its block. */
        float *dst = send + (((size_t)(h / Hn) * T + t) * Hn + h % Hn) * Dv;
        if (w == 0.0f) { /* no weight: the partial row is not read */
            memset(dst, 0, (size_t)Dv * sizeof(float));
        } else {
            kva_convert((const char *)out_part + (size_t)n * Dv * c->g.es, c->g.dtype, c->row,
                        KVA_DTYPE_F32, (size_t)Dv);
            for (int32_t x = 0; x < Dv; x++)
                dst[x] = w * c->row[x];
        }
        if (lse_out && h / Hn == c->g.rank)
            lse_out[(size_t)t * Hn + h % Hn] = lse;
    }
    const int count = (int)((int64_t)T * Hn * Dv);
    err = MPI_Reduce_scatter_block(send, c->recv, count, MPI_FLOAT, MPI_SUM, c->comm);
    if (err != MPI_SUCCESS)
        return mpi_fail("MPI_Reduce_scatter_block of the rescaled outputs", err);
    return kva_convert(c->recv, KVA_DTYPE_F32, out, c->g.dtype, (size_t)count);
}

/* Rank k's block (of T*Hn rows: out in dtype, then lse in float32) for
 * destination k, packed from this rank's partials at dst. */
static void pack_block(const kva_dcp_mpi *c, int32_t T, int32_t k, const void *out_part,
                       const float *lse_part, char *dst, size_t out_bytes)
{
    const int32_t H = c->g.num_heads, Hn = H / c->g.size, Dv = c->g.head_dim_v;
    const size_t hrow = (size_t)Hn * Dv * c->g.es;
    for (int32_t t = 0; t < T; t++) {
        const size_t src = ((size_t)t * H + (size_t)k * Hn) * Dv * c->g.es;
        memcpy(dst + (size_t)t * hrow, (const char *)out_part + src, hrow);
        memcpy(dst + out_bytes + (size_t)t * Hn * 4, lse_part + (size_t)t * H + (size_t)k * Hn,
               (size_t)Hn * 4);
    }
}

/* Sets c->shm at the first A2A combine (a collective, like the combine):
 * 1 with the window made when every rank is on this rank's host and MPI gives
 * contiguous segments, -1 otherwise. Every rank takes the same branch: the
 * host test is an all-gather, the segment test an all-reduce. */
static kva_status shm_open(kva_dcp_mpi *c)
{
    const int N = c->g.size;
    char name[MPI_MAX_PROCESSOR_NAME + 1];
    int len = 0, err;
    memset(name, 0, sizeof name);
    if ((err = MPI_Get_processor_name(name, &len)) != MPI_SUCCESS)
        return mpi_fail("MPI_Get_processor_name", err);
    char *all = malloc((size_t)N * sizeof name);
    if (!all)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_mpi_combine: out of memory");
    err = MPI_Allgather(name, (int)sizeof name, MPI_CHAR, all, (int)sizeof name, MPI_CHAR, c->comm);
    int same = 1;
    for (int p = 0; err == MPI_SUCCESS && p < N; p++)
        same &= strcmp(all + (size_t)p * sizeof name, name) == 0;
    free(all);
    if (err != MPI_SUCCESS)
        return mpi_fail("MPI_Allgather of the processor names", err);
    /* Every rank compares the same names: same is equal on every rank. */
    c->shm = -1;
    if (!same)
        return KVA_STATUS_OK;
    /* One buffer: max_tokens blocks' worth of rows for every destination,
     * rounded to 128 bytes; two of them, then the flag. */
    c->buf = (c->bytes + 127) & ~(size_t)127;
    c->seg = 2 * c->buf + FLAG_BYTES;
    char *mine = NULL;
    if ((err = MPI_Win_allocate_shared((MPI_Aint)c->seg, 1, MPI_INFO_NULL, c->comm, &mine,
                                       &c->win)) != MPI_SUCCESS)
        return mpi_fail("MPI_Win_allocate_shared", err);
    MPI_Aint size = 0;
    int du = 0;
    char *p0 = NULL;
    if ((err = MPI_Win_shared_query(c->win, 0, &size, &du, &p0)) != MPI_SUCCESS)
        return mpi_fail("MPI_Win_shared_query", err);
    int ok = mine == p0 + (size_t)c->g.rank * c->seg, all_ok = 0;
    /* No combine published yet; the all-reduce orders this store before any
     * peer reads the flag. */
    atomic_store((_Atomic int64_t *)(mine + 2 * c->buf), 0);
    if ((err = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, c->comm)) != MPI_SUCCESS)
        return mpi_fail("MPI_Allreduce", err);
    if (!all_ok) { /* segments not contiguous: the all-to-all after all */
        MPI_Win_free(&c->win);
        return KVA_STATUS_OK;
    }
    if ((err = MPI_Win_lock_all(MPI_MODE_NOCHECK, c->win)) != MPI_SUCCESS)
        return mpi_fail("MPI_Win_lock_all", err);
    c->seg0 = p0;
    c->shm = 1;
    return KVA_STATUS_OK;
}

/* A2A (see the top of the file). */
static kva_status combine_a2a(kva_dcp_mpi *c, int32_t T, const void *out_part,
                              const float *lse_part, void *out, float *lse_out)
{
    const int32_t N = c->g.size, H = c->g.num_heads, Hn = H / N, Dv = c->g.head_dim_v;
    const size_t out_bytes = (size_t)T * Hn * Dv * c->g.es, lse_bytes = (size_t)T * Hn * 4;
    const size_t block = out_bytes + lse_bytes; /* a multiple of 4: Dv is a multiple of 8 */
    if (c->shm == 0)
        KVA_TRY(shm_open(c));
    if (c->shm > 0) {
        const size_t b = (size_t)(c->calls & 1) * c->buf, lo = part_lse_offset(c, T);
        char *own = c->seg0 + (size_t)c->g.rank * c->seg + b;
        const char *p = out_part;
        const int zero_copy = p == own;
        if (zero_copy && (const char *)lse_part != own + lo)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_dcp_mpi_combine: out_part is this rank's kva_dcp_mpi_partials "
                             "buffer but lse_part is not its lse for %d tokens",
                             (int)T);
        if (!zero_copy && p >= c->seg0 && p < c->seg0 + (size_t)N * c->seg)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_dcp_mpi_combine: out_part lies in the shared window but is not "
                             "the buffer of this combine (kva_dcp_mpi_partials right before it)");
        c->calls++;
        if (zero_copy) {
            shm_sync(c);
            /* This rank's heads in rank 0's buffer; rank p's one segment on. */
            const char *b0 = c->seg0 + b;
            kva__cpu_merge_rows(c->g.ctx, N, T, Hn, Dv, c->g.dtype,
                                b0 + (size_t)c->g.rank * Hn * Dv * c->g.es,
                                (int64_t)(c->seg / c->g.es), (int64_t)H * Dv,
                                (const float *)(b0 + lo) + (size_t)c->g.rank * Hn,
                                (int64_t)(c->seg / 4), H, out, lse_out);
            return KVA_STATUS_OK;
        }
        for (int32_t k = 0; k < N; k++)
            pack_block(c, T, k, out_part, lse_part, own + (size_t)k * block, out_bytes);
        shm_sync(c); /* publish the blocks, see the peers' */
        const char *first = c->seg0 + b + (size_t)c->g.rank * block; /* rank 0's block for me */
        return kva_merge_states_n(c->g.ctx, N, T, Hn, Dv, c->g.dtype, first,
                                  (int64_t)(c->seg / c->g.es), (const float *)(first + out_bytes),
                                  (int64_t)(c->seg / 4), out, lse_out);
    }
    for (int32_t k = 0; k < N; k++)
        pack_block(c, T, k, out_part, lse_part, (char *)c->send + (size_t)k * block, out_bytes);
    const int err =
        MPI_Alltoall(c->send, (int)block, MPI_BYTE, c->recv, (int)block, MPI_BYTE, c->comm);
    if (err != MPI_SUCCESS)
        return mpi_fail("MPI_Alltoall of the packed partials", err);
    return kva_merge_states_n(
        c->g.ctx, N, T, Hn, Dv, c->g.dtype, c->recv, (int64_t)(block / c->g.es),
        (const float *)((char *)c->recv + out_bytes), (int64_t)(block / 4), out, lse_out);
}

kva_status kva_dcp_mpi_partials(kva_dcp_mpi *c, int32_t num_tokens, void **out_part,
                                float **lse_part)
{
    kva__clear_error();
    KVA_CHECK_PTR(c);
    KVA_CHECK_PTR(out_part);
    KVA_CHECK_PTR(lse_part);
    if (num_tokens < 1 || num_tokens > c->g.max_tokens)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_dcp_mpi_partials: num_tokens = %d is outside [1, max_tokens = %d]",
                         (int)num_tokens, (int)c->g.max_tokens);
    if (c->shm == 0)
        KVA_TRY(shm_open(c));
    char *p;
    if (c->shm > 0) {
        p = c->seg0 + (size_t)c->g.rank * c->seg + (size_t)(c->calls & 1) * c->buf;
    } else {
        if (!c->part && !(c->part = malloc(c->bytes)))
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_dcp_mpi_partials: out of memory");
        p = c->part;
    }
    *out_part = p;
    *lse_part = (float *)(p + part_lse_offset(c, num_tokens));
    return KVA_STATUS_OK;
}

kva_status kva_dcp_mpi_combine(kva_dcp_mpi *c, kva_dcp_combine mode, int32_t num_tokens,
                               const void *out_part, const float *lse_part, void *out,
                               float *lse_out)
{
    kva__clear_error();
    KVA_CHECK_PTR(c);
    KVA_TRY(kva__dcp_group_check("kva_dcp_mpi_combine", &c->g, mode, num_tokens, out_part, lse_part,
                                 out));
    if (mode == KVA_DCP_COMBINE_LSA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_dcp_mpi_combine: KVA_DCP_COMBINE_LSA is the NCCL combine's mode "
                         "(GPU memory over NVLink); use A2A or AG_RS");
    /* Every rank returns here for T = 0 alike, so no collective is skipped on one only. */
    if (num_tokens == 0)
        return KVA_STATUS_OK;
    if (mode == KVA_DCP_COMBINE_AG_RS)
        return combine_ag_rs(c, num_tokens, out_part, lse_part, out, lse_out);
    return combine_a2a(c, num_tokens, out_part, lse_part, out, lse_out);
}
