/*
 * mla_decode_mma.cuh - absorbed MLA decode on tensor cores ("mla_decode_mma_sm80"):
 * the plan's work items over a latent paged cache (one row of D = Dc + Dr =
 * 576 elements per token, [c_kv 512 | k_pe 64], shared by every query head),
 * on mma.sync m16n8k16 with fp32 accumulation. Compiles for sm_80 and runs on
 * sm_90a as well (the portable tensor-core path of the MLA family).
 *
 * The math is FlashMLA's flash_mla_with_kvcache: per item (request r, heads
 * h0 .. h0 + nh - 1, query rows i0 .. i0 + nq - 1, keys [k0, k1)), the
 * M = nq * nh rows of q [T, H, 576] attend to the latent rows with head size
 * 576, and the values are the same rows' first Dv = 512 columns:
 *   S = q K^T (over 576), P = softmax(scale * S), out = P K[:, :512].
 *
 * One CTA (8 warps) runs one item at a time (persistent grid over the item
 * count of the device header). M is padded to 16 * MT rows (MT = 1, 2 or 4:
 * the plan picks the smallest that holds H * q_len up to 64), never to 64 or
 * 128, so H 8 or 16 decodes do not pay the tensor work of 64 rows.
 *
 * The body serves the sparse MLA too (mla_sparse.cu), as the wgmma one does
 * (mla_wgmma_body.cuh): the item, where its key rows come from and their
 * format, the logit mask and the stores are the key-source policy W of
 * mla_decode_mma_kernel<Ty, MT, QR, W> (below; the dense one is ml_dense).
 *
 *   - Q [M, 576] is staged in shared memory per item (XOR-swizzled 16-byte
 *     chunks, ldmatrix). The 16-row items of sm_90 (QR, ml_cfg) keep it in
 *     registers instead (the A fragments of all 36 k-steps, loaded once per
 *     item from a copy staged in the last ring stage): the 18 KB freed make
 *     room for a third ring stage.
 *   - The item's keys are cut into tiles of BN rows (64 for MT <= 2, 32 for
 *     MT = 4), copied by the whole CTA with cp.async into a ring of NST stages
 *     (NST - 1 tiles in flight; NST = 3 for MT = 4 and QR, else 2: with two
 *     stages the next tile is issued only when the previous one has fully
 *     landed, so the bytes in flight per SM fall to zero once per tile, which
 *     kept the memory-bound H 16 decode well under the copy bandwidth:
 *     docs/mla.md). Each tile is read from global memory once and serves S
 *     and P V: the value operand is the first 512 columns of the same
 *     shared-memory tile (no second load).
 *   - S = Q K^T: warp w computes row tile w % MT against its slice of
 *     BN * MT / 8 keys (36 k-steps over 576). The row max goes through shared
 *     memory (every warp of a row tile gets the same max, so the running max,
 *     the rescale and P agree between warps); P is written to shared memory in
 *     the input dtype. The sparse fp8_ds_mla 16-row items (the row format's
 *     ST) compute S transposed instead, S^T = K Q^T with Q^T in registers
 *     (ml_st_tile), and write P transposed, so P V below is unchanged.
 *   - O += P V: warp w owns row tile w % MT and the 64 * MT value columns
 *     (w / MT) * 64 * MT .. + 64 * MT - 1: O [16, 64 * MT] stays in its
 *     registers for the whole item, so no merge of O between warps; only the
 *     row sums l are added through shared memory at the end.
 *   - The epilogue (decode_mma_common.cuh) writes out [T, H, 512] and lse, or
 *     the split partial that split_merge.cu combines.
 * Keys at or past the item's end are zero-filled by cp.async and their block
 * table entries never read.
 *
 * The latent cache's format is the kernel's FP8 parameter: 16-bit rows land
 * straight in the ring of 16-bit tiles; FP8 E4M3 rows (mla_decode_common.cuh)
 * land by cp.async in a ring of raw stages of half the size (four with QR:
 * three tiles in flight; each thread's block-table entry read a tile before
 * its copies), and after a stage lands each warp converts the
 * rows of its own S slice into the one 16-bit tile that S and P V read;
 * only the warps that share a slice meet before S (none with MT = 1), and
 * the barriers of the row max and of P order every warp's rows before P V.
 * Raw rows of a row format with BULK (the sparse fp8_ds_mla rows of 16-row
 * items) land by one bulk copy per row instead (cp.async.bulk, sm_90), each
 * stage completing on its mbarrier, which the tile loop waits on instead of
 * a cp.async group; with the row format's PROD (sm_90a) that many producer
 * warps issue them and the compute warps never copy (ml_tiles::NPW).
 * The tile loop is otherwise the same.
 * The 16-bit instantiations are in mla_decode_mma.cu (with the host side),
 * the FP8 ones in mla_decode_mma_fp8.cu.
 */
#ifndef KVA_CUDA_MLA_DECODE_MMA_CUH
#define KVA_CUDA_MLA_DECODE_MMA_CUH
extern "C" {
#include "cuda_backend.h"
}
#include "async_ptx.cuh"
#include "cuda_check.h"
#include "mla_decode_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#define ML_NW (ML_NT / 32) /* warps per CTA */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ML_BULK_ARCH 0 /* no cp.async.bulk before sm_90 */
#else
#define ML_BULK_ARCH 1
#endif
/* Producer warps (ml_tiles::NPW) need setmaxnreg: sm_90a device passes and
 * the host pass; other device passes build the kernels without them. */
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ML_PROD_ARCH 0
#else
#define ML_PROD_ARCH 1
#endif
#define ML_REG_P 40  /* setmaxnreg of the producer warpgroup */
#define ML_REG_C 232 /* and of the compute warps: 256 x 232 + 128 x 40 <= 65,536 */

/* The mbarrier of a stage of bulk row copies (ml_tiles::BULK; sm_90 device
 * passes only, elsewhere nothing): set up with `count` arrivals per phase;
 * wait for the phase of the given parity. */
static __device__ __forceinline__ void ml_bulk_init(uint32_t bar, int count)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    kva__mbar_init(bar, count);
#else
    (void)bar, (void)count;
#endif
}
static __device__ __forceinline__ void ml_bulk_wait(uint32_t bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    kva__mbar_wait(bar, parity);
#else
    (void)bar, (void)parity;
#endif
}
/* One arrival on a stage's "free" mbarrier (ml_tiles::PROD). */
static __device__ __forceinline__ void ml_bulk_arrive(uint32_t bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    kva__mbar_arrive(bar);
#else
    (void)bar;
#endif
}

/* The dense policy's row format (the sparse ones: sp_rows16, sp_ds_mla):
 * RAW_ROW bytes per row of a raw ring (0: 16-bit rows land in the 16-bit
 * tiles), NP copies of P (one per value scale), FLAGS: per-stage key flags
 * in shared memory (none: the mask is positional), BULK: raw rows land by
 * one bulk copy per row (sm_90's cp.async.bulk, the copy engine's, not the
 * threads' 16-byte cp.async) completing on an mbarrier per stage, PROD:
 * producer warps (0: none; else that many warps past the 8 compute warps do
 * the row lookups and the bulk copies, ml_tiles::PROD), NST: ring stages. */
template <bool FP8> struct ml_dense_rows {
    static constexpr int RAW_ROW = FP8 ? ML_D : 0;
    static constexpr int NP = 1;
    static constexpr bool FLAGS = false;
    template <int MT> static constexpr bool BULK = false;
    template <int MT> static constexpr int PROD = 0;
    template <int MT, bool QR>
    static constexpr int NST = RAW_ROW && QR ? 4 : MT == 4 || QR ? 3 : 2;
    template <int MT> static constexpr bool ST = false;
};

/* Tile shape per MT (row tiles of 16), QR (Q in registers, MT = 1 only) and
 * row format R (above): keys per tile, ring stages, keys of one warp's S
 * slice, value columns of one warp; shared memory in bytes: Q [M, 576] (not
 * with QR or ST: its registers are loaded from a staging copy in the last ring
 * stage, or with raw rows in the 16-bit tile, free until the first tile's
 * copies or conversion), the ring [NST][BN, 576] of 16-bit tiles (raw rows:
 * one 16-bit tile, then the ring [NST][BN, RAW_ROW] of raw bytes; dense FP8
 * with QR: NST = 4, the raw stages are half a tile, and the fourth fits), NP
 * copies of P [M, BN] (rows padded by 16 bytes against bank conflicts), the
 * row maxima and sums [8][64] fp32, (FLAGS) the key flags [NST][BN], (ST)
 * the exchange of S halves [8 warps][32 lanes][4] fp32, (BULK) the
 * stages' mbarriers [NST] (8 bytes each; with producer warps a second set
 * [NST], the stages' "free" barriers). No dense FP8
 * configuration needs more than its 16-bit one. QR exists for the
 * memory-bound 16-row items (H <= 16 decodes): without the 18 KB of Q a
 * third 72 KB stage fits (227 KB on sm_90), so two tiles are in flight
 * while one is computed, and the ring never drains between tiles.
 * ST (the row format's ST<MT>; MT = 1, NP = 4, FLAGS, not QR): the
 * transposed S of ml_st_tile (below), Q^T in registers.
 * NPW (the row format's PROD<MT>; BULK rows only): producer warps past the
 * ML_NW compute warps, in a producer warpgroup of 4 warps (the others
 * idle: the register file is split over 4 quarters, so a ninth warp alone
 * would cap every warp at 168 registers), NTHR threads per CTA in all; the
 * warpgroup gives its registers to the compute warps (setmaxnreg: ML_REG_P,
 * ML_REG_C). The host launches the NTHR of the device's binary
 * (sm_90a: NPW of the row format; other passes: none). They look up the rows
 * and issue the bulk copies of every tile into the ring (all NST stages:
 * NST - 1 tiles in flight while one is computed, as before), each stage
 * behind two mbarriers: "full" (the rows landed: BN arrivals plus the
 * bytes) and "free" (the compute threads are done with its raw rows, key
 * flags and scales: one arrival, thread 0's after P's barrier). The
 * compute threads then never copy, and meet on ml_sync<true> (ML_NT
 * threads) instead of __syncthreads. Device passes without bulk copies
 * (before sm_90) keep the threads' copies: their producer warps exit at
 * once (PROD false). */
template <int MT, bool QR, typename R> struct ml_tiles {
    static constexpr int M = 16 * MT;
    static constexpr int BN = MT == 4 ? 32 : 64;
    static constexpr int NST = R::template NST<MT, QR>;
    static constexpr int NS = ML_NW / MT; /* key slices of S (warps per row tile) */
    static constexpr int KW = BN * MT / ML_NW;
    static constexpr int NBS = KW / 8;
    static constexpr int CW = ML_DV * MT / ML_NW;
    static constexpr int NBO = CW / 8;
    static constexpr int TILE = BN * ML_D * 2;
    static constexpr int RAW = BN * R::RAW_ROW; /* one raw stage (0: none) */
    static constexpr int NP = R::NP;
    static constexpr bool ST = R::template ST<MT>; /* the transposed S */
    static constexpr bool QREG = QR || ST;         /* Q lives in registers */
    /* Rows by bulk copies (the row format's BULK; sm_90 device passes and the
     * host's shared-memory size; earlier device passes copy with cp.async). */
    static constexpr bool BULK = R::template BULK<MT> && ML_BULK_ARCH;
    static constexpr int NPW = ML_PROD_ARCH ? R::template PROD<MT> : 0; /* producer warps */
    static constexpr int NTHR = ML_NT + (NPW ? 128 : 0);                /* threads per CTA */
    static constexpr bool PROD = NPW > 0 && BULK; /* this pass copies by producer warps */
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int P_BYTES = M * P_STRIDE;
    static constexpr int OFF_RING = QREG ? 0 : M * ML_D * 2; /* the 16-bit tile(s) */
    static constexpr int OFF_RAW = OFF_RING + (RAW ? 1 : NST) * TILE;
    static constexpr int OFF_Q = !QREG ? 0 : RAW ? OFF_RING : (NST - 1) * TILE;
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + NP * P_BYTES;
    static constexpr int OFF_OK = OFF_RED + 2 * ML_NW * 64 * 4;
    static constexpr int OFF_X = OFF_OK + (R::FLAGS ? NST * BN * 4 : 0);
    static constexpr int OFF_MB = OFF_X + (ST ? ML_NW * 32 * 16 : 0);
    static constexpr int SMEM = OFF_MB + (BULK ? (NPW ? 2 : 1) * NST * 8 : 0);
    static_assert(NBS >= 1 && KW % 8 == 0, "key slice of a warp");
    static_assert(!QR || (MT == 1 && NBS == 1 && NP == 1),
                  "Q in registers: one row tile, 8 keys a warp");
    static_assert(!ST ||
                      (MT == 1 && !QR && NP == 4 && BN == 64 && ML_NW == 8 && R::FLAGS && RAW > 0),
                  "transposed S: 16 heads, 4 key groups of 16 x 2 column halves, raw rows "
                  "with 4 tile scales, the mask in key flags");
    static_assert(NP == 1 || NP == ML_DV / 128, "P copies: none, or one per c_kv tile of 128");
    static_assert(!BULK || (RAW > 0 && R::FLAGS), "bulk copies: raw rows, the mask in key flags");
    static_assert(NPW == 0 ||
                      (R::template BULK<MT> && ST && NPW <= 4 && BN % (32 * (NPW ? NPW : 1)) == 0),
                  "producer warps: bulk rows, the transposed S, whole keys per lane");
    static_assert(SMEM <= 227 * 1024, "shared memory of one CTA");
};
/* The dense decode's shapes (host side: shared memory per kernel). */
template <int MT, bool QR = false, bool FP8 = false>
using ml_cfg = ml_tiles<MT, QR, ml_dense_rows<FP8>>;

/* S (+)= Q K^T of the 16 rows whose A fragments are qf (k-step kk: chunks
 * 2 kk, 2 kk + 1) against keys key0 .. key0 + 7 of the tile at sk, in two
 * chains (sa even k-steps, sb odd), as ml_qk's NBS = 1 case. */
template <typename Ty>
static __device__ __forceinline__ void ml_qk_reg(const uint32_t (*qf)[4], uint32_t sk, int key0,
                                                 int lane, float (*sa)[4], float (*sb)[4])
{
#pragma unroll
    for (int kk = 0; kk < ML_D / 16; kk += 2) {
        uint32_t kf[4];
        kva__ldsm_x4(sk + ml_off<0>(key0 + (lane & 7), kk * 2 + (lane >> 3)), kf);
        Ty::mma(sa[0], qf[kk], kf[0], kf[1]);
        Ty::mma(sb[0], qf[kk + 1], kf[2], kf[3]);
    }
}

/* The MT warps of key slice kg meet after converting their rows of the
 * slice (convert<C>'s end, before S reads them): MT = 1 the warp alone,
 * else named barrier 1 + kg of MT * 32 threads (barrier 0 is the kernel's
 * ml_sync: __syncthreads, or the 256 compute threads' with producer warps;
 * the only other named barriers, ml_st_tile's 1 + kq of 64 threads, come
 * with ST, which is MT = 1 only). */
template <int MT> static __device__ __forceinline__ void ml_slice_sync(int kg)
{
    if constexpr (MT == 1)
        __syncwarp();
    else
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kg), "r"(MT * 32) : "memory");
}

/*
 * The transposed S (C::ST: 16-row items over raw rows with 4 c_kv tile
 * scales, the sparse fp8_ds_mla rows): S^T = K Q^T with the keys as
 * mma.sync's M and the 16 heads as N (two n8 tiles), so Q is never read from
 * shared memory in the tile loop. Warp w takes key group kq = w % 4 (keys
 * 16 kq .. + 15 of the tile) and column half hh = w / 4 of the 36 k-steps:
 * ml_st_ks(hh, j), j < 18, the c_kv tiles 2 hh and 2 hh + 1 (k-steps
 * 16 hh .. + 15) and two k-steps of k_pe (32 + 2 hh, + 1). Q^T's B fragments
 * of those 18 k-steps stay in registers for the item (ml_st_load_q). The
 * pair of warps of a key group adds its halves through shared memory: each
 * warp keeps n8 tile hh (heads 8 hh .. + 7) and finishes the softmax there.
 * Fragment of a thread (g4 = lane / 4, t4 = lane % 4): sc[e] is key
 * 16 kq + g4 + 8 (e / 2), head 8 hh + 2 t4 + e % 2. P goes to shared memory
 * transposed (P [16 heads, BN keys], stmatrix.trans on sm_90), so P V is the
 * kernel's; its O rows are heads g4 and g4 + 8, whose running max m_run the
 * thread keeps beside m_st, the max of its own S heads (both from the same
 * maxima, so they agree); l_st sums P of its S heads and keys, turned into
 * ml_finish's l_run by ml_st_sums at the item's end.
 */
static __device__ __forceinline__ int ml_st_ks(int hh, int j)
{
    return j < 16 ? 16 * hh + j : 32 + 2 * hh + (j - 16);
}
/* Q^T's B fragments of half hh from Q [16, 576] at sQ: qf[j] = {b0, b1} of
 * heads 0-7, then of heads 8-15, at k-step ml_st_ks(hh, j). */
static __device__ __forceinline__ void ml_st_load_q(uint32_t sQ, int hh, int lane,
                                                    uint32_t (*qf)[4])
{
    const int b_r = (lane & 7) + (lane >> 4) * 8, b_c = (lane >> 3) & 1;
#pragma unroll
    for (int j = 0; j < ML_D / 32; j++)
        kva__ldsm_x4(sQ + ml_off<0>(b_r, 2 * ml_st_ks(hh, j) + b_c), qf[j]);
}
/* Four 8x8 b16 matrices stored transposed: r[i] is row g4, columns 2 t4 and
 * 2 t4 + 1 of matrix i, whose column j goes to the row address of lane
 * 8 i + j. (Before sm_90: per element, the same bytes.) */
template <typename Ty>
static __device__ __forceinline__ void ml_stsm_x4_trans(uint32_t addr, const float (*v)[2],
                                                        int lane, uint32_t base, int pitch)
{
#if __CUDA_ARCH__ >= 900
    (void)base, (void)pitch;
    uint32_t r[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        r[i] = Ty::pack(v[i][0], v[i][1]);
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
        "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
        : "memory");
#else
    (void)addr;
    /* base: the address of matrix i's row j = base(i) + j pitch, given per i
     * by the lanes 8 i (shuffled); element (g4, c) goes to row c at g4. */
    const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t b = __shfl_sync(0xffffffffu, base, 8 * i);
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const uint32_t h = Ty::pack(v[i][c], 0.f) & 0xffffu;
            asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(b + (2 * t4 + c) * pitch + g4 * 2),
                         "h"((unsigned short)h)
                         : "memory");
        }
    }
#endif
}
/* One key tile of the transposed S: S^T halves over the tile at sk (16-bit
 * [BN, 576]) with the raw stage's tile scales (W::key_scale4), summed with
 * the pair warp's half through s_x [8][32] float4 (named barrier 1 + kq of
 * 64 threads), logits (scale_log2; keys with flag 0: -inf), the running max
 * through s_max [4][16] (one CTA barrier), P^T's NP copies into sP; returns
 * whether any O row's max changed, and alpha, the rescale of O rows g4 and
 * g4 + 8. */
template <typename Ty, typename C, typename W>
static __device__ __forceinline__ bool
ml_st_tile(const uint32_t (*qf)[4], uint32_t sk, const unsigned char *raw, const int *ok,
           float scale_log2, float4 *s_x, float (*s_max)[64], uint32_t sP, int kq, int hh, int lane,
           float m_run[2], float m_st[2], float l_st[2], float alpha[2])
{
    const int g4 = lane >> 2, t4 = lane & 3, key0 = 16 * kq;
    float4 ks[2]; /* the 4 tile scales of keys key0 + g4 and key0 + g4 + 8 */
    ks[0] = W::key_scale4(raw, key0 + g4);
    ks[1] = W::key_scale4(raw, key0 + g4 + 8);
    float sh[2][2]; /* the scales of this half's c_kv tiles 2 hh, 2 hh + 1 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        sh[i][0] = hh ? ks[i].z : ks[i].x;
        sh[i][1] = hh ? ks[i].w : ks[i].y;
    }
    /* S^T half: per part (c_kv tile 2 hh + part, then k_pe's two k-steps),
     * even and odd k-steps in two chains per n8 tile. */
    const int a_r = key0 + (lane & 15), a_c = lane >> 4;
    float s[2][4] = {};
#pragma unroll
    for (int part = 0; part < 3; part++) {
        float ta[2][4] = {}, tb[2][4] = {};
#pragma unroll
        for (int j = 0; j < (part < 2 ? 8 : 2); j += 2) {
            const int jj = part * 8 + j, kk = ml_st_ks(hh, jj);
            uint32_t ka[4], kb[4];
            kva__ldsm_x4(sk + ml_off<0>(a_r, 2 * kk + a_c), ka);
            kva__ldsm_x4(sk + ml_off<0>(a_r, 2 * kk + 2 + a_c), kb);
            Ty::mma(ta[0], ka, qf[jj][0], qf[jj][1]);
            Ty::mma(ta[1], ka, qf[jj][2], qf[jj][3]);
            Ty::mma(tb[0], kb, qf[jj + 1][0], qf[jj + 1][1]);
            Ty::mma(tb[1], kb, qf[jj + 1][2], qf[jj + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float x = ta[n][e] + tb[n][e];
                s[n][e] = part < 2 ? fmaf(x, sh[e >> 1][part], s[n][e]) : s[n][e] + x;
            }
    }
    /* The pair's halves: keep n8 tile hh, hand over the other. */
    const int warp = threadIdx.x >> 5;
    float sc[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
        sc[e] = hh ? s[0][e] : s[1][e];
    s_x[warp * 32 + lane] = make_float4(sc[0], sc[1], sc[2], sc[3]);
    asm volatile("bar.sync %0, 64;\n" ::"r"(1 + kq) : "memory");
    const float4 y = s_x[(warp ^ 4) * 32 + lane];
    const float yv[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float x = (hh ? s[1][e] : s[0][e]) + yv[e];
        sc[e] = ok[key0 + g4 + 8 * (e >> 1)] ? x * scale_log2 : -INFINITY;
    }
    /* The max of heads 8 hh + 2 t4 + c over the tile: 2 keys, 8 lanes, 4 groups. */
#pragma unroll
    for (int c = 0; c < 2; c++) {
        float mx = fmaxf(sc[c], sc[c + 2]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g4 == 0)
            s_max[kq][8 * hh + 2 * t4 + c] = mx;
    }
    ml_sync<(C::NPW > 0)>(); /* every group's maxima */
    bool resc = false;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) { /* O rows: heads g4, g4 + 8 */
        float mx = m_run[hf];
#pragma unroll
        for (int k = 0; k < 4; k++)
            mx = fmaxf(mx, s_max[k][g4 + 8 * hf]);
        alpha[hf] = kva__ex2(m_run[hf] - (mx == -INFINITY ? 0.f : mx));
        resc |= mx != m_run[hf];
        m_run[hf] = mx;
    }
    float mu[2];
#pragma unroll
    for (int c = 0; c < 2; c++) { /* S heads: 8 hh + 2 t4 + c */
        float mx = m_st[c];
#pragma unroll
        for (int k = 0; k < 4; k++)
            mx = fmaxf(mx, s_max[k][8 * hh + 2 * t4 + c]);
        mu[c] = mx == -INFINITY ? 0.f : mx;
        l_st[c] *= kva__ex2(m_st[c] - mu[c]);
        m_st[c] = mx;
    }
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        p[e] = kva__ex2(sc[e] - mu[e & 1]);
        l_st[e & 1] += p[e];
    }
    /* P^T: matrix i of store q is copy 2 q + i / 2 (times the keys' scale of
     * c_kv tile 2 q + i / 2), keys key0 + 8 (i % 2) .. + 7, heads 8 hh .. + 7. */
    const float kv[2][4] = {{ks[0].x, ks[0].y, ks[0].z, ks[0].w},
                            {ks[1].x, ks[1].y, ks[1].z, ks[1].w}};
    const int mi = lane >> 3, mj = lane & 7;
#pragma unroll
    for (int q = 0; q < C::NP / 2; q++) {
        float v[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tp = 2 * q + (i >> 1), kh = i & 1;
            v[i][0] = p[2 * kh] * kv[kh][tp];
            v[i][1] = p[2 * kh + 1] * kv[kh][tp];
        }
        const uint32_t row = sP + (uint32_t)((2 * q + (mi >> 1)) * C::P_BYTES +
                                             (key0 + 8 * (mi & 1)) * 2 + 8 * hh * C::P_STRIDE);
        ml_stsm_x4_trans<Ty>(row + mj * C::P_STRIDE, v, lane, row, C::P_STRIDE);
    }
    return __any_sync(0xffffffffu, resc);
}
/* At the item's end: l_st of the thread's S heads summed over the warp's 16
 * keys, as ml_finish's l_run of O rows g4, g4 + 8 (this warp's partial on
 * the t4 = 0 lane of its own n8 tile, zero elsewhere: ml_finish adds the
 * lanes and the warps). */
static __device__ __forceinline__ void ml_st_sums(float l_st[2], int hh, int lane, float l_run[2])
{
    const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        l_st[c] += __shfl_xor_sync(0xffffffffu, l_st[c], 4);
        l_st[c] += __shfl_xor_sync(0xffffffffu, l_st[c], 8);
        l_st[c] += __shfl_xor_sync(0xffffffffu, l_st[c], 16);
    }
    const float v0 = __shfl_sync(0xffffffffu, l_st[0], g4 >> 1);
    const float v1 = __shfl_sync(0xffffffffu, l_st[1], g4 >> 1);
    const float v = t4 == 0 ? (g4 & 1 ? v1 : v0) : 0.f;
    l_run[0] = hh == 0 ? v : 0.f;
    l_run[1] = hh == 1 ? v : 0.f;
}

/*
 * The key-source policy W of mla_decode_mma_kernel<Ty, MT, QR, W>: one object
 * per CTA, built from the launch's arguments (typedef args); typedef rows:
 * its row format; static items(a), scale_log2(a): the work items, the logits'
 * factor. Per item (C: the kernel's ml_tiles): load<C>(a, it) (false: the CTA
 * skips it) sets keys k0 .. kend - 1; issue<C>(a, kb, stage, ok) copies tile
 * kb (< kend, in order; ok: the stage's key flags; bar: the stage's mbarrier
 * with C::BULK, which every key's copier arrives on once) and the caller commits;
 * stage_q<C, elem>(a, dst) writes Q [M, 576] (zeros past the item's rows);
 * masks(a, r0) prepares logits for the thread's rows r0, r0 + 8; static
 * convert<C>(raw, tile, key0, rt, kg, lane) (RAW_ROW > 0) turns a landed raw
 * stage into the 16-bit tile, ordered before this warp's S (before P V: the
 * row max's and P's barriers); static key_scales<C>(raw, key0, t4, ksc) (NP >
 * 1) reads the 4 c_kv tile scales of keys key0 + 8 nt + 2 t4 + e;
 * logits<C>(sc, a, scale_log2, kb, key0, t4, ok) makes S of keys kb + key0 +
 * 8 nt + 2 t4 + e log2-unit logits (masked: -inf); finish<C>(a, s_sum, slice,
 * r0, col0, t4, l_run, m_run, o) stores, every thread past s_sum at its end
 * (C::NPW: every compute thread, ml_sync<true>).
 * Ty: kva__mma_bf16 or kva__mma_f16 (the q dtype; the 16-bit rows' too); MT:
 * row tiles of 16 per item; QR: Q in registers. Dynamic shared memory:
 * ml_tiles<MT, QR, W::rows>::SMEM; threads: its NTHR (ML_NT compute
 * threads, then NPW producer warps). With producer warps (C::PROD), load and
 * issue run in them as well: load<C> in every thread (the producer's own
 * keys: W's business), issue<C> only in the producer warps, one tile per
 * stage in order, after the stage's "free" barrier.
 */
template <typename Ty, int MT, bool QR, typename W>
__global__ void __launch_bounds__(ml_tiles<MT, QR, typename W::rows>::NTHR, 1)
    mla_decode_mma_kernel(const typename W::args a)
{
    typedef ml_tiles<MT, QR, typename W::rows> C;
    typedef typename Ty::elem elem;
    constexpr int BN = C::BN, NST = C::NST, KW = C::KW, NBS = C::NBS, NBO = C::NBO;
    extern __shared__ __align__(128) unsigned char ml_smem[];
    const uint32_t s0 = kva__smem_u32(ml_smem), sQ = s0 + C::OFF_Q;
    const uint32_t sRing = s0 + C::OFF_RING, sP = s0 + C::OFF_P;
    float(*s_max)[64] = (float(*)[64])(ml_smem + C::OFF_RED);
    float(*s_sum)[64] = (float(*)[64])(ml_smem + C::OFF_RED + ML_NW * 64 * 4);
    int *s_ok = (int *)(ml_smem + C::OFF_OK); /* [NST][BN] key flags (FLAGS) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const int rt = warp % MT; /* row tile of this warp */
    const int kg = warp / MT; /* key slice (S) and column slice (O) of this warp */
    const int row0 = rt * 16; /* first row of the row tile */
    constexpr bool ST = C::ST;
    const int kq = warp & 3, hh = warp >> 2;      /* ST: key group and column half */
    float4 *s_x = (float4 *)(ml_smem + C::OFF_X); /* ST: [8][32] S halves */
    const int32_t n_items = W::items(a);
    W wi(a);
    const float scale_log2 = W::scale_log2(a);
    /* The ring the copies fill: 16-bit tiles, or raw stages. */
    const uint32_t ring = C::RAW ? s0 + C::OFF_RAW : sRing;
    constexpr uint32_t STAGE = C::RAW ? C::RAW : C::TILE;
    /* BULK: stage st's mbarrier at sMB + 8 st, one arrival per key of a tile
     * (W::issue); bit st of ph: the parity of the stage's next phase. With
     * producer warps, its "free" mbarrier at sFree + 8 st (one arrival). */
    const uint32_t sMB = s0 + C::OFF_MB, sFree = sMB + 8 * NST;
    uint32_t ph = 0;
    constexpr bool CONS = C::NPW > 0; /* the compute threads meet alone */
    if constexpr (C::BULK) {
        if (threadIdx.x < NST)
            ml_bulk_init(sMB + 8 * threadIdx.x, BN);
        else if (C::NPW > 0 && threadIdx.x < 2 * NST)
            ml_bulk_init(sMB + 8 * threadIdx.x, 1);
        __syncthreads();
    }
    if constexpr (C::NPW > 0) {
        if (warp >= ML_NW) { /* the producer warpgroup: its first NPW warps copy */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ML_REG_P) : "memory");
#endif
            if (C::PROD && warp < ML_NW + C::NPW) {
                /* Stage st is free for its n-th tile once the compute threads
                 * released its (n - 1)-th: bit st of fph is the parity to wait
                 * for, 1 first (a fresh mbarrier's previous phase counts as
                 * complete). The stages restart at 0 with every item, as the
                 * compute threads' do. */
                uint32_t fph = (1u << NST) - 1;
                for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                    if (!wi.template load<C>(a, it))
                        continue;
                    int stage = 0;
                    for (int32_t kb = wi.k0; kb < wi.kend; kb += BN) {
                        ml_bulk_wait(sFree + 8 * stage, (fph >> stage) & 1u);
                        fph ^= 1u << stage;
                        wi.template issue<C>(a, kb, ring + stage * STAGE, s_ok + stage * BN,
                                             sMB + 8 * stage);
                        stage = stage == NST - 1 ? 0 : stage + 1;
                    }
                }
            }
            return;
        }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ML_REG_C) : "memory");
#endif
    }

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        if (!wi.template load<C>(a, it))
            continue;
        const int32_t kend = wi.kend;

        /* The first NST - 1 key tiles (not with producer warps: they do it),
         * then Q [M, 576] (zeros past the item's rows). */
        if constexpr (!C::PROD) {
#pragma unroll
            for (int st = 0; st < NST - 1; st++) {
                const int32_t kb = wi.k0 + st * BN;
                if (kb < kend)
                    wi.template issue<C>(a, kb, ring + st * STAGE, s_ok + st * BN, sMB + 8 * st);
                kva__cp_async_commit();
            }
        }
        wi.template stage_q<C, elem>(a, ml_smem + C::OFF_Q);
        /* QR: the A fragments of the 36 k-steps from the staged copy, which the
         * first tile's copies overwrite only after the loop's first barrier. */
        uint32_t qf[QR ? ML_D / 16 : ST ? ML_D / 32 : 1][4];
        if constexpr (QR) {
            ml_sync<CONS>();
            const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
#pragma unroll
            for (int kk = 0; kk < ML_D / 16; kk++)
                kva__ldsm_x4(sQ + ml_off<0>(q_r, kk * 2 + q_c), qf[kk]);
        } else if constexpr (ST) { /* ST: Q^T of this warp's half */
            ml_sync<CONS>();
            ml_st_load_q(sQ, hh, lane, qf);
        }
        wi.masks(a, row0 + g4);

        float o[NBO][4] = {};
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        float m_st[2] = {-INFINITY, -INFINITY}, l_st[2] = {0.f, 0.f}; /* ST: S heads */

        int stage = 0;
        for (int32_t kb = wi.k0; kb < kend; kb += BN) {
            if constexpr (C::BULK) { /* the stage's rows (the flags: the barrier below) */
                ml_bulk_wait(sMB + 8 * stage, (ph >> stage) & 1u);
                ph ^= 1u << stage;
            } else {
                kva__cp_async_wait<NST - 2>();
            }
            ml_sync<CONS>(); /* tile kb (and Q) landed for every thread; the previous
                                tile's stage, P and maxima are free */
            if constexpr (!C::PROD) {
                const int32_t kn = kb + (NST - 1) * BN;
                const int ahead = stage == 0 ? NST - 1 : stage - 1;
                if (kn < kend)
                    wi.template issue<C>(a, kn, ring + ahead * STAGE, s_ok + ahead * BN,
                                         sMB + 8 * ahead);
                kva__cp_async_commit();
            }
            /* The first key of this warp's S slice (ST: of its key group). */
            const int key0 = ST ? 16 * kq : kg * KW;
            uint32_t sk = sRing + stage * C::TILE;
            if constexpr (C::RAW > 0) { /* the landed raw stage into the 16-bit tile */
                sk = sRing;
                W::template convert<C>(ml_smem + C::OFF_RAW + stage * C::RAW, ml_smem + C::OFF_RING,
                                       key0, ST ? hh : rt, kg, lane);
            }
            if constexpr (ST) {
                float alpha[2];
                if (ml_st_tile<Ty, C, W>(qf, sk, ml_smem + C::OFF_RAW + stage * C::RAW,
                                         s_ok + stage * BN, scale_log2, s_x, s_max, sP, kq, hh,
                                         lane, m_run, m_st, l_st, alpha))
                    ml_rescale<NBO>(o, alpha);
            } else {
                /* S = Q K^T for row tile rt and keys kb + kg * KW .. + KW - 1. */
                float sc[NBS][4] = {};
                float ksc[C::NP > 1 ? NBS : 1][2][4]; /* the keys' c_kv tile scales (NP > 1) */
                if constexpr (C::NP > 1) {
                    /* Per part (the 4 c_kv tiles of 8 k-steps, then k_pe's 4),
                     * each c_kv part times its key's tile scale. */
                    W::template key_scales<C>(ml_smem + C::OFF_RAW + stage * C::RAW, key0, t4, ksc);
#pragma unroll
                    for (int part = 0; part < 5; part++) {
                        float ta[NBS][4] = {}, tb[NBS][4] = {};
                        if (part < 4)
                            ml_qk<Ty, NBS, 8>(sQ, sk, row0, key0, part * 8, lane, ta, tb);
                        else
                            ml_qk<Ty, NBS, 4>(sQ, sk, row0, key0, 32, lane, ta, tb);
#pragma unroll
                        for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float x = ta[nt][e] + tb[nt][e];
                                sc[nt][e] = part < 4 ? fmaf(x, ksc[nt][e & 1][part & 3], sc[nt][e])
                                                     : sc[nt][e] + x;
                            }
                    }
                } else {
                    /* Over all 36 k-steps, in two accumulator sets (even and odd
                     * k-steps) for independent mma chains. */
                    float sc2[NBS][4] = {};
                    if constexpr (QR)
                        ml_qk_reg<Ty>(qf, sk, key0, lane, sc, sc2);
                    else
                        ml_qk<Ty, NBS, ML_D / 16>(sQ, sk, row0, key0, 0, lane, sc, sc2);
#pragma unroll
                    for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            sc[nt][e] += sc2[nt][e];
                }
                /* Logits (log2 units) and the mask where some row may not see a key. */
                wi.template logits<C>(sc, a, scale_log2, kb, key0, t4, s_ok + stage * BN);
                /* The running max over every key slice of the row tile. */
                float alpha[2], mu[2];
                const bool resc =
                    ml_tile_max<NBS, C::NS>(sc, s_max, kg, row0 + g4, t4, m_run, l_run, alpha, mu);
                /* P of the warp's keys, in the input dtype, into the shared P tile
                 * (NP > 1: one copy per value tile, times the keys' scales of that tile). */
                ml_store_p<Ty, NBS, C::NP, C::P_STRIDE, C::P_BYTES>(sc, mu, sP, row0 + g4, key0, t4,
                                                                    l_run, C::NP > 1 ? ksc : NULL);
                if (resc)
                    ml_rescale<NBO>(o, alpha);
            }
            ml_sync<CONS>(); /* P of every slice */
            if constexpr (C::PROD) { /* every compute thread is done with the raw stage */
                if (threadIdx.x == 0)
                    ml_bulk_arrive(sFree + 8 * stage);
            }

            /* O += P V: P [16, BN] of the row tile, V = the tile's columns
             * kg * CW .. + CW - 1 (ldmatrix.trans of the latent rows); NP > 1:
             * per value tile of 128 columns, with that tile's P. */
            const int cc0 = kg * (C::CW / 8); /* first value chunk of the warp */
            constexpr int NBT = C::NP > 1 && NBO > 16 ? 16 : NBO; /* n8 tiles per P copy */
#pragma unroll
            for (int pt = 0; pt < NBO / NBT; pt++) {
                const int tp = C::NP > 1 ? (cc0 + pt * NBT) >> 4 : 0;
                ml_pv<Ty, BN, NBT, C::P_STRIDE>(sP + tp * C::P_BYTES, sk, row0, cc0 + pt * NBT,
                                                lane, o + pt * NBT);
            }
            stage = stage == NST - 1 ? 0 : stage + 1;
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */
        if constexpr (ST)
            ml_st_sums(l_st, hh, lane, l_run);

        wi.template finish<C>(a, s_sum, kg, row0 + g4, kg * C::CW, t4, l_run, m_run, o);
    }
}

/* The dense key-source policy of mla_decode_mma_kernel: the plan's work
 * items (request, heads, query rows, keys [k0, k1)), key tiles of the
 * request's contiguous positions gathered through its block-table row, the
 * plan's masks, and ml_finish's stores. FP8: the cache holds FP8 E4M3 codes
 * with one k_scale (mla_decode_common.cuh), folded into the logits' scale
 * and the output rows. */
template <typename Ty, bool FP8> struct ml_dense {
    typedef kva__cuda_attn_args args;
    typedef ml_dense_rows<FP8> rows;
    int32_t bt_stride;
    ml_item mi;
    int32_t k0, kend;
    int64_t row_next; /* FP8: the thread's cache row in the next tile to issue */
    int32_t lo[2], hi[2], pos[2], lo_all, hi_all; /* the thread's rows' visible keys */
    float slope[2];

    __device__ __forceinline__ explicit ml_dense(const args &a)
        : bt_stride(a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE])
    {
    }
    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    }
    static __device__ __forceinline__ float scale_log2(const args &a)
    {
        return (FP8 ? a.scale * a.kv_scale : a.scale) * KVA__DMMA_LOG2E;
    }
    template <typename C> __device__ __forceinline__ bool load(const args &a, int32_t it)
    {
        mi = ml_item_load(a, it, bt_stride);
        k0 = mi.w.k0;
        kend = mi.w.k1;
        if constexpr (FP8)
            row_next = ml_row<C::BN>(a, mi.bt_row, k0, kend);
        return true;
    }
    /* The copies of tile kb: 16-bit rows (layout ml_off<0>; the block-table
     * entry read just before them: read a tile ahead they ran slower) or FP8
     * rows (raw; then the next tile's entry is read, so that its copies do
     * not wait for it). */
    template <typename C>
    __device__ __forceinline__ void issue(const args &a, int32_t kb, uint32_t stage, int *,
                                          uint32_t)
    {
        if constexpr (FP8) {
            ml_issue_fp8_row<C::BN>(a, row_next, stage);
            row_next = ml_row<C::BN>(a, mi.bt_row, kb + C::BN, kend);
        } else {
            ml_issue<C::BN, 0>(a, mi.bt_row, kb, kend, stage);
        }
    }
    template <typename C, typename elem>
    __device__ __forceinline__ void stage_q(const args &a, unsigned char *dst) const
    {
        ml_stage_q<C::M, 0, elem>(a, mi.w, mi.nrows, mi.qs, dst);
    }
    /* (Through locals: with the members as its out-parameters, the compiler
     * unrolled kva__dmma_rows' row loop less and the code changed.) */
    __device__ __forceinline__ void masks(const args &a, int r0)
    {
        int32_t l[2], h[2], p[2], la, ha;
        float sl[2];
        kva__dmma_rows(a, mi.w, mi.nrows, mi.s, mi.q_len, r0, l, h, p, sl, la, ha);
#pragma unroll
        for (int i = 0; i < 2; i++)
            lo[i] = l[i], hi[i] = h[i], pos[i] = p[i], slope[i] = sl[i];
        lo_all = la, hi_all = ha;
    }
    /* Each of the MT warps of key slice kg converts KW / MT of its rows; those
     * warps meet before S reads them. */
    template <typename C>
    static __device__ __forceinline__ void convert(const unsigned char *raw, unsigned char *tile,
                                                   int key0, int rt, int kg, int lane)
    {
        constexpr int MT = C::M / 16;
        static_assert(C::KW % MT == 0, "FP8: the warps of a key slice convert its rows");
        ml_fp8_rows<C::KW / MT, Ty>(raw, tile, key0 + rt * (C::KW / MT), lane);
        ml_slice_sync<MT>(kg);
    }
    template <typename C>
    __device__ __forceinline__ void logits(float (*sc)[4], const args &a, float scale_log2,
                                           int32_t kb, int key0, int t4, const int *) const
    {
        kva__dmma_logits<C::KW>(sc, a, scale_log2, kb + key0, t4, lo_all, hi_all, lo, hi, pos,
                                slope);
    }
    template <typename C>
    __device__ __forceinline__ void finish(const args &a, float (*s_sum)[64], int slice, int r0,
                                           int col0, int t4, float l_run[2], const float m_run[2],
                                           const float (*o)[4]) const
    {
        ml_finish<C::NBO, C::NS, Ty>(ml_dst{a, mi.w, mi.nrows, mi.qs, FP8 ? a.kv_scale : 1.f},
                                     s_sum, slice, r0, col0, t4, l_run, m_run, o);
    }
};

/* ---- host side shared by the two instantiation files ---- */

typedef struct ml_pick_t {
    ml_kernel_fn fn;
    int smem;
} ml_pick_t;

/* The FP8-cache kernel for q dtype dt (bf16 or f16) and items of `rows` rows
 * (16, 32 or 64), qr: the 16-row kernel with Q in registers
 * (mla_decode_mma_fp8.cu); {NULL, 0} for anything else. */
ml_pick_t kva__cuda_mla_mma_pick_fp8(kva_dtype dt, int rows, bool qr);

#endif
