/*
 * test_api_blackbox_r15.c - black-box round fifteen (session 43, task
 * api55): promises of the public headers checked at edges no other test
 * reaches, on the reference and CPU backends, outputs poisoned first:
 *   - kvattn_merge.h's merges with a +inf lse (exp(lse) overflows: the
 *     weights are undefined, so the row is NaN as with a NaN lse); the
 *     reference wrote NaN, the CPU backend the +inf part's row and lse +inf;
 *     rows with -inf parts beside them still merge right;
 *   - kva_convert of a count whose byte size overflows the address space is
 *     refused whatever the dtypes (equal dtypes crashed in memmove);
 *   - MLA (kva_mla_run and the absorbed kva_attention_run) with q_len 1-4
 *     over contexts of 0, 1, B - 1, B, B + 1 and 2B keys, on both paths
 *     (decode_threshold 1 and 4), H 1 / 3 / 16, f32 / f16 / bf16 / FP8
 *     caches, and non-causal requests with seq_len 0 or q_len > seq_len;
 *   - sparse MLA with q_len 1-4 over the same contexts, K of 1, 3, B, 2B + 3,
 *     -1 entries, repeats, topk_length (0, K, in between) or none, a wide
 *     indices_stride, every MLA cache format, MIXED and SEPARATE;
 *   - kvattn_dcp.h at positions and slots past int32: N * I past 2^31,
 *     slots past 2^32, against the header's formulas in int64; refusals
 *     leave the outputs alone;
 *   - kvattn.h's plan lifetimes through kva_plan_update: a failed update on
 *     another context leaves the plan its owner's (same bytes); a successful
 *     one moves a cascade plan to the new context, which runs it after the
 *     old context is destroyed;
 *   - kvattn.h's zero-size rule for plans of no request given without arrays
 *     (the empty block table NULL): every run call returns OK, writes
 *     nothing, and still checks the cache against the plan.
 */
#include "blackbox_util.h"
#include "mla_vs_ref.h"
#include "sparse_util.h" /* includes mla_util.h */

/* ---- merges with +inf lse ---- */

/* Merges P parts of one row pattern on be, with kva_merge_states_n (and
 * kva_merge_states for P = 2), and checks out / lse against want (NaN:
 * every element NaN). */
static void merge_case(kva_backend be, kva_dtype dt, int32_t P, const float *lses, double want_lse,
                       const double *want_out, const char *label)
{
    enum { H = 11, DV = 16, T = 2 }; /* H 11: the CPU's 8-head blocks and single rows */
    kva_context *ctx = new_ctx(be, 2);
    const size_t es = kva_dtype_size(dt), part = (size_t)T * H * DV, pad = 8;
    const int64_t os = (int64_t)(part + pad); /* strided parts */
    unsigned char *outs = malloc((size_t)P * (size_t)os * es), *out = malloc(part * es);
    float *ls = malloc((size_t)P * T * H * sizeof(float)), lse[T * H];
    for (int32_t p = 0; p < P; p++) {
        for (size_t i = 0; i < part; i++) /* part p's rows hold p + 1 (-inf parts: NaN) */
            kva__store_f(outs + (size_t)(p * os) * es, dt, i,
                         lses[p] == -INFINITY ? NAN : p + 1.0f);
        for (int32_t n = 0; n < T * H; n++)
            ls[p * T * H + n] = lses[p];
    }
    for (int call = 0; call < (P == 2 ? 2 : 1); call++) {
        kva_test_poison(out, dt, part);
        kva_test_poison(lse, KVA_DTYPE_F32, T * H);
        kva_status st =
            call == 0 ? kva_merge_states_n(ctx, P, T, H, DV, dt, outs, os, ls, T * H, out, lse)
                      : kva_merge_states(ctx, T, H, DV, dt, outs, ls, outs + (size_t)os * es,
                                         ls + T * H, out, lse);
        CHECK_MSG(st == KVA_STATUS_OK, "%s: %s", label, kva_last_error());
        size_t bad = 0;
        for (size_t i = 0; i < part; i++) {
            const double o = kva_test_get(out, dt, i), w = want_out[0];
            bad += isnan(w) ? !isnan(o) || kva_test_poisoned(out, dt, i)
                            : fabs(o - w) > 1e-2 * fabs(w) + 1e-6;
        }
        for (int32_t n = 0; n < T * H; n++)
            bad += isnan(want_lse)   ? !isnan(lse[n]) || kva_test_poisoned(lse, KVA_DTYPE_F32, n)
                   : isinf(want_lse) ? lse[n] != want_lse
                                     : fabs(lse[n] - want_lse) > 1e-5 * fabs(want_lse) + 1e-6;
        CHECK_MSG(bad == 0, "%s %s (%s, %s): %zu elements wrong (out[0] %g, lse[0] %g)",
                  kva_backend_name(be), label, call ? "merge_states" : "merge_states_n",
                  kva_dtype_name(dt), bad, kva_test_get(out, dt, 0), lse[0]);
    }
    free(outs);
    free(out);
    free(ls);
    kva_context_destroy(ctx);
}

static void test_merge_inf_lse(void)
{
    const double nan = NAN;
    static const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++) {
            const kva_backend be = kBk[b];
            const kva_dtype dt = dts[d];
            /* One +inf part beside finite and -inf ones; all +inf; +inf alone. */
            merge_case(be, dt, 3, (const float[]){INFINITY, 0.5f, -INFINITY}, nan, &nan,
                       "+inf, 0.5, -inf");
            merge_case(be, dt, 2, (const float[]){1.0f, INFINITY}, nan, &nan, "1, +inf");
            merge_case(be, dt, 2, (const float[]){INFINITY, INFINITY}, nan, &nan, "+inf, +inf");
            merge_case(be, dt, 1, (const float[]){INFINITY}, nan, &nan, "+inf alone");
            merge_case(be, dt, 2, (const float[]){INFINITY, NAN}, nan, &nan, "+inf, NaN");
            /* The neighbours stay as the header says: -inf parts are not read. */
            const double w2 = 2.0, w0 = 0.0, ninf = -INFINITY;
            merge_case(be, dt, 3, (const float[]){-INFINITY, 80.0f, -INFINITY}, 80.0, &w2,
                       "-inf, 80, -inf");
            merge_case(be, dt, 2, (const float[]){-INFINITY, -INFINITY}, ninf, &w0, "-inf, -inf");
            const double mix = (exp(0.0) * 1 + exp(-1.0) * 2) / (exp(0.0) + exp(-1.0));
            merge_case(be, dt, 2, (const float[]){3.0f, 2.0f}, 3.0 + log(1.0 + exp(-1.0)), &mix,
                       "3, 2");
        }
}

/* ---- kva_convert sizes ---- */

static void test_convert_sizes(void)
{
    float src[8], dst[8];
    kva_rng rng = {1501};
    kva_test_fill(src, KVA_DTYPE_F32, 8, &rng, 1.0);
    static const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const size_t ns[3] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 4 + 1};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int k = 0; k < 3; k++) {
                kva_test_poison(dst, KVA_DTYPE_F32, 8);
                const uint64_t s0 = bb_sum(src, sizeof src), d0 = bb_sum(dst, sizeof dst);
                BAD(kva_convert(src, dts[a], dst, dts[b], ns[k]), KVA_STATUS_INVALID_ARGUMENT);
                CHECK_MSG(bb_sum(src, sizeof src) == s0 && bb_sum(dst, sizeof dst) == d0,
                          "convert %s -> %s of %zu: a buffer changed", kva_dtype_name(dts[a]),
                          kva_dtype_name(dts[b]), ns[k]);
            }
    /* src == dst with equal dtypes is a no-op at any count: nothing to move. */
    const uint64_t s0 = bb_sum(src, sizeof src);
    CHECK_OK(kva_convert(src, KVA_DTYPE_F32, src, KVA_DTYPE_F32, 8));
    CHECK(bb_sum(src, sizeof src) == s0);
    CHECK_OK(kva_convert(NULL, KVA_DTYPE_F16, NULL, KVA_DTYPE_BF16, 0));
    /* A count that fits converts as before. */
    CHECK_OK(kva_convert(src, KVA_DTYPE_F32, dst, KVA_DTYPE_F32, 8));
    CHECK(memcmp(src, dst, sizeof src) == 0);
}

/* ---- MLA at q_len 1-4 and context edges ---- */

static void test_mla_context_edges(void)
{
    static const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_F16};
    const int quick = kva_test_quick();
    int n = 0;
    for (int bi = 0; bi < 2; bi++)
        for (int32_t ql = 1; ql <= 4; ql++)
            for (int ci = 0; ci < 6; ci++)
                for (int v = 0; v < 3; v++) {
                    if (quick && (ql + ci + v + bi) % 4 != 0)
                        continue;
                    const int32_t B = bi ? 16 : 4;
                    const int32_t ctxs[6] = {0, 1, B - 1, B, B + 1, 2 * B}, cl = ctxs[ci];
                    const int32_t H = v == 0 ? 1 : v == 1 ? 3 : 16;
                    const kva_dtype dt = dts[(ql + ci + v) % 3];
                    for (int32_t thr = 1; thr <= 4; thr += 3) {
                        /* The request under test, a decode over the same
                         * context, and a request with no context. */
                        const int32_t qls[3] = {ql, 1, ql};
                        const int32_t sls[3] = {cl + ql, cl + 1, ql + (ci ? 2 * B - 1 : 0)};
                        mla_case c = mla_case_of(H, 64, 16, 32, 24, B, dt, 1, thr, 3, qls, sls,
                                                 1500 + (uint64_t)n++);
                        c.fp8 = (ql + ci + bi) % 4 == 0;
                        char tag[160];
                        snprintf(tag, sizeof tag, "MLA B %d q_len %d context %d H %d %s%s thr %d",
                                 B, ql, cl, H, kva_dtype_name(dt), c.fp8 ? " fp8" : "", thr);
                        mla_case_vs_ref(&c, 2, tag);
                    }
                }
    /* Non-causal: seq_len 0 (rows without keys: 0 and lse -inf) and q_len > seq_len. */
    for (int32_t ql = 1; ql <= 4; ql++)
        for (int32_t sl = 0; sl <= 5; sl += 5) {
            const int32_t qls[2] = {ql, 1}, sls[2] = {sl, 0};
            mla_case c = mla_case_of(3, 64, 16, 32, 24, 4, KVA_DTYPE_F32, 0, ql % 2 ? 1 : 4, 2, qls,
                                     sls, 1700 + (uint64_t)n++);
            char tag[160];
            snprintf(tag, sizeof tag, "MLA non-causal q_len %d seq_len %d", ql, sl);
            mla_case_vs_ref(&c, 2, tag);
        }
}

/* ---- sparse MLA at q_len 1-4 and context edges ---- */

static void sparse_edge_case(const sp_case *c, const char *tag)
{
    kva_context *ctx[2] = {new_ctx(KVA_BACKEND_REF, 1), new_ctx(KVA_BACKEND_CPU, 2)};
    sp_data m[2];
    void *out[2] = {0};
    float *lse[2] = {0};
    int ok = 1;
    for (int b = 0; b < 2 && ok; b++) {
        ok = sp_data_make(ctx[b], c, &m[b]);
        CHECK_MSG(ok, "%s: setup: %s", tag, kva_last_error());
        if (!ok)
            break;
        kva_plan_desc pd = sp_plan_desc(c, &m[b]);
        kva_plan *p = NULL;
        const size_t rows = (size_t)m[b].T * c->H, n = rows * c->Dc;
        out[b] = malloc(n * 4 + 16);
        lse[b] = malloc(rows * 4 + 16);
        kva_test_poison(out[b], c->dt, n);
        kva_test_poison(lse[b], KVA_DTYPE_F32, rows);
        kva_status st = kva_plan_create(ctx[b], &pd, &p);
        if (st == KVA_STATUS_OK)
            st = kva_mla_sparse_run(ctx[b], p, m[b].q, m[b].cache, m[b].idx, c->K + c->stride_pad,
                                    m[b].len, m[b].sinks, out[b], lse[b]);
        CHECK_MSG(st == KVA_STATUS_OK, "%s %s: %s", tag, kva_backend_name(kBk[b]),
                  kva_last_error());
        ok = st == KVA_STATUS_OK;
        kva_plan_destroy(p);
    }
    if (ok) {
        const size_t rows = (size_t)m[0].T * c->H, n = rows * c->Dc;
        double atol, latol, cos_max;
        kva_test_sparse_bf16dot_bounds(c->Dc, c->Dr, c->quant == KVA_QUANT_FP8_DS_MLA, &atol,
                                       &latol, &cos_max);
        if (c->dt == KVA_DTYPE_F32)
            atol = latol = 1e-4;
        const size_t bad =
            kva_test_compare(tag, out[1], out[0], c->dt, n, atol, 2 * kva_test_rtol(c->dt)) +
            kva_test_compare_f32(tag, lse[1], lse[0], rows, latol, 1e-5);
        CHECK_MSG(bad == 0, "%s: %zu elements differ from the reference", tag, bad);
        CHECK_MSG(kva_test_count_poisoned(out[0], c->dt, n) == 0, "%s: ref left rows", tag);
    }
    for (int b = 0; b < 2; b++) {
        free(out[b]);
        free(lse[b]);
        if (m[b].cache || m[b].bt)
            sp_data_free(&m[b]);
        kva_context_destroy(ctx[b]);
    }
}

static void test_sparse_context_edges(void)
{
    static const kva_quant qs[3] = {KVA_QUANT_NONE, KVA_QUANT_FP8_E4M3, KVA_QUANT_FP8_DS_MLA};
    int n = 0;
    for (int32_t ql = 1; ql <= 4; ql++)
        for (int ci = 0; ci < 5; ci++)
            for (int qi = 0; qi < 3; qi++)
                for (int32_t mode = 0; mode < 2; mode++) {
                    /* SEPARATE gathers bf16 rows on the CPU (kvattn_mla.h): compared
                     * where those are exact, a bf16 cache. */
                    if (mode == KVA_SPARSE_SEPARATE && qs[qi] != KVA_QUANT_NONE)
                        continue;
                    if (kva_test_quick() && (ql + ci + qi + mode) % 2)
                        continue;
                    const int32_t B = qi == 2 ? 64 : 4;
                    const int32_t ctxs[5] = {0, 1, B - 1, B, B + 1}, cl = ctxs[ci];
                    const int32_t Ks[4] = {1, 3, B, 2 * B + 3};
                    sp_case c = {.H = ql == 3 ? 17 : 3,
                                 .Dc = qi == 2 ? 128 : 64,
                                 .Dr = 16,
                                 .B = B,
                                 .K = Ks[(ql + ci) % 4],
                                 .dt = qi == 0 && ql % 2 && mode == 0 ? KVA_DTYPE_F32
                                                                      : KVA_DTYPE_BF16,
                                 .quant = qs[qi],
                                 .mode = mode,
                                 .thr = ql % 2 ? 1 : 2,
                                 .R = 3,
                                 .use_len = (ci + qi) % 2,
                                 .sinks = ql == 2,
                                 .unused = 0.3,
                                 .dup = 0.1,
                                 .stride_pad = ci == 4 ? 3 : 0,
                                 .seed = 1800 + (uint64_t)n++};
                    c.q_len[0] = ql;
                    c.seq_len[0] = cl + ql;
                    c.q_len[1] = 1;
                    c.seq_len[1] = cl + 1;
                    c.q_len[2] = ql;
                    c.seq_len[2] = ql;
                    char tag[160];
                    snprintf(tag, sizeof tag, "sparse q_len %d context %d %s %s K %d %s", ql, cl,
                             kva_quant_name(c.quant), kva_dtype_name(c.dt), c.K,
                             mode ? "separate" : "mixed");
                    sparse_edge_case(&c, tag);
                }
}

/* ---- DCP helpers past int32 ---- */

/* kvattn_dcp.h's count of positions i < s with (i / I) mod N == rank, in int64. */
static int64_t dcp_count(int64_t s, int64_t N, int64_t rank, int64_t I)
{
    if (N == 1)
        return s;
    int64_t n = 0; /* one step per round of the N ranks: the I used here are large */
    for (int64_t start = rank * I; start < s; start += N * I)
        n += s - start < I ? s - start : I;
    return n;
}

static void test_dcp_wide(void)
{
    static const int32_t Ns[5] = {2, 3, 3, 256, 7},
                         Is[5] = {1 << 30, 1 << 29, 1 << 30, 1 << 24, 12345677};
    static const int32_t ss[5] = {0, 1, (1 << 30) - 1, 1 << 30, 987654321};
    for (int k = 0; k < 5; k++) {
        const int32_t step = Ns[k] > 8 ? 37 : 1; /* N 256: every 37th rank */
        for (int32_t rank = 0; rank < Ns[k]; rank += step) {
            int32_t sl[5], ll[5];
            memcpy(sl, ss, sizeof sl);
            for (int i = 0; i < 5; i++)
                ll[i] = -5;
            CHECK_OK(kva_dcp_local_lens(5, sl, Ns[k], rank, Is[k], ll));
            for (int i = 0; i < 5; i++)
                CHECK_MSG(ll[i] == dcp_count(ss[i], Ns[k], rank, Is[k]),
                          "local_lens N %d rank %d I %d seq_len %d: got %d, want %lld", Ns[k], rank,
                          Is[k], ss[i], ll[i], (long long)dcp_count(ss[i], Ns[k], rank, Is[k]));
            /* In place gives the same. */
            CHECK_OK(kva_dcp_local_lens(5, sl, Ns[k], rank, Is[k], sl));
            CHECK(memcmp(sl, ll, sizeof ll) == 0);
        }
    }
    /* Slots of positions near 2^30 through block ids whose slots pass 2^32:
     * local token k at slot row[k / B] * B + k % B (kvattn_dcp.h); with a
     * row of one entry the tokens past it are refused, nothing written. */
    const int32_t B = 1 << 28, row[4] = {INT32_MAX, 65535, 0, INT32_MAX - 1};
    static const int32_t Ns2[3] = {1, 3, 2}, Is2[3] = {1, 1 << 28, 1 << 29};
    for (int k = 0; k < 3; k++)
        for (int32_t rank = 0; rank < Ns2[k]; rank++)
            for (int32_t row_len = 4; row_len >= 1; row_len -= 3) {
                const int32_t first = (1 << 30) - 40, count = 40;
                int64_t slots[40], want[40];
                int refused = 0;
                for (int i = 0; i < count; i++) {
                    const int64_t p = (int64_t)first + i;
                    slots[i] = -77;
                    want[i] = -1;
                    if ((p / Is2[k]) % Ns2[k] != rank)
                        continue;
                    const int64_t lk = dcp_count(p, Ns2[k], rank, Is2[k]);
                    refused |= lk / B >= row_len;
                    if (lk / B < row_len)
                        want[i] = (int64_t)row[lk / B] * B + lk % B;
                }
                const kva_status st =
                    kva_dcp_slots(Ns2[k], rank, Is2[k], B, row, row_len, first, count, slots);
                if (refused) {
                    CHECK_MSG(st == KVA_STATUS_OUT_OF_RANGE && kva_last_error()[0],
                              "slots N %d rank %d row_len %d: %s", Ns2[k], rank, row_len,
                              kva_status_name(st));
                    for (int i = 0; i < count; i++)
                        CHECK(slots[i] == -77);
                    continue;
                }
                CHECK_MSG(st == KVA_STATUS_OK, "slots N %d rank %d: %s", Ns2[k], rank,
                          kva_last_error());
                for (int i = 0; i < count; i++)
                    CHECK_MSG(slots[i] == want[i], "slots N %d rank %d pos %d: got %lld, want %lld",
                              Ns2[k], rank, first + i, (long long)slots[i], (long long)want[i]);
            }
}

/* ---- plan lifetimes through kva_plan_update ---- */

static void test_plan_owner(void)
{
    kva_context *a = new_ctx(KVA_BACKEND_CPU, 2), *b = new_ctx(KVA_BACKEND_CPU, 3);
    kva_cache_desc cd = make_desc(8, 4, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(a, &cd, &c));
    kva_rng rng = {1900};
    fill_cache(c, &rng);
    /* Two requests sharing their first two blocks: a cascade (ON). */
    const int32_t qsl[3] = {0, 2, 4}, sl[2] = {9, 9}, bt[6] = {0, 1, 2, 0, 1, 3};
    kva_plan_desc pd = {.num_requests = 2,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_table = bt,
                        .block_table_stride = 3,
                        .block_size = 4,
                        .num_heads = 4,
                        .num_kv_heads = 2,
                        .head_dim = 16,
                        .q_dtype = KVA_DTYPE_F32,
                        .causal = 1,
                        .window_left = -1,
                        .cascade = KVA_CASCADE_ON};
    float q[4 * 4 * 16], out0[4 * 4 * 16], lse0[16], out[4 * 4 * 16], lse[16];
    kva_test_fill(q, KVA_DTYPE_F32, 4 * 4 * 16, &rng, 1.0);
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(a, &pd, &p));
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(p, &info));
    CHECK(info.num_cascade_groups == 1);
    kva_test_poison(out0, KVA_DTYPE_F32, 4 * 4 * 16);
    CHECK_OK(kva_attention_run(a, p, q, c, NULL, out0, lse0));
    CHECK(kva_test_count_poisoned(out0, KVA_DTYPE_F32, 4 * 4 * 16) == 0);
    /* Failed updates on b: refused at the field checks and at the grouping
     * check; the plan stays a's and gives a's bytes. */
    const int32_t grp[2] = {0, 0}, plen[1] = {8};
    kva_plan_desc bad1 = pd, bad2 = pd;
    bad1.window_left = -5;
    bad2.num_cascade_groups = 1;
    bad2.cascade_group = grp;
    bad2.cascade_prefix_len = plen; /* ends after the first query (9 - 2) */
    const kva_plan_desc *bads[2] = {&bad1, &bad2};
    for (int i = 0; i < 2; i++) {
        kva_status st = kva_plan_update(b, p, bads[i]);
        CHECK_MSG(st != KVA_STATUS_OK && kva_last_error()[0], "bad update %d accepted", i);
        kva_test_poison(out, KVA_DTYPE_F32, 4 * 4 * 16);
        kva_test_poison(lse, KVA_DTYPE_F32, 16);
        CHECK_OK(kva_attention_run(a, p, q, c, NULL, out, lse));
        CHECK_MSG(memcmp(out, out0, sizeof out) == 0 && memcmp(lse, lse0, sizeof lse) == 0,
                  "bad update %d on another context changed the plan", i);
        CHECK_OK(kva_plan_get_info(p, &(kva_plan_info){0}));
        kva_test_poison(out, KVA_DTYPE_F32, 4 * 4 * 16);
        kva_test_poison(lse, KVA_DTYPE_F32, 16);
        const uint64_t so = bb_sum(out, sizeof out), sls = bb_sum(lse, sizeof lse);
        BAD(kva_attention_run(b, p, q, c, NULL, out, lse), KVA_STATUS_INVALID_ARGUMENT);
        CHECK(bb_sum(out, sizeof out) == so && bb_sum(lse, sizeof lse) == sls);
    }
    /* A good update on b moves the cascade plan: a refuses it, b runs it,
     * also after a is gone, with the bytes of a plan b creates (kvattn.h:
     * the updated plan is what kva_plan_create(b, desc) builds). */
    float outb[4 * 4 * 16], lseb[16];
    kva_plan *pb = NULL;
    CHECK_OK(kva_plan_create(b, &pd, &pb));
    kva_test_poison(outb, KVA_DTYPE_F32, 4 * 4 * 16);
    CHECK_OK(kva_attention_run(b, pb, q, c, NULL, outb, lseb));
    kva_plan_destroy(pb);
    CHECK_OK(kva_plan_update(b, p, &pd));
    kva_test_poison(out, KVA_DTYPE_F32, 4 * 4 * 16);
    const uint64_t so = bb_sum(out, sizeof out);
    BAD(kva_attention_run(a, p, q, c, NULL, out, lse), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(bb_sum(out, sizeof out) == so);
    kva_context_destroy(a);
    for (int i = 0; i < 2; i++) {
        kva_test_poison(out, KVA_DTYPE_F32, 4 * 4 * 16);
        kva_test_poison(lse, KVA_DTYPE_F32, 16);
        CHECK_OK(kva_attention_run(b, p, q, c, NULL, out, lse));
        CHECK_MSG(memcmp(out, outb, sizeof out) == 0 && memcmp(lse, lseb, sizeof lse) == 0,
                  "the moved plan's run %d differs from b's own plan", i);
        /* Through a plain plan and back: the same bytes again. */
        kva_plan_desc plain = pd;
        plain.cascade = KVA_CASCADE_OFF;
        CHECK_OK(kva_plan_update(b, p, &plain));
        CHECK_OK(kva_plan_update(b, p, &pd));
    }
    kva_plan_destroy(p);
    kva_cache_destroy(c);
    kva_context_destroy(b);
}

/* ---- empty plans without arrays ---- */

/* kvattn.h, Zero sizes: a plan of R = 0 may come without arrays (the empty
 * block table NULL too), and every run call on it validates the rest and
 * returns OK without touching a tensor. main refused the paged calls ("plan
 * has no block_table"), so an empty step needed a dummy block-table pointer. */
static void test_empty_plans(void)
{
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 2);
        kva_cache_desc md = make_desc(2, 4, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache_desc ld = {.num_blocks = 2,
                             .block_size = 4,
                             .num_kv_heads = 1,
                             .head_dim = 80,
                             .head_dim_v = 64,
                             .dtype = KVA_DTYPE_BF16,
                             .kind = KVA_ATTN_MLA};
        kva_cache_desc id = {.num_blocks = 2,
                             .block_size = 4,
                             .num_kv_heads = 1,
                             .head_dim = 32,
                             .dtype = KVA_DTYPE_F32,
                             .kind = KVA_ATTN_INDEX};
        kva_cache_desc od = md;
        od.block_size = 8;
        kva_cache *mc = NULL, *lc = NULL, *ic = NULL, *oc = NULL;
        CHECK_OK(kva_cache_create(ctx, &md, &mc));
        CHECK_OK(kva_cache_create(ctx, &ld, &lc));
        CHECK_OK(kva_cache_create(ctx, &id, &ic));
        CHECK_OK(kva_cache_create(ctx, &od, &oc));
        float out[64], lse[8];
        int32_t idx[8];
        kva_test_poison(out, KVA_DTYPE_F32, 64);
        kva_test_poison(lse, KVA_DTYPE_F32, 8);
        memset(idx, 0x5a, sizeof idx);
        const uint64_t so = bb_sum(out, sizeof out), sl = bb_sum(lse, sizeof lse),
                       si = bb_sum(idx, sizeof idx);
        kva_plan_desc mha = {.num_heads = 4,
                             .num_kv_heads = 2,
                             .head_dim = 16,
                             .block_size = 4,
                             .q_dtype = KVA_DTYPE_F32,
                             .causal = 1,
                             .window_left = -1};
        kva_plan_desc mla = {.num_heads = 3,
                             .num_kv_heads = 1,
                             .head_dim = 80,
                             .head_dim_v = 64,
                             .block_size = 4,
                             .q_dtype = KVA_DTYPE_BF16,
                             .scale = 0.1f,
                             .causal = 1,
                             .window_left = -1,
                             .kind = KVA_ATTN_MLA,
                             .mla_qk_nope_head_dim = 32,
                             .mla_v_head_dim = 24};
        kva_plan_desc sparse = mla;
        sparse.mla_qk_nope_head_dim = sparse.mla_v_head_dim = 0;
        sparse.sparse_topk = 8;
        kva_plan_desc index = {.num_heads = 4,
                               .num_kv_heads = 1,
                               .head_dim = 32,
                               .block_size = 4,
                               .q_dtype = KVA_DTYPE_F32,
                               .causal = 1,
                               .window_left = -1,
                               .kind = KVA_ATTN_INDEX,
                               .sparse_topk = 8};
        kva_plan *p[4] = {NULL, NULL, NULL, NULL};
        CHECK_OK(kva_plan_create(ctx, &mha, &p[0]));
        CHECK_OK(kva_plan_create(ctx, &mla, &p[1]));
        CHECK_OK(kva_plan_create(ctx, &sparse, &p[2]));
        CHECK_OK(kva_plan_create(ctx, &index, &p[3]));
        if (p[0] && p[1] && p[2] && p[3]) {
            CHECK_OK(kva_attention_run(ctx, p[0], NULL, mc, NULL, out, lse));
            CHECK_OK(kva_attention_run_ragged(ctx, p[0], NULL, NULL, NULL, NULL, out, lse));
            CHECK_OK(kva_attention_run(ctx, p[1], NULL, lc, NULL, out, lse));
            CHECK_OK(kva_mla_run(ctx, p[1], NULL, NULL, NULL, lc, out, lse));
            CHECK_OK(kva_mla_sparse_run(ctx, p[2], NULL, lc, NULL, 0, NULL, NULL, out, lse));
            CHECK_OK(kva_indexer_run(ctx, p[3], NULL, NULL, ic, idx, 0, NULL));
            /* The other arguments are still checked. */
            BAD(kva_attention_run(ctx, p[0], NULL, oc, NULL, out, lse), KVA_STATUS_SHAPE_MISMATCH);
            BAD(kva_attention_run(ctx, p[0], NULL, lc, NULL, out, lse), KVA_STATUS_SHAPE_MISMATCH);
            BAD(kva_mla_run(ctx, p[1], NULL, NULL, NULL, mc, out, lse), KVA_STATUS_SHAPE_MISMATCH);
            BAD(kva_indexer_run(ctx, p[3], NULL, NULL, mc, idx, 0, NULL),
                KVA_STATUS_SHAPE_MISMATCH);
        }
        CHECK_MSG(bb_sum(out, sizeof out) == so && bb_sum(lse, sizeof lse) == sl &&
                      bb_sum(idx, sizeof idx) == si,
                  "%s: an empty run wrote its outputs", kva_backend_name(kBk[b]));
        for (int i = 0; i < 4; i++)
            kva_plan_destroy(p[i]);
        kva_cache_destroy(mc);
        kva_cache_destroy(lc);
        kva_cache_destroy(ic);
        kva_cache_destroy(oc);
        kva_context_destroy(ctx);
    }
}

int main(void)
{
    RUN(test_merge_inf_lse);
    RUN(test_convert_sizes);
    RUN(test_mla_context_edges);
    RUN(test_sparse_context_edges);
    RUN(test_dcp_wide);
    RUN(test_plan_owner);
    RUN(test_empty_plans);
    return kva_test_finish();
}
