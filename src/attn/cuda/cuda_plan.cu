/*
 * cuda_plan.cu - the CUDA backend's plan builder (C-style CUDA): the device
 * metadata buffer and its layout, the partition parameters for the GPU, the
 * kernel choice per plan, the upload of a plan's metadata, the workspace,
 * kva_cuda_context_reserve, and the plan builds of every kind (attention,
 * MLA, sparse MLA, indexer). The context and the operation tables are in
 * cuda_ctx.cu.
 *
 * kva_plan_create partitions the work on the host (src/plan/partition.c),
 * grows the buffers if the plan does not fit (after a stream synchronize;
 * refused during capture), fills a slot of the pinned staging ring (waiting
 * for an older upload to leave it where needed) and enqueues its used
 * sections in as few cudaMemcpyAsync as possible (one for a decode step).
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

/* ---- device metadata ---- */

static size_t align256(size_t x)
{
    return (x + 255u) & ~(size_t)255u;
}

/* Byte offsets of the sections for caps c; returns the total size. */
#define KVA_CUDA_SECTIONS 11
/* Packed rows (q_len * H / Hkv) from which a request above the decode
 * threshold goes to prefill_mma (fewer leave most of its 128-row tile empty). */
#define KVA_CUDA_MMA_MIN_ROWS 64
/* K/V bytes of one L2 section of the prefill tile list
 * (kva__cuda_prefill_tiles_build_sections): a third of an H100's 50 MB L2,
 * the rest left to the query rows and outputs streaming through. */
#define KVA_CUDA_L2_SECTION_BYTES ((int64_t)16 << 20)
/* Largest gap between two used metadata sections that one upload spans. */
#define KVA_CUDA_UPLOAD_GAP ((size_t)32 << 10)
/* Used sections that lie within this many bytes go up in one copy, whatever
 * the gaps between them: the extra bytes cost the copy engine little, a
 * second cudaMemcpyAsync costs the host a runtime call. */
#define KVA_CUDA_UPLOAD_SPAN ((size_t)128 << 10)

/*
 * The sections in buffer order: the header and the per-request arrays
 * (small), the block table, the work items, then the sections that only some
 * plans use (split tasks, prefill tiles, tree words). A decode step's upload
 * (header, requests, block table, items) is then one span whose only gaps are
 * the unused capacities of the request arrays and the block table, even when
 * kva_cuda_context_reserve made the item and tile capacities large.
 * Indices: 0 header, 1 items, 2 tasks, 3 qsl, 4 seq_lens, 5 kv_start, 6 block
 * table, 7 ALiBi slopes, 8 prefill tiles, 9 global seq_lens, 10 tree words.
 */
static const int kva_cuda_section_order[KVA_CUDA_SECTIONS] = {0, 3, 4, 5, 7, 9, 6, 1, 2, 8, 10};

static size_t layout_sections(const kva__cuda_caps *c, size_t off[KVA_CUDA_SECTIONS])
{
    size_t bytes[KVA_CUDA_SECTIONS];
    bytes[0] = KVA_CUDA_HDR_WORDS * sizeof(int32_t);
    bytes[1] = (size_t)c->items * sizeof(kva__cuda_item);
    bytes[2] = (size_t)c->tasks * sizeof(kva__cuda_task);
    bytes[3] = (size_t)(c->reqs + 1) * sizeof(int32_t);
    bytes[4] = (size_t)c->reqs * sizeof(int32_t);
    bytes[5] = (size_t)(c->reqs + 1) * sizeof(int64_t);
    bytes[6] = (size_t)c->bt * sizeof(int32_t);
    bytes[7] = (size_t)c->heads * sizeof(float);
    bytes[8] = (size_t)c->ptiles * KVA__CUDA_PREFILL_TILE_INTS * sizeof(int32_t);
    bytes[9] = (size_t)c->reqs * sizeof(int32_t);
    bytes[10] = (size_t)c->tree * sizeof(uint64_t);
    size_t o = 0;
    for (int k = 0; k < KVA_CUDA_SECTIONS; k++) {
        const int i = kva_cuda_section_order[k];
        off[i] = o;
        o = align256(o + bytes[i]);
    }
    return o;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Refuses to grow while the stream is being captured: a graph would keep the
 * old addresses. */
static kva_status check_not_capturing(const char *fn, kva__cuda_state *st)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    KVA_CUDA_TRY(cudaStreamIsCapturing(STREAM(st), &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: the context's stream is capturing a graph; plans must be created "
                         "(and buffers reserved) outside capture",
                         fn);
    return KVA_STATUS_OK;
}

/* The capacity of one section that has to hold need, at least lo: cap when
 * it does, else need, and with slack at least twice cap. */
static int64_t grow_cap(int64_t cap, int64_t need, int64_t lo, int slack)
{
    if (need <= cap)
        return max64(cap, lo);
    return max64(max64(need, lo), slack ? 2 * cap : 0);
}

/* Grows the metadata buffers to hold need (keeps them when they already do).
 * slack (plan builds): a section that overflows at least doubles, so a batch
 * that grows step by step, as a serving engine's first steps do, costs a few
 * reallocations (each one a stream synchronize, device and pinned
 * allocations), not one per step; kva_cuda_context_reserve asks for its upper
 * bounds exactly. The prefill tiles grow exactly: their capacity is the grid
 * of the (non-persistent) mma.sync prefill kernel. */
static kva_status reserve_meta(kva__cuda_state *st, const kva__cuda_caps *need, int slack)
{
    kva__cuda_caps c = st->caps;
    if (st->meta_dev && need->items <= c.items && need->tasks <= c.tasks && need->reqs <= c.reqs &&
        need->bt <= c.bt && need->heads <= c.heads && need->ptiles <= c.ptiles &&
        need->tree <= c.tree)
        return KVA_STATUS_OK;
    c.items = grow_cap(c.items, need->items, 1024, slack);
    c.tasks = grow_cap(c.tasks, need->tasks, 256, slack);
    c.reqs = grow_cap(c.reqs, need->reqs, 64, slack);
    c.bt = grow_cap(c.bt, need->bt, 4096, slack);
    c.heads = grow_cap(c.heads, need->heads, 64, 0);
    /* No prefill-tile capacity until a plan or reserve needs some: the prefill
     * kernel is launched only when there is (decode-only contexts skip it);
     * likewise the tree words (tree plans only). */
    c.ptiles = need->ptiles > 0 ? grow_cap(c.ptiles, need->ptiles, 256, 0) : c.ptiles;
    c.tree = need->tree > 0 ? grow_cap(c.tree, need->tree, 256, slack) : c.tree;
    size_t off[KVA_CUDA_SECTIONS];
    size_t bytes = layout_sections(&c, off);
    KVA_TRY(check_not_capturing("kva_plan_create", st));
    void *dev = NULL, *host = NULL;
    cudaError_t e = cudaMalloc(&dev, bytes);
    if (e == cudaSuccess)
        e = cudaMallocHost(&host, bytes * KVA__CUDA_STAGING_SLOTS);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(dev);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: cannot allocate %zu bytes of device metadata: %s", bytes,
                         cudaGetErrorString(e));
    }
    /* Kernels queued earlier may still read the old buffers. */
    KVA_CUDA_TRY(cudaStreamSynchronize(STREAM(st)));
    cudaFree(st->meta_dev);
    cudaFreeHost(st->meta_host);
    st->ring->pending[0] = st->ring->pending[1] = 0; /* the stream ran every upload */
    st->ring->uploads = 0;
    st->ring_slots = KVA__CUDA_STAGING_SLOTS;
    st->meta_dev = dev;
    st->meta_host = host;
    st->meta_bytes = bytes;
    st->caps = c;
    st->generation++; /* the plan whose metadata the old buffers held is gone */
    char *b = (char *)dev;
    st->meta.hdr = (const int32_t *)(b + off[0]);
    st->meta.items = (const kva__cuda_item *)(b + off[1]);
    st->meta.tasks = (const kva__cuda_task *)(b + off[2]);
    st->meta.qsl = (const int32_t *)(b + off[3]);
    st->meta.seq_lens = (const int32_t *)(b + off[4]);
    st->meta.kv_start = (const int64_t *)(b + off[5]);
    st->meta.block_table = (const int32_t *)(b + off[6]);
    st->meta.alibi = (const float *)(b + off[7]);
    st->meta.ptiles = c.ptiles > 0 ? (const int32_t *)(b + off[8]) : NULL;
    st->meta.dcp_seq_lens = (const int32_t *)(b + off[9]);
    st->meta.tree = (const uint64_t *)(b + off[10]);
    /* The header is read by every kernel (the prefill kernel's tile count
     * too) before the first upload could fill it. */
    KVA_CUDA_TRY(cudaMemsetAsync(dev, 0, KVA_CUDA_HDR_WORDS * sizeof(int32_t), STREAM(st)));
    return KVA_STATUS_OK;
}

/* Grows the device workspace (split partials) to bytes. */
extern "C" kva_status kva__cuda_workspace_reserve(kva_context *ctx, size_t bytes)
{
    kva__cuda_state *st = state_of(ctx);
    if (bytes <= ctx->workspace_bytes)
        return KVA_STATUS_OK;
    KVA_TRY(check_not_capturing("kva_plan_create", st));
    /* A quarter of headroom, and at least half again the old size, so a
     * workspace that grows step by step is reallocated a few times only. */
    size_t rounded = align256(bytes + bytes / 4);
    if (rounded < ctx->workspace_bytes + ctx->workspace_bytes / 2)
        rounded = align256(ctx->workspace_bytes + ctx->workspace_bytes / 2);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: cannot allocate %zu bytes of device workspace: %s",
                         rounded, cudaGetErrorString(e));
    }
    KVA_CUDA_TRY(cudaStreamSynchronize(STREAM(st)));
    cudaFree(ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_bytes = rounded;
    return KVA_STATUS_OK;
}

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
    pp->max_splits = 32;
    pp->items_per_thread = 1;
}

/*
 * The grid's time model (kva__partition_grid), fitted on an H100 to paged bf16
 * decodes (H/Hkv 32/8, D 128, tensor-core decode, 2 CTAs per SM; docs/cuda.md "Split
 * choice"): 128 unsplit items of 4k keys on 264 CTAs ran at 2.46 TB/s, i.e.
 * a CTA of a half-empty grid moves ~1.76x its share of a full one (2.88 TB/s);
 * 4 -> 8 chunks per unit of the same batch (2 -> 4 items per CTA) added ~11
 * us, and splitting at all ~10 us (partial writes, the merge pass's work), at
 * ~9.4 ns per cost unit (one key of one GQA row). A second call checked the
 * choices on 7 decode batches: none slower than the former choice, 16 x 4k
 * 1.16x faster and its pick (2 chunks) the fastest of 1, 2, 3, 4, 8, 16.
 */
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

/* Upper bounds of the sections for a batch within cap (kva_cuda_context_reserve). */
static void caps_for(const kva__cuda_state *st, const kva_cuda_capacity *cap, kva__cuda_caps *c,
                     size_t *ws_bytes)
{
    const int64_t G = cap->num_heads / (cap->num_kv_heads > 0 ? cap->num_kv_heads : 1);
    const int rows = kva__cuda_rows_for_group((int32_t)G);
    const int64_t slices = (G + rows - 1) / rows;
    /* Resident CTAs per SM never exceed 8 for the attention kernels, and the
     * partition asks for up to 4 items per CTA. */
    const int64_t threads = 32 * (int64_t)(st->num_sms > 0 ? st->num_sms : 1);
    /* Units: every request contributes at most q_len/nq + 1 tiles per slice and
     * kv head; splitting adds at most one item per partition thread, and only
     * units costlier than total/threads are split (fewer than threads of them). */
    int64_t units = cap->num_kv_heads * slices * ((int64_t)cap->max_tokens + cap->max_requests);
    c->items = units + 2 * threads + 64;
    c->tasks = threads + 64;
    c->reqs = cap->max_requests;
    c->bt = cap->max_block_table;
    c->heads = cap->num_heads;
    c->tree = cap->max_tokens; /* a tree plan's words: a graph replays trees too */
    /* Prefill tiles: every request has at most ceil(q_len * G / 128) tiles per
     * kv head; only batches with a request of more than one token can have a
     * prefill. */
    c->ptiles = cap->max_tokens > cap->max_requests
                    ? cap->num_kv_heads * ((int64_t)cap->max_tokens * G / KVA__CUDA_PREFILL_TILE_M +
                                           cap->max_requests)
                    : 0;
    /* Split partials: the tensor-core decode's items hold up to 16 rows, the
     * MLA decode's (the only kernel with Dv > 256) up to 64. */
    const size_t ws_rows = cap->head_dim_v > 256              ? (size_t)64
                           : rows > KVA__CUDA_MMA_DECODE_ROWS ? (size_t)rows
                                                              : (size_t)KVA__CUDA_MMA_DECODE_ROWS;
    *ws_bytes = (size_t)(3 * threads + 64) * ws_rows * ((size_t)cap->head_dim_v + 1) * 4u;
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

extern "C" kva_status kva_cuda_context_reserve(kva_context *ctx, const kva_cuda_capacity *cap)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    KVA_CHECK_PTR(cap);
    if (cap->max_requests < 0 || cap->max_tokens < 0 || cap->max_block_table < 0 ||
        cap->num_heads < 1 || cap->num_kv_heads < 1 || cap->num_heads % cap->num_kv_heads != 0 ||
        !kva__head_dim_ok(cap->head_dim_v) || cap->head_dim_v > kva__cuda_ops.max_head_dim)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cuda_context_reserve: cap = {R %d, T %d, block table %lld, H %d, "
                         "Hkv %d, Dv %d} is not a valid shape",
                         (int)cap->max_requests, (int)cap->max_tokens,
                         (long long)cap->max_block_table, (int)cap->num_heads,
                         (int)cap->num_kv_heads, (int)cap->head_dim_v);
    kva__cuda_state *st = state_of(ctx);
    KVA_TRY(use_device(st->device));
    kva__cuda_caps c;
    size_t ws = 0;
    caps_for(st, cap, &c, &ws);
    KVA_TRY(check_not_capturing(__func__, st));
    KVA_TRY(reserve_meta(st, &c, 0));
    return kva__cuda_workspace_reserve(ctx, ws);
}

/*
 * The staging ring. An upload fills a staging slot on the host and copies it
 * to the device buffer on the stream, so the slot stays in use until the
 * stream has run the copy. Uploads go in groups of KVA__CUDA_STAGING_GROUP
 * into alternate halves of KVA__CUDA_STAGING_SLOTS slots, and only the last
 * upload of a group records an event (ring->events[half]); the first upload
 * of a group waits, on the host, for the event of the group two before (the
 * same half), which the stream has normally run long ago. So a host event
 * record and wait (runtime calls, as the copy is) come once per group instead
 * of once per upload.
 */
static kva_status staging_acquire(kva__cuda_state *st, char **slot)
{
    const uint64_t n = st->ring->uploads;
    const int half = (int)((n / KVA__CUDA_STAGING_GROUP) & 1u);
    if (n % KVA__CUDA_STAGING_GROUP == 0 && st->ring->pending[half]) {
        const cudaError_t e = cudaEventSynchronize((cudaEvent_t)st->ring->events[half]);
        if (e != cudaSuccess)
            return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_plan_create: %s", cudaGetErrorString(e));
        st->ring->pending[half] = 0;
    }
    *slot = (char *)st->meta_host +
            (size_t)(half * KVA__CUDA_STAGING_GROUP + (int)(n % KVA__CUDA_STAGING_GROUP)) *
                st->meta_bytes;
    return KVA_STATUS_OK;
}

/* Marks the slot of staging_acquire as in flight (its copies enqueued);
 * records the group's event after its last upload. */
static kva_status staging_release(kva__cuda_state *st)
{
    const uint64_t n = st->ring->uploads;
    const int half = (int)((n / KVA__CUDA_STAGING_GROUP) & 1u);
    if (n % KVA__CUDA_STAGING_GROUP == KVA__CUDA_STAGING_GROUP - 1) {
        KVA_CUDA_TRY(cudaEventRecord((cudaEvent_t)st->ring->events[half], STREAM(st)));
        st->ring->pending[half] = 1;
    }
    st->ring->uploads = n + 1;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_upload_drain(kva__cuda_state *st)
{
    const uint64_t n = st->ring->uploads;
    if (n % KVA__CUDA_STAGING_GROUP != 0) { /* close the open group */
        const int half = (int)((n / KVA__CUDA_STAGING_GROUP) & 1u);
        KVA_CUDA_TRY(cudaEventRecord((cudaEvent_t)st->ring->events[half], STREAM(st)));
        st->ring->pending[half] = 1;
        st->ring->uploads = (n / KVA__CUDA_STAGING_GROUP + 1) * KVA__CUDA_STAGING_GROUP;
    }
    for (int h = 0; h < 2; h++)
        if (st->ring->pending[h]) {
            KVA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)st->ring->events[h]));
            st->ring->pending[h] = 0;
        }
    return KVA_STATUS_OK;
}

/* Copies bytes of the staging slot h at off to the device buffer on the stream. */
static kva_status upload(kva__cuda_state *st, const char *h, size_t off, size_t bytes)
{
    if (bytes == 0)
        return KVA_STATUS_OK;
    KVA_CUDA_TRY(cudaMemcpyAsync((char *)st->meta_dev + off, h + off, bytes, cudaMemcpyHostToDevice,
                                 STREAM(st)));
    return KVA_STATUS_OK;
}

/* Fills a staging slot with the plan's metadata and enqueues the copies. */
static kva_status upload_plan(kva__cuda_state *st, const kva_plan *plan, const kva__partition *part,
                              const uint8_t *mma_req)
{
    size_t off[KVA_CUDA_SECTIONS];
    layout_sections(&st->caps, off);
    char *h = NULL;
    KVA_TRY(staging_acquire(st, &h));
    const int32_t R = plan->d.num_requests;
    const int64_t bt = plan->block_table ? (int64_t)R * plan->d.block_table_stride : 0;

    int32_t *hdr = (int32_t *)(h + off[0]);
    memset(hdr, 0, KVA_CUDA_HDR_WORDS * sizeof(int32_t));
    hdr[KVA_CUDA_HDR_ITEMS] = part->num_items;
    hdr[KVA_CUDA_HDR_TASKS] = part->num_tasks;
    hdr[KVA_CUDA_HDR_REQS] = R;
    hdr[KVA_CUDA_HDR_BT_STRIDE] = plan->d.block_table_stride;
    kva__cuda_item *it = (kva__cuda_item *)(h + off[1]);
    for (int32_t i = 0; i < part->num_items; i++) {
        const kva__work_item *w = &part->items[i];
        kva__cuda_item x = {w->req, w->kv_head, w->h0, w->nh,   w->i0,
                            w->nq,  w->k0,      w->k1, w->task, w->split};
        it[i] = x;
    }
    kva__cuda_task *tk = (kva__cuda_task *)(h + off[2]);
    for (int32_t i = 0; i < part->num_tasks; i++) {
        const kva__split_task *t = &part->tasks[i];
        kva__cuda_task x = {t->req, t->kv_head,    t->h0, t->nh,    t->i0,
                            t->nq,  t->num_splits, 0,     t->ws_off};
        tk[i] = x;
    }
    memcpy(h + off[3], plan->query_start_loc, ((size_t)R + 1) * sizeof(int32_t));
    if (R > 0)
        memcpy(h + off[4], plan->kv_lens, (size_t)R * sizeof(int32_t)); /* see dcp_accept */
    memcpy(h + off[5], plan->kv_start, ((size_t)R + 1) * sizeof(int64_t));
    if (bt > 0)
        memcpy(h + off[6], plan->block_table, (size_t)bt * sizeof(int32_t));
    if (plan->alibi_slopes)
        memcpy(h + off[7], plan->alibi_slopes, (size_t)plan->d.num_heads * sizeof(float));
    int32_t ntiles = 0;
    if (mma_req)
        KVA_TRY(kva__cuda_prefill_tiles_build_sections(
            R, plan->query_start_loc, plan->kv_lens, mma_req, plan->d.num_heads,
            plan->d.num_kv_heads, plan->d.causal, plan->d.window_left, plan->d.attention_chunk,
            KVA_CUDA_L2_SECTION_BYTES / ((int64_t)(plan->d.head_dim + plan->d.head_dim_v) *
                                         (int64_t)kva_dtype_size(plan->d.q_dtype)),
            (int32_t *)(h + off[8]), (int32_t)st->caps.ptiles, &ntiles));
    hdr[KVA_CUDA_HDR_PTILES] = ntiles;
    const int dcp_global = ((const kva__cuda_plan *)plan->device)->dcp_global;
    if (dcp_global) { /* masks on global positions (dcp_pos.cuh) */
        hdr[KVA_CUDA_HDR_DCP_N] = plan->d.dcp_size;
        hdr[KVA_CUDA_HDR_DCP_RANK] = plan->d.dcp_rank;
        hdr[KVA_CUDA_HDR_DCP_I] = plan->d.dcp_interleave;
        memcpy(h + off[9], plan->seq_lens, (size_t)R * sizeof(int32_t));
    }
    const int32_t T = R > 0 ? plan->query_start_loc[R] : 0;
    if (plan->tree_bits) { /* draft-tree words (tree_mask.cuh) */
        hdr[KVA_CUDA_HDR_TREE] = 1;
        memcpy(h + off[10], plan->tree_bits, (size_t)T * sizeof(uint64_t));
    }

    /* The used part of every section. */
    size_t len[KVA_CUDA_SECTIONS];
    len[0] = KVA_CUDA_HDR_WORDS * sizeof(int32_t);
    len[1] = (size_t)part->num_items * sizeof(kva__cuda_item);
    len[2] = (size_t)part->num_tasks * sizeof(kva__cuda_task);
    len[3] = ((size_t)R + 1) * sizeof(int32_t);
    len[4] = (size_t)R * sizeof(int32_t);
    len[5] = ((size_t)R + 1) * sizeof(int64_t);
    len[6] = (size_t)bt * sizeof(int32_t);
    len[7] = plan->alibi_slopes ? (size_t)plan->d.num_heads * sizeof(float) : 0;
    len[8] = (size_t)ntiles * KVA__CUDA_PREFILL_TILE_INTS * sizeof(int32_t);
    len[9] = dcp_global ? (size_t)R * sizeof(int32_t) : 0;
    len[10] = plan->tree_bits ? (size_t)T * sizeof(uint64_t) : 0;
    /* Sections closer than KVA_CUDA_UPLOAD_GAP bytes, or all of them when
     * they lie within KVA_CUDA_UPLOAD_SPAN bytes, go in one copy (the gaps'
     * stale bytes with them): a cudaMemcpyAsync costs a few microseconds of
     * host time, more than copying a few KB over PCIe. */
    size_t first = 0, last = 0;
    for (int k = KVA_CUDA_SECTIONS - 1; k >= 0; k--) {
        const int i = kva_cuda_section_order[k];
        if (len[i] > 0)
            first = off[i], last = last ? last : off[i] + len[i];
    }
    const size_t gap =
        last - first <= KVA_CUDA_UPLOAD_SPAN ? KVA_CUDA_UPLOAD_SPAN : KVA_CUDA_UPLOAD_GAP;
    size_t lo = 0, hi = 0;
    int open = 0;
    for (int k = 0; k < KVA_CUDA_SECTIONS; k++) {
        const int i = kva_cuda_section_order[k];
        if (len[i] == 0)
            continue;
        if (open && off[i] - hi > gap) {
            KVA_TRY(upload(st, h, lo, hi - lo));
            open = 0;
        }
        if (!open)
            lo = off[i], open = 1;
        hi = off[i] + len[i];
    }
    if (open)
        KVA_TRY(upload(st, h, lo, hi - lo));
    return staging_release(st);
}

/* Resident CTAs per SM of the decode-family kernel (KVA__CUDA_K_DECODE_*) for
 * the shape (0: the kernel cannot be resident), from the context's cache: the
 * occupancy query (with the shared-memory attribute it sets first) is a
 * runtime call that kva_plan_create would otherwise repeat every step, and its
 * answer is fixed per kernel and device. Failures are not cached. */
static int ctas_per_sm_cached(kva__cuda_state *st, kva_dtype dt, int32_t dmax, int rows, int kernel)
{
    for (int i = 0; i < st->num_occ; i++) {
        const kva__cuda_occ *o = &st->occ[i];
        if (o->dtype == dt && o->dmax == dmax && o->rows == rows && o->kernel == kernel)
            return o->per_sm;
    }
    const int n =
        kernel == KVA__CUDA_K_DECODE_MMA         ? kva__cuda_decode_mma_ctas_per_sm(dt, dmax)
        : kernel == KVA__CUDA_K_MLA_DECODE_MMA   ? kva__cuda_mla_decode_ctas_per_sm(dt, rows)
        : kernel == KVA__CUDA_K_MLA_DECODE_WGMMA ? kva__cuda_mla_wgmma_ctas_per_sm(dt)
                                                 : kva__cuda_simt_ctas_per_sm(dt, dmax, rows);
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
                         kva__cuda_prefill_kernel *prefill, int *tiles)
{
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
    *prefill = fp == KVA__CUDA_K_PREFILL_WGMMA_TMA ? KVA__CUDA_PREFILL_WGMMA_TMA
               : fp == KVA__CUDA_K_PREFILL_WGMMA   ? KVA__CUDA_PREFILL_WGMMA
               : fp == KVA__CUDA_K_PREFILL_MMA     ? KVA__CUDA_PREFILL_MMA
                                                   : KVA__CUDA_PREFILL_AUTO;
    *tiles = fp != KVA__CUDA_K_PREFILL_ITEMS && plan->block_table != NULL &&
             kva__cuda_prefill_supported(plan->d.head_dim, plan->d.head_dim_v, plan->d.q_dtype);
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
    KVA_TRY(reserve_meta(st, &need, 1));
    KVA_TRY(kva__cuda_workspace_reserve(ctx, ws));
    KVA_TRY(upload_plan(st, plan, part, NULL));
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
    KVA_TRY(check_not_capturing("kva_plan_create", st));
    const int32_t G = plan->d.num_heads / plan->d.num_kv_heads;
    const int32_t dmax =
        plan->d.head_dim > plan->d.head_dim_v ? plan->d.head_dim : plan->d.head_dim_v;
    int kernel = 0, mma = 0;
    kva__cuda_prefill_kernel pkernel = KVA__CUDA_PREFILL_AUTO;
    plan_kernels(ctx, plan, &kernel, &pkernel, &mma);
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
    /* Requests for the prefill tile kernels (mma_req[r] = 1), when the shape has them. */
    uint8_t *mma_req = NULL;
    int32_t num_prefills = 0;
    int64_t ptiles = 0;
    if (mma) {
        mma_req = (uint8_t *)calloc((size_t)(R > 0 ? R : 1), 1);
        if (!mma_req)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
        for (int32_t r = 0; r < R; r++) {
            const int64_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
            mma_req[r] =
                q_len > plan->d.decode_threshold && q_len * G >= KVA_CUDA_MMA_MIN_ROWS ? 1 : 0;
            num_prefills += mma_req[r];
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
    kva__cuda_caps need;
    need.items = part->num_items;
    need.tasks = part->num_tasks;
    need.reqs = R;
    need.bt = plan->block_table ? (int64_t)R * plan->d.block_table_stride : 0;
    need.heads = plan->d.num_heads;
    need.ptiles = ptiles;
    need.tree = plan->tree_bits && R > 0 ? plan->query_start_loc[R] : 0;
    size_t ws = (size_t)part->partial_floats * sizeof(float);
    s = reserve_meta(st, &need, 1);
    if (s == KVA_STATUS_OK)
        s = kva__cuda_workspace_reserve(ctx, ws);
    if (s == KVA_STATUS_OK)
        s = upload_plan(st, plan, part, ptiles > 0 ? mma_req : NULL);
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
    kva_status s;
    if (plan->d.kind == KVA_ATTN_INDEX) { /* indexer.cu: no attention partition */
        s = kva__cuda_indexer_plan_build(ctx, plan);
    } else if (plan->d.sparse_topk > 0) {
        s = use_device(state_of(ctx)->device);
        if (s == KVA_STATUS_OK)
            s = check_not_capturing("kva_plan_create", state_of(ctx));
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
