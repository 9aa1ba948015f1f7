/* probe7: sparse MLA at q_len 1-4, contexts 0 / 1 / block edges, K edges, CPU vs ref, MIXED vs SEPARATE. */
#include "harness.h"
#include "sparse_util.h"

static int run(const sp_case *c, const char *tag)
{
    kva_context *ctx[2];
    kva_context_desc d0 = {KVA_BACKEND_REF, 0, 0}, d1 = {KVA_BACKEND_CPU, 2, 0};
    kva_context_create(&d0, &ctx[0]); kva_context_create(&d1, &ctx[1]);
    sp_data m[2]; void *out[2]; float *lse[2]; int bad = 0;
    for (int b = 0; b < 2; b++) {
        if (!sp_data_make(ctx[b], c, &m[b])) { printf("%s setup %s\n", tag, kva_last_error()); return 1; }
        kva_plan_desc pd = sp_plan_desc(c, &m[b]); kva_plan *p;
        if (kva_plan_create(ctx[b], &pd, &p)) { printf("%s plan %s\n", tag, kva_last_error()); return 1; }
        size_t rows = (size_t)m[b].T * c->H, n = rows * c->Dc;
        out[b] = malloc(n * 4 + 16); lse[b] = malloc(rows * 4 + 16);
        kva_test_poison(out[b], c->dt, n); kva_test_poison(lse[b], KVA_DTYPE_F32, rows);
        if (kva_mla_sparse_run(ctx[b], p, m[b].q, m[b].cache, m[b].idx, c->K + c->stride_pad, m[b].len, m[b].sinks, out[b], lse[b])) { printf("%s run %s\n", tag, kva_last_error()); bad++; }
        kva_plan_destroy(p);
    }
    size_t rows = (size_t)m[0].T * c->H, n = rows * c->Dc;
    double atol, latol, cm;
    kva_test_sparse_bf16dot_bounds(c->Dc, c->Dr, c->quant == KVA_QUANT_FP8_DS_MLA, &atol, &latol, &cm);
    if (c->dt == KVA_DTYPE_F32) { atol = 1e-4; latol = 1e-4; }
    size_t b1 = kva_test_compare(tag, out[1], out[0], c->dt, n, atol, 2 * kva_test_rtol(c->dt));
    size_t b2 = kva_test_compare_f32(tag, lse[1], lse[0], rows, latol, 1e-5);
    size_t pz = kva_test_count_poisoned(out[1], c->dt, n) + kva_test_count_poisoned(lse[0], KVA_DTYPE_F32, rows);
    if (b1 || b2 || pz) { printf("%s: out %zu lse %zu poisoned %zu\n", tag, b1, b2, pz); bad++; }
    for (int b = 0; b < 2; b++) { free(out[b]); free(lse[b]); sp_data_free(&m[b]); kva_context_destroy(ctx[b]); }
    return bad;
}

int main(void)
{
    int bad = 0, n = 0;
    const kva_quant qs[3] = {KVA_QUANT_NONE, KVA_QUANT_FP8_E4M3, KVA_QUANT_FP8_DS_MLA};
    for (int ql = 1; ql <= 4; ql++)
        for (int ci = 0; ci < 5; ci++)
            for (int qi = 0; qi < 3; qi++)
                for (int mode = 0; mode < 2; mode++) {
                    const int32_t B = qi == 2 ? 64 : 4;
                    const int32_t ctxs[5] = {0, 1, B - 1, B, B + 1}, cl = ctxs[ci];
                    const int32_t Ks[4] = {1, 3, B, 2 * B + 3};
                    sp_case c = {.H = ql == 3 ? 17 : 3, .Dc = qi == 2 ? 128 : 64, .Dr = 16, .B = B, .K = Ks[(ql + ci) % 4], .dt = qi == 0 && ql % 2 ? KVA_DTYPE_F32 : KVA_DTYPE_BF16,
                                 .quant = qs[qi], .mode = mode, .thr = ql % 2 ? 1 : 2, .R = 3, .use_len = (ci + qi) % 2, .sinks = ql == 2, .unused = 0.3, .dup = 0.1, .stride_pad = ci == 4 ? 3 : 0, .seed = 50 + n};
                    c.q_len[0] = ql; c.seq_len[0] = cl + ql;
                    c.q_len[1] = 1; c.seq_len[1] = cl + 1;
                    c.q_len[2] = ql; c.seq_len[2] = ql;
                    char tag[128]; snprintf(tag, sizeof tag, "q%d ctx%d %s %s K%d mode%d", ql, cl, kva_quant_name(c.quant), kva_dtype_name(c.dt), c.K, mode);
                    if (mode == 1 && c.quant != KVA_QUANT_NONE) continue;
                    if (mode == 1) c.dt = KVA_DTYPE_BF16;
                    bad += run(&c, tag); n++;
                }
    printf("%d cases %d bad\n", n, bad);
    return 0;
}
