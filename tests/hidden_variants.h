/*
 * hidden_variants.h - the host runs of the hidden-slot cases (hidden_cases.h):
 * which backend, forced CPU kernel and ISA level each run uses, shared by
 * test_api_blackbox_hidden.c, test_api_blackbox_blocks.c and
 * test_api_blackbox_heads.c.
 */
#ifndef KVA_TEST_HIDDEN_VARIANTS_H
#define KVA_TEST_HIDDEN_VARIANTS_H

#include "cpu_kernels.h"
#include "hidden_cases.h"
#include "hidden_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One way of running a case: backend, forced kernel (or NULL), ISA level (or NULL). */
typedef struct hc_variant {
    kva_backend b;
    const char *kernel;
    const char *isa;
} hc_variant;

/* Fills v [8 + KVA_TEST_MAX_KERNELS]: the reference (with_ref), the CPU
 * backend as dispatched and at its portable ISA level; without
 * KVA_TEST_QUICK also at AVX2 and AVX-512 and with every CPU kernel that runs
 * here forced. Returns the count. */
static inline int hc_variants(hc_variant *v, int with_ref)
{
    int n = 0;
    if (with_ref)
        v[n++] = (hc_variant){KVA_BACKEND_REF, NULL, NULL};
    v[n++] = (hc_variant){KVA_BACKEND_CPU, NULL, NULL};
    v[n++] = (hc_variant){KVA_BACKEND_CPU, NULL, "portable"};
    if (kva_test_quick())
        return n;
    v[n++] = (hc_variant){KVA_BACKEND_CPU, NULL, "avx2"};
    v[n++] = (hc_variant){KVA_BACKEND_CPU, NULL, "avx512"};
    const char *names[KVA_TEST_MAX_KERNELS + 1];
    const int nk = kva_test_cpu_runnable(names);
    for (int i = 1; i < nk; i++)
        v[n++] = (hc_variant){KVA_BACKEND_CPU, names[i], NULL};
    return n;
}

/* Whether a forced kernel runs case c: the MLA item kernels run kva_mla_run's
 * items only (others would only repeat the default). */
static inline int hc_kernel_fits(const hc_case *c, const char *kernel)
{
    return !kernel || strncmp(kernel, "mla", 3) || c->api == HC_MLA_RUN;
}

/* Variants of vs [nv] without a forced kernel: each must run every case
 * (hc_kernel_fits), so a case that ran fewer did not test the backend. */
static inline int hc_default_variants(const hc_variant *vs, int nv)
{
    int n = 0;
    for (int i = 0; i < nv; i++)
        n += vs[i].kernel == NULL;
    return n;
}

/* Checks that case c ran on every variant of vs [nv] without a forced
 * kernel (ran: how many of those it ran on), and that there are some. */
static inline void hc_check_ran(const hc_case *c, const hc_variant *vs, int nv, int ran)
{
    const int nd = hc_default_variants(vs, nv);
    CHECK_MSG(nd > 0 && ran == nd, "%s: ran on %d of the %d variants without a forced kernel",
              c->name, ran, nd);
}

/* Opens the context variant v runs on (KVA_CPU_ISA lowered to its ISA level,
 * its kernel forced) and names the variant in who [n]; hc_variant_close ends
 * it. */
static inline kva_context *hc_variant_open(const hc_variant *v, char *who, size_t n)
{
    if (v->isa)
        setenv("KVA_CPU_ISA", v->isa, 1);
    kva_context *ctx = new_ctx(v->b, 2);
    if (v->kernel)
        CHECK_OK(kva__context_force_kernel(ctx, v->kernel));
    snprintf(who, n, "%s%s%s%s%s", kva_backend_name(v->b), v->kernel ? " " : "",
             v->kernel ? v->kernel : "", v->isa ? " isa " : "", v->isa ? v->isa : "");
    return ctx;
}

static inline void hc_variant_close(const hc_variant *v, kva_context *ctx)
{
    kva_context_destroy(ctx);
    if (v->isa)
        unsetenv("KVA_CPU_ISA");
}

/* Rows of got that differ from want, and the first printed (the test's own
 * tolerances): hc_run_against_ref's comparison. */
typedef int (*hc_ref_compare)(const hc_case *c, const char *who, const void *got,
                              const float *glse, const void *want, const float *wlse);

/* Case c on the reference, then on each variant of vs that fits it: every
 * clean run against the reference's by cmp, and every run with garbage in
 * the hidden slots (each pattern) against the same context's clean run
 * (hc_compare); fails the test on any difference or when no default variant
 * ran. */
static inline void hc_run_against_ref(const hc_case *c, const hc_variant *vs, int nv,
                                      hc_ref_compare cmp)
{
    const size_t outb = (size_t)c->T * hc_out_dim(c) * kva_dtype_size(c->pd.q_dtype);
    const size_t lseb = (size_t)c->T * c->pd.num_heads * sizeof(float);
    void *out_r = malloc(outb), *out_c = malloc(outb), *out_g = malloc(outb);
    float *lse_r = (float *)malloc(lseb), *lse_c = (float *)malloc(lseb),
          *lse_g = (float *)malloc(lseb);
    hc_inputs in;
    hc_inputs_make(c, &in);
    kva_context *rctx = new_ctx(KVA_BACKEND_REF, 1);
    hc_host_run(rctx, c, -1, &in, out_r, lse_r);
    int bad_ref = cmp(c, "ref (itself)", out_r, lse_r, out_r, lse_r);
    int bad_hidden = 0;
    for (int pat = 0; pat < HC_PATTERNS; pat++) {
        hc_host_run(rctx, c, pat, &in, out_g, lse_g);
        bad_hidden += hc_compare(c, "ref", pat, out_g, lse_g, out_r, lse_r) > 0;
    }
    kva_context_destroy(rctx);
    int ran = 0;
    for (int vi = 0; vi < nv; vi++) {
        if (!hc_kernel_fits(c, vs[vi].kernel))
            continue;
        ran += vs[vi].kernel == NULL;
        char who[64];
        kva_context *ctx = hc_variant_open(&vs[vi], who, sizeof who);
        hc_host_run(ctx, c, -1, &in, out_c, lse_c);
        bad_ref += cmp(c, who, out_c, lse_c, out_r, lse_r) > 0;
        for (int pat = 0; pat < HC_PATTERNS; pat++) {
            hc_host_run(ctx, c, pat, &in, out_g, lse_g);
            bad_hidden += hc_compare(c, who, pat, out_g, lse_g, out_c, lse_c) > 0;
        }
        hc_variant_close(&vs[vi], ctx);
    }
    hc_check_ran(c, vs, nv, ran);
    CHECK_MSG(bad_ref == 0, "%s: %d runs differ from the reference", c->name, bad_ref);
    CHECK_MSG(bad_hidden == 0, "%s: %d runs (variant x pattern) leak hidden slots", c->name,
              bad_hidden);
    hc_inputs_free(&in);
    free(out_r);
    free(out_c);
    free(out_g);
    free(lse_r);
    free(lse_c);
    free(lse_g);
}

#endif
