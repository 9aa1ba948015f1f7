/*
 * test_api_blackbox_r16_edges.c - black-box round sixteen, second file (session
 * 44, task api56; split from test_api_blackbox_r16.c at its cases' seams):
 * outputs poisoned before every run and compared with the reference:
 *   - MLA (kva_mla_run and the absorbed kva_attention_run) at the head
 *     sizes' edges: Dc or Dr of 8, Dc + Dr = 576, Dn + Dr = 576 with Dv
 *     576 (the compute-friendly path's widest), Dv > Dc, odd H, both
 *     paths, f32 / bf16 / FP8 rows, CPU at 1 and 3 threads against the
 *     reference's naive fp64 math; Dn + Dr past 576 is refused
 *     (KVA_STATUS_UNSUPPORTED, as kvattn.h now says);
 *   - caches of the formats test_api_blackbox_sizes.c's 2^32-element f16
 *     cache leaves out (INT8_CHANNEL, INT8_TOKEN_K with its per-token key
 *     scales, FP8_E4M3, MLA latent rows, FP8_DS_MLA rows, FP8_TOKEN index
 *     keys), allocated by the library past 4 GiB of K (untouched pages cost
 *     nothing): writes, reads and the run calls at block ids whose byte
 *     offsets pass 2^31 and 2^32 equal the same rows at small block ids.
 */
#include "blackbox_oracle.h"
#include "indexer_util.h"
#include "mla_vs_ref.h"
#include "sparse_util.h" /* includes mla_util.h */

/* ---- MLA at the head sizes' edges ---- */

static void test_mla_head_size_edges(void)
{
    /* H, Dc, Dr, Dn, Dv */
    static const int32_t dims[][5] = {
        {3, 8, 8, 8, 8},    {5, 568, 8, 16, 24},  {2, 72, 24, 552, 576}, {1, 200, 56, 136, 8},
        {4, 8, 568, 8, 16}, {3, 24, 8, 256, 512}, {7, 120, 40, 40, 120},
    };
    const int32_t ql[4] = {1, 5, 3, 1}, sl[4] = {9, 37, 3, 70};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        for (int v = 0; v < 4; v++) {
            const kva_dtype dt = v == 1 ? KVA_DTYPE_BF16 : KVA_DTYPE_F32;
            const int32_t thr = v & 1 ? 4 : 1, B = v == 2 ? 1 : v == 3 ? 16 : 5;
            mla_case c = mla_case_of(dims[i][0], dims[i][1], dims[i][2], dims[i][3], dims[i][4], B,
                                     dt, 1, thr, 4, ql, sl, 0x16a0 + i * 4 + (uint64_t)v);
            c.fp8 = v == 3;
            char tag[96];
            snprintf(tag, sizeof tag, "MLA H %d Dc %d Dr %d Dn %d Dv %d %s%s thr %d B %d",
                     dims[i][0], dims[i][1], dims[i][2], dims[i][3], dims[i][4], kva_dtype_name(dt),
                     c.fp8 ? " fp8" : "", thr, B);
            mla_case_vs_ref(&c, v & 1 ? 3 : 1, tag);
        }
    /* The compute-friendly path attends with D = Dn + Dr: past 576 the plan
     * is refused, on every backend, naming the field. */
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 1);
        const int32_t qsl[2] = {0, 1}, seq[1] = {4}, bt[1] = {1};
        kva_plan_desc pd =
            kva_test_mla_desc(1, qsl, seq, bt, 1, 16, 2, 96, 72, KVA_DTYPE_F32, 0.1, 1);
        pd.mla_qk_nope_head_dim = 560;
        pd.mla_v_head_dim = 64;
        kva_plan *p = (kva_plan *)(uintptr_t)0x1;
        BAD(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("mla_qk_nope_head_dim");
        CHECK(p == (kva_plan *)(uintptr_t)0x1);
        pd.mla_qk_nope_head_dim = 552; /* 552 + 24 = 576 */
        p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        kva_plan_destroy(p);
        kva_context_destroy(ctx);
    }
}

/* ---- quantized, latent and index caches past 4 GiB ---- */

enum { BQ_NBLK = 6 };

typedef struct bq_case {
    const char *name;
    kva_attn_kind kind;
    kva_quant quant;
    kva_dtype cdt; /* cache dtype */
    int32_t B, Hkv, D, Dv, NB;
} bq_case;

/* Writes the same rows at blocks ids[0..5] and at small [0..5], then runs
 * the case's call over each set: the outputs must be equal bytes, and
 * reading back the rows gives equal values. */
static void bq_run(kva_backend be, const bq_case *c)
{
    const int32_t B = c->B, T = BQ_NBLK * B, Hkv = c->Hkv, D = c->D, Dv = c->Dv;
    const int32_t ids[2][BQ_NBLK] = {
        {c->NB - 1, c->NB - 2, c->NB / 2 + 1, c->NB - c->NB / 4, 5, c->NB - 7}, {0, 1, 2, 3, 4, 6}};
    kva_context *ctx = new_ctx(be, 2);
    kva_cache_desc cd = {c->NB, B, Hkv, D, Dv, c->cdt, KVA_LAYOUT_NHD, c->quant, c->kind};
    float scal[2 * 4 * 576 * 2];
    kva_quant_params qp;
    memset(&qp, 0, sizeof qp);
    kva_rng rng = {0xb16 + (uint64_t)c->quant * 3 + (uint64_t)c->kind};
    if (c->quant == KVA_QUANT_INT8_CHANNEL || c->quant == KVA_QUANT_INT8_TOKEN_K ||
        (c->quant == KVA_QUANT_FP8_E4M3 && c->kind == KVA_ATTN_MHA))
        make_params(c->quant, Hkv, D, Dv, 0, &rng, scal, &qp);
    const float one = 0.05f;
    if (c->quant == KVA_QUANT_FP8_E4M3 && c->kind == KVA_ATTN_MLA)
        qp = (kva_quant_params){.k_scale = &one, .k_scale_len = 1};
    kva_cache *cache = NULL;
    kva_status st = kva_cache_create_quant(
        ctx, &cd, c->quant == KVA_QUANT_NONE || c->quant >= KVA_QUANT_FP8_DS_MLA ? NULL : &qp,
        &cache);
    if (st == KVA_STATUS_OUT_OF_MEMORY) {
        fprintf(stderr, "  (%s skipped: %s)\n", c->name, kva_last_error());
        kva_context_destroy(ctx);
        return;
    }
    CHECK_MSG(st == KVA_STATUS_OK, "%s: %s", c->name, kva_last_error());
    if (st != KVA_STATUS_OK) {
        kva_context_destroy(ctx);
        return;
    }
    CHECK_MSG(kva_cache_block_bytes_k(cache) * (size_t)c->NB > ((size_t)1 << 32),
              "%s: K holds %zu bytes, not past 2^32", c->name,
              kva_cache_block_bytes_k(cache) * (size_t)c->NB);
    /* Rows: MHA k [T, Hkv, D] / v [T, Hkv, Dv]; MLA c_kv [T, Dv] / k_pe
     * [T, D - Dv]; INDEX keys [T, D]. */
    const int mla = c->kind == KVA_ATTN_MLA, idx = c->kind == KVA_ATTN_INDEX;
    const size_t kw = mla ? (size_t)Dv : (size_t)Hkv * D,
                 vw = mla ? (size_t)(D - Dv) : (size_t)Hkv * Dv;
    float *k = malloc(sizeof(float) * T * kw), *v = malloc(sizeof(float) * T * vw);
    float *kr[2], *vr[2];
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)T * kw, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)T * vw, &rng);
    int64_t slots[2][BQ_NBLK * 64];
    for (int s = 0; s < 2; s++) {
        for (int32_t t = 0; t < T; t++)
            slots[s][t] = (int64_t)ids[s][t / B] * B + t % B;
        CHECK_OK(kva_cache_write(ctx, cache, T, k, 0, idx ? NULL : v, 0, KVA_DTYPE_F32, slots[s]));
        kr[s] = malloc(sizeof(float) * T * kw);
        vr[s] = malloc(sizeof(float) * T * vw);
        kva_test_poison(kr[s], KVA_DTYPE_F32, (size_t)T * kw);
        kva_test_poison(vr[s], KVA_DTYPE_F32, (size_t)T * vw);
        CHECK_OK(kva_cache_read(ctx, cache, T, slots[s], kr[s], 0, idx ? NULL : vr[s], 0,
                                KVA_DTYPE_F32));
    }
    CHECK_MSG(memcmp(kr[0], kr[1], sizeof(float) * T * kw) == 0, "%s %s: K rows read back differ",
              c->name, kva_backend_name(be));
    CHECK_MSG(idx || memcmp(vr[0], vr[1], sizeof(float) * T * vw) == 0,
              "%s %s: V rows read back differ", c->name, kva_backend_name(be));
    /* Two requests over the six blocks: a decode and a 3-token prefill. */
    const int32_t qsl[3] = {0, 1, 4}, sl[2] = {T - 3, 4 * B + 1}, H = mla ? 5 : idx ? 4 : 2 * Hkv;
    const kva_dtype qdt = c->quant == KVA_QUANT_NONE ? c->cdt : KVA_DTYPE_F32;
    const int32_t Dq = D, Do = mla ? Dv : Dv, K = 16;
    void *q = malloc(4 * (size_t)H * Dq * kva_dtype_size(qdt));
    kva_test_fill_uniform(q, qdt, 4 * (size_t)H * Dq, &rng);
    float w[4 * 8];
    for (int i = 0; i < 4 * 8; i++)
        w[i] = (float)(kva_rng_unit(&rng) + 0.1);
    int32_t sidx[4 * 16];
    for (int i = 0; i < 4 * K; i++)
        sidx[i] = i % 5 == 4 ? -1 : kva_rng_int(&rng, 0, (i / K == 0 ? sl[0] : 4 * B) - 1);
    const size_t no = idx ? (size_t)4 * K * 4 : 4 * (size_t)H * Do * kva_dtype_size(qdt);
    unsigned char *out[2];
    float lse[2][4 * 8];
    for (int s = 0; s < 2; s++) {
        int32_t bt[2 * BQ_NBLK];
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < BQ_NBLK; j++)
                bt[r * BQ_NBLK + j] = ids[s][(j + 2 * r) % BQ_NBLK];
        /* Request 1 reads the blocks in another order: its keys are the rows
         * written at those blocks, the same for both sets. */
        kva_plan_desc pd = {.num_requests = 2,
                            .query_start_loc = qsl,
                            .seq_lens = sl,
                            .block_table = bt,
                            .block_table_stride = BQ_NBLK,
                            .block_size = B,
                            .decode_threshold = 1,
                            .num_heads = H,
                            .num_kv_heads = Hkv,
                            .head_dim = D,
                            .head_dim_v = idx ? 0 : Dv,
                            .q_dtype = qdt,
                            .scale = 0.1f,
                            .causal = 1,
                            .window_left = -1,
                            .kind = c->kind,
                            .sparse_topk = (idx || c->quant == KVA_QUANT_FP8_DS_MLA) ? K : 0};
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        out[s] = malloc(no);
        memset(out[s], 0xa5, no);
        kva_test_poison(lse[s], KVA_DTYPE_F32, 4 * (size_t)H);
        if (idx)
            st = kva_indexer_run(ctx, p, q, w, cache, (int32_t *)out[s], 0, NULL);
        else if (c->quant == KVA_QUANT_FP8_DS_MLA)
            st = kva_mla_sparse_run(ctx, p, q, cache, sidx, 0, NULL, NULL, out[s], lse[s]);
        else
            st = kva_attention_run(ctx, p, q, cache, NULL, out[s], lse[s]);
        CHECK_MSG(st == KVA_STATUS_OK, "%s %s: %s", c->name, kva_backend_name(be),
                  kva_last_error());
        kva_plan_destroy(p);
    }
    CHECK_MSG(memcmp(out[0], out[1], no) == 0 &&
                  (idx || memcmp(lse[0], lse[1], sizeof(float) * 4 * (size_t)H) == 0),
              "%s %s: the run over blocks past 2^32 bytes differs from the same rows at small "
              "block ids",
              c->name, kva_backend_name(be));
    for (int s = 0; s < 2; s++) {
        free(out[s]);
        free(kr[s]);
        free(vr[s]);
    }
    free(q);
    free(k);
    free(v);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
}

/* AddressSanitizer writes the shadow of a freed chunk (1/8 of its size):
 * the library-allocated caches of this case would cost GiBs there. */
#if defined(__SANITIZE_ADDRESS__)
#define R16_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define R16_ASAN 1
#endif
#endif

static void test_big_quant_offsets(void)
{
#ifdef R16_ASAN
    fprintf(stderr, "  (test_big_quant_offsets skipped under AddressSanitizer)\n");
    return;
#endif
    /* NB so that K passes 2^32 bytes (V alike where there is one). */
    static const bq_case cases[] = {
        {"INT8_CHANNEL", KVA_ATTN_MHA, KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, 16, 4, 128, 64,
         (1 << 19) + 3},
        {"INT8_TOKEN_K", KVA_ATTN_MHA, KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, 16, 1, 576, 8, 470000},
        {"FP8_E4M3", KVA_ATTN_MHA, KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 16, 4, 128, 64,
         (1 << 19) + 3},
        {"MLA f16", KVA_ATTN_MLA, KVA_QUANT_NONE, KVA_DTYPE_F16, 64, 1, 576, 512, 60000},
        {"MLA FP8_E4M3", KVA_ATTN_MLA, KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 64, 1, 576, 512,
         120000},
        {"FP8_DS_MLA", KVA_ATTN_MLA, KVA_QUANT_FP8_DS_MLA, KVA_DTYPE_FP8_E4M3, 64, 1, 576, 512,
         110000},
        {"FP8_TOKEN index", KVA_ATTN_INDEX, KVA_QUANT_FP8_TOKEN, KVA_DTYPE_FP8_E4M3, 64, 1, 128, 0,
         520000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int b = 0; b < 2; b++)
            bq_run(kBk[b], &cases[i]);
}

int main(void)
{
    RUN(test_mla_head_size_edges);
    RUN(test_big_quant_offsets);
    return kva_test_finish();
}
