/*
 * test_api_blackbox_shards.c - black-box audit, round nine (session 40, task
 * api45): decode context parallelism through kva_attention_run_ragged, which
 * no other test runs sharded. docs/dcp.md: a sharded plan's ragged run takes
 * the rank's local K/V rows (kv_start is the prefix sum of the local lengths,
 * kva_dcp_local_lens), every mask stays global, sinks are added on rank 0
 * only. For N in {2, 3}, I in {1, 2}, every rank's partial (local rows
 * gathered here from the global ones by the header's ownership rule) is
 * combined by kva_merge_states_n and must equal the unsharded ragged run:
 * causal, a window, a local chunk, ALiBi with a soft-cap, non-causal, all with
 * sinks; GQA, Dv != D, f32 and bf16, decodes, a prefill, a q_len 0 request and
 * requests shorter than N * I, on the reference and CPU backends. Outputs are
 * poisoned before every run.
 */
#include "blackbox_util.h"

enum { SH_R = 5, SH_H = 4, SH_HKV = 2, SH_D = 16, SH_DV = 8, SH_MAXN = 3 };

typedef struct sh_mask {
    const char *name;
    int32_t causal, window, chunk, alibi;
    float softcap;
} sh_mask;

static const sh_mask sh_masks[] = {{"causal", 1, -1, 0, 0, 0.0f},
                                   {"window 5", 1, 5, 0, 0, 0.0f},
                                   {"chunk 4", 1, -1, 4, 0, 0.0f},
                                   {"alibi softcap", 1, -1, 0, 1, 8.0f},
                                   {"non-causal", 0, -1, 0, 0, 0.0f}};

/* The owner of global position i (kvattn_dcp.h). */
static int32_t sh_owner(int64_t i, int32_t N, int32_t I)
{
    return (int32_t)((i / I) % N);
}

static void sh_case(kva_backend be, kva_dtype dt, const sh_mask *mk)
{
    kva_context *ctx = new_ctx(be, 2);
    const int32_t ql[SH_R] = {1, 3, 0, 6, 1}, sl[SH_R] = {13, 7, 4, 21, 2};
    int32_t qsl[SH_R + 1] = {0}, kvs[SH_R + 1] = {0};
    for (int r = 0; r < SH_R; r++) {
        qsl[r + 1] = qsl[r] + ql[r];
        kvs[r + 1] = kvs[r] + sl[r];
    }
    const int32_t T = qsl[SH_R], NK = kvs[SH_R];
    const size_t es = kva_dtype_size(dt), krow = (size_t)SH_HKV * SH_D * es,
                 vrow = (size_t)SH_HKV * SH_DV * es, on = (size_t)T * SH_H * SH_DV;
    kva_rng rng = {4545 + (uint64_t)dt * 7 + (uint64_t)mk->chunk};
    char *q = malloc((size_t)T * SH_H * SH_D * es), *k = malloc(NK * krow), *v = malloc(NK * vrow);
    char *lk = malloc(NK * krow), *lv = malloc(NK * vrow);
    kva_test_fill(q, dt, (size_t)T * SH_H * SH_D, &rng, 1.0);
    kva_test_fill(k, dt, (size_t)NK * SH_HKV * SH_D, &rng, 1.0);
    kva_test_fill(v, dt, (size_t)NK * SH_HKV * SH_DV, &rng, 1.0);
    float sinks[SH_H], slopes[SH_H];
    for (int h = 0; h < SH_H; h++) {
        sinks[h] = (float)(2.0 * kva_rng_unit(&rng) - 0.5);
        slopes[h] = (float)(0.05 * (h + 1));
    }
    kva_plan_desc pd = {.num_requests = SH_R,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_size = 4,
                        .num_heads = SH_H,
                        .num_kv_heads = SH_HKV,
                        .head_dim = SH_D,
                        .head_dim_v = SH_DV,
                        .q_dtype = dt,
                        .causal = mk->causal,
                        .window_left = mk->window,
                        .softcap = mk->softcap,
                        .alibi_slopes = mk->alibi ? slopes : NULL,
                        .attention_chunk = mk->chunk,
                        .decode_threshold = 1};
    char *want = malloc(on * es), *got = malloc(on * es), *parts = malloc(SH_MAXN * on * es);
    float *want_lse = malloc(sizeof(float) * T * SH_H), *got_lse = malloc(sizeof(float) * T * SH_H),
          *lses = malloc(sizeof(float) * SH_MAXN * T * SH_H);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    kva_test_poison(want, dt, on);
    kva_test_poison(want_lse, KVA_DTYPE_F32, (size_t)T * SH_H);
    CHECK_OK(kva_attention_run_ragged(ctx, plan, q, k, v, sinks, want, want_lse));
    kva_plan_destroy(plan);
    for (int32_t N = 2; N <= SH_MAXN; N++)
        for (int32_t I = 1; I <= 2; I++) {
            for (int32_t rank = 0; rank < N; rank++) {
                int32_t local[SH_R];
                CHECK_OK(kva_dcp_local_lens(SH_R, sl, N, rank, I, local));
                /* The rank's rows, request after request, in position order. */
                int32_t n = 0;
                for (int r = 0; r < SH_R; r++) {
                    int32_t mine = 0;
                    for (int32_t i = 0; i < sl[r]; i++)
                        if (sh_owner(i, N, I) == rank) {
                            memcpy(lk + (size_t)n * krow, k + (size_t)(kvs[r] + i) * krow, krow);
                            memcpy(lv + (size_t)n * vrow, v + (size_t)(kvs[r] + i) * vrow, vrow);
                            n++, mine++;
                        }
                    CHECK_MSG(mine == local[r], "local_lens[%d] = %d, counted %d", r, local[r],
                              mine);
                }
                kva_plan_desc sd = pd;
                sd.dcp_size = N;
                sd.dcp_rank = rank;
                sd.dcp_interleave = I;
                CHECK_OK(kva_plan_create(ctx, &sd, &plan));
                char *part = parts + (size_t)rank * on * es;
                kva_test_poison(part, dt, on);
                kva_test_poison(lses + (size_t)rank * T * SH_H, KVA_DTYPE_F32, (size_t)T * SH_H);
                CHECK_OK(kva_attention_run_ragged(ctx, plan, q, lk, lv, sinks, part,
                                                  lses + (size_t)rank * T * SH_H));
                kva_plan_destroy(plan);
            }
            kva_test_poison(got, dt, on);
            kva_test_poison(got_lse, KVA_DTYPE_F32, (size_t)T * SH_H);
            CHECK_OK(
                kva_merge_states_n(ctx, N, T, SH_H, SH_DV, dt, parts, 0, lses, 0, got, got_lse));
            char label[160];
            snprintf(label, sizeof label, "%s %s %s N=%d I=%d", kva_backend_name(be),
                     kva_dtype_name(dt), mk->name, (int)N, (int)I);
            /* Partials are rounded to dt once more than the unsharded run. */
            const double tol = dt == KVA_DTYPE_F32 ? 2e-5 : 2e-2;
            CHECK_MSG(kva_test_compare(label, got, want, dt, on, tol, tol) == 0, "%s: out", label);
            CHECK_MSG(
                kva_test_compare_f32(label, got_lse, want_lse, (size_t)T * SH_H, 1e-4, 1e-5) == 0,
                "%s: lse", label);
        }
    free(q), free(k), free(v), free(lk), free(lv), free(want), free(got), free(parts);
    free(want_lse), free(got_lse), free(lses);
    kva_context_destroy(ctx);
}

static void test_ragged_sharded(void)
{
    for (int bi = 0; bi < 2; bi++)
        for (size_t m = 0; m < sizeof sh_masks / sizeof sh_masks[0]; m++) {
            sh_case(kBk[bi], KVA_DTYPE_F32, &sh_masks[m]);
            sh_case(kBk[bi], KVA_DTYPE_BF16, &sh_masks[m]);
        }
}

int main(void)
{
    RUN(test_ragged_sharded);
    return kva_test_finish();
}
