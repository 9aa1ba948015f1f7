/*
 * cpu_ops.c - the CPU backend's operation table: plan_build (work partition
 * and workspace), the threaded run of the work items, and the kernel
 * registry and dispatch.
 */
#include "cpu_attn.h"
#include "cpu_dequant.h"
#include "indexer_cpu.h"
#include "mla_cpu.h"

#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- kernel registry ---- */

/* What a registry entry runs: its item kernel, its decode-group entry (NULL:
 * item by item) and the ISA level it needs. Same order as `kernels`. */
typedef struct cpu_kernel {
    kva__cpu_attn_fn fn;
    kva__cpu_group_fn group;
    kva__cpu_isa isa;
} cpu_kernel;

/* The CPU backend's kernels, named by kind x ISA, in increasing ISA order
 * within each family: the dispatcher takes the last one of each family that
 * the context's ISA level allows (a later entry beats the earlier ones where
 * it can run). The portable kernel serves both families. */
static int usable_avx2(const kva_context *ctx);
static int usable_avx512(const kva_context *ctx);
static int usable_avx512bf16(const kva_context *ctx);
/* clang-format off */
static const kva__kernel_info kernels[] = {
    {"decode_portable",    KVA__KERNEL_DECODE,  NULL},
#if KVA_X86_SIMD
    {"decode_avx2",        KVA__KERNEL_DECODE,  usable_avx2},
    {"decode_avx512",      KVA__KERNEL_DECODE,  usable_avx512},
    {"decode_avx512bf16",  KVA__KERNEL_DECODE,  usable_avx512bf16},
#endif
    {"prefill_portable",   KVA__KERNEL_PREFILL, NULL},
#if KVA_X86_SIMD
    {"prefill_avx2",       KVA__KERNEL_PREFILL, usable_avx2},
    {"prefill_avx512",     KVA__KERNEL_PREFILL, usable_avx512},
    {"prefill_avx512bf16", KVA__KERNEL_PREFILL, usable_avx512bf16},
#endif
    {"mla_portable",       KVA__KERNEL_MLA,     NULL},
#if KVA_X86_SIMD
    {"mla_avx2",           KVA__KERNEL_MLA,     usable_avx2},
    {"mla_avx512",         KVA__KERNEL_MLA,     usable_avx512},
    {"mla_avx512bf16",     KVA__KERNEL_MLA,     usable_avx512bf16},
#endif
};
static const cpu_kernel impls[] = {
    {kva__cpu_attn_portable,         NULL,                           KVA__ISA_PORTABLE},
#if KVA_X86_SIMD
    {kva__cpu_decode_avx2,           kva__cpu_decode_avx2_group,     KVA__ISA_AVX2},
    {kva__cpu_decode_avx512,         kva__cpu_decode_avx512_group,   KVA__ISA_AVX512},
    {kva__cpu_decode_avx512bf16,     kva__cpu_decode_avx512bf16_group, KVA__ISA_AVX512BF16},
#endif
    {kva__cpu_attn_portable,         NULL,                           KVA__ISA_PORTABLE},
#if KVA_X86_SIMD
    {kva__cpu_prefill_avx2,          NULL,                           KVA__ISA_AVX2},
    {kva__cpu_prefill_avx512,        NULL,                           KVA__ISA_AVX512},
    {kva__cpu_prefill_avx512bf16,    NULL,                           KVA__ISA_AVX512BF16},
#endif
    /* MLA items run through kva__cpu_plan_mla_item (mla_cpu.c's entry). */
    {NULL,                           NULL,                           KVA__ISA_PORTABLE},
#if KVA_X86_SIMD
    {NULL,                           NULL,                           KVA__ISA_AVX2},
    {NULL,                           NULL,                           KVA__ISA_AVX512},
    {NULL,                           NULL,                           KVA__ISA_AVX512BF16},
#endif
};
/* clang-format on */
enum { NUM_KERNELS = (int)(sizeof kernels / sizeof kernels[0]) };
_Static_assert(sizeof impls / sizeof impls[0] == NUM_KERNELS, "one implementation per kernel");

static int usable_at(const kva_context *ctx, kva__cpu_isa isa)
{
    return kva__cpu_isa_of(&ctx->cpu_features) >= isa;
}
static int usable_avx2(const kva_context *ctx)
{
    return usable_at(ctx, KVA__ISA_AVX2);
}
static int usable_avx512(const kva_context *ctx)
{
    return usable_at(ctx, KVA__ISA_AVX512);
}
static int usable_avx512bf16(const kva_context *ctx)
{
    return usable_at(ctx, KVA__ISA_AVX512BF16);
}

/* 1 for registry entries whose only gain over the entry before them is the
 * vdpbf16ps scores: prefill_avx512bf16 and mla_avx512bf16 (decode_avx512bf16
 * also has the VNNI int8 path). */
static int bf16dot_only(int32_t i)
{
#if KVA_X86_SIMD
    return impls[i].fn == kva__cpu_prefill_avx512bf16 ||
           (kernels[i].family == KVA__KERNEL_MLA && impls[i].isa == KVA__ISA_AVX512BF16);
#else
    (void)i;
    return 0;
#endif
}

/* Registry indices of the kernels a plan built on ctx runs: per family the
 * one forced on ctx (kva__context_force_kernel) while the ISA level still
 * allows it, else the last entry the level allows, skipping a bf16-dot
 * entry where bf16 dot products do not beat fp32 FMAs
 * (kva__cpu_features.bf16dot_fast). */
static void choose(const kva_context *ctx, int32_t *decode, int32_t *prefill, int32_t *mla)
{
    const kva__cpu_isa level = kva__cpu_isa_of(&ctx->cpu_features);
    int32_t pick[KVA__KERNEL_FAMILIES] = {0};
    for (int32_t i = 0; i < NUM_KERNELS; i++)
        if (impls[i].isa <= level && (!bf16dot_only(i) || ctx->cpu_features.bf16dot_fast))
            pick[kernels[i].family] = i;
    for (int f = 0; f < KVA__KERNEL_FAMILIES; f++) {
        const int32_t forced = kva__context_forced_kernel(ctx, (kva__kernel_family)f);
        if (forced >= 0 && forced < NUM_KERNELS && impls[forced].isa <= level)
            pick[f] = forced;
    }
    *decode = pick[KVA__KERNEL_DECODE];
    *prefill = pick[KVA__KERNEL_PREFILL];
    *mla = pick[KVA__KERNEL_MLA];
}

const char *kva__cpu_plan_kernel(const kva_plan *plan, kva__kernel_family family)
{
    const int32_t v = family == KVA__KERNEL_DECODE    ? plan->part->variant_decode
                      : family == KVA__KERNEL_PREFILL ? plan->part->variant_prefill
                                                      : plan->part->variant_mla;
    return v >= 1 && v <= NUM_KERNELS ? kernels[v - 1].name : NULL;
}

kva__cpu_mla_item_fn kva__cpu_plan_mla_item(const kva_plan *plan)
{
#if KVA_X86_SIMD
    const int32_t v = plan->part->variant_mla;
    if (v >= 1 && v <= NUM_KERNELS && impls[v - 1].isa >= KVA__ISA_AVX512BF16)
        return kva__cpu_mla_item_avx512bf16;
    if (v >= 1 && v <= NUM_KERNELS && impls[v - 1].isa >= KVA__ISA_AVX512)
        return kva__cpu_mla_item_avx512;
    if (v >= 1 && v <= NUM_KERNELS && impls[v - 1].isa >= KVA__ISA_AVX2)
        return kva__cpu_mla_item_avx2;
#else
    (void)plan;
#endif
    return kva__cpu_mla_item_portable;
}

int kva__cpu_kernel_groups(const char *name)
{
    for (int32_t i = 0; i < NUM_KERNELS; i++)
        if (name && strcmp(kernels[i].name, name) == 0)
            return impls[i].group != NULL;
    return 0;
}

/* The group entry of the plan's decode kernel, or NULL. */
static kva__cpu_group_fn decode_group(const kva__partition *part)
{
    return impls[part->variant_decode - 1].group;
}

/* ---- plan ---- */

/* Bytes of the split partials, rounded to 64 (the scratch areas follow). */
static size_t partial_bytes(const kva__partition *part)
{
    return ((size_t)part->partial_floats * sizeof(float) + 63u) & ~(size_t)63u;
}

/* Group order: cost (largest first, as the partition sorts), then the
 * items of one request, query rows and key range by kv head, so that the
 * members of a decode group are adjacent. */
static int by_group_order(const void *pa, const void *pb)
{
    const kva__work_item *a = pa, *b = pb;
    const int64_t ka[6] = {-a->cost, a->req, a->h0, a->i0, a->k0, a->kv_head};
    const int64_t kb[6] = {-b->cost, b->req, b->h0, b->i0, b->k0, b->kv_head};
    for (int i = 0; i < 6; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static int same_group(const kva__work_item *a, const kva__work_item *b)
{
    return a->req == b->req && a->h0 == b->h0 && a->nh == b->nh && a->i0 == b->i0 &&
           a->nq == b->nq && a->k0 == b->k0 && a->k1 == b->k1;
}

/* Orders part's items for grouping and cuts them into groups (cpu_attn.h,
 * "Groups"); items that are not groupable, and every item when the plan's
 * decode kernel has no group entry (group == 0), form groups of one. */
static kva_status build_groups(kva__partition *part, int group)
{
    const int32_t n = part->num_items;
    if (n > 1)
        qsort(part->items, (size_t)n, sizeof *part->items, by_group_order);
    int32_t *start = malloc(((size_t)n + 1) * sizeof *start);
    if (!start)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_plan_create: out of memory (groups of %d work items)", (int)n);
    int32_t ng = 0;
    for (int32_t i = 0; i < n;) {
        int32_t j = i + 1;
        if (group && kva__cpu_groupable(&part->items[i]))
            while (j < n && j - i < KVA_CPU_GROUP_MAX &&
                   same_group(&part->items[i], &part->items[j]))
                j++;
        start[ng++] = i;
        i = j;
    }
    start[ng] = n;
    part->group_start = start;
    part->num_groups = ng;
    return KVA_STATUS_OK;
}

kva_status kva__cpu_plan_partition(kva_context *ctx, kva_plan *plan,
                                   const kva__partition_params *pp)
{
    kva__partition *part = NULL;
    KVA_TRY(kva__partition_build(plan, pp, &part));
    if (plan->part) {
        /* Re-partitioning keeps the kernels. */
        part->variant_decode = plan->part->variant_decode;
        part->variant_prefill = plan->part->variant_prefill;
        part->variant_mla = plan->part->variant_mla;
    } else {
        int32_t kd = 0, kp = 0, km = 0;
        choose(ctx, &kd, &kp, &km);
        part->variant_decode = kd + 1;
        part->variant_prefill = kp + 1;
        part->variant_mla = km + 1;
    }
    kva_status gst = build_groups(part, decode_group(part) != NULL);
    if (gst != KVA_STATUS_OK) {
        kva__partition_free(part);
        return gst;
    }
    size_t bytes = 0;
    if (part->num_items > 0)
        bytes =
            partial_bytes(part) +
            (size_t)pp->num_threads * kva__cpu_scratch_bytes(plan->d.head_dim, plan->d.head_dim_v);
    kva_status st = kva__context_reserve_workspace(ctx, bytes);
    if (st != KVA_STATUS_OK) {
        kva__partition_free(part);
        return st;
    }
    kva__partition_free(plan->part);
    plan->part = part;
    plan->info.num_work_items = part->num_items;
    plan->workspace_bytes = bytes;
    return KVA_STATUS_OK;
}

static kva_status cpu_plan_build(kva_context *ctx, kva_plan *plan)
{
    /* An indexer plan needs only its threads' scratch (indexer_cpu.c). */
    if (plan->d.kind == KVA_ATTN_INDEX) {
        const size_t bytes =
            kva__cpu_indexer_workspace(plan, ctx->num_threads > 0 ? ctx->num_threads : 1);
        KVA_TRY(kva__context_reserve_workspace(ctx, bytes));
        plan->workspace_bytes = bytes;
        plan->info.num_work_items = plan->info.num_tokens;
        return KVA_STATUS_OK;
    }
    kva__partition_params pp;
    pp.num_threads = ctx->num_threads > 0 ? ctx->num_threads : 1;
    pp.max_rows = KVA_CPU_MAX_ROWS;
    pp.prefill_rows = KVA_CPU_PREFILL_ROWS;
    pp.split_align = KVA_CPU_KEY_CHUNK;
    pp.min_split_keys = 128;
    pp.max_splits = 64;
    pp.items_per_thread = 4;
    /* Decode-only steps whose decode kernel runs groups of up to
     * KVA_CPU_GROUP_MAX kv heads (cpu_attn.h, "Groups"): ask for as many
     * groups per thread as there were items, i.e. split long requests as
     * often as before grouping. */
    int32_t kd = 0, kp = 0, km = 0;
    choose(ctx, &kd, &kp, &km);
    int decode_only = impls[kd].group != NULL;
    for (int32_t r = 0; r < plan->d.num_requests; r++)
        if (plan->query_start_loc[r + 1] - plan->query_start_loc[r] > KVA_CPU_DECODE_MAX_NQ)
            decode_only = 0;
    if (decode_only) {
        const int32_t hkv = plan->d.num_kv_heads;
        pp.items_per_thread *= hkv < KVA_CPU_GROUP_MAX ? hkv : KVA_CPU_GROUP_MAX;
    }
    /* Rows that all see the same keys (cpu_attn.h, KVA_CPU_TILE_ROWS): the
     * tiled kernels take twice the rows per K/V tile. (Asking for more items
     * per thread as well, to cut these tiles along the keys as often as the
     * smaller ones were, would double the split partials the merge reads.)
     * The portable kernel's scratch holds KVA_CPU_MAX_ROWS rows. */
    const kva_plan_desc *d = &plan->d;
    if (!decode_only && impls[kp].fn != kva__cpu_attn_portable && !d->causal &&
        d->window_left < 0 && d->attention_chunk <= 0)
        pp.prefill_rows = KVA_CPU_TILE_ROWS;
    KVA_TRY(kva__cpu_plan_partition(ctx, plan, &pp));
    /* A plan with MLA head sizes also serves kva_mla_run (mla_cpu.c), whose
     * per-thread scratch shares the workspace with the partition's. */
    size_t mla = kva__cpu_mla_workspace(ctx, plan, pp.num_threads);
    const size_t sparse = kva__cpu_sparse_workspace(plan, pp.num_threads);
    mla = sparse > mla ? sparse : mla;
    if (mla > plan->workspace_bytes) {
        KVA_TRY(kva__context_reserve_workspace(ctx, mla));
        plan->workspace_bytes = mla;
    }
    return KVA_STATUS_OK;
}

static void cpu_plan_release(kva_plan *plan)
{
    kva__partition_free(plan->part);
    plan->part = NULL;
}

/* ---- run ---- */

/* Runs every item of the plan, then merges the split tasks. */
static void run_items(kva_context *ctx, kva__cpu_run *run)
{
    const kva__partition *part = run->part;
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    /* Kernels resolved (and checked against the CPU) at plan build. */
    const kva__cpu_attn_fn fn_decode = impls[part->variant_decode - 1].fn;
    const kva__cpu_group_fn fn_group = decode_group(part);
    const kva__cpu_attn_fn fn_prefill = impls[part->variant_prefill - 1].fn;
    run->partials = ctx->workspace;
    run->scratch = (unsigned char *)ctx->workspace + partial_bytes(part);
    run->scratch_stride = kva__cpu_scratch_bytes(D, Dv);
    /* Threads: the running context's, as far as its workspace holds scratch
     * areas (a plan built on a context with fewer threads still runs on all
     * of this one's cores when the workspace was reserved large enough). */
    const size_t room = ctx->workspace_bytes > partial_bytes(part)
                            ? (ctx->workspace_bytes - partial_bytes(part)) / run->scratch_stride
                            : 0;
    int nt = ctx->num_threads;
    if ((size_t)nt > room)
        nt = (int)room;
    if (nt > part->num_groups)
        nt = part->num_groups;
    if (nt < 1)
        nt = 1;
    const int32_t ng = part->num_groups, nk = part->num_tasks;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        kva__cpu_scratch s;
        kva__cpu_scratch_map(run->scratch + (size_t)tid * run->scratch_stride, D, Dv, &s);
#pragma omp for schedule(dynamic, 1)
        for (int32_t g = 0; g < ng; g++) {
            const int32_t i0 = part->group_start[g], n = part->group_start[g + 1] - i0;
            const kva__work_item *it = &part->items[i0];
            if (n > 1 && fn_group) {
                fn_group(run, it, n, &s);
                continue;
            }
            for (int32_t i = 0; i < n; i++)
                (kva__cpu_item_prefill(it[i].nq, it[i].nh) ? fn_prefill : fn_decode)(run, &it[i],
                                                                                     &s);
        }
#pragma omp for schedule(dynamic, 1)
        for (int32_t t = 0; t < nk; t++)
            kva__cpu_merge_task(run, &part->tasks[t]);
    }
}

/* Runs the plan's items over either the paged cache or ragged K/V (the other
 * source is NULL). */
static kva_status run_attention(kva_context *ctx, const kva_plan *plan, const void *q,
                                const kva_cache *cache, const void *k, const void *v,
                                const float *sinks, void *out, float *lse)
{
    kva__cpu_run run;
    memset(&run, 0, sizeof run);
    run.plan = plan;
    run.part = plan->part;
    run.dt = plan->d.q_dtype;
    run.kv_dt = cache ? cache->k_dtype : plan->d.q_dtype;
    run.quant = cache && cache->desc.quant != KVA_QUANT_NONE;
    run.dequant_simd = run.quant ? kva__cpu_dequant_simd(&ctx->cpu_features) : 0;
    run.vnni = ctx->cpu_features.avx512vnni;
    run.q = q;
    run.cache = cache;
    run.k = k;
    run.v = v;
    run.sinks = sinks;
    run.out = out;
    run.lse = lse;
    run_items(ctx, &run);
    return KVA_STATUS_OK;
}

static kva_status cpu_attention_paged(kva_context *ctx, const kva_plan *plan, const void *q,
                                      const kva_cache *cache, const float *sinks, void *out,
                                      float *lse)
{
    return run_attention(ctx, plan, q, cache, NULL, NULL, sinks, out, lse);
}

static kva_status cpu_attention_ragged(kva_context *ctx, const kva_plan *plan, const void *q,
                                       const void *k, const void *v, const float *sinks, void *out,
                                       float *lse)
{
    return run_attention(ctx, plan, q, NULL, k, v, sinks, out, lse);
}

/* The cascade cost model's rates for ctx's threads: rough per-core figures
 * of an AVX-512 server core, memory bandwidth saturating at ~8 cores. The
 * decode kernels reach ~20-25 GFLOP/s per core on keys in cache, the tiled
 * prefill kernel of the prefix pass 90-130 (one thread, 64 rows x 8k keys,
 * prefill_avx512 on a Xeon; bench/results/vm_2026-11-27_casc2.txt), taken
 * at half that for loaded machines, with 256 attention rows per kv head or
 * more (fewer leave its vector lanes and register blocks unfilled: at 2
 * threads 8 and 16 decodes over a 2k prefix ran slower as a cascade, 32
 * over 4k and 64 over 8k faster); a prefix that fits the last-level cache
 * (taken as 16 MiB) is re-read from it at ~4x the memory's rate. */
static kva_status cpu_cascade_cost(const kva_context *ctx, kva__cascade_cost *out)
{
    const double nt = ctx->num_threads, bw_cores = nt < 8 ? nt : 8;
    out->read_bw = 6e9 * bw_cores;
    out->reread_bw = 4.0 * out->read_bw;
    out->reread_max = 16.0 * 1024 * 1024;
    out->decode_flops = 20e9 * nt;
    out->prefix_flops = 60e9 * nt;
    out->fixed_s = 20e-6;
    out->prefix_rows = 256.0;
    out->units = 0;
    return KVA_STATUS_OK;
}

const kva__backend_ops kva__cpu_ops = {
    .name = "cpu",
    .plan_build = cpu_plan_build,
    .plan_release = cpu_plan_release,
    .attention_paged = cpu_attention_paged,
    .attention_ragged = cpu_attention_ragged,
    .merge_states = kva__cpu_merge_states,
    .merge_states_n = kva__cpu_merge_states_n,
    /* An MLA cache's V rows alias its K rows (kva__cpu_locate_rows): the
     * decode and prefill kernels run the absorbed math unchanged. */
    .mla_attention_paged = cpu_attention_paged,
    .mla_run = kva__cpu_mla_run,
    .mla_sparse = kva__cpu_mla_sparse,
    .max_head_dim = KVA_MAX_HEAD_DIM,
    .memory = &kva__host_memory,
    .kernels = kernels,
    .num_kernels = NUM_KERNELS,
    .cascade_cost = cpu_cascade_cost,
    .cascade_gather = kva__host_cascade_gather,
    .cascade_merge = kva__host_cascade_merge,
    .indexer = kva__cpu_indexer,
};
