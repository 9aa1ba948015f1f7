/*
 * test_cuda_plan_update.c - kva_plan_update on the CUDA backend. A plan on
 * one context is updated through a sequence of random steps (decodes,
 * speculative decodes, chunked and fresh prefills that take the tensor-core
 * prefill kernel, R growing and shrinking, windows, non-causal steps); after
 * every update it must equal a plan created fresh from the same descriptor
 * on a second context of the same device: the same info, the same partition
 * item for item, and the same outputs bit for bit (outputs poisoned before
 * each run), and the reference backend's output within the tensor-core
 * tolerance. The sequence runs twice: with the updated plan's context growing
 * its metadata as the batches need (each upload one copy), and reserved for
 * far larger batches (kva_cuda_context_reserve: large item, task and tile
 * capacities, so a step with split tasks or prefill tiles uploads in several
 * copies), against the fresh plans' unreserved context, and once more on the
 * reserved context through a serving engine's decode steps (each request one
 * key longer per step: the grid partition reuses the previous step's order of
 * its units where it still sorts them). Bad input (a negative
 * block id, a context of another backend) changes nothing: the plan still
 * runs and gives the same output. Pipelined: updates and runs enqueued with
 * no host synchronization behind a long first run, so the later uploads
 * queue on the stream while the host fills the staging ring again, through
 * several changes of its half (an upload whose staging were overwritten
 * before its copy ran would give a wrong output). The sequence and the
 * pipelined steps run with the default minimum copy (KVA__CUDA_UPLOAD_MIN),
 * then once more with the updated plan's uploads unpadded (only their used
 * bytes) and once padded to 256 KiB (kva__cuda_context_upload_min: the copy
 * carries stale staging bytes past the plan's sections). The pipelined steps
 * run once more with every third upload padded past the hot staging ring's
 * half (KVA__CUDA_STAGING_HOT), so uploads of both staging rings interleave
 * on the busy stream, and with the hot ring's half set by its hook (none;
 * 64 KiB with unpadded uploads: a change of half at nearly every upload),
 * and once with every third upload padded further each time (up to the
 * buffer), so the large staging ring, sized by its uploads, grows twice while
 * the stream still has its earlier uploads' copies queued. That case cannot
 * catch a growth that frees the old halves without waiting for their copies
 * on a driver whose cudaFreeHost synchronizes the device by itself, as the
 * H200's (580.159.04, CUDA 13) does: dev/ws52/freehost_probe.cu measured the
 * free of a pinned buffer return only when a 200 ms kernel queued before it
 * had ended, with or without a copy from that buffer queued
 * (bench/results/h200_2026-11-28_ws52.txt; the planted fault passes there).
 * The CUDA reference documents no such wait, so the growth keeps its own.
 * Every case runs on its own, so KVA_TEST_ONLY can spread them over
 * processes. Exits 77 without a GPU.
 */
#include "batchgen.h"
#include "cuda_util.h"
#include "../../src/plan/partition.h"

#ifdef KVA_HAVE_CUDA
#include "cuda_backend.h" /* kva__cuda_context_upload_min (CUDA builds only) */

enum { H = 16, HKV = 4, D = 128, BS = 16 };
#define DT KVA_DTYPE_BF16

/* Runs plan on ctx into a poisoned device output (0xff bytes); returns it on
 * the host. Every element must have been written (no 0xffff left: the data
 * are finite, so is every output): the long steps compare the updated and the
 * fresh plan's outputs only with each other, where an element neither run
 * wrote would hold the same poison. */
static uint16_t *run_out(kva_context *ctx, const kva_plan *plan, const void *dq,
                         const kva_cache *cache, int32_t T)
{
    const size_t n = (size_t)(T > 0 ? T : 1) * H * D * 2;
    void *dout = dev_poisoned(n);
    uint16_t *out = malloc(n);
    if (T > 0)
        CHECK_OK(kva_attention_run(ctx, plan, dq, cache, NULL, dout, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    to_host(out, dout, n);
    CUDA_OK(cudaFree(dout));
    size_t unwritten = 0;
    for (size_t i = 0; i < (size_t)T * H * D; i++)
        unwritten += out[i] == 0xffffu;
    CHECK_MSG(unwritten == 0, "%zu output elements unwritten", unwritten);
    return out;
}

/* Steps of more multiply-adds than this (q_len x seq_len x H x (D + Dv)
 * summed over the requests) skip the reference compare: the scalar fp64
 * reference would take seconds to minutes on a long prefill. */
#define REF_WORK_MAX 2e7

/* The reference output of pd over the host cache hc and q, against got
 * (steps of at most REF_WORK_MAX work). */
static void check_ref(kva_context *ref, const kva_plan_desc *pd, const kva_cache *hc, const void *q,
                      const uint16_t *got, int32_t T, int step)
{
    double work = 0.0;
    for (int32_t r = 0; r < pd->num_requests; r++)
        work += (double)(pd->query_start_loc[r + 1] - pd->query_start_loc[r]) *
                (double)pd->seq_lens[r] * H * (2.0 * D);
    if (work > REF_WORK_MAX)
        return;
    kva_plan *pr = NULL;
    CHECK_OK(kva_plan_create(ref, pd, &pr));
    const size_t n = (size_t)T * H * D;
    uint16_t *want = malloc((n > 0 ? n : 1) * 2);
    if (pr && T > 0)
        CHECK_OK(kva_attention_run(ref, pr, q, hc, NULL, want, NULL));
    /* Rows of the tensor-core decode and prefill (the defaults for this
     * shape): P rounded to bf16 for P V, + 2^-8 * max|v|; the data are
     * uniform in (-sqrt 3, sqrt 3) (kva_test_fill_uniform: a long step's
     * cache holds ~10^8 elements, which Box-Muller normals took seconds
     * to draw). */
    const double atol = kva_test_atol(DT) + 0x1p-8 * 1.7320508;
    CHECK_MSG(kva_test_compare("out", got, want, DT, n, atol, kva_test_rtol(DT)) == 0,
              "step %d: the updated plan's output is off the reference", step);
    free(want);
    kva_plan_destroy(pr);
}

/* The updated plan's context's minimum copy (pad): -1 the default, 0 none,
 * or 256 KiB, more than the unreserved contexts' buffer (the copy then spans
 * all of it). */
#define PAD_BYTES (256 << 10)

/* decode: the steps are a serving engine's decode steps instead (each
 * request one key longer per step, now and then a tie of two lengths or the
 * last request finished), whose grid partition reuses the previous step's
 * order of its units (partition_grid.c build_decodes). */
static void update_sequence(int reserved, int pad, int decode)
{
    kva_context *ctx = NULL, *fresh_ctx = NULL, *ref = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0}, rd = {KVA_BACKEND_REF, 1, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_context_create(&cd, &fresh_ctx));
    CHECK_OK(kva_context_create(&rd, &ref));
    if (pad >= 0 && ctx) {
        CHECK(kva__cuda_context_upload_min(ctx, -1) == KVA_STATUS_INVALID_ARGUMENT);
        CHECK_OK(kva__cuda_context_upload_min(ctx, pad));
    }
    if (reserved && ctx) {
        const kva_cuda_capacity cap = {256, 16384, 256 * 512, H, HKV, D};
        CHECK_OK(kva_cuda_context_reserve(ctx, &cap));
    }
    kva_rng rng = {271828u + (uint64_t)reserved + 2u * (uint64_t)(pad + 1)};
    kva_plan *plan = NULL;
    const int steps = decode ? 8 : kva_test_quick() ? (reserved ? 6 : 12) : 40;
    /* Decode steps: 96 requests of 600..1200 keys fill a grid of up to 3
     * CTAs per SM unsplit, so the grid build takes its decode path; 8 steps
     * (the random cache of each step is ~0.2 GB on the host). */
    int32_t dR = 96, dql[96], dsl[96], decode_path = 0;
    for (int32_t r = 0; decode && r < dR; r++) /* the other sequences keep their draws */
        dql[r] = 1, dsl[r] = kva_rng_int(&rng, 600, 1200);
    for (int c = 0; c < steps && ctx && fresh_ctx; c++) {
        const int32_t R = kva_rng_int(&rng, 1, c % 3 == 0 ? 40 : 10);
        kva_test_batch b;
        if (decode) {
            for (int32_t r = 0; r < dR; r++)
                dsl[r]++;
            if (c % 4 == 2) /* a tie */
                dsl[kva_rng_int(&rng, 0, dR - 1)] = dsl[kva_rng_int(&rng, 0, dR - 1)];
            if (c % 5 == 4)
                dR--;
            kva_test_batch_init(&b, &rng, dR, dql, dsl, BS, 2, 0);
        } else {
            kva_test_batch_random(&b, &rng, R, BS, c % 2 ? 3000 : 400,
                                  c % 4 == 0   ? 1u
                                  : c % 4 == 1 ? 3u
                                               : 15u,
                                  0);
        }
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, HKV, D, D, DT);
        pd.causal = decode || c % 7 != 3;
        if (c % 5 == 2 && !decode)
            pd.window_left = kva_rng_int(&rng, 0, 300);
        kva_plan *fresh = NULL;
        CHECK_OK(kva_plan_create(fresh_ctx, &pd, &fresh));
        if (!plan)
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        else
            CHECK_OK(kva_plan_update(ctx, plan, &pd));
        if (plan && fresh) {
            decode_path += plan->part && plan->part->decode_path;
            CHECK(!memcmp(&plan->info, &fresh->info, sizeof plan->info));
            CHECK(plan->workspace_bytes == fresh->workspace_bytes);
            CHECK_MSG(plan->part && fresh->part &&
                          plan->part->num_items == fresh->part->num_items &&
                          !memcmp(plan->part->items, fresh->part->items,
                                  sizeof *plan->part->items * (size_t)plan->part->num_items),
                      "step %d: the updated plan's partition differs from a fresh one", c);
            /* One random cache, on the device. */
            kva_cache_desc desc;
            memset(&desc, 0, sizeof desc);
            desc.num_blocks = b.num_blocks, desc.block_size = BS, desc.num_kv_heads = HKV;
            desc.head_dim = D, desc.head_dim_v = D, desc.dtype = DT;
            kva_cache *hc = NULL, *dc = NULL;
            CHECK_OK(kva_cache_create(ref, &desc, &hc));
            CHECK_OK(kva_cache_create(ctx, &desc, &dc));
            void *k = NULL, *v = NULL;
            kva_cache_data(hc, &k, &v);
            const size_t nkv = (size_t)b.num_blocks * BS * HKV * D;
            kva_test_fill_uniform(k, DT, nkv, &rng);
            kva_test_fill_uniform(v, DT, nkv, &rng);
            cache_upload(dc, hc);
            const size_t nq = (size_t)(b.T > 0 ? b.T : 1) * H * D;
            uint16_t *q = malloc(nq * 2);
            kva_test_fill_uniform(q, DT, nq, &rng);
            void *dq = dev_from(q, nq * 2);
            uint16_t *o1 = run_out(ctx, plan, dq, dc, b.T);
            uint16_t *o2 = run_out(fresh_ctx, fresh, dq, dc, b.T);
            CHECK_MSG(!memcmp(o1, o2, (size_t)b.T * H * D * 2),
                      "step %d: outputs of the updated and the fresh plan differ", c);
            check_ref(ref, &pd, hc, q, o1, b.T, c);
            if (c == steps - 1) {
                /* Bad input changes nothing: the plan still runs alike. */
                int32_t *bt = malloc(sizeof(int32_t) * (size_t)b.R * (size_t)b.stride);
                memcpy(bt, b.block_table, sizeof(int32_t) * (size_t)b.R * (size_t)b.stride);
                bt[0] = -3;
                kva_plan_desc bad = pd;
                bad.block_table = bt;
                CHECK_STATUS(kva_plan_update(ctx, plan, &bad), KVA_STATUS_OUT_OF_RANGE);
                CHECK_STATUS(kva_plan_update(ref, plan, &pd), KVA_STATUS_INVALID_ARGUMENT);
                uint16_t *o3 = run_out(ctx, plan, dq, dc, b.T);
                CHECK(!memcmp(o1, o3, (size_t)b.T * H * D * 2));
                free(o3);
                free(bt);
            }
            free(o1), free(o2), free(q);
            CUDA_OK(cudaFree(dq));
            kva_cache_destroy(dc);
            kva_cache_destroy(hc);
        }
        kva_plan_destroy(fresh);
        kva_test_batch_free(&b);
    }
    if (decode) /* else the order reuse went untested */
        CHECK_MSG(decode_path == steps, "the decode path built %d of %d decode steps", decode_path,
                  steps);
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_context_destroy(fresh_ctx);
    kva_context_destroy(ref);
}

/* One step of the pipelined test: its batch, caches, q and device output. */
typedef struct pipe_step {
    kva_test_batch b;
    kva_plan_desc pd;
    kva_cache *hc, *dc;
    uint16_t *q;
    void *dq, *dout;
} pipe_step;

/* pad: the updated plan's minimum copy (-1: the default); MIXED_PAD: every
 * third step's upload padded past the hot staging ring's half, the others
 * the default. */
#define MIXED_PAD (-2)
#define GROW_PAD (-3)

static void update_pipelined(int pad, int64_t hot)
{
    /* Enough steps that their uploads (tens of KB each, the unused block
     * table capacity between their sections included) change the staging
     * ring's half several times (the later ones short, to keep the test quick); step 0
     * runs often enough to keep the device busy while the host plans the
     * rest. */
    enum { STEPS = 48, RUNS0 = 64 };
    kva_context *ctx = NULL, *fresh_ctx = NULL, *ref = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0}, rd = {KVA_BACKEND_REF, 1, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    CHECK_OK(kva_context_create(&cd, &fresh_ctx));
    CHECK_OK(kva_context_create(&rd, &ref));
    if (pad >= 0 && ctx)
        CHECK_OK(kva__cuda_context_upload_min(ctx, pad));
    if (hot >= 0 && ctx)
        CHECK_OK(kva__cuda_context_staging_hot(ctx, hot));
    if ((pad == MIXED_PAD || pad == GROW_PAD) &&
        ctx) { /* a buffer larger than the hot half, so padding reaches past it (GROW_PAD:
                  past 1 MiB, two growths of the large ring from its 512 KiB half) */
        const kva_cuda_capacity cap = {64, 4096, 64 * (pad == GROW_PAD ? 4096 : 256), H, HKV, D};
        CHECK_OK(kva_cuda_context_reserve(ctx, &cap));
    }
    kva_rng rng = {314159u + (uint64_t)(pad + 1) + 7u * (uint64_t)(hot + 1)};
    pipe_step st[STEPS];
    for (int c = 0; c < STEPS && ctx && ref; c++) { /* all set up before the first run */
        pipe_step *p = &st[c];
        /* Step 0: 32 long decodes, run RUNS0 times (the same output), so the
         * device is busy while the host plans the next steps. */
        const int32_t max_len = c == 0 ? 4000 : c < 9 ? 1500 : 300;
        kva_test_batch_random(&p->b, &rng, c == 0 ? 32 : kva_rng_int(&rng, 1, 24), BS, max_len,
                              c % 2 ? 15u : 1u, 0);
        p->pd = kva_test_batch_plan_desc(&p->b, H, HKV, D, D, DT);
        kva_cache_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.num_blocks = p->b.num_blocks, desc.block_size = BS, desc.num_kv_heads = HKV;
        desc.head_dim = D, desc.head_dim_v = D, desc.dtype = DT;
        p->hc = p->dc = NULL;
        CHECK_OK(kva_cache_create(ref, &desc, &p->hc));
        CHECK_OK(kva_cache_create(ctx, &desc, &p->dc));
        void *k = NULL, *v = NULL;
        kva_cache_data(p->hc, &k, &v);
        const size_t nkv = (size_t)p->b.num_blocks * BS * HKV * D;
        kva_test_fill_uniform(k, DT, nkv, &rng);
        kva_test_fill_uniform(v, DT, nkv, &rng);
        cache_upload(p->dc, p->hc);
        const size_t nq = (size_t)(p->b.T > 0 ? p->b.T : 1) * H * D;
        p->q = malloc(nq * 2);
        kva_test_fill_uniform(p->q, DT, nq, &rng);
        p->dq = dev_from(p->q, nq * 2);
        p->dout = dev_poisoned(nq * 2);
    }
    if (!ctx || !fresh_ctx || !ref)
        return;
    CUDA_OK(cudaDeviceSynchronize());
    kva_plan *plan = NULL;
    for (int c = 0; c < STEPS; c++) { /* no host synchronization in this loop */
        pipe_step *p = &st[c];
        if (pad == MIXED_PAD)
            CHECK_OK(kva__cuda_context_upload_min(ctx, c % 3 == 2
                                                           ? (int64_t)KVA__CUDA_STAGING_HOT + 4096
                                                           : (int64_t)KVA__CUDA_UPLOAD_MIN));
        if (pad == GROW_PAD) /* 132 KiB, then 192 KiB more at each third step */
            CHECK_OK(kva__cuda_context_upload_min(ctx, c % 3 == 2
                                                           ? (int64_t)KVA__CUDA_STAGING_HOT + 4096 +
                                                                 (int64_t)(c / 3) * (192 << 10)
                                                           : (int64_t)KVA__CUDA_UPLOAD_MIN));
        if (!plan)
            CHECK_OK(kva_plan_create(ctx, &p->pd, &plan));
        else
            CHECK_OK(kva_plan_update(ctx, plan, &p->pd));
        for (int i = 0; plan && p->b.T > 0 && i < (c == 0 ? RUNS0 : 1); i++)
            CHECK_OK(kva_attention_run(ctx, plan, p->dq, p->dc, NULL, p->dout, NULL));
    }
    for (int c = 0; c < STEPS; c++) {
        pipe_step *p = &st[c];
        const size_t n = (size_t)p->b.T * H * D;
        uint16_t *got = malloc((n > 0 ? n : 1) * 2);
        to_host(got, p->dout, n * 2);
        kva_plan *fresh = NULL;
        CHECK_OK(kva_plan_create(fresh_ctx, &p->pd, &fresh));
        uint16_t *want = run_out(fresh_ctx, fresh, p->dq, p->dc, p->b.T);
        CHECK_MSG(!memcmp(got, want, n * 2),
                  "pipelined step %d: the output differs from a fresh plan's", c);
        check_ref(ref, &p->pd, p->hc, p->q, got, p->b.T, c);
        kva_plan_destroy(fresh);
        free(got), free(want), free(p->q);
        CUDA_OK(cudaFree(p->dq));
        CUDA_OK(cudaFree(p->dout));
        kva_cache_destroy(p->dc);
        kva_cache_destroy(p->hc);
        kva_test_batch_free(&p->b);
    }
    if (pad == GROW_PAD) { /* the case did what it is for */
        const kva__cuda_state *cs = (const kva__cuda_state *)ctx->state;
        CHECK_MSG(cs->stage_big_half >= ((size_t)2 << 20) || cs->stage_big_half >= cs->meta_bytes,
                  "the large staging ring's half is %zu bytes: it did not grow twice",
                  cs->stage_big_half);
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
    kva_context_destroy(fresh_ctx);
    kva_context_destroy(ref);
}

static void test_update_sequence(void)
{
    update_sequence(0, -1, 0);
}

static void test_update_sequence_reserved(void)
{
    update_sequence(1, -1, 0);
}

/* Decode steps on a reserved context, as serve-sim plans them. */
static void test_update_decode_steps(void)
{
    update_sequence(1, -1, 1);
}

static void test_update_pipelined(void)
{
    update_pipelined(-1, -1);
}

/* The hot staging ring's half set by the hook: none (every upload in the
 * large ring), or 64 KiB with unpadded uploads (tens of KB), so nearly
 * every upload changes half and waits for an event while the stream is
 * busy. The hook refuses bad sizes, and any size once the context has its
 * staging, leaving the plan running. */
static void test_staging_hot(void)
{
    update_pipelined(-1, 0);
    update_pipelined(0, 64 << 10);
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_CUDA, 0, 0};
    CHECK_OK(kva_context_create(&cd, &ctx));
    if (!ctx)
        return;
    CHECK(kva__cuda_context_staging_hot(ctx, -1) == KVA_STATUS_INVALID_ARGUMENT);
    CHECK(kva__cuda_context_staging_hot(ctx, 1000) == KVA_STATUS_INVALID_ARGUMENT);
    CHECK(kva__cuda_context_staging_hot(ctx, (int64_t)65 << 20) == KVA_STATUS_INVALID_ARGUMENT);
    CHECK_OK(kva__cuda_context_staging_hot(ctx, 4096));
    const kva_cuda_capacity cap = {8, 64, 8 * 64, H, HKV, D};
    CHECK_OK(kva_cuda_context_reserve(ctx, &cap));
    CHECK(kva__cuda_context_staging_hot(ctx, 0) == KVA_STATUS_INVALID_ARGUMENT);
    kva_context_destroy(ctx);
}

/* The updated plan's uploads unpadded, padded to 256 KiB, and every third
 * one padded past the hot ring's half (three cases, so that a GPU machine's
 * quick set can run them in parallel processes: KVA_TEST_ONLY). */
static void test_update_unpadded(void)
{
    update_sequence(0, 0, 0);
    update_sequence(1, 0, 0);
    update_pipelined(0, -1);
}

static void test_update_padded(void)
{
    update_sequence(0, PAD_BYTES, 0);
    update_sequence(1, PAD_BYTES, 0);
    update_pipelined(PAD_BYTES, -1);
}

static void test_update_mixed_pad(void)
{
    update_pipelined(MIXED_PAD, -1);
}

static void test_update_grow_pad(void)
{
    update_pipelined(GROW_PAD, -1);
}

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
    RUN(test_update_sequence);
    RUN(test_update_sequence_reserved);
    RUN(test_update_decode_steps);
    RUN(test_update_pipelined);
    RUN(test_update_unpadded);
    RUN(test_update_padded);
    RUN(test_update_mixed_pad);
    RUN(test_update_grow_pad);
    RUN(test_staging_hot);
    return kva_test_finish();
}

#else
int main(void)
{
    return cuda_test_skip();
}
#endif
