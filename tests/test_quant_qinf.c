/*
 * test_quant_qinf.c - an infinite element of q over an INT8_CHANNEL cache on
 * the reference and CPU backends: kvattn.h's rule (IEEE products with the
 * key elements (c - o) s) with no exception, row by row as qinf_rows.h
 * states it: a code equal to the channel's offset scores NaN (the row
 * writes NaN), a code of 0 or one between 0 and the offset gives the
 * infinity the sign of c - o (rows whose every score is -inf write 0 and
 * lse -inf), beyond the offset both signs agree; every other row equals the
 * reference. The CUDA side, where the quantized tensor-core kernels take the
 * exception, is test_cuda_nan.c's test_qinf_channel over the same batch.
 * CPU runs: the dispatcher's kernels at every ISA level the machine has
 * (KVA_CPU_ISA lowered: portable, avx2, avx512), 3 threads over a partition
 * forced into small unaligned key chunks (the NaN and -inf partials go
 * through the split merge), and every registry kernel that runs here
 * forced in turn (the MLA kernels left out: they run latent caches only).
 * KVA_TEST_QUICK=1: the dispatcher's and portable only.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cpu_kernels.h"
#include "qinf_rows.h"
#include "../src/attn/cpu/cpu_attn.h"

/* The reference's output for the problem, and the rule's row kinds. */
typedef struct qi_want {
    void *out;
    float *lse;
    uint8_t *kind;
} qi_want;

static void run_ctx(kva_context *ctx, const qi_problem *p, int small_chunks, void *out, float *lse)
{
    const size_t no = (size_t)p->b.T * QI_H * QI_D, nl = (size_t)p->b.T * QI_H;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &p->pd, &plan));
    if (plan && small_chunks) {
        kva__partition_params pp = {3, 8, 4, 7, 50, 40, 64};
        CHECK_OK(kva__cpu_plan_partition(ctx, plan, &pp));
        CHECK_MSG(plan->part->num_tasks > 0, "the small-chunk partition does not split");
    }
    kva_test_poison(out, KVA_DTYPE_BF16, no);
    kva_test_poison(lse, KVA_DTYPE_F32, nl);
    if (plan)
        CHECK_OK(kva_attention_run(ctx, plan, p->q, p->hc, NULL, out, lse));
    kva_plan_destroy(plan);
}

/* The CPU backend with threads thr, forced kernel (or NULL), ISA level (or
 * NULL), against the rule and the reference. */
static void run_cpu(const qi_problem *p, const qi_want *w, int thr, const char *kernel,
                    const char *isa, int small_chunks)
{
    char label[128];
    snprintf(label, sizeof label, "cpu %d threads%s%s%s%s%s", thr, kernel ? " kernel " : "",
             kernel ? kernel : "", isa ? " isa " : "", isa ? isa : "",
             small_chunks ? " small chunks" : "");
    if (isa)
        setenv("KVA_CPU_ISA", isa, 1);
    kva_context_desc cd = {KVA_BACKEND_CPU, thr, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    if (ctx && kernel)
        CHECK_OK(kva__context_force_kernel(ctx, kernel));
    const size_t no = (size_t)p->b.T * QI_H * QI_D, nl = (size_t)p->b.T * QI_H;
    void *out = malloc(no * 2);
    float *lse = malloc(nl * 4);
    if (ctx) {
        run_ctx(ctx, p, small_chunks, out, lse);
        const size_t bad = qi_check(label, p, w->kind, out, lse, w->out, w->lse);
        CHECK_MSG(bad == 0, "%s: %zu rows wrong", label, bad);
    }
    free(out), free(lse);
    kva_context_destroy(ctx);
    if (isa)
        unsetenv("KVA_CPU_ISA");
}

static void test_qinf_channel(void)
{
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
    kva_context *ref = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    if (!ref)
        return;
    qi_problem p;
    qi_init(&p, ref, 5700);
    const size_t no = (size_t)p.b.T * QI_H * QI_D, nl = (size_t)p.b.T * QI_H;
    qi_want w = {malloc(no * 2), malloc(nl * 4), malloc(nl)};
    qi_expect(&p, NULL, w.kind);
    if (p.hc) {
        /* The reference (fp64 over the dequantized keys) states the rule
         * too: its marked rows exactly, its finite rows against themselves. */
        run_ctx(ref, &p, 0, w.out, w.lse);
        CHECK_MSG(qi_check("reference", &p, w.kind, w.out, w.lse, w.out, w.lse) == 0,
                  "the reference breaks kvattn.h's rule");
        run_cpu(&p, &w, 2, NULL, NULL, 0);
        run_cpu(&p, &w, 2, NULL, "portable", 0);
        run_cpu(&p, &w, 3, NULL, NULL, 1);
        if (!kva_test_quick()) {
            run_cpu(&p, &w, 2, NULL, "avx2", 0);
            run_cpu(&p, &w, 2, NULL, "avx512", 0);
            run_cpu(&p, &w, 3, NULL, "portable", 1);
            kva_test_kernel k[KVA_TEST_MAX_KERNELS];
            const int32_t nk = kva_test_cpu_kernels(k);
            for (int32_t i = 0; i < nk; i++)
                if (k[i].runs && k[i].family != KVA__KERNEL_MLA) /* MLA: another kind */
                    run_cpu(&p, &w, 2, k[i].name, NULL, 0);
        }
    }
    free(w.out), free(w.lse), free(w.kind);
    qi_free(&p);
    kva_context_destroy(ref);
}

int main(void)
{
    RUN(test_qinf_channel);
    return kva_test_finish();
}
