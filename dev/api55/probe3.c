/* probe3: MLA at q_len 1-4 and contexts 0 / 1 / block edges, CPU vs ref. */
#include "harness.h"
#include "mla_util.h"

static int run_case(const mla_case *c, const char *tag)
{
    kva_context *ctx[2];
    kva_context_desc d0 = {KVA_BACKEND_REF, 0, 0}, d1 = {KVA_BACKEND_CPU, 2, 0};
    kva_context_create(&d0, &ctx[0]); kva_context_create(&d1, &ctx[1]);
    mla_data m[2];
    int bad = 0;
    void *out[2][2]; float *lse[2][2];
    const size_t rows = 0;
    (void)rows;
    for (int b = 0; b < 2; b++) {
        if (!mla_data_make(ctx[b], c, &m[b])) { printf("%s setup fail %s\n", tag, kva_last_error()); return 1; }
        const size_t T = (size_t)m[b].T, es = kva_dtype_size(c->dt);
        for (int layer = 0; layer < 2; layer++) {
            kva_plan_desc pd = mla_plan_desc(c, &m[b], layer);
            kva_plan *p;
            kva_status st = kva_plan_create(ctx[b], &pd, &p);
            if (st) { printf("%s plan %s\n", tag, kva_last_error()); return 1; }
            const int32_t dvo = layer ? c->Dv : c->Dc;
            out[b][layer] = malloc(T * c->H * dvo * es + 16);
            lse[b][layer] = malloc(T * c->H * 4 + 16);
            kva_test_poison(out[b][layer], c->dt, T * c->H * dvo);
            kva_test_poison(lse[b][layer], KVA_DTYPE_F32, T * c->H);
            if (layer) st = kva_mla_run(ctx[b], p, m[b].q, m[b].w_uk, m[b].w_uv, m[b].cache, out[b][layer], lse[b][layer]);
            else {
                /* absorbed: q of Dc + Dr per head, made from the same random source */
                void *qa = malloc(T * c->H * (c->Dc + c->Dr) * es + 16);
                kva_rng r = {c->seed + 7};
                kva_test_fill_uniform(qa, c->dt, T * c->H * (c->Dc + c->Dr), &r);
                st = kva_attention_run(ctx[b], p, qa, m[b].cache, NULL, out[b][layer], lse[b][layer]);
                free(qa);
            }
            if (st) { printf("%s run %d: %s\n", tag, layer, kva_last_error()); bad++; }
            kva_plan_destroy(p);
        }
    }
    for (int layer = 0; layer < 2; layer++) {
        const size_t T = (size_t)m[0].T, dvo = layer ? c->Dv : c->Dc, n = T * c->H * dvo;
        size_t pz = kva_test_count_poisoned(out[1][layer], c->dt, n) + kva_test_count_poisoned(lse[1][layer], KVA_DTYPE_F32, T * c->H);
        int bf = c->dt == KVA_DTYPE_BF16 && !c->fp8;
        double atol = bf ? KVA_TEST_MLA_BF16DOT_ATOL : 2 * kva_test_atol(c->dt) + (c->dt != KVA_DTYPE_F32 ? 2e-3 : 0);
        double latol = bf ? KVA_TEST_MLA_BF16DOT_LSE_ATOL : 1e-4;
        char lab[200]; snprintf(lab, sizeof lab, "%s %s", tag, layer ? "mla_run" : "absorbed");
        size_t b1 = kva_test_compare(lab, out[1][layer], out[0][layer], c->dt, n, atol, 2 * kva_test_rtol(c->dt));
        size_t b2 = kva_test_compare_f32(lab, lse[1][layer], lse[0][layer], T * c->H, latol, 1e-5);
        if (b1 || b2 || pz) { printf("%s %s: out bad %zu lse bad %zu poisoned %zu\n", tag, lab, b1, b2, pz); bad++; }
        for (int b = 0; b < 2; b++) { free(out[b][layer]); free(lse[b][layer]); }
    }
    for (int b = 0; b < 2; b++) { mla_data_free(&m[b]); kva_context_destroy(ctx[b]); }
    return bad;
}

int main(void)
{
    int bad = 0, n = 0;
    const int32_t Bs[2] = {4, 16};
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_F16};
    for (int bi = 0; bi < 2; bi++)
        for (int ql = 1; ql <= 4; ql++)
            for (int ci = 0; ci < 6; ci++) {
                const int32_t B = Bs[bi];
                const int32_t ctxs[6] = {0, 1, B - 1, B, B + 1, 2 * B};
                const int32_t cl = ctxs[ci];
                for (int v = 0; v < 3; v++) {
                    const int32_t H = v == 0 ? 1 : v == 1 ? 3 : 16;
                    const kva_dtype dt = dts[(ql + ci + v) % 3];
                    const int fp8 = (ql + ci + bi) % 4 == 0;
                    for (int thr = 1; thr <= 4; thr += 3) {
                        int32_t qls[3] = {ql, 1, ql}, sls[3] = {cl + ql, cl + 1, ql + (ci == 0 ? 0 : 2 * B - 1)};
                        mla_case c = mla_case_of(H, 64, 16, 32, 24, B, dt, 1, thr, 3, qls, sls, 1000 + n);
                        c.fp8 = fp8;
                        char tag[160];
                        snprintf(tag, sizeof tag, "B%d q%d ctx%d H%d %s%s thr%d", B, ql, cl, H, kva_dtype_name(dt), fp8 ? " fp8" : "", thr);
                        bad += run_case(&c, tag);
                        n++;
                    }
                }
            }
    /* non-causal with seq_len 0 and q_len > seq_len */
    for (int ql = 1; ql <= 4; ql++)
        for (int sl = 0; sl <= 5; sl += (sl == 0 ? 1 : 4)) {
            int32_t qls[2] = {ql, 1}, sls[2] = {sl, 0};
            mla_case c = mla_case_of(3, 64, 16, 32, 24, 4, KVA_DTYPE_F32, 0, ql % 2 ? 1 : 4, 2, qls, sls, 77 + n);
            char tag[160]; snprintf(tag, sizeof tag, "noncausal q%d s%d", ql, sl);
            bad += run_case(&c, tag); n++;
        }
    printf("%d cases, %d bad\n", n, bad);
    return bad != 0;
}
