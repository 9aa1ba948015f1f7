/*
 * partition_grid.c - the partition for a persistent grid (the CUDA backend's
 * plan): the choice among split targets, in closed form, and the build of
 * the winner (kva__partition_build_grid, partition.h).
 *
 * The grid runs items round-robin, so the split target matters more than on
 * a dynamic schedule. The units are listed once (one per request, head slice
 * and query tile; the kv heads multiply them), identical neighbours merged
 * into groups. Each candidate target first gives every group its chunk
 * count (a candidate that asks every group for the same counts as an
 * earlier one cuts the same items, so it is not evaluated again); then its
 * item costs are listed as runs of equal cost, sorted, and the grid's
 * makespan read off them. Only the winner is built, every item placed at its
 * sorted position by counting (no comparison sort). Run every step, this is
 * most of a decode plan's host time: the per-group work has no division
 * where a comparison does, and a rebuild (reuse) allocates nothing once its
 * arrays are large enough.
 */
#include "partition_impl.h"
#include "sort_inline.h"

#include <stdlib.h>
#include <string.h>

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

/* Consecutive units [first, first + n) cut alike under any rule
 * (same_shape), with the first one's cost and chunk cap (ask_groups reads
 * them for every candidate). */
typedef struct unit_group {
    int64_t cost;
    int32_t first, n, cap;
} unit_group;

/* Candidates: 1..4 ceil, 5..8 floor, 9 forced, 0 unsplit. */
#define NUM_CANDIDATES 10

/* What a grid build keeps for the next one (kva__partition.scratch). */
struct kva__partition_scratch {
    kva__unit_list a;
    unit_group *groups;
    int32_t cap_groups;
    int32_t *asked; /* [cap_asked]: each candidate's chunk counts [ng] in turn */
    int32_t cap_asked;
    cost_run *runs[2]; /* the candidate's and the best one's [cap_runs[i]], the upper half merge
                          scratch */
    int32_t cap_runs[2];
    int64_t *dcost; /* [2 * (cap_dcost + 1)]: build_placed's costs and positions */
    int32_t cap_dcost;
    int32_t *elog; /* [2 * cap_elog]: build_placed's log of one request's kv head 0 items */
    int32_t cap_elog;
    int32_t decode_n; /* > 0: runs[0][0..decode_n) holds the order of the units that the
                         latest build's decode path wrote its items in (build_decodes) */
};

void kva__partition_scratch_free(struct kva__partition_scratch *s)
{
    if (!s)
        return;
    free(s->a.units);
    free(s->groups);
    free(s->asked);
    free(s->runs[0]);
    free(s->runs[1]);
    free(s->dcost);
    free(s->elog);
    free(s);
}

/* Whether units x and y are cut into the same item costs under any rule. */
static int same_shape(const kva_plan *plan, const kva__unit *x, const kva__unit *y)
{
    if (x->cost != y->cost || x->nh != y->nh || x->nq != y->nq || x->k0 != y->k0 || x->k1 != y->k1)
        return 0;
    if (x->nq == 1)
        return 1; /* chunk costs depend on the key range only */
    const int32_t qx = plan->query_start_loc[x->req + 1] - plan->query_start_loc[x->req];
    const int32_t qy = plan->query_start_loc[y->req + 1] - plan->query_start_loc[y->req];
    return x->i0 == y->i0 && qx == qy && plan->seq_lens[x->req] == plan->seq_lens[y->req];
}

/* Grows *p (elements of size sz) to hold n, keeping *cap; 0 when out of memory. */
static int grow(void **p, int32_t *cap, int64_t n, size_t sz)
{
    if (n <= *cap)
        return 1;
    if (n > INT32_MAX / 2)
        return 0;
    const int32_t c = (int32_t)(n + n / 2 + 16);
    void *q = realloc(*p, (size_t)c * sz);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* Merges consecutive units of the same shape into s->groups; returns the
 * group count, or -1 when out of memory. */
static int32_t list_groups(const kva_plan *plan, struct kva__partition_scratch *s)
{
    const kva__unit_list *a = &s->a;
    int32_t ng = 0;
    for (int32_t i = 0; i < a->n;) {
        int32_t j = i + 1;
        while (j < a->n && same_shape(plan, &a->units[i], &a->units[j]))
            j++;
        if (!grow((void **)&s->groups, &s->cap_groups, (int64_t)ng + 1, sizeof *s->groups))
            return -1;
        s->groups[ng].cost = a->units[i].cost;
        s->groups[ng].cap = a->units[i].cap;
        s->groups[ng].first = i;
        s->groups[ng++].n = j - i;
        i = j;
    }
    return ng;
}

/* The chunk counts rule sr asks of every group, into asked [ng]; returns
 * whether any group is split. */
static int ask_groups(const kva__split_rule *sr, const struct kva__partition_scratch *s, int32_t ng,
                      int32_t *asked)
{
    const unit_group *gr = s->groups;
    const int64_t t = sr->target;
    int any = 0;
    if (sr->forced > 0 || t <= 0) {
        for (int32_t g = 0; g < ng; g++) {
            asked[g] = (int32_t)kva__part_asked(sr, gr[g].cost, gr[g].cap);
            any |= asked[g] > 1;
        }
        return any;
    }
    /* kva__part_asked with the rule's branches out of the loop. */
    for (int32_t g = 0; g < ng; g++) {
        const int64_t c = gr[g].cost, cap = gr[g].cap;
        int64_t n = 1;
        if (cap >= 2 && c > t) {
            if (sr->floor)
                n = c >= t * cap ? cap : c < 2 * t ? 1 : c / t;
            else
                n = c > t * (cap - 1) ? cap : c <= 2 * t ? 2 : (c + t - 1) / t;
        }
        asked[g] = (int32_t)n;
        any |= n > 1;
    }
    return any;
}

/*
 * The makespan of the items the chunk counts asked [ng] cut the groups
 * into, on `slots` workers running them round-robin in cost order, without
 * building them: sorted by cost (largest first), worker b runs items b,
 * b + slots, ..., so worker 0 has the largest item of every round and at
 * least as many items as any other worker, and its load is the makespan:
 * the sum of the costs at positions 0, slots, 2 slots, ... of the sorted
 * list. Only the costs are listed, in s->runs[buf] as runs of equal cost (a
 * unit split into equal chunks is one run, a group one run per chunk cost).
 * *num_items gets the item count, *num_runs the runs, *sum_cost their total.
 * Returns -1 when out of memory.
 */
static int64_t groups_makespan(const kva_plan *plan, const kva__partition_params *pp,
                               const kva__split_rule *sr, struct kva__partition_scratch *s,
                               int32_t ng, const int32_t *asked, int buf, int64_t slots,
                               int64_t *num_items, int32_t *num_runs, int64_t *sum_cost)
{
    const int64_t hkv = plan->d.num_kv_heads;
    /* Runs: one for an unsplit group, two for a split one-row unit (the full
     * chunks and the last), one per chunk otherwise (at most the asked count). */
    int64_t need = 1;
    for (int32_t g = 0; g < ng; g++)
        need += asked[g] == 1 ? 1 : s->a.units[s->groups[g].first].nq == 1 ? 2 : asked[g];
    if (!grow((void **)&s->runs[buf], &s->cap_runs[buf], 2 * need, sizeof(cost_run)))
        return -1;
    cost_run *r = s->runs[buf];
    int32_t n = 0;
    for (int32_t g = 0; g < ng; g++) {
        kva__unit *u = &s->a.units[s->groups[g].first];
        const int64_t mult = hkv * s->groups[g].n;
        if (asked[g] == 1) {
            r[n].cost = u->cost, r[n++].count = mult;
            continue;
        }
        int32_t chunk = 0, a2 = 0;
        const int32_t ns = kva__part_unit_splits(pp, sr, u, &a2, &chunk);
        if (u->nq == 1) {
            const int32_t keys = u->k1 - u->k0, last = keys - (ns - 1) * chunk;
            r[n].cost = kva__part_chunk_cost(plan, u, 0, 0, 0, chunk),
            r[n++].count = (ns - 1) * mult;
            r[n].cost = kva__part_chunk_cost(plan, u, 0, 0, 0, last), r[n++].count = mult;
        } else {
            const int32_t sl = plan->seq_lens[u->req];
            const int32_t q_len = plan->query_start_loc[u->req + 1] - plan->query_start_loc[u->req];
            for (int32_t c = 0; c < ns; c++) {
                const int32_t lo = u->k0 + c * chunk, e = lo + chunk < u->k1 ? lo + chunk : u->k1;
                r[n].cost = kva__part_chunk_cost(plan, u, sl, q_len, lo, e), r[n++].count = mult;
            }
        }
    }
    sort_runs(r, r + s->cap_runs[buf] / 2, n); /* n <= need <= cap / 2 */
    /* Worker 0's positions (multiples of slots) in each run [pos, pos + count):
     * next0 is the first one not before pos; a division only for a run
     * longer than a round. */
    int64_t pos = 0, next0 = 0, worst = 0;
    *sum_cost = 0;
    for (int32_t i = 0; i < n; i++) {
        const int64_t end = pos + r[i].count;
        *sum_cost += r[i].cost * r[i].count;
        if (next0 < end) {
            const int64_t span = end - 1 - next0;
            const int64_t hits = 1 + (span < slots ? 0 : span / slots);
            worst += hits * r[i].cost;
            next0 += hits * slots;
        }
        pos = end;
    }
    *num_items = pos;
    *num_runs = n;
    return worst;
}

/*
 * Places the items of one request's n units (u [n]) for all hkv kv heads in
 * emission order (kv head, then unit) when rule sr splits none of them: the
 * cost bucket of each unit is looked up once, not once per kv head. Returns
 * 0 (nothing placed) when a unit is split; *ok = 0 when a bucket overflows.
 */
static int place_whole(kva__part_builder *b, const kva__partition_params *pp,
                       const kva__split_rule *sr, kva__unit *u, int32_t n, int32_t hkv, int *ok)
{
    for (int32_t k = 0; k < n; k++) {
        int32_t asked = 1, chunk = 0;
        if (kva__part_unit_splits(pp, sr, &u[k], &asked, &chunk) != 1)
            return 0;
        int32_t lo = 0, hi = b->ndist - 1; /* dcost descending, the unit's cost among them */
        while (lo < hi) {
            const int32_t mid = (lo + hi) / 2;
            if (b->dcost[mid] > u[k].cost)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (b->dcost[lo] != u[k].cost) {
            *ok = 0; /* cannot happen: the costs were listed by groups_makespan */
            return 1;
        }
        u[k].memo_bucket = lo;
    }
    /* One unit (every decode): its kv heads' items are consecutive in its
     * bucket, written from one template. */
    const int32_t per = n == 1 ? hkv : 1;
    for (int32_t kvh = 0; kvh < hkv; kvh += per)
        for (int32_t k = 0; k < n; k++) {
            const int64_t at = b->dnext[u[k].memo_bucket];
            b->dnext[u[k].memo_bucket] += per;
            if (at + per > b->cap_items) {
                *ok = 0;
                return 1;
            }
            kva__work_item t = {u[k].req, kvh,     u[k].h0, u[k].nh, u[k].i0,  u[k].nq,
                                u[k].k0,  u[k].k1, -1,      0,       u[k].cost};
            kva__work_item *it = &b->items[at];
            for (int32_t j = 0; j < per; j++, t.kv_head++)
                it[j] = t;
        }
    b->num_items += n * hkv;
    return 1;
}

/* A builder over part's item and task arrays (part gives them up, so a
 * rebuild in place reuses their capacity). */
static kva__part_builder take_arrays(kva__partition *part)
{
    kva__part_builder b;
    memset(&b, 0, sizeof b);
    b.items = part->items;
    b.cap_items = part->cap_items;
    b.tasks = part->tasks;
    b.cap_tasks = part->cap_tasks;
    part->items = NULL;
    part->tasks = NULL;
    return b;
}

/*
 * Builds the partition of rule sr whose item costs groups_makespan listed in
 * runs [nruns] (sorted, largest first; num_items items) into part (its
 * arrays reused where large enough): the items are emitted in tie order (per
 * request: kv head, head slice, query rows, keys) and placed at their sorted
 * position by cost (builder.place), so the result equals a build sorted by
 * item_before up to the numbering of the split tasks and their workspace
 * offsets, without a sort.
 */
static kva_status build_placed(const kva_plan *plan, const kva__partition_params *pp,
                               struct kva__partition_scratch *s, const kva__split_rule *sr,
                               const cost_run *runs, int32_t nruns, int64_t num_items,
                               kva__partition *part, kva__partition **out)
{
    kva__part_builder b = take_arrays(part);
    int ok = num_items < INT32_MAX &&
             grow((void **)&s->dcost, &s->cap_dcost, 2 * ((int64_t)nruns + 1), sizeof(int64_t)) &&
             grow((void **)&b.items, &b.cap_items, num_items + 1, sizeof *b.items);
    const int32_t cap_items = b.cap_items;
    int64_t partial_floats = 0;
    if (ok) {
        /* Distinct costs and the first position of each. */
        int64_t *dcost = s->dcost;
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
        b.cap_items = (int32_t)num_items; /* the placement's bound; restored below */
    }
    kva__unit_list *a = &s->a;
    for (int32_t i = 0; ok && i < a->n;) {
        int32_t j = i + 1;
        while (j < a->n && a->units[j].req == a->units[i].req)
            j++;
        if (place_whole(&b, pp, sr, a->units + i, j - i, plan->d.num_kv_heads, &ok)) {
            i = j;
            continue;
        }
        /* A unit of the request is split: kv head 0's items and tasks are
         * emitted (and logged), the other kv heads' are copies of them. */
        const int64_t nlog = (int64_t)(j - i) * pp->max_splits;
        ok = grow((void **)&s->elog, &s->cap_elog, 2 * nlog, sizeof(int32_t));
        b.log = s->elog;
        b.nlog = 0;
        b.cap_log = (int32_t)nlog;
        const int32_t task0 = b.num_tasks;
        for (int32_t u = i; ok && u < j; u++)
            ok = kva__part_emit_unit(&b, plan, pp, &a->units[u], 0, sr, &partial_floats);
        ok = ok && kva__part_copy_kv_heads(&b, plan, task0, plan->d.num_kv_heads, &partial_floats);
        b.log = NULL;
        i = j;
    }
    ok = ok && b.num_items == num_items;
    b.cap_items = cap_items;
    return kva__part_finish(plan, pp, part, &b, partial_floats, ok, out);
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

/*
 * A lower bound of the grid_estimate of the items the chunk counts asked
 * [ng] cut the groups into, in O(ng) and without listing or sorting their
 * costs; *num_items gets their exact count. A unit cut into n chunks costs
 * its own cost plus n - 1 item overheads in all (the chunks partition its
 * keys, so their row-keys and loads add up to the unit's), so the sum, and
 * with it the spread, is exact; worker 0's load is at least the largest
 * item, which is at least the mean chunk of every unit.
 */
static int64_t groups_bound(const kva__partition_grid *g, const kva_plan *plan,
                            const kva__partition_params *pp, const kva__split_rule *sr,
                            struct kva__partition_scratch *s, int32_t ng, const int32_t *asked,
                            int any_split, int64_t slots, int64_t *num_items)
{
    const int64_t hkv = plan->d.num_kv_heads;
    int64_t items = 0, sum = 0, big = 0;
    for (int32_t k = 0; k < ng; k++) {
        kva__unit *u = &s->a.units[s->groups[k].first];
        const int64_t mult = hkv * s->groups[k].n;
        int64_t n = 1, c = u->cost;
        if (asked[k] > 1) {
            int32_t a2 = 0, chunk = 0;
            n = kva__part_unit_splits(pp, sr, u, &a2, &chunk);
            c = u->cost + (n - 1) * KVA__ITEM_OVERHEAD;
        }
        items += n * mult;
        sum += c * mult;
        c = (c + n - 1) / n; /* u's largest chunk is at least the mean, rounded up */
        big = c > big ? c : big;
    }
    *num_items = items;
    return grid_estimate(g, slots, big, sum, items, any_split);
}

/*
 * Whether no candidate that splits a unit can beat the unsplit one (of grid
 * estimate e0, items0 items of total cost sum0), decided in O(ng) without
 * asking the groups once per candidate: a candidate that splits has more
 * items, at least the same total cost (a unit cut into n chunks costs its
 * own cost plus n - 1 item overheads) and pays the split overhead, so its
 * lower bound (groups_bound) is at least grid_estimate(0, sum0, items0,
 * split); when e0 lies strictly below that, the bound loop would skip every
 * splitting candidate. Most decode steps of a serving batch are such (the
 * total spread over the grid exceeds any one item). Then *rule and *pick
 * get the first candidate (1..8, build_grid's order) that splits nothing,
 * which the loop would have picked (its partition is candidate 0's), or
 * stay as they are when every candidate splits. Candidate c asks a group
 * with a cap of at least 2 chunks for more than one when its cost exceeds
 * the target t (rounded up, 1..4) or is at least 2 t (rounded down, 5..8),
 * as ask_groups does, so the largest such cost decides (maxc: the
 * largest cost of a group whose cap is at least 2, -1 for none). Needs
 * slots > 1 (every target is then total / (slots * k), at least 1).
 */
static int no_split_wins(const kva__partition_grid *g, int64_t maxc, int64_t total, int64_t slots,
                         int64_t sum0, int64_t items0, int64_t e0, kva__split_rule *rule,
                         int32_t *pick)
{
    if (e0 >= grid_estimate(g, slots, 0, sum0, items0, 1))
        return 0;
    for (int32_t c = 1; c <= 8; c++) {
        const int32_t k = c <= 4 ? c : c - 4;
        int64_t t = total / (slots * k);
        t = t < 1 ? 1 : t;
        if (c <= 4 ? maxc > t : maxc >= 2 * t)
            continue; /* splits a unit */
        const kva__split_rule sr = {t, c > 4, 0};
        *rule = sr;
        *pick = c;
        break;
    }
    return 1;
}

/*
 * The decode path of build_grid's bounded choice: when every unit is one
 * query row of its own request (decode steps: one head slice per kv head),
 * the groups, the runs and the placement by cost buckets reduce to the units
 * sorted by cost (largest first; ties in request order), each expanded into
 * its kv heads. The unsplit candidate's makespan and estimate are read off
 * that order as groups_makespan reads them off the runs (a run of equal
 * costs counts the same split into its units), and when no_split_wins holds
 * the items are written straight in their final order: the partition, pick,
 * makespan and estimate equal the general path's (test_plan_grid compares
 * them with the exhaustive build). Returns 0, having built nothing, when the
 * batch is not such a batch or a split may win (the general path decides);
 * 1 with *st the build's status otherwise.
 */
static int build_decodes(const kva_plan *plan, const kva__partition_params *pp,
                         const kva__partition_grid *grid, int64_t slots, int32_t prev_n,
                         kva__partition *part, kva__partition **out, kva_status *st)
{
    struct kva__partition_scratch *s = part->scratch;
    const kva__unit *u = s->a.units;
    const int32_t n = s->a.n, hkv = plan->d.num_kv_heads;
    int64_t cost = 0, maxc = -1;
    for (int32_t i = 0; i < n; i++) {
        if (u[i].nq != 1 || (i > 0 && u[i].req == u[i - 1].req))
            return 0; /* a query tile or a second head slice */
        cost += u[i].cost;
        if (u[i].cap >= 2 && u[i].cost > maxc)
            maxc = u[i].cost;
    }
    if (n < 1 || (int64_t)n * hkv >= INT32_MAX ||
        !grow((void **)&s->runs[0], &s->cap_runs[0], 2 * (int64_t)n, sizeof(cost_run)))
        return 0;
    cost_run *r = s->runs[0]; /* {cost, unit}: sorted by cost, stable */
    /* A decode step's units mostly sort as the previous step's did (every
     * request one key longer): that order is tried first. Largest cost first
     * with ties in unit order is a strict total order, so an order that
     * satisfies it is the stable sort's result. */
    int sorted = prev_n == n;
    for (int32_t i = 0; sorted && i < n; i++) {
        r[i].cost = u[r[i].count].cost;
        sorted = i == 0 || r[i - 1].cost > r[i].cost ||
                 (r[i - 1].cost == r[i].cost && r[i - 1].count < r[i].count);
    }
    if (!sorted) {
        for (int32_t i = 0; i < n; i++)
            r[i].cost = u[i].cost, r[i].count = i;
        sort_runs(r, r + n, n);
    }
    int64_t next0 = 0, t = 0; /* worker 0's load, as groups_makespan */
    for (int32_t i = 0; i < n; i++) {
        const int64_t end = (int64_t)(i + 1) * hkv;
        if (next0 < end) {
            const int64_t span = end - 1 - next0;
            const int64_t hits = 1 + (span < slots ? 0 : span / slots);
            t += hits * r[i].cost;
            next0 += hits * slots;
        }
    }
    const int64_t items = (int64_t)n * hkv, sum = cost * hkv;
    const int64_t e = grid_estimate(grid, slots, t, sum, items, 0);
    kva__split_rule rule = {0, 0, 0};
    int32_t pick = 0;
    if (!no_split_wins(grid, maxc, sum, slots, sum, items, e, &rule, &pick))
        return 0;
    kva__part_builder b = take_arrays(part);
    const int ok = grow((void **)&b.items, &b.cap_items, items + 1, sizeof *b.items);
    for (int32_t i = 0; ok && i < n; i++) {
        const kva__unit *x = &u[r[i].count];
        kva__work_item w = {x->req, 0, x->h0, x->nh, x->i0, x->nq, x->k0, x->k1, -1, 0, x->cost};
        kva__work_item *it = b.items + (int64_t)i * hkv;
        for (int32_t k = 0; k < hkv; k++, w.kv_head++)
            it[k] = w;
    }
    b.num_items = ok ? (int32_t)items : 0;
    s->decode_n = n; /* runs[0] keeps this order for the next build */
    kva__partition_params pq = *pp;
    pq.num_threads = (int32_t)(slots < INT32_MAX ? slots : INT32_MAX);
    *st = kva__part_finish(plan, &pq, part, &b, 0, ok, out);
    if (*st == KVA_STATUS_OK) {
        (*out)->pick = pick;
        (*out)->decode_path = 1;
        (*out)->makespan = t;
        (*out)->estimate = e;
    }
    return 1;
}

int64_t kva__partition_makespan(const kva__partition *part, int64_t slots)
{
    int64_t worst = 0;
    if (slots < 1)
        slots = 1;
    for (int64_t i = 0; i < part->num_items; i += slots)
        worst += part->items[i].cost; /* worker 0: see groups_makespan */
    return worst;
}

/* The partition to build in: reuse emptied (its arrays and scratch kept), or
 * a new one; NULL when out of memory (reuse freed). */
static kva__partition *take_partition(kva__partition *reuse)
{
    kva__partition *part = reuse ? reuse : calloc(1, sizeof *part);
    if (part && !part->scratch)
        part->scratch = calloc(1, sizeof *part->scratch);
    if (!part || !part->scratch) {
        kva__partition_free(part);
        return NULL;
    }
    kva__partition keep = *part;
    free(part->group_start);
    memset(part, 0, sizeof *part);
    part->items = keep.items;
    part->cap_items = keep.cap_items;
    part->tasks = keep.tasks;
    part->cap_tasks = keep.cap_tasks;
    part->scratch = keep.scratch;
    return part;
}

/* kva__partition_build_grid; exhaustive: every candidate evaluated in order
 * (kva__partition_build_grid_all). */
static kva_status build_grid(const kva_plan *plan, const kva__partition_params *params,
                             const kva__partition_grid *grid, const uint8_t *skip_req,
                             kva__partition *reuse, kva__partition **out, int exhaustive)
{
    kva__partition_params pp = kva__part_norm_params(params);
    pp.items_per_thread = 1;
    const int64_t slots = grid->slots > 0 ? grid->slots : 1;
    kva__partition *part = take_partition(reuse);
    if (!part)
        goto oom;
    struct kva__partition_scratch *s = part->scratch;
    s->a.n = 0;
    if (kva__part_list_units(&s->a, plan, &pp, skip_req) < 0)
        goto oom;
    const int bound = grid->force_splits == 0 && !exhaustive;
    kva_status dst = KVA_STATUS_OK;
    const int32_t prev_n = s->decode_n;
    s->decode_n = 0; /* set again only where build_decodes writes the items */
    if (bound && slots > 1 && build_decodes(plan, &pp, grid, slots, prev_n, part, out, &dst))
        return dst; /* decodes that no split can speed up */
    const int32_t ng = list_groups(plan, s);
    if (ng < 0 || !grow((void **)&s->asked, &s->cap_asked, (int64_t)NUM_CANDIDATES * ng + 1,
                        sizeof *s->asked))
        goto oom;
    const int64_t total = kva__part_units_total(plan, &s->a);
    /* Candidates 1..4: items of at most total / (slots * k) (chunk counts
     * rounded up, the CPU's rule); 5..8: the same targets rounded down, so a
     * unit is cut into as many chunks as fit, not one more (16 decodes x 8
     * kv heads on 264 CTAs: 2 chunks each fill one round; rounded up, 3 take
     * two); 0: no split. The lowest grid_estimate wins; ties go to fewer
     * items, then to the earlier candidate (order 1..8, 0). force_splits < 0
     * keeps the former choice: candidates 1..4 by makespan alone. A
     * candidate asking every group for the same chunk counts as an earlier
     * one has that one's estimate and items, so it cannot win: skipped. */
    kva__split_rule best = {0, 0, 0};
    int32_t best_pick = -1, best_nruns = 0, nseen = 0;
    int64_t best_e = 0, best_t = 0, best_items = 0;
    int cur = 0; /* the runs buffer a candidate fills; the best one's is 1 - cur */
    const int former = grid->force_splits < 0;
    /*
     * Under the time model (not the former choice or a forced count) the
     * unsplit candidate 0 is evaluated first, as the best so far: ties with
     * it go to the other candidate (which comes before it in the order), one
     * that splits no unit is the same partition (no second listing), and a
     * candidate whose lower bound (groups_bound) already loses to the best
     * is not listed either. The winner is the same as the one of evaluating
     * every candidate in order (exhaustive); a decode step mostly lists one
     * candidate instead of two or more.
     */
    if (bound) {
        int32_t nruns = 0;
        int64_t sum = 0;
        (void)ask_groups(&best, s, ng, s->asked); /* all 1: target 0 splits nothing */
        best_t = groups_makespan(plan, &pp, &best, s, ng, s->asked, cur, slots, &best_items, &nruns,
                                 &sum);
        if (best_t < 0)
            goto oom;
        best_e = grid_estimate(grid, slots, best_t, sum, best_items, 0);
        best_pick = 0;
        best_nruns = nruns;
        cur = 1 - cur;
        int64_t maxc = -1;
        for (int32_t k = 0; k < ng; k++)
            if (s->groups[k].cap >= 2 && s->groups[k].cost > maxc)
                maxc = s->groups[k].cost;
        if (slots > 1 &&
            no_split_wins(grid, maxc, total, slots, sum, best_items, best_e, &best, &best_pick))
            goto build;
    }
    for (int32_t i = 1; i <= 10; i++) {
        const int32_t c = i == 10 ? 0 : i; /* 1..9, then 0 */
        if (c == 0 && bound)
            break; /* evaluated first */
        kva__split_rule sr = {0, 0, 0};
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
        int32_t *asked = s->asked + (size_t)nseen * (size_t)ng;
        const int any_split = ask_groups(&sr, s, ng, asked);
        int seen = 0;
        for (int32_t k = 0; k < nseen && !seen; k++)
            seen = !memcmp(s->asked + (size_t)k * (size_t)ng, asked, sizeof(int32_t) * (size_t)ng);
        if (seen)
            continue;
        nseen++;
        if (bound && !any_split) { /* candidate 0's items, and before it */
            if (best_pick == 0) {
                best = sr;
                best_pick = c;
            }
            continue;
        }
        /* A candidate whose lower bound already loses to the best so far
         * (ties: fewer items, then the earlier candidate, which the best is
         * unless it is candidate 0) cannot win: its costs are not listed. */
        if (bound) {
            int64_t lb_items = 0;
            const int64_t lb =
                groups_bound(grid, plan, &pp, &sr, s, ng, asked, any_split, slots, &lb_items);
            if (lb > best_e || (lb == best_e && (lb_items > best_items ||
                                                 (lb_items == best_items && best_pick != 0))))
                continue;
        }
        int64_t items = 0, sum = 0;
        int32_t nruns = 0;
        const int64_t t =
            groups_makespan(plan, &pp, &sr, s, ng, asked, cur, slots, &items, &nruns, &sum);
        if (t < 0)
            goto oom;
        const int64_t e = former ? t : grid_estimate(grid, slots, t, sum, items, any_split);
        if (best_pick < 0 || e < best_e ||
            (!former && e == best_e &&
             (items < best_items || (items == best_items && best_pick == 0)))) {
            best = sr;
            best_pick = c;
            best_e = e;
            best_t = t;
            best_items = items;
            best_nruns = nruns;
            cur = 1 - cur;
        }
    }
build:
    pp.num_threads = (int32_t)(slots < INT32_MAX ? slots : INT32_MAX);
    kva_status st =
        build_placed(plan, &pp, s, &best, s->runs[1 - cur], best_nruns, best_items, part, out);
    if (st == KVA_STATUS_OK) {
        (*out)->pick = best_pick;
        (*out)->makespan = best_t;
        (*out)->estimate = best_e;
    }
    return st;
oom:
    kva__partition_free(part);
    return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                     "kva_plan_create: out of memory partitioning %d requests",
                     (int)plan->d.num_requests);
}

kva_status kva__partition_build_grid(const kva_plan *plan, const kva__partition_params *params,
                                     const kva__partition_grid *grid, const uint8_t *skip_req,
                                     kva__partition *reuse, kva__partition **out)
{
    return build_grid(plan, params, grid, skip_req, reuse, out, 0);
}

kva_status kva__partition_build_grid_all(const kva_plan *plan, const kva__partition_params *params,
                                         const kva__partition_grid *grid, const uint8_t *skip_req,
                                         kva__partition *reuse, kva__partition **out)
{
    return build_grid(plan, params, grid, skip_req, reuse, out, 1);
}
