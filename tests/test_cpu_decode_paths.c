/*
 * test_cpu_decode_paths.c - two paths of the CPU decode kernels that the
 * kernel tests reach only in passing:
 *
 *   1. Decode groups (src/attn/cpu/cpu_attn.h, "Groups"): the plan's items
 *      are cut into groups that cover every item once, in order; a group's
 *      members are groupable decode items of one request, query rows and key
 *      range with distinct kv heads; non-groupable items (prefill tiles) run
 *      alone; a decode-only plan is split so that there are enough groups for
 *      the threads. Running a plan in groups gives bitwise the outputs and
 *      LSE of running its items one by one (groups disabled), for float and
 *      quantized caches, GQA 1 / 2 / 3 / 4 / 8, on every decode kernel that runs
 *      groups, and both equal the reference.
 *   2. The int8 key scores by VNNI dot products (decode_avx512bf16 on CPUs with
 *      AVX512_VNNI): over INT8_CHANNEL (with offsets), symmetric int8 and
 *      INT8_TOKEN_K caches filled with outlier-heavy keys (channels with 8x
 *      the spread, 1% of values 20x larger), queries with outlier dims and
 *      rows of tiny values, short and long contexts, every decode kernel
 *      equals the reference over the same cache to the f32 tolerance.
 *
 * Fixed seeds, random data, outputs and LSE poisoned with NaN before each run.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

static kva_context *ctx_of(kva_backend b, int32_t threads)
{
    kva_context_desc cd = {b, threads, 0};
    kva_context *c = NULL;
    CHECK_OK(kva_context_create(&cd, &c));
    return c;
}

/* Checks the grouping invariants of a CPU plan; returns its group count. */
static int32_t check_groups(const kva_plan *plan, const char *label)
{
    const kva__partition *p = plan->part;
    CHECK_MSG(p->group_start != NULL && p->num_groups >= 1, "%s: no groups", label);
    if (!p->group_start)
        return 0;
    CHECK_MSG(p->group_start[0] == 0 && p->group_start[p->num_groups] == p->num_items,
              "%s: groups cover [%d, %d) of %d items", label, (int)p->group_start[0],
              (int)p->group_start[p->num_groups], (int)p->num_items);
    for (int32_t g = 0; g < p->num_groups; g++) {
        const int32_t a = p->group_start[g], n = p->group_start[g + 1] - a;
        CHECK_MSG(n >= 1 && n <= KVA_CPU_GROUP_MAX, "%s: group %d has %d items", label, (int)g,
                  (int)n);
        for (int32_t i = 1; i < n; i++) {
            const kva__work_item *x = &p->items[a], *y = &p->items[a + i];
            CHECK_MSG(kva__cpu_groupable(x) && kva__cpu_groupable(y) && x->req == y->req &&
                          x->i0 == y->i0 && x->nq == y->nq && x->h0 == y->h0 && x->nh == y->nh &&
                          x->k0 == y->k0 && x->k1 == y->k1 &&
                          y->kv_head > p->items[a + i - 1].kv_head,
                      "%s: group %d member %d does not match", label, (int)g, (int)i);
        }
    }
    return p->num_groups;
}

/* Replaces the plan's groups by one group per item (groups disabled). */
static void ungroup(kva_plan *plan)
{
    kva__partition *p = plan->part;
    int32_t *start = malloc(((size_t)p->num_items + 1) * sizeof *start);
    for (int32_t i = 0; i <= p->num_items; i++)
        start[i] = i;
    free(p->group_start);
    p->group_start = start;
    p->num_groups = p->num_items;
}

static void test_group_layout(void)
{
    kva_rng rng = {5150};
    kva_context *cpu = ctx_of(KVA_BACKEND_CPU, 2);
    /* Groups of more than one item only where the plans' decode kernel runs
     * them (not the portable one: KVA_CPU_ISA=portable). */
    int grouping = 0;
    {
        const int32_t q[1] = {1}, s[1] = {10};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 1, q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 8, 64, 64, KVA_DTYPE_BF16);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(cpu, &pd, &plan));
        const char *kd = plan ? kva__cpu_plan_kernel(plan, KVA__KERNEL_DECODE) : NULL;
        grouping = kva__cpu_kernel_groups(kd);
        printf("  decode kernel %s: %s\n", kd ? kd : "?", grouping ? "groups" : "no groups");
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    /* Decode-only with one long request (split), GQA 4 over 8 kv heads. */
    {
        const int32_t q[3] = {1, 1, 3}, s[3] = {4000, 100, 40};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 3, q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 32, 8, 64, 64, KVA_DTYPE_BF16);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(cpu, &pd, &plan));
        if (plan) {
            const int32_t ng = check_groups(plan, "decode-only");
            /* Every unit has 8 kv heads with the same key ranges: groups of 8. */
            CHECK_MSG(ng * (grouping ? KVA_CPU_GROUP_MAX : 1) == plan->part->num_items,
                      "%d groups of %d items", (int)ng, (int)plan->part->num_items);
            CHECK(plan->part->num_tasks > 0 || !grouping); /* the long request was split */
        }
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    /* One long decode alone: split so that 2 threads have groups to share. */
    {
        const int32_t q[1] = {1}, s[1] = {8192};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 1, q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 8, 128, 128, KVA_DTYPE_F16);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(cpu, &pd, &plan));
        if (plan) {
            const int32_t ng = check_groups(plan, "one long decode");
            CHECK_MSG(ng >= 2 * 4, "one long decode: %d groups for 2 threads", (int)ng);
        }
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    /* Mixed batch: prefill tiles are alone, decodes grouped (Hkv 4). */
    {
        const int32_t q[3] = {1, 40, 1}, s[3] = {300, 90, 77};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 3, q, s, 16, 2, 0);
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 4, 64, 64, KVA_DTYPE_F32);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(cpu, &pd, &plan));
        if (plan) {
            check_groups(plan, "mixed");
            const kva__partition *p = plan->part;
            int grouped = 0;
            for (int32_t g = 0; g < p->num_groups; g++) {
                const int32_t a = p->group_start[g], n = p->group_start[g + 1] - a;
                if (kva__cpu_item_prefill(p->items[a].nq, p->items[a].nh))
                    CHECK_MSG(n == 1, "a prefill tile shares group %d", (int)g);
                grouped += n > 1;
            }
            CHECK(grouped == (grouping ? 2 : 0)); /* the two decodes */
        }
        kva_plan_destroy(plan);
        kva_test_batch_free(&b);
    }
    kva_context_destroy(cpu);
}

/* A cache of the given kind over the batch's blocks, filled from random float
 * K/V through kva_cache_write (quantized kinds) or directly (float kinds).
 * kind: 0 f16, 1 bf16, 2 int8_channel with offsets, 3 fp8, 4 int8_token_k. */
static kva_cache *make_cache(kva_context *ctx, const kva_test_batch *b, int kind, int32_t Hkv,
                             int32_t D, kva_rng *rng)
{
    kva_cache *c = NULL;
    if (kind < 2) {
        CHECK_OK(kva_test_batch_cache(b, ctx, rng, Hkv, D, D, kind ? KVA_DTYPE_BF16 : KVA_DTYPE_F16,
                                      KVA_LAYOUT_NHD, &c));
        return c;
    }
    const kva_quant fmt = kind == 2   ? KVA_QUANT_INT8_CHANNEL
                          : kind == 3 ? KVA_QUANT_FP8_E4M3
                                      : KVA_QUANT_INT8_TOKEN_K;
    float *ps = malloc(sizeof(float) * (size_t)(4 * Hkv * D));
    float *ks = ps, *ko = ks + Hkv * D, *vs = ko + Hkv * D, *vo = vs + Hkv * D;
    for (int32_t i = 0; i < Hkv * D; i++) {
        ks[i] = (float)((1.8 + 0.7 * kva_rng_unit(rng)) / 127.0);
        ko[i] = (float)(6.0 * kva_rng_unit(rng) - 3.0);
        vs[i] = (float)((1.8 + 0.7 * kva_rng_unit(rng)) / 127.0);
        vo[i] = (float)(6.0 * kva_rng_unit(rng) - 3.0);
    }
    kva_quant_params qp = {ks, Hkv * D, ko, Hkv * D, vs, Hkv * D, vo, Hkv * D};
    if (fmt == KVA_QUANT_FP8_E4M3)
        qp = (kva_quant_params){ks, 1, NULL, 0, vs, 1, NULL, 0};
    if (fmt == KVA_QUANT_INT8_TOKEN_K)
        qp.k_scale = qp.k_offset = NULL, qp.k_scale_len = qp.k_offset_len = 0;
    kva_cache_desc cd = {b->num_blocks,
                         b->block_size,
                         Hkv,
                         D,
                         D,
                         fmt == KVA_QUANT_FP8_E4M3 ? KVA_DTYPE_FP8_E4M3 : KVA_DTYPE_I8,
                         KVA_LAYOUT_NHD,
                         fmt,
                         KVA_ATTN_MHA};
    CHECK_OK(kva_cache_create_quant(ctx, &cd, &qp, &c));
    const int64_t n = (int64_t)b->num_blocks * b->block_size;
    float *k = malloc(sizeof(float) * (size_t)(n * Hkv * D));
    float *v = malloc(sizeof(float) * (size_t)(n * Hkv * D));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)(n * Hkv * D), rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)(n * Hkv * D), rng);
    if (fmt == KVA_QUANT_FP8_E4M3)
        for (int64_t i = 0; i < n * Hkv * D; i++)
            k[i] *= 0.005f, v[i] *= 0.005f; /* within 448 * scale */
    for (int64_t i = 0; i < n; i++)
        slots[i] = i;
    if (c)
        CHECK_OK(kva_cache_write(ctx, c, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    free(k), free(v), free(slots), free(ps);
    return c;
}

/* Runs the plan (decode kernel `kernel` forced) with its groups and with groups disabled:
 * bitwise equal; both equal the reference within the q dtype's tolerance. */
static void check_grouped_run(const char *kernel, int kind, int32_t H, int32_t Hkv, kva_dtype qdt,
                              uint64_t seed)
{
    kva_rng rng = {seed};
    enum { R = 3 };
    const int32_t q[R] = {1, 1, 2}, s[R] = {700, 45, 260};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, R, q, s, 16, 2, 0);
    const int32_t D = 128;
    kva_context *ref = ctx_of(KVA_BACKEND_REF, 1), *cpu = ctx_of(KVA_BACKEND_CPU, 2);
    kva_cache *cache = make_cache(cpu, &b, kind, Hkv, D, &rng);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, qdt);
    const size_t esz = kva_dtype_size(qdt);
    const size_t nq = (size_t)b.T * H * D, no = nq, nl = (size_t)b.T * H;
    void *qv = malloc(nq * esz), *o[3];
    float *l[3];
    kva_test_fill_uniform(qv, qdt, nq, &rng);
    kva_plan *pref = NULL, *pcpu = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    if (cpu)
        CHECK_OK(kva__context_force_kernel(cpu, kernel));
    CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
    for (int i = 0; i < 3; i++) {
        o[i] = malloc(no * esz);
        l[i] = malloc(nl * sizeof(float));
        kva_test_poison(o[i], qdt, no);
        kva_test_poison(l[i], KVA_DTYPE_F32, nl);
    }
    if (cache && pref && pcpu) {
        int32_t grouped = 0;
        for (int32_t g = 0; g < pcpu->part->num_groups; g++)
            grouped += pcpu->part->group_start[g + 1] - pcpu->part->group_start[g] > 1;
        CHECK(Hkv == 1 || grouped > 0);
        CHECK_OK(kva_attention_run(ref, pref, qv, cache, NULL, o[0], l[0]));
        CHECK_OK(kva_attention_run(cpu, pcpu, qv, cache, NULL, o[1], l[1]));
        ungroup(pcpu);
        CHECK_OK(kva_attention_run(cpu, pcpu, qv, cache, NULL, o[2], l[2]));
        char label[96];
        snprintf(label, sizeof label, "%s kind %d H %d Hkv %d q %s", kernel, kind, (int)H, (int)Hkv,
                 kva_dtype_name(qdt));
        CHECK_MSG(memcmp(o[1], o[2], no * esz) == 0 && memcmp(l[1], l[2], nl * sizeof(float)) == 0,
                  "%s: grouped and item-by-item runs differ", label);
        const double atol = kva_test_atol(qdt), rtol = kva_test_rtol(qdt);
        CHECK_MSG(kva_test_compare(label, o[1], o[0], qdt, no, atol, rtol) == 0 &&
                      kva_test_compare_f32(label, l[1], l[0], nl, 2e-5, 2e-5) == 0,
                  "%s: differs from the reference", label);
    }
    for (int i = 0; i < 3; i++)
        free(o[i]), free(l[i]);
    free(qv);
    kva_plan_destroy(pref), kva_plan_destroy(pcpu);
    kva_cache_destroy(cache);
    kva_context_destroy(ref), kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

static void test_groups_equal_items(void)
{
    /* GQA 1, 4, 8, and 2, 3 (the D = 128 score loop keeps q of two heads in
     * registers and reads the others from memory: 1..4 heads per pass). */
    const int32_t shapes[5][2] = {{8, 8}, {16, 4}, {32, 4}, {8, 4}, {12, 4}};
    uint64_t seed = 900;
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t n = kva_test_cpu_kernels(k);
    for (int32_t v = 0; v < n; v++) {
        if (!k[v].runs || k[v].family != KVA__KERNEL_DECODE || !kva__cpu_kernel_groups(k[v].name))
            continue;
        for (int kind = 0; kind < 5; kind++)
            for (int sh = 0; sh < 5; sh++) {
                const kva_dtype qdt = kind == 1   ? KVA_DTYPE_BF16
                                      : kind == 0 ? KVA_DTYPE_F16
                                                  : KVA_DTYPE_F32;
                check_grouped_run(k[v].name, kind, shapes[sh][0], shapes[sh][1], qdt, seed++);
            }
    }
}

/* Outlier-heavy float K [n, Hkv, D]: channels 0 and 5 of every head have 8x
 * the spread, 1% of all values are 20x larger. */
static void fill_outliers(float *x, int64_t n, int32_t Hkv, int32_t D, kva_rng *rng)
{
    kva_test_fill_uniform(x, KVA_DTYPE_F32, (size_t)(n * Hkv * D), rng);
    for (int64_t i = 0; i < n * Hkv * D; i++) {
        const int32_t c = (int32_t)(i % D);
        if (c == 0 || c == 5)
            x[i] *= 8.0f;
        if (kva_rng_unit(rng) < 0.01)
            x[i] *= 20.0f;
    }
}

/* The int8 key paths (fp32 scores on decode_avx2 and decode_avx512, VNNI dot
 * products on decode_avx512bf16 where
 * the CPU has AVX512_VNNI) on outlier-heavy data, against the reference over
 * the same quantized cache at the f32 tolerance. */
static void test_int8_scores_outliers(void)
{
    kva_rng rng = {4711};
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    kva_test_kernel kern[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(kern);
    int vnni = 0;
    for (int32_t i = 0; i < nk; i++)
        vnni |= kern[i].runs && strcmp(kern[i].name, "decode_avx512bf16") == 0 && f.avx512vnni;
    printf("  int8 key scores: %s\n", vnni ? "decode_avx512bf16 uses VNNI dot products"
                                           : "no VNNI on this CPU (fp32 scores only)");
    const int32_t Hkv = 2, H = 8, D = 128, B = 16;
    const int32_t q[4] = {1, 1, 1, 2}, s[4] = {1, 7, 300, 1000};
    kva_context *ref = ctx_of(KVA_BACKEND_REF, 1), *cpu = ctx_of(KVA_BACKEND_CPU, 2);
    for (int fmt = 0; fmt < 3; fmt++) { /* int8_channel + offsets, symmetric, token_k */
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 4, q, s, B, 2, 0);
        const int64_t n = (int64_t)b.num_blocks * B;
        float *k = malloc(sizeof(float) * (size_t)(n * Hkv * D));
        float *v = malloc(sizeof(float) * (size_t)(n * Hkv * D));
        fill_outliers(k, n, Hkv, D, &rng);
        fill_outliers(v, n, Hkv, D, &rng);
        /* Per-channel scales and offsets calibrated to each channel's range. */
        float *ps = malloc(sizeof(float) * (size_t)(4 * Hkv * D));
        float *ks = ps, *ko = ks + Hkv * D, *vs = ko + Hkv * D, *vo = vs + Hkv * D;
        for (int32_t hc = 0; hc < Hkv * D; hc++) {
            float kmin = 1e30f, kmax = -1e30f, vmin = 1e30f, vmax = -1e30f;
            for (int64_t i = 0; i < n; i++) {
                kmin = fminf(kmin, k[i * Hkv * D + hc]), kmax = fmaxf(kmax, k[i * Hkv * D + hc]);
                vmin = fminf(vmin, v[i * Hkv * D + hc]), vmax = fmaxf(vmax, v[i * Hkv * D + hc]);
            }
            if (fmt == 1) { /* symmetric: scales from max |x| */
                ks[hc] = fmaxf(-kmin, kmax) / 127.0f, ko[hc] = 0.0f;
                vs[hc] = fmaxf(-vmin, vmax) / 127.0f, vo[hc] = 0.0f;
            } else {
                ks[hc] = (kmax - kmin) / 255.0f, ko[hc] = -128.0f - kmin / ks[hc];
                vs[hc] = (vmax - vmin) / 255.0f, vo[hc] = -128.0f - vmin / vs[hc];
            }
        }
        kva_quant_params qp = {ks, Hkv * D, ko, Hkv * D, vs, Hkv * D, vo, Hkv * D};
        if (fmt == 1)
            qp.k_offset = qp.v_offset = NULL, qp.k_offset_len = qp.v_offset_len = 0;
        if (fmt == 2)
            qp.k_scale = qp.k_offset = NULL, qp.k_scale_len = qp.k_offset_len = 0;
        const kva_quant qf = fmt == 2 ? KVA_QUANT_INT8_TOKEN_K : KVA_QUANT_INT8_CHANNEL;
        kva_cache_desc cd = {b.num_blocks,   B,  Hkv,         D, D, KVA_DTYPE_I8,
                             KVA_LAYOUT_NHD, qf, KVA_ATTN_MHA};
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create_quant(cpu, &cd, &qp, &c));
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            slots[i] = i;
        if (c)
            CHECK_OK(kva_cache_write(cpu, c, (int32_t)n, k, 0, v, 0, KVA_DTYPE_F32, slots));
        /* Queries: normal, dims 3 and 64 20x larger; token 1's rows 1e-3 smaller,
         * token 2's subnormal. */
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, KVA_DTYPE_F32);
        const size_t nq = (size_t)b.T * H * D, nl = (size_t)b.T * H;
        float *qv = malloc(nq * sizeof(float));
        kva_test_fill(qv, KVA_DTYPE_F32, nq, &rng, 1.0);
        for (size_t i = 0; i < nq; i++) {
            const size_t d = i % D, t = i / ((size_t)H * D);
            qv[i] *= (d == 3 || d == 64 ? 20.0f : 1.0f) * (t == 1 ? 1e-3f : 1.0f);
            if (t == 2) /* subnormal queries (the integer step, 2^-22 max|q|, underflows) */
                qv[i] *= 1e-39f;
        }
        float *o_ref = malloc(nq * sizeof(float)), *o_cpu = malloc(nq * sizeof(float));
        float *l_ref = malloc(nl * sizeof(float)), *l_cpu = malloc(nl * sizeof(float));
        kva_plan *pr = NULL, *pc = NULL;
        CHECK_OK(kva_plan_create(ref, &pd, &pr));
        CHECK_OK(kva_plan_create(cpu, &pd, &pc));
        kva_test_poison(o_ref, KVA_DTYPE_F32, nq);
        kva_test_poison(l_ref, KVA_DTYPE_F32, nl);
        if (c && pr && pc)
            CHECK_OK(kva_attention_run(ref, pr, qv, c, NULL, o_ref, l_ref));
        for (int32_t var = 0; var < nk && c && pr && pc; var++) {
            if (!kern[var].runs || kern[var].family != KVA__KERNEL_DECODE)
                continue;
            kva_plan_destroy(pc);
            pc = NULL;
            CHECK_OK(kva__context_force_kernel(cpu, kern[var].name));
            CHECK_OK(kva_plan_create(cpu, &pd, &pc));
            if (!pc)
                break;
            kva_test_poison(o_cpu, KVA_DTYPE_F32, nq);
            kva_test_poison(l_cpu, KVA_DTYPE_F32, nl);
            CHECK_OK(kva_attention_run(cpu, pc, qv, c, NULL, o_cpu, l_cpu));
            char label[64];
            snprintf(label, sizeof label, "int8 outliers fmt %d %s", fmt, kern[var].name);
            CHECK_MSG(kva_test_compare(label, o_cpu, o_ref, KVA_DTYPE_F32, nq, 2e-5, 2e-5) == 0 &&
                          kva_test_compare_f32(label, l_cpu, l_ref, nl, 2e-5, 2e-5) == 0,
                      "%s", label);
        }
        kva_plan_destroy(pr), kva_plan_destroy(pc);
        kva_cache_destroy(c);
        free(qv), free(o_ref), free(o_cpu), free(l_ref), free(l_cpu);
        free(k), free(v), free(ps), free(slots);
        kva_test_batch_free(&b);
    }
    kva_context_destroy(ref), kva_context_destroy(cpu);
}

int main(void)
{
    RUN(test_group_layout);
    RUN(test_groups_equal_items);
    RUN(test_int8_scores_outliers);
    return kva_test_finish();
}
