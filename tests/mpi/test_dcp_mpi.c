/*
 * test_dcp_mpi.c - the DCP combine over MPI (kvattn_mpi.h), run by ctest as
 * `mpirun --oversubscribe -np 2 test_dcp_mpi` (any N dividing H = 4 works).
 *
 * Every rank builds the same global K/V and queries (fixed seed), fills its
 * own sharded cache, runs its sharded plan on the CPU backend and combines
 * with both modes (AG_RS, A2A; A2A again after a combine of NaN partials,
 * which the shared-memory path's second buffer must not leak), and A2A from
 * the partials buffers of kva_dcp_mpi_partials (the zero-copy path, the same
 * NaN round); its H / N heads of the result must
 * equal the unsharded run (computed by every rank for itself) within the tolerance of test_dcp.c,
 * for f32 and bf16 outputs and two masks, with I = 1 and B. Bad input fails with a status on every
 * rank before any collective. Built without MPI, it prints why and exits 77 (skipped).
 */
#include <stdio.h>

#ifndef KVA_HAVE_MPI
int main(void)
{
    printf("test_dcp_mpi: skipped: kvattn was built without MPI (install libopenmpi-dev and "
           "openmpi-bin, then reconfigure)\n");
    return 77;
}
#else
#include "dcp_util.h"
#include "kvattn_mpi.h"

static int g_rank, g_size;

static void check_mode(const fmt *f, const mask *m, int32_t I)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_rng rng = {99};
    int64_t rows = 0;
    for (int32_t r = 0; r < R; r++)
        rows += seq_lens[r];
    const int32_t T = total_tokens(), N = g_size, Hn = H / N;
    float *k = malloc(sizeof(float) * rows * HKV * D), *v = malloc(sizeof(float) * rows * HKV * DV);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)rows * HKV * D, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)rows * HKV * DV, &rng);
    const size_t es = kva_dtype_size(f->q_dt), on = (size_t)T * H * DV;
    void *q = malloc(es * T * H * D);
    kva_test_fill(q, f->q_dt, (size_t)T * H * D, &rng, 1.5);
    float slopes[H] = {0.05f, 0.1f, 0.15f, 0.2f};

    rank_run full, mine;
    void *want = malloc(es * on), *part = malloc(es * on), *got = malloc(es * on);
    float *want_lse = malloc(sizeof(float) * T * H), *part_lse = malloc(sizeof(float) * T * H);
    float *got_lse = malloc(sizeof(float) * T * H);
    CHECK_OK(setup_rank(ctx, f, m, 0, 0, 0, k, v, slopes, &full, NULL));
    CHECK_OK(kva_attention_run(ctx, full.plan, q, full.cache, NULL, want, want_lse));
    free_rank(&full);
    CHECK_OK(setup_rank(ctx, f, m, N, g_rank, I, k, v, slopes, &mine, NULL));
    kva_test_poison(part, f->q_dt, on);
    CHECK_OK(kva_attention_run(ctx, mine.plan, q, mine.cache, NULL, part, part_lse));
    free_rank(&mine);

    kva_dcp_mpi *dcp = NULL;
    CHECK_OK(kva_dcp_mpi_create(ctx, MPI_COMM_WORLD, T, H, DV, f->q_dt, &dcp));
    /* A2A runs again after a combine of NaN partials (-1): a rank that read a
     * buffer the others did not write this time (the shared-memory path's two
     * buffers) gets NaN. */
    /* ZC: A2A from the kva_dcp_mpi_partials buffers (the partial copied in,
     * as the attention would write it); -2: a zero-copy combine of NaN. */
    enum { ZC = 100 };
    const int modes[] = {KVA_DCP_COMBINE_AG_RS,
                         KVA_DCP_COMBINE_A2A,
                         -1,
                         KVA_DCP_COMBINE_A2A,
                         KVA_DCP_COMBINE_A2A,
                         ZC,
                         -2,
                         ZC,
                         ZC,
                         KVA_DCP_COMBINE_A2A};
    const int num_modes = (int)(sizeof modes / sizeof modes[0]);
    void *nan_part = malloc(es * on);
    float *nan_lse = malloc(sizeof(float) * T * H);
    kva_test_poison(nan_part, f->q_dt, on);
    kva_test_poison(nan_lse, KVA_DTYPE_F32, (size_t)T * H);
    for (int mi = 0; mi < num_modes; mi++) {
        kva_test_poison(got, f->q_dt, (size_t)T * Hn * DV);
        const void *src = modes[mi] == -1 ? nan_part : part;
        const float *src_lse = modes[mi] == -1 ? nan_lse : part_lse;
        if (modes[mi] == ZC || modes[mi] == -2) {
            void *zp = NULL;
            float *zl = NULL;
            CHECK_OK(kva_dcp_mpi_partials(dcp, T, &zp, &zl));
            memcpy(zp, modes[mi] == ZC ? part : nan_part, es * on);
            memcpy(zl, modes[mi] == ZC ? part_lse : nan_lse, sizeof(float) * T * H);
            src = zp;
            src_lse = zl;
        }
        const kva_dcp_combine mode =
            modes[mi] == KVA_DCP_COMBINE_AG_RS ? KVA_DCP_COMBINE_AG_RS : KVA_DCP_COMBINE_A2A;
        CHECK_OK(kva_dcp_mpi_combine(dcp, mode, T, src, src_lse, got, got_lse));
        if (modes[mi] < 0)
            continue;
        size_t bad = 0;
        for (int32_t t = 0; t < T; t++)
            for (int32_t hh = 0; hh < Hn; hh++) {
                const int32_t h = g_rank * Hn + hh;
                for (int32_t c = 0; c < DV; c++) {
                    const size_t gi = ((size_t)t * Hn + hh) * DV + c;
                    const size_t wi = ((size_t)t * H + h) * DV + c;
                    const double a = kva_test_get(got, f->q_dt, gi);
                    const double w = kva_test_get(want, f->q_dt, wi);
                    /* The partials are rounded to the dtype (|partial| <= 1.75). */
                    const double tol = kva_test_atol(f->q_dt) +
                                       kva_test_rtol(f->q_dt) * (fabs(w) + 1.75 * (N - 1));
                    if (!(fabs(a - w) <= tol) && bad++ < 3)
                        fprintf(stderr, "  rank %d %s %s I=%d mode %d: t %d h %d c %d: %g vs %g\n",
                                g_rank, f->name, m->name, (int)I, mi, (int)t, (int)h, (int)c, a, w);
                }
                const float gl = got_lse[t * Hn + hh], wl = want_lse[t * H + h];
                CHECK_MSG(fabsf(gl - wl) <= 1e-4f + 1e-5f * fabsf(wl), "lse %g vs %g", gl, wl);
            }
        CHECK_MSG(bad == 0, "rank %d %s %s I=%d mode %d: %zu elements differ", g_rank, f->name,
                  m->name, (int)I, mi, bad);
    }
    /* Bad input: no collective is issued, every rank fails alike. */
    CHECK_STATUS(kva_dcp_mpi_combine(dcp, (kva_dcp_combine)7, T, part, part_lse, got, got_lse),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_mpi_combine(dcp, KVA_DCP_COMBINE_A2A, T + 1, part, part_lse, got, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("max_tokens");
    CHECK_STATUS(kva_dcp_mpi_combine(dcp, KVA_DCP_COMBINE_LSA, T, part, part_lse, got, got_lse),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("NCCL");
    void *zp = NULL;
    float *zl = NULL;
    CHECK_STATUS(kva_dcp_mpi_partials(dcp, 0, &zp, &zl), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_mpi_partials(dcp, T, NULL, &zl), KVA_STATUS_NULL_POINTER);
    CHECK_OK(kva_dcp_mpi_partials(dcp, T, &zp, &zl));
    /* The window's buffer with an lse that is not its own (ranks on one host:
     * the shared-memory path checks before its barrier). */
    CHECK_STATUS(kva_dcp_mpi_combine(dcp, KVA_DCP_COMBINE_A2A, T, zp, zl + 1, got, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("lse_part");
    kva_dcp_mpi_destroy(dcp);
    kva_dcp_mpi *bad = NULL;
    CHECK_STATUS(kva_dcp_mpi_create(ctx, MPI_COMM_WORLD, T, H + 1, DV, f->q_dt, &bad),
                 N > 1 ? KVA_STATUS_INVALID_ARGUMENT : KVA_STATUS_OK);
    kva_dcp_mpi_destroy(bad);
    free(want), free(part), free(got), free(want_lse), free(part_lse), free(got_lse);
    free(nan_part), free(nan_lse);
    free(q), free(k), free(v);
    kva_context_destroy(ctx);
}

static void test_combine(void)
{
    const fmt *fs[] = {&fmts[0], &fmts[2]};    /* f32, bf16 */
    const mask *ms[] = {&masks[1], &masks[2]}; /* window, alibi-softcap */
    for (int fi = 0; fi < 2; fi++)
        for (int mi = 0; mi < 2; mi++)
            for (int32_t I = 1; I <= B; I += B - 1)
                check_mode(fs[fi], ms[mi], I);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (H % g_size != 0) {
        if (g_rank == 0)
            printf("test_dcp_mpi: skipped: %d ranks do not divide H = %d\n", g_size, H);
        MPI_Finalize();
        return 77;
    }
    RUN(test_combine);
    /* Every rank's verdict: the test fails if any rank failed. */
    int mine = kva_test_cases_failed_, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("ranks: %d\n", g_size);
    const int rc = kva_test_finish();
    MPI_Finalize();
    return any ? 1 : rc;
}
#endif
