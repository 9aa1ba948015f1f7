/*
 * test_ref_merge.c - the reference backend's merge_states, the split-and-merge
 * identity of kva_attention_run, and rows that see no key.
 *
 * merge_states is checked against a direct evaluation of the formula in the
 * header (exp of each lse, no max subtraction, so it shares no code path with
 * the stable kernel), including -inf on either side and both, large lse values
 * and in-place aliasing. The split identity is checked on paged plans whose
 * block tables point at the right blocks and on ragged plans over slices of
 * packed K/V.
 *
 * Empty rows: through the public API no row can be empty. kva_plan_create
 * requires q_len <= seq_len, so pos = seq_len - q_len + i lies in
 * [0, seq_len), and key j = pos passes every clause of the mask (j < seq_len,
 * j <= pos, pos - j = 0 <= window_left for any window >= 0). The -inf state
 * therefore reaches users only through merge_states (a part of a split that
 * saw nothing, or a padding row). The kernels still implement the documented
 * empty-row result, which is tested here by calling the backend table
 * directly with a hand-built plan that has q_len > seq_len.
 */
#include "batchgen.h"
#include "internal.h"

#include <math.h>

static const kva_context_desc REF = {KVA_BACKEND_REF, 0, 0};
static const kva_dtype DTYPES[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};

/* ------------------------------------------------------------------------ */
/* merge_states                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Direct merge of rows [n, Dv] of out_a/out_b in dtype dt into want_out
 * (double) and want_lse. Every row's lse pair is offset[n] + small values, so
 * the direct exp() cannot overflow once the known offset is taken out.
 */
static void merge_direct(size_t rows, int32_t Dv, kva_dtype dt, const void *a, const float *la,
                         const void *b, const float *lb, const double *offset, double *want,
                         double *want_lse)
{
    for (size_t n = 0; n < rows; n++) {
        double *w = want + n * (size_t)Dv;
        if (la[n] == -INFINITY && lb[n] == -INFINITY) {
            for (int32_t c = 0; c < Dv; c++)
                w[c] = 0.0;
            want_lse[n] = -INFINITY;
            continue;
        }
        const double ea = la[n] == -INFINITY ? 0.0 : exp((double)la[n] - offset[n]);
        const double eb = lb[n] == -INFINITY ? 0.0 : exp((double)lb[n] - offset[n]);
        for (int32_t c = 0; c < Dv; c++) {
            double x = 0.0;
            if (ea != 0.0)
                x += ea * kva_test_get(a, dt, n * (size_t)Dv + (size_t)c);
            if (eb != 0.0)
                x += eb * kva_test_get(b, dt, n * (size_t)Dv + (size_t)c);
            w[c] = x / (ea + eb);
        }
        want_lse[n] = offset[n] + log(ea + eb);
    }
}

/* Compares out (dt) and lse with the double truth; returns the mismatches. */
static size_t compare_merge(const char *label, const void *out, const float *lse, kva_dtype dt,
                            const double *want, const double *want_lse, size_t rows, int32_t Dv)
{
    const size_t n = rows * (size_t)Dv;
    float *got = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n);
    float *wl = malloc(sizeof(float) * rows);
    for (size_t i = 0; i < n; i++) {
        got[i] = (float)kva_test_get(out, dt, i);
        w[i] = (float)want[i];
    }
    for (size_t i = 0; i < rows; i++)
        wl[i] = (float)want_lse[i];
    size_t bad =
        kva_test_compare(label, got, w, KVA_DTYPE_F32, n, kva_test_atol(dt), kva_test_rtol(dt));
    bad += kva_test_compare_f32(label, lse, wl, rows, kva_test_atol(KVA_DTYPE_F32),
                                kva_test_rtol(KVA_DTYPE_F32));
    free(got);
    free(w);
    free(wl);
    return bad;
}

/*
 * Random states with, by row: both finite (some near +-800, beyond exp's
 * range without the max subtraction), a = -inf, b = -inf, both -inf. The
 * out row of a -inf side holds large finite garbage that must not leak in.
 * Then: a fresh output, out aliasing a, and out aliasing b.
 */
static void test_merge_random(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    kva_rng rng = {0x6d65726765ull};
    const int32_t T = 9, H = 3, dims[3] = {8, 136, 256};
    const size_t rows = (size_t)T * H;
    for (int di = 0; di < 3; di++) {
        for (int ti = 0; ti < 3; ti++) {
            const kva_dtype dt = DTYPES[ti];
            const int32_t Dv = dims[(di + ti) % 3];
            const size_t n = rows * (size_t)Dv, bytes = n * kva_dtype_size(dt);
            void *a = malloc(bytes), *b = malloc(bytes), *out = malloc(bytes);
            void *a2 = malloc(bytes), *b2 = malloc(bytes);
            float *la = malloc(sizeof(float) * rows), *lb = malloc(sizeof(float) * rows);
            float *lo = malloc(sizeof(float) * rows);
            float *la2 = malloc(sizeof(float) * rows), *lb2 = malloc(sizeof(float) * rows);
            double *offset = malloc(sizeof(double) * rows);
            double *want = malloc(sizeof(double) * n), *want_lse = malloc(sizeof(double) * rows);
            kva_test_fill(a, dt, n, &rng, 1.0);
            kva_test_fill(b, dt, n, &rng, 1.0);
            for (size_t r = 0; r < rows; r++) {
                offset[r] = r % 5 == 1 ? 800.0 : r % 5 == 3 ? -800.0 : 0.0;
                la[r] = (float)(offset[r] + kva_rng_normal(&rng) * 3.0);
                lb[r] = (float)(offset[r] + kva_rng_normal(&rng) * 3.0);
                int kind = (int)(r % 7);
                if (kind == 2 || kind == 6)
                    la[r] = -INFINITY;
                if (kind == 4 || kind == 6)
                    lb[r] = -INFINITY;
                for (int32_t c = 0; c < Dv; c++) {
                    if (la[r] == -INFINITY)
                        kva__store_f(a, dt, r * (size_t)Dv + (size_t)c, 1.0e4f);
                    if (lb[r] == -INFINITY)
                        kva__store_f(b, dt, r * (size_t)Dv + (size_t)c, -1.0e4f);
                }
            }
            merge_direct(rows, Dv, dt, a, la, b, lb, offset, want, want_lse);
            char label[96];

            /* Separate output. */
            snprintf(label, sizeof label, "merge %s Dv=%d", kva_dtype_name(dt), (int)Dv);
            kva_test_poison(out, dt, n);
            kva_test_poison(lo, KVA_DTYPE_F32, rows);
            CHECK_OK(kva_merge_states(ctx, T, H, Dv, dt, a, la, b, lb, out, lo));
            CHECK_MSG(compare_merge(label, out, lo, dt, want, want_lse, rows, Dv) == 0, "%s",
                      label);

            /* In place on a, then on b: the same bits as the separate output. */
            memcpy(a2, a, bytes);
            memcpy(la2, la, sizeof(float) * rows);
            CHECK_OK(kva_merge_states(ctx, T, H, Dv, dt, a2, la2, b, lb, a2, la2));
            CHECK_MSG(memcmp(a2, out, bytes) == 0 && memcmp(la2, lo, sizeof(float) * rows) == 0,
                      "%s: in place on a differs", label);
            memcpy(b2, b, bytes);
            memcpy(lb2, lb, sizeof(float) * rows);
            CHECK_OK(kva_merge_states(ctx, T, H, Dv, dt, a, la, b2, lb2, b2, lb2));
            CHECK_MSG(memcmp(b2, out, bytes) == 0 && memcmp(lb2, lo, sizeof(float) * rows) == 0,
                      "%s: in place on b differs", label);

            free(a), free(b), free(out), free(a2), free(b2);
            free(la), free(lb), free(lo), free(la2), free(lb2);
            free(offset), free(want), free(want_lse);
        }
    }
    kva_context_destroy(ctx);
}

/* Hand-computed merges of one row (Dv = 8, f32). */
static void test_merge_hand(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    float a[8], b[8], out[8], lo[1];
    for (int c = 0; c < 8; c++) {
        a[c] = 2.0f;
        b[c] = -4.0f;
    }
    /* Equal lse: the mean, and lse + log 2. */
    float la = 1.5f, lb = 1.5f;
    CHECK_OK(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, a, &la, b, &lb, out, lo));
    for (int c = 0; c < 8; c++)
        CHECK(fabs(out[c] - (-1.0)) <= 1e-6);
    CHECK(fabs(lo[0] - (1.5 + 0.6931471805599453)) <= 1e-6);
    /* lse_b = lse_a + log 3: weights 1/4 and 3/4 -> 2/4 - 12/4 = -2.5; lse_a + log 4. */
    la = 1000.0f;
    lb = (float)(1000.0 + 1.0986122886681098);
    CHECK_OK(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, a, &la, b, &lb, out, lo));
    for (int c = 0; c < 8; c++)
        CHECK_MSG(fabs(out[c] - (-2.5)) <= 1e-4, "%.9g", out[c]);
    CHECK_MSG(fabs(lo[0] - (1000.0 + 1.3862943611198906)) <= 1e-4, "%.9g", lo[0]);
    /* One side -inf: the other side unchanged, even if the empty side's out is NaN
     * (the reference never multiplies a zero weight into its out row). */
    la = -INFINITY;
    lb = -7.25f;
    for (int c = 0; c < 8; c++)
        a[c] = NAN;
    CHECK_OK(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, a, &la, b, &lb, out, lo));
    for (int c = 0; c < 8; c++)
        CHECK(out[c] == -4.0f);
    CHECK(lo[0] == -7.25f);
    CHECK_OK(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, b, &lb, a, &la, out, lo));
    for (int c = 0; c < 8; c++)
        CHECK(out[c] == -4.0f);
    CHECK(lo[0] == -7.25f);
    /* Both -inf: zeros and -inf. */
    lb = -INFINITY;
    kva_test_poison(out, KVA_DTYPE_F32, 8);
    CHECK_OK(kva_merge_states(ctx, 1, 1, 8, KVA_DTYPE_F32, a, &la, b, &lb, out, lo));
    for (int c = 0; c < 8; c++)
        CHECK(out[c] == 0.0f);
    CHECK(lo[0] == -INFINITY);
    kva_context_destroy(ctx);
}

/* ------------------------------------------------------------------------ */
/* Split and merge equals the whole                                          */
/* ------------------------------------------------------------------------ */

/*
 * Why these splits are exact: for query i of a request with q_len q and
 * seq_len s, pos = s - q + i >= s - q. Split the keys at a with
 * q <= a <= s - q (so both parts are valid plans, q_len <= seq_len):
 *   part A, keys [0, a): every j < a <= s - q <= pos is visible under the
 *     causal mask, so A is a non-causal plan with seq_len a;
 *   part B, keys [a, s): a plan with seq_len s - a puts query i at
 *     pos' = pos - a and key j at j' = j - a, so j' <= pos' iff j <= pos:
 *     B keeps the causal mask as is.
 * The scale and soft-cap act per score and carry over. (A window or ALiBi
 * would shift with the part's positions, so they are off here: ALiBi adds the
 * constant -slope*(s - a) to every score of part A, which moves its lse.)
 */

/* The shape of the states a split test merges. */
typedef struct split_run {
    kva_context *ctx;
    kva_dtype dt;
    int32_t T, H, Dv;
} split_run;

/* Checks merge(A, B) == whole and also merge(whole, empty) == whole with the
 * empty side (lse -inf) on either side, in place. */
static void check_merged(const split_run *sr, const char *label, const void *out_w,
                         const float *lse_w, void *out_a, float *lse_a, const void *out_b,
                         const float *lse_b)
{
    const size_t rows = (size_t)sr->T * sr->H, n = rows * (size_t)sr->Dv;
    const size_t bytes = n * kva_dtype_size(sr->dt);
    /* Each part was rounded to the dtype before the merge, an error of up to an
     * ulp of the part's elements, which can be much larger than the merged
     * element when the parts cancel. So: atol = one ulp of the largest part
     * element for each of the two parts, plus the dtype's own tolerance. */
    double part_max = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs(kva_test_get(out_a, sr->dt, i)), b = fabs(kva_test_get(out_b, sr->dt, i));
        part_max = a > part_max ? a : part_max;
        part_max = b > part_max ? b : part_max;
    }
    /* Merge in place into A. */
    CHECK_OK(kva_merge_states(sr->ctx, sr->T, sr->H, sr->Dv, sr->dt, out_a, lse_a, out_b, lse_b,
                              out_a, lse_a));
    const double ulp_rel = sr->dt == KVA_DTYPE_F16    ? 0x1p-10
                           : sr->dt == KVA_DTYPE_BF16 ? 0x1p-7
                                                      : 0x1p-23;
    const double atol = kva_test_atol(sr->dt) + 2 * ulp_rel * part_max;
    const double rtol = 2 * kva_test_rtol(sr->dt);
    size_t bad = kva_test_compare(label, out_a, out_w, sr->dt, n, atol, rtol);
    bad += kva_test_compare_f32(label, lse_a, lse_w, rows, 1e-5, 1e-5);
    CHECK_MSG(bad == 0, "%s: merge(A, B) != whole (%zu mismatches)", label, bad);

    /* An empty state (lse -inf, garbage out) on either side is the identity. */
    void *garbage = malloc(bytes), *acc = malloc(bytes);
    float *ninf = malloc(sizeof(float) * rows), *lacc = malloc(sizeof(float) * rows);
    kva_rng rng = {77};
    kva_test_fill(garbage, sr->dt, n, &rng, 100.0);
    for (size_t r = 0; r < rows; r++)
        ninf[r] = -INFINITY;
    for (int side = 0; side < 2; side++) {
        memcpy(acc, out_w, bytes);
        memcpy(lacc, lse_w, sizeof(float) * rows);
        if (side == 0)
            CHECK_OK(kva_merge_states(sr->ctx, sr->T, sr->H, sr->Dv, sr->dt, acc, lacc, garbage,
                                      ninf, acc, lacc));
        else
            CHECK_OK(kva_merge_states(sr->ctx, sr->T, sr->H, sr->Dv, sr->dt, garbage, ninf, acc,
                                      lacc, acc, lacc));
        bad = kva_test_compare(label, acc, out_w, sr->dt, n, 0.0, 0.0);
        bad += kva_test_compare_f32(label, lacc, lse_w, rows, 0.0, 0.0);
        CHECK_MSG(bad == 0, "%s: merge with an empty side %d changed the state", label, side);
    }
    free(garbage);
    free(acc);
    free(ninf);
    free(lacc);
}

/* Paged: B = 16; part A reads the first a/16 blocks, part B a table shifted by a/16. */
static void test_split_paged(void)
{
    kva_rng rng = {0x73706c6974ull};
    enum { R = 4, B = 16, H = 8, HKV = 2, D = 64 };
    for (int ti = 0; ti < 6; ti++) {
        const kva_dtype dt = DTYPES[ti % 3];
        const kva_layout layout = (kva_layout)(ti / 3);
        kva_context *ctx = NULL;
        CHECK_OK(kva_context_create(&REF, &ctx));
        int32_t q_lens[R], seq_lens[R], a[R];
        for (int r = 0; r < R; r++) {
            q_lens[r] = kva_rng_int(&rng, 1, 6);
            seq_lens[r] = kva_rng_int(&rng, q_lens[r] + B, 90);
            /* a: a multiple of B in [q, s - q]. */
            int32_t kmax = (seq_lens[r] - q_lens[r]) / B;
            a[r] = B * kva_rng_int(&rng, 1, kmax);
        }
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, R, q_lens, seq_lens, B, 2, 1);
        kva_cache *cache = NULL;
        CHECK_OK(kva_test_batch_cache(&b, ctx, &rng, HKV, D, D, dt, layout, &cache));

        float sinks[H];
        for (int h = 0; h < H; h++)
            sinks[h] = (float)kva_rng_normal(&rng);
        const size_t T = (size_t)b.T, esz = kva_dtype_size(dt);
        const size_t n = T * H * D;
        void *q = malloc(n * esz), *out_w = malloc(n * esz), *out_a = malloc(n * esz),
             *out_b = malloc(n * esz);
        float lse_w[64 * H], lse_a[64 * H], lse_b[64 * H];
        kva_test_fill(q, dt, n, &rng, 2.0);

        kva_plan_desc whole = kva_test_batch_plan_desc(&b, H, HKV, D, D, dt);
        whole.softcap = ti % 2 ? 4.0f : 0.0f;
        kva_plan_desc pa = whole, pb = whole;
        int32_t seq_a[R], seq_b[R];
        int32_t *table_b = malloc(sizeof(int32_t) * (size_t)R * b.stride);
        for (int r = 0; r < R; r++) {
            seq_a[r] = a[r];
            seq_b[r] = seq_lens[r] - a[r];
            for (int32_t i = 0; i < b.stride; i++) {
                int32_t src = i + a[r] / B;
                table_b[r * b.stride + i] = src < b.stride ? b.block_table[r * b.stride + src] : -1;
            }
        }
        pa.seq_lens = seq_a;
        pa.causal = 0;
        pb.seq_lens = seq_b;
        pb.block_table = table_b;
        kva_plan *plan_w = NULL, *plan_a = NULL, *plan_b = NULL;
        CHECK_OK(kva_plan_create(ctx, &whole, &plan_w));
        CHECK_OK(kva_plan_create(ctx, &pa, &plan_a));
        CHECK_OK(kva_plan_create(ctx, &pb, &plan_b));

        const int sink_in_a = ti % 2 == 0;
        kva_test_poison(out_w, dt, n);
        kva_test_poison(out_a, dt, n);
        kva_test_poison(out_b, dt, n);
        kva_test_poison(lse_w, KVA_DTYPE_F32, T * H);
        kva_test_poison(lse_a, KVA_DTYPE_F32, T * H);
        kva_test_poison(lse_b, KVA_DTYPE_F32, T * H);
        CHECK_OK(kva_attention_run(ctx, plan_w, q, cache, sinks, out_w, lse_w));
        CHECK_OK(kva_attention_run(ctx, plan_a, q, cache, sink_in_a ? sinks : NULL, out_a, lse_a));
        CHECK_OK(kva_attention_run(ctx, plan_b, q, cache, sink_in_a ? NULL : sinks, out_b, lse_b));
        char label[64];
        snprintf(label, sizeof label, "split paged %s %s sink in %c", kva_dtype_name(dt),
                 layout ? "HND" : "NHD", sink_in_a ? 'A' : 'B');
        split_run sr = {ctx, dt, b.T, H, D};
        check_merged(&sr, label, out_w, lse_w, out_a, lse_a, out_b, lse_b);

        kva_plan_destroy(plan_w);
        kva_plan_destroy(plan_a);
        kva_plan_destroy(plan_b);
        free(table_b);
        free(q), free(out_w), free(out_a), free(out_b);
        kva_cache_destroy(cache);
        kva_test_batch_free(&b);
        kva_context_destroy(ctx);
    }
}

/* Ragged: parts are row slices of packed K/V; D != Dv; causal and not. */
static void test_split_ragged(void)
{
    kva_rng rng = {0x7370726167ull};
    enum { R = 3, H = 16, HKV = 2, D = 128, DV = 64 };
    for (int ti = 0; ti < 6; ti++) {
        const kva_dtype dt = DTYPES[ti % 3];
        const int causal = ti / 3;
        kva_context *ctx = NULL;
        CHECK_OK(kva_context_create(&REF, &ctx));
        int32_t qsl[R + 1] = {0}, seq[R], seq_a[R], seq_b[R];
        size_t rows = 0;
        for (int r = 0; r < R; r++) {
            int32_t ql = kva_rng_int(&rng, 1, 5);
            seq[r] = kva_rng_int(&rng, 2 * ql, 40);
            seq_a[r] = kva_rng_int(&rng, ql, seq[r] - ql);
            seq_b[r] = seq[r] - seq_a[r];
            qsl[r + 1] = qsl[r] + ql;
            rows += (size_t)seq[r];
        }
        const size_t T = (size_t)qsl[R], esz = kva_dtype_size(dt);
        const size_t kw = (size_t)HKV * D * esz, vw = (size_t)HKV * DV * esz; /* bytes per row */
        char *k = malloc(rows * kw), *v = malloc(rows * vw);
        char *ka = malloc(rows * kw), *va = malloc(rows * vw);
        char *kb = malloc(rows * kw), *vb = malloc(rows * vw);
        kva_test_fill(k, dt, rows * HKV * D, &rng, 1.0);
        kva_test_fill(v, dt, rows * HKV * DV, &rng, 1.0);
        /* Slice request r's rows [0, a) into A and [a, s) into B, each packed. */
        size_t src = 0, da = 0, db = 0;
        for (int r = 0; r < R; r++) {
            memcpy(ka + da * kw, k + src * kw, (size_t)seq_a[r] * kw);
            memcpy(va + da * vw, v + src * vw, (size_t)seq_a[r] * vw);
            memcpy(kb + db * kw, k + (src + (size_t)seq_a[r]) * kw, (size_t)seq_b[r] * kw);
            memcpy(vb + db * vw, v + (src + (size_t)seq_a[r]) * vw, (size_t)seq_b[r] * vw);
            src += (size_t)seq[r];
            da += (size_t)seq_a[r];
            db += (size_t)seq_b[r];
        }
        float sinks[H];
        for (int h = 0; h < H; h++)
            sinks[h] = (float)kva_rng_normal(&rng);
        const size_t nq = T * H * D, no = T * H * DV;
        void *q = malloc(nq * esz), *out_w = malloc(no * esz), *out_a = malloc(no * esz),
             *out_b = malloc(no * esz);
        float lse_w[16 * H], lse_a[16 * H], lse_b[16 * H];
        kva_test_fill(q, dt, nq, &rng, 2.0);

        kva_plan_desc whole;
        memset(&whole, 0, sizeof whole);
        whole.num_requests = R;
        whole.query_start_loc = qsl;
        whole.seq_lens = seq;
        whole.num_heads = H;
        whole.num_kv_heads = HKV;
        whole.head_dim = D;
        whole.head_dim_v = DV;
        whole.q_dtype = dt;
        whole.causal = causal;
        whole.window_left = -1;
        whole.softcap = ti % 2 ? 0.0f : 2.5f;
        whole.scale = 0.05f;
        kva_plan_desc pa = whole, pb = whole;
        pa.seq_lens = seq_a;
        pa.causal = 0;
        pb.seq_lens = seq_b;
        kva_plan *plan_w = NULL, *plan_a = NULL, *plan_b = NULL;
        CHECK_OK(kva_plan_create(ctx, &whole, &plan_w));
        CHECK_OK(kva_plan_create(ctx, &pa, &plan_a));
        CHECK_OK(kva_plan_create(ctx, &pb, &plan_b));

        const int sink_in_a = ti % 2 == 1;
        kva_test_poison(out_w, dt, no);
        kva_test_poison(out_a, dt, no);
        kva_test_poison(out_b, dt, no);
        kva_test_poison(lse_w, KVA_DTYPE_F32, T * H);
        kva_test_poison(lse_a, KVA_DTYPE_F32, T * H);
        kva_test_poison(lse_b, KVA_DTYPE_F32, T * H);
        CHECK_OK(kva_attention_run_ragged(ctx, plan_w, q, k, v, sinks, out_w, lse_w));
        CHECK_OK(kva_attention_run_ragged(ctx, plan_a, q, ka, va, sink_in_a ? sinks : NULL, out_a,
                                          lse_a));
        CHECK_OK(kva_attention_run_ragged(ctx, plan_b, q, kb, vb, sink_in_a ? NULL : sinks, out_b,
                                          lse_b));
        char label[64];
        snprintf(label, sizeof label, "split ragged %s causal=%d sink in %c", kva_dtype_name(dt),
                 causal, sink_in_a ? 'A' : 'B');
        split_run sr = {ctx, dt, (int32_t)T, H, DV};
        check_merged(&sr, label, out_w, lse_w, out_a, lse_a, out_b, lse_b);

        kva_plan_destroy(plan_w);
        kva_plan_destroy(plan_a);
        kva_plan_destroy(plan_b);
        free(k), free(v), free(ka), free(va), free(kb), free(vb);
        free(q), free(out_w), free(out_a), free(out_b);
        kva_context_destroy(ctx);
    }
}

/* ------------------------------------------------------------------------ */
/* Rows that see no key (backend table, hand-built plan)                     */
/* ------------------------------------------------------------------------ */

/*
 * Request 0: seq_len 0, q_len 2 (no keys at all). Request 1: seq_len 1,
 * q_len 3, causal: pos = -2, -1, 0, so rows 2 and 3 see nothing and row 4
 * sees key 0 alone. Neither request passes kva_plan_create (q_len > seq_len),
 * so the plan is filled by hand and the backend is called directly.
 */
static void test_empty_rows(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    enum { H = 2, HKV = 1, D = 16, DV = 8, T = 5 };
    int32_t qsl[3] = {0, 2, 5}, seq[2] = {0, 1};
    int64_t kv_start[3] = {0, 0, 1};
    struct kva_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.backend = KVA_BACKEND_REF;
    plan.d.num_requests = 2;
    plan.d.num_heads = H;
    plan.d.num_kv_heads = HKV;
    plan.d.head_dim = D;
    plan.d.head_dim_v = DV;
    plan.d.q_dtype = KVA_DTYPE_F32;
    plan.d.scale = 0.25f;
    plan.d.causal = 1;
    plan.d.window_left = -1;
    plan.d.decode_threshold = 1;
    plan.query_start_loc = qsl;
    plan.seq_lens = seq;
    plan.kv_lens = seq; /* unsharded: every key of the request is held */
    plan.kv_start = kv_start;
    plan.info.num_tokens = T;

    kva_rng rng = {0x656d707479ull};
    float q[T * H * D], k[D], v[DV], out[T * H * DV], lse[T * H];
    kva_test_fill(q, KVA_DTYPE_F32, T * H * D, &rng, 1.0);
    kva_test_fill(k, KVA_DTYPE_F32, D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, DV, &rng, 1.0);
    const float sinks[H] = {0.75f, -1.5f};
    for (int with_sink = 0; with_sink < 2; with_sink++) {
        kva_test_poison(out, KVA_DTYPE_F32, T * H * DV);
        kva_test_poison(lse, KVA_DTYPE_F32, T * H);
        CHECK_OK(
            kva__ref_ops.attention_ragged(ctx, &plan, q, k, v, with_sink ? sinks : NULL, out, lse));
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                const float *o = out + (t * H + h) * DV;
                double want_lse, weight = 0.0; /* weight of v0 in the output */
                if (t < 4) {
                    want_lse = with_sink ? (double)sinks[h] : -INFINITY;
                } else {
                    double dot = 0.0;
                    for (int c = 0; c < D; c++)
                        dot += (double)q[(t * H + h) * D + c] * k[c];
                    const double s0 = 0.25 * dot;
                    double den = exp(s0) + (with_sink ? exp((double)sinks[h]) : 0.0);
                    weight = exp(s0) / den;
                    want_lse = log(den);
                }
                for (int c = 0; c < DV; c++)
                    CHECK_MSG(fabs(o[c] - weight * v[c]) <= 1e-6, "t=%d h=%d sink=%d: %g vs %g", t,
                              h, with_sink, o[c], weight * v[c]);
                if (isinf(want_lse))
                    CHECK_MSG(lse[t * H + h] == -INFINITY, "t=%d h=%d: lse %g", t, h,
                              lse[t * H + h]);
                else
                    CHECK_MSG(fabs(lse[t * H + h] - want_lse) <= 1e-5, "t=%d h=%d: lse %g vs %g", t,
                              h, lse[t * H + h], want_lse);
            }
        }
    }
    kva_context_destroy(ctx);
}

/* Through the API, window_left = 0 with the causal mask leaves each row
 * exactly one key, its own position: out = v_pos, lse = score_pos. */
static void test_window_zero(void)
{
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&REF, &ctx));
    enum { H = 4, HKV = 2, D = 32, S = 7 };
    kva_rng rng = {0x77696e30ull};
    int32_t qsl[2] = {0, S}, seq[1] = {S};
    float q[S * H * D], k[S * HKV * D], v[S * HKV * D], out[S * H * D], lse[S * H];
    kva_test_fill(q, KVA_DTYPE_F32, S * H * D, &rng, 1.0);
    kva_test_fill(k, KVA_DTYPE_F32, S * HKV * D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, S * HKV * D, &rng, 1.0);
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.causal = 1;
    pd.window_left = 0;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    kva_test_poison(out, KVA_DTYPE_F32, S * H * D);
    kva_test_poison(lse, KVA_DTYPE_F32, S * H);
    CHECK_OK(kva_attention_run_ragged(ctx, plan, q, k, v, NULL, out, lse));
    for (int t = 0; t < S; t++) {
        for (int h = 0; h < H; h++) {
            const int g = h / (H / HKV);
            double dot = 0.0;
            for (int c = 0; c < D; c++) {
                dot += (double)q[(t * H + h) * D + c] * k[(t * HKV + g) * D + c];
                CHECK(out[(t * H + h) * D + c] == v[(t * HKV + g) * D + c]);
            }
            CHECK(fabs(lse[t * H + h] - dot / sqrt((double)D)) <= 1e-5);
        }
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_merge_hand);
    RUN(test_merge_random);
    RUN(test_split_paged);
    RUN(test_split_ragged);
    RUN(test_empty_rows);
    RUN(test_window_zero);
    return kva_test_finish();
}
