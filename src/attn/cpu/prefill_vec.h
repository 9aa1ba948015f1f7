/*
 * prefill_vec.h - the elementwise functions of the tiled prefill kernels
 * (prefill_tiled.inc) written once over an ISA's vector traits: included at
 * the end of prefill_avx2.c's and prefill_avx512.h's trait definitions, which
 * define besides prefill_tiled.inc's list:
 *   pf_m             a lane mask
 *   pf_lt(a, b)      lanes with a < b (false for NaN); pf_nlt(a, b) its
 *                    complement (true for NaN)
 *   pf_clear(m, x)   x with the lanes of m set to 0
 *   pf_fnmadd(a, b, c) c - a*b; pf_round(x) nearest integer; pf_div pf_and
 *                    pf_or pf_andnot(a, b) = ~a & b
 *   pf_exp2i(n)      2^n built in the exponent field (n integer, >= -126)
 *   pf_scale2_keep(keep, p, n) p * 2^n in the lanes of keep, 0 elsewhere
 */
#ifndef KVA_PREFILL_VEC_H
#define KVA_PREFILL_VEC_H

/* e^x for x <= 0: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial
 * (1 + r + r^2 (1/2 + r/6 + ...), coefficients of the classic Cephes expf),
 * times 2^n built in the exponent field. x < -87.3 (e^x below the normal
 * range) and -inf give exactly 0; NaN stays NaN (the clamp keeps it:
 * vmaxps returns its second operand when either is NaN). */
static inline pf_v pf_exp(pf_v x)
{
    const pf_v lim = pf_set1(-87.3f);
    const pf_m tiny = pf_lt(x, lim);
    x = pf_maxskip(lim, x);
    const pf_v n = pf_round(pf_mul(x, pf_set1(1.44269504088896341f)));
    pf_v r = pf_fnmadd(n, pf_set1(0.693359375f), x);
    r = pf_fnmadd(n, pf_set1(-2.12194440e-4f), r);
    pf_v p = pf_set1(1.9875691500e-4f);
    p = pf_fma(p, r, pf_set1(1.3981999507e-3f));
    p = pf_fma(p, r, pf_set1(8.3334519073e-3f));
    p = pf_fma(p, r, pf_set1(4.1665795894e-2f));
    p = pf_fma(p, r, pf_set1(1.6666665459e-1f));
    p = pf_fma(p, r, pf_set1(5.0000001201e-1f));
    p = pf_fma(p, pf_mul(r, r), pf_add(r, pf_set1(1.0f)));
    return pf_clear(tiny, pf_mul(p, pf_exp2i(n)));
}

/* 2^x for x <= 0 (the softmax runs in base 2: scores are scaled by log2 e):
 * n = round(x), f = x - n in [-1/2, 1/2] (exact), 2^f by a degree-6
 * polynomial (Chebyshev-node fit, max relative error 8e-8), times 2^n
 * (pf_scale2_keep: vscalefps on AVX-512, the exponent field on AVX2).
 * x < -126 (2^x below the normal range) and -inf give exactly 0; NaN stays
 * NaN. */
static inline pf_v pf_exp2(pf_v x)
{
    const pf_m keep = pf_nlt(x, pf_set1(-126.0f));
    const pf_v n = pf_round(x);
    const pf_v f = pf_sub(x, n);
    pf_v p = pf_set1(1.5461444855e-4f);
    p = pf_fma(p, f, pf_set1(1.3400427997e-3f));
    p = pf_fma(p, f, pf_set1(9.6180569381e-3f));
    p = pf_fma(p, f, pf_set1(5.5503271520e-2f));
    p = pf_fma(p, f, pf_set1(2.4022650719e-1f));
    p = pf_fma(p, f, pf_set1(6.9314718246e-1f));
    p = pf_fma(p, f, pf_set1(1.0f));
    return pf_scale2_keep(keep, p, n);
}

/* tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|); +-inf -> +-1, NaN -> NaN. */
static inline pf_v pf_tanh(pf_v x)
{
    const pf_v sign = pf_set1(-0.0f);
    const pf_v ax = pf_andnot(sign, x);
    const pf_v e = pf_exp(pf_mul(ax, pf_set1(-2.0f)));
    const pf_v one = pf_set1(1.0f);
    const pf_v t = pf_div(pf_sub(one, e), pf_add(one, e));
    return pf_or(t, pf_and(sign, x));
}

#endif /* KVA_PREFILL_VEC_H */
