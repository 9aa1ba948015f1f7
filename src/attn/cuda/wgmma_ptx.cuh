/*
 * wgmma_ptx.cuh - PTX wrappers of the sm_90a warpgroup matrix instructions
 * (wgmma.mma_async) used by prefill_wgmma.cu: shared-memory matrix
 * descriptors (128-byte swizzle), fences, commit / wait, and the
 * m64n128k16 and m64n64k16 forms with fp32 accumulation (A from shared memory, A from
 * registers; B K-major or MN-major), m64n128k32 e4m3 from shared memory (the indexer).
 * Only compiled where the sm_90a feature set is present
 * (__CUDA_ARCH_FEAT_SM90_ALL); the including file guards its use.
 *
 * Accumulator fragment of m64nNk16 (fp32), per thread of the warpgroup
 * (warp w = (tid / 32) % 4, g = lane / 4, t = lane % 4): d[4 * j + e] is
 * row 16 * w + g + 8 * (e / 2), column 8 * j + 2 * t + (e % 2), j < N / 8 --
 * the mma.sync m16n8 C layout repeated along N. The register A operand
 * [64, 16] has the mma.sync m16n8k16 A layout on the warp's 16 rows.
 */
#ifndef KVA_CUDA_WGMMA_PTX_CUH
#define KVA_CUDA_WGMMA_PTX_CUH

#include <stdint.h>

/* Shared-memory matrix descriptor, 128-byte swizzle (mode 1 in bits 62-63):
 * start address, leading-dimension byte offset (LBO) and stride-dimension byte
 * offset (SBO), each >> 4 in 14 bits. The swizzle atom is 8 rows x 128 bytes
 * (1024-byte aligned): 16-byte chunk c of row r lives at chunk c ^ (r & 7).
 * K-major operand: SBO = 1024 (8-row groups), LBO unused. MN-major operand
 * (transposed): LBO = stride between 64-element column blocks, SBO = 1024. */
static __device__ __forceinline__ uint64_t kva__wgmma_desc(uint32_t saddr, uint32_t lbo,
                                                           uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)((lbo & 0x3ffffu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3ffffu) >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void kva__wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void kva__wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void kva__wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Generic-proxy shared-memory writes (cp.async, st.shared) made visible to the
 * async proxy (wgmma operand reads); each writing thread, before the barrier. */
static __device__ __forceinline__ void kva__fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving accesses of an accumulator register across
 * the wgmma issue / wait statements. */
static __device__ __forceinline__ void kva__reg_fence(float &r)
{
    asm volatile("" : "+f"(r)::"memory");
}

/* Operand lists of the wrappers below: the accumulators d[0..N) with the
 * constraint c ("+f" accumulate, "=f" overwrite), and the matching "{%0, ...}"
 * register lists of the PTX text. */
#define KVA__WG_D8(c, b)                                                                           \
    c(d[b]), c(d[b + 1]), c(d[b + 2]), c(d[b + 3]), c(d[b + 4]), c(d[b + 5]), c(d[b + 6]),         \
        c(d[b + 7])
#define KVA__WG_D32(c) KVA__WG_D8(c, 0), KVA__WG_D8(c, 8), KVA__WG_D8(c, 16), KVA__WG_D8(c, 24)
#define KVA__WG_D64(c)                                                                             \
    KVA__WG_D32(c), KVA__WG_D8(c, 32), KVA__WG_D8(c, 40), KVA__WG_D8(c, 48), KVA__WG_D8(c, 56)
#define KVA__WG_R32                                                                                \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "       \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KVA__WG_R64                                                                                \
    KVA__WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "    \
                "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, " \
                "%63}"

/* S-type products, A and B from shared memory, both K-major:
 * D [64, N] (+)= A [64, K] B [K, N] with K = 16 (bf16, f16) or 32 (e4m3,
 * which takes no transpose operands: TR is empty); scale_d 0 overwrites D.
 * kva__wgmma_ss_m64n{128,64}_{bf16,f16}(d, da, db, scale_d) (and n128 e4m3),
 * d[N / 2]; RL / DL: d's PTX register list and operands, A, B, S: the operand
 * numbers of da, db and scale_d (they follow d's N / 2). */
#define KVA__WGMMA_SS(ty, N, K, TR, RL, DL, A, B, S)                                               \
    static __device__ __forceinline__ void kva__wgmma_ss_m64n##N##_##ty(                           \
        float d[N / 2], uint64_t da, uint64_t db, int scale_d)                                     \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                              \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." #ty "." #ty " " RL      \
                     ", %" #A ", %" #B ", p, 1, 1" TR ";\n}\n"                                     \
                     : DL("+f")                                                                    \
                     : "l"(da), "l"(db), "r"(scale_d));                                            \
    }
KVA__WGMMA_SS(bf16, 128, 16, ", 0, 0", KVA__WG_R64, KVA__WG_D64, 64, 65, 66)
KVA__WGMMA_SS(f16, 128, 16, ", 0, 0", KVA__WG_R64, KVA__WG_D64, 64, 65, 66)
KVA__WGMMA_SS(e4m3, 128, 32, "", KVA__WG_R64, KVA__WG_D64, 64, 65, 66)
KVA__WGMMA_SS(bf16, 64, 16, ", 0, 0", KVA__WG_R32 "}", KVA__WG_D32, 32, 33, 34)
KVA__WGMMA_SS(f16, 64, 16, ", 0, 0", KVA__WG_R32 "}", KVA__WG_D32, 32, 33, 34)

/* The same with D overwritten (scale-d false): D is an output only, so the
 * registers it lands in carry no dependency on earlier values.
 * kva__wgmma_ss0_m64n{128,64}_{bf16,f16}(d, da, db) (and n128 e4m3). */
#define KVA__WGMMA_SS0(ty, N, K, TR, RL, DL, A, B)                                                 \
    static __device__ __forceinline__ void kva__wgmma_ss0_m64n##N##_##ty(float d[N / 2],           \
                                                                         uint64_t da, uint64_t db) \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." #ty "." #ty " " RL      \
                     ", %" #A ", %" #B ", p, 1, 1" TR ";\n}\n"                                     \
                     : DL("=f")                                                                    \
                     : "l"(da), "l"(db));                                                          \
    }
KVA__WGMMA_SS0(bf16, 128, 16, ", 0, 0", KVA__WG_R64, KVA__WG_D64, 64, 65)
KVA__WGMMA_SS0(f16, 128, 16, ", 0, 0", KVA__WG_R64, KVA__WG_D64, 64, 65)
KVA__WGMMA_SS0(e4m3, 128, 32, "", KVA__WG_R64, KVA__WG_D64, 64, 65)
KVA__WGMMA_SS0(bf16, 64, 16, ", 0, 0", KVA__WG_R32 "}", KVA__WG_D32, 32, 33)
KVA__WGMMA_SS0(f16, 64, 16, ", 0, 0", KVA__WG_R32 "}", KVA__WG_D32, 32, 33)

/* Both from shared memory, A K-major, B MN-major (imm-trans-b = 1):
 * kva__wgmma_ss_m64n128_{bf16,f16}_tb(d, da, db, scale_d), d[64] (the batched
 * GEMM of kva_mla_run, mla_gemm_wgmma.cu, with B stored [K, N]). */
#define KVA__WGMMA_SS_TB(ty)                                                                       \
    static __device__ __forceinline__ void kva__wgmma_ss_m64n128_##ty##_tb(                        \
        float d[64], uint64_t da, uint64_t db, int scale_d)                                        \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." #ty "." #ty " " KVA__WG_R64    \
                     ", %64, %65, p, 1, 1, 0, 1;\n}\n"                                             \
                     : KVA__WG_D64("+f")                                                           \
                     : "l"(da), "l"(db), "r"(scale_d));                                            \
    }
KVA__WGMMA_SS_TB(bf16)
KVA__WGMMA_SS_TB(f16)

/* A from registers, B from shared memory MN-major (imm-trans-b = 1):
 * kva__wgmma_rs_m64n{N}_{bf16,f16}_tb(d, a, db, scale_d), d[N / 2]; RL: the
 * PTX register list of d, then the operand numbers of a[0..3], db and scale_d
 * (they follow d's N / 2). */
#define KVA__WGMMA_RS(ty, N, RL, DL, A0, A1, A2, A3, B, S)                                         \
    static __device__ __forceinline__ void kva__wgmma_rs_m64n##N##_##ty##_tb(                      \
        float d[N / 2], const uint32_t a[4], uint64_t db, int scale_d)                             \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                              \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #ty "." #ty " " RL          \
                     ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"       \
                     : DL("+f")                                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));         \
    }
/* N = 128 (S and O at D 128), N = 64 (O of a 64-element value head). */
KVA__WGMMA_RS(bf16, 128, KVA__WG_R64, KVA__WG_D64, 64, 65, 66, 67, 68, 69)
KVA__WGMMA_RS(f16, 128, KVA__WG_R64, KVA__WG_D64, 64, 65, 66, 67, 68, 69)
KVA__WGMMA_RS(bf16, 64, KVA__WG_R32 "}", KVA__WG_D32, 32, 33, 34, 35, 36, 37)
KVA__WGMMA_RS(f16, 64, KVA__WG_R32 "}", KVA__WG_D32, 32, 33, 34, 35, 36, 37)

#endif
