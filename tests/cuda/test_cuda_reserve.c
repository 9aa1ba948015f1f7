/*
 * test_cuda_reserve.c - kva_cuda_context_reserve's capacity is a bound.
 * After a reservation, every plan within it keeps the context's device
 * buffers (metadata and split workspace: their addresses and sizes), which
 * a graph captured over kva_attention_run goes on reading. The workspace is
 * reserved exactly (no headroom), so this holds only as far as the reserved
 * bound covers the split partials the partition asks for: random batches
 * within the capacity (decodes over long contexts, which split the most;
 * speculative decodes and prefills where the capacity's query tokens allow
 * them; requests and page-table entries up to the capacity's edges), for MHA
 * shapes of group 1..8 and head sizes 64..256 and the MLA decode's shape
 * (H 16 and 128, D 576, Dv 512). Every plan also checks the two facts the
 * bound rests on (cuda_meta.cu, caps_for): its split chunks number fewer than
 * 12 x its grid's slots (per_sm x SMs), and its per_sm x rows per item (at
 * most G x max_tokens) is at most kva__cuda_reserve_slot_rows (the largest
 * over the kernels a plan within the capacity may run). A reservation is also
 * exact: its workspace is 12 x SMs x that x (Dv + 1) floats, rounded to 256
 * bytes, without the quarter of headroom that a plan's own growth adds (a
 * fresh context's first plan shows it). Plans only, no runs.
 * Exits 77 without a GPU.
 */
#include "batchgen.h"
#include "cuda_util.h"
#include "../../src/plan/partition.h"

#ifdef KVA_HAVE_CUDA
#include "cuda_backend.h"

enum { BS = 16, PLANS = 40 };

typedef struct shape {
    int32_t H, Hkv, D, Dv;
    int32_t max_r, max_t, max_len;
} shape;

static const kva__cuda_state *cuda_state(const kva_context *ctx)
{
    return (const kva__cuda_state *)ctx->state;
}

/* Plans random batches within s's capacity on a context reserved for it;
 * returns the largest workspace they asked for. */
static size_t plans_within(const shape *s, kva_rng *rng)
{
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    if (!ctx)
        return 0;
    /* A batch's table has max_len / BS + 2 entries per request at most
     * (batches.h: the longest request's blocks and one spare column). */
    const int64_t bt_cap = (int64_t)s->max_r * (s->max_len / BS + 2);
    const kva_cuda_capacity cap = {s->max_r, s->max_t, bt_cap, s->H, s->Hkv, s->Dv};
    CHECK_OK(kva_cuda_context_reserve(ctx, &cap));
    int per_sm_max = 0;
    const int64_t slot_rows = kva__cuda_reserve_slot_rows(&cap, &per_sm_max);
    const int64_t sms = cuda_state(ctx)->num_sms;
    const int64_t row_cap = (int64_t)(s->H / s->Hkv) * (s->max_t > 1 ? s->max_t : 1);
    const void *ws = ctx->workspace, *meta = cuda_state(ctx)->meta_dev;
    const size_t ws_bytes = ctx->workspace_bytes, meta_bytes = cuda_state(ctx)->meta_bytes;
    CHECK(ws != NULL && ws_bytes > 0);
    size_t most = 0;
    int64_t most_pieces = 0;
    int planned = 0;
    for (int c = 0; c < PLANS * 4 && planned < PLANS; c++) {
        /* Every fourth batch at the capacity's request count; kinds: decodes,
         * plus speculative decodes and prefills where T may exceed R. */
        const int32_t R = c % 4 == 0 ? s->max_r : kva_rng_int(rng, 1, s->max_r);
        const int32_t max_len = c % 3 == 0 ? s->max_len : kva_rng_int(rng, 64, s->max_len);
        unsigned kinds = s->max_t >= 4 * s->max_r ? (c % 2 ? 0x3u : 0xfu) : 0x1u;
        if (s->D == 576)
            kinds &= 0x3u; /* the MLA decode: decodes and speculative decodes */
        kva_test_batch b;
        kva_test_batch_random(&b, rng, R, BS, max_len, kinds, 0);
        if (b.T > s->max_t || (int64_t)b.R * b.stride > bt_cap) {
            kva_test_batch_free(&b); /* beyond the capacity (a long prefill): another */
            continue;
        }
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, s->H, s->Hkv, s->D, s->Dv, KVA_DTYPE_BF16);
        if (s->D == 576) { /* the MLA decode (a kernel-level plan, as the MLA wrapper's) */
            pd.kind = KVA_ATTN_MLA;
            pd.scale = 0.0723f; /* an MLA plan needs the model's scale (about 1 / sqrt(192)) */
        }
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        if (plan) {
            planned++;
            most = plan->workspace_bytes > most ? plan->workspace_bytes : most;
            const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
            const kva__partition *part = plan->part;
            int64_t pieces = 0;
            for (int32_t k = 0; k < part->num_tasks; k++)
                pieces += part->tasks[k].num_splits;
            most_pieces = pieces > most_pieces ? pieces : most_pieces;
            const int64_t rows = cp->rows < row_cap ? cp->rows : row_cap;
            CHECK_MSG(pieces < 12 * (int64_t)cp->per_sm * sms,
                      "H %d Hkv %d D %d Dv %d, plan %d: %lld split chunks on %lld slots (the "
                      "bound: fewer than 12 per slot)",
                      (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, c, (long long)pieces,
                      (long long)(cp->per_sm * sms));
            CHECK_MSG((int64_t)cp->per_sm * rows <= slot_rows && cp->per_sm <= per_sm_max,
                      "H %d Hkv %d D %d Dv %d, plan %d: its kernel %d runs %d CTAs per SM of %lld "
                      "rows, above the reservation's largest per_sm x rows %lld (per_sm %d)",
                      (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, c, cp->decode_kernel,
                      cp->per_sm, (long long)rows, (long long)slot_rows, per_sm_max);
            CHECK_MSG(ctx->workspace == ws && ctx->workspace_bytes == ws_bytes,
                      "H %d Hkv %d D %d Dv %d, plan %d (R %d, T %d, longest %d): the workspace "
                      "grew from %zu to %zu bytes (the plan asks for %zu) within the reserved "
                      "capacity",
                      (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, c, (int)b.R, (int)b.T,
                      (int)max_len, ws_bytes, ctx->workspace_bytes, plan->workspace_bytes);
            CHECK_MSG(cuda_state(ctx)->meta_dev == meta &&
                          cuda_state(ctx)->meta_bytes == meta_bytes,
                      "H %d Hkv %d D %d Dv %d, plan %d (R %d, T %d): the metadata buffer grew "
                      "within the reserved capacity",
                      (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, c, (int)b.R, (int)b.T);
        }
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    CHECK_MSG(planned == PLANS, "only %d of %d batches fit the capacity", planned, PLANS);
    /* Exact: the bound of caps_for, with no headroom. */
    const size_t bound = (size_t)12 * (size_t)sms * (size_t)slot_rows * ((size_t)s->Dv + 1) * 4;
    CHECK_MSG(ws_bytes == ((bound + 255) & ~(size_t)255),
              "H %d Hkv %d D %d Dv %d: %zu bytes of workspace reserved for a bound of %zu",
              (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, ws_bytes, bound);
    printf("H %d Hkv %d D %d Dv %d, R <= %d, T <= %d, longest %d: %.1f MiB reserved (per_sm x "
           "rows %lld, per_sm <= %d), the plans asked for at most %.1f MiB (%lld split chunks, "
           "the bound %lld)\n",
           (int)s->H, (int)s->Hkv, (int)s->D, (int)s->Dv, (int)s->max_r, (int)s->max_t,
           (int)s->max_len, ws_bytes / 1048576.0, (long long)slot_rows, per_sm_max,
           most / 1048576.0, (long long)most_pieces, (long long)(12 * sms * per_sm_max));
    CHECK_MSG(most > 0, "H %d Hkv %d D %d Dv %d: no plan split (the bound untested)", (int)s->H,
              (int)s->Hkv, (int)s->D, (int)s->Dv);
    kva_context_destroy(ctx);
    return most;
}

static void test_reserved_bound_mha(void)
{
    kva_rng rng = {20261128u};
    const shape shapes[] = {
        {32, 8, 128, 128, 64, 64, 32768}, /* Llama-3 8B decode */
        {32, 8, 128, 128, 16, 512, 8192}, /* with speculative decodes and prefills */
        {16, 16, 64, 64, 32, 32, 16384},  /* group 1 */
        {64, 8, 128, 128, 8, 8, 65536},   /* group 8, few long requests */
        {8, 2, 256, 256, 24, 96, 16384},  /* D 256 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        plans_within(&shapes[i], &rng);
}

static void test_reserved_bound_mla(void)
{
    kva_rng rng = {5762026u};
    const shape shapes[] = {
        {16, 1, 576, 512, 64, 64, 32768},
        {128, 1, 576, 512, 32, 32, 16384},
        {16, 1, 576, 512, 16, 64, 16384}, /* speculative decodes: 16 to 64 rows per item */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        plans_within(&shapes[i], &rng);
}

/* A plan's own growth of the workspace (a fresh context) keeps a quarter of
 * headroom over what it asks for. */
static void test_growth_keeps_headroom(void)
{
    kva_rng rng = {777u};
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    if (!ctx)
        return;
    kva_test_batch b;
    /* Two long decodes: 16 units on a grid of hundreds of CTAs split. */
    kva_test_batch_random(&b, &rng, 2, BS, 32768, 0x1u, 0);
    const kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 128, 128, KVA_DTYPE_BF16);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (plan) {
        const size_t need = plan->workspace_bytes;
        CHECK_MSG(need > 0, "the plan has no split: nothing tested");
        CHECK_MSG(ctx->workspace_bytes >= need + need / 4,
                  "a plan's growth to %zu bytes has no headroom over its %zu", ctx->workspace_bytes,
                  need);
    }
    kva_plan_destroy(plan);
    kva_test_batch_free(&b);
    kva_context_destroy(ctx);
}

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
    RUN(test_reserved_bound_mha);
    RUN(test_reserved_bound_mla);
    RUN(test_growth_keeps_headroom);
    return kva_test_finish();
}

#else
int main(void)
{
    return cuda_test_skip();
}
#endif
