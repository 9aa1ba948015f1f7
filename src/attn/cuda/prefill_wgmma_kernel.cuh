/*
 * prefill_wgmma_kernel.cuh - the sm_90a (Hopper) paged prefill kernel on warpgroup
 * matrix instructions (wgmma.mma_async): KVA__CUDA_PREFILL_WGMMA and
 * KVA__CUDA_PREFILL_WGMMA_TMA of prefill_mma.h.
 *
 * Same contract, tiles and arguments as prefill_mma.cu (one CTA tile = 128
 * packed (token, group head) rows of one (request, kv head); paged NHD/HND
 * cache, any B; causal, window, soft-cap, ALiBi, sinks, LSE), f16/bf16, with
 * the head sizes (DK, DV) as template traits (prefill_wgmma.cuh, wg_dims).
 * The body is written once here and instantiated per head-size pair in
 * prefill_wgmma_d{64,128,192,256}.cu (so the build compiles them in parallel);
 * prefill_wgmma.cu is the host side (device check, tensor maps, dispatch).
 * Structure (FlashAttention-3 style; docs/cuda-prefill.md, "The sm_90a wgmma
 * kernel"): a producer warpgroup fills a ring of K/V stages guarded by full /
 * empty mbarriers (cp.async gather, or TMA boxes for tiles inside the visible
 * range); two consumer warpgroups own rows 0..63 and 64..127, ping-pong their
 * GEMMs through named barriers and keep P in registers as the A operand of
 * O += P V; the grid is persistent over the heaviest-first tile list (in
 * snake order, or dealt to the CTAs as they finish their tiles: wg_sched),
 * the K/V ring running on across CTA tiles.
 * The kernel body exists only in sm_90a device code (__CUDA_ARCH_FEAT_SM90_ALL);
 * other targets get an empty kernel that the host never launches
 * (kva__cuda_prefill_wgmma_ready() checks the build and the device).
 */
#ifndef KVA_CUDA_PREFILL_WGMMA_KERNEL_CUH
#define KVA_CUDA_PREFILL_WGMMA_KERNEL_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "prefill_mma_common.cuh"
#include "tree_mask.cuh"
#include "wgmma_ptx.cuh"

#include <cuda.h> /* CUtensorMap (types only; the driver entry point is looked up) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <math.h>
#include <string.h>

#include "prefill_wgmma.cuh"

/* A diagnostic hook: dev/pf_trace/pf_trace.cu defines KVA_WG_TRACE(ev, ti,
 * nkt) to record the time of event ev of CTA tile ti (nkt key tiles) from
 * one thread per warpgroup (producer 0-2: header built, first free stage,
 * tile issued; consumer 3-9: tile start, Q in, first K/V in, first S done,
 * last P V done, epilogue done, next Q issued (before the epilogue)). The library leaves it empty
 * (its arguments are not evaluated), so its code does not change. */
#ifndef KVA_WG_TRACE
#define KVA_WG_TRACE(ev, ti, nkt) ((void)0)
#endif

/* prefill_wgmma.cu: fills tm for the TMA kernel (wg_tmaps); tm->ok = 0 where
 * the cache cannot be described or the driver refuses. */
void kva__wg_tmaps_encode(const kva__cuda_prefill_args *a, wg_tmaps *tm, int bn);
/* prefill_wgmma_d{64,128,192,256}.cu: launch the kernel of one head-size pair
 * (tma: the TMA form); prefill_wgmma_d128n.cu: D 128's narrow tile shape. */
kva_status kva__wg_launch_d64(const kva__cuda_prefill_args *a, cudaStream_t st, int tma);
kva_status kva__wg_launch_d128(const kva__cuda_prefill_args *a, cudaStream_t st, int tma);
kva_status kva__wg_launch_d128n(const kva__cuda_prefill_args *a, cudaStream_t st, int tma);
kva_status kva__wg_launch_d192(const kva__cuda_prefill_args *a, cudaStream_t st, int tma);
kva_status kva__wg_launch_d256(const kva__cuda_prefill_args *a, cudaStream_t st, int tma);

/*
 * The kernel (header comment above; TMA, snake order and tile shapes:
 * docs/cuda-prefill.md, "The sm_90a wgmma kernel"). The producer waits for
 * its cp.async copies of a stage, fence.proxy.async, then arrives on the
 * stage's "full" mbarrier (TMA tiles: armed by thread 0 with the byte count,
 * the four warps issue a quarter of the boxes each, nobody waits); a consumer
 * releases a stage on its "empty" mbarrier once the P V that read it is done.
 * The K/V ring and its phases run on across CTA tiles (counter gi), consumers
 * release a tile's last stage too, and the ping-pong starts afresh per tile
 * (consumer 1 arrives first on consumer 0's barrier). The narrow shape
 * (NCW 1) splits each tile of the plan's list into SPLIT = 2 CTA tiles of 64
 * rows (CTA tile ti: list tile ti / 2, rows 64 (ti % 2) on).
 * Dynamic shared memory (from a 1024-byte aligned base): Q [M, DK], K
 * [NST][BN, DK], V [NST][BN, DV] (all swizzled, wg_swz), the 2 * NST
 * mbarriers (8 bytes each), then the staged block ids [2][BN] int32; a
 * layout without the alignment pad (wg_dims::PAD) whose base is not aligned
 * runs NST - 1 stages (wg_ring).
 */
template <bool INTRA, bool TMA, typename Ty, int DK, int DV, int NCW, int BN>
__global__ void __launch_bounds__((NCW + 1) * 128, 3 - NCW)
    prefill_wgmma_ws_kernel(const kva__cuda_prefill_args a, const __grid_constant__ wg_tmaps tm)
{
#ifdef KVA_WGMMA_BODY
    typedef wg_dims<DK, DV, NCW, BN> dims;
    constexpr int NST = dims::NST, NO = dims::NO, NS = dims::NS, KS = dims::KS, M = dims::M;
    constexpr int SPLIT = dims::SPLIT;
    constexpr uint32_t QB = dims::QB, KB = dims::KB, VB = dims::VB;
    const int n_tiles = *a.num_tiles * SPLIT;
    const bool dyn = a.sched != nullptr; /* the dynamic schedule (wg_sched) */
    if ((int)blockIdx.x >= n_tiles) {
        if (dyn && threadIdx.x == 0)
            wg_sched_done(a.sched);
        return;
    }
    /* Static schedule (a.sched NULL): CTA tile of round k: k * gridDim.x +
     * blockIdx.x, the CTA order reversed in odd rounds (snake: the CTA that
     * took the heaviest tile of one round takes the lightest of the next). A
     * CTA's rounds end at the first tile index >= n_tiles (only the last
     * round is partial). Dynamic: round 0 is blockIdx.x, then wg_sched. */
    const int t_step = (int)gridDim.x;
    auto tile_of = [&](int k) {
        return k * t_step + ((k & 1) ? t_step - 1 - (int)blockIdx.x : (int)blockIdx.x);
    };

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t sbase = kva__smem_u32(smem_raw);
    const uint32_t sQ = (sbase + 1023u) & ~1023u;
    const wg_ring<NST> ring = {dims::PAD || sQ == sbase ? (uint32_t)NST : (uint32_t)NST - 1u};
    const uint32_t sK = sQ + QB;
    const uint32_t sV = sK + ring.n * KB;
    const uint32_t full = sV + ring.n * VB, empty = full + 8 * ring.n; /* mbarriers [n] each */
    const uint32_t sids = empty + 8 * ring.n;                          /* block ids [2][BN] */
    constexpr int SR = dims::SR;
    const wg_sched<SR> sc = {sids + dims::IDB, sids + dims::IDB + 8 * SR,
                             sids + dims::IDB + 16 * SR}; /* CTA-tile ring */

    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const wg_div gd = wg_div_make((uint32_t)(a.num_heads / a.num_kv_heads)); /* G */
    if (tid == 0) {
        for (int i = 0; i < (int)ring.n; i++) {
            kva__mbar_init(full + 8 * i, 128);
            kva__mbar_init(empty + 8 * i, 128 * NCW);
        }
        for (int i = 0; i < SR; i++) {
            kva__mbar_init(sc.full + 8 * i, 1);
            kva__mbar_init(sc.empty + 8 * i, 128 * (NCW + 1));
        }
    }
    __syncthreads();
    /* K/V tiles of the CTA's earlier CTA tiles: the ring's stage and phase of
     * key tile it of this CTA tile come from gi + it. */
    uint32_t gi = 0;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(dims::REG_P) : "memory");
        int ti = (int)blockIdx.x;
        for (int k = 0;; k++) {
            if (k > 0)
                ti = dyn ? sc.take(k) : tile_of(k);
            if (ti >= n_tiles)
                break;
            wg_tile tl;
            wg_tile_init<M>(tl, a, wg_rec_of<SPLIT, M>(a, ti), gd);
            const int n_first = tl.kv_lo / BN;
            const int n_last = tl.kv_hi > tl.kv_lo ? (tl.kv_hi - 1) / BN : n_first - 1;
            const int ntiles = n_last - n_first + 1; /* may be 0 */
            KVA_WG_TRACE(0, ti, ntiles);
            wg_kv g;
            wg_kv_init<DK, DV>(g, a, tl, tid);
            /* The block id of key n0 + tid of the next tile is loaded one tile
             * ahead and staged in shared memory ([2][BN] int32 after the
             * mbarriers), so the copy path has no dependent global load
             * (threads tid >= BN stage nothing). */
            const bool stager = BN >= 128 || tid < BN; /* the producer has 128 threads */
            int nxt = ntiles > 0 && stager ? wg_blk_of(g, n_last * BN + tid) : 0;
            for (int it = 0; it < ntiles; it++) {
                const uint32_t gk = gi + (uint32_t)it;
                const int st = ring.st(gk), n0 = (n_last - it) * BN;
                {
                    const int cur = nxt;
                    if (it + 1 < ntiles && stager)
                        nxt = wg_blk_of(g, n0 - BN + tid);
                    if (stager) /* the buffers hold BN ids each */
                        asm volatile(
                            "st.shared.b32 [%0], %1;\n" ::"r"(sids + (gk & 1) * (BN * 4) + 4 * tid),
                            "r"(cur)
                            : "memory");
                    kva__named_bar(true, 5,
                                   128); /* ids visible; buffer (gk - 1) & 1 no longer read */
                }
                if (gk >= ring.n)
                    kva__mbar_wait(empty + 8 * st, ring.ph(gk) ^ 1u);
                if (it == 0)
                    KVA_WG_TRACE(1, ti, ntiles);
                if (TMA && tm.ok && n0 >= tl.kv_lo && n0 + BN <= tl.kv_hi) {
                    /* A TMA copy is a warp-uniform instruction (the compiler
                     * issues a warp's lanes' boxes one after the other), so the
                     * four warps issue a quarter each (op o by lane o / 4 of
                     * warp o % 4): at B 16 (32 boxes per tile) each warp issues
                     * 8. Boxes of other warps may complete before thread 0 arms
                     * the barrier: the tx-count may go below zero while thread
                     * 0's arrival is pending, and the phase cannot complete
                     * without it. */
                    const int NW = 4;
                    if (tid < 32 * NW) {
                        if (tid == 0)
                            kva__mbar_expect_tx(full + 8 * st, KB + VB);
                        __syncwarp();
                        /* Op o: block b = o / OPB of the tile (key rows b * R ..),
                         * then op j = o % OPB of the block: DK = DV: column block
                         * j / 2 of K (j even) or V; else K's column blocks
                         * 0 .. DK / 64 - 1, then V's. */
                        constexpr int KCB = DK / 64, OPB = KCB + DV / 64;
                        static_assert(DK != DV || KCB == 1 || KCB == 2 || KCB == 4,
                                      "DK = DV: 64, 128 or 256");
                        const int R = tm.box_rows, nhd = a.layout == KVA_LAYOUT_NHD;
                        const int o0 = (tid & 31) * 4 + (tid >> 5);
                        for (int o = o0; o < OPB * (BN / R); o += 32 * NW) {
                            /* DK = DV: OPB = 2 KCB (8 at 256, 4 at 128, 2 at 64),
                             * shifts. */
                            constexpr int SH = KCB == 4 ? 3 : KCB == 2 ? 2 : 1;
                            const int j = (unsigned)o % OPB;
                            const int row = DK == DV ? (o >> SH) * R : (int)((unsigned)o / OPB) * R;
                            const bool isv = DK == DV ? (o & 1) != 0 : j >= KCB;
                            const int cb = DK == DV ? (o >> 1) & (KCB - 1) : (isv ? j - KCB : j);
                            int blk;
                            asm volatile("ld.shared.b32 %0, [%1];\n"
                                         : "=r"(blk)
                                         : "r"(sids + (gk & 1) * (BN * 4) + 4u * (uint32_t)row));
                            const int off = (n0 + row) & (a.block_size - 1);
                            uint32_t dst;
                            if constexpr (DK == DV)
                                dst = (isv ? sV : sK) + st * KB + (uint32_t)(cb * BN + row) * 128u;
                            else
                                dst = (isv ? sV + st * VB : sK + st * KB) +
                                      (uint32_t)(cb * BN + row) * 128u;
                            kva__tma_load4(dst, isv ? &tm.v : &tm.k, cb * 64, nhd ? tl.kvh : off,
                                           nhd ? off : tl.kvh, blk, full + 8 * st);
                        }
                        if (tid != 0)
                            kva__mbar_arrive(full + 8 * st);
                    } else {
                        kva__mbar_arrive(full + 8 * st);
                    }
                    continue;
                }
                wg_gather_ids<DK, DV, BN>(g, tid, n0, sK + st * KB, sV + st * VB,
                                          sids + (gk & 1) * (BN * 4));
                kva__cp_async_commit();
                /* Wait for this tile, then publish it. */
                kva__cp_async_wait<0>();
                kva__fence_proxy_async();
                kva__mbar_arrive(full + 8 * st);
            }
            gi += (uint32_t)ntiles;
            /* Dynamic: round k + 1's tile, fetched once this round's copies
             * are issued (a register held across the round would spill: the
             * producer runs on REG_P registers). */
            if (dyn && tid == 0)
                sc.put(k + 1, t_step + atomicAdd(a.sched, 1));
            KVA_WG_TRACE(2, ti, ntiles);
        }
        if (dyn && tid == 0)
            wg_sched_done(a.sched);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(dims::REG_C) : "memory");
        const int cw = wg - 1, ct = tid - 128, wq = (ct >> 5) & 3;
        const uint64_t dq = kva__wgmma_desc(sQ + (uint32_t)cw * 64 * 128, 16, 1024);
        const uint64_t dk0 = kva__wgmma_desc(sK, 16, 1024);
        const uint64_t dv0 = kva__wgmma_desc(sV, BN * 128, 1024);
        const int tree_on = a.tree_on ? *a.tree_on : 0;
        int k = 0, ti = (int)blockIdx.x; /* round k, its CTA tile */
        /* tl: the header of the CTA tile about to start, built when its Q rows
         * are loaded (under the previous tile's epilogue); the key loop and the
         * epilogue need only c and the key-tile range. */
        wg_tile tl;
        wg_tile_init<M>(tl, a, wg_rec_of<SPLIT, M>(a, ti), gd);
        wg_load_q<128, DK, M>(a, tl, sQ, cw * 64, 64, ct & 127, gd);
        kva__cp_async_commit();
        for (;;) {
            KVA_WG_TRACE(3, ti, -1);
            kva__cp_async_wait<0>();
            kva__fence_proxy_async();
            kva__named_bar(true, 3 + cw, 128);
            wg_ctx c;
            wg_ctx_init<DK>(c, a, tl, cw * 64 + wq * 16, gd, tree_on);
            const int n_first = tl.kv_lo / BN;
            const int n_last = tl.kv_hi > tl.kv_lo ? (tl.kv_hi - 1) / BN : n_first - 1;
            const int ntiles = n_last - n_first + 1; /* may be 0 */
            KVA_WG_TRACE(4, ti, ntiles);
            float o[NO], s[NS];
            float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < NS; e++)
                s[e] = 0.0f;
#pragma unroll
            for (int e = 0; e < NO; e++)
                o[e] = 0.0f;
            uint32_t pa[KS][4];
            /* The ping-pong of two consumers (wide shape): a consumer waits on
             * its barrier before issuing its GEMMs and arrives on the other's
             * after; one consumer (narrow) has nobody to wait for. */
            const int my_bar = 1 + cw, other_bar = 2 - cw;
            auto pp_wait = [&]() {
                if (NCW == 2)
                    kva__named_bar(true, my_bar, 256);
            };
            auto pp_pass = [&]() {
                if (NCW == 2)
                    kva__named_bar(false, other_bar, 256);
            };
            /* The next CTA tile (tn; dynamic: published by the producer once it
             * has issued this tile's copies) and its record (nxt.r < 0: none),
             * loaded before the last P V so that its latency hides under it
             * and the next Q load under the epilogue does not wait for it. */
            int tn = n_tiles;
            wg_rec nxt = {-1, 0, 0};
            if (ntiles > 0) {
                if (NCW == 2 && cw == 1)
                    kva__named_bar(false, 1, 256); /* consumer 0 issues first */
                /* Tile 0: S only. */
                const int st0 = ring.st(gi);
                kva__mbar_wait(full + 8 * st0, ring.ph(gi));
                KVA_WG_TRACE(5, ti, ntiles);
                pp_wait();
                kva__wgmma_fence();
                wg_qk<Ty, DK, M>(s, dq, dk0 + ((uint64_t)(st0 * KB) >> 4));
                kva__wgmma_commit();
                pp_pass();
                kva__wgmma_wait<0>();
#pragma unroll
                for (int e = 0; e < NS; e++)
                    kva__reg_fence(s[e]);
                KVA_WG_TRACE(6, ti, ntiles);
                float alpha[2] = {1.0f, 1.0f};
                wg_softmax<Ty, false>(s, o, pa, m_run, l_run, c, a.softcap, a.alibi_slopes,
                                      n_last * BN, alpha);
                bool resc_prev = false; /* INTRA: o is still zero after tile 0 */
                for (int it = 1; it < ntiles; it++) {
                    const uint32_t gk = gi + (uint32_t)it;
                    const int st = ring.st(gk), sp = ring.st(gk - 1);
                    kva__mbar_wait(full + 8 * st, ring.ph(gk));
                    pp_wait();
                    kva__wgmma_fence();
                    if (!INTRA) {
                        wg_pv<Ty, DV>(o, pa, dv0 + ((uint64_t)(sp * VB) >> 4));
                        kva__wgmma_commit();
                        wg_qk<Ty, DK, M>(s, dq, dk0 + ((uint64_t)(st * KB) >> 4));
                        kva__wgmma_commit();
                        pp_pass();
                        kva__wgmma_wait<1>(); /* P V of tile it - 1 */
#pragma unroll
                        for (int e = 0; e < NO; e++)
                            kva__reg_fence(o[e]);
                        kva__mbar_arrive(empty + 8 * sp);
                        kva__wgmma_wait<0>();
#pragma unroll
                        for (int e = 0; e < NS; e++)
                            kva__reg_fence(s[e]);
                        wg_softmax<Ty, false>(s, o, pa, m_run, l_run, c, a.softcap, a.alibi_slopes,
                                              (n_last - it) * BN, alpha);
                    } else {
                        /* S of tile it first, then P V of tile it - 1, which runs
                         * under this tile's softmax. o is rescaled for tile it - 1
                         * between the two issues (as FlashAttention-3 does; a
                         * rescale after the wait makes ptxas serialize wgmma). */
                        wg_qk<Ty, DK, M>(s, dq, dk0 + ((uint64_t)(st * KB) >> 4));
                        kva__wgmma_commit();
                        if (resc_prev)
                            wg_rescale_o(o, alpha);
                        kva__wgmma_fence();
                        wg_pv<Ty, DV>(o, pa, dv0 + ((uint64_t)(sp * VB) >> 4));
                        kva__wgmma_commit();
                        pp_pass();
                        kva__wgmma_wait<1>(); /* S of tile it */
#pragma unroll
                        for (int e = 0; e < NS; e++)
                            kva__reg_fence(s[e]);
                        uint32_t pn[KS][4];
                        resc_prev = wg_softmax<Ty, true>(s, o, pn, m_run, l_run, c, a.softcap,
                                                         a.alibi_slopes, (n_last - it) * BN, alpha);
                        kva__wgmma_wait<0>(); /* P V of tile it - 1 */
#pragma unroll
                        for (int e = 0; e < NO; e++)
                            kva__reg_fence(o[e]);
#pragma unroll
                        for (int k = 0; k < KS; k++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                asm volatile("" : "+r"(pa[k][i])::"memory"); /* live until here */
                                pa[k][i] = pn[k][i];
                            }
                        kva__mbar_arrive(empty + 8 * sp);
                    }
                }
                tn = dyn ? sc.take(k + 1) : tile_of(k + 1);
                if (tn < n_tiles)
                    nxt = wg_rec_of<SPLIT, M>(a, tn);
                /* P V of the last tile. */
                pp_wait();
                if (INTRA && resc_prev)
                    wg_rescale_o(o, alpha);
                const int sl = ring.st(gi + (uint32_t)ntiles - 1);
                kva__wgmma_fence();
                wg_pv<Ty, DV>(o, pa, dv0 + ((uint64_t)(sl * VB) >> 4));
                kva__wgmma_commit();
                if (cw == 0)
                    pp_pass();
                kva__wgmma_wait<0>();
#pragma unroll
                for (int e = 0; e < NO; e++)
                    kva__reg_fence(o[e]);
                KVA_WG_TRACE(7, ti, ntiles);
                kva__mbar_arrive(empty + 8 * sl); /* the ring goes on with the next CTA tile */
            } else {
                tn = dyn ? sc.take(k + 1) : tile_of(k + 1);
                if (tn < n_tiles)
                    nxt = wg_rec_of<SPLIT, M>(a, tn);
            }
            gi += (uint32_t)ntiles;
            /* The next CTA tile's Q rows of this warpgroup are loaded under the
             * epilogue (S of this tile is done with them). */
            if (nxt.r >= 0) {
                wg_tile_init<M>(tl, a, nxt, gd);
                wg_load_q<128, DK, M>(a, tl, sQ, cw * 64, 64, ct & 127, gd);
                kva__cp_async_commit();
            }
            KVA_WG_TRACE(9, ti, ntiles);
            wg_epilogue<Ty, DV>(a, c, o, m_run, l_run);
            KVA_WG_TRACE(8, ti, ntiles);
            if (nxt.r < 0)
                break;
            k++;
            ti = tn;
        }
    }
#endif /* KVA_WGMMA_BODY */
}

/* Launches the kernel on a persistent grid of min(SPLIT grid_tiles, CTAS
 * SMs) CTAs (wg_dims). DIX: the kernel's index among the head-size pairs and
 * shapes (bits of the host cache's attribute mask). */
template <bool INTRA, bool TMA, typename Ty, int DK, int DV, int NCW, int BN, int DIX>
static kva_status launch_ws(const kva__cuda_prefill_args *a, cudaStream_t stream)
{
    typedef wg_dims<DK, DV, NCW, BN> dims;
    /* CTAS CTAs per SM, each with 1 KB of shared memory reserved by the
     * system, in the SM's 228 KB (wg_dims::SMEM checks it). */
    const size_t smem = dims::SMEM;
    wg_tmaps tm;
    if (TMA)
        kva__wg_tmaps_encode(a, &tm, BN);
    else
        memset(&tm, 0, sizeof tm);
    kva__cuda_prefill_host_cache *hc = a->host_cache;
    int grid = a->grid_tiles * dims::SPLIT;
    int nsm = hc ? hc->num_sms : 0;
    if (nsm <= 0) {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess)
            return kva__fail(
                KVA_STATUS_DEVICE_ERROR,
                "kva__cuda_prefill_launch_kernel: SM count (persistent wgmma kernel): %s",
                cudaGetErrorString(e));
        if (hc)
            hc->num_sms = nsm;
    }
    grid = nsm > 0 && nsm * dims::CTAS < grid ? nsm * dims::CTAS : grid;
    const int bf = a->dtype == KVA_DTYPE_BF16;
    const int bit = 2 * DIX + (TMA ? 1 : 0);
    auto fn = prefill_wgmma_ws_kernel<INTRA, TMA, Ty, DK, DV, NCW, BN>;
    if (!hc || !((hc->attr_set[bf] >> bit) & 1)) {
        cudaError_t e =
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        /* All of the SM's unified memory as shared memory, so that CTAS CTAs
         * fit (the driver's default carveout may hold fewer). */
        if (e == cudaSuccess && dims::CTAS > 1)
            e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     (int)cudaSharedmemCarveoutMaxShared);
        if (e != cudaSuccess)
            return kva__fail(
                KVA_STATUS_DEVICE_ERROR,
                "kva__cuda_prefill_launch_kernel: cudaFuncSetAttribute(%zu bytes of shared "
                "memory, wgmma kernel): %s",
                smem, cudaGetErrorString(e));
        if (hc)
            hc->attr_set[bf] |= (uint64_t)1 << bit;
    }
    fn<<<grid, (NCW + 1) * 128, smem, stream>>>(*a, tm);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch_kernel: launch of %d tiles (wgmma kernel): %s",
                         (int)a->grid_tiles, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

/* The kernels of one head-size pair and tile shape (NCW, BN: wg_dims): TMA
 * or cp.async, bf16 or f16. The TMA kernel also issues P V under the
 * consumer's own softmax (INTRA) where wg_dims::TMA_INTRA says so; the
 * cp.async kernel does not (measured faster without, docs/cuda-prefill.md). */
template <int DK, int DV, int DIX, int NCW = 2, int BN = 128>
static kva_status launch_dims(const kva__cuda_prefill_args *a, cudaStream_t st, int tma)
{
    constexpr bool IN = wg_dims<DK, DV, NCW, BN>::TMA_INTRA;
    const int bf = a->dtype == KVA_DTYPE_BF16;
    if (tma)
        return bf ? launch_ws<IN, true, kva__mma_bf16, DK, DV, NCW, BN, DIX>(a, st)
                  : launch_ws<IN, true, kva__mma_f16, DK, DV, NCW, BN, DIX>(a, st);
    return bf ? launch_ws<false, false, kva__mma_bf16, DK, DV, NCW, BN, DIX>(a, st)
              : launch_ws<false, false, kva__mma_f16, DK, DV, NCW, BN, DIX>(a, st);
}

#endif /* KVA_CUDA_PREFILL_WGMMA_KERNEL_CUH */
