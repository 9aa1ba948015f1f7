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
 *     the input dtype.
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
 * The tile loop is otherwise the same.
 * The 16-bit instantiations are in mla_decode_mma.cu (with the host side),
 * the FP8 ones in mla_decode_mma_fp8.cu.
 */
#ifndef KVA_CUDA_MLA_DECODE_MMA_CUH
#define KVA_CUDA_MLA_DECODE_MMA_CUH
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "mla_decode_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#define ML_NW (ML_NT / 32) /* warps per CTA */

/* The dense policy's row format (the sparse ones: sp_rows16, sp_ds_mla):
 * RAW_ROW bytes per row of a raw ring (0: 16-bit rows land in the 16-bit
 * tiles), NP copies of P (one per value scale), FLAGS: per-stage key flags
 * in shared memory (none: the mask is positional), NST: ring stages. */
template <bool FP8> struct ml_dense_rows {
    static constexpr int RAW_ROW = FP8 ? ML_D : 0;
    static constexpr int NP = 1;
    static constexpr bool FLAGS = false;
    template <int MT, bool QR>
    static constexpr int NST = RAW_ROW && QR ? 4 : MT == 4 || QR ? 3 : 2;
};

/* Tile shape per MT (row tiles of 16), QR (Q in registers, MT = 1 only) and
 * row format R (above): keys per tile, ring stages, keys of one warp's S
 * slice, value columns of one warp; shared memory in bytes: Q [M, 576] (not
 * with QR: its registers are loaded from a staging copy in the last ring
 * stage, or with raw rows in the 16-bit tile, free until the first tile's
 * copies or conversion), the ring [NST][BN, 576] of 16-bit tiles (raw rows:
 * one 16-bit tile, then the ring [NST][BN, RAW_ROW] of raw bytes; dense FP8
 * with QR: NST = 4, the raw stages are half a tile, and the fourth fits), NP
 * copies of P [M, BN] (rows padded by 16 bytes against bank conflicts), the
 * row maxima and sums [8][64] fp32, (FLAGS) the key flags [NST][BN]. No dense FP8
 * configuration needs more than its 16-bit one. QR exists for the
 * memory-bound 16-row items (H <= 16 decodes): without the 18 KB of Q a
 * third 72 KB stage fits (227 KB on sm_90), so two tiles are in flight
 * while one is computed, and the ring never drains between tiles. */
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
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int P_BYTES = M * P_STRIDE;
    static constexpr int OFF_RING = QR ? 0 : M * ML_D * 2; /* the 16-bit tile(s) */
    static constexpr int OFF_RAW = OFF_RING + (RAW ? 1 : NST) * TILE;
    static constexpr int OFF_Q = !QR ? 0 : RAW ? OFF_RING : (NST - 1) * TILE;
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + NP * P_BYTES;
    static constexpr int OFF_OK = OFF_RED + 2 * ML_NW * 64 * 4;
    static constexpr int SMEM = OFF_OK + (R::FLAGS ? NST * BN * 4 : 0);
    static_assert(NBS >= 1 && KW % 8 == 0, "key slice of a warp");
    static_assert(!QR || (MT == 1 && NBS == 1 && NP == 1),
                  "Q in registers: one row tile, 8 keys a warp");
    static_assert(NP == 1 || NP == ML_DV / 128, "P copies: none, or one per c_kv tile of 128");
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
 * __syncthreads; the kernel uses no other named barrier). */
template <int MT> static __device__ __forceinline__ void ml_slice_sync(int kg)
{
    if constexpr (MT == 1)
        __syncwarp();
    else
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kg), "r"(MT * 32) : "memory");
}

/*
 * The key-source policy W of mla_decode_mma_kernel<Ty, MT, QR, W>: one object
 * per CTA, built from the launch's arguments (typedef args); typedef rows:
 * its row format; static items(a), scale_log2(a): the work items, the logits'
 * factor. Per item (C: the kernel's ml_tiles): load<C>(a, it) (false: the CTA
 * skips it) sets keys k0 .. kend - 1; issue<C>(a, kb, stage, ok) copies tile
 * kb (< kend, in order; ok: the stage's key flags) and the caller commits;
 * stage_q<C, elem>(a, dst) writes Q [M, 576] (zeros past the item's rows);
 * masks(a, r0) prepares logits for the thread's rows r0, r0 + 8; static
 * convert<C>(raw, tile, key0, rt, kg, lane) (RAW_ROW > 0) turns a landed raw
 * stage into the 16-bit tile, ordered before this warp's S (before P V: the
 * row max's and P's barriers); static key_scales<C>(raw, key0, t4, ksc) (NP >
 * 1) reads the 4 c_kv tile scales of keys key0 + 8 nt + 2 t4 + e;
 * logits<C>(sc, a, scale_log2, kb, key0, t4, ok) makes S of keys kb + key0 +
 * 8 nt + 2 t4 + e log2-unit logits (masked: -inf); finish<C>(a, s_sum, slice,
 * r0, col0, t4, l_run, m_run, o) stores, every thread past s_sum at its end.
 * Ty: kva__mma_bf16 or kva__mma_f16 (the q dtype; the 16-bit rows' too); MT:
 * row tiles of 16 per item; QR: Q in registers. Dynamic shared memory:
 * ml_tiles<MT, QR, W::rows>::SMEM.
 */
template <typename Ty, int MT, bool QR, typename W>
__global__ void __launch_bounds__(ML_NW * 32, 1) mla_decode_mma_kernel(const typename W::args a)
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
    const int32_t n_items = W::items(a);
    W wi(a);
    const float scale_log2 = W::scale_log2(a);
    /* The ring the copies fill: 16-bit tiles, or raw stages. */
    const uint32_t ring = C::RAW ? s0 + C::OFF_RAW : sRing;
    constexpr uint32_t STAGE = C::RAW ? C::RAW : C::TILE;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        if (!wi.template load<C>(a, it))
            continue;
        const int32_t kend = wi.kend;

        /* The first NST - 1 key tiles, then Q [M, 576] (zeros past the item's rows). */
#pragma unroll
        for (int st = 0; st < NST - 1; st++) {
            const int32_t kb = wi.k0 + st * BN;
            if (kb < kend)
                wi.template issue<C>(a, kb, ring + st * STAGE, s_ok + st * BN);
            kva__cp_async_commit();
        }
        wi.template stage_q<C, elem>(a, ml_smem + C::OFF_Q);
        /* QR: the A fragments of the 36 k-steps from the staged copy, which the
         * first tile's copies overwrite only after the loop's first barrier. */
        uint32_t qf[QR ? ML_D / 16 : 1][4];
        if constexpr (QR) {
            __syncthreads();
            const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
#pragma unroll
            for (int kk = 0; kk < ML_D / 16; kk++)
                kva__ldsm_x4(sQ + ml_off<0>(q_r, kk * 2 + q_c), qf[kk]);
        }
        wi.masks(a, row0 + g4);

        float o[NBO][4] = {};
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        int stage = 0;
        for (int32_t kb = wi.k0; kb < kend; kb += BN) {
            kva__cp_async_wait<NST - 2>();
            __syncthreads(); /* tile kb (and Q) landed for every thread; the previous
                                tile's stage, P and maxima are free */
            {
                const int32_t kn = kb + (NST - 1) * BN;
                const int ahead = stage == 0 ? NST - 1 : stage - 1;
                if (kn < kend)
                    wi.template issue<C>(a, kn, ring + ahead * STAGE, s_ok + ahead * BN);
                kva__cp_async_commit();
            }
            const int key0 = kg * KW; /* the first key of this warp's S slice */
            uint32_t sk = sRing + stage * C::TILE;
            if constexpr (C::RAW > 0) { /* the landed raw stage into the 16-bit tile */
                sk = sRing;
                W::template convert<C>(ml_smem + C::OFF_RAW + stage * C::RAW,
                                       ml_smem + C::OFF_RING, key0, rt, kg, lane);
            }

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
            __syncthreads(); /* P of every slice */

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
    __device__ __forceinline__ void issue(const args &a, int32_t kb, uint32_t stage, int *)
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
