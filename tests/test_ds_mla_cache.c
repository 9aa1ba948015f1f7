/*
 * test_ds_mla_cache.c - the fp8_ds_mla cache format and kva_cache_read.
 *
 *   - kva_cache_write into an FP8_DS_MLA cache stores, per slot, the bytes a
 *     quantizer written here from the header's description (and FlashMLA's /
 *     vLLM's layout) produces: Dc e4m3 codes, one float32 scale per tile of
 *     128 (max(amax / 448, FLT_MIN)), Dr bf16 values of k_pe; from f32, f16
 *     and bf16 sources, strided, with padding slots skipped. The e4m3 and
 *     bf16 roundings are this file's own (nearest value, ties to even).
 *   - kva_cache_read gives back code * scale and k_pe exactly (f32), rounded
 *     once (f16, bf16), for fp8_ds_mla and every other format of MHA and
 *     MLA caches (decoded here from the raw storage and the given scales,
 *     in double, rounded once to f32).
 *   - copy_blocks / swap_blocks move whole 656-byte-row blocks.
 *   - Bad descriptors and bad reads: a status, nothing created or written.
 */
#include "cache_util.h"

#include <float.h>

#define SENTINEL ((void *)(uintptr_t)0x1234)

/* The value of e4m3fn code c (bias 7, no infinities; 0x7f/0xff NaN). */
static double e4m3_value(int c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (c & 0x80) ? -v : v;
}

/* The e4m3 code nearest to x, ties to the even code, saturating at 448. */
static uint8_t e4m3_code(float x)
{
    if (x != x)
        return 0x7f;
    const double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
        if (d < db || (d == db && (c & 1) == 0))
            best = c;
    }
    return (uint8_t)(best | (x < 0 ? 0x80 : 0));
}

/* bf16 bits nearest to x (finite), ties to even. */
static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, sizeof lo);
    memcpy(&fhi, &hi, sizeof hi);
    const double dl = fabs((double)x - flo), dh = fabs((double)fhi - x);
    if (dl < dh || (dl == dh && ((lo >> 16) & 1) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

/* The expected fp8_ds_mla row of c_kv [Dc] and k_pe [Dr] (float32 values). */
static void expect_row(uint8_t *row, const float *ckv, const float *kpe, int Dc, int Dr)
{
    for (int t = 0; t < Dc / 128; t++) {
        float amax = 0.0f;
        for (int i = 0; i < 128; i++)
            amax = fmaxf(amax, fabsf(ckv[t * 128 + i]));
        const float s = fmaxf(amax / 448.0f, FLT_MIN);
        memcpy(row + Dc + 4 * t, &s, 4);
        for (int i = 0; i < 128; i++)
            row[t * 128 + i] = e4m3_code(ckv[t * 128 + i] / s);
    }
    for (int i = 0; i < Dr; i++) {
        const uint16_t b = bf16_bits(kpe[i]);
        memcpy(row + Dc + 4 * (Dc / 128) + 2 * i, &b, 2);
    }
}

static kva_cache_desc ds_desc(int32_t nb, int32_t B, int32_t Dc, int32_t Dr)
{
    kva_cache_desc d = {.num_blocks = nb,
                        .block_size = B,
                        .num_kv_heads = 1,
                        .head_dim = Dc + Dr,
                        .head_dim_v = Dc,
                        .dtype = KVA_DTYPE_FP8_E4M3,
                        .quant = KVA_QUANT_FP8_DS_MLA,
                        .kind = KVA_ATTN_MLA};
    return d;
}

/* Writes T tokens (strided sources in src_dt, every third slot -1) and
 * checks every row's bytes, and that skipped rows kept theirs. */
static void check_bytes(kva_backend be, int32_t Dc, int32_t Dr, kva_dtype src_dt, uint64_t seed)
{
    kva_context *ctx = new_ctx(be, 2);
    const int32_t B = 16, nb = 5, T = 40, rb = Dc + 4 * (Dc / 128) + 2 * Dr;
    kva_cache_desc d = ds_desc(nb, B, Dc, Dr);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, NULL, &c));
    if (!c) {
        kva_context_destroy(ctx);
        return;
    }
    CHECK(kva_cache_block_bytes_k(c) == (size_t)B * rb);
    CHECK(kva_cache_block_bytes_v(c) == 0);
    CHECK(kva_cache_static_scale_bytes(c) == 0);
    uint8_t *k = NULL;
    CHECK_OK(kva_cache_data(c, (void **)&k, NULL));
    kva_rng rng = {seed};
    memset(k, 0xa5, (size_t)nb * B * rb);
    const int64_t ks = Dc + 8, vs = Dr + 3;
    const size_t es = kva_dtype_size(src_dt);
    char *ckv = malloc((size_t)T * ks * es), *kpe = malloc((size_t)T * vs * es);
    kva_test_fill(ckv, src_dt, (size_t)T * ks, &rng, 2.0);
    kva_test_fill(kpe, src_dt, (size_t)T * vs, &rng, 2.0);
    /* Token 1: an all-zero first tile (scale FLT_MIN); token 3: a tile
     * whose largest value maps to the code of 448. */
    for (int i = 0; i < 128; i++)
        kva__store_f(ckv + (size_t)ks * es, src_dt, (size_t)i, 0.0f);
    kva__store_f(ckv + 3 * (size_t)ks * es, src_dt, 5, -1000.0f);
    int64_t slots[40];
    for (int32_t t = 0; t < T; t++)
        slots[t] = t % 3 == 2 ? -1 : (int64_t)((t * 7 + 3) % (nb * B));
    CHECK_OK(kva_cache_write(ctx, c, T, ckv, ks, kpe, vs, src_dt, slots));
    uint8_t want[1024];
    float fc[KVA_MAX_HEAD_DIM], fp[KVA_MAX_HEAD_DIM];
    int bad = 0;
    unsigned char written[80] = {0};
    for (int32_t t = 0; t < T; t++) {
        if (slots[t] < 0)
            continue;
        written[slots[t]] = 1;
        for (int i = 0; i < Dc; i++)
            fc[i] = (float)kva_test_get(ckv + (size_t)t * ks * es, src_dt, (size_t)i);
        for (int i = 0; i < Dr; i++)
            fp[i] = (float)kva_test_get(kpe + (size_t)t * vs * es, src_dt, (size_t)i);
        expect_row(want, fc, fp, Dc, Dr);
        bad += memcmp(k + slots[t] * rb, want, (size_t)rb) != 0;
    }
    CHECK_MSG(bad == 0, "%d rows differ (Dc %d Dr %d src %s)", bad, Dc, Dr, kva_dtype_name(src_dt));
    for (int32_t s = 0; s < nb * B; s++)
        if (!written[s])
            for (int i = 0; i < rb; i++)
                bad += k[s * rb + i] != 0xa5;
    CHECK_MSG(bad == 0, "unwritten rows changed");

    /* Read back: c_kv = code * scale, k_pe exact, in f32, and rounded once
     * in f16 / bf16; rows of negative slots untouched. */
    for (int di = 0; di < 3; di++) {
        const kva_dtype dt = di == 0 ? KVA_DTYPE_F32 : di == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        const size_t des = kva_dtype_size(dt);
        char *rk = malloc((size_t)T * Dc * des), *rv = malloc((size_t)T * (Dr + 1) * des);
        kva_test_poison(rk, dt, (size_t)T * Dc);
        kva_test_poison(rv, dt, (size_t)T * (Dr + 1));
        CHECK_OK(kva_cache_read(ctx, c, T, slots, rk, 0, rv, Dr + 1, dt));
        int wrong = 0;
        for (int32_t t = 0; t < T; t++) {
            if (slots[t] < 0) {
                wrong += !kva_test_poisoned(rk, dt, (size_t)t * Dc);
                continue;
            }
            const uint8_t *row = k + slots[t] * rb;
            for (int i = 0; i < Dc; i++) {
                float s;
                memcpy(&s, row + Dc + 4 * (i / 128), 4);
                const float x = (float)(e4m3_value(row[i]) * (double)s);
                float w = x;
                if (dt != KVA_DTYPE_F32)
                    w = (float)kva_test_get(
                        &(uint16_t){dt == KVA_DTYPE_F16 ? kva_f32_to_f16(x) : bf16_bits(x)}, dt, 0);
                wrong += kva_test_get(rk, dt, (size_t)t * Dc + i) != w;
            }
            for (int i = 0; i < Dr; i++) {
                uint16_t b;
                memcpy(&b, row + Dc + 4 * (Dc / 128) + 2 * i, 2);
                const float x = kva_bf16_to_f32(b);
                const double got = kva_test_get(rv, dt, (size_t)t * (Dr + 1) + i);
                wrong += dt == KVA_DTYPE_F16 ? got != kva_f16_to_f32(kva_f32_to_f16(x)) : got != x;
            }
        }
        CHECK_MSG(wrong == 0, "%d read values differ (dst %s)", wrong, kva_dtype_name(dt));
        free(rk);
        free(rv);
    }
    free(ckv);
    free(kpe);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

static void test_bytes(void)
{
    check_bytes(KVA_BACKEND_CPU, 512, 64, KVA_DTYPE_F32, 1);
    check_bytes(KVA_BACKEND_REF, 512, 64, KVA_DTYPE_BF16, 2);
    check_bytes(KVA_BACKEND_CPU, 128, 8, KVA_DTYPE_F16, 3);
    check_bytes(KVA_BACKEND_CPU, 256, 32, KVA_DTYPE_BF16, 4);
}

/* Block copies and swaps move whole rows of bytes. */
static void test_copy_swap(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_cache_desc d = ds_desc(4, 8, 512, 64);
    kva_cache *a = NULL, *b = NULL, *m = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, NULL, &a));
    d.num_blocks = 3;
    CHECK_OK(kva_cache_create_quant(ctx, &d, NULL, &b));
    kva_cache_desc md = d;
    md.quant = KVA_QUANT_FP8_E4M3;
    CHECK_OK(kva_cache_create_quant(ctx, &md, NULL, &m));
    if (!a || !b || !m)
        goto out;
    uint8_t *ka, *kb;
    kva_cache_data(a, (void **)&ka, NULL);
    kva_cache_data(b, (void **)&kb, NULL);
    const size_t bb = 8 * 656;
    for (size_t i = 0; i < 4 * bb; i++)
        ka[i] = (uint8_t)(i * 131 + 7);
    memset(kb, 0, 3 * bb);
    uint8_t *before = malloc(4 * bb);
    memcpy(before, ka, 4 * bb);
    const int32_t cp[2] = {1, 3};
    CHECK_OK(kva_cache_copy_blocks(ctx, a, cp, 1));
    CHECK(memcmp(ka + 3 * bb, before + bb, bb) == 0);
    CHECK(memcmp(ka, before, 3 * bb) == 0);
    const int32_t sw[4] = {2, 0, 0, 2};
    CHECK_OK(kva_cache_swap_blocks(ctx, a, b, sw, 2));
    CHECK(memcmp(kb, before + 2 * bb, bb) == 0);
    CHECK(memcmp(kb + 2 * bb, before, bb) == 0);
    /* Another format of the same shape: the bytes would change meaning. */
    CHECK_STATUS(kva_cache_swap_blocks(ctx, a, m, sw, 1), KVA_STATUS_DTYPE_MISMATCH);
    free(before);
out:
    kva_cache_destroy(a);
    kva_cache_destroy(b);
    kva_cache_destroy(m);
    kva_context_destroy(ctx);
}

/* The value of element i (channel ch of kv head h) of a token's K or V row
 * decoded from the raw storage of cache c with the test's own format math. */
static double decoded(const kva_cache *c, const float *ks, const float *vs, const float *vo,
                      int is_v, int64_t slot, int64_t h, int64_t ch)
{
    kva_cache_desc d;
    void *kp, *vp;
    float *tsc = NULL;
    kva_cache_get_desc(c, &d);
    kva_cache_data(c, &kp, &vp);
    kva_cache_token_scales(c, &tsc);
    const int mla = d.kind == KVA_ATTN_MLA;
    if (mla && is_v)
        ch += d.head_dim_v, is_v = 0; /* k_pe: channels Dc .. D of the row */
    const int64_t dim = is_v ? d.head_dim_v : d.head_dim, B = d.block_size;
    const size_t off = (size_t)ref_offset(&d, (uint64_t)(slot / B), (uint64_t)(slot % B),
                                          (uint64_t)h, (uint64_t)dim) +
                       (size_t)ch;
    const void *base = is_v ? vp : kp;
    switch (d.quant) {
    case KVA_QUANT_NONE:
        return kva_test_get(base, d.dtype, off);
    case KVA_QUANT_INT8_CHANNEL:
        return (float)(((double)((const int8_t *)base)[off] - (is_v ? vo : ks + 2)[0]) *
                       (is_v ? vs : ks)[0]);
    case KVA_QUANT_INT8_TOKEN_K:
    case KVA_QUANT_INT8_TOKEN_K_V16:
        if (!is_v) {
            const size_t ti = (size_t)(((slot / B) * d.num_kv_heads + h) * B + slot % B);
            return (float)((const int8_t *)base)[off] * tsc[ti];
        }
        if (d.quant == KVA_QUANT_INT8_TOKEN_K_V16)
            return kva_test_get(base, d.dtype, off);
        return (float)(((double)((const int8_t *)base)[off] - vo[0]) * vs[0]);
    default: /* FP8_E4M3 */
        return (float)(e4m3_value(((const uint8_t *)base)[off]) * (is_v && !mla ? vs : ks)[0]);
    }
}

/* kva_cache_read of every MHA format (both layouts) and the MLA formats
 * against the storage decoded here, f32 destination. */
static void test_read_formats(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng rng = {77};
    for (int kind = 0; kind < 2; kind++)
        for (int q = 0; q < KVA_TEST_MHA_QUANTS; q++)
            for (int lay = 0; lay < 2; lay++) {
                const int mla = kind == 1;
                if (mla && (lay == 1 || (q != KVA_QUANT_NONE && q != KVA_QUANT_FP8_E4M3)))
                    continue;
                kva_dtype dt = q == KVA_QUANT_NONE               ? KVA_DTYPE_BF16
                               : q == KVA_QUANT_FP8_E4M3         ? KVA_DTYPE_FP8_E4M3
                               : q == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_F16
                                                                 : KVA_DTYPE_I8;
                const int32_t hkv = mla ? 1 : 2, D = mla ? 40 : 16, Dv = mla ? 32 : 24, B = 4;
                kva_cache_desc d = {
                    6, B, hkv, D, Dv, dt, (kva_layout)lay, (kva_quant)q, (kva_attn_kind)kind};
                /* Per-tensor parameters: ks[0] k scale, ks[2] k offset. */
                float ks[3] = {0.013f, 0.0f, 0.75f}, vs = 0.021f, vo = -1.25f;
                kva_quant_params p = {0};
                if (q == KVA_QUANT_INT8_CHANNEL)
                    p = (kva_quant_params){ks, 1, ks + 2, 1, &vs, 1, &vo, 1};
                else if (q == KVA_QUANT_INT8_TOKEN_K)
                    p = (kva_quant_params){NULL, 0, NULL, 0, &vs, 1, &vo, 1};
                else if (q == KVA_QUANT_FP8_E4M3)
                    p = (kva_quant_params){ks, 1, NULL, 0, mla ? NULL : &vs, mla ? 0 : 1, NULL, 0};
                kva_cache *c = NULL;
                CHECK_OK(kva_cache_create_quant(ctx, &d, q ? &p : NULL, &c));
                if (!c)
                    continue;
                const int32_t T = 9;
                const int64_t kr = mla ? Dv : hkv * D, vr = mla ? D - Dv : hkv * Dv;
                float *k = malloc(sizeof(float) * T * kr), *v = malloc(sizeof(float) * T * vr);
                kva_test_fill(k, KVA_DTYPE_F32, (size_t)T * kr, &rng, 1.0);
                kva_test_fill(v, KVA_DTYPE_F32, (size_t)T * vr, &rng, 1.0);
                int64_t slots[9] = {3, 0, -1, 23, 7, 8, 12, 5, 17};
                CHECK_OK(kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_F32, slots));
                kva_test_poison(k, KVA_DTYPE_F32, (size_t)T * kr);
                kva_test_poison(v, KVA_DTYPE_F32, (size_t)T * vr);
                CHECK_OK(kva_cache_read(ctx, c, T, slots, k, 0, v, 0, KVA_DTYPE_F32));
                int wrong = 0;
                for (int32_t t = 0; t < T; t++)
                    for (int is_v = 0; is_v < 2; is_v++) {
                        const int64_t heads = mla ? 1 : hkv;
                        const int64_t dim = mla ? (is_v ? D - Dv : Dv) : (is_v ? Dv : D);
                        const float *row = (is_v ? v : k) + t * (is_v ? vr : kr);
                        for (int64_t h = 0; h < heads; h++)
                            for (int64_t ch = 0; ch < dim; ch++) {
                                const float got = row[h * dim + ch];
                                if (slots[t] < 0) { /* untouched: the poison's bits */
                                    wrong += !kva_test_poisoned(row, KVA_DTYPE_F32,
                                                                (size_t)(h * dim + ch));
                                    continue;
                                }
                                const double w = decoded(c, ks, &vs, &vo, is_v, slots[t], h, ch);
                                wrong += got != (float)w;
                            }
                    }
                CHECK_MSG(wrong == 0, "%d values differ: kind %d quant %s layout %d", wrong, kind,
                          kva_quant_name((kva_quant)q), lay);
                free(k);
                free(v);
                kva_cache_destroy(c);
            }
    kva_context_destroy(ctx);
}

static void test_errors(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    kva_cache *c = SENTINEL;
    kva_cache_desc d = ds_desc(2, 4, 192, 64);
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("head_dim_v = 192");
    d = ds_desc(2, 4, 512, 64);
    d.dtype = KVA_DTYPE_BF16;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_DTYPE_MISMATCH);
    d = ds_desc(2, 4, 512, 64);
    /* A format of one kind with another: INVALID_ARGUMENT (kvattn.h), for
     * both kind-bound formats and every other kind. */
    d.kind = KVA_ATTN_MHA;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("fp8_ds_mla");
    d.kind = KVA_ATTN_INDEX;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("KVA_ATTN_MLA");
    d = ds_desc(2, 4, 512, 64);
    d.quant = KVA_QUANT_FP8_TOKEN;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("KVA_ATTN_INDEX");
    d.kind = KVA_ATTN_MHA;
    d.num_kv_heads = 2;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("fp8_token");
    /* A format the kind could hold but is not implemented for it: UNSUPPORTED. */
    d = ds_desc(2, 4, 512, 64);
    d.quant = KVA_QUANT_INT8_CHANNEL;
    d.dtype = KVA_DTYPE_I8;
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, NULL, &c), KVA_STATUS_UNSUPPORTED);
    d = ds_desc(2, 4, 512, 64);
    const float one = 1.0f;
    kva_quant_params p = {.k_scale = &one, .k_scale_len = 1};
    CHECK_STATUS(kva_cache_create_quant(ctx, &d, &p, &c), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("params");
    void *mem = aligned_alloc(64, 2 * 4 * 656);
    CHECK_STATUS(kva_cache_create_from(ctx, &d, mem, NULL, &c), KVA_STATUS_UNSUPPORTED);
    free(mem);
    CHECK(c == SENTINEL);

    /* Reads: nothing written on any failure. */
    CHECK_OK(kva_cache_create_quant(ctx, &d, NULL, &c));
    float k[2 * 512], v[2 * 64];
    kva_test_poison(k, KVA_DTYPE_F32, 1024);
    kva_test_poison(v, KVA_DTYPE_F32, 128);
    const int64_t slots[2] = {1, 8}, past[2] = {1, 9};
    CHECK_STATUS(kva_cache_read(ctx, c, 2, past, k, 0, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("slot_mapping[1] = 9");
    CHECK_STATUS(kva_cache_read(ctx, c, 2, slots, NULL, 0, NULL, 0, KVA_DTYPE_F32),
                 KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_cache_read(ctx, c, 2, NULL, k, 0, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_cache_read(ctx, c, 2, slots, k, 100, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("k_token_stride");
    CHECK_STATUS(kva_cache_read(ctx, c, 2, slots, k, 0, v, 0, KVA_DTYPE_I8),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_STATUS(kva_cache_read(ctx, c, -1, slots, k, 0, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_cache_read(ctx, c, 2, slots, (char *)k + 2, 0, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_cache_read(NULL, c, 2, slots, k, 0, v, 0, KVA_DTYPE_F32),
                 KVA_STATUS_NULL_POINTER);
    int untouched = 1;
    for (int i = 0; i < 1024; i++)
        untouched &= kva_test_poisoned(k, KVA_DTYPE_F32, (size_t)i);
    for (int i = 0; i < 128; i++)
        untouched &= kva_test_poisoned(v, KVA_DTYPE_F32, (size_t)i);
    CHECK(untouched);
    CHECK_OK(kva_cache_read(ctx, c, 0, NULL, k, 0, NULL, 0, KVA_DTYPE_F32));
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_bytes);
    RUN(test_copy_swap);
    RUN(test_read_formats);
    RUN(test_errors);
    return kva_test_finish();
}
