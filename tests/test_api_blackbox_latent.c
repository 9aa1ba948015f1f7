/*
 * test_api_blackbox_latent.c - black-box audit, round nine (session 40, task
 * api45): promises of kvattn.h and kvattn_mla.h about the latent and
 * index-key caches that no other test pins down, on the reference and CPU
 * backends, against values computed here from the header's formulas:
 *   - non-finite rows: an FP8_TOKEN key row holding +-inf gets an infinite
 *     scale and reads back as NaN in every element (0 * inf); a NaN element
 *     stays NaN alone, the scale from the finite rest; an FP8_DS_MLA tile
 *     likewise, tile by tile, k_pe as stored; the indexer lists a key that
 *     reads back NaN after every finite one (a NaN logit sorts last);
 *   - a NaN latent value (in c_kv or in k_pe) of a key a row sees makes that
 *     row's out and lse NaN in kva_mla_run as in kva_attention_run (kvattn.h:
 *     "a NaN score makes its row's out and lse NaN on every backend and for
 *     any key split"; kva_mla_run is that attention per head), on both of
 *     its paths (absorbed decodes, split-KV or not; compute-friendly
 *     prefills), 16-bit and FP8 latent caches; rows without such a key stay
 *     finite. The reference wrote 0 and lse -inf (an empty row), the CPU
 *     backend NaN out with a finite or -inf lse, or (its bf16 decode path)
 *     dropped the key silently;
 *   - a NaN in q or in w_uk: the rows whose scores it reaches are NaN, also
 *     when the CPU splits a long decode's keys (whose merge skipped pieces
 *     with max -inf and so wrote 0 and lse -inf for an all-NaN row);
 *   - the block bytes of the packed formats (in-block scales counted);
 *   - the same in kva_mla_sparse_run for a listed key (16-bit, FP8 and
 *     fp8_ds_mla caches, whose NaN code the CPU backend read as 480 s; both
 *     modes, decodes and a prefill), unlisted NaN keys change nothing.
 * Outputs are poisoned before every run, with a NaN of a payload no
 * computed NaN has (kva_test_poison), so that an expected NaN must be written.
 */
#include "blackbox_util.h"
#include "sparse_util.h"

#include <float.h>

/* The FP8_TOKEN scale of kvattn.h: max(amax / 448, FLT_MIN), NaN left out. */
static float lt_scale(const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    const float s = amax / 448.0f;
    return s > FLT_MIN ? s : FLT_MIN;
}

/* Writes rows with +inf / NaN through FP8_TOKEN and FP8_DS_MLA caches and
 * reads them back; then the indexer over a key that holds +inf. */
static void test_nonfinite_rows(void)
{
    enum { D = 32, Dc = 256, Dr = 16, B = 4 };
    for (int bi = 0; bi < 2; bi++) {
        kva_context *ctx = new_ctx(kBk[bi], 2);
        kva_rng rng = {4501};
        /* FP8_TOKEN: row 0 finite, row 1 with +inf at 3, row 2 with NaN at 5. */
        kva_cache_desc xd = {
            2, B, 1, D, 0, KVA_DTYPE_FP8_E4M3, KVA_LAYOUT_NHD, KVA_QUANT_FP8_TOKEN, KVA_ATTN_INDEX};
        kva_cache *xc = NULL;
        CHECK_OK(kva_cache_create(ctx, &xd, &xc));
        CHECK(kva_cache_block_bytes_k(xc) == (size_t)B * (D + 4) &&
              kva_cache_block_bytes_v(xc) == 0 && kva_cache_block_bytes_scales(xc) == 0);
        float keys[3][D], back[3][D];
        kva_test_fill(keys, KVA_DTYPE_F32, 3 * D, &rng, 1.0);
        keys[1][3] = INFINITY;
        keys[2][5] = NAN;
        const int64_t slots[3] = {6, 1, 4};
        CHECK_OK(kva_cache_write(ctx, xc, 3, keys, 0, NULL, 0, KVA_DTYPE_F32, slots));
        kva_test_poison(back, KVA_DTYPE_F32, 3 * D);
        CHECK_OK(kva_cache_read(ctx, xc, 3, slots, back, 0, NULL, 0, KVA_DTYPE_F32));
        int inf_row_nan = 1, nan_row_ok = 1, finite_ok = 1;
        const float s0 = lt_scale(keys[0], D), s2 = lt_scale(keys[2], D);
        for (int i = 0; i < D; i++) {
            inf_row_nan &=
                isnan(back[1][i]) && !kva_test_poisoned(back[1], KVA_DTYPE_F32, (size_t)i);
            const float w0 = kva_fp8_e4m3_to_f32(kva_f32_to_fp8_e4m3(keys[0][i] / s0)) * s0;
            finite_ok &= back[0][i] == w0;
            if (i == 5)
                nan_row_ok &=
                    isnan(back[2][i]) && !kva_test_poisoned(back[2], KVA_DTYPE_F32, (size_t)i);
            else
                nan_row_ok &=
                    back[2][i] == kva_fp8_e4m3_to_f32(kva_f32_to_fp8_e4m3(keys[2][i] / s2)) * s2;
        }
        CHECK_MSG(finite_ok, "%s: fp8_token finite row", kva_backend_name(kBk[bi]));
        CHECK_MSG(inf_row_nan, "%s: fp8_token row with +inf: element 0 reads %g, not NaN",
                  kva_backend_name(kBk[bi]), back[1][0]);
        CHECK_MSG(nan_row_ok, "%s: fp8_token row with NaN", kva_backend_name(kBk[bi]));

        /* FP8_DS_MLA, two tiles of 128: row 0's tile 0 holds +inf, row 1's
         * tile 1 a NaN; k_pe comes back as its bf16 rounding. */
        kva_cache_desc dd = {2,
                             B,
                             1,
                             Dc + Dr,
                             Dc,
                             KVA_DTYPE_FP8_E4M3,
                             KVA_LAYOUT_NHD,
                             KVA_QUANT_FP8_DS_MLA,
                             KVA_ATTN_MLA};
        kva_cache *dc = NULL;
        CHECK_OK(kva_cache_create(ctx, &dd, &dc));
        CHECK(kva_cache_block_bytes_k(dc) == (size_t)B * (Dc + 4 * Dc / 128 + 2 * Dr) &&
              kva_cache_block_bytes_v(dc) == 0 && kva_cache_block_bytes_scales(dc) == 0);
        static float ckv[2][Dc], kpe[2][Dr], rc[2][Dc], rp[2][Dr];
        kva_test_fill(ckv, KVA_DTYPE_F32, 2 * Dc, &rng, 1.0);
        kva_test_fill(kpe, KVA_DTYPE_F32, 2 * Dr, &rng, 1.0);
        ckv[0][17] = INFINITY;
        ckv[1][200] = NAN;
        const int64_t ds[2] = {5, 2};
        CHECK_OK(kva_cache_write(ctx, dc, 2, ckv, 0, kpe, 0, KVA_DTYPE_F32, ds));
        kva_test_poison(rc, KVA_DTYPE_F32, 2 * Dc);
        kva_test_poison(rp, KVA_DTYPE_F32, 2 * Dr);
        CHECK_OK(kva_cache_read(ctx, dc, 2, ds, rc, 0, rp, 0, KVA_DTYPE_F32));
        int tile_nan = 1, other_ok = 1, pe_ok = 1;
        for (int r = 0; r < 2; r++)
            for (int t0 = 0; t0 < Dc; t0 += 128) {
                const float s = lt_scale(&ckv[r][t0], 128);
                for (int i = t0; i < t0 + 128; i++) {
                    if (r == 0 && t0 == 0)
                        tile_nan &=
                            isnan(rc[r][i]) && !kva_test_poisoned(rc[r], KVA_DTYPE_F32, (size_t)i);
                    else if (r == 1 && i == 200)
                        other_ok &=
                            isnan(rc[r][i]) && !kva_test_poisoned(rc[r], KVA_DTYPE_F32, (size_t)i);
                    else
                        other_ok &=
                            rc[r][i] == kva_fp8_e4m3_to_f32(kva_f32_to_fp8_e4m3(ckv[r][i] / s)) * s;
                }
            }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < Dr; i++)
                pe_ok &= rp[r][i] == kva_bf16_to_f32(kva_f32_to_bf16(kpe[r][i]));
        CHECK_MSG(tile_nan, "%s: fp8_ds_mla tile with +inf", kva_backend_name(kBk[bi]));
        CHECK_MSG(other_ok, "%s: fp8_ds_mla other tiles / NaN element", kva_backend_name(kBk[bi]));
        CHECK_MSG(pe_ok, "%s: fp8_ds_mla k_pe", kva_backend_name(kBk[bi]));

        /* The indexer over 7 keys (slots 0..6 of block table {0, 1}): key 1
         * is the +inf row (NaN on read-back), the others finite. */
        float all[8][D];
        int64_t s8[8];
        for (int j = 0; j < 8; j++)
            s8[j] = j;
        kva_test_fill(all, KVA_DTYPE_F32, 8 * D, &rng, 1.0);
        all[1][3] = INFINITY;
        CHECK_OK(kva_cache_write(ctx, xc, 8, all, 0, NULL, 0, KVA_DTYPE_F32, s8));
        float rb[8][D];
        CHECK_OK(kva_cache_read(ctx, xc, 8, s8, rb, 0, NULL, 0, KVA_DTYPE_F32));
        enum { Hi = 2, K = 8, S = 7 };
        const int32_t qsl[2] = {0, 1}, sl[1] = {S}, bt[2] = {0, 1};
        kva_plan_desc pd = {.num_requests = 1,
                            .query_start_loc = qsl,
                            .seq_lens = sl,
                            .block_table = bt,
                            .block_table_stride = 2,
                            .block_size = B,
                            .num_heads = Hi,
                            .num_kv_heads = 1,
                            .head_dim = D,
                            .q_dtype = KVA_DTYPE_F32,
                            .causal = 1,
                            .window_left = -1,
                            .kind = KVA_ATTN_INDEX,
                            .sparse_topk = K};
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        float q[Hi * D], w[Hi] = {0.75f, 0.5f};
        kva_test_fill(q, KVA_DTYPE_F32, Hi * D, &rng, 1.0);
        int32_t ind[K], len = -7;
        memset(ind, 0x5a, sizeof ind);
        CHECK_OK(kva_indexer_run(ctx, p, q, w, xc, ind, 0, &len));
        /* The header's order of the finite keys (by logit, descending). */
        double L[S];
        int32_t want[K];
        int n = 0;
        for (int j = 0; j < S; j++) {
            L[j] = 0.0;
            for (int h = 0; h < Hi; h++) {
                double dot = 0.0;
                for (int i = 0; i < D; i++)
                    dot += (double)q[h * D + i] * rb[j][i];
                L[j] += w[h] * (dot > 0.0 ? dot : 0.0);
            }
            if (j != 1)
                want[n++] = j;
        }
        for (int a = 1; a < n; a++)
            for (int b = a; b > 0 && L[want[b]] > L[want[b - 1]]; b--) {
                const int32_t t = want[b];
                want[b] = want[b - 1];
                want[b - 1] = t;
            }
        want[n++] = 1; /* the NaN key last */
        want[n++] = -1;
        CHECK_MSG(len == S, "%s: topk_length %d", kva_backend_name(kBk[bi]), len);
        CHECK_MSG(memcmp(ind, want, sizeof want) == 0,
                  "%s: indexer row %d %d %d %d %d %d %d %d, want %d %d %d %d %d %d %d %d",
                  kva_backend_name(kBk[bi]), ind[0], ind[1], ind[2], ind[3], ind[4], ind[5], ind[6],
                  ind[7], want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7]);
        kva_plan_destroy(p);
        kva_cache_destroy(xc);
        kva_cache_destroy(dc);
        kva_context_destroy(ctx);
    }
}

/* Writes one latent row at slot: c_kv (dc values) all v, k_pe (dr) all -v,
 * and NaN in column col of the row [c_kv | k_pe]. */
static void lt_nan_row(kva_context *ctx, kva_cache *cache, int64_t slot, int dc, int dr, float v,
                       int col)
{
    float ckv[128], kpe[64];
    for (int i = 0; i < dc; i++)
        ckv[i] = v;
    for (int i = 0; i < dr; i++)
        kpe[i] = -v;
    if (col < dc)
        ckv[col] = NAN;
    else
        kpe[col - dc] = NAN;
    CHECK_OK(kva_cache_write(ctx, cache, 1, ckv, 0, kpe, 0, KVA_DTYPE_F32, &slot));
}

/* Rows of request r of a case: all NaN (out and lse, written: not the
 * poison) or all finite. */
static void lt_expect_rows(const char *label, int32_t r, int want_nan, const int32_t *qsl,
                           int32_t H, int32_t Dv, kva_dtype dt, const void *out, const float *lse)
{
    int nan_out = 0, nan_lse = 0, fin = 0;
    const int64_t rows = (int64_t)(qsl[r + 1] - qsl[r]) * H;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t row = (int64_t)qsl[r] * H + i;
        nan_lse += isnan(lse[row]) && !kva_test_poisoned(lse, KVA_DTYPE_F32, (size_t)row);
        fin += isfinite(lse[row]) != 0;
        for (int32_t e = 0; e < Dv; e++) {
            const size_t at = (size_t)(row * Dv + e);
            const double x = kva_test_get(out, dt, at);
            nan_out += isnan(x) && !kva_test_poisoned(out, dt, at);
            fin += isfinite(x) != 0;
        }
    }
    if (want_nan)
        CHECK_MSG(nan_out == rows * Dv && nan_lse == rows,
                  "%s: request %d has a NaN score: %d of %lld out and %d of %lld lse are NaN",
                  label, (int)r, nan_out, (long long)(rows * Dv), nan_lse, (long long)rows);
    else
        CHECK_MSG(fin == rows * (Dv + 1), "%s: request %d: %lld values not finite", label, (int)r,
                  (long long)(rows * (Dv + 1) - fin));
}

/* Requests: two decodes, a prefill and a clean decode; NaN in c_kv of key 3
 * of request 0 and 2, in k_pe of key 3 of request 1. Then one long decode
 * alone (fewer items than threads: the CPU backend splits its keys), NaN in
 * c_kv of key 3. */
static void test_nan_latent(void)
{
    const int32_t ql[4] = {1, 1, 20, 1}, sl[4] = {300, 5000, 400, 77};
    const int32_t ql1[1] = {1}, sl1[1] = {6000};
    for (int bi = 0; bi < 2; bi++)
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int thr = 1; thr <= 3; thr += 2)
                for (int solo = 0; solo < 2; solo++) {
                    kva_context *ctx = new_ctx(kBk[bi], thr);
                    const int32_t R = solo ? 1 : 4, nan_reqs = solo ? 1 : 3;
                    mla_case c =
                        mla_case_of(4, 64, 16, 32, 24, 16, KVA_DTYPE_BF16, 1, 1, R, solo ? ql1 : ql,
                                    solo ? sl1 : sl, 4502 + (uint64_t)fp8);
                    c.fp8 = fp8;
                    mla_data m;
                    CHECK(mla_data_make(ctx, &c, &m));
                    for (int32_t r = 0; r < nan_reqs; r++)
                        lt_nan_row(ctx, m.cache, (int64_t)m.bt[(size_t)r * m.stride] * c.B + 3, 64,
                                   16, 0.25f, r == 1 ? 64 + 5 : 9);
                    kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
                    kva_plan *p = NULL;
                    CHECK_OK(kva_plan_create(ctx, &pd, &p));
                    const size_t T = (size_t)m.T, H = (size_t)c.H;
                    uint16_t *ol = malloc(T * H * c.Dv * 2), *oa = malloc(T * H * c.Dc * 2);
                    float *ll = malloc(T * H * 4), *la = malloc(T * H * 4);
                    void *qa = malloc(T * H * (c.Dc + c.Dr) * 2);
                    kva_rng rng = {77};
                    kva_test_fill_uniform(qa, KVA_DTYPE_BF16, T * H * (c.Dc + c.Dr), &rng);
                    kva_test_poison(ol, KVA_DTYPE_BF16, T * H * c.Dv);
                    kva_test_poison(oa, KVA_DTYPE_BF16, T * H * c.Dc);
                    kva_test_poison(ll, KVA_DTYPE_F32, T * H);
                    kva_test_poison(la, KVA_DTYPE_F32, T * H);
                    CHECK_OK(kva_mla_run(ctx, p, m.q, m.w_uk, m.w_uv, m.cache, ol, ll));
                    CHECK_OK(kva_attention_run(ctx, p, qa, m.cache, NULL, oa, la));
                    char label[112];
                    for (int32_t r = 0; r < R; r++) {
                        snprintf(label, sizeof label, "%s fp8 %d threads %d%s kva_mla_run",
                                 kva_backend_name(kBk[bi]), fp8, thr, solo ? " solo" : "");
                        lt_expect_rows(label, r, r < nan_reqs, m.qsl, c.H, c.Dv, KVA_DTYPE_BF16, ol,
                                       ll);
                        snprintf(label, sizeof label, "%s fp8 %d threads %d%s kva_attention_run",
                                 kva_backend_name(kBk[bi]), fp8, thr, solo ? " solo" : "");
                        lt_expect_rows(label, r, r < nan_reqs, m.qsl, c.H, c.Dc, KVA_DTYPE_BF16, oa,
                                       la);
                    }
                    kva_plan_destroy(p);
                    free(ol), free(oa), free(ll), free(la), free(qa);
                    mla_data_free(&m);
                    kva_context_destroy(ctx);
                }
}

/* NaN in the query of token 0, head 0 and in w_uk of head 2 (every row of
 * head 2 scores NaN): kva_mla_run's rows (0, 0) and (t, 2) are NaN, the
 * others finite; the absorbed call with a NaN in q of token 0, head 0 alike.
 * A long decode alone at three threads splits its keys on the CPU: every
 * piece of a NaN row then has max -inf and l NaN (the merge wrote 0 and
 * lse -inf); and a batch of decodes and a prefill. */
static void test_nan_query(void)
{
    const int32_t ql1[1] = {1}, sl1[1] = {6000}, ql3[3] = {1, 20, 1}, sl3[3] = {300, 400, 77};
    for (int bi = 0; bi < 2; bi++)
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int solo = 0; solo < 2; solo++) {
                kva_context *ctx = new_ctx(kBk[bi], 3);
                mla_case c = mla_case_of(4, 64, 16, 32, 24, 16, KVA_DTYPE_BF16, 1, 1, solo ? 1 : 3,
                                         solo ? ql1 : ql3, solo ? sl1 : sl3, 4504 + (uint64_t)fp8);
                c.fp8 = fp8;
                mla_data m;
                CHECK(mla_data_make(ctx, &c, &m));
                ((uint16_t *)m.q)[3] = kva_f32_to_bf16(NAN);
                ((uint16_t *)m.w_uk)[(size_t)2 * c.Dn * c.Dc + 5] = kva_f32_to_bf16(NAN);
                kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
                kva_plan *p = NULL;
                CHECK_OK(kva_plan_create(ctx, &pd, &p));
                const size_t T = (size_t)m.T, H = (size_t)c.H;
                uint16_t *ol = malloc(T * H * c.Dv * 2), *oa = malloc(T * H * c.Dc * 2);
                float *ll = malloc(T * H * 4), *la = malloc(T * H * 4);
                uint16_t *qa = malloc(T * H * (c.Dc + c.Dr) * 2);
                kva_rng rng = {78};
                kva_test_fill_uniform(qa, KVA_DTYPE_BF16, T * H * (c.Dc + c.Dr), &rng);
                qa[7] = kva_f32_to_bf16(NAN);
                kva_test_poison(ol, KVA_DTYPE_BF16, T * H * c.Dv);
                kva_test_poison(oa, KVA_DTYPE_BF16, T * H * c.Dc);
                kva_test_poison(ll, KVA_DTYPE_F32, T * H);
                kva_test_poison(la, KVA_DTYPE_F32, T * H);
                CHECK_OK(kva_mla_run(ctx, p, m.q, m.w_uk, m.w_uv, m.cache, ol, ll));
                CHECK_OK(kva_attention_run(ctx, p, qa, m.cache, NULL, oa, la));
                for (size_t t = 0; t < T; t++)
                    for (size_t h = 0; h < H; h++) {
                        const int32_t one[2] = {(int32_t)(t * H + h), (int32_t)(t * H + h + 1)};
                        char label[112];
                        snprintf(label, sizeof label, "%s fp8 %d%s kva_mla_run row (%zu, %zu)",
                                 kva_backend_name(kBk[bi]), fp8, solo ? " solo" : "", t, h);
                        /* lt_expect_rows over one "request" of one row and H = 1. */
                        lt_expect_rows(label, 0, (t == 0 && h == 0) || h == 2, one, 1, c.Dv,
                                       KVA_DTYPE_BF16, ol, ll);
                        snprintf(label, sizeof label,
                                 "%s fp8 %d%s kva_attention_run row (%zu, %zu)",
                                 kva_backend_name(kBk[bi]), fp8, solo ? " solo" : "", t, h);
                        lt_expect_rows(label, 0, t == 0 && h == 0, one, 1, c.Dc, KVA_DTYPE_BF16, oa,
                                       la);
                    }
                kva_plan_destroy(p);
                free(ol), free(oa), free(ll), free(la), free(qa);
                mla_data_free(&m);
                kva_context_destroy(ctx);
            }
}

/* Sparse MLA: request 0's key 3 holds NaN in c_kv, request 1's in k_pe;
 * tokens of request 0 and 1 list key 3 except token 2 (of request 1), which
 * lists only the clean keys 4 ..; request 2 is clean. */
static void test_nan_sparse(void)
{
    for (int bi = 0; bi < 2; bi++)
        for (int quant = 0; quant < 3; quant++)
            for (int mode = 0; mode < 2; mode++) {
                kva_context *ctx = new_ctx(kBk[bi], 3);
                const kva_quant qs[3] = {KVA_QUANT_NONE, KVA_QUANT_FP8_E4M3, KVA_QUANT_FP8_DS_MLA};
                sp_case c = {.H = 20,
                             .Dc = 128,
                             .Dr = 64,
                             .B = 8,
                             .K = 16,
                             .dt = KVA_DTYPE_BF16,
                             .quant = qs[quant],
                             .mode = mode,
                             .thr = 1,
                             .R = 3,
                             .q_len = {1, 5, 1},
                             .seq_len = {100, 60, 30},
                             .seed = 4503};
                sp_data m;
                if (!sp_data_make(ctx, &c, &m)) {
                    CHECK_MSG(0, "setup: %s", kva_last_error());
                    kva_context_destroy(ctx);
                    continue;
                }
                for (int32_t r = 0; r < 2; r++)
                    lt_nan_row(ctx, m.cache, (int64_t)m.bt[(size_t)r * m.stride] * c.B + 3, 128, 64,
                               0.125f, r == 1 ? 128 + 2 : 2);
                for (int32_t t = 0; t < m.T; t++) {
                    for (int32_t k = 0; k < c.K; k++)
                        m.idx[(size_t)t * c.K + k] = t == 2 ? 4 + k : k;
                    if (m.len)
                        m.len[t] = c.K;
                }
                kva_plan_desc pd = sp_plan_desc(&c, &m);
                kva_plan *p = NULL;
                CHECK_OK(kva_plan_create(ctx, &pd, &p));
                const size_t rows = (size_t)m.T * c.H;
                uint16_t *out = malloc(rows * c.Dc * 2);
                float *lse = malloc(rows * 4);
                kva_test_poison(out, KVA_DTYPE_BF16, rows * c.Dc);
                kva_test_poison(lse, KVA_DTYPE_F32, rows);
                CHECK_OK(
                    kva_mla_sparse_run(ctx, p, m.q, m.cache, m.idx, 0, m.len, m.sinks, out, lse));
                for (int32_t t = 0; t < m.T; t++) {
                    /* Tokens 0 (request 0) and 1, 3 .. 5 (request 1) list the NaN key. */
                    const int want_nan = t != 2 && t < 6;
                    const int32_t tq[2] = {t, t + 1};
                    char label[96];
                    snprintf(label, sizeof label, "%s %s %s sparse token %d",
                             kva_backend_name(kBk[bi]), kva_quant_name(qs[quant]),
                             mode ? "separate" : "mixed", (int)t);
                    lt_expect_rows(label, 0, want_nan, tq, c.H, c.Dc, KVA_DTYPE_BF16, out, lse);
                }
                kva_plan_destroy(p);
                free(out), free(lse);
                sp_data_free(&m);
                kva_context_destroy(ctx);
            }
}

int main(void)
{
    RUN(test_nonfinite_rows);
    RUN(test_nan_latent);
    RUN(test_nan_query);
    RUN(test_nan_sparse);
    return kva_test_finish();
}
