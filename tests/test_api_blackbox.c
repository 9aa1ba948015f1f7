/*
 * test_api_blackbox.c - a black-box audit of the public headers' promises on
 * the reference and CPU backends (session 35, task api35), valid inputs: shapes,
 * masks and formats the other tests do not try, the CPU backend against the
 * reference on random data, outputs (and caches) poisoned before each run:
 *   - block sizes 1, 3, 5 and 256, head sizes 8..576 not powers of two, Dv != D,
 *     GQA ratios 1..64, H = KVA_MAX_HEADS, NHD and HND, f32/f16/bf16, q_len 0
 *     requests, causal chunked prefill with window + soft-cap + ALiBi + sinks,
 *     local chunks, speculative decodes, long contexts split over threads;
 *   - non-causal q_len > seq_len and seq_len 0 (zero rows, lse -inf or the
 *     sink); ragged runs equal paged runs;
 *   - shared prefixes run as cascades (and the cascade's context rule);
 *   - quantized caches (both backends store the same bytes), MLA (absorbed
 *     and layer-level), sparse MLA and the indexer on odd shapes;
 *   - merges with -inf parts holding NaN, all -inf, NaN lse;
 *   - a plan reused after its cache changed.
 * test_api_blackbox_errors.c has the bad inputs.
 */
#include "blackbox_util.h"

/* The case tables below list the leading fields of bb_case and leave its
 * trailing optional ones (threads, prefix sharing, cache format) zero. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* Cases that ran as a cascade (test_exotic checks that its shared prefixes did). */
static int bb_cascades;

/* One attention case: requests, shapes, masks. */
typedef struct bb_case {
    int32_t R;
    int32_t ql[4], sl[4];
    int32_t H, Hkv, D, Dv, B;
    kva_layout layout;
    kva_dtype dt;
    int32_t causal, window, chunk;
    float softcap;
    int alibi, sinks;
    /* Optional: decode_threshold, cascade mode, CPU threads (0: 2), leading
     * blocks every request shares with request 0 (a shared prefix). */
    int32_t thr, cascade, threads, share;
    /* Optional: the cache format (cache_util.h's random static scales of
     * granularity gran) and, for INT8_TOKEN_K_V16, V's dtype (else q's). */
    kva_quant quant;
    int gran;
} bb_case;

/* The storage dtype of a case's cache. */
static kva_dtype bb_cache_dtype(const bb_case *c)
{
    switch (c->quant) {
    case KVA_QUANT_INT8_CHANNEL:
    case KVA_QUANT_INT8_TOKEN_K:
        return KVA_DTYPE_I8;
    case KVA_QUANT_FP8_E4M3:
        return KVA_DTYPE_FP8_E4M3;
    case KVA_QUANT_INT8_TOKEN_K_V16:
        return c->dt == KVA_DTYPE_F32 ? KVA_DTYPE_F16 : c->dt;
    default:
        return c->dt;
    }
}

/* Builds the plan descriptor of a case; qsl [R+1], bt [R*stride] filled here. */
static kva_plan_desc bb_desc(const bb_case *c, int32_t *qsl, int32_t *bt, int32_t stride,
                             const float *slopes)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    qsl[0] = 0;
    for (int32_t r = 0; r < c->R; r++)
        qsl[r + 1] = qsl[r] + c->ql[r];
    d.num_requests = c->R;
    d.query_start_loc = qsl;
    d.seq_lens = c->sl;
    d.block_table = bt;
    d.block_table_stride = stride;
    d.block_size = c->B;
    d.num_heads = c->H;
    d.num_kv_heads = c->Hkv;
    d.head_dim = c->D;
    d.head_dim_v = c->Dv;
    d.q_dtype = c->dt;
    d.causal = c->causal;
    d.window_left = c->window;
    d.attention_chunk = c->chunk;
    d.softcap = c->softcap;
    d.alibi_slopes = c->alibi ? slopes : NULL;
    d.decode_threshold = c->thr;
    d.cascade = c->cascade;
    return d;
}

/* Runs one case on the reference and the CPU backend with the same data and
 * compares; also checks rows that see no key (out 0, lse -inf or the sink).
 * Returns the number of mismatches. */
static size_t bb_run_case(const bb_case *c, uint64_t seed)
{
    kva_rng rng = {seed};
    const int32_t Dv = c->Dv ? c->Dv : c->D;
    int32_t stride = 1, nb = 1, T = 0;
    for (int32_t r = 0; r < c->R; r++) {
        int32_t n = (c->sl[r] + c->B - 1) / c->B;
        stride = n > stride ? n : stride;
        nb += n;
        T += c->ql[r];
    }
    int32_t qsl[5], *bt = malloc(sizeof(int32_t) * (size_t)(c->R * stride + 1));
    /* Blocks in a shuffled order, padding -1. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t i = 0; i < nb; i++)
        perm[i] = i;
    for (int32_t i = nb - 1; i > 0; i--) {
        int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t used = 0, tokens = 0;
    for (int32_t r = 0; r < c->R; r++) {
        int32_t n = (c->sl[r] + c->B - 1) / c->B;
        for (int32_t k = 0; k < stride; k++)
            bt[r * stride + k] = k >= n ? -1 : r > 0 && k < c->share ? bt[k] : perm[used + k];
        used += n;
        tokens += c->sl[r];
    }
    static float slopes[KVA_MAX_HEADS], sinks[KVA_MAX_HEADS];
    for (int32_t h = 0; h < c->H; h++) {
        slopes[h] = (float)(0.05 + 0.3 * kva_rng_unit(&rng));
        sinks[h] = (float)(2.0 * kva_rng_unit(&rng) - 1.0);
    }
    kva_plan_desc pd = bb_desc(c, qsl, bt, stride, slopes);
    /* Keys and values of every position, f32, written through kva_cache_write. */
    const size_t kr = (size_t)c->Hkv * c->D, vr = (size_t)c->Hkv * Dv;
    float *k = malloc(sizeof(float) * (kr * (size_t)tokens + 1));
    float *v = malloc(sizeof(float) * (vr * (size_t)tokens + 1));
    int64_t *slots = malloc(sizeof(int64_t) * ((size_t)tokens + 1));
    kva_test_fill(k, KVA_DTYPE_F32, kr * (size_t)tokens, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, vr * (size_t)tokens, &rng, 1.0);
    for (int32_t r = 0, t = 0; r < c->R; r++)
        for (int32_t j = 0; j < c->sl[r]; j++, t++) {
            slots[t] = (int64_t)bt[r * stride + j / c->B] * c->B + j % c->B;
            if (r > 0 && j < c->share * c->B) {
                /* A shared position: request 0's key and value, written once. */
                memcpy(k + (size_t)t * kr, k + (size_t)j * kr, sizeof(float) * kr);
                memcpy(v + (size_t)t * vr, v + (size_t)j * vr, sizeof(float) * vr);
                slots[t] = -1;
            }
        }
    const size_t es = kva_dtype_size(c->dt);
    const size_t qn = (size_t)T * c->H * c->D, on = (size_t)T * c->H * Dv, ln = (size_t)T * c->H;
    void *q = malloc(es * qn + 1);
    kva_test_fill(q, c->dt, qn, &rng, 1.0);
    void *out[2];
    float *lse[2];
    size_t bad = 0;
    uint64_t store_sum = 0;
    for (int bi = 0; bi < 2; bi++) {
        out[bi] = malloc(es * on + 1);
        lse[bi] = malloc(sizeof(float) * ln + 1);
        kva_test_poison(out[bi], c->dt, on);
        kva_test_poison(lse[bi], KVA_DTYPE_F32, ln);
        kva_context *ctx = new_ctx(kBk[bi], bi ? (c->threads ? c->threads : 2) : 1);
        kva_cache_desc cd = make_desc(nb, c->B, c->Hkv, c->D, c->Dv, bb_cache_dtype(c), c->layout);
        cd.quant = c->quant;
        kva_cache *cache = NULL;
        kva_plan *plan = NULL;
        kva_rng prng = {seed * 7 + 1}; /* the same scales on both backends */
        float *pbuf = malloc(sizeof(float) * 2 * (size_t)c->Hkv * (size_t)(c->D + Dv));
        kva_quant_params qp;
        make_params(c->quant, c->Hkv, c->D, Dv, c->gran, &prng, pbuf, &qp);
        CHECK_OK(kva_cache_create_quant(ctx, &cd, c->quant ? &qp : NULL, &cache));
        free(pbuf);
        if (!cache) {
            kva_context_destroy(ctx);
            bad++;
            continue;
        }
        /* The cache is poisoned first: only written slots may be read. */
        {
            void *ck, *cv;
            kva_cache_data(cache, &ck, &cv);
            memset(ck, 0x7f, kva_cache_block_bytes_k(cache) * (size_t)nb);
            memset(cv, 0x7f, kva_cache_block_bytes_v(cache) * (size_t)nb);
        }
        CHECK_OK(kva_cache_write(ctx, cache, tokens, k, 0, v, 0, KVA_DTYPE_F32, slots));
        /* Both backends store the same bytes (quantization included). */
        {
            void *ck, *cv;
            float *ts = NULL;
            kva_cache_data(cache, &ck, &cv);
            kva_cache_token_scales(cache, &ts);
            const size_t kb = kva_cache_block_bytes_k(cache) * (size_t)nb;
            const size_t vb = kva_cache_block_bytes_v(cache) * (size_t)nb;
            const size_t tb = kva_cache_block_bytes_scales(cache) * (size_t)nb;
            uint64_t h = bb_sum(ck, kb) ^ (bb_sum(cv, vb) << 1) ^ (ts ? bb_sum(ts, tb) << 2 : 0);
            if (bi == 0)
                store_sum = h;
            else if (h != store_sum) {
                fprintf(stderr, "  cache bytes differ between ref and cpu\n");
                bad++;
            }
        }
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        CHECK_OK(kva_attention_run(ctx, plan, q, cache, c->sinks ? sinks : NULL, out[bi], lse[bi]));
        /* The same keys packed per request (kva_attention_run_ragged) give the same rows. */
        void *kq = malloc(es * kr * (size_t)tokens + 1), *vq = malloc(es * vr * (size_t)tokens + 1);
        void *ro = malloc(es * on + 1);
        float *rl = malloc(sizeof(float) * ln + 1);
        CHECK_OK(kva_convert(k, KVA_DTYPE_F32, kq, c->dt, kr * (size_t)tokens));
        CHECK_OK(kva_convert(v, KVA_DTYPE_F32, vq, c->dt, vr * (size_t)tokens));
        kva_test_poison(ro, c->dt, on);
        kva_test_poison(rl, KVA_DTYPE_F32, ln);
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(plan, &info));
        bb_cascades += info.num_cascade_groups > 0;
        if (info.num_cascade_groups > 0) {
            /* A cascade plan reads shared blocks of a paged cache: refused, nothing written. */
            const uint64_t so = bb_sum(ro, es * on), sl = bb_sum(rl, sizeof(float) * ln);
            BAD(kva_attention_run_ragged(ctx, plan, q, kq, vq, NULL, ro, rl),
                KVA_STATUS_INVALID_ARGUMENT);
            CHECK(bb_sum(ro, es * on) == so && bb_sum(rl, sizeof(float) * ln) == sl);
        } else if (c->quant == KVA_QUANT_NONE) {
            CHECK_OK(
                kva_attention_run_ragged(ctx, plan, q, kq, vq, c->sinks ? sinks : NULL, ro, rl));
            bad += kva_test_compare("ragged vs paged", ro, out[bi], c->dt, on, kva_test_atol(c->dt),
                                    kva_test_rtol(c->dt));
            bad += kva_test_compare_f32("ragged vs paged lse", rl, lse[bi], ln, 1e-4, 1e-5);
        }
        free(kq);
        free(vq);
        free(ro);
        free(rl);
        kva_plan_destroy(plan);
        kva_cache_destroy(cache);
        kva_context_destroy(ctx);
    }
    bad += kva_test_compare("out cpu vs ref", out[1], out[0], c->dt, on, kva_test_atol(c->dt),
                            kva_test_rtol(c->dt));
    bad += kva_test_compare_f32("lse cpu vs ref", lse[1], lse[0], ln, 1e-4, 1e-5);
    /* Rows of a non-causal request beyond what its keys cover: none when
     * seq_len is 0 (out 0, lse -inf or the sink); the reference checked alone. */
    for (int32_t r = 0; r < c->R; r++) {
        if (c->sl[r] != 0)
            continue;
        for (int32_t t = qsl[r]; t < qsl[r + 1]; t++)
            for (int32_t h = 0; h < c->H; h++) {
                for (int bi = 0; bi < 2; bi++) {
                    float l = lse[bi][(size_t)t * c->H + h];
                    int ok = c->sinks ? l == sinks[h] : (isinf(l) && l < 0);
                    for (int32_t e = 0; e < Dv; e++)
                        ok &= kva_test_get(out[bi], c->dt, ((size_t)t * c->H + h) * Dv + e) == 0.0;
                    if (!ok) {
                        fprintf(stderr, "  %s: empty row t %d h %d: lse %g\n",
                                kva_backend_name(kBk[bi]), t, h, l);
                        bad++;
                    }
                }
            }
    }
    for (int bi = 0; bi < 2; bi++) {
        free(out[bi]);
        free(lse[bi]);
    }
    free(q);
    free(k);
    free(v);
    free(slots);
    free(bt);
    free(perm);
    return bad;
}

#define BB_CHECK_CASE(c, seed)                                                                     \
    do {                                                                                           \
        size_t bad_ = bb_run_case(&(c), (seed));                                                   \
        CHECK_MSG(bad_ == 0, "case at line %d: %zu mismatches", __LINE__, bad_);                   \
    } while (0)

/* Shapes: block sizes 1 and 3, head sizes 24 / 40 / 72 and Dv != D, GQA ratios, layouts. */
static void test_shapes(void)
{
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    const int32_t Bs[3] = {1, 3, 5};
    const int32_t Ds[4][2] = {{8, 0}, {24, 40}, {72, 16}, {40, 0}};
    const int32_t Hs[4][2] = {{6, 1}, {6, 3}, {5, 5}, {6, 2}};
    int n = 0;
    for (int di = 0; di < 4; di++)
        for (int hi = 0; hi < 4; hi++, n++) {
            bb_case c = {3,          {1, 4, 2}, {7, 9, 2},
                         Hs[hi][0],  Hs[hi][1], Ds[di][0],
                         Ds[di][1],  Bs[n % 3], (kva_layout)(n % 2),
                         dts[n % 3], 1,         -1,
                         0,          0.0f,      0,
                         0,          0,         0,
                         0,          0};
            BB_CHECK_CASE(c, 100 + (uint64_t)n);
        }
}

/* Masks combined: causal chunked prefill with window, soft-cap, ALiBi and sinks; local chunks;
 * q_len 0 requests in between. */
static void test_masks(void)
{
    for (int m = 0; m < 16; m++) {
        bb_case c = {4,
                     {3, 0, 1, 6},
                     {11, 5, 13, 6},
                     4,
                     2,
                     16,
                     0,
                     3,
                     (kva_layout)(m % 2),
                     (kva_dtype)(m % 3),
                     1,
                     -1,
                     0,
                     0.0f,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0};
        c.window = (m & 1) ? 4 : -1;
        c.softcap = (m & 2) ? 3.0f : 0.0f;
        c.alibi = (m & 4) != 0;
        c.sinks = (m & 8) != 0;
        if (m == 5 || m == 10)
            c.chunk = 4, c.alibi = 0;
        if (m == 15)
            c.window = 0; /* each row sees its own key only */
        BB_CHECK_CASE(c, 200 + (uint64_t)m);
    }
}

/* Wide GQA groups, the largest head sizes, big blocks, long contexts split
 * over threads, speculative decodes with windows and chunks, shared prefixes
 * run as cascades (sinks and soft-cap must count once), all heads. */
static void test_exotic(void)
{
    const kva_layout N = KVA_LAYOUT_NHD, Hd = KVA_LAYOUT_HND;
    const kva_dtype F32 = KVA_DTYPE_F32, F16 = KVA_DTYPE_F16, BF = KVA_DTYPE_BF16;
    bb_case cs[] = {
        /* R  q_lens         seq_lens             H   Hkv D    Dv   B    layout dt  causal win chunk
           cap alibi sinks thr casc thr share */
        {3, {1, 1, 1}, {300, 1, 77}, 48, 1, 128, 0, 16, N, F16, 1, -1, 0, 0, 0, 1, 0, 0, 4, 0},
        {2, {5, 1}, {9, 3}, 2, 1, 576, 512, 2, Hd, BF, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0},
        {2, {5, 2}, {5, 300}, 4, 2, 64, 0, 256, N, F32, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0},
        {2, {1, 3}, {2500, 1700}, 8, 2, 64, 0, 16, Hd, F32, 1, 1000, 0, 5.0f, 0, 1, 4, 0, 7, 0},
        {2, {4, 3}, {70, 33}, 4, 1, 32, 0, 16, N, BF, 1, -1, 16, 0, 0, 1, 4, 0, 3, 0},
        {4,
         {1, 1, 2, 1},
         {40, 45, 50, 33},
         4,
         2,
         32,
         0,
         8,
         N,
         F16,
         1,
         -1,
         0,
         2.0f,
         0,
         1,
         2,
         KVA_CASCADE_ON,
         3,
         4},
        {4,
         {3, 3, 3, 3},
         {40, 45, 50, 33},
         4,
         2,
         32,
         0,
         8,
         Hd,
         F32,
         1,
         -1,
         0,
         0,
         0,
         1,
         0,
         KVA_CASCADE_ON,
         2,
         4},
        {3, {1, 0, 1}, {600, 610, 620},  8, 1, 64, 0, 16, N, F32, 1, -1, 0, 0, 0,
         1, 0,         KVA_CASCADE_AUTO, 4, 37},
        {1, {6}, {3}, 4, 4, 16, 0, 2, N, F32, 0, -1, 0, 0, 1, 1, 0, 0, 0, 0},
        {1, {1}, {2}, KVA_MAX_HEADS, 64, 8, 0, 1, Hd, F32, 1, KVA_MAX_SEQ_LEN, 0, 0, 0, 1, 0,
         0, 0,   0},
    };
    const int cascades0 = bb_cascades;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        size_t bad = bb_run_case(&cs[i], 800 + i);
        CHECK_MSG(bad == 0, "exotic case %zu: %zu mismatches", i, bad);
    }
    CHECK_MSG(bb_cascades - cascades0 >= 4, "only %d runs were cascades", bb_cascades - cascades0);
}

/* Quantized caches on odd shapes: block sizes 1 and 3, D 24 / Dv 40, GQA,
 * both layouts, every scale granularity; both backends store the same bytes
 * and agree on the result. */
static void test_quant_shapes(void)
{
    const kva_quant qs[4] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                             KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_FP8_E4M3};
    int n = 0;
    for (int qi = 0; qi < 4; qi++)
        for (int g = 0; g < 3; g++, n++) {
            bb_case c = {3,
                         {1, 4, 2},
                         {7, 9, 2},
                         6,
                         3,
                         24,
                         40,
                         n % 2 ? 3 : 1,
                         (kva_layout)(n % 2),
                         (kva_dtype)(n % 3),
                         1,
                         -1,
                         0,
                         0.0f,
                         0,
                         n % 4 == 1,
                         0,
                         0,
                         0,
                         0,
                         qs[qi],
                         g};
            if (qs[qi] == KVA_QUANT_FP8_E4M3 && g == 0)
                c.gran = 1; /* fp8 scales are per tensor or per kv head */
            if (n % 5 == 2)
                c.window = 3, c.softcap = 4.0f;
            size_t bad = bb_run_case(&c, 1000 + (uint64_t)n);
            CHECK_MSG(bad == 0, "quant case %s gran %d: %zu mismatches", kva_quant_name(qs[qi]), g,
                      bad);
        }
}

/* MLA on small odd shapes (Dc 24, Dr 8, Dn 16, Dv 40, H 3, B 3, both q
 * dtypes f32/f16, causal and not, a q_len 0 request, decode and prefill paths
 * in one plan): the absorbed kva_attention_run and the layer-level kva_mla_run,
 * CPU against the reference, outputs poisoned. */
static void test_mla_shapes(void)
{
    enum { Dc = 24, Dr = 8, Dn = 16, Dv2 = 40, H = 3, B = 3, R = 3 };
    /* Non-causal plans also get a request with no keys and one with q_len > seq_len. */
    const int32_t qsl[R + 1] = {0, 1, 1, 7}, slc[R] = {5, 4, 10}, sln[R] = {0, 4, 3};
    const int32_t bt[R * 4] = {6, 2, -1, -1, 0, 1, -1, -1, 3, 7, 4, 5};
    const int32_t T = 7, NB = 8;
    for (int m = 0; m < 4; m++) {
        const kva_dtype dt = m % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_F32;
        const int causal = m < 2;
        const int32_t *sl = causal ? slc : sln;
        kva_rng rng = {1100 + (uint64_t)m};
        const size_t es = kva_dtype_size(dt);
        float ckv[NB * B * Dc], kpe[NB * B * Dr];
        int64_t slots[NB * B];
        kva_test_fill(ckv, KVA_DTYPE_F32, NB * B * Dc, &rng, 1.0);
        kva_test_fill(kpe, KVA_DTYPE_F32, NB * B * Dr, &rng, 1.0);
        for (int i = 0; i < NB * B; i++)
            slots[i] = i;
        void *qa = malloc(es * T * H * (Dc + Dr)), *ql = malloc(es * T * H * (Dn + Dr));
        void *wuk = malloc(es * H * Dn * Dc), *wuv = malloc(es * H * Dc * Dv2);
        kva_test_fill(qa, dt, (size_t)T * H * (Dc + Dr), &rng, 1.0);
        kva_test_fill(ql, dt, (size_t)T * H * (Dn + Dr), &rng, 1.0);
        kva_test_fill(wuk, dt, (size_t)H * Dn * Dc, &rng, 0.25);
        kva_test_fill(wuv, dt, (size_t)H * Dc * Dv2, &rng, 0.25);
        void *oa[2], *ol[2];
        float la[2][T * H], ll[2][T * H];
        for (int bi = 0; bi < 2; bi++) {
            kva_context *ctx = new_ctx(kBk[bi], 3);
            kva_cache_desc cd = {NB,          B, 1, Dc + Dr, Dc, dt, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                                 KVA_ATTN_MLA};
            kva_cache *c = NULL;
            CHECK_OK(kva_cache_create(ctx, &cd, &c));
            CHECK_OK(kva_cache_write(ctx, c, NB * B, ckv, 0, kpe, 0, KVA_DTYPE_F32, slots));
            kva_plan_desc pd =
                kva_test_mla_desc(R, qsl, sl, bt, 4, B, H, Dc + Dr, Dc, dt, 0.2, causal);
            pd.mla_qk_nope_head_dim = Dn;
            pd.mla_v_head_dim = Dv2;
            kva_plan *p = NULL;
            CHECK_OK(kva_plan_create(ctx, &pd, &p));
            oa[bi] = malloc(es * T * H * Dc);
            ol[bi] = malloc(es * T * H * Dv2);
            kva_test_poison(oa[bi], dt, (size_t)T * H * Dc);
            kva_test_poison(ol[bi], dt, (size_t)T * H * Dv2);
            kva_test_poison(la[bi], KVA_DTYPE_F32, T * H);
            kva_test_poison(ll[bi], KVA_DTYPE_F32, T * H);
            CHECK_OK(kva_attention_run(ctx, p, qa, c, NULL, oa[bi], la[bi]));
            CHECK_OK(kva_mla_run(ctx, p, ql, wuk, wuv, c, ol[bi], ll[bi]));
            kva_plan_destroy(p);
            kva_cache_destroy(c);
            kva_context_destroy(ctx);
        }
        const double at = dt == KVA_DTYPE_F32 ? 5e-5 : 8e-4, rt = dt == KVA_DTYPE_F32 ? 5e-5 : 2e-3;
        CHECK(kva_test_compare("mla absorbed", oa[1], oa[0], dt, (size_t)T * H * Dc, at, rt) == 0);
        CHECK(kva_test_compare_f32("mla absorbed lse", la[1], la[0], T * H, 5e-5, 1e-5) == 0);
        CHECK(kva_test_compare("mla layer", ol[1], ol[0], dt, (size_t)T * H * Dv2, at, rt) == 0);
        CHECK(kva_test_compare_f32("mla layer lse", ll[1], ll[0], T * H, 5e-5, 1e-5) == 0);
        if (!causal) /* token 0 sees no key: zeros and -inf on both backends and both calls */
            for (int bi = 0; bi < 2; bi++)
                for (int h = 0; h < H; h++) {
                    CHECK(isinf(la[bi][h]) && la[bi][h] < 0 && isinf(ll[bi][h]) && ll[bi][h] < 0);
                    CHECK(kva_test_get(oa[bi], dt, (size_t)h * Dc) == 0.0);
                    CHECK(kva_test_get(ol[bi], dt, (size_t)h * Dv2 + Dv2 - 1) == 0.0);
                }
        for (int bi = 0; bi < 2; bi++) {
            free(oa[bi]);
            free(ol[bi]);
        }
        free(qa);
        free(ql);
        free(wuk);
        free(wuv);
    }
}

/* Sparse MLA (duplicate entries, -1 anywhere, topk_length, sinks, both modes,
 * a token that lists nothing) and the indexer (K above pos + 1: rows padded
 * with -1) on odd shapes, CPU against the reference. */
static void test_sparse_shapes(void)
{
    enum { Dc = 16, Dr = 8, H = 3, B = 3, NB = 6, K = 5, T = 3, Di = 24 };
    const int32_t qsl[3] = {0, 2, 3}, sl[2] = {2, 9}, bt[2 * 3] = {4, -1, -1, 0, 5, 2};
    const int32_t idx[T * K] = {1,  -1, 1,  0,  -1, /* token 0 (pos 0): 1 is its own request's */
                                -1, -1, -1, -1, -1, /* token 1 lists nothing */
                                8,  8,  -1, 0,  4};
    const int32_t idx_fix[T * K] = {0, -1, 0, 1, -1, -1, -1, -1, -1, -1, 8, 8, -1, 0, 4};
    const int32_t tlen[T] = {4, 0, 5};
    (void)idx;
    float ckv[NB * B * Dc], kpe[NB * B * Dr], keys[NB * B * Di], q[T * H * (Dc + Dr)];
    float qi[T * H * Di], w[T * H], sinks[H];
    int64_t slots[NB * B];
    kva_rng rng = {1200};
    kva_test_fill(ckv, KVA_DTYPE_F32, NB * B * Dc, &rng, 1.0);
    kva_test_fill(kpe, KVA_DTYPE_F32, NB * B * Dr, &rng, 1.0);
    kva_test_fill(keys, KVA_DTYPE_F32, NB * B * Di, &rng, 1.0);
    kva_test_fill(q, KVA_DTYPE_F32, T * H * (Dc + Dr), &rng, 1.0);
    kva_test_fill(qi, KVA_DTYPE_F32, T * H * Di, &rng, 1.0);
    kva_test_fill(w, KVA_DTYPE_F32, T * H, &rng, 1.0);
    kva_test_fill(sinks, KVA_DTYPE_F32, H, &rng, 1.0);
    for (int i = 0; i < NB * B; i++)
        slots[i] = i;
    for (int mode = 0; mode < 2; mode++) {
        float out[2][T * H * Dc], lse[2][T * H];
        int32_t ind[2][T * K], len[2][T];
        for (int bi = 0; bi < 2; bi++) {
            kva_context *ctx = new_ctx(kBk[bi], 2);
            kva_cache_desc cd = {
                NB, B, 1, Dc + Dr, Dc, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MLA};
            kva_cache_desc ci = {
                NB, B, 1, Di, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_INDEX};
            kva_cache *c = NULL, *cx = NULL;
            CHECK_OK(kva_cache_create(ctx, &cd, &c));
            CHECK_OK(kva_cache_create(ctx, &ci, &cx));
            CHECK_OK(kva_cache_write(ctx, c, NB * B, ckv, 0, kpe, 0, KVA_DTYPE_F32, slots));
            CHECK_OK(kva_cache_write(ctx, cx, NB * B, keys, 0, NULL, 0, KVA_DTYPE_F32, slots));
            kva_plan_desc pd =
                kva_test_mla_desc(2, qsl, sl, bt, 3, B, H, Dc + Dr, Dc, KVA_DTYPE_F32, 0.3, 1);
            pd.sparse_topk = K;
            pd.sparse_mode = mode;
            pd.decode_threshold = 1;
            kva_plan *p = NULL, *pi = NULL;
            CHECK_OK(kva_plan_create(ctx, &pd, &p));
            kva_plan_desc pdi = pd;
            pdi.kind = KVA_ATTN_INDEX;
            pdi.sparse_mode = 0;
            pdi.num_heads = H;
            pdi.head_dim = Di;
            pdi.head_dim_v = 0;
            pdi.scale = 0;
            CHECK_OK(kva_plan_create(ctx, &pdi, &pi));
            kva_test_poison(out[bi], KVA_DTYPE_F32, T * H * Dc);
            kva_test_poison(lse[bi], KVA_DTYPE_F32, T * H);
            CHECK_OK(kva_mla_sparse_run(ctx, p, q, c, idx_fix, 0, mode ? tlen : NULL, sinks,
                                        out[bi], lse[bi]));
            for (int i = 0; i < T * K; i++)
                ind[bi][i] = 12345;
            for (int i = 0; i < T; i++)
                len[bi][i] = 12345;
            CHECK_OK(kva_indexer_run(ctx, pi, qi, w, cx, ind[bi], 0, len[bi]));
            kva_plan_destroy(p);
            kva_plan_destroy(pi);
            kva_cache_destroy(c);
            kva_cache_destroy(cx);
            kva_context_destroy(ctx);
        }
        /* SEPARATE: the CPU reads a prefill's rows back as bf16 (kvattn.h, kva_sparse_mode),
         * so its scores carry bf16 rounding of the keys; MIXED reads them exactly. */
        const double at = mode ? 2e-2 : 5e-5, rt = mode ? 9e-3 : 5e-5;
        CHECK_MSG(
            kva_test_compare("sparse out", out[1], out[0], KVA_DTYPE_F32, T * H * Dc, at, rt) == 0,
            "mode %d", mode);
        CHECK_MSG(kva_test_compare_f32("sparse lse", lse[1], lse[0], T * H, mode ? 2e-2 : 5e-5,
                                       1e-5) == 0,
                  "mode %d", mode);
        /* Token 1 lists nothing: zeros and the sink. */
        for (int bi = 0; bi < 2; bi++)
            for (int h = 0; h < H; h++) {
                CHECK(lse[bi][H + h] == sinks[h]);
                CHECK(out[bi][(H + h) * Dc] == 0.0f && out[bi][(H + h) * Dc + Dc - 1] == 0.0f);
            }
        CHECK(memcmp(ind[0], ind[1], sizeof ind[0]) == 0);
        CHECK(memcmp(len[0], len[1], sizeof len[0]) == 0);
        /* pos 0, 1 of request 0 and pos 8 of request 1: min(K, pos + 1) keys, then -1. */
        CHECK(len[0][0] == 1 && len[0][1] == 2 && len[0][2] == K);
        CHECK(ind[0][0] == 0 && ind[0][1] == -1 && ind[0][K - 1] == -1);
        CHECK(ind[0][K + 2] == -1 && ind[0][2 * K + K - 1] >= 0);
    }
}

/* Merges: a part whose lse is -inf contributes nothing, so NaN in its rows must
 * not reach the result (kvattn_merge.h: "its out rows are not read" for _n);
 * all -inf gives 0 and -inf; a NaN lse makes the row NaN (_n); every dtype,
 * both backends, out poisoned. */
static void test_merge_edges(void)
{
    enum { T = 3, H = 2, Dv = 16, P = 3 };
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 3; di++) {
            const kva_dtype dt = dts[di];
            const size_t es = kva_dtype_size(dt), part = (size_t)T * H * Dv;
            kva_context *ctx = new_ctx(kBk[bi], 2);
            kva_rng rng = {1300 + (uint64_t)(bi * 3 + di)};
            void *outs = malloc(es * part * P), *out = malloc(es * part);
            float lses[P * T * H], lse[T * H];
            kva_test_fill(outs, dt, part * P, &rng, 1.0);
            kva_test_fill(lses, KVA_DTYPE_F32, P * T * H, &rng, 1.0);
            /* Row 0 (t 0, h 0): part 1 is -inf with NaN values. Row 1: all parts -inf.
             * Row 2: part 2's lse is NaN. */
            lses[1 * T * H + 0] = -INFINITY;
            kva_test_poison((char *)outs + es * (part + 0), dt, Dv);
            for (int p = 0; p < P; p++)
                lses[p * T * H + 1] = -INFINITY;
            lses[2 * T * H + 2] = NAN;
            kva_test_poison(out, dt, part);
            kva_test_poison(lse, KVA_DTYPE_F32, T * H);
            CHECK_OK(kva_merge_states_n(ctx, P, T, H, Dv, dt, outs, 0, lses, 0, out, lse));
            /* Row 2's NaNs must be written: the poison is a NaN too. */
            int ok0 = 1, ok1 = isinf(lse[1]) && lse[1] < 0,
                ok2 = kva_test_nan_written(lse, KVA_DTYPE_F32, 2);
            for (int e = 0; e < Dv; e++) {
                ok0 &= !isnan(kva_test_get(out, dt, (size_t)e));
                ok1 &= kva_test_get(out, dt, (size_t)Dv + e) == 0.0;
                ok2 &= kva_test_nan_written(out, dt, 2 * (size_t)Dv + e);
            }
            CHECK_MSG(ok0 && !isnan(lse[0]), "%s %s: a -inf part's NaN rows leaked",
                      kva_backend_name(kBk[bi]), kva_dtype_name(dt));
            CHECK_MSG(ok1, "%s %s: all -inf", kva_backend_name(kBk[bi]), kva_dtype_name(dt));
            CHECK_MSG(ok2, "%s %s: NaN lse", kva_backend_name(kBk[bi]), kva_dtype_name(dt));
            /* The two-way merge: side b -inf with NaN values contributes nothing. */
            void *oa = outs, *ob = (char *)outs + es * part;
            kva_test_poison(out, dt, part);
            CHECK_OK(kva_merge_states(ctx, T, H, Dv, dt, oa, lses, ob, lses + T * H, out, lse));
            int okm = isfinite(lse[0]);
            for (int e = 0; e < Dv; e++)
                okm &= kva_test_get(out, dt, (size_t)e) == kva_test_get(oa, dt, (size_t)e);
            CHECK_MSG(okm, "%s %s: merge_states leaked a -inf side's NaN",
                      kva_backend_name(kBk[bi]), kva_dtype_name(dt));
            free(outs);
            free(out);
            kva_context_destroy(ctx);
        }
}

/* Non-causal: q_len > seq_len, seq_len 0 (rows of zeros, lse -inf or the sink). */
static void test_noncausal_empty(void)
{
    for (int m = 0; m < 6; m++) {
        bb_case c = {3,
                     {5, 3, 2},
                     {2, 0, 9},
                     4,
                     1,
                     16,
                     24,
                     4,
                     (kva_layout)(m % 2),
                     (kva_dtype)(m % 3),
                     0,
                     -1,
                     0,
                     0.0f,
                     0,
                     m >= 3,
                     0,
                     0,
                     0,
                     0};
        if (m == 2 || m == 5)
            c.window = 1; /* a window on non-causal rows: rows with pos < 0 may see no key */
        BB_CHECK_CASE(c, 300 + (uint64_t)m);
    }
    /* All requests empty of keys. */
    bb_case e = {2, {2, 1}, {0, 0}, 2, 2, 8, 0, 1, KVA_LAYOUT_NHD, KVA_DTYPE_F32, 0, -1,
                 0, 0.0f,   0,      1, 0, 0, 0, 0};
    BB_CHECK_CASE(e, 399);
}

/* A plan keeps no copy of the cache: after the cache changes, the same plan
 * computes over the new contents (both backends agree with a fresh plan). */
static void test_plan_reuse_after_cache_change(void)
{
    for (int bi = 0; bi < 2; bi++) {
        kva_rng rng = {400 + (uint64_t)bi};
        kva_context *ctx = new_ctx(kBk[bi], 2);
        kva_cache_desc cd = make_desc(6, 3, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        if (!c)
            continue;
        fill_cache(c, &rng);
        const int32_t qsl[3] = {0, 1, 3}, sl[2] = {7, 5}, bt[6] = {5, 1, 3, 0, 2, -1};
        kva_plan_desc pd = bb_small_desc(qsl, sl, bt);
        kva_plan *p = NULL, *p2 = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &p));
        float q[3 * 4 * 16], o1[3 * 4 * 16], o2[3 * 4 * 16], l1[12], l2[12];
        kva_test_fill(q, KVA_DTYPE_F32, 3 * 4 * 16, &rng, 1.0);
        CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, o1, l1));
        fill_cache(c, &rng); /* new contents */
        kva_test_poison(o1, KVA_DTYPE_F32, 3 * 4 * 16);
        kva_test_poison(l1, KVA_DTYPE_F32, 12);
        CHECK_OK(kva_attention_run(ctx, p, q, c, NULL, o1, l1));
        CHECK_OK(kva_plan_create(ctx, &pd, &p2));
        kva_test_poison(o2, KVA_DTYPE_F32, 3 * 4 * 16);
        CHECK_OK(kva_attention_run(ctx, p2, q, c, NULL, o2, l2));
        CHECK(kva_test_compare("reused plan", o1, o2, KVA_DTYPE_F32, 3 * 4 * 16, 0, 0) == 0);
        CHECK(kva_test_compare_f32("reused plan lse", l1, l2, 12, 0, 0) == 0);
        kva_plan_destroy(p);
        kva_plan_destroy(p2);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

/* A cascade plan runs on the context that created it only (kvattn.h), even
 * where another context reserved the same workspace; nothing is written. */
static void test_cascade_context(void)
{
    for (int bi = 0; bi < 2; bi++) {
        bb_fix f;
        bb_fix_init(&f, kBk[bi], 950 + (uint64_t)bi);
        const int32_t qsl[3] = {0, 1, 2}, sl[2] = {7, 8}, bt[6] = {5, 1, 3, 5, 1, 2};
        kva_plan_desc pd = f.pd;
        pd.query_start_loc = qsl, pd.seq_lens = sl, pd.block_table = bt;
        pd.cascade = KVA_CASCADE_ON;
        kva_plan *pa = NULL, *pb = NULL;
        kva_context *b = new_ctx(kBk[bi], 2);
        CHECK_OK(kva_plan_create(f.ctx, &pd, &pa));
        CHECK_OK(kva_plan_create(b, &pd, &pb));
        kva_plan_info info;
        CHECK_OK(kva_plan_get_info(pa, &info));
        CHECK(info.num_cascade_groups == 1);
        BAD(kva_attention_run(b, pa, f.q, f.cache, NULL, f.out, f.lse),
            KVA_STATUS_INVALID_ARGUMENT);
        CHECK(bb_untouched(&f));
        /* With the cascade off the same plan is shared as the header's rule says. */
        pd.cascade = KVA_CASCADE_OFF;
        CHECK_OK(kva_plan_update(f.ctx, pa, &pd));
        CHECK_OK(kva_plan_update(b, pb, &pd));
        CHECK_OK(kva_attention_run(b, pa, f.q, f.cache, NULL, f.out, f.lse));
        kva_plan_destroy(pa);
        kva_plan_destroy(pb);
        kva_context_destroy(b);
        bb_fix_free(&f);
    }
}

int main(void)
{
    RUN(test_shapes);
    RUN(test_masks);
    RUN(test_noncausal_empty);
    RUN(test_exotic);
    RUN(test_cascade_context);
    RUN(test_quant_shapes);
    RUN(test_mla_shapes);
    RUN(test_sparse_shapes);
    RUN(test_merge_edges);
    RUN(test_plan_reuse_after_cache_change);
    return kva_test_finish();
}
