/*
 * prefill_wgmma.cu - the sm_90a (Hopper) paged prefill kernel on warpgroup
 * matrix instructions (wgmma.mma_async), variants 6..23 of prefill_mma.h.
 *
 * Same contract, tiles and arguments as prefill_mma.cu (one CTA = one tile of
 * 128 packed (token, group head) rows of one (request, kv head); paged NHD/HND
 * cache, any B; causal, window, soft-cap, ALiBi, sinks, LSE), for D = Dv = 128,
 * f16/bf16. Structure (FlashAttention-2 loop on FlashAttention-3's
 * instructions, without warp specialization):
 *   - CTA = 2 warpgroups (256 threads); warpgroup w owns rows 64 w .. 64 w + 63;
 *   - Q [128, 128] and the K, V tiles [BN = 128 keys, 128] live in shared
 *     memory in the 128-byte-swizzle layout of wgmma: two column blocks of 64
 *     elements, each [rows][64] with 16-byte chunk c of row r at c ^ (r & 7);
 *   - K and V tiles are gathered from the paged cache (block table per key row)
 *     by cp.async into an NST-stage ring (NST = 2 or 3): the copy of the tile
 *     NST - 1 ahead is issued while S = Q K^T runs on the tensor cores;
 *   - S [64, 128] per warpgroup = 8 wgmma m64n128k16 (A = Q, B = K, both from
 *     shared memory, K-major); online softmax on the fp32 accumulators in log2
 *     units (as prefill_mma, lazy rescaling); P is packed to f16/bf16 in
 *     registers and is the register A operand of O += P V, 8 wgmma m64n128k16
 *     with B = V from shared memory in its natural [key][dim] layout
 *     (MN-major, imm-trans-b = 1);
 *   - tiles are visited from the diagonal down; only tiles crossing the
 *     diagonal, the window edge or seq_len are masked per element.
 * Variants: v6 NST = 2, v7 NST = 3, v8 = v6 with P V as two m64n64k16 per
 * k-step (one per 64-column block of V); v9 (NST = 2) and v10 (NST = 3) are
 * warp-specialized (a producer warpgroup gathers K/V into an mbarrier ring,
 * two consumer warpgroups ping-pong their GEMMs against each other's
 * softmax, FlashAttention-3 style; see prefill_wgmma_ws_kernel); v11 = v10
 * with two K/V tiles in flight in the producer; v12 = v11 with each consumer's
 * P V of tile it - 1 issued after S of tile it, so it runs under the
 * consumer's own softmax of tile it (P double-buffered, O rescaled for tile
 * it - 1 just before its P V is issued); v13 = v10 and v14 = v10 with v12's
 * overlap, both with the producer's block-table loads one tile ahead and
 * staged in shared memory (PRE); v15 = v13 and v16 = v14 with the K/V tiles
 * that lie inside the visible key range loaded by TMA (one box per block,
 * column block and K or V, on the stage's mbarrier, no producer wait; B a
 * power of two >= 8 and NB known), the edge tiles still by cp.async;
 * v17 = v16 and v18 = v15 on a persistent grid (one CTA per SM walking the
 * tile list with stride gridDim.x; the producer runs into the next CTA tile's
 * K/V while the consumers finish, each consumer loads its next Q rows under
 * its epilogue); v19 = v13 on that persistent grid (cp.async only, for block
 * sizes where TMA does not pay); v20 and v21 = v17 and v19 with the CTA
 * tiles dealt in snake order (PERSIST 2); v22 = v20 with each consumer
 * warpgroup's tile headers kept in shared memory (PERSIST 3: read from global
 * memory once per CTA tile, for the next tile's Q load, instead of three
 * times; each read is a chain of two dependent loads the warpgroup waits on);
 * v23 = v20 with the TMA boxes issued by the producer's four warps instead of
 * its first (TMA 2; at B 16 a tile is 32 boxes, which one warp issues one
 * after the other: ncu showed the consumers waiting on the "full" barrier
 * 14 % of their stall samples at B 16 against 0.5 % at B 64).
 *
 * The kernel body exists only in sm_90a device code (__CUDA_ARCH_FEAT_SM90_ALL);
 * other targets get an empty kernel that the host never launches
 * (kva__cuda_prefill_wgmma_ready() checks the build and the device).
 */
extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "wgmma_ptx.cuh"

#include <cuda.h> /* CUtensorMap (types only; the driver entry point is looked up) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <math.h>
#include <string.h>

#include "prefill_wgmma.cuh"

/*
 * v6..v8. NST: K/V stages (2 or 3). PV_SPLIT: P V as two n64 products per
 * k-step. All 256 threads gather; one barrier per key tile.
 * Dynamic shared memory (from a 1024-byte aligned base): Q [128, 128], then K
 * [NST][128, 128], then V [NST][128, 128], all swizzled (wg_swz).
 */
template <int NST, bool PV_SPLIT, typename Ty>
__global__ void __launch_bounds__(WG_THREADS, 1)
    prefill_wgmma_kernel(const kva__cuda_prefill_args a)
{
#ifdef KVA_WGMMA_BODY
    constexpr uint32_t QB = WG_TILE_BYTES(WG_M), KB = WG_TILE_BYTES(WG_BN);
    const int tile_idx = blockIdx.x;
    if (tile_idx >= *a.num_tiles)
        return;
    wg_tile tl;
    wg_tile_init(tl, a, a.tiles + (size_t)tile_idx * KVA__CUDA_PREFILL_TILE_INTS);

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t sQ = (kva__smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sK = sQ + QB;
    const uint32_t sV = sK + NST * KB;

    const int tid = threadIdx.x;
    const int wg = tid >> 7, wq = (tid >> 5) & 3;
    wg_load_q<WG_THREADS>(a, tl, sQ, 0, WG_M, tid); /* first copy group */
    wg_kv g;
    wg_kv_init(g, a, tl, tid & 15);
    wg_ctx c;
    wg_ctx_init(c, a, tl.m0, wg * 64 + wq * 16, tl.m_last, tl.G, tl.kvh, tl.seq_len, tl.q_len,
                tl.pos_min, tl.pos_max);

    /* Descriptors: Q rows of this warpgroup (K-major, SBO 1024); K and V of
     * stage 0 (K-major; V MN-major with LBO = one column block = BN rows). */
    const uint64_t dq = kva__wgmma_desc(sQ + (uint32_t)wg * 64 * 128, 16, 1024);
    const uint64_t dk0 = kva__wgmma_desc(sK, 16, 1024);
    const uint64_t dv0 = kva__wgmma_desc(sV, WG_BN * 128, 1024);

    float o[64], s[64];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < 64; e++) {
        o[e] = 0.0f;
        s[e] = 0.0f;
    }
    const int n_first = tl.kv_lo / WG_BN;
    const int n_last = tl.kv_hi > tl.kv_lo ? (tl.kv_hi - 1) / WG_BN : n_first - 1;
#pragma unroll
    for (int p = 0; p < NST - 1; p++) {
        const int n = n_last - p;
        if (n >= n_first)
            wg_gather<WG_THREADS, 8>(g, tid, n * WG_BN, sK + p * KB, sV + p * KB);
        kva__cp_async_commit();
    }
    for (int n = n_last, it = 0; n >= n_first; n--, it++) {
        const int st = it % NST;
        kva__cp_async_wait<NST - 2>(); /* this thread's copies of tile n landed */
        kva__fence_proxy_async();      /* ... visible to wgmma */
        __syncthreads();               /* everyone's; stage (it - 1) % NST is free */
        kva__wgmma_fence();
        wg_qk<Ty>(s, dq, dk0 + ((uint64_t)(st * KB) >> 4));
        kva__wgmma_commit();
        /* Copy of tile n - NST + 1 into stage (it + NST - 1) % NST meanwhile. */
        const int nn = n - (NST - 1);
        if (nn >= n_first) {
            const uint32_t so = ((it + NST - 1) % NST) * KB;
            wg_gather<WG_THREADS, 8>(g, tid, nn * WG_BN, sK + so, sV + so);
        }
        kva__cp_async_commit();
        kva__wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; e++)
            kva__reg_fence(s[e]);
        uint32_t pa[8][4];
        float alpha[2];
        wg_softmax<Ty>(s, o, pa, m_run, l_run, c, n * WG_BN, alpha);
        kva__wgmma_fence();
        wg_pv<Ty, PV_SPLIT>(o, pa, dv0 + ((uint64_t)(st * KB) >> 4));
        kva__wgmma_commit();
        kva__wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; e++)
            kva__reg_fence(o[e]);
    }
    kva__cp_async_wait<0>();
    wg_epilogue<Ty>(a, c, o, m_run, l_run, tl.m0 + wg * 64 + wq * 16 + ((tid & 31) >> 2), tl.rows,
                    tl.q_start, tl.G);
#endif /* KVA_WGMMA_BODY */
}

/*
 * v9 (NST = 2) and v10 (NST = 3): warp-specialized. 384 threads: warpgroup 0
 * is the producer (40 registers via setmaxnreg: gathers the K/V tiles with
 * cp.async, waits for them, fence.proxy.async, then arrives on the stage's
 * "full" mbarrier), warpgroups 1 and 2 the consumers (232 registers; rows
 * 0..63 and 64..127; Q loaded by each for its own rows). A consumer releases
 * a stage on its "empty" mbarrier once the P V product that read it is done.
 * Consumers ping-pong through named barriers 1 and 2: one issues its GEMMs
 * (P V of tile it - 1 with S of tile it) while the other runs its softmax, so
 * the tensor cores are fed during the exponentials.
 * DELAY (v11, NST = 3): the producer publishes tile it - 1 after issuing the
 * copies of tile it, so two tiles are in flight instead of one (with two
 * stages this would deadlock: the producer would wait for a stage that the
 * consumers free only after the tile it has not published yet).
 * TMA (v15, v16; needs PRE, not DELAY): a K/V tile whose 128 keys all lie in
 * the visible range [kv_lo, kv_hi) is loaded by TMA (tm, wg_tmaps) instead of
 * cp.async: lanes of the producer's first warp issue one box per (block,
 * column block, K or V) on the stage's "full" mbarrier, thread 0 having
 * armed it with the tile's byte count (arrive.expect_tx), and nobody waits:
 * the producer goes on to the next stage at once. Tiles that cross the edge
 * of the range (rows there must be zero-filled, not loaded: unused slots of a
 * block may hold NaN) and every tile when tm.ok = 0 take the cp.async path.
 * PERSIST (1: v17, v18, v19; 2: v20, v21; 3: v22): min(grid_tiles, SMs) CTAs, CTA b
 * computes the CTA tiles b, b + gridDim.x, ... (1: round robin over the
 * heaviest-first list; 2: odd rounds in reverse CTA order, which evens out
 * the CTAs' sums of weights: 1 x 4096 causal, 1024 tiles on 132 SMs, max
 * CTA load 12 % over the mean with 1, at the mean with 2; 3 deals as 2);
 * the K/V ring and its mbarrier phases run on across CTA tiles (counter gi),
 * consumers release the last stage of a tile too, and the ping-pong starts
 * afresh per tile (consumer 1 arrives first on consumer 0's barrier).
 * Shared memory as v6..v8, then the 2 * NST mbarriers (8 bytes each), then
 * (PRE) the staged block ids [2][128] int32, then (PERSIST 3) the consumers'
 * tile-header slots [2 consumers][2] wg_tile.
 */
template <int NST, bool DELAY, bool INTRA, bool PRE, int TMA, int PERSIST, typename Ty>
__global__ void __launch_bounds__(3 * 128, 1)
    prefill_wgmma_ws_kernel(const kva__cuda_prefill_args a, const __grid_constant__ wg_tmaps tm)
{
    static_assert(!DELAY || NST >= 3, "a delayed publish needs three stages (else deadlock)");
    static_assert(!TMA || (PRE && !DELAY), "TMA reads the staged block ids and publishes at once");
    static_assert(!PERSIST || !DELAY, "a persistent CTA publishes every tile at once");
#ifdef KVA_WGMMA_BODY
    constexpr uint32_t QB = WG_TILE_BYTES(WG_M), KB = WG_TILE_BYTES(WG_BN);
    const int n_tiles = *a.num_tiles;
    if ((int)blockIdx.x >= n_tiles)
        return;
    /* CTA tile of round k: blockIdx.x alone (PERSIST 0); k * gridDim.x +
     * blockIdx.x (1, round robin); or that with the CTA order reversed in odd
     * rounds (2, "snake": the CTA that took the heaviest tile of one round
     * takes the lightest of the next). A CTA's rounds end at the first tile
     * index >= n_tiles (only the last round is partial). */
    const int t_step = PERSIST ? (int)gridDim.x : n_tiles;
    auto tile_of = [&](int k) {
        return k * t_step +
               (PERSIST >= 2 && (k & 1) ? t_step - 1 - (int)blockIdx.x : (int)blockIdx.x);
    };

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t sQ = (kva__smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sK = sQ + QB;
    const uint32_t sV = sK + NST * KB;
    const uint32_t full = sV + NST * KB, empty = full + 8 * NST; /* mbarriers [NST] each */

    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    if (tid == 0) {
        for (int i = 0; i < NST; i++) {
            wg_mbar_init(full + 8 * i, 128);
            wg_mbar_init(empty + 8 * i, 256);
        }
    }
    __syncthreads();
    /* K/V tiles of the CTA's earlier CTA tiles (PERSIST): the ring's stage
     * and phase of key tile it of this CTA tile come from gi + it. */
    uint32_t gi = 0;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        for (int k = 0;; k++) {
            const int ti = tile_of(k);
            if (ti >= n_tiles)
                break;
            wg_tile tl;
            wg_tile_init(tl, a, a.tiles + (size_t)ti * KVA__CUDA_PREFILL_TILE_INTS);
            const int n_first = tl.kv_lo / WG_BN;
            const int n_last = tl.kv_hi > tl.kv_lo ? (tl.kv_hi - 1) / WG_BN : n_first - 1;
            const int ntiles = n_last - n_first + 1; /* may be 0 */
            wg_kv g;
            wg_kv_init(g, a, tl, tid & 15);
            /* PRE: the block id of key n0 + tid of the next tile is loaded one tile
             * ahead and staged in shared memory ([2][128] int32 after the
             * mbarriers), so the copy path has no dependent global load. */
            const uint32_t sids = empty + 8 * NST;
            int nxt = PRE && ntiles > 0 ? wg_blk_of(g, n_last * WG_BN + tid) : 0;
            for (int it = 0; it < ntiles; it++) {
                const uint32_t gk = gi + (uint32_t)it;
                const int st = (int)(gk % NST), n0 = (n_last - it) * WG_BN;
                if (PRE) {
                    const int cur = nxt;
                    if (it + 1 < ntiles)
                        nxt = wg_blk_of(g, n0 - WG_BN + tid);
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sids + (gk & 1) * 512 + 4 * tid),
                                 "r"(cur)
                                 : "memory");
                    wg_bar_sync(5, 128); /* ids visible; buffer (gk - 1) & 1 no longer read */
                }
                if (gk >= NST)
                    wg_mbar_wait(empty + 8 * st, ((gk / NST) - 1) & 1);
                if (TMA && tm.ok && n0 >= tl.kv_lo && n0 + WG_BN <= tl.kv_hi) {
                    /* TMA 1: the lanes of warp 0 issue the boxes (a TMA copy is
                     * a warp-uniform instruction: the compiler issues the lanes'
                     * boxes one after the other). TMA 2: the four warps issue a
                     * quarter each (op o by lane o / 4 of warp o % 4), so at
                     * B 16 (32 boxes per tile) each warp issues 8. Boxes of
                     * other warps may complete before thread 0 arms the barrier:
                     * the tx-count may go below zero while thread 0's arrival
                     * is pending, and the phase cannot complete without it. */
                    const int NW = TMA == 2 ? 4 : 1;
                    if (tid < 32 * NW) {
                        if (tid == 0)
                            wg_mbar_arrive_tx(full + 8 * st, 2 * KB);
                        __syncwarp();
                        /* Op o: block b = o / 4 of the tile (key rows b * R ..),
                         * column block (o / 2) % 2, K (o even) or V. */
                        const int R = tm.box_rows, nhd = a.layout == KVA_LAYOUT_NHD;
                        const int o0 = TMA == 2 ? (tid & 31) * 4 + (tid >> 5) : tid;
                        for (int o = o0; o < 4 * (WG_BN / R); o += 32 * NW) {
                            const int row = (o >> 2) * R, cb = (o >> 1) & 1;
                            int blk;
                            asm volatile("ld.shared.b32 %0, [%1];\n"
                                         : "=r"(blk)
                                         : "r"(sids + (gk & 1) * 512 + 4u * (uint32_t)row));
                            const int off = (n0 + row) & (a.block_size - 1);
                            const uint32_t dst =
                                (o & 1 ? sV : sK) + st * KB + (uint32_t)(cb * WG_BN + row) * 128u;
                            wg_tma_load4(dst, o & 1 ? &tm.v : &tm.k, cb * 64, nhd ? tl.kvh : off,
                                         nhd ? off : tl.kvh, blk, full + 8 * st);
                        }
                        if (tid != 0)
                            wg_mbar_arrive(full + 8 * st);
                    } else {
                        wg_mbar_arrive(full + 8 * st);
                    }
                    continue;
                }
                if (PRE)
                    wg_gather_ids(g, tid, n0, sK + st * KB, sV + st * KB, sids + (gk & 1) * 512);
                else
                    wg_gather<128, 4>(g, tid, n0, sK + st * KB, sV + st * KB);
                kva__cp_async_commit();
                if (!DELAY) { /* wait for this tile, then publish it */
                    kva__cp_async_wait<0>();
                    kva__fence_proxy_async();
                    wg_mbar_arrive(full + 8 * st);
                } else if (it > 0) { /* publish the previous tile; this one stays in flight */
                    kva__cp_async_wait<1>();
                    kva__fence_proxy_async();
                    wg_mbar_arrive(full + 8 * ((gk - 1) % NST));
                }
            }
            if (DELAY && ntiles > 0) {
                kva__cp_async_wait<0>();
                kva__fence_proxy_async();
                wg_mbar_arrive(full + 8 * ((ntiles - 1) % NST));
            }
            gi += (uint32_t)ntiles;
            if (!PERSIST)
                break;
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, ct = tid - 128, wq = (ct >> 5) & 3;
        const uint64_t dq = kva__wgmma_desc(sQ + (uint32_t)cw * 64 * 128, 16, 1024);
        const uint64_t dk0 = kva__wgmma_desc(sK, 16, 1024);
        const uint64_t dv0 = kva__wgmma_desc(sV, WG_BN * 128, 1024);
        int k = 0, ti = blockIdx.x;
        /* PERSIST 3: the warpgroup's tile headers of rounds k and k + 1 in
         * shared memory (slot k & 1 of [2 consumers][2] wg_tile after the
         * staged block ids), written by its thread 0 when the header is first
         * read from global memory (the next tile's Q load) and published by
         * the named barrier 3 + cw at the top of the round. */
        static_assert(4 * sizeof(wg_tile) <= 256, "tile-header slots (launch_ws smem)");
        wg_tile *const hslots =
            (wg_tile *)(smem_raw + (empty + 8 * NST + (PRE ? 1024 : 0) - kva__smem_u32(smem_raw)));
        wg_tile tl;
        wg_tile_init(tl, a, a.tiles + (size_t)ti * KVA__CUDA_PREFILL_TILE_INTS);
        wg_load_q<128>(a, tl, sQ, cw * 64, 64, ct & 127);
        kva__cp_async_commit();
        if (PERSIST == 3 && (ct & 127) == 0)
            hslots[cw * 2] = tl;
        for (;;) {
            /* PERSIST 1, 2: tile header and tile count are read again where
             * they are needed, not kept live through the key loop (registers);
             * 3: from the shared-memory slot instead of global memory. */
            if (PERSIST == 1 || PERSIST == 2)
                wg_tile_init(tl, a, a.tiles + (size_t)ti * KVA__CUDA_PREFILL_TILE_INTS);
            kva__cp_async_wait<0>();
            kva__fence_proxy_async();
            wg_bar_sync(3 + cw, 128);
            if (PERSIST == 3)
                tl = hslots[cw * 2 + (k & 1)];
            wg_ctx c;
            wg_ctx_init(c, a, tl.m0, cw * 64 + wq * 16, tl.m_last, tl.G, tl.kvh, tl.seq_len,
                        tl.q_len, tl.pos_min, tl.pos_max);
            const int n_first = tl.kv_lo / WG_BN;
            const int n_last = tl.kv_hi > tl.kv_lo ? (tl.kv_hi - 1) / WG_BN : n_first - 1;
            const int ntiles = n_last - n_first + 1; /* may be 0 */
            float o[64], s[64];
            float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < 64; e++) {
                o[e] = 0.0f;
                s[e] = 0.0f;
            }
            uint32_t pa[8][4];
            const int my_bar = 1 + cw, other_bar = 2 - cw;
            if (ntiles > 0) {
                if (cw == 1)
                    wg_bar_arrive(1, 256); /* consumer 0 issues first */
                /* Tile 0: S only. */
                const int st0 = (int)(gi % NST);
                wg_mbar_wait(full + 8 * st0, (gi / NST) & 1);
                wg_bar_sync(my_bar, 256);
                kva__wgmma_fence();
                wg_qk<Ty>(s, dq, dk0 + ((uint64_t)(st0 * KB) >> 4));
                kva__wgmma_commit();
                wg_bar_arrive(other_bar, 256);
                kva__wgmma_wait<0>();
#pragma unroll
                for (int e = 0; e < 64; e++)
                    kva__reg_fence(s[e]);
                float alpha[2] = {1.0f, 1.0f};
                wg_softmax<Ty>(s, o, pa, m_run, l_run, c, n_last * WG_BN, alpha);
                bool resc_prev = false; /* INTRA: o is still zero after tile 0 */
                for (int it = 1; it < ntiles; it++) {
                    const uint32_t gk = gi + (uint32_t)it;
                    const int st = (int)(gk % NST), sp = (int)((gk - 1) % NST);
                    wg_mbar_wait(full + 8 * st, (gk / NST) & 1);
                    wg_bar_sync(my_bar, 256);
                    kva__wgmma_fence();
                    if (!INTRA) {
                        wg_pv<Ty, false>(o, pa, dv0 + ((uint64_t)(sp * KB) >> 4));
                        kva__wgmma_commit();
                        wg_qk<Ty>(s, dq, dk0 + ((uint64_t)(st * KB) >> 4));
                        kva__wgmma_commit();
                        wg_bar_arrive(other_bar, 256);
                        kva__wgmma_wait<1>(); /* P V of tile it - 1 */
#pragma unroll
                        for (int e = 0; e < 64; e++)
                            kva__reg_fence(o[e]);
                        wg_mbar_arrive(empty + 8 * sp);
                        kva__wgmma_wait<0>();
#pragma unroll
                        for (int e = 0; e < 64; e++)
                            kva__reg_fence(s[e]);
                        wg_softmax<Ty>(s, o, pa, m_run, l_run, c, (n_last - it) * WG_BN, alpha);
                    } else {
                        /* S of tile it first, then P V of tile it - 1, which runs
                         * under this tile's softmax. o is rescaled for tile it - 1
                         * between the two issues (as FlashAttention-3 does; a
                         * rescale after the wait makes ptxas serialize wgmma). */
                        wg_qk<Ty>(s, dq, dk0 + ((uint64_t)(st * KB) >> 4));
                        kva__wgmma_commit();
                        if (resc_prev)
                            wg_rescale_o(o, alpha);
                        kva__wgmma_fence();
                        wg_pv<Ty, false>(o, pa, dv0 + ((uint64_t)(sp * KB) >> 4));
                        kva__wgmma_commit();
                        wg_bar_arrive(other_bar, 256);
                        kva__wgmma_wait<1>(); /* S of tile it */
#pragma unroll
                        for (int e = 0; e < 64; e++)
                            kva__reg_fence(s[e]);
                        uint32_t pn[8][4];
                        resc_prev = wg_softmax<Ty, true>(s, o, pn, m_run, l_run, c,
                                                         (n_last - it) * WG_BN, alpha);
                        kva__wgmma_wait<0>(); /* P V of tile it - 1 */
#pragma unroll
                        for (int e = 0; e < 64; e++)
                            kva__reg_fence(o[e]);
#pragma unroll
                        for (int k = 0; k < 8; k++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                asm volatile("" : "+r"(pa[k][i])::"memory"); /* live until here */
                                pa[k][i] = pn[k][i];
                            }
                        wg_mbar_arrive(empty + 8 * sp);
                    }
                }
                /* P V of the last tile. */
                wg_bar_sync(my_bar, 256);
                if (INTRA && resc_prev)
                    wg_rescale_o(o, alpha);
                const int sl = (int)((gi + (uint32_t)ntiles - 1) % NST);
                kva__wgmma_fence();
                wg_pv<Ty, false>(o, pa, dv0 + ((uint64_t)(sl * KB) >> 4));
                kva__wgmma_commit();
                if (cw == 0)
                    wg_bar_arrive(other_bar, 256);
                kva__wgmma_wait<0>();
#pragma unroll
                for (int e = 0; e < 64; e++)
                    kva__reg_fence(o[e]);
                if (PERSIST) /* the ring goes on with the next CTA tile */
                    wg_mbar_arrive(empty + 8 * sl);
            }
            gi += (uint32_t)ntiles;
            /* PERSIST: the next CTA tile's Q rows of this warpgroup are loaded
             * under the epilogue (S of this tile is done with them). */
            const int tn = tile_of(k + 1), nt = PERSIST ? *a.num_tiles : n_tiles;
            if (PERSIST && tn < nt) {
                wg_tile_init(tl, a, a.tiles + (size_t)tn * KVA__CUDA_PREFILL_TILE_INTS);
                wg_load_q<128>(a, tl, sQ, cw * 64, 64, ct & 127);
                kva__cp_async_commit();
                /* Slot (k + 1) & 1 was last read in round k - 1, before the
                 * barrier at the top of this round. */
                if (PERSIST == 3 && (ct & 127) == 0)
                    hslots[cw * 2 + ((k + 1) & 1)] = tl;
            }
            if (PERSIST == 3)
                tl = hslots[cw * 2 + (k & 1)];
            else if (PERSIST)
                wg_tile_init(tl, a, a.tiles + (size_t)ti * KVA__CUDA_PREFILL_TILE_INTS);
            wg_epilogue<Ty>(a, c, o, m_run, l_run, tl.m0 + cw * 64 + wq * 16 + ((ct & 31) >> 2),
                            tl.rows, tl.q_start, tl.G);
            if (!PERSIST || tn >= nt)
                break;
            ti = tn;
            k++;
        }
    }
#endif /* KVA_WGMMA_BODY */
}

/* ------------------------------------------------------------------------ */
/* Host side                                                                 */
/* ------------------------------------------------------------------------ */

extern "C" int kva__cuda_prefill_wgmma_ready(void)
{
#ifdef KVA_CUDA_SM90A
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* sm_90a code runs on compute capability 9.0 only. */
    return major == 9 && minor == 0;
#else
    return 0; /* the build has no sm_90a device code */
#endif
}

template <int NST, bool PV_SPLIT, typename Ty>
static kva_status launch_wg(const kva__cuda_prefill_args *a, cudaStream_t stream)
{
    const size_t smem = 1024 + (size_t)WG_TILE_BYTES(WG_M) + 2 * NST * (size_t)WG_TILE_BYTES(WG_BN);
    cudaError_t e = cudaFuncSetAttribute(prefill_wgmma_kernel<NST, PV_SPLIT, Ty>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch: cudaFuncSetAttribute(%zu bytes of shared "
                         "memory, wgmma kernel): %s",
                         smem, cudaGetErrorString(e));
    prefill_wgmma_kernel<NST, PV_SPLIT, Ty><<<a->grid_tiles, WG_THREADS, smem, stream>>>(*a);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch: launch of %d tiles (wgmma kernel): %s",
                         (int)a->grid_tiles, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

/* Fills tm for the TMA variants (wg_tmaps); tm->ok = 0 where the cache cannot
 * be described or the driver refuses (the kernel then uses cp.async only).
 * With a host cache (a->host_cache) the encoder is looked up once and the
 * maps are reused while they describe the same tensors. */
static void wg_tmaps_encode(const kva__cuda_prefill_args *a, wg_tmaps *tm)
{
    static_assert(sizeof(wg_tmaps) <= sizeof(((kva__cuda_prefill_host_cache *)0)->tmaps),
                  "host cache too small for the tensor maps");
    kva__cuda_prefill_host_cache *hc = a->host_cache;
    memset(tm, 0, sizeof *tm);
    const int B = a->block_size;
    if (a->num_blocks <= 0 || B < 8 || (B & (B - 1)) != 0)
        return;
    if (hc && hc->tm_valid && hc->tm_k == a->k && hc->tm_v == a->v && hc->tm_nb == a->num_blocks &&
        hc->tm_b == B && hc->tm_hkv == a->num_kv_heads && hc->tm_layout == (int32_t)a->layout &&
        hc->tm_dtype == (int32_t)a->dtype) {
        memcpy(tm, hc->tmaps, sizeof *tm);
        return;
    }
    void *fn = hc ? hc->tmap_encode : NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn) {
            (void)cudaGetLastError();
            return;
        }
        if (hc)
            hc->tmap_encode = fn;
    }
    PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const int nhd = a->layout == KVA_LAYOUT_NHD, R = B < 128 ? B : 128;
    const cuuint64_t Hkv = (cuuint64_t)a->num_kv_heads, row = (cuuint64_t)WG_D * 2;
    /* (D, Hkv, B, NB) for NHD, (D, B, Hkv, NB) for HND; strides in bytes of
     * dimensions 1..3. */
    const cuuint64_t dims[4] = {WG_D, nhd ? Hkv : (cuuint64_t)B, nhd ? (cuuint64_t)B : Hkv,
                                (cuuint64_t)a->num_blocks};
    const cuuint64_t strides[3] = {row, row * dims[1], row * dims[1] * dims[2]};
    const cuuint32_t box[4] = {64, nhd ? 1u : (cuuint32_t)R, nhd ? (cuuint32_t)R : 1u, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const CUtensorMapDataType dt = a->dtype == KVA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    for (int i = 0; i < 2; i++) {
        CUresult r = encode(i ? &tm->v : &tm->k, dt, 4, (void *)(i ? a->v : a->k), dims, strides,
                            box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) {
            memset(tm, 0, sizeof *tm);
            return;
        }
    }
    tm->ok = 1;
    tm->box_rows = R;
    if (hc) {
        memcpy(hc->tmaps, tm, sizeof *tm);
        hc->tm_k = a->k;
        hc->tm_v = a->v;
        hc->tm_nb = a->num_blocks;
        hc->tm_b = B;
        hc->tm_hkv = a->num_kv_heads;
        hc->tm_layout = (int32_t)a->layout;
        hc->tm_dtype = (int32_t)a->dtype;
        hc->tm_valid = 1;
    }
}

/* VAR: the variant number (bit of the host cache's attribute mask). */
template <int VAR, int NST, bool DELAY, bool INTRA, bool PRE, int TMA, int PERSIST, typename Ty>
static kva_status launch_ws(const kva__cuda_prefill_args *a, cudaStream_t stream)
{
    const size_t smem = 1024 + (size_t)WG_TILE_BYTES(WG_M) +
                        2 * NST * (size_t)WG_TILE_BYTES(WG_BN) + 16 * NST + (PRE ? 1024 : 0) +
                        (PERSIST == 3 ? 256 : 0); /* 4 wg_tile (52 bytes each) */
    wg_tmaps tm;
    if (TMA)
        wg_tmaps_encode(a, &tm);
    else
        memset(&tm, 0, sizeof tm);
    kva__cuda_prefill_host_cache *hc = a->host_cache;
    int grid = a->grid_tiles;
    if (PERSIST) { /* one CTA per SM (224 KB of shared memory each) */
        int nsm = hc ? hc->num_sms : 0;
        if (nsm <= 0) {
            int dev = 0;
            cudaError_t e = cudaGetDevice(&dev);
            if (e == cudaSuccess)
                e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
            if (e != cudaSuccess)
                return kva__fail(KVA_STATUS_DEVICE_ERROR,
                                 "kva__cuda_prefill_launch: SM count (persistent wgmma kernel): %s",
                                 cudaGetErrorString(e));
            if (hc)
                hc->num_sms = nsm;
        }
        grid = nsm > 0 && nsm < grid ? nsm : grid;
    }
    const int bf = a->dtype == KVA_DTYPE_BF16;
    if (!hc || !((hc->attr_set[bf] >> VAR) & 1)) {
        cudaError_t e =
            cudaFuncSetAttribute(prefill_wgmma_ws_kernel<NST, DELAY, INTRA, PRE, TMA, PERSIST, Ty>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return kva__fail(KVA_STATUS_DEVICE_ERROR,
                             "kva__cuda_prefill_launch: cudaFuncSetAttribute(%zu bytes of shared "
                             "memory, wgmma ws kernel): %s",
                             smem, cudaGetErrorString(e));
        if (hc)
            hc->attr_set[bf] |= (uint64_t)1 << VAR;
    }
    cudaError_t e;
    prefill_wgmma_ws_kernel<NST, DELAY, INTRA, PRE, TMA, PERSIST, Ty>
        <<<grid, 3 * 128, smem, stream>>>(*a, tm);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch: launch of %d tiles (wgmma ws kernel): %s",
                         (int)a->grid_tiles, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

template <typename Ty>
static kva_status launch_wg_dtype(const kva__cuda_prefill_args *a, cudaStream_t st, int variant)
{
    switch (variant) {
    case 6:
        return launch_wg<2, false, Ty>(a, st);
    case 7:
        return launch_wg<3, false, Ty>(a, st);
    case 8:
        return launch_wg<2, true, Ty>(a, st);
    case 9:
        return launch_ws<9, 2, false, false, false, false, 0, Ty>(a, st);
    case 10:
        return launch_ws<10, 3, false, false, false, false, 0, Ty>(a, st);
    case 11:
        return launch_ws<11, 3, true, false, false, false, 0, Ty>(a, st);
    case 12:
        return launch_ws<12, 3, true, true, false, false, 0, Ty>(a, st);
    case 13:
        return launch_ws<13, 3, false, false, true, false, 0, Ty>(a, st);
    case 14:
        return launch_ws<14, 3, false, true, true, false, 0, Ty>(a, st);
    case 15:
        return launch_ws<15, 3, false, false, true, true, 0, Ty>(a, st);
    case 16:
        return launch_ws<16, 3, false, true, true, true, 0, Ty>(a, st);
    case 17:
        return launch_ws<17, 3, false, true, true, true, 1, Ty>(a, st);
    case 18:
        return launch_ws<18, 3, false, false, true, true, 1, Ty>(a, st);
    case 19:
        return launch_ws<19, 3, false, false, true, false, 1, Ty>(a, st);
    case 20:
        return launch_ws<20, 3, false, true, true, true, 2, Ty>(a, st);
    case 22:
        return launch_ws<22, 3, false, true, true, true, 3, Ty>(a, st);
    case 23:
        return launch_ws<23, 3, false, true, true, 2, 2, Ty>(a, st);
    default: /* 21 */
        return launch_ws<21, 3, false, false, true, false, 2, Ty>(a, st);
    }
}

/* Called by kva__cuda_prefill_launch_variant after its argument checks, for
 * variants 6..23 that exist (D = Dv = 128, f16/bf16, sm_90a build and device). */
extern "C" kva_status kva__cuda_prefill_wgmma_launch(const kva__cuda_prefill_args *a, void *stream,
                                                     int variant)
{
    cudaStream_t st = (cudaStream_t)stream;
    return a->dtype == KVA_DTYPE_BF16 ? launch_wg_dtype<kva__mma_bf16>(a, st, variant)
                                      : launch_wg_dtype<kva__mma_f16>(a, st, variant);
}
