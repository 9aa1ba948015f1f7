/*
 * test_cpu_partition.c - the CPU backend's work partition, without running
 * attention (so batches can be large): balance of a long prefill next to many
 * decodes and of a lone long decode, longest-first order, workspace, and one
 * unsplit item per (request, kv head) for large decode batches, and a step
 * of ~10^6 query tokens (fuzz_desc's slow input) covered exactly once.
 */
#include "batchgen.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

/* Builds a batch from explicit q_lens / seq_lens. */
static void make_batch(kva_test_batch *b, uint64_t seed, int32_t R, const int32_t *q,
                       const int32_t *s, int32_t block_size)
{
    kva_rng rng = {seed};
    kva_test_batch_init(b, &rng, R, q, s, block_size, 2, 1);
}

/* Partition shape only (no attention run, so it can be large): one 32k prefill
 * next to 60 decodes, and a lone long decode, on 2 and 3 threads. */
static void test_partition_balance(void)
{
    enum { R = 61 };
    static int32_t q[R], s[R];
    kva_rng rng = {2024};
    q[0] = 32768;
    s[0] = 32768;
    for (int r = 1; r < R; r++) {
        q[r] = 1;
        s[r] = kva_rng_int(&rng, 100, 4000);
    }
    for (int thr = 2; thr <= 3; thr++) {
        for (int lone = 0; lone < 2; lone++) {
            kva_test_batch b;
            int32_t q1 = 1, s1 = 32768;
            if (lone)
                make_batch(&b, 5, 1, &q1, &s1, 16);
            else
                make_batch(&b, 5, R, q, s, 16);
            kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_BF16);
            kva_context_desc cd = {KVA_BACKEND_CPU, thr, 0};
            kva_context *ctx = NULL;
            kva_plan *plan = NULL;
            CHECK_OK(kva_context_create(&cd, &ctx));
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
            if (plan) {
                const kva__partition *p = plan->part;
                int64_t max_cost = 0, sum = 0;
                for (int32_t i = 0; i < p->num_items; i++) {
                    sum += p->items[i].cost;
                    if (p->items[i].cost > max_cost)
                        max_cost = p->items[i].cost;
                    if (i > 0)
                        CHECK(p->items[i].cost <= p->items[i - 1].cost); /* longest first */
                }
                CHECK(sum == p->total_cost);
                CHECK(plan->info.num_work_items == p->num_items);
                CHECK_MSG(p->num_items >= 4 * thr, "%d items", (int)p->num_items);
                /* No item may hold more than a quarter of one thread's share. */
                CHECK_MSG(max_cost * 4 * thr <= sum * 1 + 4 * thr * 4096,
                          "largest item %lld of total %lld (threads %d, lone %d)",
                          (long long)max_cost, (long long)sum, thr, lone);
                CHECK(plan->workspace_bytes > 0 && ctx->workspace_bytes >= plan->workspace_bytes);
            }
            kva_plan_destroy(plan);
            kva_context_destroy(ctx);
            kva_test_batch_free(&b);
        }
    }
}

/* Decode-only batches with many requests are not split: one item per
 * (request, kv head), the whole GQA group in one item. */
static void test_decode_items(void)
{
    enum { R = 64 };
    int32_t q[R], s[R];
    for (int r = 0; r < R; r++) {
        q[r] = 1;
        s[r] = 100 + r;
    }
    kva_test_batch b;
    make_batch(&b, 3, R, q, s, 16);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_F16);
    kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ctx = NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (plan) {
        CHECK_MSG(plan->info.num_work_items == R * 8, "%d items", (int)plan->info.num_work_items);
        CHECK(plan->part->num_tasks == 0);
        for (int32_t i = 0; i < plan->part->num_items; i++)
            CHECK(plan->part->items[i].nh == 4 && plan->part->items[i].nq == 1);
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_test_batch_free(&b);
}

/* fuzz_desc's slow input (tests/fuzz/findings): non-causal, one request of
 * 1,044,479 query tokens over 4 keys next to small ones, H 68 / Hkv 17, D 24,
 * B 5, no block table. The plan is large but linear in the step's tokens; every (request,
 * query head, row) must be covered by exactly one item (or one split task),
 * and no item may read past its request's keys. */
static void test_partition_huge_step(void)
{
    enum { R = 5, H = 68, HKV = 17, G = H / HKV, STRIDE = 6 };
    const int32_t qsl[R + 1] = {0, 4, 4, 4097, 1048576, 1048581};
    const int32_t sl[R] = {4096, 7, 0, 4, 20};
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = sl;
    pd.block_table = NULL; /* a plan for kva_attention_run_ragged, as the input's */
    pd.block_table_stride = STRIDE;
    pd.block_size = 5;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = 24;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.window_left = -1;
    kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ctx = NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    const int64_t T = qsl[R];
    uint8_t *seen = calloc((size_t)T * H, 1); /* [token, head] covered count */
    if (plan && seen) {
        CHECK(plan->info.num_tokens == T);
        const kva__partition *p = plan->part;
        int bad = 0;
        for (int32_t i = 0; i < p->num_items && !bad; i++) {
            const kva__work_item *it = &p->items[i];
            const int32_t qlen = qsl[it->req + 1] - qsl[it->req];
            if (it->req < 0 || it->req >= R || it->i0 < 0 || it->i0 + it->nq > qlen ||
                it->k0 < 0 || it->k1 > sl[it->req] || it->kv_head < 0 || it->kv_head >= HKV ||
                it->h0 < 0 || it->h0 + it->nh > G) {
                bad = 1;
                break;
            }
            if (it->split > 0)
                continue; /* a split task's rows are counted once, at chunk 0 */
            for (int32_t r = it->i0; r < it->i0 + it->nq; r++)
                for (int32_t h = it->h0; h < it->h0 + it->nh; h++)
                    seen[(int64_t)(qsl[it->req] + r) * H + it->kv_head * G + h]++;
        }
        CHECK_MSG(!bad, "an item outside its request's rows, heads or keys");
        int64_t wrong = 0;
        for (int64_t x = 0; x < T * H; x++)
            wrong += seen[x] != 1;
        CHECK_MSG(wrong == 0, "%lld (token, head) pairs not covered exactly once", (long long)wrong);
    }
    free(seen);
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_partition_balance);
    RUN(test_decode_items);
    RUN(test_partition_huge_step);
    return kva_test_finish();
}
