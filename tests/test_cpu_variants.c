/*
 * test_cpu_variants.c - ISA detection, the kernel registry and dispatch, and
 * the SIMD kernels' specialized paths.
 *
 *   - KVA_CPU_ISA lowers the ISA level (never raises it) and unknown values are
 *     ignored; the dispatcher then picks, for decode and for prefill items,
 *     the last registry kernel of the family the level allows (decode_* and
 *     prefill_* in increasing ISA order), a plan built under
 *     KVA_CPU_ISA=portable runs the portable kernel only and one under
 *     KVA_CPU_ISA=avx2 runs decode_avx2 and prefill_avx2; the per-item shape
 *     rule (kva__cpu_item_prefill) sends decodes to the decode kernel and
 *     tiles of many query rows to the prefill kernel.
 *   - kva__context_force_kernel forces a registry kernel of one family into
 *     the plans of a context (the other family keeps the dispatcher's
 *     choice); an unknown name fails with the registry in the message, a
 *     kernel above the ISA level with KVA_STATUS_UNSUPPORTED, and a forcing
 *     that the ISA level no longer allows at plan build is ignored.
 *   - Every kernel that runs here, forced, against the reference on decode
 *     batches over the shapes the SIMD kernels specialize (D = Dv = 64, 128,
 *     256; f32, f16, bf16 caches: the bf16 q and cache path of
 *     decode_avx512bf16 uses vdpbf16ps), the
 *     runtime-D path (D = 40, Dv = 24) and GQA 1, 4, 8 and 16 (more than one
 *     register block of heads), with speculative decodes (2-4 query rows),
 *     sinks and a window; outputs are poisoned before each run; and a NaN in
 *     one cached key (its GQA group's rows NaN, all other rows unchanged);
 *   - a plan built on a 1-thread context running on a 3-thread context.
 * KVA_TEST_QUICK=1 (the sanitizer run) runs one dtype of each (head size,
 * GQA) and (block size, layout, GQA) point of the forced-kernel grids, the
 * dtypes in turn: every kernel still meets every head size, GQA, block size,
 * layout and dtype, and every pair of them (each dtype keeps its seed, hence
 * its mask case).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

static void test_isa_override(void)
{
    unsetenv("KVA_CPU_ISA");
    const kva__cpu_isa detected = kva__cpu_isa_level();
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    if (detected >= KVA__ISA_AVX2)
        CHECK(f.avx2 && f.fma && f.f16c);
    if (detected >= KVA__ISA_AVX512)
        CHECK(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
    if (detected >= KVA__ISA_AVX512BF16)
        CHECK(f.avx512bf16);
    printf("  detected ISA level: %s (%s)\n", kva__cpu_isa_name(detected), kva__cpu_isa_string());
    static const char *const names[] = {"portable", "avx2", "avx512", "avx512bf16"};
    for (int i = 0; i < 4; i++) {
        setenv("KVA_CPU_ISA", names[i], 1);
        const kva__cpu_isa want = (kva__cpu_isa)i < detected ? (kva__cpu_isa)i : detected;
        CHECK_MSG(kva__cpu_isa_level() == want, "KVA_CPU_ISA=%s gave %s", names[i],
                  kva__cpu_isa_name(kva__cpu_isa_level()));
    }
    setenv("KVA_CPU_ISA", "sse9", 1);
    CHECK(kva__cpu_isa_level() == detected);
    unsetenv("KVA_CPU_ISA");
}

/* Name of the last kernel of family f in the registry k [n] that runs at ISA
 * level `level` (required ISA read from the name's suffix). */
static const char *best_at(const kva_test_kernel *k, int32_t n, kva__kernel_family f,
                           kva__cpu_isa level)
{
    static const char *const isa[] = {"portable", "avx2", "avx512", "avx512bf16"};
    const char *best = NULL;
    for (int32_t i = 0; i < n; i++) {
        const char *suffix = strchr(k[i].name, '_') + 1;
        for (int l = 0; l <= (int)level; l++)
            if (k[i].family == f && strcmp(suffix, isa[l]) == 0)
                best = k[i].name;
    }
    return best;
}

static int same(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

static void test_dispatch(void)
{
    kva_rng rng = {77};
    kva_test_batch b;
    const int32_t q[2] = {1, 1}, s[2] = {40, 90};
    kva_test_batch_init(&b, &rng, 2, q, s, 16, 2, 0);
    const kva__cpu_isa level = kva__cpu_isa_level();
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t n = kva_test_cpu_kernels(k);
#if defined(KVA_NO_SIMD)
    /* A KVA_CPU_SIMD=OFF build registers the portable kernel of each family. */
    CHECK(n == 3 && same(k[0].name, "decode_portable") && same(k[1].name, "prefill_portable") &&
          same(k[2].name, "mla_portable") && k[0].runs && k[1].runs && k[2].runs);
    CHECK(level == KVA__ISA_PORTABLE);
#elif defined(__x86_64__)
    /* The registry: kind x ISA, each family in increasing ISA order. */
    static const char *const names[] = {"decode_portable",   "decode_avx2",       "decode_avx512",
                                        "decode_avx512bf16", "prefill_portable",  "prefill_avx2",
                                        "prefill_avx512",    "prefill_avx512bf16"};
    CHECK(n == 12);
    /* Then the MLA items (tests/test_mla.c, tests/test_mla_sparse.c force them). */
    CHECK(n == 12 && same(k[8].name, "mla_portable") && k[8].family == KVA__KERNEL_MLA &&
          k[8].runs);
    CHECK(n == 12 && same(k[9].name, "mla_avx2") && k[9].family == KVA__KERNEL_MLA &&
          k[9].runs == (level >= KVA__ISA_AVX2));
    CHECK(n == 12 && same(k[10].name, "mla_avx512") && k[10].family == KVA__KERNEL_MLA &&
          k[10].runs == (level >= KVA__ISA_AVX512));
    CHECK(n == 12 && same(k[11].name, "mla_avx512bf16") && k[11].family == KVA__KERNEL_MLA &&
          k[11].runs == (level >= KVA__ISA_AVX512BF16));
    for (int32_t i = 0; i < n && i < 8; i++) {
        CHECK_MSG(same(k[i].name, names[i]) &&
                      k[i].family == (i < 4 ? KVA__KERNEL_DECODE : KVA__KERNEL_PREFILL) &&
                      k[i].runs == (i % 4 <= (int)level),
                  "registry entry %d: %s family %d runs %d (ISA level %s)", (int)i, k[i].name,
                  (int)k[i].family, k[i].runs, kva__cpu_isa_name(level));
    }
#endif
    const char *best = best_at(k, n, KVA__KERNEL_DECODE, level);
    const char *bestp = best_at(k, n, KVA__KERNEL_PREFILL, level);
    CHECK(best && bestp);
    /* The bf16-dot prefill is the default only where vdpbf16ps beats fp32
     * FMAs (kva__cpu_features.bf16dot_fast); elsewhere the entry before it. */
    kva__cpu_features feat;
    kva__cpu_features_get(&feat);
    if (same(bestp, "prefill_avx512bf16") && !feat.bf16dot_fast)
        bestp = "prefill_avx512";
    /* Per-item shape rule: single-row decodes and short GQA-1 spec decodes
     * are decode-shaped, query tiles prefill-shaped. */
    CHECK(!kva__cpu_item_prefill(1, 8) && !kva__cpu_item_prefill(1, 64));
    CHECK(!kva__cpu_item_prefill(4, 1) && !kva__cpu_item_prefill(2, 4));
    CHECK(kva__cpu_item_prefill(4, 4) && kva__cpu_item_prefill(5, 1));
    CHECK(kva__cpu_item_prefill(32, 4) && kva__cpu_item_prefill(128, 1));

    for (int mode = 0; mode < 8; mode++) {
        /* 0: default; 1: KVA_CPU_ISA=portable; 2: decode_portable forced; 3: an
         * unknown name; 4: KVA_CPU_ISA=avx2; 5: a kernel above the (lowered)
         * ISA level; 6: forced, then the level lowered below it before plan
         * build (ignored); 7: forced, then cleared. */
        if (mode == 1)
            setenv("KVA_CPU_ISA", "portable", 1);
        if (mode == 4 || mode == 5)
            setenv("KVA_CPU_ISA", "avx2", 1);
        kva_context *ctx = NULL;
        kva_plan *plan = NULL;
        kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0};
        CHECK_OK(kva_context_create(&cd, &ctx));
        const char *want_d = best, *want_p = bestp;
        if (ctx && mode == 1)
            want_d = "decode_portable", want_p = "prefill_portable";
        if (ctx && mode == 2) {
            CHECK_OK(kva__context_force_kernel(ctx, "decode_portable"));
            want_d = "decode_portable";
        }
        if (ctx && mode == 3) {
            CHECK_STATUS(kva__context_force_kernel(ctx, "v3"), KVA_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(kva_last_error(), "decode_portable") != NULL);
        }
        if (ctx && (mode == 4 || mode == 5) && level >= KVA__ISA_AVX2)
            want_d = "decode_avx2", want_p = "prefill_avx2";
        if (ctx && (mode == 4 || mode == 5) && level < KVA__ISA_AVX2)
            want_d = "decode_portable", want_p = "prefill_portable";
        if (ctx && mode == 5 && level >= KVA__ISA_AVX512)
            CHECK_STATUS(kva__context_force_kernel(ctx, "prefill_avx512"), KVA_STATUS_UNSUPPORTED);
        if (ctx && mode == 6 && level >= KVA__ISA_AVX512) {
            CHECK_OK(kva__context_force_kernel(ctx, "prefill_avx512"));
            setenv("KVA_CPU_ISA", "avx2", 1);
            want_d = "decode_avx2", want_p = "prefill_avx2";
        }
        if (ctx && mode == 7) {
            CHECK_OK(kva__context_force_kernel(ctx, "decode_portable"));
            CHECK_OK(kva__context_force_kernel(ctx, "prefill_portable"));
            CHECK_OK(kva__context_force_kernel(ctx, NULL));
        }
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 64, 64, KVA_DTYPE_BF16);
        if (ctx)
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        if (plan) {
            const char *got_d = kva__cpu_plan_kernel(plan, KVA__KERNEL_DECODE);
            const char *got_p = kva__cpu_plan_kernel(plan, KVA__KERNEL_PREFILL);
            CHECK_MSG(same(got_d, want_d) && same(got_p, want_p),
                      "mode %d: decode %s prefill %s, want %s and %s", mode, got_d, got_p, want_d,
                      want_p);
        }
        kva_plan_destroy(plan);
        kva_context_destroy(ctx);
        unsetenv("KVA_CPU_ISA");
    }
    kva_test_batch_free(&b);
}

/* Mismatches of n dtype-dt values: a written NaN must meet a written NaN
 * (both sides were poisoned, kva_test_poison), the rest the tolerance. */
static size_t compare_nan(const char *label, const void *got, const void *want, kva_dtype dt,
                          size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = kva_test_get(got, dt, i), b = kva_test_get(want, dt, i);
        const int ok = (kva_test_nan_written(got, dt, i) && kva_test_nan_written(want, dt, i)) ||
                       (isinf(b) && a == b) ||
                       fabs(a - b) <= kva_test_atol(dt) + kva_test_rtol(dt) * fabs(b);
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s: element %zu: got %.8g, want %.8g\n", label, i, a, b);
    }
    return bad;
}

/* Writes NaN into element d of the K row of request 0's key j, kv head 0
 * (NHD cache). */
static void poison_key(kva_cache *cache, const kva_test_batch *b, int32_t Hkv, int32_t D,
                       kva_dtype dt, int32_t j, int32_t d)
{
    void *k, *v;
    kva_cache_data(cache, &k, &v);
    const int64_t blk = b->block_table[j / b->block_size], off = j % b->block_size;
    const size_t idx = (size_t)(((blk * b->block_size + off) * Hkv) * D + d);
    if (dt == KVA_DTYPE_F32)
        ((float *)k)[idx] = NAN;
    else
        ((uint16_t *)k)[idx] = dt == KVA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
}

/* One decode batch of shape (H, Hkv, D, Dv, dtype) with kernel `kernel`
 * forced, against the reference; with nan_key, one key of request 0 holds a NaN (its rows of kv
 * head 0 must come out NaN, everything else unchanged). */
static void check_shape_bl(const kva_test_kernel *kn, int32_t H, int32_t Hkv, int32_t D, int32_t Dv,
                           kva_dtype dt, uint64_t seed, int nan_key, int32_t B, kva_layout layout)
{
    kva_rng rng = {seed};
    enum { R = 4 };
    int32_t q[R], s[R];
    for (int r = 0; r < R; r++) {
        q[r] = r == 3 ? kva_rng_int(&rng, 2, 4) : 1; /* one speculative decode */
        s[r] = kva_rng_int(&rng, 33, 170) + q[r];
    }
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, R, q, s, B, 2, 0);
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(&b, cpu, &rng, Hkv, D, Dv, dt, layout, &cache));
    if (cache && nan_key)
        poison_key(cache, &b, Hkv, D, dt, b.seq_lens[0] - 3, D - 1); /* inside the window */
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, dt);
    const int variant_case = (int)(seed % 3);
    if (variant_case == 1)
        pd.window_left = 50;
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++)
        sinks[h] = (float)kva_rng_normal(&rng);
    const size_t esz = kva_dtype_size(dt);
    const size_t nq = (size_t)b.T * H * D, no = (size_t)b.T * H * Dv, nl = (size_t)b.T * H;
    void *qv = malloc(nq * esz), *o_ref = malloc(no * esz), *o_cpu = malloc(no * esz);
    float *l_ref = malloc(nl * sizeof(float)), *l_cpu = malloc(nl * sizeof(float));
    kva_test_fill_uniform(qv, dt, nq, &rng);
    kva_test_poison(o_ref, dt, no);
    kva_test_poison(o_cpu, dt, no);
    kva_test_poison(l_ref, KVA_DTYPE_F32, nl);
    kva_test_poison(l_cpu, KVA_DTYPE_F32, nl);
    const float *sk = variant_case == 2 ? sinks : NULL;

    kva_plan *pref = NULL, *pcpu = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    if (cpu)
        CHECK_OK(kva__context_force_kernel(cpu, kn->name));
    CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
    if (pref && pcpu && cache) {
        CHECK(same(kva__cpu_plan_kernel(pcpu, kn->family), kn->name));
        CHECK_OK(kva_attention_run(ref, pref, qv, cache, sk, o_ref, l_ref));
        CHECK_OK(kva_attention_run(cpu, pcpu, qv, cache, sk, o_cpu, l_cpu));
        char label[96];
        snprintf(label, sizeof label, "%s H=%d Hkv=%d D=%d Dv=%d %s case %d B=%d %s", kn->name,
                 (int)H, (int)Hkv, (int)D, (int)Dv, kva_dtype_name(dt), variant_case, (int)B,
                 layout == KVA_LAYOUT_NHD ? "NHD" : "HND");
        const size_t bad = compare_nan(label, o_cpu, o_ref, dt, no) +
                           compare_nan(label, l_cpu, l_ref, KVA_DTYPE_F32, nl);
        CHECK_MSG(bad == 0, "%s%s: %zu mismatches", label, nan_key ? " (NaN key)" : "", bad);
        if (nan_key) {
            /* Request 0 is a decode: its token's heads 0 .. G-1 (kv head 0) are NaN. */
            size_t nan_rows = 0;
            for (size_t i = 0; i < nl; i++)
                nan_rows += kva_test_nan_written(l_cpu, KVA_DTYPE_F32, i);
            CHECK_MSG(nan_rows == (size_t)(H / Hkv), "%s: %zu NaN rows, want %d", label, nan_rows,
                      (int)(H / Hkv));
        }
    }
    kva_plan_destroy(pref);
    kva_plan_destroy(pcpu);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_test_batch_free(&b);
    free(sinks);
    free(qv);
    free(o_ref);
    free(o_cpu);
    free(l_ref);
    free(l_cpu);
}

static void check_shape(const kva_test_kernel *kn, int32_t H, int32_t Hkv, int32_t D, int32_t Dv,
                        kva_dtype dt, uint64_t seed, int nan_key)
{
    check_shape_bl(kn, H, Hkv, D, Dv, dt, seed, nan_key, 16, KVA_LAYOUT_NHD);
}

/* The AVX-512 decode loops visit the keys of an NHD cache with Hkv > 1 in
 * groups of 4 in the order 0, 2, 1, 3 (key_at in decode_loop.h), and
 * only the groups that lie inside a query row's visible keys: both AVX-512
 * decode kernels against the reference over NHD and HND caches, block sizes 5
 * (not a power of two), 16 and 24 (blocks straddling the 32-key chunks),
 * GQA 1, 2, 4 and 8 over 4 kv heads, each row format, D = 128 (the one-pass
 * scores) and 40/24 (runtime D), with spec decodes (ragged visible ranges
 * inside a chunk), windows and sinks (check_shape's cases). */
static void test_key_order(void)
{
    static const int32_t blocks[] = {5, 16, 24};
    static const int32_t gqa[] = {1, 2, 4, 8};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    uint64_t seed = 900;
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t n = kva_test_cpu_kernels(k);
    for (int32_t v = 0; v < n; v++) {
        if (!k[v].runs || strncmp(k[v].name, "decode_avx512", 13) != 0)
            continue;
        for (int bi = 0; bi < 3; bi++)
            for (int li = 0; li < 2; li++)
                for (int gi = 0; gi < 4; gi++)
                    for (int ti = 0; ti < 3; ti++, seed++) {
                        if (kva_test_quick() && ti != (bi + li + gi) % 3)
                            continue;
                        const kva_layout lay = li ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
                        const int32_t D = gi % 2 ? 40 : 128, Dv = gi % 2 ? 24 : 128;
                        check_shape_bl(&k[v], 4 * gqa[gi], 4, D, Dv, dts[ti], seed, 0, blocks[bi],
                                       lay);
                    }
    }
}

static void test_variant_shapes(void)
{
    static const int32_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {40, 24}};
    static const int32_t gqa[] = {1, 4, 8, 16};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    uint64_t seed = 500;
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t n = kva_test_cpu_kernels(k);
    for (int32_t v = 0; v < n; v++) {
        if (!k[v].runs || k[v].family == KVA__KERNEL_MLA) /* MLA: tests/test_mla.c */
            continue;
        for (int di = 0; di < 4; di++)
            for (int gi = 0; gi < 4; gi++)
                for (int ti = 0; ti < 3; ti++, seed++) {
                    if (kva_test_quick() && ti != (di + gi) % 3)
                        continue;
                    const int32_t Hkv = gi == 3 ? 1 : 2;
                    check_shape(&k[v], Hkv * gqa[gi], Hkv, dims[di][0], dims[di][1], dts[ti], seed,
                                0);
                }
        /* A NaN key, each row format and the bf16-dot path. */
        for (int ti = 0; ti < 3; ti++)
            for (int gi = 1; gi < 3; gi++)
                check_shape(&k[v], 2 * gqa[gi], 2, 128, 128, dts[ti], seed++, 1);
    }
}

/* A plan built on a 1-thread context runs on a 3-thread context whose
 * workspace holds 3 scratch areas (reserved by its own plan): the run may use
 * all 3 threads (each with its own scratch: ASan checks the bounds) and must
 * match the reference. */
static void test_plan_on_wider_context(void)
{
    kva_rng rng = {4711};
    enum { R = 6 };
    int32_t q[R], s[R];
    for (int r = 0; r < R; r++) {
        q[r] = 1;
        s[r] = kva_rng_int(&rng, 100, 300);
    }
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, R, q, s, 16, 2, 0);
    const int32_t H = 8, Hkv = 2, D = 64;
    const kva_dtype dt = KVA_DTYPE_F32;
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0}, c1d = {KVA_BACKEND_CPU, 1, 0},
                     c3d = {KVA_BACKEND_CPU, 3, 0};
    kva_context *ref = NULL, *c1 = NULL, *c3 = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&c1d, &c1));
    CHECK_OK(kva_context_create(&c3d, &c3));
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(&b, c1, &rng, Hkv, D, D, dt, KVA_LAYOUT_NHD, &cache));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, dt);
    kva_plan *pref = NULL, *p1 = NULL, *p3 = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    CHECK_OK(kva_plan_create(c1, &pd, &p1));
    CHECK_OK(kva_plan_create(c3, &pd, &p3));
    const size_t no = (size_t)b.T * H * D, nl = (size_t)b.T * H;
    float *qv = malloc(no * sizeof(float)), *o_ref = malloc(no * sizeof(float)),
          *o = malloc(no * sizeof(float)), *l_ref = malloc(nl * sizeof(float)),
          *l = malloc(nl * sizeof(float));
    kva_test_fill_uniform(qv, dt, no, &rng);
    kva_test_poison(o, dt, no);
    kva_test_poison(l, KVA_DTYPE_F32, nl);
    if (pref && p1 && p3 && cache) {
        CHECK(p1->part->params.num_threads == 1 && p1->part->num_items >= 3);
        CHECK_OK(kva_attention_run(ref, pref, qv, cache, NULL, o_ref, l_ref));
        CHECK_OK(kva_attention_run(c3, p1, qv, cache, NULL, o, l));
        const size_t bad =
            compare_nan("1-thread plan on 3 threads", o, o_ref, dt, no) +
            compare_nan("1-thread plan on 3 threads (lse)", l, l_ref, KVA_DTYPE_F32, nl);
        CHECK_MSG(bad == 0, "%zu mismatches", bad);
    }
    kva_plan_destroy(pref);
    kva_plan_destroy(p1);
    kva_plan_destroy(p3);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(c1);
    kva_context_destroy(c3);
    kva_test_batch_free(&b);
    free(qv);
    free(o_ref);
    free(o);
    free(l_ref);
    free(l);
}

int main(void)
{
    RUN(test_isa_override);
    RUN(test_dispatch);
    RUN(test_variant_shapes);
    RUN(test_key_order);
    RUN(test_plan_on_wider_context);
    return kva_test_finish();
}
