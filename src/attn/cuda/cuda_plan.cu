/*
 * cuda_plan.cu - the CUDA backend's plan builder (C-style CUDA): the
 * partition parameters for the GPU, the kernel choice per plan, and the plan
 * builds of every kind (attention, MLA, sparse MLA, indexer). The device
 * metadata buffer, its growth, the workspace, kva_cuda_context_reserve and
 * the upload of a plan's metadata are in cuda_meta.cu; the context and the
 * operation tables in cuda_ctx.cu.
 *
 * kva_plan_create partitions the work on the host (src/plan/partition.c),
 * grows the buffers if the plan does not fit (after a stream synchronize;
 * refused during capture), stages the metadata in the pinned staging ring
 * (waiting for older uploads to leave a half of it where needed) and
 * enqueues its used sections in as few cudaMemcpyAsync as possible (one for
 * a decode step).
 * The run path then only launches kernels.
 *
 * Prefills on tensor cores: for paged plans whose shape a prefill tile kernel
 * supports (kva__cuda_prefill_supported: D = Dv in {64, 128, 256}, or D 192 /
 * Dv 128 on sm_90a; f16/bf16), requests with q_len above the
 * decode threshold and at least KVA_CUDA_MMA_MIN_ROWS packed rows
 * (q_len * H / Hkv) leave the work partition; their tile list is built into
 * the staging buffer's prefill-tile section and uploaded with the rest. The
 * decode kernel then sees only the other requests' items, so the two kernels
 * write disjoint rows of out and lse.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_run.h"
#include "mla_sparse.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "cuda_ctx.h"

#include <stdlib.h>
#include <string.h>

/* Packed rows (q_len * H / Hkv) from which a request above the decode
 * threshold goes to prefill_mma (fewer leave most of its 128-row tile empty). */
#define KVA_CUDA_MMA_MIN_ROWS 64
/* The longest prefill (q_len) for which the wgmma kernels run their narrow
 * tile shape (64 rows and 64 keys per CTA tile, two CTAs per SM;
 * prefill_wgmma.cuh wg_dims): a batch of short prompts has one or two key
 * tiles per CTA tile, where the wide shape's fixed cost per tile and its
 * causal waste dominate (docs/cuda-prefill.md). */
#ifndef KVA_CUDA_PREFILL_NARROW_MAX_Q
#define KVA_CUDA_PREFILL_NARROW_MAX_Q 256
#endif

/* Partition parameters for the GPU: items of at most `rows` attention rows;
 * keys are split only when there are too few items to fill the SMs. */
static void gpu_params(const kva__cuda_state *st, int rows, int ctas_per_sm,
                       kva__partition_params *pp)
{
    memset(pp, 0, sizeof *pp);
    /* One "thread" per resident CTA of the persistent grid: a batch with at
     * least that many items runs unsplit, a smaller one is split until it
     * fills the grid. */
    pp->num_threads = ctas_per_sm * (st->num_sms > 0 ? st->num_sms : 1);
    pp->max_rows = rows;
    pp->prefill_rows = rows;
    pp->split_align = 64;
    pp->min_split_keys = 256;
    /* At most 32 chunks per unit; a count forced above that
     * (kva__cuda_context_force_splits, benches and tests) is honoured. */
    pp->max_splits = st->force_splits > 32 ? st->force_splits : 32;
    pp->items_per_thread = 1;
}

/*
 * The grid's time model (kva__partition_grid), fitted on an H100 to paged bf16
 * decodes (H/Hkv 32/8, D 128, tensor-core decode, 2 CTAs per SM; docs/cuda-decode.md "Split
 * choice"): 128 unsplit items of 4k keys on 264 CTAs ran at 2.46 TB/s, i.e.
 * a CTA of a half-empty grid moves ~1.76x its share of a full one (2.88 TB/s);
 * 4 -> 8 chunks per unit of the same batch (2 -> 4 items per CTA) added ~11
 * us, and splitting at all ~10 us (partial writes, the merge pass's work), at
 * ~9.4 ns per cost unit (one key of one GQA row). A second call checked the
 * choices on 7 decode batches: none slower than the former choice, 16 x 4k
 * 1.16x faster and its pick (2 chunks) the fastest of 1, 2, 3, 4, 8, 16.
 */
/* On a context that asked for it (kva__cuda_context_balanced), split tasks
 * of at least this many splits run on the tensor-core decode's balanced
 * schedule (decode_mma_kernel.cuh, dm_steps): its gain is the spread of the
 * loop ends of many single-wave CTAs of one task; with a few splits per task
 * the plain key loop was faster (H200, bench/results/h200_2026-11-27_dec25.txt). */
#define KVA__CUDA_BALANCED_SPLITS 8

#define KVA_CUDA_GRID_ALPHA_PCT 176
#define KVA_CUDA_GRID_ITEM_OVERHEAD 600
#define KVA_CUDA_GRID_SPLIT_OVERHEAD 1100

/*
 * Partitions the plan for a grid of SMs x per_sm CTAs. Equal items quantize
 * badly (512 decode items on 396 CTAs take two rounds) and splitting has a
 * cost, so the partition compares no split with split targets for 1..4 items
 * per CTA (chunk counts rounded up and down) by the grid's time model and
 * keeps the fastest; the candidates are evaluated in closed form and only the
 * winner is built (kva__partition_build_grid).
 */
static kva_status best_partition(const kva__cuda_state *st, const kva_plan *plan, int rows,
                                 int per_sm, const uint8_t *skip_req, kva__partition *reuse,
                                 kva__partition **out)
{
    kva__partition_params pp;
    gpu_params(st, rows, per_sm, &pp);
    kva__partition_grid grid;
    memset(&grid, 0, sizeof grid);
    grid.slots = (int64_t)per_sm * (st->num_sms > 0 ? st->num_sms : 1);
    grid.force_splits = st->force_splits;
    grid.alpha_pct = KVA_CUDA_GRID_ALPHA_PCT;
    grid.item_overhead = KVA_CUDA_GRID_ITEM_OVERHEAD;
    grid.split_overhead = KVA_CUDA_GRID_SPLIT_OVERHEAD;
    return kva__partition_build_grid(plan, &pp, &grid, skip_req, reuse, out);
}

extern "C" kva_status kva__cuda_context_force_splits(kva_context *ctx, int splits)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (splits < -1 || splits > 1024)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_force_splits: splits = %d (-1..1024)", splits);
    state_of(ctx)->force_splits = splits;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_staging_hot(kva_context *ctx, int64_t bytes)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (bytes < 0 || bytes > ((int64_t)64 << 20) || bytes % 256 != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_staging_hot: bytes = %lld (a multiple of 256 in "
                         "0..64 MiB)",
                         (long long)bytes);
    if (state_of(ctx)->meta_host)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_staging_hot: the context already has its staging "
                         "(set it before the first plan or reserve)");
    state_of(ctx)->staging_hot = (size_t)bytes;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_plan_probe(kva_context *ctx, double *stamps)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    state_of(ctx)->probe = stamps;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_balanced(kva_context *ctx, int on)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (on != 0 && on != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_balanced: on = %d, must be 0 or 1", on);
    state_of(ctx)->balanced = on;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_upload_min(kva_context *ctx, int64_t bytes)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (bytes < 0 || bytes > ((int64_t)1 << 30))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_upload_min: bytes = %lld (0..2^30)", (long long)bytes);
    state_of(ctx)->upload_min = (size_t)bytes;
    return KVA_STATUS_OK;
}

/* Resident CTAs per SM of the decode-family kernel (KVA__CUDA_K_DECODE_*) for
 * the shape (0: the kernel cannot be resident), from the context's cache: the
 * occupancy query (with the shared-memory attribute it sets first) is a
 * runtime call that kva_plan_create would otherwise repeat every step, and its
 * answer is fixed per kernel and device. Failures are not cached. */
static int ctas_per_sm_query(kva_dtype dt, int32_t dmax, int rows, int kernel)
{
    return kernel == KVA__CUDA_K_DECODE_MMA         ? kva__cuda_decode_mma_ctas_per_sm(dt, dmax)
           : kernel == KVA__CUDA_K_MLA_DECODE_MMA   ? kva__cuda_mla_decode_ctas_per_sm(dt, rows)
           : kernel == KVA__CUDA_K_MLA_DECODE_WGMMA ? kva__cuda_mla_wgmma_ctas_per_sm(dt)
                                                    : kva__cuda_simt_ctas_per_sm(dt, dmax, rows);
}

static int ctas_per_sm_cached(kva__cuda_state *st, kva_dtype dt, int32_t dmax, int rows, int kernel)
{
    for (int i = 0; i < st->num_occ; i++) {
        const kva__cuda_occ *o = &st->occ[i];
        if (o->dtype == dt && o->dmax == dmax && o->rows == rows && o->kernel == kernel)
            return o->per_sm;
    }
    const int n = ctas_per_sm_query(dt, dmax, rows, kernel);
    if (n > 0 && st->num_occ < KVA__CUDA_OCC_CACHE) {
        kva__cuda_occ *o = &st->occ[st->num_occ++];
        o->dtype = dt, o->dmax = dmax, o->rows = rows, o->kernel = kernel, o->per_sm = n;
    }
    return n;
}

/* The kernels a plan of ctx runs: the decode family's (the tensor-core decode
 * where it covers the shape, unless the CUDA-core kernel is forced; a forced
 * tensor-core decode on a shape it does not cover runs the CUDA-core kernel)
 * and the prefill tiles' (KVA__CUDA_PREFILL_AUTO unless one is forced; *tiles
 * = 0 when "prefill_items" is forced: the prefills become work items). */
static void plan_kernels(const kva_context *ctx, const kva_plan *plan, int *decode,
                         kva__cuda_prefill_kernel *prefill, int *tiles, int *narrow)
{
    *narrow = -1; /* the wgmma tile shape: -1 by q_len, else forced (0 wide, 1 narrow) */
    if (plan->d.kind == KVA_ATTN_MLA) {
        /* An MLA kernel runs every item of a latent plan: wgmma where the
         * items fill its 64 rows (H * max q_len > 32) on sm_90a, else mma.sync;
         * a forced MLA kernel wins. */
        const int fd = kva__context_forced_kernel(ctx, KVA__KERNEL_DECODE);
        const int rows =
            kva__cuda_mla_decode_rows(plan->d.num_heads, kva__cuda_mla_decode_q_len(plan));
        *decode =
            fd == KVA__CUDA_K_MLA_DECODE_MMA ? KVA__CUDA_K_MLA_DECODE_MMA
            : fd == KVA__CUDA_K_MLA_DECODE_WGMMA || (rows == 64 && kva__cuda_prefill_wgmma_ready())
                ? KVA__CUDA_K_MLA_DECODE_WGMMA
                : KVA__CUDA_K_MLA_DECODE_MMA;
        *prefill = KVA__CUDA_PREFILL_AUTO;
        *tiles = 0;
        return;
    }
    const int fd = kva__context_forced_kernel(ctx, KVA__KERNEL_DECODE);
    const int fp = kva__context_forced_kernel(ctx, KVA__KERNEL_PREFILL);
    const int mma =
        kva__cuda_decode_mma_supported(plan->d.head_dim, plan->d.head_dim_v, plan->d.q_dtype);
    *decode =
        mma && fd != KVA__CUDA_K_DECODE_SIMT ? KVA__CUDA_K_DECODE_MMA : KVA__CUDA_K_DECODE_SIMT;
    const int tma =
        fp == KVA__CUDA_K_PREFILL_WGMMA_TMA || fp == KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW;
    const int gather = fp == KVA__CUDA_K_PREFILL_WGMMA || fp == KVA__CUDA_K_PREFILL_WGMMA_NARROW;
    *prefill = tma                             ? KVA__CUDA_PREFILL_WGMMA_TMA
               : gather                        ? KVA__CUDA_PREFILL_WGMMA
               : fp == KVA__CUDA_K_PREFILL_MMA ? KVA__CUDA_PREFILL_MMA
                                               : KVA__CUDA_PREFILL_AUTO;
    if (tma || gather)
        *narrow =
            fp == KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW || fp == KVA__CUDA_K_PREFILL_WGMMA_NARROW;
    *tiles = fp != KVA__CUDA_K_PREFILL_ITEMS && plan->block_table != NULL &&
             kva__cuda_prefill_supported(plan->d.head_dim, plan->d.head_dim_v, plan->d.q_dtype);
}

/* *best = max(*best, per_sm x min(rows, row_cap)); *most = max(*most, per_sm). */
static void slot_rows(int64_t *best, int *most, int per_sm, int64_t rows, int64_t row_cap)
{
    const int64_t r = rows < row_cap ? rows : row_cap;
    if ((int64_t)per_sm * r > *best)
        *best = (int64_t)per_sm * r;
    if (per_sm > *most)
        *most = per_sm;
}

/*
 * The largest slots x split rows of any plan within cap, for
 * kva_cuda_context_reserve's workspace bound (cuda_meta.cu, caps_for): a
 * plan's partition runs on a grid of per_sm x SMs slots (best_partition), and
 * each of its split tasks holds nq x nh attention rows, at most the decode
 * kernel's rows (partition.c: nh <= the rows, nq = rows / nh for a tile) and
 * at most G x max_tokens (nh <= G = H / Hkv, nq <= q_len <= max_tokens).
 * Returned here: max over every kernel a plan of the shape may run (forced
 * kernels included) and every q dtype it takes of per_sm x min(rows,
 * G x max_tokens), per SM:
 *   - Dv > 256 (kind KVA_ATTN_MLA, D 576 / Dv 512, plan_kernels): the MLA
 *     mma decode at each row count (16, 32, 64) that H x q_len selects for a
 *     q_len of 1 .. max_tokens, and the wgmma decode (64 rows);
 *   - else: the tensor-core decode (D = Dv in {64, 128, 256}, 16 rows) and the
 *     CUDA-core decode (kva__cuda_rows_for_group(G) rows) at Dv and every head
 *     size bucket above it (cap has no D: dmax = max(D, Dv) >= Dv, up to 256).
 * *per_sm_max gets the largest per_sm alone (the item and task bounds).
 * The occupancy queries are not cached (a reservation is rare; the plans'
 * cache stays theirs). A kernel that cannot be resident (0) adds nothing.
 */
extern "C" int64_t kva__cuda_reserve_slot_rows(const kva_cuda_capacity *cap, int *per_sm_max)
{
    const int64_t G = cap->num_heads / (cap->num_kv_heads > 0 ? cap->num_kv_heads : 1);
    const int64_t q_max = cap->max_tokens > 1 ? cap->max_tokens : 1;
    const int64_t row_cap = G * q_max; /* nh x nq of any item */
    int64_t best = 0;
    int most = 0;
    const kva_dtype half[2] = {KVA_DTYPE_F16, KVA_DTYPE_BF16};
    if (cap->head_dim_v > 256) {
        const int lo = kva__cuda_mla_decode_rows(cap->num_heads, 1);
        const int hi = kva__cuda_mla_decode_rows(cap->num_heads, (int32_t)q_max);
        for (int d = 0; d < 2; d++) {
            for (int rows = lo; rows <= hi; rows *= 2)
                slot_rows(&best, &most,
                          ctas_per_sm_query(half[d], 576, rows, KVA__CUDA_K_MLA_DECODE_MMA), rows,
                          row_cap);
            slot_rows(&best, &most,
                      ctas_per_sm_query(half[d], 576, 64, KVA__CUDA_K_MLA_DECODE_WGMMA), 64,
                      row_cap);
        }
    } else {
        const int32_t Dv = cap->head_dim_v;
        if (kva__cuda_decode_mma_supported(Dv, Dv, KVA_DTYPE_BF16))
            for (int d = 0; d < 2; d++)
                slot_rows(&best, &most, ctas_per_sm_query(half[d], Dv, 0, KVA__CUDA_K_DECODE_MMA),
                          KVA__CUDA_MMA_DECODE_ROWS, row_cap);
        const kva_dtype all[3] = {KVA_DTYPE_F16, KVA_DTYPE_BF16, KVA_DTYPE_F32};
        const int rows = kva__cuda_rows_for_group((int32_t)G);
        const int32_t dmax[5] = {Dv, 32, 64, 128, 256}; /* attn_simt.cuh: buckets end there */
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 5; k++)
                if (dmax[k] >= Dv)
                    slot_rows(&best, &most,
                              ctas_per_sm_query(all[d], dmax[k], rows, KVA__CUDA_K_DECODE_SIMT),
                              rows, row_cap);
    }
    *per_sm_max = most > 0 ? most : 1;
    return best > 0 ? best : 1;
}

/*
 * Sharded (DCP) plans. The device copy of seq_lens holds the local lengths
 * kv_lens. Where every query row sees all of the rank's keys (no window, no
 * local chunk, no ALiBi, and causal rows only when the first query of each request comes
 * after every local key: decodes, q_len 1, always do) the plan runs as a
 * non-causal plan over them, on every kernel. Otherwise (*global = 1) the
 * masks need global positions: the upload adds N, the rank, the interleave
 * and the global lengths (dcp_pos.cuh), and the plan's rows all run as work
 * items of the decode-family kernels, whose mask code reads them (the
 * prefill tile kernels do not).
 */
static kva_status dcp_accept(kva_plan *plan, int *global)
{
    const kva_plan_desc *d = &plan->d;
    *global = 0;
    if (d->dcp_size <= 1)
        return KVA_STATUS_OK;
    *global = d->window_left >= 0 || d->attention_chunk > 0 || plan->alibi_slopes;
    for (int32_t r = 0; d->causal && r < d->num_requests; r++) {
        const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        const int32_t s = plan->seq_lens[r];
        if (q > 0 && kva__dcp_local_count(d, (int64_t)s - q + 1) != plan->kv_lens[r])
            *global = 1;
    }
    if (!*global)
        plan->d.causal = 0; /* every local key is visible to every row */
    return KVA_STATUS_OK;
}

/* Sparse MLA plans (sparse_topk > 0, mla_sparse.cu): no work partition (the
 * kernel's items are tokens x head tiles x key splits, from the launch
 * arguments); the batch arrays are uploaded as for every plan, and the
 * workspace holds the split partials and the separate mode's dense rows. */
static kva_status sparse_plan_build(kva_context *ctx, kva_plan *plan)
{
    kva__cuda_state *st = state_of(ctx);
    if (!kva__cuda_sparse_supported(plan))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: the CUDA sparse MLA covers D = 576, Dv = 512 with f16 "
                         "or bf16 q (got D = %d, Dv = %d, %s)",
                         (int)plan->d.head_dim, (int)plan->d.head_dim_v,
                         kva_dtype_name(plan->d.q_dtype));
    if (!plan->block_table)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_plan_create: a sparse MLA plan needs a block_table (its index "
                         "lists are positions, turned into cache slots through it)");
    kva__partition *part = (kva__partition *)calloc(1, sizeof *part);
    kva__cuda_plan *cp = (kva__cuda_plan *)calloc(1, sizeof *cp);
    if (!part || !cp) {
        free(part);
        free(cp);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
    }
    plan->part = part; /* released by kva__cuda_plan_release on any failure below */
    plan->device = cp;
    cp->decode_kernel = kva__cuda_sparse_kernel(ctx, plan);
    const int32_t R = plan->d.num_requests;
    kva__cuda_caps need;
    memset(&need, 0, sizeof need);
    need.reqs = R;
    need.bt = (int64_t)R * plan->d.block_table_stride;
    need.heads = plan->d.num_heads;
    size_t ws = 0, rows_off = 0;
    KVA_TRY(kva__cuda_sparse_workspace(ctx, plan, &ws, &rows_off));
    KVA_TRY(kva__cuda_reserve_meta(st, &need, 1));
    KVA_TRY(kva__cuda_workspace_reserve(ctx, ws));
    KVA_TRY(kva__cuda_upload_plan(st, plan, part, NULL));
    st->generation++;
    cp->generation = st->generation;
    plan->workspace_bytes = ws;
    return KVA_STATUS_OK;
}

/* The attention plans' build (every kind but sparse MLA and the indexer):
 * *reuse and *cp_reuse, a recycled plan's partition and device record or
 * NULL, are taken over (set to NULL) once the build gets to them. */
static kva_status attention_plan_build(kva_context *ctx, kva_plan *plan, kva__partition **reuse,
                                       kva__cuda_plan **cp_reuse)
{
    int dcp_global = 0;
    KVA_TRY(dcp_accept(plan, &dcp_global));
    kva__cuda_state *st = state_of(ctx);
    KVA_TRY(use_device(st->device));
    kva__cuda_probe(st, KVA__CUDA_PROBE_DEVICE);
    KVA_TRY(kva__cuda_check_not_capturing("kva_plan_create", st));
    kva__cuda_probe(st, KVA__CUDA_PROBE_CAPTURE);
    const int32_t G = plan->d.num_heads / plan->d.num_kv_heads;
    const int32_t dmax =
        plan->d.head_dim > plan->d.head_dim_v ? plan->d.head_dim : plan->d.head_dim_v;
    int kernel = 0, mma = 0;
    kva__cuda_prefill_kernel pkernel = KVA__CUDA_PREFILL_AUTO;
    int narrow = -1;
    plan_kernels(ctx, plan, &kernel, &pkernel, &mma, &narrow);
    mma = mma && !dcp_global; /* the prefill tiles take masks from local lengths */
    const int mla = kernel == KVA__CUDA_K_MLA_DECODE_MMA || kernel == KVA__CUDA_K_MLA_DECODE_WGMMA;
    if (plan->d.kind == KVA_ATTN_MLA && plan->d.dcp_size > 1)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: sharded (dcp_size = %d) MLA plans run on the reference "
                         "and CPU backends; the CUDA MLA decode has not been run sharded",
                         (int)plan->d.dcp_size);
    if (!mla && dmax > 256)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: head_dim = %d, head_dim_v = %d: the CUDA backend's "
                         "attention kernels take head sizes up to 256 (D 576 / Dv 512 only for "
                         "kind KVA_ATTN_MLA)",
                         (int)plan->d.head_dim, (int)plan->d.head_dim_v);
    if (mla &&
        !kva__cuda_mla_decode_supported(plan->d.head_dim, plan->d.head_dim_v, plan->d.q_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: the CUDA MLA decode covers D = 576, Dv = 512 with f16 "
                         "or bf16 q (got D = %d, Dv = %d, %s)",
                         (int)plan->d.head_dim, (int)plan->d.head_dim_v,
                         kva_dtype_name(plan->d.q_dtype));
    /* The decode kernel decides the rows per item: one m16 tile for the
     * tensor-core decode, 4 or 8 for the CUDA-core kernel, 16 to 64 (H x the
     * longest q_len) for the MLA decode. */
    const int rows =
        kernel == KVA__CUDA_K_MLA_DECODE_WGMMA ? 64
        : mla ? kva__cuda_mla_decode_rows(plan->d.num_heads, kva__cuda_mla_decode_q_len(plan))
        : kernel == KVA__CUDA_K_DECODE_MMA ? KVA__CUDA_MMA_DECODE_ROWS
                                           : kva__cuda_rows_for_group(G);
    const int per_sm = ctas_per_sm_cached(
        st, plan->d.q_dtype, kernel == KVA__CUDA_K_DECODE_MMA ? plan->d.head_dim : dmax,
        kernel == KVA__CUDA_K_DECODE_MMA ? 0 : rows, kernel);
    if (per_sm < 1)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_plan_create: the attention kernel %s for %s, D/Dv %d/%d cannot be "
                         "resident on device %d",
                         kva__cuda_kernels[kernel].name, kva_dtype_name(plan->d.q_dtype),
                         (int)plan->d.head_dim, (int)plan->d.head_dim_v, (int)st->device);
    const int32_t R = plan->d.num_requests;
    /* Requests for the prefill tile kernels (mma_req[r] = 1), when the shape
     * has them and the step has prefills (classify: q_len above the decode
     * threshold); a decode step allocates and counts nothing. */
    uint8_t *mma_req = NULL;
    int32_t num_prefills = 0;
    int64_t ptiles = 0, max_prefill_q = 0;
    if (mma && plan->info.num_prefills > 0) {
        mma_req = (uint8_t *)calloc((size_t)(R > 0 ? R : 1), 1);
        if (!mma_req)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
        for (int32_t r = 0; r < R; r++) {
            const int64_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
            mma_req[r] =
                q_len > plan->d.decode_threshold && q_len * G >= KVA_CUDA_MMA_MIN_ROWS ? 1 : 0;
            num_prefills += mma_req[r];
            if (mma_req[r] && q_len > max_prefill_q)
                max_prefill_q = q_len;
        }
        ptiles = kva__cuda_prefill_tiles_count_subset(R, plan->query_start_loc, mma_req,
                                                      plan->d.num_heads, plan->d.num_kv_heads);
        if (ptiles < 0) {
            free(mma_req);
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "kva_plan_create: the prefill tile count of the batch overflows");
        }
    }
    /* Layer-level MLA plans: the partition holds the absorbed requests only. */
    const int mla_layer = mla && plan->d.mla_qk_nope_head_dim > 0;
    if (mla_layer) {
        mma_req = (uint8_t *)calloc((size_t)(R > 0 ? R : 1), 1);
        if (!mma_req)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
        const kva_status ms = kva__cuda_mla_split(plan, mma_req);
        if (ms != KVA_STATUS_OK) {
            free(mma_req);
            return ms;
        }
    }
    kva__partition *part = NULL;
    kva_status s = best_partition(st, plan, rows, per_sm, mma_req, *reuse, &part);
    *reuse = NULL; /* consumed: part, or freed */
    kva__cuda_probe(st, KVA__CUDA_PROBE_PART);
    if (mla_layer) {
        free(mma_req);
        mma_req = NULL;
    }
    if (s != KVA_STATUS_OK) {
        free(mma_req);
        return s;
    }
    kva__cuda_plan *cp = *cp_reuse ? *cp_reuse : (kva__cuda_plan *)malloc(sizeof *cp);
    *cp_reuse = NULL;
    if (cp)
        memset(cp, 0, sizeof *cp);
    if (!cp) {
        free(mma_req);
        kva__partition_free(part);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
    }
    plan->part = part; /* released by kva__cuda_plan_release on any failure below */
    plan->device = cp;
    cp->mma = mma;
    cp->dcp_global = dcp_global;
    cp->num_prefills = num_prefills;
    cp->num_ptiles = (int32_t)ptiles;
    cp->prefill_narrow =
        narrow >= 0 ? narrow : ptiles > 0 && max_prefill_q <= KVA_CUDA_PREFILL_NARROW_MAX_Q;
    kva__cuda_caps need;
    need.items = part->num_items;
    need.tasks = part->num_tasks;
    need.reqs = R;
    need.bt = plan->block_table ? (int64_t)R * plan->d.block_table_stride : 0;
    need.heads = plan->d.num_heads;
    need.ptiles = ptiles;
    need.tree = plan->tree_bits && R > 0 ? plan->query_start_loc[R] : 0;
    size_t ws = (size_t)part->partial_floats * sizeof(float);
    s = kva__cuda_reserve_meta(st, &need, 1);
    if (s == KVA_STATUS_OK)
        s = kva__cuda_workspace_reserve(ctx, ws);
    kva__cuda_probe(st, KVA__CUDA_PROBE_RESERVE);
    if (s == KVA_STATUS_OK)
        s = kva__cuda_upload_plan(st, plan, part, ptiles > 0 ? mma_req : NULL);
    free(mma_req);
    if (s == KVA_STATUS_OK && mla_layer)
        s = kva__cuda_mla_plan_build(ctx, plan, (ws + 255u) & ~(size_t)255u, st->mla_chunk_keys,
                                     kva__cuda_workspace_reserve, st->stream, &cp->mla);
    if (s != KVA_STATUS_OK && mla_layer)
        st->generation++; /* the upload replaced the current plan's metadata */
    KVA_TRY(s);
    st->generation++;
    cp->generation = st->generation;
    cp->rows = rows;
    cp->decode_kernel = kernel;
    cp->per_sm = per_sm;
    cp->prefill_kernel = pkernel;
    cp->has_alibi = plan->alibi_slopes != NULL;
    for (int32_t t = 0; st->balanced && t < part->num_tasks && !cp->balanced; t++)
        cp->balanced = part->tasks[t].num_splits >= KVA__CUDA_BALANCED_SPLITS;
    plan->info.num_work_items = part->num_items + (int32_t)ptiles;
    plan->workspace_bytes = cp->mla ? cp->mla->base + cp->mla->bytes : ws;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_plan_build(kva_context *ctx, kva_plan *plan)
{
    /* A recycled plan (kva_plan_update) brings its partition and device
     * record; the attention build rebuilds in them, the others free them. */
    kva__partition *reuse = plan->part;
    kva__cuda_plan *cp = (kva__cuda_plan *)plan->device;
    plan->part = NULL;
    plan->device = NULL;
    kva__cuda_probe(state_of(ctx), KVA__CUDA_PROBE_ENTRY);
    kva_status s;
    if (plan->d.kind == KVA_ATTN_INDEX) { /* indexer.cu: no attention partition */
        s = kva__cuda_indexer_plan_build(ctx, plan);
    } else if (plan->d.sparse_topk > 0) {
        s = use_device(state_of(ctx)->device);
        if (s == KVA_STATUS_OK)
            s = kva__cuda_check_not_capturing("kva_plan_create", state_of(ctx));
        if (s == KVA_STATUS_OK)
            s = sparse_plan_build(ctx, plan);
    } else {
        s = attention_plan_build(ctx, plan, &reuse, &cp);
    }
    kva__partition_free(reuse);
    free(cp);
    return s;
}

/* Keeps a replaced plan's partition (its arrays) and device record for the
 * next build; the MLA and indexer parts are freed. */
extern "C" void kva__cuda_plan_recycle(kva_plan *plan)
{
    kva__cuda_plan *cp = (kva__cuda_plan *)plan->device;
    if (cp) {
        kva__cuda_mla_plan_free(cp->mla);
        kva__cuda_indexer_plan_free(cp->index);
        cp->mla = NULL;
        cp->index = NULL;
    }
}

extern "C" void kva__cuda_plan_release(kva_plan *plan)
{
    kva__partition_free(plan->part);
    plan->part = NULL;
    if (plan->device) {
        kva__cuda_mla_plan_free(((kva__cuda_plan *)plan->device)->mla);
        kva__cuda_indexer_plan_free(((kva__cuda_plan *)plan->device)->index);
    }
    free(plan->device);
    plan->device = NULL;
}
