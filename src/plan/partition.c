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
 *
 * The GPU's persistent grid (kva__partition_build_grid) runs items round-
 * robin, so the split target matters more than on a dynamic schedule: it
 * lists the units once (one per request, head slice and query tile; the kv
 * heads multiply them), evaluates eight candidate targets by the grid's
 * makespan in closed form (runs of equal item cost, no items built), and
 * builds only the winner, placing every item at its sorted position by
 * counting (no comparison sort).
 */
#include "partition.h"
#include "sort_inline.h"

#include <stdlib.h>
#include <string.h>

/* Fixed cost of an item (loading the query tile, finalizing, scheduling), in row-keys. */
#define ITEM_OVERHEAD 32

/*
 * Growable arrays of items and tasks. With `place` set, items are not
 * appended but stored at their final sorted position: the distinct item
 * costs are known (dcost [ndist], largest first) and dnext[k] is the next
 * free position of cost dcost[k] in items (preallocated), so items emitted in
 * tie order (request, kv head, head slice, query rows, keys) land in the
 * sort order of item_before without a sort.
 */
typedef struct builder {
    kva__work_item *items;
    int32_t num_items, cap_items;
    kva__split_task *tasks;
    int32_t num_tasks, cap_tasks;
    int place;
    const int64_t *dcost; /* [ndist] */
    int64_t *dnext;       /* [ndist] */
    int32_t ndist, dlast; /* dlast: bucket of the last placed item */
} builder;

static int push_item(builder *b, const kva__work_item *it)
{
    if (b->place) {
        /* Consecutive items (the chunks of a unit) mostly share a cost. */
        int32_t lo = b->dlast, hi = b->ndist - 1; /* dcost descending, it->cost among them */
        if (b->dcost[lo] != it->cost)
            lo = 0;
        else
            hi = lo;
        while (lo < hi) {
            const int32_t mid = (lo + hi) / 2;
            if (b->dcost[mid] > it->cost)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (b->dcost[lo] != it->cost || b->dnext[lo] >= b->cap_items)
            return 0; /* cannot happen: the costs were counted by rule_makespan */
        b->items[b->dnext[lo]++] = *it;
        b->num_items++;
        b->dlast = lo;
        return 1;
    }
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

static int32_t ceil_div(int32_t a, int32_t b)
{
    return (a + b - 1) / b;
}

/* One (request, query tile, kv head, head slice) before splitting; keys [k0, k1)
 * is the union of its rows' visible ranges (contiguous: lo and hi grow with i). */
typedef struct unit {
    int32_t req, kv_head, h0, nh, i0, nq, k0, k1;
    int64_t cost;
} unit;

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

/* How units are split: target == 0 and forced == 0 keep every unit whole. */
typedef struct split_rule {
    int64_t target; /* cost one item should not exceed much */
    int floor;      /* chunks = cost / target rounded down (1) or up (0) */
    int32_t forced; /* > 0: every unit is cut into this many chunks (benchmarks) */
} split_rule;

/* Chunks a unit of `cost` over `keys` keys is cut into under rule sr (1 =
 * unsplit), and through *chunk the keys of every chunk but the last. */
static int32_t unit_splits(const kva__partition_params *pp, const split_rule *sr, int64_t cost,
                           int32_t keys, int32_t *chunk)
{
    int64_t ns = 1;
    if (sr->forced > 0)
        ns = sr->forced;
    else if (sr->target > 0 && cost > sr->target)
        ns = sr->floor ? cost / sr->target : (cost + sr->target - 1) / sr->target;
    if (ns > 1) {
        const int64_t by_len = keys / pp->min_split_keys;
        if (ns > by_len)
            ns = by_len;
        if (ns > pp->max_splits)
            ns = pp->max_splits;
    }
    if (ns < 2)
        return 1;
    int32_t c = ceil_div(keys, (int32_t)ns);
    c = ceil_div(c, pp->split_align) * pp->split_align;
    *chunk = c;
    return ceil_div(keys, c);
}

/* Cost of the chunk [a, e) of a unit: heads x row-keys, plus loads and overhead. */
static int64_t chunk_cost(const kva_plan *plan, const unit *u, int32_t s, int32_t q_len, int32_t a,
                          int32_t e)
{
    /* A one-row unit sees all of [k0, k1): no per-row walk. */
    const int64_t vis = u->nq == 1 ? e - a : visible_keys(plan, s, q_len, u->i0, u->nq, a, e);
    return (int64_t)u->nh * vis + (e - a) + ITEM_OVERHEAD;
}

/*
 * Emits the items of one unit for kv head kvh: one item when it is cheap
 * enough, otherwise a split task with one item per key chunk. Returns 0 when
 * out of memory.
 */
static int emit_unit(builder *b, const kva_plan *plan, const kva__partition_params *pp,
                     const unit *u, int32_t kvh, const split_rule *sr, int64_t *partial_floats)
{
    kva__work_item it;
    memset(&it, 0, sizeof it);
    it.req = u->req;
    it.kv_head = kvh;
    it.h0 = u->h0;
    it.nh = u->nh;
    it.i0 = u->i0;
    it.nq = u->nq;
    it.k0 = u->k0;
    it.k1 = u->k1;
    it.task = -1;
    it.cost = u->cost;

    int32_t chunk = 0;
    const int32_t nsplit = unit_splits(pp, sr, u->cost, u->k1 - u->k0, &chunk);
    if (nsplit < 2)
        return push_item(b, &it);

    kva__split_task t;
    t.req = u->req;
    t.kv_head = kvh;
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
        it.cost = chunk_cost(plan, u, s, q_len, a, e);
        if (!push_item(b, &it))
            return 0;
    }
    return 1;
}

/*
 * The units of the plan, one per (request, head slice, query tile); every
 * unit stands for num_kv_heads units that differ only in the kv head. Fills
 * a->units (grown as needed) and returns the count, or -1 when out of memory.
 */
typedef struct unit_list {
    unit *units;
    int32_t n, cap;
} unit_list;

static int32_t list_units(unit_list *a, const kva_plan *plan, const kva__partition_params *pp,
                          const uint8_t *skip_req)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t G = d->num_heads / d->num_kv_heads;
    const int32_t nslices = ceil_div(G, pp->max_rows);
    const int32_t nh_base = ceil_div(G, nslices);
    a->n = 0;
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        const int32_t s = plan->seq_lens[r];
        if (q_len <= 0 || (skip_req && skip_req[r]))
            continue;
        for (int32_t h0 = 0; h0 < G; h0 += nh_base) {
            const int32_t nh = G - h0 < nh_base ? G - h0 : nh_base;
            const int32_t nq_tile = tile_rows(plan, pp, q_len, nh);
            for (int32_t i0 = 0; i0 < q_len; i0 += nq_tile) {
                if (a->n == a->cap) {
                    const int32_t cap = a->cap ? a->cap * 2 : 64;
                    unit *p = realloc(a->units, (size_t)cap * sizeof *p);
                    if (!p)
                        return -1;
                    a->units = p;
                    a->cap = cap;
                }
                unit *u = &a->units[a->n++];
                u->req = r;
                u->kv_head = 0;
                u->h0 = h0;
                u->nh = nh;
                u->i0 = i0;
                u->nq = q_len - i0 < nq_tile ? q_len - i0 : nq_tile;
                int32_t lo_first, hi_first, lo_last, hi_last;
                kva__row_keys(d, s, q_len, i0, &lo_first, &hi_first);
                kva__row_keys(d, s, q_len, i0 + u->nq - 1, &lo_last, &hi_last);
                u->k0 = lo_first;
                u->k1 = hi_last;
                const int64_t vis = u->nq == 1 ? (hi_first > lo_first ? hi_first - lo_first : 0)
                                               : visible_keys(plan, s, q_len, i0, u->nq, 0, s);
                u->cost = (int64_t)nh * vis + (u->k1 - u->k0) + ITEM_OVERHEAD;
            }
        }
    }
    return a->n;
}

/* Total cost of the units (every kv head). */
static int64_t units_total(const kva_plan *plan, const unit_list *a)
{
    int64_t total = 0;
    for (int32_t i = 0; i < a->n; i++)
        total += a->units[i].cost;
    return total * plan->d.num_kv_heads;
}

/* Normalizes the caller's parameters (every field >= 1; prefill_rows may
 * exceed max_rows, which bounds decode tiles and head slices). */
static kva__partition_params norm_params(const kva__partition_params *params)
{
    kva__partition_params pp = *params;
    if (pp.num_threads < 1)
        pp.num_threads = 1;
    if (pp.max_rows < 1)
        pp.max_rows = 1;
    if (pp.prefill_rows < 1)
        pp.prefill_rows = pp.max_rows;
    if (pp.split_align < 1)
        pp.split_align = 1;
    if (pp.min_split_keys < 1)
        pp.min_split_keys = 1;
    if (pp.max_splits < 1)
        pp.max_splits = 1;
    if (pp.items_per_thread < 1)
        pp.items_per_thread = 1;
    return pp;
}

/* Hands the builder's items and tasks to part and stores it in *out (ok), or
 * frees all three and reports the allocation failure (!ok). */
static kva_status finish_partition(const kva_plan *plan, const kva__partition_params *pp,
                                   kva__partition *part, builder *b, int64_t partial_floats, int ok,
                                   kva__partition **out)
{
    if (!ok) {
        free(b->items);
        free(b->tasks);
        free(part);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory partitioning %d requests",
                         (int)plan->d.num_requests);
    }
    part->params = *pp;
    part->items = b->items;
    part->num_items = b->num_items;
    part->tasks = b->tasks;
    part->num_tasks = b->num_tasks;
    part->partial_floats = partial_floats;
    part->total_cost = 0;
    for (int32_t i = 0; i < b->num_items; i++)
        part->total_cost += b->items[i].cost;
    *out = part;
    return KVA_STATUS_OK;
}

/* Emits the items of all units under rule sr, sorts them and fills *out.
 * Consumes nothing of a (the caller frees it). */
static kva_status build_from_units(const kva_plan *plan, const kva__partition_params *pp,
                                   const unit_list *a, const split_rule *sr, kva__partition **out)
{
    kva__partition *part = calloc(1, sizeof *part);
    builder b;
    memset(&b, 0, sizeof b);
    int64_t partial_floats = 0;
    int ok = part != NULL;
    for (int32_t i = 0; ok && i < a->n; i++)
        for (int32_t kvh = 0; ok && kvh < plan->d.num_kv_heads; kvh++)
            ok = emit_unit(&b, plan, pp, &a->units[i], kvh, sr, &partial_floats);
    if (ok && b.num_items > 1 && !sort_items(b.items, b.num_items))
        qsort(b.items, (size_t)b.num_items, sizeof *b.items, by_cost_desc);
    return finish_partition(plan, pp, part, &b, partial_floats, ok, out);
}

kva_status kva__partition_build(const kva_plan *plan, const kva__partition_params *params,
                                kva__partition **out)
{
    return kva__partition_build_subset(plan, params, NULL, out);
}

kva_status kva__partition_build_subset(const kva_plan *plan, const kva__partition_params *params,
                                       const uint8_t *skip_req, kva__partition **out)
{
    const kva__partition_params pp = norm_params(params);
    unit_list a;
    memset(&a, 0, sizeof a);
    if (list_units(&a, plan, &pp, skip_req) < 0) {
        free(a.units);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory partitioning %d requests",
                         (int)plan->d.num_requests);
    }
    split_rule sr = {0, 0, 0};
    if (pp.num_threads > 1) {
        sr.target = units_total(plan, &a) / ((int64_t)pp.num_threads * pp.items_per_thread);
        if (sr.target < 1)
            sr.target = 1;
    }
    kva_status st = build_from_units(plan, &pp, &a, &sr, out);
    free(a.units);
    return st;
}

/* ---- the GPU's choice among split targets (kva__partition_build_grid) ---- */

/* A run of `count` items of equal cost. */
typedef struct cost_run {
    int64_t cost, count;
} cost_run;

/* runs[0..n) by cost, largest first (sort_inline.h; runs of 16). */
static inline int run_before(const cost_run *x, const cost_run *y)
{
    return x->cost > y->cost;
}
KVA__DEFINE_SORT(sort_runs, cost_run, run_before, 16)

/* Whether units x and y are cut into the same item costs under any rule. */
static int same_shape(const kva_plan *plan, const unit *x, const unit *y)
{
    if (x->cost != y->cost || x->nh != y->nh || x->nq != y->nq || x->k0 != y->k0 || x->k1 != y->k1)
        return 0;
    if (x->nq == 1)
        return 1; /* chunk costs depend on the key range only */
    const int32_t qx = plan->query_start_loc[x->req + 1] - plan->query_start_loc[x->req];
    const int32_t qy = plan->query_start_loc[y->req + 1] - plan->query_start_loc[y->req];
    return x->i0 == y->i0 && qx == qy && plan->seq_lens[x->req] == plan->seq_lens[y->req];
}

/*
 * The makespan of the items rule sr cuts the units into, on `slots` workers
 * running them round-robin in cost order, without building them: sorted by
 * cost (largest first), worker b runs items b, b + slots, ..., so worker 0
 * has the largest item of every round and at least as many items as any
 * other worker, and its load is the makespan: the sum of the costs at
 * positions 0, slots, 2 slots, ... of the sorted list. Only the costs are
 * listed, as runs of equal cost (a unit split into equal chunks is one run,
 * and identical units are merged). *num_items gets the item count. Returns
 * -1 when out of memory.
 */
static int64_t rule_makespan(const kva_plan *plan, const kva__partition_params *pp,
                             const unit_list *a, const split_rule *sr, int64_t slots,
                             cost_run **runs, int32_t *cap, int64_t *num_items, int32_t *num_runs,
                             int64_t *sum_cost, int *any_split)
{
    *any_split = 0;
    const int64_t hkv = plan->d.num_kv_heads;
    int32_t n = 0;
    for (int32_t i = 0; i < a->n;) {
        const unit *u = &a->units[i];
        int64_t mult = hkv;
        int32_t j = i + 1;
        while (j < a->n && same_shape(plan, u, &a->units[j]))
            j++, mult += hkv;
        i = j;
        int32_t chunk = 0;
        const int32_t keys = u->k1 - u->k0;
        const int32_t ns = unit_splits(pp, sr, u->cost, keys, &chunk);
        *any_split |= ns > 1;
        /* At most ns runs (one per chunk; two for a one-row unit). */
        if (n + ns > *cap) {
            const int32_t c = 2 * (n + ns) + 64;
            cost_run *p = realloc(*runs, 2 * (size_t)c * sizeof *p); /* + merge scratch */
            if (!p)
                return -1;
            *runs = p;
            *cap = c;
        }
        cost_run *r = *runs;
        if (ns == 1) {
            r[n].cost = u->cost, r[n++].count = mult;
        } else if (u->nq == 1) {
            const int32_t last = keys - (ns - 1) * chunk;
            r[n].cost = chunk_cost(plan, u, 0, 0, 0, chunk), r[n++].count = (ns - 1) * mult;
            r[n].cost = chunk_cost(plan, u, 0, 0, 0, last), r[n++].count = mult;
        } else {
            const int32_t s = plan->seq_lens[u->req];
            const int32_t q_len = plan->query_start_loc[u->req + 1] - plan->query_start_loc[u->req];
            for (int32_t c = 0; c < ns; c++) {
                const int32_t lo = u->k0 + c * chunk, e = lo + chunk < u->k1 ? lo + chunk : u->k1;
                r[n].cost = chunk_cost(plan, u, s, q_len, lo, e), r[n++].count = mult;
            }
        }
    }
    sort_runs(*runs, *runs + *cap, n);
    int64_t pos = 0, worst = 0;
    *sum_cost = 0;
    for (int32_t i = 0; i < n; i++) {
        const cost_run *r = &(*runs)[i];
        *sum_cost += r->cost * r->count;
        /* Positions of worker 0 (multiples of slots) in [pos, pos + count). */
        const int64_t hits = (pos + r->count + slots - 1) / slots - (pos + slots - 1) / slots;
        worst += hits * r->cost;
        pos += r->count;
    }
    *num_items = pos;
    *num_runs = n;
    return worst;
}

/*
 * Builds the partition of rule sr whose item costs rule_makespan listed in
 * runs [nruns] (sorted, largest first; num_items items): the items are
 * emitted in tie order (per request: kv head, head slice, query rows, keys)
 * and placed at their sorted position by cost (builder.place), so the result
 * equals build_from_units' (sorted by item_before) up to the numbering of
 * the split tasks and their workspace offsets, without a sort.
 */
static kva_status build_placed(const kva_plan *plan, const kva__partition_params *pp,
                               const unit_list *a, const split_rule *sr, cost_run *runs,
                               int32_t nruns, int64_t num_items, kva__partition **out)
{
    builder b;
    memset(&b, 0, sizeof b);
    kva__partition *part = calloc(1, sizeof *part);
    int64_t *dcost = malloc(2 * ((size_t)nruns + 1) * sizeof *dcost);
    b.items = malloc(((size_t)num_items + 1) * sizeof *b.items);
    int ok = part && dcost && b.items && num_items <= INT32_MAX;
    int64_t partial_floats = 0;
    if (ok) {
        /* Distinct costs and the first position of each. */
        int32_t nd = 0;
        int64_t pos = 0;
        for (int32_t i = 0; i < nruns; i++) {
            if (nd == 0 || dcost[nd - 1] != runs[i].cost) {
                dcost[nd] = runs[i].cost;
                dcost[nruns + 1 + nd] = pos;
                nd++;
            }
            pos += runs[i].count;
        }
        b.place = 1;
        b.dcost = dcost;
        b.dnext = dcost + nruns + 1;
        b.ndist = nd;
        b.cap_items = (int32_t)num_items;
    }
    for (int32_t i = 0; ok && i < a->n;) {
        int32_t j = i + 1;
        while (j < a->n && a->units[j].req == a->units[i].req)
            j++;
        for (int32_t kvh = 0; ok && kvh < plan->d.num_kv_heads; kvh++)
            for (int32_t u = i; ok && u < j; u++)
                ok = emit_unit(&b, plan, pp, &a->units[u], kvh, sr, &partial_floats);
        i = j;
    }
    ok = ok && b.num_items == num_items;
    free(dcost);
    return finish_partition(plan, pp, part, &b, partial_floats, ok, out);
}

/*
 * The grid's time for a candidate, in cost units: the load of worker 0 (t)
 * divided by the speed-up a worker gets while the grid is not saturated
 * (alpha_pct / 100), but never less than the total cost spread over every
 * worker; plus the fixed cost of every item worker 0 runs and, when any unit
 * is split, of the split tasks' partial writes and merge pass.
 */
static int64_t grid_estimate(const kva__partition_grid *g, int64_t slots, int64_t t, int64_t sum,
                             int64_t items, int any_split)
{
    const int64_t alpha = g->alpha_pct > 100 ? g->alpha_pct : 100;
    const int64_t spread = (sum + slots - 1) / slots, solo = t * 100 / alpha;
    return (spread > solo ? spread : solo) + g->item_overhead * ((items + slots - 1) / slots) +
           (any_split ? g->split_overhead : 0);
}

int64_t kva__partition_makespan(const kva__partition *part, int64_t slots)
{
    int64_t worst = 0;
    if (slots < 1)
        slots = 1;
    for (int64_t i = 0; i < part->num_items; i += slots)
        worst += part->items[i].cost; /* worker 0: see rule_makespan */
    return worst;
}

kva_status kva__partition_build_grid(const kva_plan *plan, const kva__partition_params *params,
                                     const kva__partition_grid *grid, const uint8_t *skip_req,
                                     kva__partition **out)
{
    kva__partition_params pp = norm_params(params);
    pp.items_per_thread = 1;
    const int64_t slots = grid->slots > 0 ? grid->slots : 1;
    unit_list a;
    memset(&a, 0, sizeof a);
    cost_run *runs = NULL;
    int32_t cap = 0;
    if (list_units(&a, plan, &pp, skip_req) < 0)
        goto oom;
    const int64_t total = units_total(plan, &a);
    /* Candidates 1..4: items of at most total / (slots * k) (chunk counts
     * rounded up, the CPU's rule); 5..8: the same targets rounded down, so a
     * unit is cut into as many chunks as fit, not one more (16 decodes x 8
     * kv heads on 264 CTAs: 2 chunks each fill one round; rounded up, 3 take
     * two); 0: no split. The lowest grid_estimate wins; ties go to fewer
     * items, then to the earlier candidate (order 1..8, 0). force_splits < 0
     * keeps the former choice: candidates 1..4 by makespan alone. */
    split_rule best = {0, 0, 0};
    int32_t best_pick = -1;
    int64_t best_e = 0, best_t = 0, best_items = 0;
    const int former = grid->force_splits < 0;
    for (int32_t i = 1; i <= 10; i++) {
        const int32_t c = i == 10 ? 0 : i; /* 1..9, then 0 */
        split_rule sr = {0, 0, 0};
        if (grid->force_splits > 0) {
            if (c != 9)
                continue;
            sr.forced = grid->force_splits;
        } else if (c == 9 || (former && (c == 0 || c > 4))) {
            continue;
        } else if (c > 0) {
            const int32_t k = c <= 4 ? c : c - 4;
            sr.floor = c > 4;
            if (slots * k > 1) {
                sr.target = total / (slots * k);
                if (sr.target < 1)
                    sr.target = 1;
            }
        }
        int64_t items = 0, sum = 0;
        int32_t nruns = 0;
        int any_split = 0;
        const int64_t t =
            rule_makespan(plan, &pp, &a, &sr, slots, &runs, &cap, &items, &nruns, &sum, &any_split);
        if (t < 0)
            goto oom;
        const int64_t e = former ? t : grid_estimate(grid, slots, t, sum, items, any_split);
        if (best_pick < 0 || e < best_e || (!former && e == best_e && items < best_items)) {
            best = sr;
            best_pick = c;
            best_e = e;
            best_t = t;
            best_items = items;
        }
    }
    /* The winner's costs again (the scratch holds the last candidate's). */
    int64_t items = 0, sum = 0;
    int32_t nruns = 0;
    int any_split = 0;
    if (rule_makespan(plan, &pp, &a, &best, slots, &runs, &cap, &items, &nruns, &sum, &any_split) <
        0)
        goto oom;
    pp.num_threads = (int32_t)(slots < INT32_MAX ? slots : INT32_MAX);
    kva_status st = build_placed(plan, &pp, &a, &best, runs, nruns, items, out);
    free(runs);
    free(a.units);
    if (st == KVA_STATUS_OK) {
        (*out)->pick = best_pick;
        (*out)->makespan = best_t;
        (*out)->estimate = best_e;
    }
    return st;
oom:
    free(a.units);
    free(runs);
    return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                     "kva_plan_create: out of memory partitioning %d requests",
                     (int)plan->d.num_requests);
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
