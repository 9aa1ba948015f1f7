/*
 * mla_cpu.c - the CPU backend's layer-level MLA (kva_mla_run): work items,
 * split-KV, scratch and the OpenMP team; the item bodies are in
 * mla_items.inc.
 *
 * Work items need no list: item index r * H + h names request r and head h.
 * A request with q_len <= decode_threshold takes the absorbed path, one item
 * per group of KVA_MLA_HEAD_GROUP heads (the indices h % group == 0; the
 * others are empty), so each latent row is read once per group; a longer
 * request takes the compute-friendly path, one item per head. Requests with
 * q_len 0 have no items. The dynamic schedule spreads the items over the
 * threads; the empty indices cost a test each.
 *
 * Split-KV: a step of fewer items than threads (one long decode at small
 * batch) would leave threads idle, so kva__cpu_mla_split_of cuts each
 * absorbed item's keys into `split` pieces of whole chunks. The run then has
 * three phases, each ended by the team's barrier: each split item absorbs
 * its queries once (q_nope . W_UK, reading W_UK once) into the workspace
 * after the threads' scratch; every piece (and every other item) runs,
 * leaving its partial (unnormalized latent output, row max and sum) next to
 * them; one merge per split item folds its pieces by their LSE, projects
 * the rows by W_UV and stores them. Absorption and projection run once per
 * row whatever the split.
 *
 * Staged weights: an unsplit step with two or more absorbed items (a decode
 * batch) would read every head's W_UK and W_UV once per request, from memory
 * or the last-level cache (H 128: 32 MB of bf16 weights per request). It
 * runs the same three phases over areas like the split items' (one piece
 * each): phase 1 absorbs per head, each thread taking heads and reading a
 * head's W_UK once for the rows of every absorbed request; phase 2 runs
 * every item, an absorbed one leaving its partial in its area; phase 3
 * projects per head by W_UV likewise. Steps whose areas would pass
 * KVA_MLA_STAGED_BYTES absorb and project item by item.
 */
#include "mla_cpu.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows of an absorbed item of q_len queries and nh heads, padded to 16. */
static size_t padded_rows(size_t q_len, size_t nh)
{
    return (q_len * nh + 15) / 16 * 16;
}

size_t kva__cpu_mla_scratch_bytes(const kva_plan *plan)
{
    const kva_plan_desc *d = &plan->d;
    const size_t D = (size_t)d->head_dim, Dc = (size_t)d->head_dim_v, Dr = D - Dc;
    const size_t Dn = (size_t)d->mla_qk_nope_head_dim, Dv = (size_t)d->mla_v_head_dim;
    const size_t qmax = (size_t)plan->info.max_q_len, thr = (size_t)d->decode_threshold;
    const size_t group =
        d->num_heads < KVA_MLA_HEAD_GROUP ? (size_t)d->num_heads : (size_t)KVA_MLA_HEAD_GROUP;
    const size_t rows = (qmax < thr ? qmax : thr) * group;
    size_t n = kva__cpu_mla_floats(1, rows, D, Dc, Dr, Dn, Dv);
    if (qmax > thr) {
        const size_t p = kva__cpu_mla_floats(0, qmax, D, Dc, Dr, Dn, Dv);
        n = p > n ? p : n;
    }
    return (n * sizeof(float) + 63) & ~(size_t)63;
}

void kva__cpu_mla_split_of(const kva_context *ctx, const kva_plan *plan, int32_t nt,
                           kva__cpu_mla_split *s)
{
    const kva_plan_desc *d = &plan->d;
    const int64_t H = d->num_heads, groups = (H + KVA_MLA_HEAD_GROUP - 1) / KVA_MLA_HEAD_GROUP;
    const int32_t thr = d->decode_threshold;
    int64_t items = 0, absorbed = 0, s_max = 0;
    int32_t q_abs = 0;
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        if (q_len == 0)
            continue;
        if (q_len > thr) {
            items += H;
            continue;
        }
        items += groups;
        absorbed += groups;
        s_max = plan->seq_lens[r] > s_max ? plan->seq_lens[r] : s_max;
        q_abs = q_len > q_abs ? q_len : q_abs;
    }
    const int32_t nh = H < KVA_MLA_HEAD_GROUP ? (int32_t)H : KVA_MLA_HEAD_GROUP;
    s->split = 1;
    s->num_absorbed = (int32_t)absorbed;
    s->qa_floats = padded_rows((size_t)q_abs, (size_t)nh) * (size_t)d->head_dim;
    s->piece_floats = padded_rows((size_t)q_abs, (size_t)nh) * ((size_t)d->head_dim_v + 2);
    const int64_t limit = ctx->mla_max_splits > 0 ? ctx->mla_max_splits : KVA_MLA_MAX_SPLITS;
    if (absorbed == 0 || items >= (int64_t)nt)
        return;
    int64_t split = (2 * (int64_t)nt + items - 1) / items;
    const int64_t by_keys = (s_max + KVA_MLA_SPLIT_MIN - 1) / KVA_MLA_SPLIT_MIN;
    split = split < by_keys ? split : by_keys;
    split = split < limit ? split : limit;
    s->split = split > 1 ? (int32_t)split : 1;
}

/* Floats of one split item's area: its absorbed queries, then its pieces'
 * partials. */
static size_t item_floats(const kva__cpu_mla_split *s)
{
    return s->qa_floats + (size_t)s->split * s->piece_floats;
}

/* Whether a step of split s stages its weights: unsplit (at least as many
 * items as threads), two or more absorbed items, their areas within
 * KVA_MLA_STAGED_BYTES. */
static int staged_of(const kva__cpu_mla_split *s)
{
    return s->split == 1 && s->num_absorbed >= 2 &&
           (size_t)s->num_absorbed * item_floats(s) * sizeof(float) <= KVA_MLA_STAGED_BYTES;
}

/* Bytes of the absorbed items' areas of s (0 without split-KV or staged
 * weights). */
static size_t partial_bytes(const kva__cpu_mla_split *s)
{
    if (s->split <= 1 && !staged_of(s))
        return 0;
    return (size_t)s->num_absorbed * item_floats(s) * sizeof(float);
}

size_t kva__cpu_mla_workspace(const kva_context *ctx, const kva_plan *plan, int32_t nt)
{
    if (plan->d.kind != KVA_ATTN_MLA || plan->d.mla_qk_nope_head_dim == 0 ||
        plan->info.num_tokens == 0)
        return 0;
    nt = nt > 0 ? nt : 1;
    kva__cpu_mla_split s;
    kva__cpu_mla_split_of(ctx, plan, nt, &s);
    return (size_t)nt * kva__cpu_mla_scratch_bytes(plan) + partial_bytes(&s);
}

/* The item of index idx (request idx / H, head idx % H), or 0 when the index
 * runs nothing (q_len 0, or inside an absorbed head group). */
static int item_at(const kva_plan *plan, int64_t idx, int32_t H, kva__cpu_mla_item *it)
{
    memset(it, 0, sizeof *it);
    it->r = (int32_t)(idx / H);
    it->h0 = (int32_t)(idx % H);
    const int32_t q_len = plan->query_start_loc[it->r + 1] - plan->query_start_loc[it->r];
    if (q_len == 0)
        return 0;
    it->absorbed = q_len <= plan->d.decode_threshold;
    if (it->absorbed && it->h0 % KVA_MLA_HEAD_GROUP != 0)
        return 0; /* inside a group that the index h0 - h0 % group runs */
    it->nh = it->absorbed ? (H - it->h0 < KVA_MLA_HEAD_GROUP ? H - it->h0 : KVA_MLA_HEAD_GROUP) : 1;
    it->split = 1;
    return 1;
}

/* Split-KV: the ordinal of absorbed item it among the plan's absorbed items
 * (its area's slot). Splitting happens only for plans of fewer items than
 * threads, so the walk over the earlier requests is short. */
static int64_t absorbed_ordinal(const kva_plan *plan, const kva__cpu_mla_item *it, int32_t H)
{
    const int64_t groups = (H + KVA_MLA_HEAD_GROUP - 1) / KVA_MLA_HEAD_GROUP;
    int64_t n = 0;
    for (int32_t r = 0; r < it->r; r++) {
        const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        n += q_len > 0 && q_len <= plan->d.decode_threshold ? groups : 0;
    }
    return n + it->h0 / KVA_MLA_HEAD_GROUP;
}

/* Makes it piece `piece` (-1: the absorption, split: the merge) of a split
 * absorbed item: its area in partials and, for a piece, its keys, chunks
 * [nc p / split, nc (p + 1) / split). */
static void split_piece(const kva_plan *plan, const kva__cpu_mla_split *sp, float *partials,
                        int32_t H, int32_t piece, kva__cpu_mla_item *it)
{
    const int64_t s = plan->seq_lens[it->r], nc = (s + KVA_MLA_CHUNK - 1) / KVA_MLA_CHUNK;
    const int32_t split = sp->split;
    it->split = split;
    it->piece = piece;
    if (piece >= 0 && piece < split) {
        it->k0 = nc * piece / split * KVA_MLA_CHUNK;
        it->k1 = nc * (piece + 1) / split * KVA_MLA_CHUNK;
        it->k1 = it->k1 < s ? it->k1 : s;
    }
    it->piece_floats = sp->piece_floats;
    it->qa = partials + (size_t)absorbed_ordinal(plan, it, H) * item_floats(sp);
    it->partial = it->qa + sp->qa_floats;
}

/* Runs piece `piece` (-1: the absorption, split: the merge) of every split
 * item on the calling team: an orphaned worksharing loop, called by every
 * thread of the parallel region (its end is the team's barrier). */
static void split_pass(const kva__cpu_mla *m, kva__cpu_mla_item_fn item_fn,
                       const kva__cpu_mla_split *sp, float *partials, int64_t n_idx, int32_t piece,
                       float *scratch)
{
#pragma omp for schedule(dynamic, 1)
    for (int64_t idx = 0; idx < n_idx; idx++) {
        kva__cpu_mla_item it;
        if (!item_at(m->plan, idx, m->H, &it) || !it.absorbed)
            continue;
        split_piece(m->plan, sp, partials, m->H, piece, &it);
        item_fn(m, &it, scratch);
    }
}

/* Staged weights: piece -2 (absorption) or -3 (projection) of every head
 * on the calling team (an orphaned worksharing loop, like split_pass). */
static void head_pass(const kva__cpu_mla *m, kva__cpu_mla_item_fn item_fn, int32_t piece,
                      float *scratch)
{
#pragma omp for schedule(dynamic, 1)
    for (int32_t h = 0; h < m->H; h++) {
        kva__cpu_mla_item it;
        memset(&it, 0, sizeof it);
        it.h0 = h;
        it.nh = 1;
        it.absorbed = 1;
        it.staged = 1;
        it.split = 1;
        it.piece = piece;
        item_fn(m, &it, scratch);
    }
}

void kva__cpu_mla_init(kva__cpu_mla *m, const kva_plan *plan, const kva_cache *cache, const void *q,
                       void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    memset(m, 0, sizeof *m);
    m->plan = plan;
    m->cache = cache;
    m->q = q;
    m->out = out;
    m->lse = lse;
    m->H = d->num_heads;
    m->D = d->head_dim;
    m->Dc = d->head_dim_v;
    m->Dr = d->head_dim - d->head_dim_v;
    m->Dn = d->mla_qk_nope_head_dim;
    m->Dv = d->mla_v_head_dim;
    m->max_q_len = plan->info.max_q_len;
    if (cache->desc.quant == KVA_QUANT_FP8_E4M3) {
        const float s = cache->k_scale[0]; /* one per-tensor scale (MLA: Hkv = 1) */
        for (int i = 0; i < 256; i++)
            m->fp8_lut[i] = kva_fp8_e4m3_to_f32((uint8_t)i) * s;
    }
}

kva_status kva__cpu_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                            const void *w_uv, const kva_cache *cache, void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    kva__cpu_mla m;
    kva__cpu_mla_init(&m, plan, cache, q, out, lse);
    m.w_uk = w_uk;
    m.w_uv = w_uv;
    const kva__cpu_mla_item_fn item_fn = kva__cpu_plan_mla_item(plan);
    /* Threads: the context's, as far as the workspace holds their scratch
     * and, when splitting, the partials after it (sized at plan time for the
     * same thread count). */
    const size_t stride = kva__cpu_mla_scratch_bytes(plan);
    int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    kva__cpu_mla_split sp;
    kva__cpu_mla_split_of(ctx, plan, nt, &sp);
    if (ctx->workspace_bytes < (size_t)nt * stride + partial_bytes(&sp))
        sp.split = 1;
    const int staged =
        staged_of(&sp) && ctx->workspace_bytes >= (size_t)nt * stride + partial_bytes(&sp);
    if ((size_t)nt > ctx->workspace_bytes / stride)
        nt = (int)(ctx->workspace_bytes / stride);
    if (nt < 1)
        nt = 1;
    const int32_t H = m.H, split = sp.split;
    const int64_t n_idx = (int64_t)d->num_requests * H;
    unsigned char *base = ctx->workspace;
    float *partials = (float *)(base + (size_t)nt * stride);
    if (staged) {
        m.areas = partials;
        m.area_floats = item_floats(&sp);
        m.area_qa_floats = sp.qa_floats;
    }
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *scratch = (float *)(base + (size_t)tid * stride);
        /* Phase 1: each split item's absorption, or staged: each head's. */
        if (split > 1)
            split_pass(&m, item_fn, &sp, partials, n_idx, -1, scratch);
        if (staged)
            head_pass(&m, item_fn, -2, scratch);
            /* Phase 2: every item, or every piece of a split absorbed item. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t x = 0; x < n_idx * split; x++) {
            kva__cpu_mla_item it;
            if (!item_at(plan, x / split, H, &it))
                continue;
            const int32_t p = (int32_t)(x % split);
            if ((split > 1 || staged) && it.absorbed) {
                split_piece(plan, &sp, partials, H, p, &it);
                it.staged = staged;
            } else if (p != 0)
                continue; /* unsplit items run once */
            item_fn(&m, &it, scratch);
        }
        /* Phase 3: merge each split item, or staged: each head's projection. */
        if (split > 1)
            split_pass(&m, item_fn, &sp, partials, n_idx, split, scratch);
        if (staged)
            head_pass(&m, item_fn, -3, scratch);
    }
    return KVA_STATUS_OK;
}
