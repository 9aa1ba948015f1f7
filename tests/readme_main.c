/*
 * readme_main.c - compiles the C example of README.md (extracted at configure
 * time into the build tree as readme_example.c) and checks what it computes,
 * so the README's example cannot drift from the API.
 *
 * The example writes 9 new tokens (1 decode token of request 0, 8 prefill
 * tokens of request 1) and runs attention. Request 0's 40 context tokens were
 * never written here, so only request 1's rows (tokens 1..8) are checked,
 * against a dense causal attention computed in double from the same inputs.
 */
#include "harness.h"

#include "readme_example.c"

enum { T = 9, H = 8, HKV = 2, D = 128 };

static void test_readme_example(void)
{
    static uint16_t q[T * H * D], k[T * HKV * D], v[T * HKV * D], out[T * H * D];
    kva_rng rng = {2024};
    kva_test_fill(q, KVA_DTYPE_BF16, T * H * D, &rng, 1.0);
    kva_test_fill(k, KVA_DTYPE_BF16, T * HKV * D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_BF16, T * HKV * D, &rng, 1.0);
    kva_test_poison(out, KVA_DTYPE_BF16, T * H * D);
    CHECK(step(q, k, v, out) == 0);

    /* Request 1: tokens 1..8, causal over its own 8 keys (rows 1..8 of k, v). */
    static uint16_t want[8 * H * D];
    double scale = 1.0 / sqrt((double)D);
    for (int i = 0; i < 8; i++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / HKV);
            double s[8], m = -INFINITY, den = 0;
            for (int j = 0; j <= i; j++) {
                double dot = 0;
                for (int c = 0; c < D; c++)
                    dot += kva_test_get(q, KVA_DTYPE_BF16, ((size_t)(1 + i) * H + h) * D + c) *
                           kva_test_get(k, KVA_DTYPE_BF16, ((size_t)(1 + j) * HKV + g) * D + c);
                s[j] = dot * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j <= i; j++)
                den += exp(s[j] - m);
            for (int c = 0; c < D; c++) {
                double acc = 0;
                for (int j = 0; j <= i; j++)
                    acc += exp(s[j] - m) *
                           kva_test_get(v, KVA_DTYPE_BF16, ((size_t)(1 + j) * HKV + g) * D + c);
                want[((size_t)i * H + h) * D + c] = kva_f32_to_bf16((float)(acc / den));
            }
        }
    CHECK(kva_test_compare("readme request 1", out + H * D, want, KVA_DTYPE_BF16, 8 * H * D,
                           kva_test_atol(KVA_DTYPE_BF16), kva_test_rtol(KVA_DTYPE_BF16)) == 0);
}

int main(void)
{
    RUN(test_readme_example);
    return kva_test_finish();
}
