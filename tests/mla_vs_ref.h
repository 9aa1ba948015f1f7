/*
 * mla_vs_ref.h - one MLA case (mla_util.h's mla_case) run by the black-box
 * tests on the reference and on the CPU backend, both calls (kva_mla_run and
 * the absorbed kva_attention_run), outputs poisoned, the CPU's compared with
 * the reference's (test_api_blackbox_r15.c, test_api_blackbox_r16_edges.c).
 */
#ifndef KVA_TEST_MLA_VS_REF_H
#define KVA_TEST_MLA_VS_REF_H

#include "cache_util.h"
#include "mla_util.h"

/* Runs case c on the reference and on the CPU backend (threads th), both
 * calls, outputs poisoned, and compares the CPU's with the reference's. */
static inline void mla_case_vs_ref(const mla_case *c, int32_t th, const char *tag)
{
    kva_context *ctx[2] = {new_ctx(KVA_BACKEND_REF, 1), new_ctx(KVA_BACKEND_CPU, th)};
    mla_data m[2];
    void *out[2][2] = {{0}};
    float *lse[2][2] = {{0}};
    const size_t es = kva_dtype_size(c->dt);
    int ok = 1;
    for (int b = 0; b < 2 && ok; b++) {
        ok = mla_data_make(ctx[b], c, &m[b]);
        CHECK_MSG(ok, "%s: setup: %s", tag, kva_last_error());
        if (!ok)
            break;
        const size_t T = (size_t)m[b].T, Da = (size_t)(c->Dc + c->Dr);
        void *qa = malloc((T ? T : 1) * c->H * Da * es);
        kva_rng r = {c->seed + 7};
        kva_test_fill_uniform(qa, c->dt, T * c->H * Da, &r);
        for (int layer = 0; layer < 2 && ok; layer++) {
            kva_plan_desc pd = mla_plan_desc(c, &m[b], layer);
            kva_plan *p = NULL;
            const size_t dvo = (size_t)(layer ? c->Dv : c->Dc), n = T * c->H * dvo;
            out[b][layer] = malloc(n * es + 16);
            lse[b][layer] = malloc(T * c->H * sizeof(float) + 16);
            kva_test_poison(out[b][layer], c->dt, n);
            kva_test_poison(lse[b][layer], KVA_DTYPE_F32, T * c->H);
            kva_status st = kva_plan_create(ctx[b], &pd, &p);
            if (st == KVA_STATUS_OK)
                st = layer ? kva_mla_run(ctx[b], p, m[b].q, m[b].w_uk, m[b].w_uv, m[b].cache,
                                         out[b][layer], lse[b][layer])
                           : kva_attention_run(ctx[b], p, qa, m[b].cache, NULL, out[b][layer],
                                               lse[b][layer]);
            CHECK_MSG(st == KVA_STATUS_OK, "%s %s %s: %s", tag, kva_backend_name(kBk[b]),
                      layer ? "kva_mla_run" : "absorbed", kva_last_error());
            ok = st == KVA_STATUS_OK;
            kva_plan_destroy(p);
        }
        free(qa);
    }
    for (int layer = 0; layer < 2 && ok; layer++) {
        const size_t T = (size_t)m[0].T, dvo = (size_t)(layer ? c->Dv : c->Dc);
        const size_t rows = T * c->H, n = rows * dvo;
        const int bf16dot = c->dt == KVA_DTYPE_BF16 && !c->fp8;
        const double atol = bf16dot
                                ? KVA_TEST_MLA_BF16DOT_ATOL
                                : 2 * kva_test_atol(c->dt) + (c->dt != KVA_DTYPE_F32 ? 2e-3 : 0);
        const double latol = bf16dot ? KVA_TEST_MLA_BF16DOT_LSE_ATOL : 1e-4;
        char lab[200];
        snprintf(lab, sizeof lab, "%s %s", tag, layer ? "kva_mla_run" : "absorbed");
        const size_t bad =
            kva_test_compare(lab, out[1][layer], out[0][layer], c->dt, n, atol,
                             2 * kva_test_rtol(c->dt)) +
            kva_test_compare_f32(lab, lse[1][layer], lse[0][layer], rows, latol, 1e-5);
        CHECK_MSG(bad == 0, "%s: %zu elements differ from the reference", lab, bad);
        CHECK_MSG(kva_test_count_poisoned(out[0][layer], c->dt, n) == 0, "%s: ref left rows", lab);
    }
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

#endif
