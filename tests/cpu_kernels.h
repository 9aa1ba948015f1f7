/*
 * cpu_kernels.h - the CPU backend's kernel registry for tests: which kernels
 * exist and which run here. Tests force one on a context with
 * kva__context_force_kernel (src/core/internal.h), the one sanctioned hook.
 */
#ifndef KVA_TEST_CPU_KERNELS_H
#define KVA_TEST_CPU_KERNELS_H

#include "harness.h"
#include "internal.h"

enum { KVA_TEST_MAX_KERNELS = 16 };

/* One registry entry: its name, family and whether this machine and build
 * run it (the ISA level lowered by KVA_CPU_ISA, as at plan build). */
typedef struct kva_test_kernel {
    const char *name;
    kva__kernel_family family;
    int runs;
} kva_test_kernel;

/* Fills out [KVA_TEST_MAX_KERNELS] with the CPU registry; returns its size. */
static inline int32_t kva_test_cpu_kernels(kva_test_kernel *out)
{
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    if (kva_context_create(&cd, &ctx) != KVA_STATUS_OK)
        return 0;
    int32_t n = 0;
    const kva__kernel_info *k = kva__context_kernels(ctx, &n);
    n = n < KVA_TEST_MAX_KERNELS ? n : KVA_TEST_MAX_KERNELS;
    for (int32_t i = 0; i < n; i++) {
        out[i].name = k[i].name;
        out[i].family = k[i].family;
        out[i].runs = !k[i].usable || k[i].usable(ctx);
    }
    kva_context_destroy(ctx);
    return n;
}

/* The kernels a test runs a case with: NULL (the dispatcher's choice), then
 * the name of every registry kernel that runs here; v holds
 * KVA_TEST_MAX_KERNELS + 1 entries. Returns their count. */
static inline int kva_test_cpu_runnable(const char **v)
{
    kva_test_kernel k[KVA_TEST_MAX_KERNELS];
    const int32_t nk = kva_test_cpu_kernels(k);
    int n = 0;
    v[n++] = NULL;
    for (int32_t i = 0; i < nk; i++)
        if (k[i].runs)
            v[n++] = k[i].name;
    return n;
}

#endif /* KVA_TEST_CPU_KERNELS_H */
