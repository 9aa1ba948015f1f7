/*
 * test_api_blackbox_hidden.c - kvattn.h: out = sum over the *visible* keys of
 * softmax_j * v_j; "the contents [of a cache] are unspecified until written".
 * So whatever the cache holds where a row does not look must not reach the
 * row: real engines recycle pages and device caches start with arbitrary
 * bits, NaN and infinity patterns included. Each case (hidden_cases.h) runs
 * twice on the same backend and kernel: over a cache whose whole storage
 * first held garbage (NaN, then +inf, then -inf patterns of every format:
 * hidden_util.h), with selected keys that some rows do not see overwritten
 * by non-finite rows, and over a clean twin (zeros, the same keys written
 * with finite values). Every row that sees none of the overwritten keys must
 * come out the same up to rounding (2x the dtype tolerances of bench/data.h;
 * the rounding may differ where hidden keys take part in a tile's running
 * max), out and lse; the clean rows finite.
 * Backends: the reference, the CPU backend as dispatched, with every
 * registry kernel that runs here forced (kva__context_force_kernel), and
 * with KVA_CPU_ISA lowered to each level (the dequantizers and merges follow
 * it). KVA_TEST_QUICK: the reference, the CPU default and the portable level.
 * The leaks this found and what became of them: docs/masks.md.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "hidden_cases.h"
#include "hidden_run.h"
#include "hidden_variants.h"

static int g_bad_runs[HC_MAX_CASES];

static void run_case(const hc_case *c, int ci, const hc_variant *vs, int nv)
{
    const size_t outb = (size_t)c->T * hc_out_dim(c) * kva_dtype_size(c->pd.q_dtype);
    const size_t lseb = (size_t)c->T * c->pd.num_heads * sizeof(float);
    void *out_c = malloc(outb), *out_g = malloc(outb);
    float *lse_c = malloc(lseb), *lse_g = malloc(lseb);
    hc_inputs in;
    hc_inputs_make(c, &in);
    int ran = 0;
    for (int vi = 0; vi < nv; vi++) {
        if (!hc_kernel_fits(c, vs[vi].kernel))
            continue;
        ran += vs[vi].kernel == NULL;
        char who[64];
        kva_context *ctx = hc_variant_open(&vs[vi], who, sizeof who);
        hc_host_run(ctx, c, -1, &in, out_c, lse_c);
        for (int pat = 0; pat < HC_PATTERNS; pat++) {
            hc_host_run(ctx, c, pat, &in, out_g, lse_g);
            const int bad = hc_compare(c, who, pat, out_g, lse_g, out_c, lse_c);
            if (bad) {
                g_bad_runs[ci]++;
                fprintf(stderr, "  -> %s: %s: %d rows differ\n", c->name, who, bad);
            }
        }
        hc_variant_close(&vs[vi], ctx);
    }
    hc_check_ran(c, vs, nv, ran);
    hc_inputs_free(&in);
    free(out_c);
    free(out_g);
    free(lse_c);
    free(lse_g);
}

/* Cases whose name begins with prefix (a class of the list). */
static void run_class(const char *prefix)
{
    static hc_case cs[HC_MAX_CASES];
    const int n = hc_cases(cs, 0);
    hc_variant vs[8 + KVA_TEST_MAX_KERNELS];
    const int nv = hc_variants(vs, 1);
    for (int i = 0; i < n; i++) {
        if (strncmp(cs[i].name, prefix, strlen(prefix)))
            continue;
        run_case(&cs[i], i, vs, nv);
        CHECK_MSG(g_bad_runs[i] == 0, "%s: %d runs (variant x pattern) leak hidden slots",
                  cs[i].name, g_bad_runs[i]);
    }
}

HC_CLASSES(HC_CLASS_TEST)

int main(void)
{
    HC_CLASSES(HC_CLASS_RUN)
    return kva_test_finish();
}
