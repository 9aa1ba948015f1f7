/*
 * test_quant.c - quantized cache formats: fp8 e4m3 conversions (all 256 codes
 * and every rounding boundary), the codes each format writes (recomputed here
 * from the format's definition), round-trip error on Gaussian and on
 * outlier-heavy data with a stated bound per format, and bytes per token.
 * Bad inputs, specials and copy/swap are in test_quant_errors.c.
 */
#include "cache_util.h"

#include <float.h>

/* ---- fp8 e4m3 ---- */

/* The value of a code by the OCP definition, computed independently of the
 * library: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8. */
static double fp8_value(int code)
{
    int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static void test_fp8_decode_all_codes(void)
{
    for (int c = 0; c < 256; c++) {
        float f = kva_fp8_e4m3_to_f32((uint8_t)c);
        double want = fp8_value(c);
        if (isnan(want)) {
            CHECK_MSG(isnan(f), "code 0x%02x decodes to %g, want NaN", c, (double)f);
            CHECK(kva_f32_to_fp8_e4m3(f) == (uint8_t)c); /* sign of NaN kept */
            continue;
        }
        CHECK_MSG((double)f == want, "code 0x%02x: %g != %g", c, (double)f, want);
        CHECK_MSG((signbit(f) != 0) == (c >> 7), "code 0x%02x sign", c);
        /* Every finite code round-trips (including -0 = 0x80). */
        CHECK_MSG(kva_f32_to_fp8_e4m3(f) == (uint8_t)c, "code 0x%02x does not round-trip", c);
    }
    CHECK(kva_fp8_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(kva_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
}

/* Every boundary between consecutive positive codes: the midpoint rounds to the
 * even code, one f32 ulp below to the lower, one above to the upper; the same
 * for negatives; beyond 448 (and +-inf) saturates to 448. */
static void test_fp8_rounding_boundaries(void)
{
    for (int c = 0; c < 0x7e; c++) {
        const float lo = (float)fp8_value(c), hi = (float)fp8_value(c + 1);
        const float mid = (float)(((double)lo + (double)hi) / 2.0); /* exact in f32 */
        CHECK((double)mid == ((double)lo + (double)hi) / 2.0);
        const int even = (c & 1) ? c + 1 : c;
        CHECK_MSG(kva_f32_to_fp8_e4m3(mid) == even, "mid of 0x%02x/0x%02x -> 0x%02x", c, c + 1,
                  kva_f32_to_fp8_e4m3(mid));
        CHECK(kva_f32_to_fp8_e4m3(nextafterf(mid, 0.0f)) == c);
        CHECK(kva_f32_to_fp8_e4m3(nextafterf(mid, INFINITY)) == c + 1);
        CHECK(kva_f32_to_fp8_e4m3(-mid) == (0x80 | even));
        CHECK(kva_f32_to_fp8_e4m3(-nextafterf(mid, 0.0f)) == (0x80 | c));
        CHECK(kva_f32_to_fp8_e4m3(-nextafterf(mid, INFINITY)) == (0x80 | (c + 1)));
        /* Values strictly inside the interval next to lo or hi. */
        CHECK(kva_f32_to_fp8_e4m3(nextafterf(lo, INFINITY)) == c || lo == 0.0f);
        CHECK(kva_f32_to_fp8_e4m3(nextafterf(hi, 0.0f)) == c + 1);
    }
    /* Saturation and specials. */
    const float big[] = {448.0f,  nextafterf(448.0f, INFINITY), 464.0f, 480.0f, 1e6f, FLT_MAX,
                         INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(kva_f32_to_fp8_e4m3(big[i]) == 0x7e);
        CHECK(kva_f32_to_fp8_e4m3(-big[i]) == 0xfe);
    }
    CHECK(kva_f32_to_fp8_e4m3(NAN) == 0x7f);
    CHECK(kva_f32_to_fp8_e4m3(-NAN) == 0xff);
    CHECK(kva_f32_to_fp8_e4m3(0x1p-10f) == 0x00); /* tie between 0 and 2^-9: even (0) */
    CHECK(kva_f32_to_fp8_e4m3(0x1p-149f) == 0x00);
    CHECK(kva_f32_to_fp8_e4m3(-0.0f) == 0x80);
    /* A dense sweep against round-to-nearest by search over all codes. */
    kva_rng rng = {41};
    for (int i = 0; i < 200000; i++) {
        float x = (float)ldexp(kva_rng_unit(&rng) * 2.0 - 1.0, kva_rng_int(&rng, -12, 9));
        double best = INFINITY;
        int bc = -1;
        for (int c = 0; c < 256; c++) {
            double v = fp8_value(c);
            if (isnan(v) || (v == 0.0 && (signbit(v) != 0) != (signbit(x) != 0)))
                continue;
            double e = fabs(v - (double)x);
            if (e < best || (e == best && !(c & 1))) {
                best = e;
                bc = c;
            }
        }
        if (fabs(x) >= 448.0f)
            bc = x > 0 ? 0x7e : 0xfe;
        CHECK_MSG(kva_f32_to_fp8_e4m3(x) == bc, "x = %a -> 0x%02x, nearest 0x%02x", (double)x,
                  kva_f32_to_fp8_e4m3(x), bc);
        if (kva_f32_to_fp8_e4m3(x) != bc)
            break;
    }
}

/* ---- helpers ---- */

static kva_cache_desc qdesc(int32_t nb, int32_t b, int32_t hkv, int32_t d, int32_t dv, kva_quant q,
                            kva_layout layout, kva_dtype v16)
{
    kva_dtype dt = q == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
                   : q == KVA_QUANT_INT8_TOKEN_K_V16 ? v16
                   : q == KVA_QUANT_NONE             ? KVA_DTYPE_F32
                                                     : KVA_DTYPE_I8;
    kva_cache_desc desc = {nb, b, hkv, d, dv, dt, layout, q, KVA_ATTN_MHA};
    return desc;
}

/* Per-channel scale/offset of a C8 cache calibrated on data x [T, Hkv*dim]:
 * asymmetric min/max over [-128, 127] per channel. */
static void calibrate_c8(const float *x, int32_t T, int32_t n, float *scale, float *offset)
{
    for (int32_t c = 0; c < n; c++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int32_t t = 0; t < T; t++) {
            float v = x[(size_t)t * n + c];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        scale[c] = (hi - lo) / 255.0f;
        offset[c] = -128.0f - lo / scale[c];
    }
}

/* Gaussian data, or outlier-heavy: 1% of the values 20x larger, and two
 * channels of every head with 8x the spread (the activation outliers of LLM keys). */
static void fill_data(float *x, int32_t T, int32_t hkv, int32_t dim, int outliers, kva_rng *r)
{
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < hkv; h++)
            for (int32_t c = 0; c < dim; c++) {
                double v = kva_rng_normal(r);
                if (outliers) {
                    if (c == 3 || c == dim / 2)
                        v *= 8.0;
                    if (kva_rng_unit(r) < 0.01)
                        v *= 20.0;
                }
                x[((size_t)t * hkv + h) * dim + c] = (float)(v == 0.0 ? 0.5 : v);
            }
}

typedef struct rt_stats {
    double rel_rms;  /* ||x - x^|| / ||x|| */
    double max_step; /* max |x - x^| / (quantization step of that element) */
} rt_stats;

/*
 * Writes T tokens of K and V (f32, [T, Hkv, dim]) into slots 0..T-1 of a cache of
 * format q, checks every stored code against the format's definition computed
 * here, and returns the round-trip statistics of K and V.
 */
static void round_trip(kva_quant q, const float *k, const float *v, int32_t T, int32_t hkv,
                       int32_t D, const kva_quant_params *p, rt_stats *ks, rt_stats *vs)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    const int32_t B = 16, nb = (T + B - 1) / B;
    kva_cache_desc desc = qdesc(nb, B, hkv, D, D, q, KVA_LAYOUT_NHD, KVA_DTYPE_BF16);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &desc, p, &c));
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)T);
    for (int32_t t = 0; t < T; t++)
        slots[t] = t;
    CHECK_OK(kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_F32, slots));
    size_t code_bad = 0;
    for (int is_v = 0; is_v < 2; is_v++) {
        const float *x = is_v ? v : k;
        double se = 0, sx = 0, mstep = 0;
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < hkv; h++) {
                float amax = 0;
                for (int32_t ch = 0; ch < D; ch++) {
                    float a = fabsf(x[((size_t)t * hkv + h) * D + ch]);
                    amax = a > amax ? a : amax;
                }
                for (int32_t ch = 0; ch < D; ch++) {
                    const size_t i = ((size_t)t * hkv + h) * D + ch;
                    const size_t e = (size_t)kva__cache_row(&c->desc, t / B, t % B, h, D) + ch;
                    const double got = kva__quant_load(c, is_v, t / B, t % B, h, ch);
                    double step;
                    /* The code the format defines, recomputed here. */
                    if (!is_v && (q == KVA_QUANT_INT8_TOKEN_K || q == KVA_QUANT_INT8_TOKEN_K_V16)) {
                        float s = amax / 127.0f;
                        float y = nearbyintf(x[i] / s);
                        int want = y > 127 ? 127 : y < -128 ? -128 : (int)y;
                        code_bad += ((int8_t *)c->k)[e] != want;
                        code_bad +=
                            c->k_token_scale[kva__token_scale_index(&c->desc, t / B, t % B, h)] !=
                            s;
                        step = s;
                    } else if (q == KVA_QUANT_INT8_TOKEN_K_V16) {
                        code_bad += ((uint16_t *)c->v)[e] != kva_f32_to_bf16(x[i]);
                        step = fabs(x[i]) * 0x1p-7; /* bf16: half an ulp <= 2^-8 |x| */
                    } else if (q == KVA_QUANT_FP8_E4M3) {
                        const float s =
                            (is_v ? p->v_scale : p->k_scale)[p->k_scale_len == 1 ? 0 : h];
                        uint8_t want = kva_f32_to_fp8_e4m3(x[i] / s);
                        code_bad += ((uint8_t *)(is_v ? c->v : c->k))[e] != want;
                        /* Half the spacing around x: 2^-4 relative, 2^-10 s absolute. */
                        step = fmax(fabs(x[i]) * 0x1p-3, 0x1p-9 * s);
                    } else {
                        const float *sc = is_v ? p->v_scale : p->k_scale;
                        const float *of = is_v ? p->v_offset : p->k_offset;
                        const size_t ci = (size_t)h * D + ch;
                        float y = nearbyintf(x[i] / sc[ci] + of[ci]);
                        int want = y > 127 ? 127 : y < -128 ? -128 : (int)y;
                        code_bad += ((int8_t *)(is_v ? c->v : c->k))[e] != want;
                        step = sc[ci];
                    }
                    const double err = fabs(got - (double)x[i]);
                    se += err * err;
                    sx += (double)x[i] * x[i];
                    mstep = fmax(mstep, err / step);
                }
            }
        rt_stats *st = is_v ? vs : ks;
        st->rel_rms = sqrt(se / sx);
        st->max_step = mstep;
    }
    CHECK_MSG(code_bad == 0, "%zu codes differ from the format's definition (%s)", code_bad,
              kva_quant_name(q));
    free(slots);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/*
 * Round-trip error per format on Gaussian and outlier-heavy data. The bounds:
 * every element within half a quantization step (max_step <= 0.5: values are
 * inside the calibrated range, so nothing saturates), and a relative RMS error
 * per format and data set (measured values printed; bounds ~1.3x above them).
 */
static void test_round_trip_error(void)
{
    const int32_t T = 256, hkv = 2, D = 64, n = hkv * D;
    float *k = malloc(sizeof(float) * (size_t)T * n), *v = malloc(sizeof(float) * (size_t)T * n);
    float *ksc = malloc(sizeof(float) * n), *kof = malloc(sizeof(float) * n);
    float *vsc = malloc(sizeof(float) * n), *vof = malloc(sizeof(float) * n);
    /* Bounds on rel RMS: [format][gaussian, outliers]. */
    static const double bound[5][2] = {
        {0, 0}, {0.0085, 0.026}, {0.0085, 0.026}, {0.0085, 0.026}, {0.035, 0.035}};
    printf("round trip, relative RMS error (K / V), max error in quantization steps\n");
    for (int outl = 0; outl < 2; outl++) {
        kva_rng rng = {1000u + (uint64_t)outl};
        fill_data(k, T, hkv, D, outl, &rng);
        fill_data(v, T, hkv, D, outl, &rng);
        calibrate_c8(k, T, n, ksc, kof);
        calibrate_c8(v, T, n, vsc, vof);
        for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++) {
            kva_quant_params p;
            memset(&p, 0, sizeof p);
            float fk[2], fv[2];
            if (q == KVA_QUANT_INT8_CHANNEL) {
                p = (kva_quant_params){ksc, n, kof, n, vsc, n, vof, n};
            } else if (q == KVA_QUANT_INT8_TOKEN_K) {
                p.v_scale = vsc, p.v_scale_len = n, p.v_offset = vof, p.v_offset_len = n;
            } else if (q == KVA_QUANT_FP8_E4M3) {
                /* Per-head scale: amax / 448 of the head (vLLM's calibration). */
                for (int32_t h = 0; h < hkv; h++) {
                    float ak = 0, av = 0;
                    for (int32_t t = 0; t < T; t++)
                        for (int32_t ch = 0; ch < D; ch++) {
                            ak = fmaxf(ak, fabsf(k[((size_t)t * hkv + h) * D + ch]));
                            av = fmaxf(av, fabsf(v[((size_t)t * hkv + h) * D + ch]));
                        }
                    fk[h] = ak / 448.0f;
                    fv[h] = av / 448.0f;
                }
                p.k_scale = fk, p.k_scale_len = hkv, p.v_scale = fv, p.v_scale_len = hkv;
            }
            rt_stats ks, vs;
            round_trip((kva_quant)q, k, v, T, hkv, D, &p, &ks, &vs);
            printf("  %-17s %-9s K %.5f  V %.5f   max %.3f / %.3f steps\n",
                   kva_quant_name((kva_quant)q), outl ? "outliers" : "gaussian", ks.rel_rms,
                   vs.rel_rms, ks.max_step, vs.max_step);
            CHECK_MSG(ks.max_step <= 0.5 * (1 + 1e-5) && vs.max_step <= 0.5 * (1 + 1e-5),
                      "%s: error beyond half a step (%g, %g)", kva_quant_name((kva_quant)q),
                      ks.max_step, vs.max_step);
            const double kb = bound[q][outl];
            const double vb = q == KVA_QUANT_INT8_TOKEN_K_V16 ? 0.0025 : bound[q][outl];
            CHECK_MSG(ks.rel_rms <= kb && vs.rel_rms <= vb, "%s %s: rel RMS %g / %g > %g / %g",
                      kva_quant_name((kva_quant)q), outl ? "outliers" : "gaussian", ks.rel_rms,
                      vs.rel_rms, kb, vb);
        }
    }
    free(k);
    free(v);
    free(ksc);
    free(kof);
    free(vsc);
    free(vof);
}

/* Bytes per token of each format against an f16 cache (H kv = 8, D = 128). */
static void test_bytes_per_token(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    const int32_t hkv = 8, D = 128, B = 16;
    kva_cache_desc f16 = make_desc(4, B, hkv, D, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    kva_cache *c16 = NULL;
    CHECK_OK(kva_cache_create(ctx, &f16, &c16));
    const double base = (double)(kva_cache_block_bytes_k(c16) + kva_cache_block_bytes_v(c16)) / B;
    float one = 0.05f;
    kva_quant_params p = {&one, 1, NULL, 0, &one, 1, NULL, 0};
    printf("bytes per token (Hkv 8, D 128): f16 %.0f\n", base);
    for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++) {
        kva_cache_desc d = qdesc(4, B, hkv, D, D, (kva_quant)q, KVA_LAYOUT_NHD, KVA_DTYPE_F16);
        kva_cache *c = NULL;
        const kva_quant_params *pp = q == KVA_QUANT_INT8_TOKEN_K_V16 ? NULL : &p;
        kva_quant_params pt = {NULL, 0, NULL, 0, &one, 1, NULL, 0};
        if (q == KVA_QUANT_INT8_TOKEN_K)
            pp = &pt;
        CHECK_OK(kva_cache_create_quant(ctx, &d, pp, &c));
        const double data = (double)(kva_cache_block_bytes_k(c) + kva_cache_block_bytes_v(c)) / B;
        const double sc = (double)kva_cache_block_bytes_scales(c) / B;
        printf("  %-17s %.0f data + %.0f scale bytes = %.3f x f16 (+ %zu bytes static scales)\n",
               kva_quant_name((kva_quant)q), data, sc, (data + sc) / base,
               kva_cache_static_scale_bytes(c));
        if (q != KVA_QUANT_INT8_TOKEN_K_V16)
            CHECK(data <= 0.5 * base);
        CHECK(sc ==
              ((q == KVA_QUANT_INT8_TOKEN_K || q == KVA_QUANT_INT8_TOKEN_K_V16) ? 4.0 * hkv : 0.0));
        kva_cache_desc got;
        CHECK_OK(kva_cache_get_desc(c, &got));
        CHECK(got.quant == (kva_quant)q && got.dtype == d.dtype);
        kva_cache_destroy(c);
    }
    kva_cache_destroy(c16);
    kva_context_destroy(ctx);
}

/*
 * The write path's other inputs for every format: bf16/f16 sources store the
 * same codes as f32 sources holding the same values; strided rows (a slice of
 * a fused QKV buffer) the same as contiguous ones; both layouts; padding slots
 * (-1) write nothing.
 */
static void test_write_sources_strides(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng rng = {555};
    const int32_t T = 40, hkv = 3, D = 16, Dv = 24, B = 8, nb = 6;
    float ks = 0.015f, vs = 0.02f, ko = 1.5f;
    for (int q = 1; q < KVA_TEST_MHA_QUANTS; q++)
        for (int lay = 0; lay < 2; lay++)
            for (int sdt = 0; sdt < 2; sdt++) {
                const kva_dtype src_dt = sdt ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
                kva_quant_params p = {&ks, 1, &ko, 1, &vs, 1, &ko, 1};
                if (q == KVA_QUANT_INT8_TOKEN_K)
                    p.k_scale = NULL, p.k_scale_len = 0, p.k_offset = NULL, p.k_offset_len = 0;
                if (q == KVA_QUANT_FP8_E4M3)
                    p.k_offset = p.v_offset = NULL, p.k_offset_len = p.v_offset_len = 0;
                kva_cache_desc d =
                    qdesc(nb, B, hkv, D, Dv, (kva_quant)q, (kva_layout)lay, KVA_DTYPE_F16);
                kva_cache *a = NULL, *b = NULL;
                const kva_quant_params *pp = q == KVA_QUANT_INT8_TOKEN_K_V16 ? NULL : &p;
                CHECK_OK(kva_cache_create_quant(ctx, &d, pp, &a));
                CHECK_OK(kva_cache_create_quant(ctx, &d, pp, &b));
                if (!a || !b)
                    continue;
                const size_t kb = (size_t)nb * B * hkv * D * a->elem_size;
                const size_t vb = (size_t)nb * B * hkv * Dv * a->v_elem;
                memset(a->k, 0x5a, kb), memset(b->k, 0x5a, kb);
                memset(a->v, 0x5a, vb), memset(b->v, 0x5a, vb);
                /* Fused rows [T, q | k | v] in 16-bit, and f32 copies of k and v. */
                const int32_t row = 7 + hkv * D + hkv * Dv;
                uint16_t *fused = malloc(sizeof(uint16_t) * (size_t)T * row);
                float *k32 = malloc(sizeof(float) * (size_t)T * hkv * D);
                float *v32 = malloc(sizeof(float) * (size_t)T * hkv * Dv);
                kva_test_fill(fused, src_dt, (size_t)T * row, &rng, 1.0);
                for (int32_t t = 0; t < T; t++) {
                    for (int32_t i = 0; i < hkv * D; i++)
                        k32[(size_t)t * hkv * D + i] =
                            (float)kva_test_get(fused, src_dt, (size_t)t * row + 7 + i);
                    for (int32_t i = 0; i < hkv * Dv; i++)
                        v32[(size_t)t * hkv * Dv + i] =
                            (float)kva_test_get(fused, src_dt, (size_t)t * row + 7 + hkv * D + i);
                }
                int64_t slots[40];
                for (int32_t t = 0; t < T; t++)
                    slots[t] = t % 5 == 2 ? -1 : (int64_t)((t * 7) % (nb * B));
                CHECK_OK(kva_cache_write(ctx, a, T, fused + 7, row, fused + 7 + hkv * D, row,
                                         src_dt, slots));
                CHECK_OK(kva_cache_write(ctx, b, T, k32, 0, v32, 0, KVA_DTYPE_F32, slots));
                CHECK_MSG(memcmp(a->k, b->k, kb) == 0 && memcmp(a->v, b->v, vb) == 0,
                          "%s layout %d src %s: codes differ", kva_quant_name((kva_quant)q), lay,
                          kva_dtype_name(src_dt));
                if (a->k_token_scale)
                    CHECK(memcmp(a->k_token_scale, b->k_token_scale,
                                 sizeof(float) * (size_t)nb * B * hkv) == 0);
                /* Padding tokens wrote nothing: slot (2*7) % 48 = 14 stays 0x5a
                 * unless another token maps there. */
                size_t untouched = 0;
                for (size_t i = 0; i < kb; i++)
                    untouched += ((unsigned char *)a->k)[i] == 0x5a;
                CHECK(untouched > 0);
                free(fused), free(k32), free(v32);
                kva_cache_destroy(a);
                kva_cache_destroy(b);
            }
    kva_context_destroy(ctx);
}

/*
 * INT8 rounding on exact ties, which random data never hits: x / s + o
 * exactly halfway between two integers must round to the even one (rne, not
 * half away from zero), before the clamp to [-128, 127]; per-token keys the
 * same with s_t = max|k| / 127. Also the read formula (q - o) * s.
 */
static void test_int8_ties(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 1);
    enum { D = 16 };
    /* K: s = 1, o = 0, so x / s + o = x. */
    const float kx[D] = {0.5f,    1.5f,    2.5f, -0.5f,  -1.5f,  -2.5f,       126.5f,     127.5f,
                         -127.5f, -128.5f, 5.5f, 200.0f, -1e30f, 0.49999997f, 3.4999998f, 1e-45f};
    const int kq[D] = {0, 2, 2, 0, -2, -2, 126, 127, -128, -128, 6, 127, -128, 0, 3, 0};
    /* V: s = 0.5, o = 0.25: x = (n + 0.25) / 2 gives x / s + o = n + 0.5 exactly. */
    float vx[D];
    int vq[D];
    for (int i = 0; i < D; i++) {
        const int n = i - 8; /* -8 .. 7: ties at -7.5 .. 7.5 */
        vx[i] = ((float)n + 0.25f) * 0.5f;
        const int lo = n, hi = n + 1; /* tie between lo and hi: the even one */
        vq[i] = (lo % 2 == 0) ? lo : hi;
    }
    const float ks = 1.0f, vs = 0.5f, vo = 0.25f;
    kva_quant_params p = {&ks, 1, NULL, 0, &vs, 1, &vo, 1};
    kva_cache_desc d = qdesc(1, 4, 1, D, D, KVA_QUANT_INT8_CHANNEL, KVA_LAYOUT_NHD, KVA_DTYPE_F16);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &d, &p, &c));
    const int64_t slot = 2;
    CHECK_OK(kva_cache_write(ctx, c, 1, kx, 0, vx, 0, KVA_DTYPE_F32, &slot));
    for (int i = 0; c && i < D; i++) {
        const int8_t gk = ((const int8_t *)c->k)[kva__cache_row(&c->desc, 0, 2, 0, D) + i];
        const int8_t gv = ((const int8_t *)c->v)[kva__cache_row(&c->desc, 0, 2, 0, D) + i];
        CHECK_MSG(gk == kq[i], "k %a -> %d, want %d", (double)kx[i], gk, kq[i]);
        CHECK_MSG(gv == vq[i], "v %a (y = %g) -> %d, want %d", (double)vx[i],
                  (double)(vx[i] / vs + vo), gv, vq[i]);
        CHECK(kva__quant_load(c, 1, 0, 2, 0, i) == ((double)vq[i] - 0.25) * 0.5);
    }
    kva_cache_destroy(c);

    /* Per-token keys: 127 in the row makes s_t = 127 / 127 = 1 exactly. */
    float tx[D] = {127.0f, 2.5f,  3.5f, -0.5f, -126.5f, 0.5f,  -1.5f, 1.5f,
                   4.5f,   -4.5f, 0.0f, 10.5f, 11.5f,   -3.5f, 6.5f,  -127.0f};
    const int tq[D] = {127, 2, 4, 0, -126, 0, -2, 2, 4, -4, 0, 10, 12, -4, 6, -127};
    float tv[D];
    for (int i = 0; i < D; i++)
        tv[i] = (float)i;
    d = qdesc(1, 4, 1, D, D, KVA_QUANT_INT8_TOKEN_K_V16, KVA_LAYOUT_HND, KVA_DTYPE_BF16);
    CHECK_OK(kva_cache_create_quant(ctx, &d, NULL, &c));
    CHECK_OK(kva_cache_write(ctx, c, 1, tx, 0, tv, 0, KVA_DTYPE_F32, &slot));
    for (int i = 0; c && i < D; i++) {
        const int8_t g = ((const int8_t *)c->k)[kva__cache_row(&c->desc, 0, 2, 0, D) + i];
        CHECK_MSG(g == tq[i], "token k %g -> %d, want %d", (double)tx[i], g, tq[i]);
        CHECK(kva__quant_load(c, 0, 0, 2, 0, i) == (double)tq[i]);
    }
    if (c)
        CHECK(c->k_token_scale[kva__token_scale_index(&c->desc, 0, 2, 0)] == 1.0f);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_fp8_decode_all_codes);
    RUN(test_fp8_rounding_boundaries);
    RUN(test_int8_ties);
    RUN(test_round_trip_error);
    RUN(test_bytes_per_token);
    RUN(test_write_sources_strides);
    return kva_test_finish();
}
