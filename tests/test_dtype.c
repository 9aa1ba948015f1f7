/*
 * test_dtype.c - dtype sizes and names, f32 <-> f16/bf16 conversions and
 * kva_convert.
 *
 * Rounding is checked against an independent method: values of f16/bf16 bit
 * patterns are decoded here with ldexp from sign, exponent and mantissa (not
 * with the library's decoders), and
 *   - every rounding boundary is tested exhaustively: for each pair of
 *     consecutive finite values, their exact midpoint must round to the
 *     neighbour with the even mantissa, and the f32 values just below and
 *     just above it to the lower and upper neighbour;
 *   - random f32 values must round to a candidate that no neighbour beats
 *     in |x - candidate| (ties to even).
 */
#include "harness.h"
#include "internal.h"

#include <float.h>

/* Independent decoders: value of a bit pattern as double; NaN and inf are
 * returned as such. */
static double decode_f16(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp((double)mant, -24);
    else
        v = ldexp((double)(1024 + mant), exp - 25);
    return sign ? -v : v;
}

static double decode_bf16(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
    double v;
    if (exp == 0xff)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp((double)mant, -133);
    else
        v = ldexp((double)(128 + mant), exp - 134);
    return sign ? -v : v;
}

/* Magnitude of the positive pattern h, where the first infinite pattern
 * stands for the next power of two (the rounding boundary to overflow). */
static double mag_f16(uint16_t h)
{
    return h == 0x7c00 ? 65536.0 : decode_f16(h);
}
static double mag_bf16(uint16_t h)
{
    return h == 0x7f80 ? ldexp(1.0, 128) : decode_bf16(h);
}

static float bits_to_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void test_sizes_and_names(void)
{
    CHECK(kva_dtype_size(KVA_DTYPE_F32) == 4);
    CHECK(kva_dtype_size(KVA_DTYPE_F16) == 2);
    CHECK(kva_dtype_size(KVA_DTYPE_BF16) == 2);
    CHECK(kva_dtype_size(KVA_DTYPE_I8) == 1);
    CHECK(kva_dtype_size(KVA_DTYPE_FP8_E4M3) == 1);
    CHECK(kva_dtype_size(KVA_DTYPE_U8) == 1);
    CHECK(kva_dtype_size(KVA_DTYPE_COUNT_) == 0);
    CHECK(kva_dtype_size((kva_dtype)-1) == 0);
    const char *names[] = {"f32", "f16", "bf16", "i8", "fp8_e4m3", "u8"};
    for (int i = 0; i < KVA_DTYPE_COUNT_; i++)
        CHECK(strcmp(kva_dtype_name((kva_dtype)i), names[i]) == 0);
    CHECK(strcmp(kva_dtype_name((kva_dtype)99), "invalid") == 0);
    CHECK(strcmp(kva_dtype_name((kva_dtype)-1), "invalid") == 0);
}

static void test_f16_decode_and_round_trip(void)
{
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = kva_f16_to_f32(h);
        double want = decode_f16(h);
        if (isnan(want)) {
            if (!isnan(f) || (signbit(f) != 0) != (h >> 15) ||
                !isnan(kva_f16_to_f32(kva_f32_to_f16(f))))
                bad++;
            /* NaN stays NaN through the round trip, with its sign. */
            uint16_t back = kva_f32_to_f16(f);
            if ((back & 0x7c00) != 0x7c00 || (back & 0x3ff) == 0 || (back >> 15) != (h >> 15))
                bad++;
            continue;
        }
        if ((double)f != want || (signbit(f) != 0) != (h >> 15)) {
            if (bad++ < 5)
                fprintf(stderr, "  f16 %04x decodes to %.9g, want %.9g\n", i, f, want);
            continue;
        }
        if (kva_f32_to_f16(f) != h && bad++ < 5)
            fprintf(stderr, "  f16 %04x round trip gives %04x\n", i, kva_f32_to_f16(f));
    }
    CHECK_MSG(bad == 0, "%d f16 patterns failed", bad);
}

static void test_bf16_decode_and_round_trip(void)
{
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = kva_bf16_to_f32(h);
        double want = decode_bf16(h);
        if (isnan(want)) {
            uint16_t back = kva_f32_to_bf16(f);
            if (!isnan(f) || (back & 0x7f80) != 0x7f80 || (back & 0x7f) == 0 ||
                (back >> 15) != (h >> 15))
                bad++;
            continue;
        }
        if ((double)f != want || (signbit(f) != 0) != (h >> 15) || kva_f32_to_bf16(f) != h) {
            if (bad++ < 5)
                fprintf(stderr, "  bf16 %04x: decodes to %.9g (want %.9g), back %04x\n", i, f, want,
                        kva_f32_to_bf16(f));
        }
    }
    CHECK_MSG(bad == 0, "%d bf16 patterns failed", bad);
}

/* For every pair of consecutive non-negative finite patterns (h, h+1), the
 * exact midpoint rounds to the even one, and its f32 neighbours round down and
 * up; both signs. to16 is the conversion under test, mag the decoder. */
static int check_boundaries(const char *label, uint16_t (*to16)(float), double (*mag)(uint16_t),
                            uint16_t last_finite)
{
    int bad = 0;
    for (uint32_t h = 0; h <= last_finite; h++) {
        double lo = mag((uint16_t)h), hi = mag((uint16_t)(h + 1));
        float exact = (float)lo;
        float mid = (float)((lo + hi) / 2);
        CHECK((double)mid == (lo + hi) / 2); /* midpoints are exact in f32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
        for (int s = 0; s < 2; s++) {
            float sg = s ? -1.0f : 1.0f;
            uint16_t sb = s ? 0x8000 : 0;
            uint16_t got[4] = {to16(sg * exact), to16(sg * mid), to16(sg * below),
                               to16(sg * above)};
            uint16_t want[4] = {(uint16_t)(sb | h), (uint16_t)(sb | even), (uint16_t)(sb | h),
                                (uint16_t)(sb | (h + 1))};
            for (int k = 0; k < 4; k++) {
                if (got[k] != want[k] && bad++ < 5)
                    fprintf(stderr, "  %s: case %d near %04x (sign %d): got %04x, want %04x\n",
                            label, k, h, s, got[k], want[k]);
            }
        }
    }
    return bad;
}

static void test_f16_rounding_boundaries(void)
{
    int bad = check_boundaries("f16", kva_f32_to_f16, mag_f16, 0x7bff);
    CHECK_MSG(bad == 0, "%d f16 boundary cases failed", bad);
}

static void test_bf16_rounding_boundaries(void)
{
    int bad = check_boundaries("bf16", kva_f32_to_bf16, mag_bf16, 0x7f7f);
    CHECK_MSG(bad == 0, "%d bf16 boundary cases failed", bad);
}

/* Random f32 values (uniform bit patterns over the relevant exponent range):
 * the result must be at least as close as both neighbours, ties to even. */
static int check_random(const char *label, uint16_t (*to16)(float), double (*mag)(uint16_t),
                        uint16_t inf_bits, uint32_t lo_bits, uint32_t hi_bits, uint64_t seed)
{
    kva_rng r = {seed};
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = lo_bits + (uint32_t)(kva_rng_u64(&r) % (hi_bits - lo_bits));
        uint32_t sign = (uint32_t)(kva_rng_u64(&r) & 1) << 31;
        float x = bits_to_f32(u | sign);
        double ax = fabs((double)x);
        uint16_t h = to16(x);
        uint16_t m = h & 0x7fff;
        int ok = (h >> 15) == (sign >> 31) && m <= inf_bits;
        if (ok) {
            double v = mag(m);
            double dv = fabs(ax - v);
            if (m > 0 && fabs(ax - mag((uint16_t)(m - 1))) < dv)
                ok = 0;
            if (m < inf_bits) {
                double dn = fabs(ax - mag((uint16_t)(m + 1)));
                if (dn < dv || (dn == dv && (m & 1)))
                    ok = 0;
            }
            if (m > 0 && fabs(ax - mag((uint16_t)(m - 1))) == dv && (m & 1))
                ok = 0;
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s: %.9g (bits %08x) -> %04x\n", label, x, u | sign, h);
    }
    return bad;
}

static void test_random_rounding(void)
{
    /* f16: from below the subnormal range (2^-26) to beyond overflow (2^17). */
    int bad = check_random("f16", kva_f32_to_f16, mag_f16, 0x7c00, 0x32800000u, 0x48000000u, 11);
    CHECK_MSG(bad == 0, "%d random f16 roundings failed", bad);
    /* bf16: every finite f32, subnormals included. */
    bad = check_random("bf16", kva_f32_to_bf16, mag_bf16, 0x7f80, 0x00000001u, 0x7f800000u, 12);
    CHECK_MSG(bad == 0, "%d random bf16 roundings failed", bad);
}

static void test_special_values(void)
{
    /* Overflow: 65520 is the midpoint between 65504 and 2^16, ties to even = inf. */
    CHECK(kva_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(kva_f32_to_f16(-65520.0f) == 0xfc00);
    CHECK(kva_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(kva_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(kva_f32_to_f16(1e10f) == 0x7c00);
    CHECK(kva_f32_to_f16(FLT_MAX) == 0x7c00);
    CHECK(kva_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(kva_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(kva_f32_to_bf16(FLT_MAX) == 0x7f80); /* rounds up past the largest bf16 */
    CHECK(kva_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(kva_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(isinf(kva_f16_to_f32(0x7c00)) && kva_f16_to_f32(0x7c00) > 0);
    /* Signed zero. */
    CHECK(kva_f32_to_f16(0.0f) == 0x0000);
    CHECK(kva_f32_to_f16(-0.0f) == 0x8000);
    CHECK(kva_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(signbit(kva_f16_to_f32(0x8000)) && kva_f16_to_f32(0x8000) == 0.0f);
    CHECK(signbit(kva_bf16_to_f32(0x8000)) && kva_bf16_to_f32(0x8000) == 0.0f);
    /* f16 subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3*2^-25 ties to 2. */
    CHECK(kva_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(kva_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);
    CHECK(kva_f32_to_f16(-ldexpf(1.0f, -25)) == 0x8000);
    CHECK(kva_f32_to_f16(nextafterf(ldexpf(1.0f, -25), 1.0f)) == 0x0001);
    CHECK(kva_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002);
    CHECK(kva_f32_to_f16(ldexpf(1023.0f, -24)) == 0x03ff); /* largest subnormal */
    CHECK(kva_f32_to_f16(ldexpf(2047.0f, -25)) == 0x0400); /* rounds up to the smallest normal */
    CHECK(kva_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(kva_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    /* f32 subnormals vanish in f16 but survive in bf16 (same exponent range). */
    CHECK(kva_f32_to_f16(bits_to_f32(0x00000001u)) == 0x0000);
    CHECK(kva_f32_to_f16(bits_to_f32(0x80400000u)) == 0x8000);
    CHECK(kva_f32_to_bf16(bits_to_f32(0x00400000u)) == 0x0040);
    CHECK(kva_bf16_to_f32(0x0001) == bits_to_f32(0x00010000u));
    /* NaN stays NaN (payload-less quiet NaN and a signalling pattern). */
    CHECK((kva_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (kva_f32_to_f16(NAN) & 0x3ff) != 0);
    CHECK((kva_f32_to_f16(bits_to_f32(0x7f800001u)) & 0x3ff) != 0);
    CHECK((kva_f32_to_bf16(bits_to_f32(0x7f800001u)) & 0x7f) != 0);
    CHECK((kva_f32_to_bf16(bits_to_f32(0xff800001u)) & 0xff80) == 0xff80);
    CHECK(isnan(kva_bf16_to_f32(kva_f32_to_bf16(NAN))));
}

/* kva_convert between every pair of float dtypes: the result equals the
 * element-wise scalar conversion through f32 (which is exact from any
 * float dtype), checked bit for bit. */
static void test_convert_pairs(void)
{
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    enum { N = 1003 };
    kva_rng r = {21};
    for (int a = 0; a < 3; a++) {
        for (int b = 0; b < 3; b++) {
            kva_dtype sd = dts[a], dd = dts[b];
            float src[N], got[N], want[N];
            /* Spread magnitudes so that f16 also sees overflow and subnormals. */
            for (int i = 0; i < N; i++) {
                float x = (float)(kva_rng_normal(&r) * ldexp(1.0, kva_rng_int(&r, -30, 20)));
                kva__store_f(src, sd, (size_t)i, x);
            }
            kva_test_poison(got, dd, N);
            for (int i = 0; i < N; i++)
                kva__store_f(want, dd, (size_t)i, kva__load_f(src, sd, (size_t)i));
            CHECK_OK(kva_convert(src, sd, got, dd, N));
            CHECK_MSG(memcmp(got, want, N * kva_dtype_size(dd)) == 0, "convert %s -> %s",
                      kva_dtype_name(sd), kva_dtype_name(dd));
        }
    }
    /* In place with equal dtypes is allowed and a no-op. */
    uint16_t buf[64], copy[64];
    kva_test_fill(buf, KVA_DTYPE_F16, 64, &r, 1.0);
    memcpy(copy, buf, sizeof buf);
    CHECK_OK(kva_convert(buf, KVA_DTYPE_F16, buf, KVA_DTYPE_F16, 64));
    CHECK(memcmp(buf, copy, sizeof buf) == 0);
    /* f32 -> f16 of a known value. */
    float one[2] = {1.0f, -2.5f};
    uint16_t h[2];
    CHECK_OK(kva_convert(one, KVA_DTYPE_F32, h, KVA_DTYPE_F16, 2));
    CHECK(h[0] == 0x3c00 && h[1] == 0xc100);
}

static void test_convert_bad_inputs(void)
{
    float src[8];
    uint16_t dst[8], before[8];
    kva_rng r = {5};
    kva_test_fill(src, KVA_DTYPE_F32, 8, &r, 1.0);
    kva_test_fill(dst, KVA_DTYPE_F16, 8, &r, 1.0);
    memcpy(before, dst, sizeof dst);

    CHECK_STATUS(kva_convert(NULL, KVA_DTYPE_F32, dst, KVA_DTYPE_F16, 8), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("src");
    CHECK_STATUS(kva_convert(src, KVA_DTYPE_F32, NULL, KVA_DTYPE_F16, 8), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("dst");
    CHECK_STATUS(kva_convert(src, KVA_DTYPE_I8, dst, KVA_DTYPE_F16, 8), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("src_dtype");
    CHECK_STATUS(kva_convert(src, KVA_DTYPE_F32, dst, KVA_DTYPE_FP8_E4M3, 8),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("dst_dtype");
    CHECK_STATUS(kva_convert(src, KVA_DTYPE_F32, dst, KVA_DTYPE_U8, 8), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("dst_dtype");
    CHECK_STATUS(kva_convert(src, (kva_dtype)77, dst, KVA_DTYPE_F16, 8), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("src_dtype");
    CHECK(memcmp(dst, before, sizeof dst) == 0);
    /* n == 0 touches nothing, so NULL buffers are fine; the error is cleared. */
    CHECK_OK(kva_convert(NULL, KVA_DTYPE_F32, NULL, KVA_DTYPE_F16, 0));
    CHECK(strcmp(kva_last_error(), "") == 0);
    /* ... but an invalid dtype is reported even then. */
    CHECK_STATUS(kva_convert(NULL, KVA_DTYPE_I8, NULL, KVA_DTYPE_F16, 0), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("src_dtype");
}

int main(void)
{
    RUN(test_sizes_and_names);
    RUN(test_f16_decode_and_round_trip);
    RUN(test_bf16_decode_and_round_trip);
    RUN(test_f16_rounding_boundaries);
    RUN(test_bf16_rounding_boundaries);
    RUN(test_random_rounding);
    RUN(test_special_values);
    RUN(test_convert_pairs);
    RUN(test_convert_bad_inputs);
    return kva_test_finish();
}
