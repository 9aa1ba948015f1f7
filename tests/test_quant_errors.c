/*
 * test_quant_errors.c - quantized caches under bad input and special values:
 * every bad scale array or descriptor gets its status and message with *out
 * untouched; NaN (and infinite per-token keys) written to int8 storage is
 * rejected with the cache byte-identical (K, V and per-token scales);
 * infinities and large values saturate; copy_blocks and swap_blocks carry
 * per-token scales and refuse caches with different static scales.
 */
#include "cache_util.h"

static kva_cache_desc qdesc(kva_quant q, kva_dtype v16)
{
    kva_dtype dt = q == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
                   : q == KVA_QUANT_INT8_TOKEN_K_V16 ? v16
                                                     : KVA_DTYPE_I8;
    kva_cache_desc d = {6, 4, 2, 16, 8, dt, KVA_LAYOUT_HND, q, KVA_ATTN_MHA};
    return d;
}

#define CHECK_QCREATE_FAILS(ctx, desc, params, st, word)                                           \
    do {                                                                                           \
        kva_cache *out_ = (kva_cache *)(uintptr_t)0x1234;                                          \
        CHECK_STATUS(kva_cache_create_quant((ctx), (desc), (params), &out_), (st));                \
        CHECK_ERROR_MENTIONS(word);                                                                \
        CHECK(out_ == (kva_cache *)(uintptr_t)0x1234);                                             \
    } while (0)

static void test_bad_params(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    const int32_t hkv = 2, D = 16, Dv = 8;
    float ks[32], ko[32], vs[16], vo[16];
    for (int i = 0; i < 32; i++) {
        ks[i] = 0.01f * (float)(i + 1);
        ko[i] = (float)(i % 5) - 2.0f;
    }
    for (int i = 0; i < 16; i++) {
        vs[i] = 0.02f * (float)(i + 1);
        vo[i] = 1.5f;
    }
    const kva_quant_params good = {ks, hkv * D, ko, hkv * D, vs, hkv * Dv, vo, hkv * Dv};
    kva_cache_desc d = qdesc(KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_F16);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, &good, &c));
    kva_cache_destroy(c);
    /* Every accepted length: 1, Hkv, Hkv*dim. */
    for (int len = 0; len < 3; len++) {
        kva_quant_params p = good;
        p.k_scale_len = len == 0 ? 1 : len == 1 ? hkv : hkv * D;
        p.v_offset_len = len == 0 ? 1 : len == 1 ? hkv : hkv * Dv;
        c = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &d, &p, &c));
        CHECK(c && c->k_scale[D + 3] == (len == 0 ? ks[0] : len == 1 ? ks[1] : ks[D + 3]));
        CHECK(c && c->v_offset[Dv + 2] == (len == 0 ? vo[0] : len == 1 ? vo[1] : vo[Dv + 2]));
        kva_cache_destroy(c);
    }
    kva_quant_params p = good;
    p.k_scale_len = 5; /* wrong length */
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_SHAPE_MISMATCH, "k_scale");
    p = good;
    p.v_offset_len = hkv * D; /* V arrays are [Hkv * Dv] */
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_SHAPE_MISMATCH, "v_offset");
    float bad[32];
    const float bad_vals[] = {0.0f, -0.5f, NAN, INFINITY};
    for (size_t b = 0; b < 4; b++) {
        memcpy(bad, ks, sizeof bad);
        bad[7] = bad_vals[b];
        p = good;
        p.k_scale = bad;
        CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_INVALID_ARGUMENT, "k_scale[7]");
    }
    memcpy(bad, ko, sizeof bad);
    bad[3] = NAN;
    p = good;
    p.k_offset = bad;
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_INVALID_ARGUMENT, "k_offset[3]");
    p = good;
    p.v_scale = NULL;
    p.v_scale_len = 0;
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_NULL_POINTER, "v_scale");
    p = good;
    p.v_scale = NULL; /* length without a pointer */
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_NULL_POINTER, "v_scale");
    CHECK_QCREATE_FAILS(ctx, &d, NULL, KVA_STATUS_NULL_POINTER, "k_scale");
    /* Negative offsets are fine; a zero v_scale in the per-head form is not. */
    p = good;
    float vz[2] = {0.1f, 0.0f};
    p.v_scale = vz;
    p.v_scale_len = 2;
    CHECK_QCREATE_FAILS(ctx, &d, &p, KVA_STATUS_INVALID_ARGUMENT, "v_scale[1]");

    /* Per-token keys take no k arrays; V16 takes none at all. */
    kva_cache_desc dt = qdesc(KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_F16);
    CHECK_QCREATE_FAILS(ctx, &dt, &good, KVA_STATUS_INVALID_ARGUMENT, "k_scale");
    kva_quant_params pv = {NULL, 0, NULL, 0, vs, hkv * Dv, NULL, 0};
    c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &dt, &pv, &c));
    CHECK(c && c->k_token_scale != NULL);
    kva_cache_destroy(c);
    kva_cache_desc d16 = qdesc(KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_BF16);
    CHECK_QCREATE_FAILS(ctx, &d16, &pv, KVA_STATUS_INVALID_ARGUMENT, "v_scale");
    c = NULL;
    CHECK_OK(kva_cache_create(ctx, &d16, &c));
    kva_cache_destroy(c);
    d16.dtype = KVA_DTYPE_I8; /* dtype names V's 16-bit type */
    CHECK_QCREATE_FAILS(ctx, &d16, NULL, KVA_STATUS_DTYPE_MISMATCH, "dtype");

    /* FP8: per tensor or per head only, no offsets; NULL params = unit scales. */
    kva_cache_desc df = qdesc(KVA_QUANT_FP8_E4M3, KVA_DTYPE_F16);
    c = NULL;
    CHECK_OK(kva_cache_create(ctx, &df, &c));
    CHECK(c && c->k_scale[5] == 1.0f && c->v_scale[3] == 1.0f);
    kva_cache_destroy(c);
    kva_quant_params pf = {ks, hkv * D, NULL, 0, vs, hkv, NULL, 0};
    CHECK_QCREATE_FAILS(ctx, &df, &pf, KVA_STATUS_SHAPE_MISMATCH, "k_scale");
    pf.k_scale_len = hkv;
    pf.k_offset = ko;
    pf.k_offset_len = 1;
    CHECK_QCREATE_FAILS(ctx, &df, &pf, KVA_STATUS_INVALID_ARGUMENT, "k_offset");
    df.dtype = KVA_DTYPE_I8;
    CHECK_QCREATE_FAILS(ctx, &df, NULL, KVA_STATUS_DTYPE_MISMATCH, "fp8_e4m3");
    /* Unquantized caches take no params; caller-owned storage is unquantized only. */
    kva_cache_desc dn = make_desc(6, 4, 2, 16, 8, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    CHECK_QCREATE_FAILS(ctx, &dn, &good, KVA_STATUS_INVALID_ARGUMENT, "params");
    static int8_t kbuf[6 * 4 * 2 * 16], vbuf[6 * 4 * 2 * 8];
    c = (kva_cache *)(uintptr_t)0x1234;
    CHECK_STATUS(kva_cache_create_from(ctx, &d, kbuf, vbuf, &c), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("kva_cache_create_quant");
    CHECK(c == (kva_cache *)(uintptr_t)0x1234);
    kva_context_destroy(ctx);
}

/* Snapshot of a quantized cache: K, V and the per-token scales. */
typedef struct qsnap {
    snapshot kv;
    float *ts;
    size_t tsn;
} qsnap;

static size_t kv_bytes(const kva_cache *c, int is_v)
{
    return (size_t)c->desc.num_blocks * (size_t)(is_v ? c->v_block_elems : c->k_block_elems) *
           (is_v ? c->v_elem : c->elem_size);
}

static qsnap qtake(const kva_cache *c)
{
    qsnap s;
    s.kv.kb = kv_bytes(c, 0);
    s.kv.vb = kv_bytes(c, 1);
    s.kv.k = malloc(s.kv.kb);
    s.kv.v = malloc(s.kv.vb);
    memcpy(s.kv.k, c->k, s.kv.kb);
    memcpy(s.kv.v, c->v, s.kv.vb);
    s.tsn = c->k_token_scale
                ? (size_t)c->desc.num_blocks * c->desc.block_size * c->desc.num_kv_heads
                : 0;
    s.ts = s.tsn ? malloc(s.tsn * sizeof(float)) : NULL;
    if (s.tsn)
        memcpy(s.ts, c->k_token_scale, s.tsn * sizeof(float));
    return s;
}

static int qsame(const kva_cache *c, const qsnap *s)
{
    return memcmp(c->k, s->kv.k, s->kv.kb) == 0 && memcmp(c->v, s->kv.v, s->kv.vb) == 0 &&
           (s->tsn == 0 || memcmp(c->k_token_scale, s->ts, s->tsn * sizeof(float)) == 0);
}

static void qdrop(qsnap *s)
{
    drop(&s->kv);
    free(s->ts);
}

/* Creates a cache of format q with valid scales and fills every slot. */
static kva_cache *filled(kva_context *ctx, kva_quant q, kva_rng *rng)
{
    float ks[32], vs[16];
    for (int i = 0; i < 32; i++)
        ks[i] = 0.02f;
    for (int i = 0; i < 16; i++)
        vs[i] = 0.03f;
    kva_quant_params p = {ks, 32, NULL, 0, vs, 16, NULL, 0};
    if (q == KVA_QUANT_INT8_TOKEN_K)
        p.k_scale = NULL, p.k_scale_len = 0;
    if (q == KVA_QUANT_FP8_E4M3)
        p.k_scale_len = 1, p.v_scale_len = 2;
    kva_cache_desc d = qdesc(q, KVA_DTYPE_F16);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, q == KVA_QUANT_INT8_TOKEN_K_V16 ? NULL : &p, &c));
    const int32_t n = d.num_blocks * d.block_size;
    float *k = malloc(sizeof(float) * (size_t)n * 32), *v = malloc(sizeof(float) * (size_t)n * 16);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill(k, KVA_DTYPE_F32, (size_t)n * 32, rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, (size_t)n * 16, rng, 1.0);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ctx, c, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    free(k);
    free(v);
    free(slots);
    return c;
}

/* A write with one bad value: status, message naming the row, cache unchanged. */
static void test_bad_writes(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng rng = {77};
    for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++) {
        kva_cache *c = filled(ctx, (kva_quant)q, &rng);
        const int32_t T = 5;
        float k[5 * 32], v[5 * 16];
        int64_t slots[5] = {3, -1, 17, 9, 0};
        for (int is_v = 0; is_v < 2; is_v++) {
            for (int kind = 0; kind < 2; kind++) { /* NaN, +inf */
                kva_test_fill(k, KVA_DTYPE_F32, 5 * 32, &rng, 1.0);
                kva_test_fill(v, KVA_DTYPE_F32, 5 * 16, &rng, 1.0);
                const float bad = kind == 0 ? NAN : INFINITY;
                if (is_v)
                    v[3 * 16 + 8 + 5] = bad; /* token 3, head 1, channel 5 */
                else
                    k[3 * 32 + 16 + 5] = bad;
                int int8 = kva__quant_is_int8((kva_quant)q, is_v);
                int token_k =
                    !is_v && (q == KVA_QUANT_INT8_TOKEN_K || q == KVA_QUANT_INT8_TOKEN_K_V16);
                int rejected = int8 && (kind == 0 || token_k);
                qsnap before = qtake(c);
                kva_status st = kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_F32, slots);
                if (rejected) {
                    CHECK_MSG(st == KVA_STATUS_INVALID_ARGUMENT, "%s %s %s: %s",
                              kva_quant_name((kva_quant)q), is_v ? "v" : "k", kind ? "inf" : "nan",
                              kva_status_name(st));
                    CHECK_ERROR_MENTIONS(is_v ? "v[token 3, head 1, channel 5]"
                                              : "k[token 3, head 1, channel 5]");
                    CHECK(qsame(c, &before));
                } else {
                    CHECK_OK(st);
                    /* FP8 stores NaN as 0x7f and +inf as 448; the 16-bit V keeps it;
                     * int8 static scales saturate +inf to 127. */
                    const double x = kva__quant_load(c, is_v, 9 / 4, 9 % 4, 1, 5);
                    if (kind == 0)
                        CHECK_MSG(isnan(x), "%s: NaN not kept", kva_quant_name((kva_quant)q));
                    else if (q == KVA_QUANT_FP8_E4M3)
                        CHECK(x == 448.0 * (is_v ? 0.03f : 0.02f));
                    else if (int8)
                        CHECK(x == 127.0 * (double)(is_v ? 0.03f : 0.02f));
                    else
                        CHECK(isinf(x));
                }
                qdrop(&before);
            }
        }
        /* A slot past the cache with a NaN elsewhere: still nothing written. */
        qsnap before = qtake(c);
        slots[4] = 1000;
        CHECK_STATUS(kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_F32, slots),
                     KVA_STATUS_OUT_OF_RANGE);
        slots[4] = 0;
        CHECK(qsame(c, &before));
        qdrop(&before);
        kva_cache_destroy(c);
    }
    kva_context_destroy(ctx);
}

/* 16-bit sources: a bf16 NaN into int8 keys or values, an f16 +inf into
 * per-token keys, are rejected like f32 ones (the check converts the row
 * first) and leave K, V and the per-token scales unchanged; an f16 +inf under
 * static scales saturates. */
static void test_bad_writes_16bit(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_rng rng = {78};
    const kva_quant qs[] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                            KVA_QUANT_INT8_TOKEN_K_V16};
    for (size_t qi = 0; qi < sizeof qs / sizeof qs[0]; qi++)
        for (int sdt = 0; sdt < 2; sdt++) {
            const kva_dtype dt = sdt ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
            kva_cache *c = filled(ctx, qs[qi], &rng);
            uint16_t k[3 * 32], v[3 * 16];
            int64_t slots[3] = {5, 11, 2};
            kva_test_fill(k, dt, 3 * 32, &rng, 1.0);
            kva_test_fill(v, dt, 3 * 16, &rng, 1.0);
            const int token_k = qs[qi] != KVA_QUANT_INT8_CHANNEL;
            /* +inf in token 2, head 0, channel 9 of K. */
            k[2 * 32 + 9] = sdt ? 0x7c00u : 0x7f80u;
            qsnap before = qtake(c);
            kva_status st = kva_cache_write(ctx, c, 3, k, 0, v, 0, dt, slots);
            if (token_k) {
                CHECK_MSG(st == KVA_STATUS_INVALID_ARGUMENT, "%s %s +inf: %s",
                          kva_quant_name(qs[qi]), kva_dtype_name(dt), kva_status_name(st));
                CHECK_ERROR_MENTIONS("k[token 2, head 0, channel 9]");
                CHECK(qsame(c, &before));
            } else {
                CHECK_OK(st);
                CHECK(kva__quant_load(c, 0, 0, 2, 0, 9) == 127.0 * (double)0.02f);
            }
            qdrop(&before);
            /* NaN (quiet and signalling) in token 1, head 1, channel 3 of K or V. */
            for (int is_v = 0; is_v < 2; is_v++)
                for (int sig = 0; sig < 2; sig++) {
                    if (is_v && qs[qi] == KVA_QUANT_INT8_TOKEN_K_V16)
                        continue; /* 16-bit V keeps NaN */
                    kva_test_fill(k, dt, 3 * 32, &rng, 1.0);
                    kva_test_fill(v, dt, 3 * 16, &rng, 1.0);
                    const uint16_t nan =
                        sdt ? (sig ? 0xfc01u : 0x7e00u) : (sig ? 0xff81u : 0x7fc0u);
                    if (is_v)
                        v[16 + 8 + 3] = nan;
                    else
                        k[32 + 16 + 3] = nan;
                    before = qtake(c);
                    CHECK_STATUS(kva_cache_write(ctx, c, 3, k, 0, v, 0, dt, slots),
                                 KVA_STATUS_INVALID_ARGUMENT);
                    CHECK_ERROR_MENTIONS(is_v ? "v[token 1, head 1, channel 3]"
                                              : "k[token 1, head 1, channel 3]");
                    CHECK(qsame(c, &before));
                    qdrop(&before);
                }
            kva_cache_destroy(c);
        }
    kva_context_destroy(ctx);
}

/* Large finite values saturate under static int8 scales; a zero key row gets
 * scale 0 and codes 0 (dequantizes to exact zeros). */
static void test_specials_saturate(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    kva_rng rng = {5};
    kva_cache *c = filled(ctx, KVA_QUANT_INT8_CHANNEL, &rng);
    float k[32], v[16];
    kva_test_fill(k, KVA_DTYPE_F32, 32, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, 16, &rng, 1.0);
    k[2] = 1e30f;
    k[3] = -1e30f;
    v[4] = -INFINITY;
    int64_t slot = 6;
    CHECK_OK(kva_cache_write(ctx, c, 1, k, 0, v, 0, KVA_DTYPE_F32, &slot));
    CHECK(kva__quant_load(c, 0, 1, 2, 0, 2) == 127.0 * (double)0.02f);
    CHECK(kva__quant_load(c, 0, 1, 2, 0, 3) == -128.0 * (double)0.02f);
    CHECK(kva__quant_load(c, 1, 1, 2, 0, 4) == -128.0 * (double)0.03f);
    kva_cache_destroy(c);
    c = filled(ctx, KVA_QUANT_INT8_TOKEN_K, &rng);
    memset(k, 0, sizeof k);
    CHECK_OK(kva_cache_write(ctx, c, 1, k, 0, v, 0, KVA_DTYPE_F32, &slot));
    for (int ch = 0; ch < 16; ch++)
        CHECK(kva__quant_load(c, 0, 1, 2, 1, ch) == 0.0);
    CHECK(c->k_token_scale[kva__token_scale_index(&c->desc, 1, 2, 0)] == 0.0f);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* copy_blocks and swap_blocks move per-token key scales with their blocks. */
static void test_copy_swap_scales(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng rng = {9};
    for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++) {
        kva_cache *a = filled(ctx, (kva_quant)q, &rng);
        kva_cache *b = filled(ctx, (kva_quant)q, &rng);
        const int32_t pairs[4] = {1, 4, 2, 0};
        CHECK_OK(kva_cache_copy_blocks(ctx, a, pairs, 2));
        CHECK_OK(kva_cache_swap_blocks(ctx, a, b, pairs, 2));
        for (int p = 0; p < 2; p++)
            for (int is_v = 0; is_v < 2; is_v++)
                for (int32_t off = 0; off < 4; off++)
                    for (int32_t h = 0; h < 2; h++)
                        for (int32_t ch = 0; ch < (is_v ? 8 : 16); ch++) {
                            double want = kva__quant_load(a, is_v, pairs[2 * p], off, h, ch);
                            double x = kva__quant_load(a, is_v, pairs[2 * p + 1], off, h, ch);
                            double y = kva__quant_load(b, is_v, pairs[2 * p + 1], off, h, ch);
                            CHECK_MSG(x == want && y == want, "%s pair %d",
                                      kva_quant_name((kva_quant)q), p);
                        }
        kva_cache_destroy(a);
        kva_cache_destroy(b);
    }
    /* Different static scales: refused, dst unchanged. */
    kva_cache *a = filled(ctx, KVA_QUANT_INT8_CHANNEL, &rng);
    float ks = 0.5f, vs = 0.25f;
    kva_quant_params p = {&ks, 1, NULL, 0, &vs, 1, NULL, 0};
    kva_cache_desc d = qdesc(KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_F16);
    kva_cache *b = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, &p, &b));
    memset(b->k, 1, kv_bytes(b, 0));
    memset(b->v, 2, kv_bytes(b, 1));
    qsnap before = qtake(b);
    const int32_t pairs[2] = {1, 1};
    CHECK_STATUS(kva_cache_swap_blocks(ctx, a, b, pairs, 1), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("static scales");
    CHECK(qsame(b, &before));
    qdrop(&before);
    /* Different formats: refused. */
    kva_cache *f = filled(ctx, KVA_QUANT_FP8_E4M3, &rng);
    CHECK_STATUS(kva_cache_swap_blocks(ctx, a, f, pairs, 1), KVA_STATUS_DTYPE_MISMATCH);
    kva_cache_destroy(a);
    kva_cache_destroy(b);
    kva_cache_destroy(f);
    kva_context_destroy(ctx);
}

/* A block moved by the caller through the public pointers alone (as an
 * offload or KV-transfer connector would: kva_cache_data, the block byte
 * sizes and kva_cache_token_scales) holds the same values in the other cache;
 * formats without per-token scales report NULL. */
static void test_user_block_transfer(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_rng rng = {10};
    for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++) {
        kva_cache *a = filled(ctx, (kva_quant)q, &rng);
        kva_cache *b = filled(ctx, (kva_quant)q, &rng);
        char *ak, *av, *bk, *bv;
        float *as = (float *)(uintptr_t)1, *bs = (float *)(uintptr_t)1;
        CHECK_OK(kva_cache_data(a, (void **)&ak, (void **)&av));
        CHECK_OK(kva_cache_data(b, (void **)&bk, (void **)&bv));
        CHECK_OK(kva_cache_token_scales(a, &as));
        CHECK_OK(kva_cache_token_scales(b, &bs));
        const int token_k = q == KVA_QUANT_INT8_TOKEN_K || q == KVA_QUANT_INT8_TOKEN_K_V16;
        CHECK(token_k ? (as != NULL && bs != NULL) : (as == NULL && bs == NULL));
        const size_t kb = kva_cache_block_bytes_k(a), vb = kva_cache_block_bytes_v(a);
        const size_t sb = kva_cache_block_bytes_scales(a);
        CHECK((sb != 0) == token_k);
        const int src = 1, dst = 3;
        memcpy(bk + dst * kb, ak + src * kb, kb);
        memcpy(bv + dst * vb, av + src * vb, vb);
        if (sb)
            memcpy((char *)bs + dst * sb, (const char *)as + src * sb, sb);
        for (int is_v = 0; is_v < 2; is_v++)
            for (int32_t off = 0; off < 4; off++)
                for (int32_t h = 0; h < 2; h++)
                    for (int32_t ch = 0; ch < (is_v ? 8 : 16); ch++)
                        CHECK_MSG(kva__quant_load(b, is_v, dst, off, h, ch) ==
                                      kva__quant_load(a, is_v, src, off, h, ch),
                                  "%s %s off %d head %d ch %d", kva_quant_name((kva_quant)q),
                                  is_v ? "v" : "k", (int)off, (int)h, (int)ch);
        kva_cache_destroy(a);
        kva_cache_destroy(b);
    }
    float *x = NULL;
    CHECK_STATUS(kva_cache_token_scales(NULL, &x), KVA_STATUS_NULL_POINTER);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_bad_params);
    RUN(test_bad_writes);
    RUN(test_bad_writes_16bit);
    RUN(test_specials_saturate);
    RUN(test_copy_swap_scales);
    RUN(test_user_block_transfer);
    return kva_test_finish();
}
