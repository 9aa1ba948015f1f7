/*
 * test_serve_dcp.c - `kvattn serve-sim --dcp` (tools/serve_dcp.c) under
 * `mpirun --oversubscribe -np 2`, on a small run: every rank runs the same
 * schedule (the same steps and tokens), rank 0's unsharded check of layer 0
 * passes at every step and catches a wrong output element and a misplaced
 * K/V row, the pool holds N times the tokens of a rank's caches. Built
 * without MPI, it prints why and exits 77 (skipped).
 */
#include <stdio.h>

#ifndef KVA_HAVE_MPI
int main(void)
{
    printf("test_serve_dcp: skipped: kvattn was built without MPI\n");
    return 77;
}
#else
#include "harness.h"
#include "serve_sim.h"

#include <mpi.h>

static int g_rank, g_size;

/* A small model and workload (test_serve_sim.c's, bf16 and more heads): 2
 * layers, H 8 / Hkv 2, D 64, B 8; 10 prompts of a 32-token shared prefix +
 * ~40 own tokens, ~6 outputs; a 64-token budget so prefills are chunked. */
static void small_opts(serve_opts *o)
{
    serve_opts_init(o);
    o->threads = 1;
    o->layers = 2;
    o->heads = 8;
    o->kv_heads = 2;
    o->head_dim = 64;
    o->block_size = 8;
    o->dtype = KVA_DTYPE_BF16;
    o->num_blocks = 64;
    o->max_num_batched_tokens = 64;
    o->max_num_seqs = 8;
    o->num_prompts = 10;
    o->input_len = 40;
    o->output_len = 6;
    o->prefix_len = 32;
    o->verify = 1;
    o->check_pool = 1;
    o->dcp = g_size;
    o->dcp_rank = g_rank;
}

static void test_check(void)
{
    for (int32_t I = 1; I <= 8; I *= 8) {
        serve_opts o;
        small_opts(&o);
        o.dcp_interleave = I;
        serve_run run;
        CHECK_OK(serve_sim_run(&o, NULL, NULL, &run));
        const serve_stats *st = &run.stats;
        /* The same schedule everywhere: rank 0's step and token counts. */
        int64_t mine[2] = {st->steps, st->scheduled_tokens}, first[2] = {0, 0};
        memcpy(first, mine, sizeof mine);
        MPI_Bcast(first, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
        CHECK_MSG(first[0] == mine[0] && first[1] == mine[1],
                  "rank %d: %lld steps / %lld tokens, rank 0 %lld / %lld", g_rank,
                  (long long)mine[0], (long long)mine[1], (long long)first[0], (long long)first[1]);
        CHECK(st->steps > 4 && st->combine_s > 0.0);
        if (g_rank == 0) {
            CHECK_MSG(st->verify_steps == st->steps && st->verify_failures == 0,
                      "I %d: %d of %d checked steps failed: %s", (int)I, (int)st->verify_failures,
                      (int)st->verify_steps, run.verify_error);
            CHECK(st->verify_tokens == st->scheduled_tokens);
        }
        serve_run_free(&run);
    }
    /* The pool's blocks hold N * B tokens: a run whose requests need more
     * than NB * B tokens at once fits N ranks (each caching NB * B). */
    CHECK(serve_pool_block_size(&(serve_opts){.dcp = 4, .block_size = 8}) == 32);
    CHECK(serve_pool_block_size(&(serve_opts){.dcp = 0, .block_size = 8}) == 8);
}

static void test_faults(void)
{
    static const int faults[] = {SERVE_FAULT_OUTPUT, SERVE_FAULT_SLOT};
    for (int f = 0; f < 2; f++) {
        serve_opts o;
        small_opts(&o);
        o.fault = faults[f];
        serve_run run;
        CHECK_OK(serve_sim_run(&o, NULL, NULL, &run));
        if (g_rank == 0) {
            /* A wrong element on the last rank, or token 0's K/V written over
             * another token's slot, shows in rank 0's comparison. */
            CHECK_MSG(run.stats.verify_failures > 0, "fault %d not caught", faults[f]);
            CHECK(strstr(run.verify_error, "differ from the unsharded run") != NULL);
        }
        serve_run_free(&run);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (8 % g_size != 0) {
        if (g_rank == 0)
            printf("test_serve_dcp: skipped: %d ranks do not divide H = 8\n", g_size);
        MPI_Finalize();
        return 77;
    }
    RUN(test_check);
    RUN(test_faults);
    int mine = kva_test_cases_failed_, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const int rc = kva_test_finish();
    MPI_Finalize();
    return any ? 1 : rc;
}
#endif
