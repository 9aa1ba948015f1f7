/*
 * mla_sparse_cpu.c - the CPU backend's sparse MLA (kva_mla_sparse_run):
 * work items, scratch, the separate mode's gather and the OpenMP team; the
 * item body is mla_items.inc's sparse item, compiled per ISA with the other
 * MLA items (the plan's MLA kernel, kva__cpu_plan_mla_item).
 *
 * An item is one query token and a group of up to KVA_MLA_HEAD_GROUP heads:
 * each listed latent row is read and converted once for the group. Tokens
 * are independent (each has its own index list), so the items of a step
 * spread over the threads with a dynamic schedule. Item index x names token
 * x / groups and head group x % groups; its request is found by a binary
 * search over query_start_loc.
 *
 * KVA_SPARSE_SEPARATE: decode tokens (q_len <= decode_threshold) run as in
 * MIXED, in one pass; then each prefill request in turn has its rows
 * 0 .. seq_len - 1 read back from the cache as bf16 into the workspace
 * (kva__host_cache_read, the cache-read path, split over the team) and its
 * tokens run over those dense rows.
 */
#include "mla_cpu.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows the gather of a separate prefill reads per call. */
#define SPARSE_GATHER_ROWS 256

/* Heads of one item. */
static int32_t group_heads(const kva_plan *plan)
{
    const int32_t H = plan->d.num_heads;
    return H < KVA_MLA_HEAD_GROUP ? H : KVA_MLA_HEAD_GROUP;
}

/* Bytes of one thread's scratch (a multiple of 64). */
static size_t scratch_bytes(const kva_plan *plan)
{
    const size_t D = (size_t)plan->d.head_dim, Dc = (size_t)plan->d.head_dim_v;
    const size_t n = kva__cpu_mla_floats(1, (size_t)group_heads(plan), D, Dc, D - Dc, 0, Dc);
    return (n * sizeof(float) + 63) & ~(size_t)63;
}

/* Bytes of the gathered rows (a multiple of 64). */
static size_t gather_bytes(const kva_plan *plan)
{
    const size_t n = (size_t)kva__sparse_gather_rows(plan) * (size_t)plan->d.head_dim;
    return (n * sizeof(uint16_t) + 63) & ~(size_t)63;
}

size_t kva__cpu_sparse_workspace(const kva_plan *plan, int32_t nt)
{
    if (plan->d.sparse_topk <= 0 || plan->info.num_tokens == 0)
        return 0;
    return gather_bytes(plan) + (size_t)(nt > 0 ? nt : 1) * scratch_bytes(plan);
}

/* The request of token t (query_start_loc[r] <= t < query_start_loc[r + 1]). */
static int32_t request_of(const kva_plan *plan, int32_t t)
{
    int32_t lo = 0, hi = plan->d.num_requests - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (plan->query_start_loc[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* 1 if request r's tokens read gathered rows (a separate-mode prefill). */
static int gathered(const kva_plan *plan, int32_t r)
{
    const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
    return plan->d.sparse_mode == KVA_SPARSE_SEPARATE && q > plan->d.decode_threshold;
}

/* Runs the items of tokens [t0, t1) on the calling team (an orphaned
 * worksharing loop: every thread of the region calls it); with want_gathered
 * 0, tokens of gathered requests are skipped. */
static void run_tokens(const kva__cpu_mla *m, kva__cpu_mla_item_fn fn, int32_t t0, int32_t t1,
                       int want_gathered, float *scratch)
{
    const int32_t nh = group_heads(m->plan), groups = (m->H + nh - 1) / nh;
#pragma omp for schedule(dynamic, 1)
    for (int64_t x = (int64_t)t0 * groups; x < (int64_t)t1 * groups; x++) {
        kva__cpu_mla_item it;
        memset(&it, 0, sizeof it);
        it.t = (int32_t)(x / groups);
        it.r = request_of(m->plan, it.t);
        if (!want_gathered && gathered(m->plan, it.r))
            continue;
        it.h0 = (int32_t)(x % groups) * nh;
        it.nh = m->H - it.h0 < nh ? m->H - it.h0 : nh;
        it.absorbed = 1;
        it.split = 1;
        fn(m, &it, scratch);
    }
}

/* Reads request r's rows 0 .. s - 1 as bf16 [s, D] into dst on the calling
 * team (c_kv then k_pe of each row): the cache-read path, whose slots the
 * plan and the API already checked. */
static void gather_rows(kva_context *ctx, const kva_plan *plan, const kva_cache *cache, int32_t r,
                        uint16_t *dst)
{
    const int64_t s = plan->seq_lens[r], B = plan->d.block_size, D = plan->d.head_dim;
    const int64_t Dc = plan->d.head_dim_v;
    const int32_t *bt = plan->block_table + (int64_t)r * plan->d.block_table_stride;
#pragma omp for schedule(static)
    for (int64_t p0 = 0; p0 < s; p0 += SPARSE_GATHER_ROWS) {
        int64_t slots[SPARSE_GATHER_ROWS];
        const int32_t n = (int32_t)(s - p0 < SPARSE_GATHER_ROWS ? s - p0 : SPARSE_GATHER_ROWS);
        for (int32_t i = 0; i < n; i++)
            slots[i] = (int64_t)bt[(p0 + i) / B] * B + (p0 + i) % B;
        (void)kva__host_cache_read(ctx, cache, n, slots, dst + p0 * D, D, dst + p0 * D + Dc, D,
                                   KVA_DTYPE_BF16);
    }
}

kva_status kva__cpu_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                               const kva_cache *cache, const int32_t *indices,
                               int64_t indices_stride, const int32_t *topk_length,
                               const float *sinks, void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    kva__cpu_mla m;
    kva__cpu_mla_init(&m, plan, cache, q, out, lse);
    m.Dv = m.Dc; /* the latent output, stored as is */
    m.idx = indices;
    m.idx_stride = indices_stride;
    m.topk_len = topk_length;
    m.sinks = sinks;
    const kva__cpu_mla_item_fn fn = kva__cpu_plan_mla_item(plan);
    /* Threads: the context's, as far as the workspace (sized at plan time)
     * holds their scratch after the gathered rows. */
    const size_t stride = scratch_bytes(plan), gb = gather_bytes(plan);
    int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    if ((size_t)nt > (ctx->workspace_bytes - gb) / stride)
        nt = (int)((ctx->workspace_bytes - gb) / stride);
    nt = nt < 1 ? 1 : nt;
    unsigned char *base = ctx->workspace;
    uint16_t *rows = (uint16_t *)base;
    const int32_t T = plan->info.num_tokens;
    const int separate = d->sparse_mode == KVA_SPARSE_SEPARATE && gb > 0;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *scratch = (float *)(base + gb + (size_t)tid * stride);
        /* MIXED: every token; SEPARATE: the decode tokens. */
        run_tokens(&m, fn, 0, T, !separate, scratch);
        for (int32_t r = 0; separate && r < d->num_requests; r++) {
            if (!gathered(plan, r))
                continue;
            gather_rows(ctx, plan, cache, r, rows); /* ends with the team's barrier */
#pragma omp single
            m.gather = rows;
            run_tokens(&m, fn, plan->query_start_loc[r], plan->query_start_loc[r + 1], 1, scratch);
        }
    }
    return KVA_STATUS_OK;
}
