/*
 * partition.c - cuts a plan's attention into work items (see partition.h).
 *
 * Runs once per step at plan time, O(T + items) on the host:
 *   1. Tiles: every request with queries is cut into query tiles (one tile
 *      for a decode, tiles of about params.prefill_rows attention rows for a
 *      prefill), and every tile is crossed with the kv heads and the slices of
 *      the GQA group (a group larger than max_rows is sliced).
 *   2. Cost: a unit's cost is its row-keys (heads x sum over rows of the keys
 *      the row sees), plus the keys it loads, plus a fixed overhead.
 *   3. Splits: with more than one thread, a unit costing more than
 *      total / (threads * items_per_thread) is split along its keys into
 *      chunks of similar size (aligned, at least min_split_keys each), so
 *      that a single long request cannot leave cores idle.
 *   4. Items are sorted by cost, largest first, for a dynamic schedule.
 */
#include "partition.h"

#include <stdlib.h>
#include <string.h>

/* Fixed cost of an item (loading the query tile, finalizing, scheduling), in row-keys. */
#define ITEM_OVERHEAD 32

/* Growable arrays of items and tasks. */
typedef struct builder {
    kva__work_item *items;
    int32_t num_items, cap_items;
    kva__split_task *tasks;
    int32_t num_tasks, cap_tasks;
} builder;

static int push_item(builder *b, const kva__work_item *it)
{
    if (b->num_items == b->cap_items) {
        int32_t cap = b->cap_items ? b->cap_items * 2 : 64;
        kva__work_item *p = realloc(b->items, (size_t)cap * sizeof *p);
        if (!p)
            return 0;
        b->items = p;
        b->cap_items = cap;
    }
    b->items[b->num_items++] = *it;
    return 1;
}

static int push_task(builder *b, const kva__split_task *t)
{
    if (b->num_tasks == b->cap_tasks) {
        int32_t cap = b->cap_tasks ? b->cap_tasks * 2 : 16;
        kva__split_task *p = realloc(b->tasks, (size_t)cap * sizeof *p);
        if (!p)
            return 0;
        b->tasks = p;
        b->cap_tasks = cap;
    }
    b->tasks[b->num_tasks++] = *t;
    return 1;
}

/* Query tile size (query rows) of request r for heads slices of nh heads. */
static int32_t tile_rows(const kva_plan *plan, const kva__partition_params *pp, int32_t q_len,
                         int32_t nh)
{
    int32_t rows = q_len <= plan->d.decode_threshold ? pp->max_rows : pp->prefill_rows;
    int32_t nq = rows / nh;
    return nq < 1 ? 1 : nq;
}

/* Sum over query rows i0..i0+nq-1 of the keys each row sees inside [a, b). */
static int64_t visible_keys(const kva_plan *plan, int32_t s, int32_t q_len, int32_t i0, int32_t nq,
                            int32_t a, int32_t b)
{
    int64_t sum = 0;
    for (int32_t i = i0; i < i0 + nq; i++) {
        int32_t lo, hi;
        kva__row_keys(&plan->d, s, q_len, i, &lo, &hi);
        if (lo < a)
            lo = a;
        if (hi > b)
            hi = b;
        if (hi > lo)
            sum += hi - lo;
    }
    return sum;
}

/* One (request, query tile, kv head, head slice) before splitting; keys [k0, k1)
 * is the union of its rows' visible ranges (contiguous: lo and hi grow with i). */
typedef struct unit {
    int32_t req, kv_head, h0, nh, i0, nq, k0, k1;
    int64_t cost;
} unit;

static int32_t ceil_div(int32_t a, int32_t b)
{
    return (a + b - 1) / b;
}

/* The items' order: largest cost first, ties by request, kv head, head
 * slice, query rows, keys (a total order: no two items compare equal). */
static inline int item_before(const kva__work_item *a, const kva__work_item *b)
{
    if (a->cost != b->cost)
        return a->cost > b->cost;
    if (a->req != b->req)
        return a->req < b->req;
    if (a->kv_head != b->kv_head)
        return a->kv_head < b->kv_head;
    if (a->h0 != b->h0)
        return a->h0 < b->h0;
    if (a->i0 != b->i0)
        return a->i0 < b->i0;
    return a->k0 < b->k0;
}

/*
 * Sorts items[0..n) by item_before with the comparison inlined: the GPU
 * plan builds several candidate partitions of up to a few thousand items per
 * step, and qsort's indirect comparisons and byte-wise moves were most of
 * kva_plan_create's time there. Indices are sorted (insertion-sorted runs of
 * 8, then bottom-up merges) and the items moved once; an array already in
 * order is recognized in one pass. The order is total, so the result equals
 * qsort's with the same comparison. Returns 0 when out of memory (items
 * unchanged; the caller falls back to qsort).
 */
static int sort_items(kva__work_item *items, int32_t n)
{
    if (n < 2)
        return 1;
    int32_t sorted = 1;
    while (sorted < n && !item_before(&items[sorted], &items[sorted - 1]))
        sorted++;
    if (sorted == n)
        return 1;
    /* Indices are sorted (4-byte moves), then the items permuted once. */
    int32_t *idx = malloc((size_t)n * 2 * sizeof *idx);
    kva__work_item *out = malloc((size_t)n * sizeof *out);
    if (!idx || !out) {
        free(idx);
        free(out);
        return 0;
    }
    int32_t *src = idx, *dst = idx + n;
    enum { RUN = 8 }; /* insertion-sorted runs before the merges */
    for (int32_t lo = 0; lo < n; lo += RUN) {
        const int32_t hi = lo + RUN < n ? lo + RUN : n;
        for (int32_t i = lo; i < hi; i++) {
            int32_t j = i;
            while (j > lo && item_before(&items[i], &items[src[j - 1]])) {
                src[j] = src[j - 1];
                j--;
            }
            src[j] = i;
        }
    }
    for (int32_t w = RUN; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            const int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = item_before(&items[src[j]], &items[src[i]]) ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        int32_t *t = src;
        src = dst;
        dst = t;
    }
    for (int32_t k = 0; k < n; k++)
        out[k] = items[src[k]];
    memcpy(items, out, (size_t)n * sizeof *items);
    free(idx);
    free(out);
    return 1;
}

static int by_cost_desc(const void *pa, const void *pb)
{
    const kva__work_item *a = pa, *b = pb;
    return item_before(a, b) ? -1 : item_before(b, a);
}

/*
 * Emits the items of one unit: one item when it is cheap enough, otherwise
 * a split task with one item per key chunk. target is the cost one item
 * should not exceed much (0 disables splitting). Returns 0 when out of memory.
 */
static int emit_unit(builder *b, const kva_plan *plan, const kva__partition_params *pp,
                     const unit *u, int64_t target, int64_t *partial_floats)
{
    kva__work_item it;
    memset(&it, 0, sizeof it);
    it.req = u->req;
    it.kv_head = u->kv_head;
    it.h0 = u->h0;
    it.nh = u->nh;
    it.i0 = u->i0;
    it.nq = u->nq;
    it.k0 = u->k0;
    it.k1 = u->k1;
    it.task = -1;
    it.cost = u->cost;

    int32_t keys = u->k1 - u->k0;
    int64_t ns = 1;
    if (target > 0 && u->cost > target) {
        ns = (u->cost + target - 1) / target;
        int64_t by_len = keys / pp->min_split_keys;
        if (ns > by_len)
            ns = by_len;
        if (ns > pp->max_splits)
            ns = pp->max_splits;
    }
    if (ns < 2)
        return push_item(b, &it);

    int32_t chunk = ceil_div(keys, (int32_t)ns);
    chunk = ceil_div(chunk, pp->split_align) * pp->split_align;
    int32_t nsplit = ceil_div(keys, chunk);
    if (nsplit < 2)
        return push_item(b, &it);

    kva__split_task t;
    t.req = u->req;
    t.kv_head = u->kv_head;
    t.h0 = u->h0;
    t.nh = u->nh;
    t.i0 = u->i0;
    t.nq = u->nq;
    t.num_splits = nsplit;
    t.ws_off = *partial_floats;
    int64_t rows = (int64_t)u->nq * u->nh;
    *partial_floats += (int64_t)nsplit * rows * (plan->d.head_dim_v + 1);
    int32_t task = b->num_tasks;
    if (!push_task(b, &t))
        return 0;

    const int32_t s = plan->seq_lens[u->req];
    const int32_t q_len = plan->query_start_loc[u->req + 1] - plan->query_start_loc[u->req];
    for (int32_t c = 0; c < nsplit; c++) {
        int32_t a = u->k0 + c * chunk;
        int32_t e = a + chunk < u->k1 ? a + chunk : u->k1;
        it.k0 = a;
        it.k1 = e;
        it.task = task;
        it.split = c;
        it.cost = (int64_t)u->nh * visible_keys(plan, s, q_len, u->i0, u->nq, a, e) + (e - a) +
                  ITEM_OVERHEAD;
        if (!push_item(b, &it))
            return 0;
    }
    return 1;
}

/*
 * Walks all units. With emit == 0 it only adds their costs to *total; with
 * emit != 0 it emits them against the given target.
 */
static int walk_units(builder *b, const kva_plan *plan, const kva__partition_params *pp,
                      const uint8_t *skip_req, int emit, int64_t target, int64_t *total,
                      int64_t *partial_floats)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t G = d->num_heads / d->num_kv_heads;
    const int32_t nslices = ceil_div(G, pp->max_rows);
    const int32_t nh_base = ceil_div(G, nslices);
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        const int32_t s = plan->seq_lens[r];
        if (q_len <= 0 || (skip_req && skip_req[r]))
            continue;
        for (int32_t h0 = 0; h0 < G; h0 += nh_base) {
            const int32_t nh = G - h0 < nh_base ? G - h0 : nh_base;
            const int32_t nq_tile = tile_rows(plan, pp, q_len, nh);
            for (int32_t i0 = 0; i0 < q_len; i0 += nq_tile) {
                unit u;
                u.req = r;
                u.h0 = h0;
                u.nh = nh;
                u.i0 = i0;
                u.nq = q_len - i0 < nq_tile ? q_len - i0 : nq_tile;
                int32_t lo_first, hi_first, lo_last, hi_last;
                kva__row_keys(d, s, q_len, i0, &lo_first, &hi_first);
                kva__row_keys(d, s, q_len, i0 + u.nq - 1, &lo_last, &hi_last);
                u.k0 = lo_first;
                u.k1 = hi_last;
                u.cost = (int64_t)nh * visible_keys(plan, s, q_len, i0, u.nq, 0, s) +
                         (u.k1 - u.k0) + ITEM_OVERHEAD;
                for (int32_t kvh = 0; kvh < d->num_kv_heads; kvh++) {
                    u.kv_head = kvh;
                    if (!emit)
                        *total += u.cost;
                    else if (!emit_unit(b, plan, pp, &u, target, partial_floats))
                        return 0;
                }
            }
        }
    }
    return 1;
}

kva_status kva__partition_build(const kva_plan *plan, const kva__partition_params *params,
                                kva__partition **out)
{
    return kva__partition_build_subset(plan, params, NULL, out);
}

kva_status kva__partition_build_subset(const kva_plan *plan, const kva__partition_params *params,
                                       const uint8_t *skip_req, kva__partition **out)
{
    kva__partition_params pp = *params;
    if (pp.num_threads < 1)
        pp.num_threads = 1;
    if (pp.max_rows < 1)
        pp.max_rows = 1;
    if (pp.prefill_rows < 1 || pp.prefill_rows > pp.max_rows)
        pp.prefill_rows = pp.max_rows;
    if (pp.split_align < 1)
        pp.split_align = 1;
    if (pp.min_split_keys < 1)
        pp.min_split_keys = 1;
    if (pp.max_splits < 1)
        pp.max_splits = 1;
    if (pp.items_per_thread < 1)
        pp.items_per_thread = 1;

    kva__partition *part = calloc(1, sizeof *part);
    if (!part)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory (partition)");
    part->params = pp;

    builder b;
    memset(&b, 0, sizeof b);
    int64_t total = 0, partial_floats = 0;
    walk_units(&b, plan, &pp, skip_req, 0, 0, &total, NULL);
    int64_t target = 0;
    if (pp.num_threads > 1) {
        target = total / ((int64_t)pp.num_threads * pp.items_per_thread);
        if (target < 1)
            target = 1;
    }
    if (!walk_units(&b, plan, &pp, skip_req, 1, target, &total, &partial_floats)) {
        free(b.items);
        free(b.tasks);
        free(part);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory partitioning %d requests",
                         (int)plan->d.num_requests);
    }
    if (b.num_items > 1 && !sort_items(b.items, b.num_items))
        qsort(b.items, (size_t)b.num_items, sizeof *b.items, by_cost_desc);
    part->items = b.items;
    part->num_items = b.num_items;
    part->tasks = b.tasks;
    part->num_tasks = b.num_tasks;
    part->partial_floats = partial_floats;
    part->total_cost = 0;
    for (int32_t i = 0; i < b.num_items; i++)
        part->total_cost += b.items[i].cost;
    *out = part;
    return KVA_STATUS_OK;
}

void kva__partition_free(kva__partition *part)
{
    if (!part)
        return;
    free(part->items);
    free(part->tasks);
    free(part->group_start);
    free(part);
}
