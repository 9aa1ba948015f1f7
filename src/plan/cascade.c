/*
 * cascade.c - shared-prefix (cascade) plans: the grouping, the choice and the
 * two passes (docs/cascade.md; the run is src/attn/cascade.c).
 *
 * Requests whose block-table rows begin with the same block ids hold the same
 * keys there (the pool's prefix cache hands one block to every request with
 * the same prompt prefix). A group's shared prefix is attended once with all
 * its query rows together, a GEMM-shaped pass over one copy of the keys, and
 * each request's remaining keys as usual; the two are merged by their LSE.
 * The prefix must end at or before every member's first query (P <= seq_len
 * - q_len), so it is wholly visible to every row under the causal mask and
 * the prefix pass runs non-causally. Groups nest: members of a group that
 * share more blocks form a subgroup, which attends only the blocks after
 * its parent's prefix; each level is merged by LSE in turn. Positions do not carry over to the
 * split parts, so ALiBi and sliding windows decline the cascade; the sinks
 * join the suffix pass only, which counts them once.
 */
#include "internal.h"
#include "sort_inline.h"

#include <stdlib.h>
#include <string.h>

static const char fn[] = "kva_plan_create";

/* The query rows of request r. */
static int32_t q_len_of(const kva_plan *p, int32_t r)
{
    return p->query_start_loc[r + 1] - p->query_start_loc[r];
}

/* Blocks request r may share: those wholly before its first query. */
static int32_t shareable_blocks(const kva_plan *p, int32_t r)
{
    return (p->seq_lens[r] - q_len_of(p, r)) / p->d.block_size;
}

/* Checks a given grouping against the block table; fills grp [R] (each
 * request's deepest group, -1 for requests with q_len 0), plen [G] (blocks)
 * and par [G] (parent group or -1). Every member of a group holds the
 * group's first member's block ids over the group's whole prefix, its
 * ancestors' prefixes included. */
static kva_status check_grouping(const kva_plan_desc *desc, const kva_plan *p, int32_t *grp,
                                 int32_t *plen, int32_t *par)
{
    const int32_t R = p->d.num_requests, G = desc->num_cascade_groups, B = p->d.block_size;
    const int32_t stride = p->d.block_table_stride;
    if (G > 0 && !desc->cascade_prefix_len)
        return kva__fail(KVA_STATUS_NULL_POINTER,
                         "%s: desc->cascade_prefix_len is NULL with num_cascade_groups = %d", fn,
                         (int)G);
    if (!p->block_table)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: a cascade grouping needs a block_table (its groups share blocks)",
                         fn);
    for (int32_t g = 0; g < G; g++) {
        const int32_t len = desc->cascade_prefix_len[g];
        if (len <= 0 || len % B != 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: cascade_prefix_len[%d] = %d, must be a positive multiple of "
                             "block_size = %d",
                             fn, (int)g, (int)len, (int)B);
        plen[g] = len / B;
        par[g] = desc->cascade_parent ? desc->cascade_parent[g] : -1;
        if (par[g] < -1 || par[g] >= g)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: cascade_parent[%d] = %d, must be -1 or a group before it "
                             "(0 .. %d)",
                             fn, (int)g, (int)par[g], (int)g - 1);
        if (par[g] >= 0 && plen[par[g]] >= plen[g])
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: cascade group %d shares %d tokens, not more than its parent "
                             "group %d (%d)",
                             fn, (int)g, (int)len, (int)par[g], (int)(plen[par[g]] * B));
        int32_t depth = 1;
        for (int32_t a = par[g]; a >= 0; a = par[a])
            depth++;
        if (depth > KVA_MAX_CASCADE_LEVELS)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: cascade group %d nests %d levels deep (at most %d)", fn, (int)g,
                             (int)depth, (int)KVA_MAX_CASCADE_LEVELS);
    }
    int32_t *first = malloc(sizeof(int32_t) * (size_t)(G > 0 ? G : 1));
    if (!first)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int32_t g = 0; g < G; g++)
        first[g] = -1;
    kva_status st = KVA_STATUS_OK;
    for (int32_t r = 0; r < R && st == KVA_STATUS_OK; r++) {
        const int32_t g = desc->cascade_group[r];
        grp[r] = -1;
        if (g < -1 || g >= G) {
            st = kva__fail(KVA_STATUS_OUT_OF_RANGE,
                           "%s: cascade_group[%d] = %d is outside [-1, num_cascade_groups = %d)",
                           fn, (int)r, (int)g, (int)G);
            break;
        }
        if (g < 0 || q_len_of(p, r) == 0)
            continue;
        if (shareable_blocks(p, r) < plen[g]) {
            st = kva__fail(KVA_STATUS_OUT_OF_RANGE,
                           "%s: request %d of cascade group %d: cascade_prefix_len[%d] = %d must "
                           "end at or before its first query (seq_len %d - q_len %d)",
                           fn, (int)r, (int)g, (int)g, (int)(plen[g] * B), (int)p->seq_lens[r],
                           (int)q_len_of(p, r));
            break;
        }
        grp[r] = g;
        for (int32_t a = g; a >= 0 && st == KVA_STATUS_OK; a = par[a]) {
            if (first[a] < 0) {
                first[a] = r;
                continue;
            }
            const int32_t *x = p->block_table + (int64_t)first[a] * stride;
            const int32_t *y = p->block_table + (int64_t)r * stride;
            for (int32_t j = 0; j < plen[a]; j++)
                if (x[j] != y[j]) {
                    st = kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                   "%s: cascade group %d does not share its prefix: block %d of "
                                   "request %d is %d, of request %d (the group's first) %d",
                                   fn, (int)a, (int)j, (int)r, (int)y[j], (int)first[a], (int)x[j]);
                    break;
                }
        }
    }
    free(first);
    return st;
}

/* Orders the keys (first block id << 32 | request) of find_groups; they
 * are distinct, so any sort gives one order (sort_inline.h: no qsort call
 * per comparison, every plan of a cascade-capable backend sorts them). */
static inline int key_before(const int64_t *x, const int64_t *y)
{
    return *x < *y;
}
KVA__DEFINE_SORT(sort_keys, int64_t, key_before, 16)

/* Among the n requests key [0..n) (block id at index `at` << 32 | request,
 * sorted), makes each run of two or more with the same block id a group of
 * parent `parent` (its members' grp set to it) sharing the longest run of
 * blocks from `at` that all of them hold and can share. */
static void group_runs(const kva_plan *p, int64_t *key, int32_t n, int32_t at, int32_t parent,
                       int32_t *grp, int32_t *plen, int32_t *par, int32_t *num_groups)
{
    const int64_t stride = p->d.block_table_stride;
    sort_keys(key, key + p->d.num_requests, n); /* key [2R]: the upper half is scratch */
    for (int32_t i = 0; i < n;) {
        const int32_t r0 = (int32_t)(key[i] & 0xffffffff);
        const int32_t *a = p->block_table + r0 * stride;
        int32_t j = i + 1, len = shareable_blocks(p, r0);
        while (j < n && key[j] >> 32 == key[i] >> 32) {
            const int32_t rj = (int32_t)(key[j] & 0xffffffff);
            const int32_t *b = p->block_table + rj * stride;
            const int32_t cap = shareable_blocks(p, rj);
            len = cap < len ? cap : len;
            int32_t k = at + 1;
            while (k < len && a[k] == b[k])
                k++;
            len = k;
            j++;
        }
        if (j - i >= 2) {
            for (int32_t k = i; k < j; k++)
                grp[key[k] & 0xffffffff] = *num_groups;
            par[*num_groups] = parent;
            plen[(*num_groups)++] = len;
        }
        i = j;
    }
}

/* Finds groups: requests with the same first block id, sharing the longest
 * run of leading blocks all of them can share (at least one); then, group
 * by group (parents before children), the members that share more blocks
 * than their group form subgroups in the same way, down to
 * KVA_MAX_CASCADE_LEVELS levels. */
static kva_status find_groups(const kva_plan *p, int32_t *grp, int32_t *plen, int32_t *par,
                              int32_t *num_groups)
{
    const int32_t R = p->d.num_requests;
    const int64_t stride = p->d.block_table_stride;
    int64_t *key = malloc(sizeof(int64_t) * 2 * (size_t)(R > 0 ? R : 1));
    int32_t *depth = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    if (!key || !depth) {
        free(key);
        free(depth);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int32_t n = 0, G = 0;
    for (int32_t r = 0; r < R; r++) {
        grp[r] = -1;
        if (q_len_of(p, r) > 0 && shareable_blocks(p, r) >= 1)
            key[n++] = (int64_t)p->block_table[r * stride] << 32 | r;
    }
    group_runs(p, key, n, 0, -1, grp, plen, par, &G);
    for (int32_t g = 0; g < G; g++) {
        depth[g] = par[g] < 0 ? 1 : depth[par[g]] + 1;
        if (depth[g] >= KVA_MAX_CASCADE_LEVELS)
            continue;
        n = 0;
        for (int32_t r = 0; r < R; r++)
            if (grp[r] == g && shareable_blocks(p, r) > plen[g])
                key[n++] = (int64_t)p->block_table[r * stride + plen[g]] << 32 | r;
        group_runs(p, key, n, plen[g], g, grp, plen, par, &G);
    }
    free(key);
    free(depth);
    *num_groups = G;
    return KVA_STATUS_OK;
}

/* Why the plan cannot run a cascade, or NULL if it can. */
static const char *decline_reason(const kva_context *ctx, const kva_plan *p)
{
    if (!ctx->ops->cascade_gather)
        return "the backend has no cascade passes";
    if (p->d.kind != KVA_ATTN_MHA)
        return "MLA plans do not cascade";
    if (p->d.dcp_size > 1)
        return "sharded (DCP) plans do not cascade";
    if (p->alibi_slopes)
        return "ALiBi biases depend on positions the split passes do not keep";
    if (p->d.window_left >= 0)
        return "a sliding window depends on positions the split passes do not keep";
    if (p->d.attention_chunk > 0)
        return "a local chunk (attention_chunk) depends on positions the split passes do not keep";
    if (p->tree_bits)
        return "draft-tree masks are not split into the prefix and suffix passes";
    if (!p->block_table)
        return "the plan has no block_table";
    return NULL;
}

/* Sets keep[0..G) to 0. */
static void keep_none(int32_t G, int32_t *keep)
{
    for (int32_t g = 0; g < G; g++)
        keep[g] = 0;
}

/* The cost model: keeps the groups of at least 256 shared keys and 4 rows
 * whose estimated time with the cascade (one read of the prefix at prefill
 * rates, plus the merge) beats the plain plan's (every member re-reads it at
 * decode rates), and declines all if the sum of their gains does not cover
 * the extra passes' fixed cost (once per level). A nested group's prefix is
 * its part after its nearest kept ancestor's, its rows those of every
 * request in it or in its subgroups; groups come parents first. */
static void choose_groups(const kva_context *ctx, const kva_plan *p, const int32_t *grp, int32_t G,
                          const int32_t *plen, const int32_t *par, int32_t *keep)
{
    kva__cascade_cost cc = {0};
    if (!ctx->ops->cascade_cost || ctx->ops->cascade_cost(ctx, &cc) != KVA_STATUS_OK) {
        keep_none(G, keep);
        return;
    }
    const kva_plan_desc *d = &p->d;
    const double es = (double)kva_dtype_size(d->q_dtype);
    const double kvb = (double)d->num_kv_heads * (d->head_dim + d->head_dim_v) * es;
    double *n = calloc((size_t)G * 2 + 1, sizeof(double)), *m = n ? n + G : NULL;
    int32_t *depth = malloc(sizeof(int32_t) * (size_t)(G > 0 ? G : 1));
    if (!n || !depth) {
        free(n);
        free(depth);
        keep_none(G, keep);
        return;
    }
    for (int32_t r = 0; r < d->num_requests; r++)
        for (int32_t a = grp[r]; a >= 0; a = par[a]) {
            n[a] += 1.0;
            m[a] += q_len_of(p, r);
        }
    double gain = 0.0;
    int32_t levels = 0;
    for (int32_t g = 0; g < G; g++) {
        int32_t up = par[g];
        while (up >= 0 && !keep[up])
            up = par[up];
        const double P = (double)(plen[g] - (up >= 0 ? plen[up] : 0)) * d->block_size;
        const double flops = 2.0 * m[g] * d->num_heads * P * (d->head_dim + d->head_dim_v);
        const int cached = cc.reread_max <= 0.0 || P * kvb <= cc.reread_max;
        const double plain_read = n[g] * P * kvb / (cached ? cc.reread_bw : cc.read_bw);
        const double plain_math = flops / cc.decode_flops;
        const double casc_read = P * kvb / cc.read_bw;
        const double lanes = m[g] * d->num_heads / d->num_kv_heads;
        const double fill =
            cc.prefix_rows > 0.0 && lanes < cc.prefix_rows ? lanes / cc.prefix_rows : 1.0;
        const double casc_math = flops / (cc.prefix_flops * fill);
        const double merge = 4.0 * m[g] * d->num_heads * (d->head_dim_v * es + 4.0) / cc.read_bw;
        const double g_gain = (plain_read > plain_math ? plain_read : plain_math) -
                              (casc_read > casc_math ? casc_read : casc_math) - merge;
        /* As vLLM's use_cascade_attention: short prefixes and groups of few
         * rows never pay for the extra passes. */
        keep[g] = g_gain > 0.0 && P >= 256.0 && m[g] >= 4.0;
        depth[g] = up >= 0 ? depth[up] + 1 : 1;
        if (keep[g]) {
            gain += g_gain;
            levels = depth[g] > levels ? depth[g] : levels;
        }
    }
    if (gain <= cc.fixed_s * levels)
        keep_none(G, keep);
    free(n);
    free(depth);
}

void kva__cascade_free(kva_plan *p)
{
    kva__cascade *c = p->cascade;
    if (!c)
        return;
    kva_plan_destroy(c->prefix);
    kva_plan_destroy(c->suffix);
    free(c->gather);
    free(c->merge);
    free(c);
    p->cascade = NULL;
}

/* The aux context of ctx (created on first use), with ctx's forced kernels. */
static kva_status aux_context(kva_context *ctx, kva_context **out)
{
    if (!ctx->aux) {
        const kva_context_desc cd = {ctx->backend, ctx->num_threads, ctx->device_id};
        KVA_TRY(kva_context_create(&cd, &ctx->aux));
    }
    memcpy(ctx->aux->forced_kernel, ctx->forced_kernel, sizeof ctx->forced_kernel);
    if (ctx->ops->cascade_follow)
        KVA_TRY(ctx->ops->cascade_follow(ctx->aux, ctx));
    *out = ctx->aux;
    return KVA_STATUS_OK;
}

/* Key chunks per group: enough (prefill tiles x chunks) to fill the
 * backend's parallel units, each chunk at least 16 blocks (and 256 keys). */
static int32_t chunks_for(const kva_context *ctx, const kva_plan *p, int32_t G, int32_t rows,
                          int32_t min_blocks)
{
    kva__cascade_cost cc = {0};
    if (!ctx->ops->cascade_cost || ctx->ops->cascade_cost(ctx, &cc) != KVA_STATUS_OK ||
        cc.units <= 0)
        return 1;
    const int64_t grp_rows = (int64_t)rows / G * (p->d.num_heads / p->d.num_kv_heads);
    const int64_t tiles = (int64_t)G * p->d.num_kv_heads * ((grp_rows + 127) / 128);
    int64_t c = (cc.units + tiles - 1) / tiles;
    int64_t min_chunk = 16, by_keys = (256 + p->d.block_size - 1) / p->d.block_size;
    if (by_keys > min_chunk)
        min_chunk = by_keys;
    const int64_t cap = min_blocks / min_chunk;
    if (c > cap)
        c = cap;
    if (c > 32)
        c = 32;
    return c < 1 ? 1 : (int32_t)c;
}

/* Builds the two passes of the groups grp/plen/par (G groups, all kept and
 * with rows, parents first; plen is where each group's prefix ends, in
 * blocks, and it starts where its parent's ends). */
static kva_status build(kva_context *ctx, kva_plan *p, const int32_t *grp, int32_t G,
                        const int32_t *plen, const int32_t *par, kva__cascade *c)
{
    const kva_plan_desc *d = &p->d;
    const int32_t R = d->num_requests, T = p->info.num_tokens, B = d->block_size;
    const int64_t stride = d->block_table_stride;
    /* Per group: first prefix row (row0 [G + 1]), a member whose block-table
     * row holds the prefix (lead), level, first block (b0), rows filled. */
    int32_t *row0 = calloc((size_t)G * 5 + 1, sizeof(int32_t));
    int32_t *lead = row0 ? row0 + G + 1 : NULL, *lev = lead ? lead + G : NULL;
    int32_t *b0 = lev ? lev + G : NULL, *fill = b0 ? b0 + G : NULL;
    if (!row0)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    int32_t L = 1;
    for (int32_t g = 0; g < G; g++) {
        lead[g] = -1;
        lev[g] = par[g] >= 0 ? lev[par[g]] + 1 : 0;
        b0[g] = par[g] >= 0 ? plen[par[g]] : 0;
        L = lev[g] + 1 > L ? lev[g] + 1 : L;
    }
    /* A request's rows join its group and every ancestor of it. */
    for (int32_t r = 0; r < R; r++)
        for (int32_t a = grp[r]; a >= 0; a = par[a]) {
            row0[a + 1] += q_len_of(p, r);
            if (lead[a] < 0)
                lead[a] = r;
        }
    for (int32_t g = 0; g < G; g++)
        row0[g + 1] += row0[g];
    const int32_t M = row0[G];
    c->merge = malloc(sizeof(int32_t) * (size_t)L * (size_t)(T > 0 ? T : 1));
    c->gather = malloc(sizeof(int32_t) * (size_t)(M > 0 ? M : 1));
    if (!c->merge || !c->gather) {
        free(row0);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int32_t min_blocks = INT32_MAX;
    for (int32_t g = 0; g < G; g++) {
        fill[g] = row0[g];
        min_blocks = plen[g] - b0[g] < min_blocks ? plen[g] - b0[g] : min_blocks;
    }
    for (int64_t t = 0; t < (int64_t)L * T; t++)
        c->merge[t] = -1;
    for (int32_t r = 0; r < R; r++)
        for (int32_t a = grp[r]; a >= 0; a = par[a])
            for (int32_t i = 0; i < q_len_of(p, r); i++) {
                const int32_t t = p->query_start_loc[r] + i;
                c->merge[(int64_t)lev[a] * T + t] = fill[a];
                c->gather[fill[a]++] = t;
            }
    const int32_t C = chunks_for(ctx, p, G, M, min_blocks);
    c->num_groups = G;
    c->num_levels = L;
    c->num_chunks = C;
    c->rows = M;

    /* The prefix pass: virtual request (k, g) = G * k + g reads blocks
     * b0 + [len * k / C, len * (k + 1) / C) of group g's lead row, len =
     * plen - b0 its part of the prefix. */
    const int32_t NR = G * C;
    int32_t pstride = 0;
    for (int32_t g = 0; g < G; g++) {
        const int32_t per = (plen[g] - b0[g] + C - 1) / C;
        pstride = per > pstride ? per : pstride;
    }
    int32_t *pq = malloc(sizeof(int32_t) * ((size_t)NR + 1));
    int32_t *ps = malloc(sizeof(int32_t) * (size_t)NR);
    int32_t *pbt = calloc((size_t)NR * (size_t)pstride, sizeof(int32_t));
    int32_t *ss = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    int32_t *sbt =
        calloc((size_t)(R > 0 ? R : 1) * (size_t)(stride > 0 ? stride : 1), sizeof(int32_t));
    kva_status st = KVA_STATUS_OK;
    if (!pq || !ps || !pbt || !ss || !sbt)
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int32_t k = 0; k < C && st == KVA_STATUS_OK; k++)
        for (int32_t g = 0; g < G; g++) {
            const int32_t v = G * k + g, len = plen[g] - b0[g];
            const int32_t k0 = b0[g] + (int32_t)((int64_t)len * k / C);
            const int32_t k1 = b0[g] + (int32_t)((int64_t)len * (k + 1) / C);
            pq[v] = M * k + row0[g];
            ps[v] = (k1 - k0) * B;
            memcpy(pbt + (int64_t)v * pstride, p->block_table + lead[g] * stride + k0,
                   sizeof(int32_t) * (size_t)(k1 - k0));
        }
    if (st == KVA_STATUS_OK) {
        pq[NR] = M * C;
        /* The suffix pass: each request's keys after its deepest group's prefix. */
        for (int32_t r = 0; r < R; r++) {
            const int32_t skip = grp[r] >= 0 ? plen[grp[r]] : 0;
            ss[r] = p->seq_lens[r] - skip * B;
            if (stride > skip)
                memcpy(sbt + r * stride, p->block_table + r * stride + skip,
                       sizeof(int32_t) * (size_t)(stride - skip));
        }
        kva_plan_desc pd = *d, sd = *d;
        pd.num_requests = NR;
        pd.query_start_loc = pq;
        pd.seq_lens = ps;
        pd.block_table = pbt;
        pd.block_table_stride = pstride;
        pd.causal = 0;
        pd.cascade = KVA_CASCADE_OFF;
        pd.num_cascade_groups = 0;
        pd.cascade_group = NULL;
        pd.cascade_parent = NULL;
        sd.query_start_loc = p->query_start_loc;
        sd.seq_lens = ss;
        sd.block_table = sbt;
        sd.cascade = KVA_CASCADE_OFF;
        sd.num_cascade_groups = 0;
        sd.cascade_group = NULL;
        sd.cascade_parent = NULL;
        kva_context *aux = NULL;
        st = aux_context(ctx, &aux);
        if (st == KVA_STATUS_OK)
            st = kva_plan_create(aux, &pd, &c->prefix);
        if (st == KVA_STATUS_OK)
            st = kva_plan_create(ctx, &sd, &c->suffix);
        c->aux = aux;
    }
    free(pq);
    free(ps);
    free(pbt);
    free(ss);
    free(sbt);
    free(row0);
    return st;
}

/* Lays out the buffers in aux's workspace past the prefix plan's bytes and
 * reserves it. */
static kva_status reserve_buffers(kva_plan *p, kva__cascade *c)
{
    const kva_plan_desc *d = &p->d;
    const size_t es = kva_dtype_size(d->q_dtype), H = (size_t)d->num_heads;
    const size_t CM = (size_t)c->num_chunks * (size_t)c->rows, T = (size_t)p->info.num_tokens;
    size_t at = c->prefix->workspace_bytes;
#define KVA_CASCADE_PLACE(field, bytes)                                                            \
    do {                                                                                           \
        at = (at + 255) & ~(size_t)255;                                                            \
        c->field = at;                                                                             \
        at += (bytes);                                                                             \
    } while (0)
    KVA_CASCADE_PLACE(off_q, CM * H * (size_t)d->head_dim * es);
    KVA_CASCADE_PLACE(off_out, CM * H * (size_t)d->head_dim_v * es);
    KVA_CASCADE_PLACE(off_lse, CM * H * sizeof(float));
    KVA_CASCADE_PLACE(off_lse_suf, T * H * sizeof(float));
    KVA_CASCADE_PLACE(off_tmp, H * ((size_t)d->head_dim_v * es + sizeof(float)) + 256);
    KVA_CASCADE_PLACE(off_idx, ((size_t)c->rows + (size_t)c->num_levels * T) * sizeof(int32_t));
#undef KVA_CASCADE_PLACE
    c->aux_bytes = at;
    return kva__context_reserve_workspace(c->aux, at);
}

/*
 * Whether the automatic choice (choose_groups) could keep a group of any
 * grouping of p. Without a cost model it keeps none. With one, a group's
 * gain is at most its plain time, the larger of its members' re-reads of
 * its prefix and their math, which is at most the sum over its members of
 * the larger of each one's re-read and math; and over the kept groups of
 * any grouping a request counts each of its shareable keys at most once
 * (the prefixes of the kept groups it is in follow each other). So the
 * gains add up to at most the sum over the requests of the larger of the
 * re-read and the math of all their shareable keys. Below the fixed cost of
 * one level no group is kept, and the groups need not be found (most decode
 * steps of a serving engine: O(R), no sort). A margin covers the rounding.
 */
static int auto_may_keep(const kva_context *ctx, const kva_plan *p)
{
    kva__cascade_cost cc = {0};
    if (!ctx->ops->cascade_cost || ctx->ops->cascade_cost(ctx, &cc) != KVA_STATUS_OK)
        return 0;
    const kva_plan_desc *d = &p->d;
    const double es = (double)kva_dtype_size(d->q_dtype);
    /* Re-reads at reread_bw, or at the slower of the two rates where large
     * prefixes are read at read_bw (reread_max > 0). */
    double bw = cc.reread_bw;
    if (cc.reread_max > 0.0 && cc.read_bw < bw)
        bw = cc.read_bw;
    const double read = (double)d->num_kv_heads * (d->head_dim + d->head_dim_v) * es / bw;
    const double math = 2.0 * d->num_heads * (d->head_dim + d->head_dim_v) / cc.decode_flops;
    double plain = 0.0; /* seconds */
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q = q_len_of(p, r), sb = shareable_blocks(p, r);
        if (q > 0 && sb >= 1)
            plain += (double)sb * d->block_size * (read > q * math ? read : q * math);
    }
    return !(plain < 0.999 * cc.fixed_s);
}

kva_status kva__cascade_plan(kva_context *ctx, const kva_plan_desc *desc, kva_plan *p)
{
    const int32_t R = p->d.num_requests, G0 = desc->num_cascade_groups;
    if ((unsigned)desc->cascade >= (unsigned)KVA_CASCADE_MODE_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: cascade = %d is not a kva_cascade_mode (0 .. %d)", fn,
                         (int)desc->cascade, (int)KVA_CASCADE_MODE_COUNT_ - 1);
    if (G0 < 0 || G0 > (R > 0 ? R : 0))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_cascade_groups = %d is outside [0, num_requests = %d]", fn,
                         (int)G0, (int)R);
    if (G0 > 0 && !desc->cascade_group)
        return kva__fail(KVA_STATUS_NULL_POINTER,
                         "%s: desc->cascade_group is NULL with num_cascade_groups = %d", fn,
                         (int)G0);
    const int given = desc->cascade_group != NULL && R > 0;
    if (!given && desc->cascade == KVA_CASCADE_OFF)
        return KVA_STATUS_OK;
    const char *why = decline_reason(ctx, p);
    if (why && desc->cascade == KVA_CASCADE_ON)
        return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: cascade = KVA_CASCADE_ON, but %s", fn, why);
    if (why && !given)
        return KVA_STATUS_OK;
    if (!given && desc->cascade == KVA_CASCADE_AUTO && !auto_may_keep(ctx, p))
        return KVA_STATUS_OK;
    /* grp [R], then plen, par, keep and map [G <= R] (a found grouping's
     * groups have two or more members each, a nested one fewer than its
     * parent's, so there are fewer than R). */
    const size_t n4 = (size_t)(R > 0 ? R : 1);
    int32_t *grp = malloc(sizeof(int32_t) * n4 * 5);
    int32_t *plen = grp ? grp + n4 : NULL, *par = grp ? plen + n4 : NULL;
    int32_t *keep = grp ? par + n4 : NULL, *map = grp ? keep + n4 : NULL;
    int32_t G = G0;
    kva_status st = KVA_STATUS_OK;
    if (!grp)
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    else if (given)
        st = check_grouping(desc, p, grp, plen, par);
    else
        st = find_groups(p, grp, plen, par, &G);
    if (st != KVA_STATUS_OK || why || desc->cascade == KVA_CASCADE_OFF)
        goto done; /* a given grouping is validated, then declined */
    for (int32_t g = 0; g < G; g++)
        keep[g] = 1;
    if (desc->cascade == KVA_CASCADE_AUTO)
        choose_groups(ctx, p, grp, G, plen, par, keep);
    /* Each request joins its deepest kept group; the kept groups with rows
     * (their own or their subgroups') are renumbered in order, each with its
     * nearest kept ancestor as parent. */
    for (int32_t g = 0; g < G; g++)
        map[g] = -1;
    for (int32_t r = 0; r < R; r++) {
        int32_t a = grp[r];
        while (a >= 0 && !keep[a])
            a = par[a];
        grp[r] = a;
        for (; a >= 0; a = par[a])
            if (keep[a])
                map[a] = 0;
    }
    int32_t n = 0;
    for (int32_t g = 0; g < G; g++) {
        int32_t up = par[g];
        while (up >= 0 && map[up] < 0)
            up = par[up];
        keep[g] = up; /* the nearest used ancestor, old numbering */
    }
    for (int32_t g = 0; g < G; g++)
        if (map[g] >= 0)
            map[g] = n++;
    for (int32_t g = 0; g < G; g++)
        if (map[g] >= 0) {
            plen[map[g]] = plen[g];
            par[map[g]] = keep[g] >= 0 ? map[keep[g]] : -1;
        }
    for (int32_t r = 0; r < R; r++)
        grp[r] = grp[r] >= 0 ? map[grp[r]] : -1;
    if (n == 0)
        goto done;
    kva__cascade *c = calloc(1, sizeof *c);
    if (!c) {
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    p->cascade = c;
    st = build(ctx, p, grp, n, plen, par, c);
    if (st == KVA_STATUS_OK)
        st = reserve_buffers(p, c);
    if (st == KVA_STATUS_OK && ctx->ops->cascade_upload)
        st = ctx->ops->cascade_upload(ctx, p);
    if (st != KVA_STATUS_OK) {
        kva__cascade_free(p);
        goto done;
    }
    p->workspace_bytes = c->suffix->workspace_bytes;
    p->info.num_work_items = c->prefix->info.num_work_items + c->suffix->info.num_work_items;
    p->info.num_cascade_groups = n;
    p->info.cascade_rows = c->rows;
    p->info.cascade_chunks = c->num_chunks;
done:
    free(grp);
    return st;
}
