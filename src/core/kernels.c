/*
 * kernels.c - the kernel registry lookup and the one force hook
 * (kva__context_force_kernel, src/core/internal.h) through which tests and
 * benchmarks make a backend run one named kernel.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

const kva__kernel_info *kva__context_kernels(const kva_context *ctx, int32_t *count)
{
    *count = ctx->ops->kernels ? ctx->ops->num_kernels : 0;
    return ctx->ops->kernels;
}

int32_t kva__context_forced_kernel(const kva_context *ctx, kva__kernel_family family)
{
    return ctx->forced_kernel[family] - 1;
}

kva_status kva__context_force_kernel(kva_context *ctx, const char *name)
{
    KVA_CHECK_PTR(ctx);
    if (!name || !*name) {
        memset(ctx->forced_kernel, 0, sizeof ctx->forced_kernel);
        return KVA_STATUS_OK;
    }
    int32_t n = 0;
    const kva__kernel_info *k = kva__context_kernels(ctx, &n);
    for (int32_t i = 0; i < n; i++) {
        if (strcmp(k[i].name, name) != 0)
            continue;
        if (k[i].usable && !k[i].usable(ctx))
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "force kernel: '%s' cannot run on this machine or build (backend %s)",
                             name, ctx->ops->name);
        ctx->forced_kernel[k[i].family] = i + 1;
        return KVA_STATUS_OK;
    }
    char list[512] = "";
    size_t used = 0;
    for (int32_t i = 0; i < n && used + 1 < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", k[i].name);
    return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                     "force kernel: backend %s has no kernel '%s' (registry: %s)", ctx->ops->name,
                     name, n ? list : "none");
}
