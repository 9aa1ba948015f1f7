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
#include "partition_impl.h"

#include <stdlib.h>
#include <string.h>

int kva__part_push_item(kva__part_builder *b, const kva__work_item *it)
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
        if (b->log) {
            if (b->nlog == b->cap_log)
                return 0; /* cannot happen: sized for every chunk of the request */
            b->log[2 * b->nlog] = (int32_t)b->dnext[lo];
            b->log[2 * b->nlog + 1] = lo;
            b->nlog++;
        }
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

static int push_task(kva__part_builder *b, const kva__split_task *t)
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

int kva__part_copy_kv_heads(kva__part_builder *b, const kva_plan *plan, int32_t task0, int32_t hkv,
                            int64_t *partial_floats)
{
    const int32_t ntask = b->num_tasks - task0, nlog = b->nlog;
    for (int32_t kvh = 1; kvh < hkv; kvh++) {
        const int32_t shift = b->num_tasks - task0;
        for (int32_t t = 0; t < ntask; t++) {
            kva__split_task x = b->tasks[task0 + t];
            x.kv_head = kvh;
            x.ws_off = *partial_floats;
            *partial_floats += (int64_t)x.num_splits * x.nq * x.nh * (plan->d.head_dim_v + 1);
            if (!push_task(b, &x))
                return 0;
        }
        for (int32_t k = 0; k < nlog; k++) {
            kva__work_item it = b->items[b->log[2 * k]];
            const int32_t d = b->log[2 * k + 1];
            it.kv_head = kvh;
            it.task += it.task >= 0 ? shift : 0;
            if (b->dnext[d] >= b->cap_items)
                return 0; /* cannot happen: the costs were counted by rule_makespan */
            b->items[b->dnext[d]++] = it;
        }
        b->num_items += nlog;
    }
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

/* The count asked (kva__part_asked) decides the cut; the chunk keys it gives
 * are remembered in u, since the grid's candidates mostly ask a unit for the
 * same count. */
int32_t kva__part_unit_splits(const kva__partition_params *pp, const kva__split_rule *sr,
                              kva__unit *u, int32_t *asked, int32_t *chunk)
{
    const int64_t ns = kva__part_asked(sr, u->cost, u->cap);
    *asked = 1;
    if (ns < 2)
        return 1;
    *asked = (int32_t)ns;
    if (u->memo_ns != ns) {
        const int32_t keys = u->k1 - u->k0;
        int32_t c = ceil_div(keys, (int32_t)ns);
        c = ceil_div(c, pp->split_align) * pp->split_align;
        u->memo_ns = (int32_t)ns;
        u->memo_chunk = c;
        u->memo_count = ceil_div(keys, c);
    }
    *chunk = u->memo_chunk;
    return u->memo_count;
}

/* Cost of the chunk [a, e) of a unit: heads x row-keys, plus loads and overhead. */
int64_t kva__part_chunk_cost(const kva_plan *plan, const kva__unit *u, int32_t s, int32_t q_len,
                             int32_t a, int32_t e)
{
    /* A one-row unit sees all of [k0, k1): no per-row walk. */
    const int64_t vis = u->nq == 1 ? e - a : visible_keys(plan, s, q_len, u->i0, u->nq, a, e);
    return (int64_t)u->nh * vis + (e - a) + KVA__ITEM_OVERHEAD;
}

/*
 * Emits the items of one unit for kv head kvh: one item when it is cheap
 * enough, otherwise a split task with one item per key chunk. Returns 0 when
 * out of memory.
 */
int kva__part_emit_unit(kva__part_builder *b, const kva_plan *plan, const kva__partition_params *pp,
                        kva__unit *u, int32_t kvh, const kva__split_rule *sr,
                        int64_t *partial_floats)
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

    int32_t chunk = 0, asked = 1;
    const int32_t nsplit = kva__part_unit_splits(pp, sr, u, &asked, &chunk);
    if (nsplit < 2)
        return kva__part_push_item(b, &it);

    kva__split_task t;
    t.req = u->req;
    t.kv_head = kvh;
    t.h0 = u->h0;
    t.nh = u->nh;
    t.i0 = u->i0;
    t.nq = u->nq;
    t.num_splits = nsplit;
    t.k0 = u->k0;
    t.k1 = u->k1;
    t.chunk = chunk;
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
        it.cost = kva__part_chunk_cost(plan, u, s, q_len, a, e);
        if (!kva__part_push_item(b, &it))
            return 0;
    }
    return 1;
}

/* Doubles a's capacity (64 at first); 0 when out of memory. */
static int grow_units(kva__unit_list *a)
{
    const int32_t cap = a->cap ? a->cap * 2 : 64;
    kva__unit *p = realloc(a->units, (size_t)cap * sizeof *p);
    if (!p)
        return 0;
    a->units = p;
    a->cap = cap;
    return 1;
}

int32_t kva__part_list_units(kva__unit_list *a, const kva_plan *plan,
                             const kva__partition_params *pp, const uint8_t *skip_req)
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
        if (q_len == 1) {
            /* A decode (most units of a serving step): one row, so one key
             * range and one tile per head slice, without the tile and
             * visible-key arithmetic below (the same units). */
            int32_t lo, hi;
            kva__row_keys(d, s, 1, 0, &lo, &hi);
            const int64_t vis = hi > lo ? hi - lo : 0;
            const int32_t by_len = (hi - lo) / pp->min_split_keys;
            for (int32_t h0 = 0; h0 < G; h0 += nh_base) {
                if (a->n == a->cap && !grow_units(a))
                    return -1;
                kva__unit *u = &a->units[a->n++];
                const int32_t nh = G - h0 < nh_base ? G - h0 : nh_base;
                u->req = r, u->kv_head = 0, u->h0 = h0, u->nh = nh, u->i0 = 0, u->nq = 1;
                u->k0 = lo, u->k1 = hi;
                u->cost = (int64_t)nh * vis + (hi - lo) + KVA__ITEM_OVERHEAD;
                u->cap = by_len < pp->max_splits ? by_len : pp->max_splits;
                u->memo_ns = 0;
            }
            continue;
        }
        for (int32_t h0 = 0; h0 < G; h0 += nh_base) {
            const int32_t nh = G - h0 < nh_base ? G - h0 : nh_base;
            const int32_t nq_tile = tile_rows(plan, pp, q_len, nh);
            for (int32_t i0 = 0; i0 < q_len; i0 += nq_tile) {
                if (a->n == a->cap && !grow_units(a))
                    return -1;
                kva__unit *u = &a->units[a->n++];
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
                u->cost = (int64_t)nh * vis + (u->k1 - u->k0) + KVA__ITEM_OVERHEAD;
                const int32_t by_len = (u->k1 - u->k0) / pp->min_split_keys;
                u->cap = by_len < pp->max_splits ? by_len : pp->max_splits;
                u->memo_ns = 0;
            }
        }
    }
    return a->n;
}

/* Total cost of the units (every kv head). */
int64_t kva__part_units_total(const kva_plan *plan, const kva__unit_list *a)
{
    int64_t total = 0;
    for (int32_t i = 0; i < a->n; i++)
        total += a->units[i].cost;
    return total * plan->d.num_kv_heads;
}

/* Normalizes the caller's parameters (every field >= 1; prefill_rows may
 * exceed max_rows, which bounds decode tiles and head slices). */
kva__partition_params kva__part_norm_params(const kva__partition_params *params)
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

kva_status kva__part_finish(const kva_plan *plan, const kva__partition_params *pp,
                            kva__partition *part, kva__part_builder *b, int64_t partial_floats,
                            int ok, kva__partition **out)
{
    if (!ok) {
        if (part) {
            part->items = b->items;
            part->tasks = b->tasks;
            kva__partition_free(part);
        } else {
            free(b->items);
            free(b->tasks);
        }
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory partitioning %d requests",
                         (int)plan->d.num_requests);
    }
    part->params = *pp;
    part->items = b->items;
    part->num_items = b->num_items;
    part->cap_items = b->cap_items;
    part->tasks = b->tasks;
    part->num_tasks = b->num_tasks;
    part->cap_tasks = b->cap_tasks;
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
                                   kva__unit_list *a, const kva__split_rule *sr,
                                   kva__partition **out)
{
    kva__partition *part = calloc(1, sizeof *part);
    kva__part_builder b;
    memset(&b, 0, sizeof b);
    int64_t partial_floats = 0;
    int ok = part != NULL;
    for (int32_t i = 0; ok && i < a->n; i++)
        for (int32_t kvh = 0; ok && kvh < plan->d.num_kv_heads; kvh++)
            ok = kva__part_emit_unit(&b, plan, pp, &a->units[i], kvh, sr, &partial_floats);
    if (ok && b.num_items > 1 && !sort_items(b.items, b.num_items))
        qsort(b.items, (size_t)b.num_items, sizeof *b.items, by_cost_desc);
    return kva__part_finish(plan, pp, part, &b, partial_floats, ok, out);
}

kva_status kva__partition_build(const kva_plan *plan, const kva__partition_params *params,
                                kva__partition **out)
{
    return kva__partition_build_subset(plan, params, NULL, out);
}

kva_status kva__partition_build_subset(const kva_plan *plan, const kva__partition_params *params,
                                       const uint8_t *skip_req, kva__partition **out)
{
    const kva__partition_params pp = kva__part_norm_params(params);
    kva__unit_list a;
    memset(&a, 0, sizeof a);
    if (kva__part_list_units(&a, plan, &pp, skip_req) < 0) {
        free(a.units);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory partitioning %d requests",
                         (int)plan->d.num_requests);
    }
    kva__split_rule sr = {0, 0, 0};
    if (pp.num_threads > 1) {
        sr.target =
            kva__part_units_total(plan, &a) / ((int64_t)pp.num_threads * pp.items_per_thread);
        if (sr.target < 1)
            sr.target = 1;
    }
    kva_status st = build_from_units(plan, &pp, &a, &sr, out);
    free(a.units);
    return st;
}

void kva__partition_free(kva__partition *part)
{
    if (!part)
        return;
    free(part->items);
    free(part->tasks);
    free(part->group_start);
    kva__partition_scratch_free(part->scratch);
    free(part);
}
