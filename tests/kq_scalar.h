/*
 * kq_scalar.h - the scalar definition of the VNNI int8 key scores' query
 * digits (src/attn/cpu/cpu_attn.h, kva__cpu_kq_prepare_avx512): the
 * decode's kq_prepare (decode_loop.c) as it was before it was vectorised, on
 * plain arrays. tests/test_cpu_kq.c compares the library's AVX-512 version
 * with it bit for bit; dev/kq62/kq_bench.c times both.
 */
#ifndef KVA_TEST_KQ_SCALAR_H
#define KVA_TEST_KQ_SCALAR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* q [M, D]; koff [D] or NULL; qi [M, 3, D], qk [M, 2], qc [M, 4]. */
static int kq_prepare_scalar(const float *q, int32_t M, int32_t D, const float *koff, int8_t *qi,
                             float *qk, int32_t *qc)
{
    int bad = 0;
    for (int32_t m = 0; m < M; m++) {
        const float *qm = q + (size_t)m * D;
        float mx[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int32_t d = 0; d < D; d += 4)
            for (int i = 0; i < 4; i++) {
                const float a = fabsf(qm[d + i]);
                mx[i] = a > mx[i] ? a : mx[i];
                bad |= !(a <= 3.4e38f);
            }
        const float m01 = mx[0] > mx[1] ? mx[0] : mx[1], m23 = mx[2] > mx[3] ? mx[2] : mx[3];
        qk[2 * m] = m01 > m23 ? m01 : m23;
    }
    if (bad)
        return 0;
    for (int32_t m = 0; m < M; m++) {
        const float *qm = q + (size_t)m * D;
        int8_t *qd = qi + (size_t)m * 3 * D;
        const float amax = qk[2 * m];
        const float step = amax * 0x1p-22f;
        const double inv = amax > 0.0f ? 0x1p22 / amax : 0.0;
        int32_t sum[3] = {0, 0, 0};
        double off = 0.0;
        for (int32_t d = 0; d < D; d++) {
            /* Adding and removing 1.5 x 2^52 rounds |x| <= 2^22 to the
             * nearest integer in the current rounding mode, as lrint does;
             * built without FMA flags (as decode_loop.c was), so x is
             * rounded to double before the addition. */
            const double x = qm[d] * inv;
            int32_t n = (int32_t)((x + 0x1.8p52) - 0x1.8p52);
            n = n > (1 << 22) ? 1 << 22 : n < -(1 << 22) ? -(1 << 22) : n;
            const int32_t c = ((n + 128) & 255) - 128, n1 = (n - c) / 256;
            const int32_t b = ((n1 + 128) & 255) - 128, a = (n1 - b) / 256;
            qd[d] = (int8_t)a;
            qd[D + d] = (int8_t)b;
            qd[2 * D + d] = (int8_t)c;
            sum[0] += a, sum[1] += b, sum[2] += c;
            if (koff)
                off += (double)n * koff[d];
        }
        qk[2 * m] = step;
        qk[2 * m + 1] = (float)off;
        for (int p = 0; p < 3; p++)
            qc[4 * m + p] = 128 * sum[p];
        qc[4 * m + 3] = 0;
    }
    return 1;
}

#endif /* KVA_TEST_KQ_SCALAR_H */
