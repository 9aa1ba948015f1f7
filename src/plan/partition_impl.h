/*
 * partition_impl.h - what the two partition builders share (internal to
 * src/plan): partition.c (units, items, the CPU's dynamic-schedule build)
 * and partition_grid.c (the persistent grid's choice of split target).
 */
#ifndef KVA_PARTITION_IMPL_H
#define KVA_PARTITION_IMPL_H

#include "partition.h"

/* Fixed cost of an item (loading the query tile, finalizing, scheduling), in row-keys. */
#define KVA__ITEM_OVERHEAD 32

/*
 * Growable arrays of items and tasks. With `place` set, items are not
 * appended but stored at their final sorted position: the distinct item
 * costs are known (dcost [ndist], largest first) and dnext[k] is the next
 * free position of cost dcost[k] in items (preallocated), so items emitted in
 * tie order (request, kv head, head slice, query rows, keys) land in the
 * sort order of item_before without a sort.
 */
typedef struct kva__part_builder {
    kva__work_item *items;
    int32_t num_items, cap_items;
    kva__split_task *tasks;
    int32_t num_tasks, cap_tasks;
    int place;
    const int64_t *dcost; /* [ndist] */
    int64_t *dnext;       /* [ndist] */
    int32_t ndist, dlast; /* dlast: bucket of the last placed item */
    /* Placement only, when set: the position and bucket of each placed item
     * ([2 * cap_log]; kva__part_copy_kv_heads reads them). */
    int32_t *log;
    int32_t nlog, cap_log;
} kva__part_builder;

/* One (request, query tile, kv head, head slice) before splitting; keys [k0, k1)
 * is the union of its rows' visible ranges (contiguous: lo and hi grow with i). */
typedef struct kva__unit {
    int32_t req, kv_head, h0, nh, i0, nq, k0, k1;
    int64_t cost;
    /* Most chunks the unit may be cut into: keys / min_split_keys, at most
     * max_splits (below 2: never split). */
    int32_t cap;
    /* kva__part_unit_splits' memo: the chunk count last asked of the unit
     * (0: none yet), its chunk keys and the chunks they make. */
    int32_t memo_ns, memo_chunk, memo_count;
    int32_t memo_bucket; /* partition_grid.c's place_whole: the unit's cost bucket */
} kva__unit;

/* The units of a plan (one per request, head slice and query tile; each
 * stands for num_kv_heads units that differ only in the kv head). */
typedef struct kva__unit_list {
    kva__unit *units;
    int32_t n, cap;
} kva__unit_list;

/* How units are split: target == 0 and forced == 0 keep every unit whole. */
typedef struct kva__split_rule {
    int64_t target; /* cost one item should not exceed much */
    int floor;      /* chunks = cost / target rounded down (1) or up (0) */
    int32_t forced; /* > 0: every unit is cut into this many chunks (benchmarks) */
} kva__split_rule;

/* The chunk count rule sr asks of a unit of `cost` that may be cut into at
 * most cap chunks (1: unsplit): cost / target rounded down or up, at most
 * cap, the usual counts (below 3) by comparison, not division. */
static inline int64_t kva__part_asked(const kva__split_rule *sr, int64_t cost, int64_t cap)
{
    const int64_t t = sr->target;
    if (cap < 2)
        return 1;
    if (sr->forced > 0)
        return sr->forced < cap ? sr->forced : cap;
    if (t <= 0 || cost <= t)
        return 1;
    if (sr->floor)
        return cost >= t * cap ? cap : cost < 2 * t ? 1 : cost / t;
    return cost > t * (cap - 1) ? cap : cost <= 2 * t ? 2 : (cost + t - 1) / t;
}

int kva__part_push_item(kva__part_builder *b, const kva__work_item *it);
/* Lists the units (a->units grown as needed; a->n set); returns the count,
 * or -1 when out of memory. */
int32_t kva__part_list_units(kva__unit_list *a, const kva_plan *plan,
                             const kva__partition_params *pp, const uint8_t *skip_req);
/* Total cost of the units (every kv head). */
int64_t kva__part_units_total(const kva_plan *plan, const kva__unit_list *a);
/* The caller's parameters with every field >= 1 (see partition.c). */
kva__partition_params kva__part_norm_params(const kva__partition_params *params);
/* Chunks unit u is cut into under rule sr (1 = unsplit); *asked gets the
 * chunk count the rule asks for after the caps (1 when unsplit), which
 * decides the cut, and *chunk the keys of every chunk but the last. */
int32_t kva__part_unit_splits(const kva__partition_params *pp, const kva__split_rule *sr,
                              kva__unit *u, int32_t *asked, int32_t *chunk);
/* Cost of the chunk [a, e) of unit u of a request of seq_len s and q_len q_len. */
int64_t kva__part_chunk_cost(const kva_plan *plan, const kva__unit *u, int32_t s, int32_t q_len,
                             int32_t a, int32_t e);
/* Emits unit u's items for kv head kvh (one item, or a split task with one
 * item per chunk); returns 0 when out of memory. */
int kva__part_emit_unit(kva__part_builder *b, const kva_plan *plan, const kva__partition_params *pp,
                        kva__unit *u, int32_t kvh, const kva__split_rule *sr,
                        int64_t *partial_floats);
/* Placement (b->place): the items and split tasks of kv heads 1..hkv-1 of
 * one request, copies of kv head 0's (the items the builder logged, the
 * tasks from task0 on), which differ only in the kv head, the task index and
 * each task's workspace offset; placed in the order kva__part_emit_unit
 * would emit them (kv head, then unit). Returns 0 when out of memory. */
int kva__part_copy_kv_heads(kva__part_builder *b, const kva_plan *plan, int32_t task0, int32_t hkv,
                            int64_t *partial_floats);
/* Hands the builder's items and tasks to part and stores it in *out (ok), or
 * frees part with them and reports the allocation failure (!ok). */
kva_status kva__part_finish(const kva_plan *plan, const kva__partition_params *pp,
                            kva__partition *part, kva__part_builder *b, int64_t partial_floats,
                            int ok, kva__partition **out);

/* kva__partition_build_grid with every candidate evaluated, none skipped by
 * its lower bound: the same result, slower (tests compare the two). */
kva_status kva__partition_build_grid_all(const kva_plan *plan, const kva__partition_params *params,
                                         const kva__partition_grid *grid, const uint8_t *skip_req,
                                         kva__partition *reuse, kva__partition **out);

#endif /* KVA_PARTITION_IMPL_H */
