/*
 * async_ptx.cuh - PTX wrappers of the sm_90 asynchronous copies and the
 * barriers that order them: mbarriers in shared memory (init, arrive,
 * arrive with an expected transfer count, wait on a phase parity), named
 * barriers, TMA boxes (cp.async.bulk.tensor, 2-D to 4-D, from a
 * CUtensorMap) and plain bulk copies into shared memory, completing on an
 * mbarrier. Shared-memory operands are 32-bit shared-window addresses
 * (kva__smem_u32). Used by the warp-specialized indexer kernel
 * (indexer_wgmma.cu) and the wgmma prefill (prefill_wgmma.cuh); compiled only
 * for sm_90 and later device passes.
 */
#ifndef KVA_CUDA_ASYNC_PTX_CUH
#define KVA_CUDA_ASYNC_PTX_CUH

#include <cuda.h> /* CUtensorMap */
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Sets up the mbarrier at bar for count arrivals per phase. Every caller
 * initialises its mbarriers once, at the kernel's start, then runs a CTA
 * barrier (__syncthreads, all of the CTA's threads) before any thread
 * arrives on, waits on or issues a copy to them; that barrier is all the
 * ordering the PTX ISA asks for here: the bulk and TMA copies access their
 * mbarrier operand through the generic proxy (so no fence.proxy.async is
 * needed for it), and fence.mbarrier_init.release.cluster only makes an init
 * visible to other CTAs of a cluster, and no kernel of the library is
 * launched with clusters. A cluster launch would need that fence. */
static __device__ __forceinline__ void kva__mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void kva__mbar_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}
/* Arrives on bar and adds bytes to the transfer count its phase waits for. */
static __device__ __forceinline__ void kva__mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile(
        "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
        "r"(bytes)
        : "memory");
}
/* Waits until the phase of the given parity has completed. */
static __device__ __forceinline__ void kva__mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nKVA_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@p bra KVA_MBAR_DONE;\nbra KVA_MBAR_WAIT;\nKVA_MBAR_DONE:\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* Named barrier id among n threads: sync waits for all n, arrive counts
 * this warp without waiting. */
static __device__ __forceinline__ void kva__named_bar(bool sync, int id, int n)
{
    if (sync)
        asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
    else
        asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* One TMA box at coordinates (c0, c1[, c2]), innermost first, into shared
 * memory at dst; its bytes complete on bar. */
static __device__ __forceinline__ void kva__tma_load2(uint32_t dst, const CUtensorMap *m, int c0,
                                                      int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)m), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void kva__tma_load3(uint32_t dst, const CUtensorMap *m, int c0,
                                                      int c1, int c2, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)m), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void kva__tma_load4(uint32_t dst, const CUtensorMap *m, int c0,
                                                      int c1, int c2, int c3, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
/* bytes (a multiple of 16) from global src (16-byte aligned) to shared dst. */
static __device__ __forceinline__ void kva__bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                                      uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

#endif
