/*
 * fuzz_mla.c - api56's differential probe of MLA on the CPU (dev/, not a
 * test): random latent shapes (Dc, Dr, Dn, Dv multiples of 8 within their
 * limits, H 1..40), batches (q_len 0..9, contexts 0..300, causal or not,
 * decode_threshold 1..8, block sizes 1..64), f32 / f16 / bf16 rows or an
 * FP8 cache, both calls (kva_mla_run and the absorbed kva_attention_run),
 * the CPU backend at 1..4 threads with an MLA kernel forced at random,
 * against the reference backend's naive fp64 MLA (tests/mla_util.h data,
 * tolerances as test_api_blackbox_r15.c's).
 *   gcc -O2 -Iinclude -Isrc/core -Itests -Ibench dev/api56/fuzz_mla.c build/libkvattn.a \
 *       -fopenmp -lcrypto -lxxhash -lcjson -lm -o /tmp/api56_mla && /tmp/api56_mla CASES SEED
 */
#include "mla_util.h"

static uint64_t st = 0x9e3779b97f4a7c15ull;
static int ri(int n)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (int)(st % (uint64_t)n);
}

int main(int argc, char **argv)
{
    const int cases = argc > 1 ? atoi(argv[1]) : 100;
    if (argc > 2)
        st += (uint64_t)atoll(argv[2]) * 0x2545F4914F6CDD1Dull;
    static const char *const mk[4] = {"mla_portable", "mla_avx2", "mla_avx512", "mla_avx512bf16"};
    int bad = 0, ran = 0;
    for (int ci = 0; ci < cases; ci++) {
        mla_case c;
        memset(&c, 0, sizeof c);
        c.H = 1 + ri(ri(2) ? 8 : 40);
        c.Dc = 8 * (1 + ri(ri(3) ? 16 : 70));
        c.Dr = 8 * (1 + ri(8));
        if (c.Dc + c.Dr > 576)
            c.Dc = 576 - c.Dr;
        c.Dn = 8 * (1 + ri(24));
        if (c.Dn + c.Dr > 576)
            c.Dn = 576 - c.Dr;
        c.Dv = 8 * (1 + ri(24));
        c.B = ri(3) ? 1 + ri(16) : 64;
        c.dt = (kva_dtype)ri(3);
        c.fp8 = ri(4) == 0;
        c.causal = ri(4) != 0;
        c.thr = 1 + ri(8);
        c.R = 1 + ri(5);
        for (int r = 0; r < c.R; r++) {
            c.q_len[r] = ri(6) == 0 ? 0 : ri(2) ? 1 : 1 + ri(9);
            c.seq_len[r] = (c.causal ? c.q_len[r] : 0) + (ri(6) == 0 ? 0 : ri(ri(3) ? 40 : 300));
        }
        c.seed = (uint64_t)ci * 7919 + st % 1000;
        const int th = 1 + ri(4), kf = ri(5);
        kva_context *ctx[2] = {NULL, NULL};
        kva_context_desc d0 = {KVA_BACKEND_REF, 1, 0}, d1 = {KVA_BACKEND_CPU, th, 0};
        kva_context_create(&d0, &ctx[0]);
        kva_context_create(&d1, &ctx[1]);
        if (kf < 4)
            kva__context_force_kernel(ctx[1], mk[kf]);
        mla_data m[2];
        void *out[2][2] = {{0}};
        float *lse[2][2] = {{0}};
        const size_t es = kva_dtype_size(c.dt);
        int ok = 1;
        for (int b = 0; b < 2 && ok; b++) {
            ok = mla_data_make(ctx[b], &c, &m[b]);
            if (!ok) {
                printf("case %d setup: %s\n", ci, kva_last_error());
                break;
            }
            const size_t T = (size_t)m[b].T, Da = (size_t)(c.Dc + c.Dr);
            void *qa = malloc((T ? T : 1) * c.H * Da * es);
            kva_rng r = {c.seed + 7};
            kva_test_fill_uniform(qa, c.dt, T * c.H * Da, &r);
            for (int layer = 0; layer < 2 && ok; layer++) {
                kva_plan_desc pd = mla_plan_desc(&c, &m[b], layer);
                kva_plan *p = NULL;
                const size_t dvo = (size_t)(layer ? c.Dv : c.Dc), n = T * c.H * dvo;
                out[b][layer] = malloc(n * es + 16);
                lse[b][layer] = malloc(T * c.H * sizeof(float) + 16);
                kva_test_poison(out[b][layer], c.dt, n);
                kva_test_poison(lse[b][layer], KVA_DTYPE_F32, T * c.H);
                kva_status s = kva_plan_create(ctx[b], &pd, &p);
                if (s == KVA_STATUS_OK)
                    s = layer ? kva_mla_run(ctx[b], p, m[b].q, m[b].w_uk, m[b].w_uv, m[b].cache,
                                            out[b][layer], lse[b][layer])
                              : kva_attention_run(ctx[b], p, qa, m[b].cache, NULL, out[b][layer],
                                                  lse[b][layer]);
                if (s != KVA_STATUS_OK) {
                    printf("case %d be %d layer %d: %s %s\n", ci, b, layer, kva_status_name(s),
                           kva_last_error());
                    ok = 0;
                }
                kva_plan_destroy(p);
            }
            free(qa);
        }
        for (int layer = 0; layer < 2 && ok; layer++) {
            const size_t T = (size_t)m[0].T, dvo = (size_t)(layer ? c.Dv : c.Dc);
            const size_t rows = T * c.H, n = rows * dvo;
            const int bf16dot = c.dt == KVA_DTYPE_BF16 && !c.fp8;
            const double atol = bf16dot
                                    ? KVA_TEST_MLA_BF16DOT_ATOL
                                    : 2 * kva_test_atol(c.dt) + (c.dt != KVA_DTYPE_F32 ? 2e-3 : 0);
            const double latol = bf16dot ? KVA_TEST_MLA_BF16DOT_LSE_ATOL : 1e-4;
            char lab[256];
            snprintf(lab, sizeof lab,
                     "case %d %s H %d Dc %d Dr %d Dn %d Dv %d B %d dt %d fp8 %d causal %d thr %d "
                     "th %d kernel %d",
                     ci, layer ? "layer" : "absorbed", c.H, c.Dc, c.Dr, c.Dn, c.Dv, c.B, c.dt,
                     c.fp8, c.causal, c.thr, th, kf);
            size_t nb = kva_test_compare(lab, out[1][layer], out[0][layer], c.dt, n, atol,
                                         2 * kva_test_rtol(c.dt)) +
                        kva_test_compare_f32(lab, lse[1][layer], lse[0][layer], rows, latol, 1e-5);
            if (nb) {
                bad++;
                printf("MISMATCH %s: %zu\n", lab, nb);
            }
        }
        ran += ok;
        for (int b = 0; b < 2; b++) {
            for (int layer = 0; layer < 2; layer++) {
                free(out[b][layer]);
                free(lse[b][layer]);
            }
            if (m[b].cache || m[b].bt)
                mla_data_free(&m[b]);
            kva_context_destroy(ctx[b]);
        }
    }
    printf("ran %d, mismatches %d\n", ran, bad);
    return bad != 0;
}
