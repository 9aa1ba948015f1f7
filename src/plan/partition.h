/*
 * partition.h - the work partition of a plan (internal; built at plan time).
 *
 * The attention of one step is cut into work items over (request, kv head,
 * query tile, key split). An item always covers a slice of one GQA group: the
 * query heads kv_head*G + h0 .. + nh (G = H / Hkv) that read the same kv head,
 * so each K/V row an item loads serves all of its heads (GQA packing). Query
 * rows are tiled (decodes form one tile, prefills are cut into tiles of a few
 * dozen rows), so an item computes a tile of nq query rows x nh heads, i.e.
 * nq * nh "rows" of attention: at most params.max_rows for a decode tile
 * (and for nq = 1), at most params.prefill_rows for a prefill tile of
 * several query rows.
 *
 * When there are too few items to keep every thread busy, or one item would
 * dominate the step, an item's key range is split into chunks (split-KV). The
 * chunks of one tile form a split task: each chunk writes a partial result
 * (out normalized over its keys, lse without the sink) into the workspace and
 * a second pass merges the task's partials with an LSE merge (the sink enters
 * only there, so it is counted once).
 *
 * Items are sorted by estimated cost, largest first, so a dynamic schedule
 * starts the long ones early (longest-processing-time-first).
 */
#ifndef KVA_PARTITION_H
#define KVA_PARTITION_H

#include "internal.h"

/* One unit of parallel work. */
typedef struct kva__work_item {
    int32_t req;     /* request r */
    int32_t kv_head; /* kv head */
    int32_t h0, nh;  /* query heads kv_head*G + h0 .. kv_head*G + h0 + nh - 1 */
    int32_t i0, nq;  /* query rows i0 .. i0 + nq - 1 of request r (0 = its first token) */
    int32_t k0, k1;  /* keys [k0, k1) this item reads (the rows' visible keys, clipped to
                        the split's chunk) */
    int32_t task;    /* index into partition tasks for a split item, -1 otherwise */
    int32_t split;   /* chunk index within the task (0 for an unsplit item) */
    int64_t cost;    /* estimated cost: row-keys plus loads and a fixed overhead */
} kva__work_item;

/* A query tile whose keys were split into num_splits chunks. */
typedef struct kva__split_task {
    int32_t req, kv_head, h0, nh, i0, nq;
    int32_t num_splits;
    /* The task's keys [k0, k1), cut into chunks of `chunk` keys (the last
     * one shorter): split c's item reads [k0 + c * chunk, ...). */
    int32_t k0, k1, chunk;
    /* Float offset in the workspace of the partials: num_splits blocks, each
     * [nq*nh, Dv] fp32 outputs followed by [nq*nh] fp32 lse. */
    int64_t ws_off;
} kva__split_task;

/* How the backend wants the work cut. */
typedef struct kva__partition_params {
    int32_t num_threads;      /* threads that will run the items (>= 1) */
    int32_t max_rows;         /* most attention rows (query rows x heads) per item */
    int32_t prefill_rows;     /* preferred attention rows of a prefill tile (may exceed
                                 max_rows, which slices the heads: nq >= 2 then) */
    int32_t split_align;      /* split boundaries are multiples of this many keys */
    int32_t min_split_keys;   /* no chunk shorter than this many keys */
    int32_t max_splits;       /* most chunks per tile */
    int32_t items_per_thread; /* aim for at least this many items of similar cost per thread */
} kva__partition_params;

struct kva__partition {
    kva__partition_params params;
    int32_t num_items;
    kva__work_item *items; /* [num_items], largest cost first */
    int32_t num_tasks;
    kva__split_task *tasks; /* [num_tasks] */
    int64_t partial_floats; /* workspace floats the split partials need (at offset 0) */
    int64_t total_cost;     /* sum of the items' costs */
    /* The CPU backend's kernels for this plan, registry index + 1, set by its
     * plan_build: variant_decode for decode-shaped items, variant_prefill for
     * prefill-shaped ones (src/attn/cpu/cpu_attn.h, "Dispatch seam"). */
    int32_t variant_decode, variant_prefill;
    int32_t variant_mla; /* the layer-level MLA items' kernel (kva_mla_run) */
    /* Groups of items a backend runs together (the CPU backend: decode items
     * of one request and key range over several kv heads, interleaved chunk
     * by chunk, src/attn/cpu/cpu_attn.h): group g is items [group_start[g],
     * group_start[g + 1]). NULL (num_groups 0) until a backend sets them. */
    int32_t num_groups;
    int32_t *group_start; /* [num_groups + 1] */
    /* Set by kva__partition_build_grid: the split candidate it kept (1..4:
     * chunk counts rounded up for k = 1..4 items per worker, 5..8: rounded
     * down, 9: forced, 0: unsplit), its makespan and estimate. */
    int32_t pick;
    int32_t decode_path; /* 1: built by the grid's decode path (partition_grid.c,
                            build_decodes; tests check that it ran) */
    int64_t makespan;    /* worker 0's load: the sum of its items' costs */
    int64_t estimate;    /* the grid's time the choice was made on (kva__partition_grid) */
    /* Memory kept for a rebuild (kva__partition_build_grid's reuse): the
     * capacities of items and tasks, and the grid builder's scratch (its
     * units and cost runs; NULL until a grid build made it). */
    int32_t cap_items, cap_tasks;
    struct kva__partition_scratch *scratch;
};

/* A persistent grid that runs a partition's items round-robin in their
 * order: worker b runs items b, b + slots, b + 2 slots, ... */
typedef struct kva__partition_grid {
    int64_t slots;        /* workers (resident CTAs), >= 1 */
    int32_t force_splits; /* > 0: cut every unit into this many chunks, at most its cap
                             (keys / min_split_keys, max_splits: a unit of fewer than
                             2 min_split_keys keys stays whole); < 0: the former choice
                             (four candidates by makespan alone); benchmarks, tests */
    /* The grid's time model (all 0: the makespan alone): a worker runs
     * alpha_pct / 100 times faster while the grid is not saturated (>= 100),
     * every item costs item_overhead more, a partition with splits
     * split_overhead more; in cost units (row-keys). */
    int32_t alpha_pct;
    int64_t item_overhead, split_overhead;
} kva__partition_grid;

/* Builds the partition of a plan whose metadata (query_start_loc, seq_lens,
 * d.*) is resolved. */
kva_status kva__partition_build(const kva_plan *plan, const kva__partition_params *params,
                                kva__partition **out);
/* The same for a subset of the requests: requests r with skip_req[r] != 0
 * (host array [R], or NULL for none) get no items (the CUDA backend runs them
 * in its tensor-core prefill kernel). */
kva_status kva__partition_build_subset(const kva_plan *plan, const kva__partition_params *params,
                                       const uint8_t *skip_req, kva__partition **out);
/*
 * The partition for a persistent grid (the CUDA backend): the split target is
 * chosen among candidates (no split; items of at most total / (slots * k)
 * cost, k = 1..4, chunk counts rounded up or down) by the grid's estimated
 * time (the makespan and grid's model), which is evaluated from the item
 * costs in closed form without building the candidates; only the winner is
 * built. params->num_threads and
 * items_per_thread are ignored. reuse: NULL, or a partition of an earlier
 * build (of any plan) that the new one is built in, taking over its memory
 * (arrays grown only when too small): it is consumed, returned as *out on
 * success and freed on failure. The result does not depend on reuse.
 */
kva_status kva__partition_build_grid(const kva_plan *plan, const kva__partition_params *params,
                                     const kva__partition_grid *grid, const uint8_t *skip_req,
                                     kva__partition *reuse, kva__partition **out);
/* Makespan of part's items on `slots` workers running them round-robin in
 * order, when the order is largest cost first: the load of worker 0. */
int64_t kva__partition_makespan(const kva__partition *part, int64_t slots);
void kva__partition_free(kva__partition *part);                     /* NULL is a no-op */
void kva__partition_scratch_free(struct kva__partition_scratch *s); /* NULL is a no-op */

/*
 * Keys [*lo, *hi) visible to query row i of a request with q_len q and
 * seq_len s (the semantics of kva_attention_run): pos = s - q + i; causal
 * limits keys to j <= pos, a window to pos - j <= window_left, a local-attention
 * chunk C to j >= pos - pos % C (kva__first_key). The visible
 * set of a row is always one contiguous range. For a sharded (DCP) plan, s
 * and pos are global and the range is mapped to the rank's local keys
 * (kva__dcp_local_count); it may be empty then, or after clipping by a caller.
 */
static inline void kva__row_keys(const kva_plan_desc *d, int32_t s, int32_t q, int32_t i,
                                 int32_t *lo, int32_t *hi)
{
    int32_t pos = s - q + i;
    *hi = d->causal ? pos + 1 : s;
    *lo = kva__first_key(pos, d->window_left, d->attention_chunk);
    if (d->dcp_size > 1) {
        *lo = (int32_t)kva__dcp_local_count(d, *lo);
        *hi = (int32_t)kva__dcp_local_count(d, *hi);
    }
}

#endif /* KVA_PARTITION_H */
