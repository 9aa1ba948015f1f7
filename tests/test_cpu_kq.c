/*
 * test_cpu_kq.c - the query digits of decode_avx512bf16's VNNI int8 key
 * scores: kva__cpu_kq_prepare_avx512 (src/attn/cpu/decode_avx512.c) against
 * the scalar definition (kq_scalar.h: the code the decode ran before it was
 * vectorised), bit for bit: the return value, and where it is 1 every digit
 * (qi), step and offsets' term (qk, compared as bits) and digit sum (qc).
 * Equal digits give equal scores, so the VNNI decode's outputs are those of
 * the scalar preparation.
 *
 * Rows: random normal rows at scales from subnormal to 3.3e38, outlier rows,
 * zero and -0 rows, one-hot rows, rows whose products fall on rounding ties
 * (x.5, rounded to even), rows at the 3.4e38f limit; with and without key
 * offsets, including offsets of +-2^60 next to small ones (a sum in another
 * order of d gives another result); head sizes that are and are not multiples
 * of 16; 1 to 17 rows (blocks of 8 rows and their tails). Rows holding inf,
 * NaN or a value above 3.4e38f must return 0. Outputs are poisoned before
 * each call, and the row after the last must stay untouched.
 */
#include "harness.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <float.h>
#include <math.h>

#if KVA_X86_SIMD

#include "kq_scalar.h"

enum { MAXM = 17, MAXD = KVA_MAX_HEAD_DIM };

/* Outputs of one call, one spare row past M (must stay as poisoned). */
typedef struct kq_out {
    int8_t qi[(MAXM + 1) * 3 * MAXD];
    float qk[(MAXM + 1) * 2];
    int32_t qc[(MAXM + 1) * 4];
} kq_out;

static void poison(kq_out *o)
{
    memset(o->qi, 0x5a, sizeof(o->qi));
    memset(o->qk, 0xff, sizeof(o->qk)); /* NaN bits */
    memset(o->qc, 0x7b, sizeof(o->qc));
}

static int checked, ties_seen;

/* Runs both on q [M, D] and compares; label names the case. */
static void compare(const char *label, const float *q, int32_t M, int32_t D, const float *koff,
                    int want_ok)
{
    static kq_out v, s, p;
    poison(&v);
    poison(&s);
    poison(&p);
    const int rv = kva__cpu_kq_prepare_avx512(q, M, D, koff, v.qi, v.qk, v.qc);
    const int rs = kq_prepare_scalar(q, M, D, koff, s.qi, s.qk, s.qc);
    checked++;
    CHECK_MSG(rv == rs && rs == want_ok, "%s M %d D %d: returned %d, scalar %d, expected %d", label,
              (int)M, (int)D, rv, rs, want_ok);
    if (rv != 1 || rs != 1)
        return;
    for (int32_t m = 0; m < M; m++) {
        for (int32_t i = 0; i < 3 * D; i++) {
            const size_t at = (size_t)m * 3 * D + (size_t)i;
            if (v.qi[at] != s.qi[at]) {
                CHECK_MSG(0, "%s M %d D %d: row %d digit %d of dim %d: %d, scalar %d", label,
                          (int)M, (int)D, (int)m, (int)(i / D), (int)(i % D), v.qi[at], s.qi[at]);
                break;
            }
        }
        CHECK_MSG(!memcmp(v.qk + 2 * m, s.qk + 2 * m, 2 * sizeof(float)),
                  "%s M %d D %d: row %d step, offsets' term %a %a, scalar %a %a", label, (int)M,
                  (int)D, (int)m, v.qk[2 * m], v.qk[2 * m + 1], s.qk[2 * m], s.qk[2 * m + 1]);
        CHECK_MSG(!memcmp(v.qc + 4 * m, s.qc + 4 * m, 4 * sizeof(int32_t)),
                  "%s M %d D %d: row %d digit sums %d %d %d %d, scalar %d %d %d %d", label, (int)M,
                  (int)D, (int)m, v.qc[4 * m], v.qc[4 * m + 1], v.qc[4 * m + 2], v.qc[4 * m + 3],
                  s.qc[4 * m], s.qc[4 * m + 1], s.qc[4 * m + 2], s.qc[4 * m + 3]);
    }
    /* Nothing written past row M - 1, nor past 3 * D digits of a row. */
    CHECK_MSG(!memcmp(v.qi + (size_t)M * 3 * D, p.qi + (size_t)M * 3 * D, (size_t)3 * D) &&
                  !memcmp(v.qk + 2 * M, p.qk + 2 * M, 2 * sizeof(float)) &&
                  !memcmp(v.qc + 4 * M, p.qc + 4 * M, 4 * sizeof(int32_t)),
              "%s M %d D %d: the row after the last was written", label, (int)M, (int)D);
}

/* Row kinds of the random cases. */
enum {
    ROW_NORMAL,
    ROW_SMALL,
    ROW_HUGE,
    ROW_SUBNORMAL,
    ROW_OUTLIER,
    ROW_ZERO,
    ROW_NEGZERO,
    ROW_ONEHOT,
    ROW_TIES,
    ROW_LIMIT,
    ROW_KINDS
};

static void fill_row(float *r, int32_t D, int kind, kva_rng *rng)
{
    for (int32_t d = 0; d < D; d++)
        r[d] = (float)kva_rng_normal(rng);
    switch (kind) {
    case ROW_SMALL:
        for (int32_t d = 0; d < D; d++)
            r[d] *= 1e-3f;
        break;
    case ROW_HUGE: /* up to 3.3e38 */
        for (int32_t d = 0; d < D; d++)
            r[d] = (float)((kva_rng_unit(rng) * 2.0 - 1.0) * 3.3e38);
        break;
    case ROW_SUBNORMAL: /* |x| < 2^-126: amax subnormal, 2^22 / amax past float */
        for (int32_t d = 0; d < D; d++)
            r[d] = (float)((kva_rng_unit(rng) * 2.0 - 1.0) * 0x1p-130);
        break;
    case ROW_OUTLIER:
        r[kva_rng_int(rng, 0, D - 1)] *= 1e6f;
        break;
    case ROW_ZERO:
        memset(r, 0, sizeof(float) * (size_t)D);
        break;
    case ROW_NEGZERO:
        for (int32_t d = 0; d < D; d++)
            r[d] = -0.0f;
        break;
    case ROW_ONEHOT:
        memset(r, 0, sizeof(float) * (size_t)D);
        r[kva_rng_int(rng, 0, D - 1)] = (float)kva_rng_normal(rng) + 3.0f;
        break;
    case ROW_TIES: /* amax 2^22: the products are q itself, many at x.5 */
        for (int32_t d = 0; d < D; d++)
            r[d] = (float)kva_rng_int(rng, -4096, 4096) + 0.5f;
        r[kva_rng_int(rng, 0, D - 1)] = kva_rng_int(rng, 0, 1) ? 0x1p22f : -0x1p22f;
        ties_seen++;
        break;
    case ROW_LIMIT: /* the largest |q| that keeps the VNNI scores */
        r[kva_rng_int(rng, 0, D - 1)] = kva_rng_int(rng, 0, 1) ? 3.4e38f : -3.4e38f;
        break;
    default:
        break;
    }
}

/* Random rows of every kind, head sizes, row counts, with and without
 * offsets. */
static void test_kq_random(void)
{
    kva_rng rng = {20261128};
    static float q[MAXM * MAXD], koff[MAXD];
    const int32_t Ds[] = {4, 12, 20, 64, 100, 128, 256, 576};
    const int32_t Ms[] = {1, 2, 3, 4, 7, 8, 9, 16, 17};
    char label[64];
    for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++)
        for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++)
            for (int rep = 0; rep < 4; rep++) {
                const int32_t D = Ds[di], M = Ms[mi];
                for (int32_t m = 0; m < M; m++)
                    fill_row(q + (size_t)m * D, D, (m + rep) % ROW_KINDS, &rng);
                for (int32_t d = 0; d < D; d++)
                    koff[d] = (float)kva_rng_normal(&rng) * (rep == 3 ? 1e20f : 1.0f);
                snprintf(label, sizeof(label), "random %d", rep);
                compare(label, q, M, D, NULL, 1);
                snprintf(label, sizeof(label), "random %d, offsets", rep);
                compare(label, q, M, D, koff, 1);
            }
}

/* Offsets of +2^60, -2^60 and small ones side by side, over rows whose dims
 * d and d + 2 (d % 4 == 0) are equal, so that the large products cancel in
 * pairs: in the scalar's order (d ascending) each small product at d % 4 == 1
 * is lost next to n_d 2^60 and each at d % 4 == 3 is kept; in another order
 * others are lost, and the float term differs. */
static void test_kq_offsets_order(void)
{
    kva_rng rng = {77};
    static float q[MAXM * MAXD], koff[MAXD];
    const int32_t Ds[] = {16, 64, 128};
    for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++) {
        const int32_t D = Ds[di], M = 9;
        for (int32_t d = 0; d < D; d++)
            koff[d] = d % 4 == 0 ? 0x1p60f : d % 4 == 2 ? -0x1p60f : (float)(d + 1);
        for (int32_t m = 0; m < M; m++) {
            float *r = q + (size_t)m * D;
            fill_row(r, D, ROW_NORMAL, &rng);
            for (int32_t d = 0; d < D; d += 4)
                r[d + 2] = r[d];
        }
        compare("offsets 2^60 and small", q, M, D, koff, 1);
    }
}

/* Rows that must go to the fp32 scores: inf, -inf, NaN, -NaN, values just
 * above 3.4e38f and FLT_MAX, placed in the first row's first dim, a middle
 * dim, or the last row's last dim (a tail lane where D % 16 != 0). */
static void test_kq_nonfinite(void)
{
    kva_rng rng = {5};
    static float q[MAXM * MAXD];
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN, nextafterf(3.4e38f, INFINITY),
                         -FLT_MAX, FLT_MAX};
    const int32_t Ds[] = {4, 12, 128};
    const int32_t Ms[] = {1, 4, 9};
    for (size_t di = 0; di < sizeof(Ds) / sizeof(Ds[0]); di++)
        for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++)
            for (size_t bi = 0; bi < sizeof(bad) / sizeof(bad[0]); bi++)
                for (int where = 0; where < 3; where++) {
                    const int32_t D = Ds[di], M = Ms[mi];
                    for (int32_t m = 0; m < M; m++)
                        fill_row(q + (size_t)m * D, D, m % ROW_KINDS, &rng);
                    const size_t at = where == 0   ? 0
                                      : where == 1 ? (size_t)(M / 2) * D + (size_t)D / 2
                                                   : (size_t)M * D - 1;
                    q[at] = bad[bi];
                    compare("non-finite", q, M, D, NULL, 0);
                }
    /* 3.4e38f itself still takes the VNNI path. */
    for (int32_t d = 0; d < 12; d++)
        q[d] = (float)d;
    q[5] = -3.4e38f;
    compare("at 3.4e38f", q, 1, 12, NULL, 1);
}

#endif /* KVA_X86_SIMD */

int main(void)
{
#if KVA_X86_SIMD
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) {
        printf("  no AVX-512 on this CPU: kva__cpu_kq_prepare_avx512 not run\n");
        return kva_test_finish();
    }
    RUN(test_kq_random);
    RUN(test_kq_offsets_order);
    RUN(test_kq_nonfinite);
    printf("  %d calls compared (%d rows of rounding ties)\n", checked, ties_seen);
#else
    printf("  no x86-64 SIMD kernels in this build\n");
#endif
    return kva_test_finish();
}
