/*
 * dev/sp18/cvt_check.c - exhaustive host check of the short e4m3 -> bf16
 * conversion that dev/sp18 tried on the sparse MLA decode's 16-row items
 * (branch sp18-cheap), and of the exactness conditions of the factors it
 * must fold back in.
 *
 * The short form: for a 32-bit word x of 4 e4m3 codes b0..b3 (b0 lowest),
 *   lo = (int32)(prmt(x, 0, 0x1804)) >> 4 & 0x87f087f0   (codes b0, b1)
 *   hi = (int32)(prmt(x, 0, 0x3A24)) >> 4 & 0x87f087f0   (codes b2, b3)
 * (prmt: PTX's default mode; selector nibble 8 + i replicates byte i's sign
 * bit) moves each code's sign to bit 15 and its 7 exponent/mantissa bits to
 * bits 4..10 of a bf16: the bf16 of code * 2^-120 (e4m3's exponent bias is
 * 7, bf16's 127; e4m3 subnormals land on bf16 subnormals). Three integer
 * instructions per 2 codes against today's four (cvt to f16x2, two f16 ->
 * f32, one f32x2 -> bf16x2 pack).
 *
 * Checked here, exhaustively:
 *   1. all 65536 code pairs (so all 256 codes in both halves): the short
 *      form's bf16 bits equal the bf16 encoding of code * 2^-120 exactly,
 *      for the 254 non-NaN codes; the two NaN codes (0x7f, 0xff) become
 *      +-480 * 2^-120, which is why kvattn's fp8 writer (satfinite, never
 *      NaN) is a precondition;
 *   2. the Q fold: q' = q * 2^120 is exact for every finite bf16 q with
 *      |q| < 256 (all 65536 bf16 patterns tried), and q' * c' == q * c in
 *      exact arithmetic for every such q and every code c (so the tensor
 *      core sees the same products: S is unchanged) - and q' overflows for
 *      every |q| >= 256;
 *   3. the P fold: bf16(fl32(p * (kv * 2^120))) == 2^120 * bf16(fl32(p * kv))
 *      over a spread of p in {0} u [2^-126, 1] and tile scales kv; it fails
 *      exactly where fl32(p * kv) is a float32 subnormal (today's P rounds
 *      on bf16's subnormal grid there, or is 0), and where kv * 2^120 * p overflows
 *      bf16 (kv >= 2^8); counted and printed.
 * Exit status 0 when 1 and 2 hold everywhere and 3's failures are exactly
 * the predicted ones.
 *
 *   cc -O2 -o /tmp/cvt_check dev/sp18/cvt_check.c -lm && /tmp/cvt_check
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* PTX prmt.b32 default mode. */
static uint32_t prmt(uint32_t a, uint32_t b, uint32_t s)
{
    uint8_t src[8];
    for (int i = 0; i < 4; i++) {
        src[i] = (uint8_t)(a >> (8 * i));
        src[4 + i] = (uint8_t)(b >> (8 * i));
    }
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) {
        const uint32_t sel = (s >> (4 * n)) & 0xf;
        uint8_t v = src[sel & 7];
        if (sel & 8)
            v = (v & 0x80) ? 0xff : 0x00;
        r |= (uint32_t)v << (8 * n);
    }
    return r;
}
static uint32_t short_lo(uint32_t x)
{
    return (uint32_t)((int32_t)prmt(x, 0, 0x1804) >> 4) & 0x87f087f0u;
}
static uint32_t short_hi(uint32_t x)
{
    return (uint32_t)((int32_t)prmt(x, 0, 0x3A24) >> 4) & 0x87f087f0u;
}

/* e4m3 code -> its value (NaN for 0x7f / 0xff). */
static double e4m3(uint8_t c)
{
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}
/* bf16 bits -> value (exact). */
static double bf16v(uint16_t h)
{
    const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255)
        v = m ? NAN : INFINITY;
    else
        v = e ? ldexp(1.0 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
    return s ? -v : v;
}
/* float -> bf16 round to nearest even (cvt.rn.bf16.f32, subnormals kept). */
static uint16_t bf16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

int main(void)
{
    int bad = 0;
    /* 1. the short form over every code pair, in both positions. */
    long n1 = 0, nan1 = 0;
    for (uint32_t pair = 0; pair < 65536; pair++) {
        const uint32_t x = pair | (pair << 16);
        const uint32_t w[2] = {short_lo(x), short_hi(x)};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 2; i++) {
                const uint8_t c = (uint8_t)(pair >> (8 * i));
                const uint16_t got = (uint16_t)(w[k] >> (16 * i));
                const double want = e4m3(c);
                if (isnan(want)) {
                    nan1 += bf16v(got) == (c & 0x80 ? -480.0 : 480.0) * ldexp(1, -120) ? 1 : 0;
                    continue;
                }
                n1++;
                if (bf16v(got) != ldexp(want, -120) || (want == 0 && (got & 0x8000) != (c & 0x80) << 8))
                    bad++, printf("1: code %02x -> %04x (%g), want %g\n", c, got, bf16v(got), want);
            }
    }
    printf("1. short form: %ld code positions exact (code * 2^-120, signed zeros kept); "
           "NaN codes -> +-480 * 2^-120 in %ld of %ld positions\n",
           n1, nan1, 65536L * 4 - n1);
    /* 2. the Q fold. */
    long n2 = 0, ovf2 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const double q = bf16v((uint16_t)h);
        if (!isfinite(q))
            continue;
        float qf;
        const uint32_t u = h << 16;
        memcpy(&qf, &u, 4);
        const float qs = qf * 0x1p120f; /* the kernel's fold, in float32 */
        const uint16_t qb = bf16_rn(qs);
        if (fabs(q) >= 256) {
            ovf2 += isinf(bf16v(qb)) ? 1 : 0;
            continue;
        }
        if (bf16v(qb) != ldexp(q, 120))
            bad++, printf("2: q %04x not exact\n", h);
        for (int c = 0; c < 256; c++) {
            const double v = e4m3((uint8_t)c);
            if (isnan(v))
                continue;
            /* exact in double: 8 x 4 significant bits */
            if (bf16v(qb) * ldexp(v, -120) != q * v)
                bad++, printf("2: q %04x code %02x product differs\n", h, c);
        }
        n2++;
    }
    printf("2. Q fold: %ld finite bf16 q with |q| < 256 exact and every product with the 254 codes "
           "unchanged; %ld with |q| >= 256 overflow (the guard's other side)\n",
           n2, ovf2);
    /* 3. the P fold over a spread of p and kv. */
    long n3 = 0, sub3 = 0, ovf3 = 0, other3 = 0;
    for (int ke = -40; ke <= 12; ke++)
        for (int km = 0; km < 16; km++) {
            const float kv = ldexpf(1.f + km / 16.f + km * 0x1p-20f, ke);
            for (int pe = -126; pe <= 0; pe++)
                for (int pm = 0; pm < 24; pm++) {
                    float p = pm == 23 ? 0.f : ldexpf(1.f + pm / 23.f, pe);
                    if (p > 1.f)
                        p = 1.f;
                    const float y = p * kv;                 /* today's */
                    const float ys = p * (kv * 0x1p120f);   /* the fold */
                    const double want = ldexp(bf16v(bf16_rn(y)), 120);
                    const double got = bf16v(bf16_rn(ys));
                    n3++;
                    const int sub = p != 0.f && fabsf(y) < 0x1p-126f; /* subnormal or flushed to 0 */
                    const int ovf = isinf(got) || isinf(kv * 0x1p120f);
                    if (got == want && !sub)
                        continue;
                    if (sub)
                        sub3++;
                    else if (ovf)
                        ovf3++;
                    else
                        other3++, bad++, (other3 < 6 ? printf("3: p %a kv %a y %a got %g want %g\n", p, kv, y, got, want) : 0);
                }
        }
    printf("3. P fold: %ld (p, kv) pairs; differs only where fl(p kv) underflows (subnormal or 0, "
           "p > 0): %ld, or where it overflows (kv >= 2^8): %ld; elsewhere: %ld\n",
           n3, sub3, ovf3, other3);
    printf("%s\n", bad ? "FAILED" : "ok");
    return bad != 0;
}
