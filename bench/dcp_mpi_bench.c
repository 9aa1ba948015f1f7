/*
 * dcp_mpi_bench.c - the DCP combine over MPI against the bare collectives
 * that move the same bytes (run under mpirun -np N; docs/dcp.md).
 *
 *   dcp_mpi_bench [T H Dv dtype iters threads]   (defaults 64 32 128 bf16 50 1)
 *
 * Times, per rank, medians over iters after a barrier each: A2A combine
 * (pack + MPI_Alltoall + merge) vs a bare MPI_Alltoall of the same block
 * size; the same A2A from the kva_dcp_mpi_partials buffers (zero-copy: the
 * attention would have written its partial there, so the combine is the
 * barrier and the in-place merge); AG_RS combine (allgather of the LSEs + rescale/pack +
 * reduce-scatter + convert) vs a bare MPI_Allgather of the LSEs plus
 * MPI_Reduce_scatter_block of T*H*Dv floats. threads: the CPU context's
 * threads per rank (the merge's). Rank 0 prints the table with
 * the ratios (the target: combine <= 1.2x the bare collective),
 * then the zero-copy combine's parts timed alone: the local merge of the
 * same rows (kva_merge_states_n of N parts of [T, H/N, Dv], this rank's
 * memory, hot) and a bare MPI_Barrier (what the combine's handshake
 * replaces).
 */
#include "../bench/data.h"
#include "kvattn_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of iters timings of fn(arg), each after a barrier; the maximum over
 * ranks of each iteration counts (a collective ends when its last rank does). */
typedef void (*step_fn)(void *arg);
static double time_ms(step_fn fn, void *arg, int iters)
{
    double *t = malloc(sizeof(double) * iters);
    for (int i = -2; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        fn(arg);
        double dt = (MPI_Wtime() - t0) * 1e3, worst = 0;
        MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i >= 0)
            t[i] = worst;
    }
    qsort(t, (size_t)iters, sizeof t[0], cmp_d);
    const double m = t[iters / 2];
    free(t);
    return m;
}

typedef struct args {
    kva_context *ctx;
    kva_dtype dt;
    kva_dcp_mpi *dcp;
    kva_dcp_combine mode;
    int32_t T, H, Dv, N;
    size_t es;
    void *part, *out, *send, *recv;
    float *lse, *lse_out, *lses;
} args;

static void combine(void *p)
{
    args *a = p;
    if (kva_dcp_mpi_combine(a->dcp, a->mode, a->T, a->part, a->lse, a->out, a->lse_out) !=
        KVA_STATUS_OK)
        fprintf(stderr, "combine failed: %s\n", kva_last_error());
}

static void combine_zero_copy(void *p)
{
    args *a = p;
    void *zp = NULL;
    float *zl = NULL;
    if (kva_dcp_mpi_partials(a->dcp, a->T, &zp, &zl) != KVA_STATUS_OK ||
        kva_dcp_mpi_combine(a->dcp, KVA_DCP_COMBINE_A2A, a->T, zp, zl, a->out, a->lse_out) !=
            KVA_STATUS_OK)
        fprintf(stderr, "zero-copy combine failed: %s\n", kva_last_error());
}

/* The zero-copy combine's merge alone: N parts of [T, H/N, Dv] (the
 * partial's buffer read as N blocks) merged into this rank's heads. */
static void merge_alone(void *p)
{
    args *a = p;
    const int32_t Hn = a->H / a->N;
    const size_t block = (size_t)a->T * Hn;
    if (kva_merge_states_n(a->ctx, a->N, a->T, Hn, a->Dv, a->dt, a->part, (int64_t)(block * a->Dv),
                           a->lse, (int64_t)block, a->out, a->lse_out) != KVA_STATUS_OK)
        fprintf(stderr, "merge failed: %s\n", kva_last_error());
}

static void bare_barrier(void *p)
{
    (void)p;
    MPI_Barrier(MPI_COMM_WORLD);
}

static void bare_a2a(void *p)
{
    args *a = p;
    const size_t block = (size_t)a->T * (a->H / a->N) * ((size_t)a->Dv * a->es + 4);
    MPI_Alltoall(a->send, (int)block, MPI_BYTE, a->recv, (int)block, MPI_BYTE, MPI_COMM_WORLD);
}

static void bare_ag_rs(void *p)
{
    args *a = p;
    const int rows = a->T * a->H;
    MPI_Allgather(a->lse, rows, MPI_FLOAT, a->lses, rows, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Reduce_scatter_block(a->send, a->recv, rows / a->N * a->Dv, MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, N;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    args a = {0};
    a.T = argc > 1 ? atoi(argv[1]) : 64;
    a.H = argc > 2 ? atoi(argv[2]) : 32;
    a.Dv = argc > 3 ? atoi(argv[3]) : 128;
    const kva_dtype dt = argc > 4 && strcmp(argv[4], "f32") == 0   ? KVA_DTYPE_F32
                         : argc > 4 && strcmp(argv[4], "f16") == 0 ? KVA_DTYPE_F16
                                                                   : KVA_DTYPE_BF16;
    const int iters = argc > 5 ? atoi(argv[5]) : 50;
    const int threads = argc > 6 ? atoi(argv[6]) : 1;
    a.N = N;
    a.dt = dt;
    a.es = kva_dtype_size(dt);
    kva_context_desc cd = {KVA_BACKEND_CPU, threads, 0};
    if (kva_context_create(&cd, &a.ctx) != KVA_STATUS_OK ||
        kva_dcp_mpi_create(a.ctx, MPI_COMM_WORLD, a.T, a.H, a.Dv, dt, &a.dcp) != KVA_STATUS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, kva_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const size_t rows = (size_t)a.T * a.H, on = rows * a.Dv;
    kva_rng rng = {(uint64_t)rank + 1};
    a.part = malloc(on * a.es);
    a.out = malloc(on * a.es);
    a.lse = malloc(rows * 4);
    a.lse_out = malloc(rows * 4);
    a.lses = malloc(rows * 4 * N);
    a.send = calloc(on * 4 + rows * 4, 1);
    a.recv = calloc(on * 4 + rows * 4, 1);
    kva_test_fill(a.part, dt, on, &rng, 1.0);
    for (size_t i = 0; i < rows; i++)
        a.lse[i] = (float)kva_rng_unit(&rng) * 4.0f;
    a.mode = KVA_DCP_COMBINE_A2A;
    const double c_a2a = time_ms(combine, &a, iters), b_a2a = time_ms(bare_a2a, &a, iters);
    /* Both buffers of the zero-copy path hold the partial (the plain A2A
     * above packed into them), then the combines alone are timed. */
    for (int i = 0; i < 2; i++) {
        void *zp = NULL;
        float *zl = NULL;
        if (kva_dcp_mpi_partials(a.dcp, a.T, &zp, &zl) != KVA_STATUS_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, kva_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memcpy(zp, a.part, on * a.es);
        memcpy(zl, a.lse, rows * 4);
        kva_dcp_mpi_combine(a.dcp, KVA_DCP_COMBINE_A2A, a.T, zp, zl, a.out, a.lse_out);
    }
    const double c_zc = time_ms(combine_zero_copy, &a, iters);
    const double m_zc = time_ms(merge_alone, &a, iters), bar = time_ms(bare_barrier, &a, iters);
    a.mode = KVA_DCP_COMBINE_AG_RS;
    const double c_rs = time_ms(combine, &a, iters), b_rs = time_ms(bare_ag_rs, &a, iters);
    if (rank == 0) {
        printf("dcp_mpi_bench: N %d, T %d, H %d, Dv %d, %s, %d iters, %d threads per rank "
               "(medians of the slowest rank)\n",
               N, (int)a.T, (int)a.H, (int)a.Dv, kva_dtype_name(dt), iters, threads);
        printf("  a2a:   combine %8.3f ms  bare MPI_Alltoall %8.3f ms  ratio %.2f\n", c_a2a, b_a2a,
               c_a2a / b_a2a);
        printf("  a2a zero-copy: combine %8.3f ms  ratio %.2f\n", c_zc, c_zc / b_a2a);
        printf("  zero-copy parts: merge alone %8.3f ms  bare MPI_Barrier %8.3f ms\n", m_zc, bar);
        printf("  ag_rs: combine %8.3f ms  bare allgather+reduce_scatter %8.3f ms  ratio %.2f\n",
               c_rs, b_rs, c_rs / b_rs);
    }
    kva_dcp_mpi_destroy(a.dcp);
    kva_context_destroy(a.ctx);
    free(a.part), free(a.out), free(a.lse), free(a.lse_out), free(a.lses), free(a.send),
        free(a.recv);
    MPI_Finalize();
    return 0;
}
