/*
 * serve_dcp.c - `kvattn serve-sim --dcp` under `mpirun -np N`: the MPI side
 * (init, the combine, the step clock's agreement, the check's gather).
 *
 * Every rank runs the same scheduler on the same workload (same seed) over a
 * pool of NB blocks of N * B tokens, so every rank takes the same decisions
 * without exchanging them: the pool sees global token counts only. A pool
 * block's id is also the id of the block of B tokens each rank's caches keep
 * of it: with the interleave I dividing B, token i of a request (pool block
 * i / (N B)) is local token k = (i / (N I)) I + i % I of rank (i / I) mod N,
 * whose local block k / B is again i / (N B). So the block table of the pool
 * is every rank's local block table, unchanged (vLLM's DCP sizes its
 * scheduler's blocks the same way), and a rank's caches hold NB * B tokens
 * where the pool holds NB * N * B.
 *
 * The one number the ranks must agree on besides that is the virtual clock
 * (arrivals and the concurrency gate read it): each step's time is the
 * slowest rank's (serve_dcp_max), as the group waits for it.
 */
#include "serve_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_MPI
#include "kvattn_mpi.h"

struct serve_dcp {
    kva_dcp_mpi *c;
};

int serve_dcp_available(char *why, size_t n)
{
    (void)why;
    (void)n;
    return 1;
}

int serve_dcp_init(int *argc, char ***argv, serve_opts *o)
{
    int size = 0, rank = 0;
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        return 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    o->dcp = size;
    o->dcp_rank = rank;
    return 1;
}

void serve_dcp_finalize(void)
{
    MPI_Finalize();
}

void serve_dcp_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
}

kva_status serve_dcp_create(kva_context *ctx, const serve_opts *o, int32_t max_tokens,
                            serve_dcp **out)
{
    serve_dcp *d = calloc(1, sizeof *d);
    *out = NULL;
    if (!d)
        return KVA_STATUS_OUT_OF_MEMORY;
    kva_status st =
        kva_dcp_mpi_create(ctx, MPI_COMM_WORLD, max_tokens, o->heads, o->head_dim, o->dtype, &d->c);
    if (st != KVA_STATUS_OK) {
        free(d);
        return st;
    }
    *out = d;
    return KVA_STATUS_OK;
}

void serve_dcp_destroy(serve_dcp *d)
{
    if (!d)
        return;
    kva_dcp_mpi_destroy(d->c);
    free(d);
}

kva_status serve_dcp_partials(serve_dcp *d, int32_t T, void **part, float **lse)
{
    return kva_dcp_mpi_partials(d->c, T, part, lse);
}

kva_status serve_dcp_combine(serve_dcp *d, int32_t T, const void *part, const float *lse, void *out)
{
    return kva_dcp_mpi_combine(d->c, KVA_DCP_COMBINE_A2A, T, part, lse, out, NULL);
}

double serve_dcp_max(serve_dcp *d, double v)
{
    (void)d;
    double m = v;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

kva_status serve_dcp_gather(serve_dcp *d, const void *mine, size_t n, void *all)
{
    (void)d;
    if (MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return KVA_STATUS_DEVICE_ERROR;
    return KVA_STATUS_OK;
}

#else /* no MPI in this build */

int serve_dcp_available(char *why, size_t n)
{
    snprintf(why, n, "this kvattn was built without MPI (Debian: libopenmpi-dev openmpi-bin)");
    return 0;
}

int serve_dcp_init(int *argc, char ***argv, serve_opts *o)
{
    (void)argc;
    (void)argv;
    (void)o;
    return 0;
}

void serve_dcp_finalize(void) {}

void serve_dcp_abort(int code)
{
    (void)code;
}

kva_status serve_dcp_create(kva_context *ctx, const serve_opts *o, int32_t max_tokens,
                            serve_dcp **out)
{
    (void)ctx;
    (void)o;
    (void)max_tokens;
    *out = NULL;
    return KVA_STATUS_UNSUPPORTED;
}

void serve_dcp_destroy(serve_dcp *d)
{
    (void)d;
}

kva_status serve_dcp_partials(serve_dcp *d, int32_t T, void **part, float **lse)
{
    (void)d;
    (void)T;
    (void)part;
    (void)lse;
    return KVA_STATUS_UNSUPPORTED;
}

kva_status serve_dcp_combine(serve_dcp *d, int32_t T, const void *part, const float *lse, void *out)
{
    (void)d;
    (void)T;
    (void)part;
    (void)lse;
    (void)out;
    return KVA_STATUS_UNSUPPORTED;
}

double serve_dcp_max(serve_dcp *d, double v)
{
    (void)d;
    return v;
}

kva_status serve_dcp_gather(serve_dcp *d, const void *mine, size_t n, void *all)
{
    (void)d;
    (void)mine;
    (void)n;
    (void)all;
    return KVA_STATUS_UNSUPPORTED;
}

#endif
