/* dev/review63/emul/gemm_emul.c - a host implementation of the contract of
 * kva__cuda_mla_gemm (src/attn/cuda/mla_run.h, written from that comment and
 * mla_gemm.cu's argument checks), linked into tests/cuda/test_cuda_mla_gemm.c
 * with the fake runtime beside it, to run the test's indexing, poison and
 * reference checks on the VM. REVIEW63_FAULT plants a fault of the kind a
 * kernel could have:
 *   1: the second product stored with the first's ldc / c_head;
 *   2: a pair's column blocks past the first skipped (N > 128);
 *   3: a pair whose C2 is not 16-byte aligned refused (the dispatch failing
 *      it instead of splitting the pair);
 *   4: a pair with K = 64 (one k step per tile) reads k step 0 of the
 *      previous tile's A rows for its second product.
 * Build: see run_emul.sh. */
#include "mla_run.h"
#include "kvattn.h"

#include <stdint.h>
#include <stdlib.h>

int emu_backend_available(kva_backend b)
{
    return b == KVA_BACKEND_CUDA || b == KVA_BACKEND_REF || b == KVA_BACKEND_CPU;
}
int kva__cuda_prefill_wgmma_ready(void) { return 1; }

static int fault(void)
{
    const char *f = getenv("REVIEW63_FAULT");
    return f ? atoi(f) : 0;
}

static float a_val(const kva__cuda_mla_gemm_args *g, int64_t row, int h, int k)
{
    const int64_t e = row * g->lda + (int64_t)h * g->a_head + k;
    if (g->a_fp8)
        return kva_fp8_e4m3_to_f32(((const uint8_t *)g->a)[e]);
    return kva__load_f(g->a, g->dtype, (size_t)e);
}

static void product(const kva__cuda_mla_gemm_args *g, const void *b, int64_t ldb, int64_t b_head,
                    int b_kn, void *c, int64_t ldc, int64_t c_head, int second)
{
    const int f = fault();
    for (int32_t m = 0; m < g->M; m++) {
        const int64_t cr = g->c_rows ? g->c_rows[m] : m;
        if (cr < 0)
            continue;
        int64_t ar = g->a_rows ? g->a_rows[m] : m;
        if (f == 4 && second && g->K == 64 && m >= 128)
            ar = g->a_rows ? g->a_rows[m - 128] : m - 128;
        for (int h = 0; h < g->heads; h++)
            for (int n = 0; n < g->N; n++) {
                if (f == 2 && g->b2 && n >= 128)
                    continue;
                float acc = 0.f;
                for (int k = 0; ar >= 0 && k < g->K; k++) {
                    const int64_t be = (int64_t)h * b_head +
                                       (b_kn ? (int64_t)k * ldb + n : (int64_t)n * ldb + k);
                    acc += a_val(g, ar, h, k) * kva__load_f(b, g->dtype, (size_t)be);
                }
                if (g->a_fp8)
                    acc *= g->c_scale;
                kva__store_f(c, g->dtype, (size_t)(cr * ldc + (int64_t)h * c_head + n), acc);
            }
    }
}

kva_status kva__cuda_mla_gemm(const kva__cuda_mla_gemm_args *g, void *stream)
{
    (void)stream;
    if (g->M <= 0 || g->N <= 0 || g->heads <= 0)
        return KVA_STATUS_OK;
    if (g->b2 && (g->ldb2 % 8 || g->b2_head % 8 || g->ldc2 % 8 || g->c2_head % 8 ||
                  (uintptr_t)g->b2 % 16 || (uintptr_t)g->c2 % 4))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "emul: the second GEMM's operands");
    if (g->K <= 0 || g->K % 8 || g->N % 8 || g->lda % 8 || g->ldb % 8 || g->ldc % 8 ||
        g->a_head % 8 || g->b_head % 8 || g->c_head % 8 || (uintptr_t)g->a % (g->a_fp8 ? 8 : 16) ||
        (uintptr_t)g->b % 16 || (uintptr_t)g->c % 4 ||
        (g->dtype != KVA_DTYPE_F16 && g->dtype != KVA_DTYPE_BF16))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "emul: GEMM operands");
    if (fault() == 3 && g->b2 && (uintptr_t)g->c2 % 16)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "emul: planted refusal of a misaligned C2");
    product(g, g->b, g->ldb, g->b_head, g->b_kn, g->c, g->ldc, g->c_head, 0);
    if (g->b2) {
        const int f1 = fault() == 1;
        product(g, g->b2, g->ldb2, g->b2_head, g->b2_kn, g->c2, f1 ? g->ldc : g->ldc2,
                f1 ? g->c_head : g->c2_head, 1);
    }
    return KVA_STATUS_OK;
}
