/*
 * cuda_meta.cu - the CUDA backend's device metadata (C-style CUDA): the
 * buffer's section layout, its growth (kva__cuda_reserve_meta) and the split
 * workspace's, kva_cuda_context_reserve, the pinned staging ring and the
 * upload of a plan's metadata (kva__cuda_upload_plan). The plan builds that
 * call them are in cuda_plan.cu; the layout of a section's entries is in
 * cuda_backend.h.
 */
extern "C" {
#include "cuda_backend.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "cuda_ctx.h"

#include <stdlib.h>
#include <string.h>

static size_t align256(size_t x)
{
    return (x + 255u) & ~(size_t)255u;
}

/* Sections of the metadata buffer (kva_cuda_section_order). */
#define KVA_CUDA_SECTIONS 11
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
/* Smallest half of the large staging ring (ring 1): uploads staged there are
 * larger than the hot ring's half, so a half holds several and the event
 * record and wait that come with each change of half are rare. */
#define KVA_CUDA_STAGING_HALF_MIN ((size_t)512 << 10)

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

/* Byte offsets of the sections for caps c; returns the total size. */
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

/* Where ring k's staging starts and the bytes of each of its halves: the hot
 * ring in meta_host, the large one in stage_big (NULL, half 0, until an
 * upload first needs it). */
static void ring_span(const kva__cuda_state *st, int k, char **base, size_t *half)
{
    *base = (char *)(k == 0 ? st->meta_host : st->stage_big);
    *half = k == 0 ? st->staging_hot : st->stage_big_half;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Refuses to grow while the stream is being captured: a graph would keep the
 * old addresses. */
kva_status kva__cuda_check_not_capturing(const char *fn, kva__cuda_state *st)
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
kva_status kva__cuda_reserve_meta(kva__cuda_state *st, const kva__cuda_caps *need, int slack)
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
    KVA_TRY(kva__cuda_check_not_capturing("kva_plan_create", st));
    void *dev = NULL, *host = NULL;
    cudaError_t e = cudaMalloc(&dev, bytes);
    /* The hot ring only (never empty: a non-NULL meta_host tells the staging
     * hook that the context has its staging); the large ring is sized by the
     * uploads, not the buffer (staging_acquire), and outlives this growth. */
    if (e == cudaSuccess)
        e = cudaMallocHost(&host, st->staging_hot > 0 ? 2 * st->staging_hot : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(dev);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: cannot allocate %zu bytes of device metadata: %s", bytes,
                         cudaGetErrorString(e));
    }
    /* Kernels queued earlier may still read the old buffers (and copies on
     * a stream the context left for a capture, the old staging). */
    if (st->drain_deferred)
        KVA_TRY(kva__cuda_upload_drain(st));
    KVA_CUDA_TRY(cudaStreamSynchronize(STREAM(st)));
    cudaFree(st->meta_dev);
    cudaFreeHost(st->meta_host);
    for (int k = 0; k < KVA__CUDA_RINGS; k++) { /* the stream ran every upload */
        st->ring[k].pending[0] = st->ring[k].pending[1] = 0;
        st->ring[k].pos = 0;
        st->ring[k].half = 0;
    }
    st->ring_slots = 2;
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
    st->meta.items_cap = (int32_t)(c.items < INT32_MAX ? c.items : INT32_MAX);
    /* The header is read by every kernel (the prefill kernel's tile count
     * too) before the first upload could fill it. */
    KVA_CUDA_TRY(cudaMemsetAsync(dev, 0, KVA_CUDA_HDR_WORDS * sizeof(int32_t), STREAM(st)));
    return KVA_STATUS_OK;
}

/* Grows the device workspace (split partials) to bytes; headroom: with a
 * quarter more, and at least half again the old size (plan builds: a
 * workspace that grows step by step is reallocated a few times only), or
 * exactly bytes (kva_cuda_context_reserve, whose bytes are already the upper
 * bound of every plan within its capacity). */
static kva_status workspace_grow(kva_context *ctx, size_t bytes, int headroom)
{
    kva__cuda_state *st = state_of(ctx);
    if (bytes <= ctx->workspace_bytes)
        return KVA_STATUS_OK;
    KVA_TRY(kva__cuda_check_not_capturing("kva_plan_create", st));
    size_t rounded = align256(headroom ? bytes + bytes / 4 : bytes);
    if (headroom && rounded < ctx->workspace_bytes + ctx->workspace_bytes / 2)
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

/* The memory table's workspace_reserve (plan builds): with headroom. */
extern "C" kva_status kva__cuda_workspace_reserve(kva_context *ctx, size_t bytes)
{
    return workspace_grow(ctx, bytes, 1);
}

/* Upper bounds of the sections for a batch within cap (kva_cuda_context_reserve). */
static void caps_for(const kva__cuda_state *st, const kva_cuda_capacity *cap, kva__cuda_caps *c,
                     size_t *ws_bytes)
{
    const int64_t G = cap->num_heads / (cap->num_kv_heads > 0 ? cap->num_kv_heads : 1);
    const int rows = kva__cuda_rows_for_group((int32_t)G);
    const int64_t slices = (G + rows - 1) / rows;
    /*
     * Split pieces. A plan's partition runs on a grid of slots = per_sm x SMs
     * CTAs, and the chunks of all its split tasks number P < 12 x slots
     * (argument below). So a plan has at most units + P items (a unit cut
     * into n chunks adds n - 1) and at most P / 2 split tasks (2 chunks or
     * more each), per_sm at most the largest of the kernels a plan within
     * cap may run (kva__cuda_reserve_slot_rows).
     */
    int per_sm = 1;
    const int64_t slot_rows = kva__cuda_reserve_slot_rows(cap, &per_sm);
    const int64_t sms = st->num_sms > 0 ? st->num_sms : 1;
    const int64_t pieces = 12 * sms * per_sm;
    /* Units: every request contributes at most q_len/nq + 1 tiles per slice
     * and kv head. */
    int64_t units = cap->num_kv_heads * slices * ((int64_t)cap->max_tokens + cap->max_requests);
    c->items = units + pieces;
    c->tasks = pieces / 2;
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
    /*
     * Split partials. A split task of nq x nh rows cut into n chunks takes
     * n x nq x nh x (Dv + 1) floats (partition.c), so the workspace of a plan
     * is at most P x its rows per task x (Dv + 1) floats, P the chunks of all
     * its split tasks. P < 12 x slots: the grid build (partition_grid.c)
     * splits, if at all, under a target t = max(1, floor(total / (slots x
     * k))) for some k in 1..4 (total: the cost of every unit, kv heads
     * included), and asks a unit of cost c > t for n < c / t + 1 <= 2c / t
     * chunks (rounded up; n <= c / t rounded down); the chunks cut are at
     * most the count asked (chunk keys rounded up to 64). So P < 2 total / t.
     * A unit is split only when its cap (keys / 256) is at least 2, and n <=
     * cap <= keys / 256 < c / 256 (c = nh x visible + keys + 32), so also P <
     * total / 256. With x = total / (slots x k): for x < 2, P < total / 256 <
     * slots x k / 128; for x >= 2, t = floor(x) >= 2 and x < t + 1, so P <
     * 2 slots x k (t + 1) / t <= 3 slots x k. Either way P < 3 x slots x k
     * <= 12 x slots. The rows per task are at most the plan's kernel's rows
     * and G x max_tokens, and slot_rows is the largest per_sm x those rows
     * over the kernels a plan within cap may run (cuda_plan.cu). A forced
     * chunk count (kva__cuda_context_force_splits: benchmarks and tests) is
     * outside this bound: such a plan grows the workspace as any plan beyond
     * the capacity does.
     */
    *ws_bytes = (size_t)12 * (size_t)sms * (size_t)slot_rows * ((size_t)cap->head_dim_v + 1) * 4u;
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
    KVA_TRY(kva__cuda_check_not_capturing(__func__, st));
    KVA_TRY(kva__cuda_reserve_meta(st, &c, 0));
    return workspace_grow(ctx, ws, 0);
}

/*
 * The staging rings. An upload fills its bytes of the pinned staging on the
 * host and copies them to the device buffer on the stream, so they stay in
 * use until the stream has run the copy. That copy is queued behind whatever
 * the host enqueued before it (a serving engine's runs or graph replays of
 * the previous steps), so the host is normally filling upload N + 1 while
 * the stream has not yet run upload N's copy: a single staging buffer would
 * have the fill overwrite bytes that copy has still to read, unless the host
 * first waited for it, i.e. for the stream to catch up with the previous
 * step (one host synchronization per upload, the host's run-ahead gone).
 * Hence two halves per ring: the host waits only for the copies of the other
 * half, staged a whole half of uploads ago. Uploads are staged one after
 * another in one half of a ring; only when the next one does not fit in what
 * is left of the half does the upload record an event for that half (after
 * all of its copies) and move to the other half, waiting on the host for
 * that half's event, recorded when the ring last left it (a whole half of
 * uploads ago, which the stream has normally run long ago). So the event
 * record and host wait, runtime calls as the copy is, come once per half of
 * uploads instead of once per upload. An upload of up to st->staging_hot
 * bytes (KVA__CUDA_STAGING_HOT: a decode step's) goes to the hot ring, whose
 * two halves of that size are small enough to stay in the host's caches from
 * step to step; a ring of halves of megabytes (a large upload's) would have
 * the fill write lines that left the caches since the ring last passed them.
 * Larger uploads go to ring 1.
 */
/*
 * Ring 1 is sized by the uploads, not by the metadata buffer: an upload
 * stages only the byte ranges it copies (kva__cuda_upload_plan), so a plan
 * whose block table fills a small part of a large reservation (a graph-mode
 * wrapper's, sized for its indices buffer) stages that part. Its halves
 * start at KVA_CUDA_STAGING_HALF_MIN when the first upload too large for the
 * hot ring comes, and at least double, up to the buffer, whenever an upload
 * does not fit in one: a growth waits for ring 1's copies still queued (the
 * old halves are freed), a host wait that comes once per doubling, as the
 * metadata buffer's own growth does, never in the steady state. The wait is
 * on ring 1's events because the CUDA reference documents no wait of
 * cudaFreeHost for copies still to read the buffer; on the drivers measured
 * (H200, 580.159.04, CUDA 13: dev/ws52/freehost_probe.cu) cudaFreeHost
 * synchronizes the whole device by itself, queued work of every stream, so
 * there the events' wait is already done when it returns and a growth costs
 * a device synchronize (test_update_grow_pad cannot catch a missing wait on
 * such a driver).
 */
static kva_status grow_big_ring(kva__cuda_state *st, size_t need)
{
    kva__cuda_ring *r = &st->ring[1];
    size_t half = st->stage_big_half < st->meta_bytes / 2 ? 2 * st->stage_big_half : st->meta_bytes;
    if (half < KVA_CUDA_STAGING_HALF_MIN)
        half = KVA_CUDA_STAGING_HALF_MIN;
    if (half < need)
        half = need;
    half = align256(half);
    void *host = NULL;
    cudaError_t e = cudaMallocHost(&host, 2 * half);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: cannot allocate %zu bytes of pinned staging: %s",
                         2 * half, cudaGetErrorString(e));
    }
    if (st->stage_big) {
        const int h = r->half;
        if ((size_t)r->pos != (size_t)h * st->stage_big_half) { /* the current half has uploads */
            e = cudaEventRecord((cudaEvent_t)r->events[h], STREAM(st));
            if (e == cudaSuccess)
                r->pending[h] = 1;
        }
        for (int i = 0; i < 2 && e == cudaSuccess; i++)
            if (r->pending[i]) {
                e = cudaEventSynchronize((cudaEvent_t)r->events[i]);
                r->pending[i] = 0;
            }
        if (e != cudaSuccess) { /* the old halves may still be read: keep them */
            cudaFreeHost(host);
            return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_plan_create: %s", cudaGetErrorString(e));
        }
        cudaFreeHost(st->stage_big);
    }
    st->stage_big = host;
    st->stage_big_half = half;
    r->pending[0] = r->pending[1] = 0;
    r->pos = 0;
    r->half = 0;
    return KVA_STATUS_OK;
}

static kva_status staging_acquire(kva__cuda_state *st, size_t need, char **slot)
{
    if (st->drain_deferred)
        KVA_TRY(kva__cuda_upload_drain(st));
    const int k = need <= st->staging_hot ? 0 : 1;
    if (k == 1 && need > st->stage_big_half)
        KVA_TRY(grow_big_ring(st, need));
    kva__cuda_ring *r = &st->ring[k];
    char *base = NULL;
    size_t half = 0;
    ring_span(st, k, &base, &half);
    size_t pos = (size_t)r->pos;
    int h = r->half;
    if (pos + need > (size_t)(h + 1) * half) { /* the rest of this half is too short */
        cudaError_t e = cudaEventRecord((cudaEvent_t)r->events[h], STREAM(st));
        if (e != cudaSuccess)
            return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_plan_create: %s", cudaGetErrorString(e));
        r->pending[h] = 1;
        h = 1 - h;
        pos = (size_t)h * half;
        if (r->pending[h]) {
            e = cudaEventSynchronize((cudaEvent_t)r->events[h]);
            if (e != cudaSuccess)
                return kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_plan_create: %s",
                                 cudaGetErrorString(e));
            r->pending[h] = 0;
        }
    }
    *slot = base + pos;
    r->half = h;
    r->pos = pos + align256(need); /* at most the half's end: the next upload moves on */
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_upload_drain(kva__cuda_state *st)
{
    if (st->drain_deferred) {
        /* The stream the rings' uploads went to may be any stream the context
         * ran on before the capture: wait for all of them. */
        KVA_CUDA_TRY(cudaDeviceSynchronize());
        st->drain_deferred = 0;
        for (int k = 0; k < KVA__CUDA_RINGS; k++) {
            kva__cuda_ring *r = &st->ring[k];
            r->pending[0] = r->pending[1] = 0;
            r->pos = 0;
            r->half = 0;
        }
        return KVA_STATUS_OK;
    }
    for (int k = 0; k < KVA__CUDA_RINGS; k++) {
        kva__cuda_ring *r = &st->ring[k];
        char *base = NULL;
        size_t half = 0;
        ring_span(st, k, &base, &half);
        if (base) {
            const int h = r->half;
            if ((size_t)r->pos != (size_t)h * half) { /* the current half has uploads */
                KVA_CUDA_TRY(cudaEventRecord((cudaEvent_t)r->events[h], STREAM(st)));
                r->pending[h] = 1;
            }
        }
        for (int h = 0; h < 2; h++)
            if (r->pending[h]) {
                KVA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)r->events[h]));
                r->pending[h] = 0;
            }
        r->pos = 0; /* the stream ran every upload */
        r->half = 0;
    }
    return KVA_STATUS_OK;
}

/* The byte ranges of the metadata buffer one upload stages: at most one per
 * section, packed one after another in its staging slot. */
typedef struct staged_ranges {
    int n;
    size_t lo[KVA_CUDA_SECTIONS], hi[KVA_CUDA_SECTIONS]; /* buffer offsets */
    size_t at[KVA_CUDA_SECTIONS];                        /* their offsets in the slot */
    char *slot;
} staged_ranges;

/* Where buffer offset x is staged: inside the range that holds it, else NULL. */
static char *staged_at(const staged_ranges *sr, size_t x)
{
    for (int r = 0; r < sr->n; r++)
        if (x >= sr->lo[r] && x < sr->hi[r])
            return sr->slot + sr->at[r] + (x - sr->lo[r]);
    return NULL;
}

/* Copies bytes of the buffer at off from their staging to the device buffer
 * on the stream. The copy's range lies in one staged range (see
 * kva__cuda_upload_plan); a bug that broke that would copy other staging. */
static kva_status upload(kva__cuda_state *st, const staged_ranges *sr, size_t off, size_t bytes)
{
    if (bytes == 0)
        return KVA_STATUS_OK;
    const char *src = staged_at(sr, off);
    if (!src || staged_at(sr, off + bytes - 1) != src + bytes - 1)
        return kva__fail(KVA_STATUS_INTERNAL,
                         "kva_plan_create: upload of buffer bytes %zu..%zu is not staged", off,
                         off + bytes);
    KVA_CUDA_TRY(cudaMemcpyAsync((char *)st->meta_dev + off, src, bytes, cudaMemcpyHostToDevice,
                                 STREAM(st)));
    return KVA_STATUS_OK;
}

/* Fills the plan's metadata into the staging ring and enqueues the copies. */
kva_status kva__cuda_upload_plan(kva__cuda_state *st, const kva_plan *plan,
                                 const kva__partition *part, const uint8_t *mma_req)
{
    size_t off[KVA_CUDA_SECTIONS];
    layout_sections(&st->caps, off);
    const int32_t R = plan->d.num_requests;
    const int64_t bt = plan->block_table ? (int64_t)R * plan->d.block_table_stride : 0;
    const int dcp_global = ((const kva__cuda_plan *)plan->device)->dcp_global;
    const int32_t T = R > 0 ? plan->query_start_loc[R] : 0;
    /* The used part of every section; the prefill tiles' count is known once
     * they are built, so their whole capacity is staged for. */
    size_t len[KVA_CUDA_SECTIONS];
    len[0] = KVA_CUDA_HDR_WORDS * sizeof(int32_t);
    len[1] = (size_t)part->num_items * sizeof(kva__cuda_item);
    len[2] = (size_t)part->num_tasks * sizeof(kva__cuda_task);
    len[3] = ((size_t)R + 1) * sizeof(int32_t);
    len[4] = (size_t)R * sizeof(int32_t);
    len[5] = ((size_t)R + 1) * sizeof(int64_t);
    len[6] = (size_t)bt * sizeof(int32_t);
    len[7] = plan->alibi_slopes ? (size_t)plan->d.num_heads * sizeof(float) : 0;
    len[8] = mma_req ? (size_t)st->caps.ptiles * KVA__CUDA_PREFILL_TILE_INTS * sizeof(int32_t) : 0;
    len[9] = dcp_global ? (size_t)R * sizeof(int32_t) : 0;
    len[10] = plan->tree_bits ? (size_t)T * sizeof(uint64_t) : 0;
    /* The copy's minimum span (KVA__CUDA_UPLOAD_MIN), within the buffer. */
    const size_t pad = st->upload_min < st->meta_bytes ? st->upload_min : st->meta_bytes;
    /* What is staged: the used sections, those closer than the widest gap a
     * copy spans (KVA_CUDA_UPLOAD_SPAN) in one range with the gap between
     * them, the first range from the buffer's start (the header, always
     * uploaded) at least pad bytes long; the ranges packed one after another
     * in the staging slot. Every copy below (gaps of at most that span, the
     * padded first copy, the prefill tiles trimmed to their count) lies in
     * one staged range, so a large unused capacity (a reserved block table's)
     * costs no staging. */
    staged_ranges sr;
    sr.n = 0;
    sr.slot = NULL;
    size_t need = 0;
    for (int k = 0; k < KVA_CUDA_SECTIONS; k++) {
        const int i = kva_cuda_section_order[k];
        if (len[i] == 0)
            continue;
        if (sr.n > 0 && off[i] <= sr.hi[sr.n - 1] + KVA_CUDA_UPLOAD_SPAN) {
            if (off[i] + len[i] > sr.hi[sr.n - 1])
                sr.hi[sr.n - 1] = off[i] + len[i];
            continue;
        }
        sr.lo[sr.n] = off[i];
        sr.hi[sr.n] = off[i] + len[i];
        if (sr.n == 0 && sr.hi[0] < pad)
            sr.hi[0] = pad;
        sr.n++;
    }
    for (int r = 0; r < sr.n; r++) {
        sr.at[r] = need;
        need += align256(sr.hi[r] - sr.lo[r]);
    }
    KVA_TRY(staging_acquire(st, need, &sr.slot));
    kva__cuda_probe(st, KVA__CUDA_PROBE_SLOT);
    char *at[KVA_CUDA_SECTIONS]; /* each used section's staging (NULL: unused) */
    for (int i = 0; i < KVA_CUDA_SECTIONS; i++)
        at[i] = len[i] > 0 ? staged_at(&sr, off[i]) : NULL;

    int32_t *hdr = (int32_t *)at[0];
    memset(hdr, 0, KVA_CUDA_HDR_WORDS * sizeof(int32_t));
    hdr[KVA_CUDA_HDR_ITEMS] = part->num_items;
    hdr[KVA_CUDA_HDR_TASKS] = part->num_tasks;
    hdr[KVA_CUDA_HDR_REQS] = R;
    hdr[KVA_CUDA_HDR_BT_STRIDE] = plan->d.block_table_stride;
    kva__cuda_item *it = (kva__cuda_item *)at[1];
    for (int32_t i = 0; i < part->num_items; i++) {
        const kva__work_item *w = &part->items[i];
        kva__cuda_item x = {w->req, w->kv_head, w->h0, w->nh,   w->i0,
                            w->nq,  w->k0,      w->k1, w->task, w->split};
        it[i] = x;
    }
    kva__cuda_task *tk = (kva__cuda_task *)at[2];
    for (int32_t i = 0; i < part->num_tasks; i++) {
        const kva__split_task *t = &part->tasks[i];
        kva__cuda_task x = {t->req, t->kv_head, t->h0, t->nh,    t->i0, t->nq,    t->num_splits,
                            0,      t->k0,      t->k1, t->chunk, 0,     t->ws_off};
        tk[i] = x;
    }
    memcpy(at[3], plan->query_start_loc, ((size_t)R + 1) * sizeof(int32_t));
    if (R > 0)
        memcpy(at[4], plan->kv_lens, (size_t)R * sizeof(int32_t)); /* see dcp_accept */
    memcpy(at[5], plan->kv_start, ((size_t)R + 1) * sizeof(int64_t));
    if (bt > 0)
        memcpy(at[6], plan->block_table, (size_t)bt * sizeof(int32_t));
    if (plan->alibi_slopes)
        memcpy(at[7], plan->alibi_slopes, (size_t)plan->d.num_heads * sizeof(float));
    int32_t ntiles = 0;
    if (mma_req)
        KVA_TRY(kva__cuda_prefill_tiles_build_sections(
            R, plan->query_start_loc, plan->kv_lens, mma_req, plan->d.num_heads,
            plan->d.num_kv_heads, plan->d.causal, plan->d.window_left, plan->d.attention_chunk,
            KVA_CUDA_L2_SECTION_BYTES / ((int64_t)(plan->d.head_dim + plan->d.head_dim_v) *
                                         (int64_t)kva_dtype_size(plan->d.q_dtype)),
            (int32_t *)at[8], (int32_t)st->caps.ptiles, &ntiles));
    hdr[KVA_CUDA_HDR_PTILES] = ntiles;
    len[8] = (size_t)ntiles * KVA__CUDA_PREFILL_TILE_INTS * sizeof(int32_t);
    if (dcp_global) { /* masks on global positions (dcp_pos.cuh) */
        hdr[KVA_CUDA_HDR_DCP_N] = plan->d.dcp_size;
        hdr[KVA_CUDA_HDR_DCP_RANK] = plan->d.dcp_rank;
        hdr[KVA_CUDA_HDR_DCP_I] = plan->d.dcp_interleave;
        memcpy(at[9], plan->seq_lens, (size_t)R * sizeof(int32_t));
    }
    if (plan->tree_bits) { /* draft-tree words (tree_mask.cuh) */
        hdr[KVA_CUDA_HDR_TREE] = 1;
        memcpy(at[10], plan->tree_bits, (size_t)T * sizeof(uint64_t));
    }

    /* Sections closer than KVA_CUDA_UPLOAD_GAP bytes, or all of them when
     * they lie within KVA_CUDA_UPLOAD_SPAN bytes, go in one copy (the gaps'
     * stale bytes with them): a cudaMemcpyAsync costs a few microseconds of
     * host time, more than copying a few KB over PCIe. */
    kva__cuda_probe(st, KVA__CUDA_PROBE_FILL);
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
            KVA_TRY(upload(st, &sr, lo, hi - lo));
            open = 0;
        }
        if (!open)
            lo = off[i], open = 1;
        hi = off[i] + len[i];
    }
    if (open && lo == 0 && hi < pad)
        hi = pad; /* one copy from the buffer's start: padded (a multi-copy upload is not) */
    if (open)
        KVA_TRY(upload(st, &sr, lo, hi - lo));
    kva__cuda_probe(st, KVA__CUDA_PROBE_COPY);
    return KVA_STATUS_OK;
}
