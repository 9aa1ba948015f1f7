/*
 * test_qmag.c - results over every cache format do not depend on the
 * magnitude of q (issue #22): the q-magnitude sweep of qmag_sweep.h (q from
 * ~1e-6 to ~1e3 with the softmax scale keeping the logits O(1), decode items
 * of q_len 1-4 and prefill items) on the reference backend (against itself
 * at sigma 1) and the CPU backend (against the reference).
 */
#include "qmag_sweep.h"

/* The CPU backend: plans on its own context, reads the host cache as is. */
typedef struct cpu_be {
    kva_context *ctx;
    const kva_cache *hc;
} cpu_be;

static void cpu_prepare(void *ud, const kva_cache_desc *cd, const kva_quant_params *p,
                        const kva_cache *hc)
{
    (void)cd, (void)p;
    ((cpu_be *)ud)->hc = hc;
}

static kva_status cpu_run(void *ud, const kva_plan_desc *pd, const void *q, void *out, float *lse)
{
    cpu_be *c = ud;
    kva_plan *plan = NULL;
    kva_status s = kva_plan_create(c->ctx, pd, &plan);
    if (s == KVA_STATUS_OK)
        s = kva_attention_run(c->ctx, plan, q, c->hc, NULL, out, lse);
    kva_plan_destroy(plan);
    return s;
}

static void test_sweep(void)
{
    cpu_be cb = {new_ctx(KVA_BACKEND_CPU, 2), NULL};
    /* The reference is also checked against itself at sigma 1 on shape 1. */
    qmag_backend be = {"cpu", &cb, cpu_prepare, cpu_run, 0, 0.0, NULL};
    qmag_backend be_ref = {"cpu", &cb, cpu_prepare, cpu_run, 1, 0.0, "reference checked too"};
    for (int i = 0; i < QMAG_NFORMATS; i++) {
        const struct qmag_format *f = &qmag_formats[i];
        /* Shape 0: the (GQA 4, D 128, B 16, HND); shape 1: MHA,
         * D 64, an odd block size, NHD. */
        const qmag_case c0 = {f->quant, f->cache_dt, f->qdt, 16, 4, 128, 16, KVA_LAYOUT_HND};
        const qmag_case c1 = {f->quant, f->cache_dt, f->qdt, 4, 4, 64, 5, KVA_LAYOUT_NHD};
        qmag_run_case(&c0, &be, 0x9a9u + (uint64_t)i);
        qmag_run_case(&c1, &be_ref, 0x9b9u + (uint64_t)i);
    }
    kva_context_destroy(cb.ctx);
}

int main(void)
{
    RUN(test_sweep);
    return kva_test_finish();
}
