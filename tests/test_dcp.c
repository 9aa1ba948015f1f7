/*
 * test_dcp.c - decode context parallelism (DCP) on the reference and the CPU
 * backend, through the public API:
 *
 *   1. for N = 1, 2, 3, 4, 8 ranks and interleave I = 1 and B, every rank's
 *      cache is filled through kva_dcp_slots (each rank given every token's
 *      K/V, keeping its own), every rank runs its sharded plan, and
 *      kva_merge_states_n of the N partials equals the unsharded run of the
 *      same backend: for every cache format (f32, f16, bf16, int8 per channel,
 *      int8 per-token keys, int8 keys + f16 values, fp8), for every mask
 *      (causal, sliding window, ALiBi + soft-cap, sinks, non-causal), on a
 *      mixed batch (decodes, spec decodes, a prefill chunk, a long decode that
 *      the CPU splits, requests shorter than N * I so some ranks hold nothing);
 *   2. the local lengths follow the formula, kva_dcp_slots maps every token to
 *      exactly one rank;
 *   3. kva_merge_states_n equals the reference merge on random partials with
 *      -inf and NaN parts, in f32 and, in f16 and bf16 on every CPU row path
 *      (native, AVX2 and portable, KVA_CPU_ISA), against the reference
 *      backend's;
 *   4. bad input: the DCP fields, the helpers and the merge fail with a clear
 *      status and change nothing.
 *
 * KVA_TEST_QUICK=1 (the sanitizer run) runs half of each case's ten (N, I)
 * pairs in 1 (and in its forced-kernel cases): N = 1, 2, 3, 4 and 8 once
 * each, I alternating, the half alternating with the format and the mask
 * (and the kernel), so every (backend, format), (backend, mask) and (kernel,
 * format) pair still meets all ten.
 *
 * Tolerances: the dtype's (bench/data.h) plus, since every partial output is
 * rounded to the dtype before the combine, the dtype's relative tolerance
 * times the largest |partial| of the element (a convex combination of the
 * partials carries at most their largest rounding error).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cpu_kernels.h"
#include "dcp_util.h"

/* One (backend, format, mask): the unsharded run against the combine of N
 * sharded runs, for every N and I, or (half 0 or 1) for the (N, I) pairs whose
 * index of N plus (I > 1) has half's parity. */
static void check_case(kva_backend be, const fmt *f, const mask *m, const char *kernel, int half)
{
    kva_context *ctx = new_ctx(be, 2);
    if (kernel)
        CHECK_OK(kva__context_force_kernel(ctx, kernel));
    kva_rng rng = {99};
    dcp_data dd;
    dcp_data_make(f, &rng, &dd);
    const int32_t T = dd.T;
    const size_t es = dd.es, on = dd.on;
    const float *k = dd.k, *v = dd.v;
    const void *q = dd.q;
    float slopes[H], sinks[H];
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)(0.05 * (h + 1));
        sinks[h] = (float)(kva_rng_unit(&rng) * 2.0);
    }
    const float *sk = m->sinks ? sinks : NULL;

    /* Unsharded (N = 1 through the same helpers, dcp_size 0). */
    rank_run full;
    void *want = malloc(es * on);
    float *want_lse = malloc(sizeof(float) * T * H);
    CHECK_OK(setup_rank(ctx, f, m, 0, 0, 0, k, v, slopes, &full, NULL));
    kva_test_poison(want, f->q_dt, on);
    CHECK_OK(kva_attention_run(ctx, full.plan, q, full.cache, sk, want, want_lse));
    free_rank(&full);

    static const int32_t Ns[] = {1, 2, 3, 4, 8};
    void *parts = malloc(es * on * 8), *got = malloc(es * on);
    float *lses = malloc(sizeof(float) * T * H * 8), *got_lse = malloc(sizeof(float) * T * H);
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
        for (int32_t I = 1; I <= B; I += B - 1) {
            if (half >= 0 && (int)(ni + (I > 1) + (size_t)half) % 2)
                continue;
            const int32_t N = Ns[ni];
            kva_test_poison(parts, f->q_dt, on * N);
            for (int32_t rank = 0; rank < N; rank++) {
                rank_run rr;
                CHECK_OK(setup_rank(ctx, f, m, N, rank, I, k, v, slopes, &rr, NULL));
                CHECK_OK(kva_attention_run(ctx, rr.plan, q, rr.cache, sk,
                                           (char *)parts + es * on * rank, lses + T * H * rank));
                free_rank(&rr);
            }
            kva_test_poison(got, f->q_dt, on);
            CHECK_OK(
                kva_merge_states_n(ctx, N, T, H, DV, f->q_dt, parts, 0, lses, 0, got, got_lse));
            char label[160];
            snprintf(label, sizeof label, "%s%s%s %s %s N=%d I=%d", kva_backend_name(be),
                     kernel ? " " : "", kernel ? kernel : "", f->name, m->name, (int)N, (int)I);
            const size_t bad = dcp_compare(label, f->q_dt, got, want, parts, N, on, 0.0);
            CHECK_MSG(bad == 0, "%s: out, %zu elements differ", label, bad);
            CHECK_MSG(kva_test_compare_f32(label, got_lse, want_lse, (size_t)T * H, 1e-4, 1e-5) ==
                          0,
                      "%s: lse", label);
        }
    }
    free(parts), free(got), free(lses), free(got_lse), free(want), free(want_lse);
    dcp_data_free(&dd);
    kva_context_destroy(ctx);
}

static void test_equal_unsharded(void)
{
    const kva_backend bes[] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};
    for (int b = 0; b < 2; b++)
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
            for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++)
                check_case(bes[b], &fmts[fi], &masks[mi], NULL,
                           kva_test_quick() ? (int)(b + fi + mi) % 2 : -1);
}

/* Every CPU kernel that runs here (forced), on the masks that read positions
 * (window: the local key range; ALiBi: kva__key_pos in each kernel). */
static void test_cpu_kernels(void)
{
    kva_test_kernel ks[KVA_TEST_MAX_KERNELS];
    const int32_t n = kva_test_cpu_kernels(ks);
    for (int32_t i = 0; i < n; i++) {
        if (!ks[i].runs)
            continue;
        for (int fi = 0; fi < 3; fi += 2) /* f32, bf16 */
            for (int mi = 1; mi <= 2; mi++)
                check_case(KVA_BACKEND_CPU, &fmts[fi], &masks[mi], ks[i].name,
                           kva_test_quick() ? (int)(i + fi / 2 + mi) % 2 : -1);
    }
}

/* The local lengths and the slot mapping against a direct count. */
static void test_layout(void)
{
    for (int32_t N = 1; N <= 8; N++)
        for (int32_t I = 1; I <= 16; I *= 2) {
            int32_t lens[40], sum_lens[40] = {0};
            for (int32_t s = 0; s < 40; s++)
                lens[s] = s * 7;
            for (int32_t rank = 0; rank < N; rank++) {
                int32_t local[40];
                CHECK_OK(kva_dcp_local_lens(40, lens, N, rank, I, local));
                for (int32_t s = 0; s < 40; s++) {
                    int32_t count = 0;
                    for (int32_t i = 0; i < lens[s]; i++)
                        count += (i / I) % N == rank;
                    CHECK(local[s] == count);
                    const int32_t span = N * I;
                    CHECK(local[s] <= (lens[s] + span - 1) / span * I);
                    sum_lens[s] += local[s];
                }
            }
            for (int32_t s = 0; s < 40; s++)
                CHECK(sum_lens[s] == lens[s]);
        }
    /* Slots: every position on exactly one rank, at its local index. */
    const int32_t N = 3, I = 4, BS = 4, S = 50;
    int32_t row[8];
    for (int32_t j = 0; j < 8; j++)
        row[j] = 10 + 3 * j;
    int owners[S];
    memset(owners, 0, sizeof owners);
    for (int32_t rank = 0; rank < N; rank++) {
        int64_t slots[S];
        CHECK_OK(kva_dcp_slots(N, rank, I, BS, row, 8, 0, S, slots));
        int32_t local = 0;
        for (int32_t i = 0; i < S; i++) {
            if ((i / I) % N != rank) {
                CHECK(slots[i] == -1);
                continue;
            }
            owners[i]++;
            CHECK(slots[i] == (int64_t)row[local / BS] * BS + local % BS);
            local++;
        }
        /* A later window of positions maps the same way. */
        int64_t tail[7];
        CHECK_OK(kva_dcp_slots(N, rank, I, BS, row, 8, 40, 7, tail));
        for (int32_t i = 0; i < 7; i++)
            CHECK(tail[i] == slots[40 + i]);
    }
    for (int32_t i = 0; i < S; i++)
        CHECK(owners[i] == 1);
}

/* kva_merge_states_n on random partials (some -inf, one NaN row) against a
 * fold of kva_merge_states on the reference backend, in f32. Hm = 10: the
 * CPU backend takes rows 0-7 of a token 8 at a time (AVX2 weights, the
 * special rows 2, 4, 5 among them) and rows 8-9 one by one. */
static void test_merge_n(void)
{
    const int32_t P = 5, T = 7, Hm = 10, Dm = 16, rows = T * Hm;
    kva_rng rng = {7};
    float *outs = malloc(sizeof(float) * P * rows * Dm), *lses = malloc(sizeof(float) * P * rows);
    kva_test_fill_uniform(outs, KVA_DTYPE_F32, (size_t)P * rows * Dm, &rng);
    for (int32_t i = 0; i < P * rows; i++)
        lses[i] = (float)(kva_rng_unit(&rng) * 20.0 - 10.0);
    for (int32_t p = 0; p < P; p++)
        lses[p * rows + 2] = -INFINITY; /* row 2: no key anywhere */
    lses[1 * rows + 4] = -INFINITY;     /* row 4: part 1 empty, its out NaN */
    for (int32_t c = 0; c < Dm; c++)
        outs[(1 * rows + 4) * Dm + c] = NAN;
    lses[3 * rows + 5] = NAN; /* row 5: a NaN part */
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1);
    float *want = malloc(sizeof(float) * rows * Dm), *wl = malloc(sizeof(float) * rows);
    memcpy(want, outs, sizeof(float) * rows * Dm);
    memcpy(wl, lses, sizeof(float) * rows);
    for (int32_t p = 1; p < P; p++)
        CHECK_OK(kva_merge_states(ref, T, Hm, Dm, KVA_DTYPE_F32, want, wl, outs + p * rows * Dm,
                                  lses + p * rows, want, wl));
    const kva_backend bes[] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(bes[b], 2);
        float *got = malloc(sizeof(float) * rows * Dm), *gl = malloc(sizeof(float) * rows);
        kva_test_poison(got, KVA_DTYPE_F32, (size_t)rows * Dm);
        kva_test_poison(gl, KVA_DTYPE_F32, (size_t)rows);
        CHECK_OK(kva_merge_states_n(ctx, P, T, Hm, Dm, KVA_DTYPE_F32, outs, 0, lses, 0, got, gl));
        for (int32_t n = 0; n < rows; n++) {
            for (int32_t c = 0; c < Dm; c++) {
                const float g = got[n * Dm + c], w = want[n * Dm + c];
                if (n == 5) /* written NaN, not the poison */
                    CHECK(kva_test_nan_written(got, KVA_DTYPE_F32, (size_t)n * Dm + c));
                else
                    CHECK_MSG(fabsf(g - w) <= 1e-5f + 1e-5f * fabsf(w), "row %d c %d: %g vs %g",
                              (int)n, (int)c, g, w);
            }
            if (n == 5)
                CHECK(kva_test_nan_written(gl, KVA_DTYPE_F32, (size_t)n));
            else if (n == 2)
                CHECK(gl[n] == -INFINITY && got[n * Dm] == 0.0f);
            else
                CHECK(fabsf(gl[n] - wl[n]) <= 1e-4f);
        }
        /* lse_out may be NULL; P = 1 copies the part. */
        CHECK_OK(kva_merge_states_n(ctx, 1, T, Hm, Dm, KVA_DTYPE_F32, outs, 0, lses, 0, got, NULL));
        CHECK(got[0] == outs[0] && got[rows * Dm - 1] == outs[rows * Dm - 1]);
        free(got), free(gl);
        kva_context_destroy(ctx);
    }
    free(outs), free(lses), free(want), free(wl);
    kva_context_destroy(ref);
}

/* kva_merge_states_n in f16 and bf16 on the CPU backend, on its SIMD row
 * paths (the native ISA's, AVX-512 for bf16 where the CPU has it; AVX2) and
 * its portable one, against the reference backend's merge of the same
 * partials: Dv = 152 takes the AVX2 path's 32-, 16- and 8-column steps and the
 * AVX-512 path's masked tail (24 columns), Hm = 12
 * a block of 8 rows with vector weights and 4 rows one by one; row 1 has an
 * empty part whose out is NaN (not read), row 3 a NaN part, row 6 one NaN
 * element in a part of finite lse (a NaN lane of the merged row's store). */
static void test_merge_n_dtypes(void)
{
    const int32_t P = 3, T = 5, Hm = 12, Dm = 152, rows = T * Hm;
    const size_t on = (size_t)rows * Dm;
    const kva_dtype dts[] = {KVA_DTYPE_BF16, KVA_DTYPE_F16};
    const char *isas[] = {NULL, "avx2", "portable"};
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1);
    kva_context *cpu = new_ctx(KVA_BACKEND_CPU, 2);
    float *lses = malloc(sizeof(float) * P * rows), *wl = malloc(sizeof(float) * rows),
          *gl = malloc(sizeof(float) * rows), *w32 = malloc(sizeof(float) * on),
          *g32 = malloc(sizeof(float) * on);
    for (int d = 0; d < 2; d++) {
        const kva_dtype dt = dts[d];
        const size_t es = kva_dtype_size(dt);
        kva_rng rng = {11 + (uint64_t)d};
        unsigned char *outs = malloc(es * on * P), *want = malloc(es * on), *got = malloc(es * on);
        kva_test_fill(outs, dt, on * P, &rng, 1.0);
        for (int32_t i = 0; i < P * rows; i++)
            lses[i] = (float)(kva_rng_unit(&rng) * 8.0 - 4.0);
        lses[2 * rows + 1] = -INFINITY;
        float nan = NAN;
        for (int32_t c = 0; c < Dm; c++)
            CHECK_OK(
                kva_convert(&nan, KVA_DTYPE_F32, outs + ((size_t)2 * on + Dm + c) * es, dt, 1));
        lses[1 * rows + 3] = NAN;
        CHECK_OK(kva_convert(&nan, KVA_DTYPE_F32, outs + ((size_t)6 * Dm + 5) * es, dt, 1));
        kva_test_poison(want, dt, on);
        kva_test_poison(wl, KVA_DTYPE_F32, (size_t)rows);
        CHECK_OK(kva_merge_states_n(ref, P, T, Hm, Dm, dt, outs, 0, lses, 0, want, wl));
        CHECK_OK(kva_convert(want, dt, w32, KVA_DTYPE_F32, on));
        for (int i = 0; i < 3; i++) {
            if (isas[i])
                setenv("KVA_CPU_ISA", isas[i], 1);
            kva_test_poison(got, dt, on);
            kva_test_poison(gl, KVA_DTYPE_F32, (size_t)rows);
            CHECK_OK(kva_merge_states_n(cpu, P, T, Hm, Dm, dt, outs, 0, lses, 0, got, gl));
            unsetenv("KVA_CPU_ISA");
            CHECK_OK(kva_convert(got, dt, g32, KVA_DTYPE_F32, on));
            /* One unit in the last place apart at most: both outputs are
             * rounded to the dtype (the reference's from fp64, the CPU's from
             * fp32), so a value near a rounding boundary may land on either
             * side: 2^-7 (bf16), 2^-10 (f16) of the value. */
            const float rtol = dt == KVA_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f;
            size_t bad = 0;
            for (int32_t n = 0; n < rows; n++) {
                for (int32_t c = 0; c < Dm; c++) {
                    /* An expected NaN (row 3, or the reference's NaN) must
                     * have been written on both sides: the poison fails. */
                    const size_t e = (size_t)n * Dm + c;
                    const float g = g32[e], w = w32[e];
                    const int nan_ok =
                        kva_test_nan_written(got, dt, e) && !kva_test_poisoned(want, dt, e);
                    bad +=
                        n == 3 || isnan(w) ? !nan_ok : !(fabsf(g - w) <= 1e-6f + rtol * fabsf(w));
                }
                bad += n == 3 ? !kva_test_nan_written(gl, KVA_DTYPE_F32, (size_t)n)
                              : !(fabsf(gl[n] - wl[n]) <= 1e-5f);
            }
            CHECK_MSG(bad == 0, "%s %s: %zu values differ from the reference", kva_dtype_name(dt),
                      isas[i] ? isas[i] : "native ISA", bad);
        }
        free(outs), free(want), free(got);
    }
    free(lses), free(wl), free(gl), free(w32), free(g32);
    kva_context_destroy(cpu);
    kva_context_destroy(ref);
}

static void test_bad_input(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    int32_t qsl[2] = {0, 1}, sl[1] = {40}, bt[2] = {1, 2};
    kva_plan_desc pd = {0};
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = sl;
    pd.block_table = bt;
    pd.block_table_stride = 2;
    pd.block_size = 8;
    pd.num_heads = 4;
    pd.num_kv_heads = 2;
    pd.head_dim = 32;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.causal = 1;
    kva_plan *plan = NULL;
    pd.dcp_size = -1;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("dcp_size");
    pd.dcp_size = KVA_MAX_DCP + 1;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_INVALID_ARGUMENT);
    pd.dcp_size = 2;
    pd.dcp_rank = 2;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("dcp_rank");
    pd.dcp_rank = 1;
    pd.dcp_interleave = -3;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("dcp_interleave");
    CHECK(plan == NULL);
    /* 40 tokens over 2 ranks: 20 local tokens need 3 blocks of 8, the row has 2. */
    pd.dcp_interleave = 1;
    pd.block_size = 8;
    sl[0] = 40;
    CHECK_STATUS(kva_plan_create(ctx, &pd, &plan), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("on this rank");
    sl[0] = 32; /* 16 local tokens: 2 blocks fit */
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    kva_plan_destroy(plan);

    int32_t lens[2] = {5, -1}, out[2] = {77, 77};
    CHECK_STATUS(kva_dcp_local_lens(2, lens, 2, 0, 1, out), KVA_STATUS_OUT_OF_RANGE);
    CHECK(out[0] == 77 && out[1] == 77);
    CHECK_STATUS(kva_dcp_local_lens(1, lens, 2, 5, 1, out), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_local_lens(1, NULL, 2, 0, 1, out), KVA_STATUS_NULL_POINTER);
    int64_t slots[20];
    for (int i = 0; i < 20; i++)
        slots[i] = 1234;
    /* Rank 0 of 2 holds 10 of positions 0..19: 2 blocks of 4 are too few. */
    CHECK_STATUS(kva_dcp_slots(2, 0, 1, 4, bt, 2, 0, 20, slots), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("row_len");
    CHECK_STATUS(kva_dcp_slots(2, 0, 1, 0, bt, 2, 0, 4, slots), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_dcp_slots(2, 0, 1, 4, bt, 2, -1, 4, slots), KVA_STATUS_INVALID_ARGUMENT);
    for (int i = 0; i < 20; i++)
        CHECK(slots[i] == 1234);

    float outs[2 * 4 * 8], lses[2 * 4], o[4 * 8], l[4];
    for (int i = 0; i < 32; i++)
        o[i] = 5.0f;
    memset(outs, 0, sizeof outs);
    memset(lses, 0, sizeof lses);
    CHECK_STATUS(kva_merge_states_n(ctx, 0, 1, 4, 8, KVA_DTYPE_F32, outs, 0, lses, 0, o, l),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_parts");
    CHECK_STATUS(kva_merge_states_n(ctx, 2, 1, 4, 12, KVA_DTYPE_F32, outs, 0, lses, 0, o, l),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_STATUS(kva_merge_states_n(ctx, 2, 1, 4, 8, KVA_DTYPE_I8, outs, 0, lses, 0, o, l),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_STATUS(kva_merge_states_n(ctx, 2, 1, 4, 8, KVA_DTYPE_F32, outs, 0, lses, 0, outs + 32, l),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("overlaps");
    CHECK_STATUS(kva_merge_states_n(ctx, 2, 1, 4, 8, KVA_DTYPE_F32, NULL, 0, lses, 0, o, l),
                 KVA_STATUS_NULL_POINTER);
    for (int i = 0; i < 32; i++)
        CHECK(o[i] == 5.0f);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_layout);
    RUN(test_merge_n);
    RUN(test_merge_n_dtypes);
    RUN(test_bad_input);
    RUN(test_equal_unsharded);
    RUN(test_cpu_kernels);
    return kva_test_finish();
}
