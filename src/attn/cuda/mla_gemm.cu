/*
 * mla_gemm.cu - the batched tensor-core GEMM and the row copies of the CUDA
 * layer-level MLA (kva_mla_run, mla_run.cu): the per-head projections
 * q_nope . W_UK and out_latent . W_UV of the absorbed path, and the
 * decompression c_kv . W_UK^T, c_kv . W_UV of the compute-friendly path.
 * kva__cuda_mla_gemm runs the sm_90a wgmma form (mla_gemm_wgmma.cu) where
 * the build, the device and the shape take it (K a multiple of 64, N of
 * 128, C 16-byte aligned), and the mma.sync form below elsewhere (sm_80 /
 * sm_89, other shapes, or forced: kva__cuda_context_mla_gemm); a product
 * pair (b2) that the wgmma form does not take runs as two products here.
 *
 * The mma.sync form, one kernel body: C[h][m, n] = sum_k A[h][m, k] B[h][k, n] for every head h
 * (blockIdx.z), f16 or bf16 operands on mma.sync m16n8k16 with fp32
 * accumulation, the result rounded once to the element type. A's and C's rows
 * may be gathered / scattered through int32 row maps (a negative A row reads
 * zeros, a negative C row is skipped), which is how the latent rows of a paged
 * cache and the decode tokens of a mixed batch enter without copies. B is
 * either K-major ([N, K] rows: W_UK[h] read as W_UK^T) or N-major ([K, N]
 * rows: W_UV[h], W_UK[h] read as itself); the layout is a template parameter
 * and the shared-memory tile keeps the global layout (ldmatrix .trans for
 * N-major), so both load with 16-byte cp.async.
 * Tiles: 128 x 128 outputs per CTA of 8 warps (2 x 4, 64 x 32 each), k steps
 * of 64, two shared-memory stages (72 KiB of dynamic shared memory: up to
 * three CTAs per SM). Requirements (checked by the launcher):
 * K, N, the leading dimensions and head strides multiples of 8 elements,
 * A and B 16-byte aligned, C 4-byte aligned.
 * An FP8 E4M3 latent cache enters as the A-format template parameter: its
 * rows are loaded 8 codes at a time and stored as their exact 16-bit values
 * in the same A tile (plain loads, not cp.async), and the cache's scale
 * multiplies the fp32 result before its one rounding. Dequantizing the chunk
 * into the workspace first would need a [keys, 576] buffer the plan cannot
 * size (it does not know the cache's format) and a second pass over the rows.
 */
extern "C" {
#include "mla_run.h"
}
#include "cuda_check.h"
#include "mma_ptx.cuh"
#include "quant_cvt.cuh"

#include <cuda_runtime.h>

namespace
{

constexpr int BM = 128, BN = 128, BK = 64, THREADS = 256;
constexpr int A_LD = BK + 8;   /* halves per A row in shared memory (144 bytes: no bank conflict) */
constexpr int BNK_LD = BK + 8; /* K-major B: [BN][BK + 8] */
constexpr int BKN_LD = BN + 8; /* N-major B: [BK][BN + 8] */
constexpr int A_STAGE = BM * A_LD;
constexpr int B_STAGE = (BN * BNK_LD > BK * BKN_LD) ? BN * BNK_LD : BK * BKN_LD;
constexpr int SMEM_BYTES = 2 * (A_STAGE + B_STAGE) * 2;

/* The kernel reads the launcher's arguments as they are (a, b as bytes). */
typedef kva__cuda_mla_gemm_args gemm_p;

/* Loads the k-step starting at k0 of the CTA's A and B tiles into stage s
 * (AF8: A's FP8 codes converted to TR's 16-bit values by plain stores). */
template <typename TR, bool KN, bool AF8>
__device__ __forceinline__ void load_stage(const gemm_p &p, uint16_t *As, uint16_t *Bs, int m0,
                                           int n0, int k0, int h)
{
    const int tid = threadIdx.x;
    /* A: BM rows x BK / 8 chunks = 1024 chunks, four per thread. */
    for (int i = tid; i < BM * (BK / 8); i += THREADS) {
        const int r = i / (BK / 8), ch = i % (BK / 8);
        const int m = m0 + r, k = k0 + ch * 8;
        int64_t row = -1;
        if (m < p.M)
            row = p.a_rows ? p.a_rows[m] : m;
        const bool ok = row >= 0 && k < p.K;
        const int64_t e = row * p.lda + (int64_t)h * p.a_head + k; /* element of A */
        if constexpr (AF8) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (ok)
                v = kva__fp8x8_as<TR>(*reinterpret_cast<const uint2 *>((const char *)p.a + e));
            *reinterpret_cast<uint4 *>(As + r * A_LD + ch * 8) = v;
        } else {
            const char *src = ok ? (const char *)p.a + 2 * e : (const char *)p.a;
            kva__cp_async16(kva__smem_u32(As + r * A_LD + ch * 8), src, ok ? 16 : 0);
        }
    }
    if (KN) {
        /* B [K, N]: BK rows x BN / 8 chunks. */
        for (int i = tid; i < BK * (BN / 8); i += THREADS) {
            const int r = i / (BN / 8), ch = i % (BN / 8);
            const int k = k0 + r, n = n0 + ch * 8;
            const bool ok = k < p.K && n < p.N;
            const char *src =
                ok ? (const char *)p.b + 2 * ((int64_t)h * p.b_head + (int64_t)k * p.ldb + n)
                   : (const char *)p.b;
            kva__cp_async16(kva__smem_u32(Bs + r * BKN_LD + ch * 8), src, ok ? 16 : 0);
        }
    } else {
        /* B [N, K]: BN rows x BK / 8 chunks. */
        for (int i = tid; i < BN * (BK / 8); i += THREADS) {
            const int r = i / (BK / 8), ch = i % (BK / 8);
            const int n = n0 + r, k = k0 + ch * 8;
            const bool ok = k < p.K && n < p.N;
            const char *src =
                ok ? (const char *)p.b + 2 * ((int64_t)h * p.b_head + (int64_t)n * p.ldb + k)
                   : (const char *)p.b;
            kva__cp_async16(kva__smem_u32(Bs + r * BNK_LD + ch * 8), src, ok ? 16 : 0);
        }
    }
}

template <typename TR, bool KN, bool AF8>
__global__ void __launch_bounds__(THREADS) gemm_kernel(gemm_p p)
{
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *As[2] = {smem, smem + A_STAGE};
    uint16_t *Bs[2] = {smem + 2 * A_STAGE, smem + 2 * A_STAGE + B_STAGE};
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, h = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32; /* warp tile origin */
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.f;

    const int ksteps = (p.K + BK - 1) / BK;
    load_stage<TR, KN, AF8>(p, As[0], Bs[0], m0, n0, 0, h);
    kva__cp_async_commit();
    for (int ks = 0; ks < ksteps; ks++) {
        const int s = ks & 1;
        if (ks + 1 < ksteps)
            load_stage<TR, KN, AF8>(p, As[s ^ 1], Bs[s ^ 1], m0, n0, (ks + 1) * BK, h);
        kva__cp_async_commit();
        kva__cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = wm + i * 16 + (lane % 16), c = kk + (lane / 16) * 8;
                kva__ldsm_x4(kva__smem_u32(As[s] + r * A_LD + c), af[i]);
            }
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                uint32_t t[4];
                if (KN) {
                    /* Matrices: (k0, n), (k0 + 8, n), (k0, n + 8), (k0 + 8, n + 8). */
                    const int k = kk + ((lane / 8) % 2) * 8 + lane % 8;
                    const int n = wn + j * 8 + (lane / 16) * 8;
                    kva__ldsm_x4_trans(kva__smem_u32(Bs[s] + k * BKN_LD + n), t);
                } else {
                    const int n = wn + j * 8 + (lane / 16) * 8 + lane % 8;
                    const int k = kk + ((lane / 8) % 2) * 8;
                    kva__ldsm_x4(kva__smem_u32(Bs[s] + n * BNK_LD + k), t);
                }
                bf[j][0] = t[0], bf[j][1] = t[1], bf[j + 1][0] = t[2], bf[j + 1][1] = t[3];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    TR::mma(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
        __syncthreads();
    }
    kva__cp_async_wait<0>();

    /* Epilogue: thread holds rows g, g + 8 and columns 2t, 2t + 1 of each m16n8 tile. */
    const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int m = m0 + wm + i * 16 + g + half * 8;
            if (m >= p.M)
                continue;
            const int64_t row = p.c_rows ? p.c_rows[m] : m;
            if (row < 0)
                continue;
            char *crow = (char *)p.c + 2 * (row * p.ldc + (int64_t)h * p.c_head);
            const float cs = AF8 ? p.c_scale : 1.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = n0 + wn + j * 8 + t2;
                if (n < p.N)
                    *(uint32_t *)(crow + 2 * n) =
                        TR::pack(acc[i][j][half * 2] * cs, acc[i][j][half * 2 + 1] * cs);
            }
        }
}

/* The load policies of copy_kernel: chunk `ch` (8 elements) of head h of
 * source row sr as one 16-byte chunk of the destination dtype. copy_load16:
 * 16-bit source rows, copied as they are; copy_load_fp8<TR>: FP8 E4M3 source
 * rows (8 codes, 8 bytes), each code * src_scale rounded once to TR. */
struct copy_load16 {
    static __device__ __forceinline__ uint4 load(const kva__cuda_mla_copy &p, int64_t sr, int h,
                                                 int ch)
    {
        return *(const uint4 *)((const char *)p.src +
                                2 * (sr * p.lds + (int64_t)h * p.src_head + ch * 8));
    }
};
template <typename TR> struct copy_load_fp8 {
    static __device__ __forceinline__ uint4 load(const kva__cuda_mla_copy &p, int64_t sr, int h,
                                                 int ch)
    {
        const uint2 c =
            *(const uint2 *)((const char *)p.src + sr * p.lds + (int64_t)h * p.src_head + ch * 8);
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t pair = ((q < 2 ? c.x : c.y) >> (16 * (q & 1))) & 0xffffu;
            const __half2_raw hr =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
            const float2 f = __half22float2(__half2(hr));
            w[q] = TR::pack(f.x * p.src_scale, f.y * p.src_scale);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

/* Row copy: dst[drow(m)][h][0:w] = src[srow(m)][h][0:w] in chunks of 8
 * elements (16 destination bytes), each loaded by the policy L (a negative
 * source row writes zeros, a negative destination row nothing). */
template <typename L> __global__ void copy_kernel(kva__cuda_mla_copy p)
{
    const int chunks = p.width / 8;
    const int64_t total = (int64_t)p.M * p.heads * chunks;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ch = (int)(i % chunks);
        const int h = (int)((i / chunks) % p.heads);
        const int m = (int)(i / ((int64_t)chunks * p.heads));
        const int64_t dr = p.dst_rows ? p.dst_rows[m] : m;
        if (dr < 0)
            continue;
        const int64_t sr = p.src_rows ? p.src_rows[m] : m;
        const uint4 v = sr >= 0 ? L::load(p, sr, h, ch) : make_uint4(0, 0, 0, 0);
        *(uint4 *)((char *)p.dst + 2 * (dr * p.ldd + (int64_t)h * p.dst_head + ch * 8)) = v;
    }
}

} // namespace

extern "C" kva_status kva__cuda_mla_gemm(const kva__cuda_mla_gemm_args *g, void *stream)
{
    if (g->M <= 0 || g->N <= 0 || g->heads <= 0)
        return KVA_STATUS_OK;
    if (g->b2 && (g->ldb2 % 8 || g->b2_head % 8 || g->ldc2 % 8 || g->c2_head % 8 ||
                  (uintptr_t)g->b2 % 16 || (uintptr_t)g->c2 % 4))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: the second GEMM's operands are not multiples of 8 "
                         "elements, aligned");
    if (g->K <= 0 || g->K % 8 || g->N % 8 || g->lda % 8 || g->ldb % 8 || g->ldc % 8 ||
        g->a_head % 8 || g->b_head % 8 || g->c_head % 8 || (uintptr_t)g->a % (g->a_fp8 ? 8 : 16) ||
        (uintptr_t)g->b % 16 || (uintptr_t)g->c % 4 ||
        (g->dtype != KVA_DTYPE_F16 && g->dtype != KVA_DTYPE_BF16))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: GEMM operands M %d, N %d, K %d (%s) are not multiples of 8 "
                         "elements, aligned f16/bf16",
                         (int)g->M, (int)g->N, (int)g->K, kva_dtype_name(g->dtype));
    /* The sm_90a wgmma form where the build, the device and the shape take
     * it (mla_gemm_wgmma.cu), unless a test or benchmark forced this one. */
    if (!g->mma_only && kva__cuda_mla_gemm_wgmma_fits(g))
        return kva__cuda_mla_gemm_wgmma(g, stream);
    if (g->b2) { /* here: the two products one after the other */
        kva__cuda_mla_gemm_args one = *g;
        one.b2 = NULL, one.c2 = NULL;
        KVA_TRY(kva__cuda_mla_gemm(&one, stream));
        one.b = g->b2, one.ldb = g->ldb2, one.b_head = g->b2_head, one.b_kn = g->b2_kn;
        one.c = g->c2, one.ldc = g->ldc2, one.c_head = g->c2_head;
        return kva__cuda_mla_gemm(&one, stream);
    }
    const gemm_p p = *g;
    const dim3 grid((unsigned)((g->M + BM - 1) / BM), (unsigned)((g->N + BN - 1) / BN),
                    (unsigned)g->heads);
    cudaStream_t s = (cudaStream_t)stream;
    const bool bf = g->dtype == KVA_DTYPE_BF16;
    void (*k)(gemm_p) = g->a_fp8 ? (bf ? (g->b_kn ? gemm_kernel<kva__mma_bf16, true, true>
                                                  : gemm_kernel<kva__mma_bf16, false, true>)
                                       : (g->b_kn ? gemm_kernel<kva__mma_f16, true, true>
                                                  : gemm_kernel<kva__mma_f16, false, true>))
                                 : (bf ? (g->b_kn ? gemm_kernel<kva__mma_bf16, true, false>
                                                  : gemm_kernel<kva__mma_bf16, false, false>)
                                       : (g->b_kn ? gemm_kernel<kva__mma_f16, true, false>
                                                  : gemm_kernel<kva__mma_f16, false, false>));
    /* Above the 48 KiB default: a host-side attribute, cheap to set again. */
    KVA_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    k<<<grid, THREADS, SMEM_BYTES, s>>>(p);
    KVA_CUDA_TRY(cudaGetLastError());
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_mla_copy_rows(const kva__cuda_mla_copy *c, void *stream)
{
    if (c->M <= 0 || c->heads <= 0 || c->width <= 0)
        return KVA_STATUS_OK;
    const int64_t total = (int64_t)c->M * c->heads * (c->width / 8);
    const int blocks = (int)(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
    if (c->src_fp8 && c->dtype == KVA_DTYPE_BF16)
        copy_kernel<copy_load_fp8<kva__mma_bf16>><<<blocks, 256, 0, (cudaStream_t)stream>>>(*c);
    else if (c->src_fp8)
        copy_kernel<copy_load_fp8<kva__mma_f16>><<<blocks, 256, 0, (cudaStream_t)stream>>>(*c);
    else
        copy_kernel<copy_load16><<<blocks, 256, 0, (cudaStream_t)stream>>>(*c);
    KVA_CUDA_TRY(cudaGetLastError());
    return KVA_STATUS_OK;
}
