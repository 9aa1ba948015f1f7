/*
 * mla_decode_wgmma.cu - absorbed MLA decode on sm_90a warpgroup MMA
 * ("mla_decode_wgmma_sm90"): the plan's work items of up to 64 rows over a
 * latent paged cache (D 576 = c_kv 512 | k_pe 64, values = the first 512
 * columns), the same math and item format as mla_decode_mma.cu, which keeps
 * the items of 16 and 32 rows (H * q_len <= 32: no padding of small head
 * counts to 64) and every item on sm_80.
 *
 * One CTA = two warpgroups (256 threads) runs one item at a time (persistent
 * grid) with a "seesaw" schedule over pairs of key tiles (docs/mla.md):
 *   - Q [64, 576] is staged once per item in shared memory (wgmma K-major
 *     layout, 128-byte swizzle, 9 column blocks of 64);
 *   - key tiles of 32 latent rows (every row read once, for S and P V) go
 *     round four buffers, tile t in buffer t % 4: warpgroup 0 gathers the
 *     even tiles, warpgroup 1 the odd ones (cp.async, 128 threads each), each
 *     a pair of tiles ahead of its use, the cache rows of its keys read from
 *     the block table a pair ahead of that;
 *   - warpgroup g computes the whole S = Q K^T [64, 32] of its own tile (36
 *     wgmma m64n32k16 from shared memory) and its softmax, so the two
 *     warpgroups' S products run side by side on the tensor cores;
 *   - warpgroup g owns value columns 256 g .. 256 g + 255 of O (128 fp32
 *     registers per thread) and adds both tiles' P V to them: its own P from
 *     registers (A operand of the wgmma), the other warpgroup's P from one
 *     shared P tile;
 *   - the running max travels with P: warpgroup 0's tile 2i uses the max of
 *     the previous pair, warpgroup 1's tile 2i + 1 the max after tile 2i, and
 *     both end the pair at the same max.
 * Handoffs: named barriers 1 "P0 and m0 written" and 3 "P1 and m1 written"
 * are met by both warpgroups (bar.sync: the data pass through generic shared
 * memory, and the rendezvous also orders the next pair's rewrites); two
 * mbarriers say "buffer free" (warpgroup 1 arrives on [0] after its P0 V, so
 * that warpgroup 0 may copy tile t0 + 4 into tile t0's buffer; warpgroup 0 on
 * [1] after its P1 V, for tile t0 + 5) and order only wgmma reads before
 * cp.async writes; 5 and 6 are each warpgroup's own "tile landed" barrier.
 * The P tile needs no barrier of its own: P0 is overwritten by P1 only after
 * warpgroup 1's P0 V completed, P1 by the next P0 only after warpgroup 0's
 * P1 V completed.
 * Shared memory: Q 72 KB + 4 x 36 KB tiles + P 8 KB + the maxima, row sums and
 * mbarriers (+ 1 KB alignment) = 226 KB.
 * Everything that issues sm_90a instructions is compiled only for sm_90a
 * (__CUDA_ARCH_FEAT_SM90_ALL); other device passes get an empty kernel that the
 * host never launches (the registry entry is usable only with sm_90a code and
 * a compute capability 9.0 device).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "mla_decode_common.cuh"
#include "wgmma_ptx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_MLA_WGMMA_BODY 1
#endif

#define MW_M 64     /* rows per item */
#define MW_LAZY 8.f /* log2 headroom of the lazily moved softmax max */
#define MW_BN 32    /* keys per tile */
#define MW_NB 4     /* tile buffers: two per warpgroup */
#define MW_QB (MW_M * ML_D * 2)
#define MW_KB (MW_BN * ML_D * 2)
#define MW_PB (MW_M * 64 * 2) /* P [64, 64] tile layout, the first MW_BN keys used */
#define MW_SMEM (MW_QB + MW_NB * MW_KB + MW_PB + 4 * 64 * 4 + 16 + 1024)

#ifdef KVA_MLA_WGMMA_BODY
/* S [64, 32] += A [64, 16] B [16, 32], A and B K-major in shared memory;
 * d[16] in the accumulator layout of wgmma_ptx.cuh. */
#define MW_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MW_SS_N32(ty)                                                                              \
    static __device__ __forceinline__ void mw_ss_n32_##ty(float d[16], uint64_t da, uint64_t db)   \
    {                                                                                              \
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32." #ty "." #ty " " MW_R16          \
                     ", %16, %17, 1, 1, 1, 0, 0;\n"                                                \
                     : KVA__WG_D8("+f", 0), KVA__WG_D8("+f", 8)                                    \
                     : "l"(da), "l"(db));                                                          \
    }
MW_SS_N32(bf16)
MW_SS_N32(f16)
/* The same with S overwritten (scale-d false) and an output only: the first
 * k-step, so that S carries no dependency on the registers' earlier values
 * (the softmax that rewrites them may then run beside another wgmma). */
#define MW_SS0_N32(ty)                                                                             \
    static __device__ __forceinline__ void mw_ss0_n32_##ty(float d[16], uint64_t da, uint64_t db)  \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." #ty "." #ty " " MW_R16          \
                     ", %16, %17, p, 1, 1, 0, 0;\n}\n"                                             \
                     : KVA__WG_D8("=f", 0), KVA__WG_D8("=f", 8)                                    \
                     : "l"(da), "l"(db));                                                          \
    }
MW_SS0_N32(bf16)
MW_SS0_N32(f16)
/* O [64, 128] += A [64, 16] B [16, 128], A K-major, B MN-major (imm-trans-b = 1). */
#define MW_SS_N128_TB(ty)                                                                          \
    static __device__ __forceinline__ void mw_ss_n128_tb_##ty(float d[64], uint64_t da,            \
                                                              uint64_t db)                         \
    {                                                                                              \
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." #ty "." #ty " " KVA__WG_R64    \
                     ", %64, %65, 1, 1, 1, 0, 1;\n"                                                \
                     : KVA__WG_D64("+f")                                                           \
                     : "l"(da), "l"(db));                                                          \
    }
MW_SS_N128_TB(bf16)
MW_SS_N128_TB(f16)

template <typename Ty> struct mw_ops;
template <> struct mw_ops<kva__mma_bf16> {
    static __device__ __forceinline__ void s(float *d, uint64_t a, uint64_t b, int sc)
    {
        if (sc)
            mw_ss_n32_bf16(d, a, b);
        else
            mw_ss0_n32_bf16(d, a, b);
    }
    static __device__ __forceinline__ void o_ss(float *d, uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_bf16(d, a, b);
    }
    static __device__ __forceinline__ void o_rs(float *d, const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_bf16_tb(d, a, b, 1);
    }
};
template <> struct mw_ops<kva__mma_f16> {
    static __device__ __forceinline__ void s(float *d, uint64_t a, uint64_t b, int sc)
    {
        if (sc)
            mw_ss_n32_f16(d, a, b);
        else
            mw_ss0_n32_f16(d, a, b);
    }
    static __device__ __forceinline__ void o_ss(float *d, uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_f16(d, a, b);
    }
    static __device__ __forceinline__ void o_rs(float *d, const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_f16_tb(d, a, b, 1);
    }
};

/* Named barrier of both warpgroups (n = 256) or of one (n = 128). */
static __device__ __forceinline__ void mw_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* S [64, 32] = Q K^T of the tile at sk (36 k-steps over 576), issued and
 * committed, not waited for. */
template <typename Ty>
static __device__ __forceinline__ void mw_qk(float (&s)[4][4], uint64_t dq, uint32_t sk)
{
    const uint64_t dk = kva__wgmma_desc(sk, 16, 1024);
    kva__wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < ML_D / 16; kk++)
        mw_ops<Ty>::s(&s[0][0], dq + (uint64_t)(((kk >> 2) * MW_M * 128 + (kk & 3) * 32) >> 4),
                      dk + (uint64_t)(((kk >> 2) * MW_BN * 128 + (kk & 3) * 32) >> 4), kk > 0);
    kva__wgmma_commit();
}

/* O [64, 256] (this warpgroup's value columns, column blocks 4 g ..) += P V of
 * the tile at sk: P from registers (pa, the A fragments of the 2 k-steps) or,
 * with pa NULL, from the shared P tile at sp. Issued and committed. */
template <typename Ty>
static __device__ __forceinline__ void mw_pv(float (&o)[128], const uint32_t (*pa)[4], uint32_t sp,
                                             uint32_t sk, int wg)
{
    const uint64_t dv = kva__wgmma_desc(sk, MW_BN * 128, 1024);
    const uint64_t dp = kva__wgmma_desc(sp, 16, 1024);
    kva__wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < MW_BN / 16; kk++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint64_t db =
                dv + (uint64_t)(((4 * wg + 2 * h) * MW_BN * 128 + kk * 16 * 128) >> 4);
            if (pa)
                mw_ops<Ty>::o_rs(&o[64 * h], pa[kk], db);
            else
                mw_ops<Ty>::o_ss(&o[64 * h], dp + (uint64_t)((kk * 32) >> 4), db);
        }
    kva__wgmma_commit();
}

/* Keeps the registers of a P operand live (unreused) until the wgmma that
 * reads them asynchronously has been waited for. */
static __device__ __forceinline__ void mw_keep(const uint32_t (&pa)[2][4])
{
#pragma unroll
    for (int i = 0; i < 2; i++)
        asm volatile("" ::"r"(pa[i][0]), "r"(pa[i][1]), "r"(pa[i][2]), "r"(pa[i][3]) : "memory");
}

static __device__ __forceinline__ void mw_fence_o(float (&o)[128])
{
#pragma unroll
    for (int i = 0; i < 128; i++)
        kva__reg_fence(o[i]);
}

/* O rows r0 / r0 + 8 times f[0] / f[1] (skipped by the warp when all are 1). */
static __device__ __forceinline__ void mw_rescale(float (&o)[128], const float f[2])
{
    if (!__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f))
        return;
#pragma unroll
    for (int n = 0; n < 32; n++) {
        o[4 * n] *= f[0];
        o[4 * n + 1] *= f[0];
        o[4 * n + 2] *= f[1];
        o[4 * n + 3] *= f[1];
    }
}

/* Softmax of the warpgroup's own tile: s holds raw scores of keys kb ..
 * kb + 31; m (rows r0, r0 + 8, log2 units) is the running max it starts
 * from and becomes the max after the tile. P = 2^(s - m) goes to pa (the A
 * fragments of the 2 P V k-steps) and its partial row sums to lsum; f is
 * the factor that moves the state relative to the old max onto the new. */
template <typename Ty>
static __device__ __forceinline__ void
mw_softmax(float (&s)[4][4], const kva__cuda_attn_args &a, float scale_log2, int32_t kb, int t4,
           int32_t lo_all, int32_t hi_all, const int32_t lo[2], const int32_t hi[2],
           const int32_t pos[2], const float slope[2], float m[2], float f[2], float lsum[2],
           uint32_t (&pa)[2][4])
{
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            kva__reg_fence(s[j][e]);
    kva__dmma_logits<MW_BN>(s, a, scale_log2, kb, t4, lo_all, hi_all, lo, hi, pos, slope);
    float mu[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = m[hf];
#pragma unroll
        for (int j = 0; j < 4; j++)
            mx = fmaxf(mx, fmaxf(s[j][2 * hf], s[j][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* Lazy rescaling: the reference max moves only when the row's max
         * grows by more than MW_LAZY (log2 units) or was -inf, so P stays
         * below 2^MW_LAZY and O, l are rarely rescaled; any reference gives
         * the same out and lse. */
        if (!(mx > m[hf] + MW_LAZY) && m[hf] != -INFINITY)
            mx = m[hf];
        mu[hf] = mx == -INFINITY ? 0.f : mx;
        f[hf] = kva__ex2(m[hf] - mu[hf]); /* 0 while m = -inf */
        m[hf] = mx;
        lsum[hf] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[j][e] = kva__ex2(s[j][e] - mu[e >> 1]);
            lsum[e >> 1] += s[j][e];
        }
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
        kva__dmma_pack_p<Ty>(&s[2 * kk], pa[kk]);
}

/* P (pa) into the shared P tile ([64, 64] K-major, 128-byte swizzle) and the
 * rows' max into sm [64]; then the proxy fence for the wgmma reads. */
static __device__ __forceinline__ void mw_publish(const uint32_t (&pa)[2][4], const float m[2],
                                                  uint32_t sp, float *sm, int r0, int t4)
{
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = r0 + 8 * hf;
            const uint32_t addr = sp + (uint32_t)(r * 128 + ((j ^ (r & 7)) << 4) + 4 * t4);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pa[j >> 1][2 * (j & 1) + hf])
                         : "memory");
        }
    if (t4 == 0) {
        sm[r0] = m[0];
        sm[r0 + 8] = m[1];
    }
    kva__fence_proxy_async();
}

/* The state (O, l, m) moved from max m onto the other warpgroup's max mn
 * (>= m), read from sm [64]. */
static __device__ __forceinline__ void mw_follow(float (&o)[128], float l[2], float m[2],
                                                 const float *sm, int r0)
{
    float f[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float mn = sm[r0 + 8 * hf];
        f[hf] = kva__ex2(m[hf] - (mn == -INFINITY ? 0.f : mn));
        m[hf] = mn;
        l[hf] *= f[hf];
    }
    mw_rescale(o, f);
}
#endif

__device__ int mw_exp; /* EXPERIMENT (not for merge): 1 no copies, 2 no wgmma, 4 no P V */

template <typename Ty>
__global__ void __launch_bounds__(ML_NT, 1) mla_decode_wgmma_kernel(const kva__cuda_attn_args a)
{
#ifdef KVA_MLA_WGMMA_BODY
    typedef typename Ty::elem elem;
    extern __shared__ __align__(1024) unsigned char mw_smem_raw[];
    const uint32_t raw = kva__smem_u32(mw_smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + MW_QB, sP = sK + MW_NB * MW_KB;
    unsigned char *q_gen = mw_smem_raw + (sQ - raw);
    float *s_m0 = reinterpret_cast<float *>(q_gen + MW_QB + MW_NB * MW_KB + MW_PB);
    float *s_m1 = s_m0 + 64;
    float(*s_sum)[64] = reinterpret_cast<float(*)[64]>(s_m1 + 64);
    /* "Buffer free" mbarriers (128 arrivals each): [0] tile t0's buffer, by
     * warpgroup 1 for warpgroup 0; [1] tile t0 + 1's, by 0 for 1. */
    const uint32_t mb_free = sP + MW_PB + 4 * 64 * 4;
    if (threadIdx.x == 0) {
        kva__mbar_init(mb_free, 128);
        kva__mbar_init(mb_free + 8, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    uint32_t free_phase = 0; /* completed waits of this warpgroup's mbarrier */

    const int tid = threadIdx.x, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int wg = tid >> 7, wt = tid & 127; /* warpgroup: tile parity and column half of O */
    const int r0 = (wt >> 5) * 16 + g4;      /* the thread's rows r0 and r0 + 8 */
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    const uint64_t dq = kva__wgmma_desc(sQ, 16, 1024);
    const int ex = mw_exp;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        const ml_item mi = ml_item_load(a, it, bt_stride);
        const kva__cuda_item &w = mi.w;
        const int32_t nrows = mi.nrows, qs = mi.qs, kend = w.k1;
        const int32_t *bt_row = mi.bt_row;
        const int32_t nt = kend > w.k0 ? (kend - w.k0 + MW_BN - 1) / MW_BN : 0; /* tiles */

        /* Tile wg into buffer wg while Q is staged; the cache row of the
         * thread's key in tile wg + 2 (the next it copies) read ahead. */
        if (wg < nt && !(ex & 1))
            ml_issue<MW_BN, MW_BN, 128>(a, bt_row, w.k0 + wg * MW_BN, kend, sK + wg * MW_KB, wt);
        kva__cp_async_commit();
        int64_t row_next = ml_row<MW_BN, 128>(a, bt_row, w.k0 + (wg + 2) * MW_BN, kend, wt);
        ml_stage_q<MW_M, MW_M, elem>(a, w, nrows, qs, q_gen);
        kva__fence_proxy_async(); /* Q stores -> the wgmma operand reads */
        __syncthreads();
        int32_t lo[2], hi[2], pos[2], lo_all, hi_all;
        float slope[2];
        kva__dmma_rows(a, w, nrows, mi.s, mi.q_len, r0, lo, hi, pos, slope, lo_all, hi_all);

        /* O [64, 256] of this warpgroup: o[64 h + 4 j + e] is n8 tile 16 h + j
         * (value column 256 wg + 128 h + 8 j + 2 t4 + e % 2, row r0 + 8 (e / 2)). */
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; i++)
            o[i] = 0.f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

        for (int32_t t0 = 0; t0 < nt; t0 += 2) { /* the pair of tiles t0, t0 + 1 */
            const bool has1 = t0 + 1 < nt;
            /* Tile t of the item lives in buffer t % 4. */
            const uint32_t buf0 = sK + (uint32_t)(t0 & 3) * MW_KB, buf1 = buf0 + MW_KB;
            /* This warpgroup's tile of the next pair (t0 + 2 + wg) goes into
             * the buffer of its tile of the previous pair, once the other
             * warpgroup's P V on that one is done (barrier 2 / 4). */
            const int32_t tn = t0 + 2 + wg;
            if (t0 >= 2 && tn < nt) {
                kva__mbar_wait(mb_free + 8 * wg, free_phase & 1);
                free_phase++;
            }
            if (tn < nt && !(ex & 1)) {
                ml_issue_row<MW_BN, MW_BN, 128>(a, row_next, sK + (uint32_t)(tn & 3) * MW_KB, wt);
                row_next = ml_row<MW_BN, 128>(a, bt_row, w.k0 + (tn + 2) * MW_BN, kend, wt);
            }
            kva__cp_async_commit();
            float s[4][4], f[2], lsum[2];
            uint32_t pa[2][4];
            if (wg == 0) {
                /* Tile t0: S, softmax from the pair's starting max, P0 and m0
                 * to warpgroup 1, O += P0 V (left half). */
                kva__cp_async_wait<1>();  /* all but the copy just issued */
                kva__fence_proxy_async(); /* cp.async -> the wgmma operand reads */
                mw_bar_sync(5, 128);
                if (ex & 2)
                    for (int i = 0; i < 16; i++)
                        s[i / 4][i % 4] = 0.f;
                else
                    mw_qk<Ty>(s, dq, buf0);
                kva__wgmma_wait<0>();
                mw_softmax<Ty>(s, a, scale_log2, w.k0 + t0 * MW_BN, t4, lo_all, hi_all, lo, hi, pos,
                               slope, m, f, lsum, pa);
                mw_publish(pa, m, sP, s_m0, r0, t4);
                mw_bar_sync(1, 256);
                mw_rescale(o, f);
                l[0] = l[0] * f[0] + lsum[0];
                l[1] = l[1] * f[1] + lsum[1];
                if (!(ex & 6))
                    mw_pv<Ty>(o, pa, sP, buf0, 0);
                kva__wgmma_wait<0>();
                mw_keep(pa);
                mw_fence_o(o);
                if (has1) {
                    /* Tile t0 + 1: O (left half) onto m1, += P1 V from the
                     * shared P tile; its buffer is then free for tile t0 + 5. */
                    mw_bar_sync(3, 256);
                    mw_follow(o, l, m, s_m1, r0);
                    if (!(ex & 6))
                        mw_pv<Ty>(o, NULL, sP, buf1, 0);
                    kva__wgmma_wait<0>();
                    mw_fence_o(o);
                    if (t0 + 5 < nt)
                        kva__mbar_arrive(mb_free + 8);
                }
            } else {
                /* Tile t0 + 1's S runs beside warpgroup 0's S and softmax. */
                if (has1) {
                    kva__cp_async_wait<1>();
                    kva__fence_proxy_async();
                    mw_bar_sync(6, 128);
                    if (ex & 2)
                        for (int i = 0; i < 16; i++)
                            s[i / 4][i % 4] = 0.f;
                    else
                        mw_qk<Ty>(s, dq, buf1);
                }
                mw_bar_sync(1, 256);
                /* S is waited for and the softmax done before the P0 V wgmma
                 * is issued: ptxas serializes wgmmas around other instructions
                 * that write the registers of an accumulator (warpgroup 0's
                 * P0 V keeps the tensor cores busy meanwhile). */
                kva__wgmma_wait<0>();
                mw_follow(o, l, m, s_m0, r0);
                if (has1)
                    mw_softmax<Ty>(s, a, scale_log2, w.k0 + (t0 + 1) * MW_BN, t4, lo_all, hi_all,
                                   lo, hi, pos, slope, m, f, lsum, pa);
                if (!(ex & 6))
                    mw_pv<Ty>(o, NULL, sP, buf0, 1);
                kva__wgmma_wait<0>();
                mw_fence_o(o);
                if (t0 + 4 < nt)
                    kva__mbar_arrive(mb_free); /* tile t0's buffer: free for tile t0 + 4 */
                if (has1) {
                    /* P1 and m1 to warpgroup 0 (P0 has been read), O += P1 V. */
                    mw_rescale(o, f);
                    l[0] = l[0] * f[0] + lsum[0];
                    l[1] = l[1] * f[1] + lsum[1];
                    mw_publish(pa, m, sP, s_m1, r0, t4);
                    mw_bar_sync(3, 256);
                    if (!(ex & 6))
                        mw_pv<Ty>(o, pa, sP, buf1, 1);
                    kva__wgmma_wait<0>();
                    mw_keep(pa);
                    mw_fence_o(o);
                }
            }
        }
        kva__cp_async_wait<0>(); /* nothing may land in a buffer after the item */
        ml_finish<32, 2, Ty>(a, w, nrows, qs, s_sum, wg, r0, wg * 256, t4, l, m,
                             reinterpret_cast<const float(*)[4]>(o));
    }
#endif
}

/* ---- host side ---- */

static ml_kernel_fn mw_pick(kva_dtype dt)
{
    if (dt == KVA_DTYPE_BF16)
        return mla_decode_wgmma_kernel<kva__mma_bf16>;
    if (dt == KVA_DTYPE_F16)
        return mla_decode_wgmma_kernel<kva__mma_f16>;
    return NULL;
}

extern "C" int kva__cuda_mla_wgmma_ctas_per_sm(kva_dtype dtype)
{
    return kva__cuda_prefill_wgmma_ready() ? ml_ctas_per_sm(mw_pick(dtype), MW_SMEM) : 0;
}

extern "C" kva_status kva__cuda_mla_wgmma_launch(const kva__cuda_attn_args *a, kva_dtype dtype,
                                                 int grid, void *stream)
{
    const ml_kernel_fn fn = mw_pick(dtype);
    {
        const char *e = getenv("KVA_MLA_EXP"); /* EXPERIMENT (not for merge) */
        const int v = e ? atoi(e) : 0;
        cudaMemcpyToSymbol(mw_exp, &v, sizeof v);
    }
    if (!fn || !kva__cuda_mla_decode_supported(a->D, a->Dv, dtype) || a->Hkv != 1 || a->ragged ||
        !kva__cuda_prefill_wgmma_ready())
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: mla_decode_wgmma_sm90 needs an sm_90a build and "
                         "device, D = 576, Dv = 512, Hkv = 1, a paged f16/bf16 latent cache (got "
                         "D = %d, Dv = %d, Hkv = %d, dtype = %s)",
                         (int)a->D, (int)a->Dv, (int)a->Hkv, kva_dtype_name(dtype));
    return ml_launch(fn, MW_SMEM, a, grid, stream);
}
