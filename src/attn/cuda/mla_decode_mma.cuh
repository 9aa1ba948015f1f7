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

/* Tile shape per MT (row tiles of 16), QR (Q in registers, MT = 1 only) and
 * FP8 (the cache's rows are FP8 E4M3 codes): keys per tile, ring stages,
 * keys of one warp's S slice, value columns of one warp; shared memory in
 * bytes: Q [M, 576] (not with QR: its registers are loaded from a staging
 * copy in the last ring stage, or with FP8 in the 16-bit tile, free until
 * the first tile's copies or conversion), the ring [NST][BN, 576] of 16-bit
 * tiles (FP8: one 16-bit tile, then the ring [NST][BN, 576] of raw bytes,
 * NST = 4 with QR: the raw stages are half a tile, and the fourth fits),
 * P [M, BN] (rows padded by 16 bytes against bank conflicts), the row maxima
 * and sums [8][64] fp32. No FP8 configuration needs more than its 16-bit one.
 * QR exists for the memory-bound 16-row items (H <= 16 decodes): without the
 * 18 KB of Q a third 72 KB stage fits (227 KB on sm_90), so two tiles are in
 * flight while one is computed, and the ring never drains between tiles. */
template <int MT, bool QR = false, bool FP8 = false> struct ml_cfg {
    static constexpr int M = 16 * MT;
    static constexpr int BN = MT == 4 ? 32 : 64;
    static constexpr int NST = FP8 && QR ? 4 : MT == 4 || QR ? 3 : 2;
    static constexpr int KW = BN * MT / ML_NW;
    static constexpr int NBS = KW / 8;
    static constexpr int CW = ML_DV * MT / ML_NW;
    static constexpr int NBO = CW / 8;
    static constexpr int TILE = BN * ML_D * 2;
    static constexpr int RAW = FP8 ? BN * ML_D : 0; /* one raw stage of FP8 rows */
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int OFF_RING = QR ? 0 : M * ML_D * 2; /* the 16-bit tile(s) */
    static constexpr int OFF_RAW = OFF_RING + (FP8 ? 1 : NST) * TILE;
    static constexpr int OFF_Q = !QR ? 0 : FP8 ? OFF_RING : (NST - 1) * TILE;
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + M * P_STRIDE;
    static constexpr int SMEM = OFF_RED + 2 * ML_NW * 64 * 4;
    static_assert(NBS >= 1 && KW % 8 == 0, "key slice of a warp");
    static_assert(!QR || (MT == 1 && NBS == 1), "Q in registers: one row tile, 8 keys a warp");
    static_assert(!FP8 || KW % MT == 0, "FP8: the warps of a key slice convert its rows");
    static_assert(SMEM <= 227 * 1024, "shared memory of one CTA");
};

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

/* The copies of the tile at kb into a ring stage: 16-bit rows (layout
 * ml_off<0>) or FP8 rows (raw). */
template <int BN, bool FP8>
static __device__ __forceinline__ void ml_issue_any(const kva__cuda_attn_args &a,
                                                    const int32_t *bt_row, int32_t kb, int32_t kend,
                                                    uint32_t stage)
{
    if constexpr (FP8)
        ml_issue_fp8_row<BN>(a, ml_row<BN>(a, bt_row, kb, kend), stage);
    else
        ml_issue<BN, 0>(a, bt_row, kb, kend, stage);
}

/*
 * Ty: kva__mma_bf16 or kva__mma_f16 (the q dtype; the 16-bit cache's too);
 * MT: row tiles of 16 per item; QR: Q in registers (ml_cfg); FP8: the cache
 * is FP8 E4M3 with k_scale a.kv_scale. Dynamic shared memory as
 * ml_cfg<MT, QR, FP8>.
 */
template <typename Ty, int MT, bool QR, bool FP8>
__global__ void __launch_bounds__(ML_NW * 32, 1) mla_decode_mma_kernel(const kva__cuda_attn_args a)
{
    typedef ml_cfg<MT, QR, FP8> C;
    typedef typename Ty::elem elem;
    constexpr int M = C::M, BN = C::BN, NST = C::NST, KW = C::KW, NBS = C::NBS, NBO = C::NBO;
    extern __shared__ __align__(128) unsigned char ml_smem[];
    const uint32_t s0 = kva__smem_u32(ml_smem), sQ = s0 + C::OFF_Q;
    const uint32_t sRing = s0 + C::OFF_RING, sP = s0 + C::OFF_P;
    float(*s_max)[64] = (float(*)[64])(ml_smem + C::OFF_RED);
    float(*s_sum)[64] = (float(*)[64])(ml_smem + C::OFF_RED + ML_NW * 64 * 4);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const int rt = warp % MT; /* row tile of this warp */
    const int kg = warp / MT; /* key slice (S) and column slice (O) of this warp */
    const int row0 = rt * 16; /* first row of the row tile */
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    /* FP8: the codes' logits times the cache's scale too (mla_decode_common.cuh). */
    const float scale_log2 = (FP8 ? a.scale * a.kv_scale : a.scale) * KVA__DMMA_LOG2E;
    /* The ring the copies fill: 16-bit tiles, or (FP8) raw stages. */
    const uint32_t ring = FP8 ? s0 + C::OFF_RAW : sRing;
    constexpr uint32_t STAGE = FP8 ? C::RAW : C::TILE;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        const ml_item mi = ml_item_load(a, it, bt_stride);
        const kva__cuda_item &w = mi.w;
        const int32_t nrows = mi.nrows, qs = mi.qs, kend = w.k1;
        const int32_t *bt_row = mi.bt_row;

        /* The first NST - 1 key tiles, then Q [M, 576] (zeros past nrows). */
#pragma unroll
        for (int st = 0; st < NST - 1; st++) {
            const int32_t kb = w.k0 + st * BN;
            if (kb < kend)
                ml_issue_any<BN, FP8>(a, bt_row, kb, kend, ring + st * STAGE);
            kva__cp_async_commit();
        }
        /* FP8: the thread's cache row in the tile the loop issues first; in the
         * loop each tile's row is read one tile before its copies are issued,
         * so that they do not wait for the block-table read (the 16-bit
         * kernels read it just before the copies: read ahead, they ran
         * slower). */
        int64_t row_ahead = FP8 ? ml_row<BN>(a, bt_row, w.k0 + (NST - 1) * BN, kend) : -1;
        ml_stage_q<M, 0, elem>(a, w, nrows, qs, ml_smem + C::OFF_Q);
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
        /* This thread's rows row0 + g4 and row0 + g4 + 8 of the item: visible
         * keys, position, slope; [lo_all, hi_all): the keys every row sees. */
        int32_t lo[2], hi[2], pos[2], lo_all, hi_all;
        float slope[2];
        kva__dmma_rows(a, w, nrows, mi.s, mi.q_len, row0 + g4, lo, hi, pos, slope, lo_all, hi_all);

        float o[NBO][4];
#pragma unroll
        for (int n = 0; n < NBO; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        int stage = 0;
        for (int32_t kb = w.k0; kb < kend; kb += BN) {
            kva__cp_async_wait<NST - 2>();
            __syncthreads(); /* tile kb (and Q) landed for every thread; the previous
                                tile's stage, P and maxima are free */
            {
                const int32_t kn = kb + (NST - 1) * BN;
                const int ahead = stage == 0 ? NST - 1 : stage - 1;
                if constexpr (FP8) {
                    if (kn < kend)
                        ml_issue_fp8_row<BN>(a, row_ahead, ring + ahead * STAGE);
                    kva__cp_async_commit();
                    row_ahead = ml_row<BN>(a, bt_row, kn + BN, kend);
                } else {
                    if (kn < kend)
                        ml_issue_any<BN, FP8>(a, bt_row, kn, kend, ring + ahead * STAGE);
                    kva__cp_async_commit();
                }
            }
            uint32_t sk = sRing + stage * C::TILE;
            if constexpr (FP8) {
                /* The landed raw stage into the 16-bit tile: each of the MT warps
                 * of key slice kg converts KW / MT of its rows; those warps meet
                 * before S reads them. P V reads every row only after the
                 * barriers of ml_tile_max and P, which order all the warps'
                 * conversions before it. */
                sk = sRing;
                ml_fp8_rows<KW / MT, Ty>(ml_smem + C::OFF_RAW + stage * C::RAW,
                                         ml_smem + C::OFF_RING, kg * KW + rt * (KW / MT), lane);
                if constexpr (MT == 1)
                    __syncwarp();
                else
                    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kg), "r"(MT * 32) : "memory");
            }

            /* S = Q K^T for row tile rt and keys kb + kg * KW .. + KW - 1, in two
             * accumulator sets (even and odd k-steps) for independent mma chains. */
            const int key0 = kg * KW;
            float sc[NBS][4], sc2[NBS][4];
#pragma unroll
            for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] = 0.f, sc2[nt][e] = 0.f;
            if constexpr (QR)
                ml_qk_reg<Ty>(qf, sk, key0, lane, sc, sc2);
            else
                ml_qk<Ty, NBS, ML_D / 16>(sQ, sk, row0, key0, 0, lane, sc, sc2);
#pragma unroll
            for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] += sc2[nt][e];
            /* Logits (log2 units) and the mask where some row may not see a key. */
            kva__dmma_logits<KW>(sc, a, scale_log2, kb + key0, t4, lo_all, hi_all, lo, hi, pos,
                                 slope);
            /* The running max over every key slice of the row tile. */
            float alpha[2], mu[2];
            const bool resc =
                ml_tile_max<NBS, ML_NW / MT>(sc, s_max, kg, row0 + g4, t4, m_run, l_run, alpha, mu);
            /* P of the warp's keys, in the input dtype, into the shared P tile. */
            ml_store_p<Ty, NBS, 1, C::P_STRIDE, 0>(sc, mu, sP, row0 + g4, key0, t4, l_run, NULL);
            if (resc)
                ml_rescale<NBO>(o, alpha);
            __syncthreads(); /* P of every slice */

            /* O += P V: P [16, BN] of the row tile, V = the tile's columns
             * kg * CW .. + CW - 1 (ldmatrix.trans of the latent rows). */
            const int cc0 = kg * (C::CW / 8); /* first value chunk of the warp */
            ml_pv<Ty, BN, NBO, C::P_STRIDE>(sP, sk, row0, cc0, lane, o);
            stage = stage == NST - 1 ? 0 : stage + 1;
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */

        ml_finish<NBO, ML_NW / MT, Ty>(a, w, nrows, qs, s_sum, kg, row0 + g4, kg * C::CW, t4, l_run,
                                       m_run, o, FP8 ? a.kv_scale : 1.f);
    }
}

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
