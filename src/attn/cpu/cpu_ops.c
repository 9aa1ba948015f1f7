/*
 * cpu_ops.c - the CPU backend's operation table: plan_build (work partition
 * and workspace), the threaded run of the work items, and kernel dispatch.
 */
#include "cpu_attn.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- kernel variants ---- */

/* ISA a variant needs (checked at run time against kva__cpu_features_get). */
enum { NEEDS_NONE = 0, NEEDS_AVX2 = 1, NEEDS_AVX512 = 2, NEEDS_AVX512_BF16 = 3 };

typedef struct variant_entry {
    kva__cpu_attn_fn fn; /* NULL: not compiled in this build */
    int needs;
} variant_entry;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVA_CPU_X86_KERNELS 1
#endif

/* Variant v is entry v - 1. Numbers 2 and 3 are reserved for the AVX2 and
 * AVX-512 decode variants (another branch); until they land those slots are
 * empty and behave like an unavailable ISA. */
/* clang-format off */
static const variant_entry variants[] = {
    {kva__cpu_attn_v1, NEEDS_NONE},
    {NULL, NEEDS_AVX2},
    {NULL, NEEDS_AVX512},
#ifdef KVA_CPU_X86_KERNELS
    {kva__cpu_attn_v4, NEEDS_AVX2},
    {kva__cpu_attn_v5, NEEDS_AVX512},
    {kva__cpu_attn_v6, NEEDS_AVX512_BF16},
#else
    {NULL, NEEDS_AVX2},
    {NULL, NEEDS_AVX512},
    {NULL, NEEDS_AVX512_BF16},
#endif
};
/* clang-format on */

static int isa_has(const kva__cpu_features *f, int needs)
{
    if (needs == NEEDS_AVX2)
        return f->avx2 && f->fma && f->f16c;
    if (needs == NEEDS_AVX512 || needs == NEEDS_AVX512_BF16)
        return f->avx512f && f->avx512bw && f->avx512vl && f->avx2 && f->fma && f->f16c &&
               (needs == NEEDS_AVX512 || f->avx512bf16);
    return 1;
}

int kva__cpu_attn_num_variants(void)
{
    return (int)(sizeof variants / sizeof variants[0]);
}

kva__cpu_attn_fn kva__cpu_attn_variant(int v)
{
    if (v < 1 || v > kva__cpu_attn_num_variants() || !variants[v - 1].fn)
        return NULL;
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    return isa_has(&f, variants[v - 1].needs) ? variants[v - 1].fn : NULL;
}

/* Items with at least this many query rows and attention rows run the tiled
 * prefill variant (when the plan's variant is 0 = per item). */
#define TILED_MIN_QUERY_ROWS 2
#define TILED_MIN_ROWS 16

/* 0: choose per item (run_items, with part->variant_tiled). Tests force one variant for
 * every item by setting part->variant to its number. */
int kva__cpu_attn_choose(const kva_plan *plan)
{
    (void)plan;
    return 0;
}

/* The best tiled prefill variant a CPU with features f runs (6 AVX512-BF16,
 * 5 AVX-512, 4 AVX2), else 1. Resolved at plan time from the features the
 * context detected at creation: cpuid traps to the hypervisor on a VM (about
 * 30 us here) and has no place on the run path or in every plan. */
static int tiled_variant(const kva__cpu_features *f)
{
    for (int v = 6; v >= 4; v--)
        if (variants[v - 1].fn && isa_has(f, variants[v - 1].needs))
            return v;
    return 1;
}

/* ---- plan ---- */

/* Bytes of the split partials, rounded to 64 (the scratch areas follow). */
static size_t partial_bytes(const kva__partition *part)
{
    return ((size_t)part->partial_floats * sizeof(float) + 63u) & ~(size_t)63u;
}

kva_status kva__cpu_plan_partition(kva_context *ctx, kva_plan *plan,
                                   const kva__partition_params *pp)
{
    kva__partition *part = NULL;
    KVA_TRY(kva__partition_build(plan, pp, &part));
    part->variant = plan->part ? plan->part->variant : kva__cpu_attn_choose(plan);
    part->variant_tiled = tiled_variant(&ctx->cpu_features);
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
    kva__partition_params pp;
    pp.num_threads = ctx->num_threads > 0 ? ctx->num_threads : 1;
    pp.max_rows = KVA_CPU_MAX_ROWS;
    pp.prefill_rows = KVA_CPU_PREFILL_ROWS;
    pp.split_align = KVA_CPU_KEY_CHUNK;
    pp.min_split_keys = 128;
    pp.max_splits = 64;
    pp.items_per_thread = 4;
    return kva__cpu_plan_partition(ctx, plan, &pp);
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
    /* Variant 0 (the default): prefill tiles (many query rows) run the tiled
     * variant, decode-shaped items v1. A forced variant runs every item, and
     * falls back to v1 where this CPU lacks its ISA. */
    kva__cpu_attn_fn fn = kva__cpu_attn_v1, fn_tile = kva__cpu_attn_v1;
    if (part->variant == 0) {
        /* Checked against this CPU at plan time. */
        fn_tile = variants[part->variant_tiled - 1].fn;
    } else {
        fn = kva__cpu_attn_variant(part->variant);
        if (!fn)
            fn = kva__cpu_attn_v1;
        fn_tile = fn;
    }
    run->partials = ctx->workspace;
    run->scratch = (unsigned char *)ctx->workspace + partial_bytes(part);
    run->scratch_stride = kva__cpu_scratch_bytes(D, Dv);
    /* The workspace holds scratch for the plan's thread count. */
    int nt =
        ctx->num_threads < part->params.num_threads ? ctx->num_threads : part->params.num_threads;
    if (nt > part->num_items)
        nt = part->num_items;
    if (nt < 1)
        nt = 1;
    const int32_t ni = part->num_items, nk = part->num_tasks;
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
        for (int32_t i = 0; i < ni; i++) {
            const kva__work_item *it = &part->items[i];
            const int tiled = it->nq >= TILED_MIN_QUERY_ROWS && it->nq * it->nh >= TILED_MIN_ROWS;
            (tiled ? fn_tile : fn)(run, it, &s);
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
    run.kv_dt = cache ? cache->desc.dtype : plan->d.q_dtype;
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

const kva__backend_ops kva__cpu_ops = {
    .name = "cpu",
    .plan_build = cpu_plan_build,
    .plan_release = cpu_plan_release,
    .attention_paged = cpu_attention_paged,
    .attention_ragged = cpu_attention_ragged,
    .merge_states = kva__cpu_merge_states,
};
