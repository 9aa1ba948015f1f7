/*
 * mla_gemm_wgmma.cu - the sm_90a form of kva_mla_run's batched GEMM
 * (mla_run.h has the contract, mla_gemm.cu the mma.sync form, which stays
 * the fallback, and the dispatch between them): C[h][m, n] = sum_k
 * A[h][m, k] B[h][k, n] on wgmma.mma_async m64n128k16, fp32 accumulation,
 * the result rounded once to the element type. Its main customer is the
 * compute-friendly path's decompression, c_kv [keys, Dc] . W_UK[h]^T and
 * c_kv [keys, Dc] . W_UV[h] for every head (2 keys H Dc (Dn + Dv) FLOPs);
 * the absorbed path's two projections take it too where their shapes fit.
 *
 * Tiles: 128 x 128 outputs per CTA of two warpgroups (rows 0-63 and 64-127,
 * all 128 columns each: 64 fp32 accumulators per thread), k steps of 64
 * (one 128-byte swizzle atom wide), a ring of three stages of A [128, 64]
 * and B (16 KiB each), 97 KiB of shared memory with the alignment pad: two
 * CTAs per SM, so one CTA's prologue and epilogue run under the other's
 * products. Every thread copies (no producer warp): A and B with 16-byte
 * cp.async in the 128-byte swizzled layout the descriptors read (chunk c of
 * row r at chunk c ^ (r % 8)). A is K-major ([128 rows][64]); B is K-major
 * ([128 n rows][64], W_UK[h] read as W_UK^T, b_kn = 0) or MN-major
 * ([64 k rows][128] as two 64-column blocks, b_kn = 1: the wgmma's
 * transpose-B form reads it).
 *
 * The step loop: wait for step ks's copies, make them visible to the async
 * proxy, CTA barrier; issue step ks's four wgmmas; copy step ks + 1 into the
 * stage after it; wait until at most one wgmma group is pending (step ks - 1
 * done). The barrier at the top of step ks + 1 then tells every thread that
 * both warpgroups are done with step ks - 1, whose stage (ks + 2) % 3 that
 * step refills. The copy of step ks + 1 runs under step ks's products.
 *
 * The A format is the policy parameter of the one body: gw_a16 (16-bit
 * rows, cp.async) or gw_afp8<TR> (an FP8 E4M3 latent cache: 8 codes loaded
 * by plain loads, converted exactly to TR's 16-bit values and stored into
 * the same swizzled slot, the cache's scale applied to the fp32 result
 * before its one rounding, as the fallback does). Rows past M and negative
 * A rows read zeros; C rows past M and negative C rows are not written.
 * Shapes taken: K a multiple of 64, N a multiple of 128 (and the contract's
 * multiples of 8 and alignments); others take the fallback.
 */
extern "C" {
#include "mla_run.h"
#include "prefill_mma.h" /* kva__cuda_prefill_wgmma_ready */
}
#include "cuda_check.h"
#include "mma_ptx.cuh"
#include "quant_cvt.cuh"
#include "wgmma_ptx.cuh"

#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_GW_BODY 1
#endif

namespace
{

constexpr int GW_BM = 128, GW_BN = 128, GW_BK = 64, GW_THREADS = 256, GW_NST = 3;
constexpr uint32_t GW_AB = GW_BM * GW_BK * 2;          /* A stage bytes */
constexpr uint32_t GW_BB = GW_BN * GW_BK * 2;          /* B stage bytes */
constexpr uint32_t GW_STAGE = GW_AB + GW_BB;           /* 1024-byte multiple */
constexpr uint32_t GW_SMEM = GW_NST * GW_STAGE + 1024; /* + the alignment pad */
static_assert(2 * (GW_SMEM + 1024) <= 228 * 1024, "two CTAs per SM");

typedef kva__cuda_mla_gemm_args gemm_p;

/* The A formats. load(dst, src, any): 16-byte chunk (8 elements) of A at
 * src (NULL: a zero chunk) into the shared slot dst; any is a valid global
 * address for the zero-fill form. */
struct gw_a16 {
    static constexpr int BYTES = 2;       /* bytes per A element */
    static constexpr bool SCALED = false; /* C = c_scale * A B */
    static __device__ __forceinline__ void load(uint32_t dst, const char *src, const void *any)
    {
        kva__cp_async16(dst, src ? src : any, src ? 16 : 0);
    }
};
template <typename TR> struct gw_afp8 {
    static constexpr int BYTES = 1;
    static constexpr bool SCALED = true;
    static __device__ __forceinline__ void load(uint32_t dst, const char *src, const void *)
    {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (src)
            v = kva__fp8x8_as<TR>(*reinterpret_cast<const uint2 *>(src));
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w)
                     : "memory");
    }
};

#ifdef KVA_GW_BODY
/* The m64n128k16 products by element type: B K-major (ss) or MN-major (tb). */
template <typename TR> struct gw_ops;
template <> struct gw_ops<kva__mma_bf16> {
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b)
    {
        kva__wgmma_ss_m64n128_bf16(d, a, b, 1);
    }
    static __device__ __forceinline__ void tb(float d[64], uint64_t a, uint64_t b)
    {
        kva__wgmma_ss_m64n128_bf16_tb(d, a, b, 1);
    }
};
template <> struct gw_ops<kva__mma_f16> {
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b)
    {
        kva__wgmma_ss_m64n128_f16(d, a, b, 1);
    }
    static __device__ __forceinline__ void tb(float d[64], uint64_t a, uint64_t b)
    {
        kva__wgmma_ss_m64n128_f16_tb(d, a, b, 1);
    }
};

/* The thread's copy sources: A rows (tid / 8) + 32 j, chunk tid % 8 (NULL:
 * a zero row), and B's first chunk (K-major: n rows (tid / 8) + 32 j, chunk
 * tid % 8; MN-major: k rows (tid / 16) + 16 j, chunk tid % 16), advanced by
 * b_step bytes per k step and b_j per j. */
struct gw_src {
    const char *a[4];
    const char *b;
    int64_t b_j, b_step;
};

/* Copies k step ks into the stage at sA (A) and sA + GW_AB (B). */
template <bool KN, typename AL>
static __device__ __forceinline__ void gw_load(const gemm_p &p, const gw_src &src, int ks,
                                               uint32_t sA)
{
    const int tid = threadIdx.x;
    const int64_t ka = (int64_t)ks * GW_BK * AL::BYTES;
    const int ra = tid >> 3, ca = tid & 7;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = ra + 32 * j;
        AL::load(sA + (uint32_t)(r * 128 + ((ca ^ (r & 7)) << 4)), src.a[j] ? src.a[j] + ka : NULL,
                 p.a);
    }
    const uint32_t sB = sA + GW_AB;
    const char *b = src.b + (int64_t)ks * src.b_step;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t dst;
        if (KN) {
            const int r = (tid >> 4) + 16 * j, c = tid & 15;
            dst = sB + (uint32_t)((c >> 3) * GW_BK * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
        } else {
            const int r = ra + 32 * j;
            dst = sB + (uint32_t)(r * 128 + ((ca ^ (r & 7)) << 4));
        }
        kva__cp_async16(dst, b + j * src.b_j, 16);
    }
}
#endif

template <typename TR, bool KN, typename AL>
__global__ void __launch_bounds__(GW_THREADS, 2) gw_kernel(gemm_p p)
{
#ifdef KVA_GW_BODY
    extern __shared__ __align__(16) unsigned char gw_smem[];
    const uint32_t base = (kva__smem_u32(gw_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int m0 = blockIdx.x * GW_BM, n0 = blockIdx.y * GW_BN, h = blockIdx.z;

    gw_src src;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int m = m0 + (tid >> 3) + 32 * j;
        int64_t row = -1;
        if (m < p.M)
            row = p.a_rows ? p.a_rows[m] : m;
        src.a[j] = row >= 0 ? (const char *)p.a +
                                  AL::BYTES * (row * p.lda + (int64_t)h * p.a_head + (tid & 7) * 8)
                            : NULL;
    }
    const char *b = (const char *)p.b + 2 * ((int64_t)h * p.b_head);
    if (KN) {
        src.b = b + 2 * ((int64_t)(tid >> 4) * p.ldb + n0 + (tid & 15) * 8);
        src.b_j = 2 * 16 * p.ldb;
        src.b_step = 2 * (int64_t)GW_BK * p.ldb;
    } else {
        src.b = b + 2 * ((int64_t)(n0 + (tid >> 3)) * p.ldb + (tid & 7) * 8);
        src.b_j = 2 * 32 * p.ldb;
        src.b_step = 2 * GW_BK;
    }

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.f;

    const int ksteps = p.K / GW_BK;
    gw_load<KN, AL>(p, src, 0, base);
    kva__cp_async_commit();
    for (int ks = 0; ks < ksteps; ks++) {
        const uint32_t sA = base + (uint32_t)(ks % GW_NST) * GW_STAGE;
        kva__cp_async_wait<0>();
        kva__fence_proxy_async();
        __syncthreads();
        /* A: this warpgroup's 64 rows, K-major; B K-major (SBO 1024) or
         * MN-major (LBO: the 64-column blocks' stride). */
        const uint64_t da = kva__wgmma_desc(sA + (uint32_t)wg * 64 * 128, 16, 1024);
        const uint64_t db = KN ? kva__wgmma_desc(sA + GW_AB, GW_BK * 128, 1024)
                               : kva__wgmma_desc(sA + GW_AB, 16, 1024);
        kva__wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++) {
            if (KN)
                gw_ops<TR>::tb(acc, da + (uint64_t)((kk * 32) >> 4),
                               db + (uint64_t)((kk * 16 * 128) >> 4));
            else
                gw_ops<TR>::ss(acc, da + (uint64_t)((kk * 32) >> 4),
                               db + (uint64_t)((kk * 32) >> 4));
        }
        kva__wgmma_commit();
        if (ks + 1 < ksteps)
            gw_load<KN, AL>(p, src, ks + 1, base + (uint32_t)((ks + 1) % GW_NST) * GW_STAGE);
        kva__cp_async_commit();
        kva__wgmma_wait<1>();
    }
    kva__wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; i++)
        kva__reg_fence(acc[i]);

    /* Epilogue: acc[4 j + e] is row 16 w + g + 8 (e / 2), column 8 j + 2 t +
     * e % 2 of the warpgroup's [64, 128] (wgmma_ptx.cuh). */
    const int lane = tid & 31, w = (tid >> 5) & 3, g = lane >> 2, t2 = (lane & 3) * 2;
    const float cs = AL::SCALED ? p.c_scale : 1.f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int m = m0 + wg * 64 + w * 16 + g + half * 8;
        if (m >= p.M)
            continue;
        const int64_t row = p.c_rows ? p.c_rows[m] : m;
        if (row < 0)
            continue;
        char *crow = (char *)p.c + 2 * (row * p.ldc + (int64_t)h * p.c_head + n0 + t2);
#pragma unroll
        for (int j = 0; j < 16; j++)
            *(uint32_t *)(crow + 16 * j) =
                TR::pack(acc[4 * j + 2 * half] * cs, acc[4 * j + 2 * half + 1] * cs);
    }
#else
    (void)p;
    /* (no sm_90a code in this pass: the policy is named only so that
     * device passes without it do not warn about its unused members) */
    if (AL::SCALED && AL::BYTES < 0)
        AL::load(0u, NULL, NULL);
#endif
}

} // namespace

extern "C" int kva__cuda_mla_gemm_wgmma_fits(const kva__cuda_mla_gemm_args *g)
{
#ifdef KVA_CUDA_SM90A
    return g->K % GW_BK == 0 && g->N % GW_BN == 0 && kva__cuda_prefill_wgmma_ready();
#else
    (void)g;
    return 0;
#endif
}

extern "C" kva_status kva__cuda_mla_gemm_wgmma(const kva__cuda_mla_gemm_args *g, void *stream)
{
    const gemm_p p = *g;
    const dim3 grid((unsigned)((g->M + GW_BM - 1) / GW_BM), (unsigned)(g->N / GW_BN),
                    (unsigned)g->heads);
    const bool bf = g->dtype == KVA_DTYPE_BF16;
    void (*k)(gemm_p);
    if (g->a_fp8)
        k = bf ? (g->b_kn ? gw_kernel<kva__mma_bf16, true, gw_afp8<kva__mma_bf16>>
                          : gw_kernel<kva__mma_bf16, false, gw_afp8<kva__mma_bf16>>)
               : (g->b_kn ? gw_kernel<kva__mma_f16, true, gw_afp8<kva__mma_f16>>
                          : gw_kernel<kva__mma_f16, false, gw_afp8<kva__mma_f16>>);
    else
        k = bf ? (g->b_kn ? gw_kernel<kva__mma_bf16, true, gw_a16>
                          : gw_kernel<kva__mma_bf16, false, gw_a16>)
               : (g->b_kn ? gw_kernel<kva__mma_f16, true, gw_a16>
                          : gw_kernel<kva__mma_f16, false, gw_a16>);
    /* Above the 48 KiB default, and all of the SM's unified memory as shared
     * memory so that two CTAs fit (the driver's default carveout may hold
     * one): host-side attributes, cheap to set again. */
    KVA_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM));
    KVA_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      (int)cudaSharedmemCarveoutMaxShared));
    k<<<grid, GW_THREADS, GW_SMEM, (cudaStream_t)stream>>>(p);
    KVA_CUDA_TRY(cudaGetLastError());
    return KVA_STATUS_OK;
}
