/* probe8: the CUDA-only entry points and the error-clearing rule on host contexts. */
#include "kvattn.h"
#include "kvattn_cuda.h"
#include <stdio.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | '%s'\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    kva_context *ctx; kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0}; kva_context_create(&cd, &ctx);
    kva_context *rc; kva_context_desc rd = {KVA_BACKEND_REF, 1, 0}; kva_context_create(&rd, &rc);
    kva_cache_desc d = {2, 4, 1, 8, 0, KVA_DTYPE_F32, 0, 0, 0}; kva_cache *c; kva_cache_create(ctx, &d, &c);
    void *s = (void *)0x1234;
    P(kva_cuda_context_set_stream(ctx, NULL));
    P(kva_cuda_context_set_stream(rc, (void *)0x10));
    P(kva_cuda_context_get_stream(ctx, &s)); printf("  s %p\n", s);
    P(kva_cuda_context_get_stream(ctx, NULL));
    P(kva_cuda_context_get_stream(NULL, &s));
    kva_cuda_capacity cap = {4, 8, 16, 4, 2, 16};
    P(kva_cuda_context_reserve(ctx, &cap));
    P(kva_cuda_context_reserve(ctx, NULL));
    cap.max_requests = -1; P(kva_cuda_context_reserve(ctx, &cap));
    P(kva_cuda_context_set_deferred_write_status(ctx, 1));
    P(kva_cuda_context_set_deferred_write_status(ctx, 5));
    P(kva_cuda_cache_write_status(ctx, c));
    P(kva_cuda_cache_write_status(ctx, NULL));
    P(kva_cuda_context_set_stream(NULL, NULL));
    /* clearing after a failure */
    P(kva_cuda_context_reserve(ctx, NULL));
    P(kva_dcp_local_lens(0, NULL, 1, 0, 1, NULL));
    P(kva_cuda_context_reserve(ctx, NULL));
    P(kva_cuda_cache_write_status(ctx, c));
    P(kva_cuda_context_reserve(ctx, NULL));
    P(kva_cuda_context_get_stream(ctx, &s));
    kva_c8_scales *sc = NULL;
    P(kva_c8_scales_load("/nonexistent", 0, 2, 16, 0, 1, &sc));
    P(kva_c8_scales_load(NULL, 0, 2, 16, 0, 1, &sc));
    P(kva_c8_scales_load("/tmp", -1, 2, 16, 0, 1, &sc));
    P(kva_c8_scales_load("/tmp", 0, 2, 16, 1, 1, &sc));
    P(kva_c8_scales_load("/tmp", 0, 2, 12, 0, 1, &sc));
    P(kva_c8_scales_load("/tmp", 0, 2, 16, 0, 3, &sc));
    P(kva_c8_scales_load("/tmp", 0, 2, 16, 0, 0, &sc));
    kva_cache_destroy(c); kva_context_destroy(ctx); kva_context_destroy(rc);
    return 0;
}
