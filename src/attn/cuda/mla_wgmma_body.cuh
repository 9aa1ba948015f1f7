/*
 * mla_wgmma_body.cuh - the absorbed MLA attention body on sm_90a warpgroup
 * MMA, shared by the dense decode (mla_decode_wgmma.cu,
 * "mla_decode_wgmma_sm90": the plan's work items over contiguous key ranges
 * of a paged latent cache) and the sparse MLA (mla_sparse_wgmma.cu, the
 * same registry entry for kva_mla_sparse_run: one query token's heads
 * against the rows its index list names). What differs enters as the work
 * policy W of mla_wgmma_kernel<Ty, W> (see "The work policy" below): which
 * item a CTA runs, where its key rows come from and how they reach the
 * shared tile (cp.async of 16-bit rows, or FP8 rows, fp8_ds_mla or dense
 * e4m3, loaded and converted by the CTA), the logit mask, the end-of-item
 * stores, and the schedule of the key loop (W::SCHED, below).
 *
 * One CTA = two warpgroups (256 threads; MW_SCHED_ALT_PROD adds a third,
 * producer warpgroup: 384) runs one item at a time (persistent grid). Per
 * item Q [64, 576] is staged in shared memory in the wgmma K-major layout
 * (128-byte swizzle, 9 column blocks). Key tiles of 64 latent rows land in
 * a 2-stage ring in the same layout (every row read once from global
 * memory, for S and for P V). Warpgroup g owns value columns
 * 256 g .. 256 g + 255 (O [64, 256] in 128 registers per thread). The
 * softmax reference max moves lazily (only when a row's max grows past it
 * by MW_LAZY, so P stays below 2^MW_LAZY and O is rarely rescaled).
 *
 * Two key-loop schedules, a compile-time trait of the policy (the rest of
 * the kernel, item setup, O, the finish, is shared), the second in four
 * forms:
 *
 * MW_SCHED_SPLIT (16-bit key rows gathered by cp.async, where TMA boxes
 * cannot copy the tiles: MW_SCHED_ALT_TMA below): both warpgroups
 * work on the same tile. Per tile:
 *   - S: warpgroup g computes Q K^T for keys 32 g .. 32 g + 31 of the tile
 *     (36 wgmma m64n32k16, A = Q and B = K from shared memory);
 *   - P is written to shared memory ([64, 64] in the input dtype, K-major,
 *     swizzled) against the running reference max; one barrier votes
 *     whether any row moved it: if none did (the usual case) P is final,
 *     otherwise the row maxima go through shared memory, both warpgroups
 *     move the reference the same way, rescale, rewrite P and meet at a
 *     second barrier;
 *   - O += P V over the tile's 64 keys (8 wgmma m64n128k16, A = P and B =
 *     the tile's value columns, MN-major, from shared memory).
 * With cp.async copies this lock-step loop keeps the tensor cores busier
 * than the alternating one with the same copies (which adds hand-offs and
 * copy latency to every pair of tiles).
 *
 * MW_SCHED_ALT and MW_SCHED_ALT_EARLY (FP8 key rows, converted by the CTA
 * into the 16-bit tile): whole tiles alternate between the warpgroups
 * (FlashMLA's sm90 decode does the same), so that one warpgroup's
 * conversion of its next tile (plain loads and stores, no copy engine) runs
 * while the other warpgroup's wgmmas use the tensor cores. The item's tiles
 * go in pairs, tile 2i in stage 0 belongs to warpgroup 0, tile 2i + 1 in
 * stage 1 to warpgroup 1, and warpgroup g
 *   - fills its own stage (its 128 threads, 2 per key);
 *   - computes S = Q K^T of its whole tile (36 wgmma m64n64k16) and the
 *     tile's P, which it keeps in registers for its own ("local") P V (RS
 *     wgmma) and writes into the stage's column block 8 (the k_pe columns,
 *     no longer needed once S is done) for the other warpgroup, so P needs
 *     no buffer of its own;
 *   - adds P V of both tiles of the pair to its value columns: its own
 *     tile's first, then the other warpgroup's ("remote").
 * The reference max is shared through s_ref in a chain: warpgroup 0 moves
 * it for tile 2i, warpgroup 1 adopts it, may move it for tile 2i + 1, and
 * warpgroup 0 rescales the P rows of tile 2i whose reference moved (rare)
 * before handing P over. Named barriers (MW_BAR_*, mla_wgmma_ops.cuh) carry
 * the hand-offs. A stage is refilled in two parts so that the conversion
 * overlaps the pair's remaining work: first the filler's own value half
 * (read only by its local P V), then the other value half and block 8 (read
 * by the other warpgroup's remote P V); S walks the column blocks in the
 * same order and waits for each part just before it. MW_SCHED_ALT_EARLY
 * also issues the next tile's S over part 0 right behind the remote P V
 * (measured faster for the sparse fp8_ds_mla rows, slower for the dense
 * FP8 ones, which then spill more), and in warpgroup 0 the remote P V
 * ahead of its part-0 fill, as warpgroup 1 does, so that the tensor cores
 * run it while the warpgroup converts.
 *
 * MW_SCHED_ALT_PROD (FP8 key rows, a producer warpgroup): 384 threads; the
 * two consumer warpgroups run MW_SCHED_ALT_EARLY's loop, but a third
 * warpgroup (threads 256 .. 383, its own loop over the same items) does
 * every fill, on a "full" and an "empty" mbarrier per stage part
 * (MW_PBAR): a consumer waits on "full" where it waited for its own copies,
 * and arrives on "empty" where it would have filled: its local P V frees
 * part 0 of its stage, its remote P V part 1 of the other stage (no FREE
 * handshake). The producer issues a part's loads before its "empty" wait,
 * so the gather runs while the consumers compute; setmaxnreg splits the
 * registers (MW_REG_C, MW_REG_P).
 *
 * MW_SCHED_ALT_TMA (16-bit key rows of a paged cache whose tiles are whole
 * TMA boxes): the same alternating tiles, each fill part copied by TMA
 * (one thread issues the part's [64, 64] boxes, which land on the part's
 * mbarrier in the ring; S waits on the mbarrier of each part just before
 * its blocks), and the stage's pieces released by the reader that finished
 * them: part 0 by its owner after its local P V, part 1 by the other
 * warpgroup right after its remote P V (no FREE handshake: the copy of the
 * other warpgroup's next tile starts as soon as its last reader is done).
 * With nothing to convert and no threads spent on copies, the two
 * warpgroups' S, softmax and P V overlap across the pair where the
 * cp.async form of the same loop lost to the split-key one. The rows of an
 * item's last tile past its keys are zeroed after S (P is 0 there, but the
 * cache may hold NaN).
 *
 * The S and P V issue sequences are instantiated per warpgroup and picked by
 * a warpgroup-uniform branch, so that their descriptors are constant offsets
 * from uniform registers (with the warpgroup index in a per-thread register,
 * every wgmma needed its descriptor converted).
 * Shared memory: Q 72 KB + 2 x 72 KB ring (+ P 8 KB for MW_SCHED_SPLIT,
 * + 4 mbarriers for MW_SCHED_ALT_TMA, + 8 for MW_SCHED_ALT_PROD) (+ 1 KB
 * alignment): MW_SMEM, MW_SMEM_ALT, MW_SMEM_TMA, MW_SMEM_PROD.
 * Everything that issues sm_90a instructions is compiled only for sm_90a
 * (__CUDA_ARCH_FEAT_SM90_ALL); other device passes get an empty kernel that the
 * host never launches (the registry entry is usable only with sm_90a code and
 * a compute capability 9.0 device).
 */
#ifndef KVA_CUDA_MLA_WGMMA_BODY_CUH
#define KVA_CUDA_MLA_WGMMA_BODY_CUH

#include "mla_wgmma_ops.cuh"

#include <math.h>
#include <stdint.h>

/* The key-loop schedule of a work policy (W::SCHED; see above). */
enum {
    MW_SCHED_SPLIT = 0,
    MW_SCHED_ALT = 1,
    MW_SCHED_ALT_EARLY = 2,
    MW_SCHED_ALT_TMA = 3,
    MW_SCHED_ALT_PROD = 4
};
/* Whether schedule SCHED runs the alternating loop's lean softmax (LEAN in
 * mw_alt_loop, mla_wgmma_ops.cuh): every alternating schedule but
 * MW_SCHED_ALT_PROD. The kernel writes the -inf that LEAN reads at
 * s_ref[MW_REF_NEG_INF] for exactly these schedules. */
static __host__ __device__ constexpr bool mw_lean(int sched)
{
    return sched != MW_SCHED_SPLIT && sched != MW_SCHED_ALT_PROD;
}
/* s_ref (the kernel's s_max[0], MW_M reference maxima of the alternating
 * loop) is followed by one float that holds -inf for the whole kernel: LEAN
 * warpgroup 0 reads it after the SC0 barrier (see mw_alt_loop). It is
 * s_max[1][0], which only the MW_SCHED_SPLIT tile loop writes, and that
 * schedule never runs the alternating loop (the kernel's static_asserts). */
#define MW_REF_NEG_INF MW_M
/* Threads per CTA of policy W (the launch bound): the producer schedule adds
 * its producer warpgroup to the two consumer warpgroups; ML_NT also for a
 * policy without SCHED (the dense decode's empty stand-in in the device
 * passes without sm_90a code; the sparse stand-in keeps its SCHED, so its
 * bound is the launch's). */
template <typename W, typename = void> struct mw_nt {
    static constexpr int NT = ML_NT;
};
template <typename W> struct mw_nt<W, decltype((void)W::SCHED)> {
    static constexpr int NT = W::SCHED == MW_SCHED_ALT_PROD ? MW_NT_PROD : ML_NT;
};

/*
 * The work policy W of mla_wgmma_kernel<Ty, W>: a class, one object per item.
 *   typedef args               the kernel's argument struct;
 *   static constexpr int SCHED the key-loop schedule, MW_SCHED_*;
 *   static items(a)            work items of the launch (CTAs loop over them);
 *   W(a, it, sK, q_gen, r0)    loads item it and sets what logits needs for
 *                              the thread's rows r0, r0 + 8; unless it skips
 *                              the item: MW_SCHED_SPLIT: starts the copies
 *                              of its first key tile into ring stage 0 at
 *                              sK (committed) and stages Q [64, 576] (rows
 *                              past the item's zero) at q_gen; ALT: what the
 *                              fills of its warpgroup's first tile need;
 *   skip, k0, kend             the item does nothing (CTA-uniform); its keys
 *                              k0 .. kend - 1, in tiles of 64;
 *   finish(a, s_sum, wg, r0, t4, l_run, m_run, o)  the item's stores; ends
 *                              with every thread past s_sum.
 * MW_SCHED_SPLIT policies also have
 *   next(a, kb, stage, st)     after S of tile kb - 64 is issued: the copies
 *                              of tile kb (if kb < kend) into `stage` (ring
 *                              slot st; the caller commits them);
 *   land(a, kb, stage, st)     after P V of tile kb - 64 is issued: what the
 *                              policy itself writes into `stage` (slot st)
 *                              for tile kb;
 *   logits(sc[4][4], a, scale_log2, kb, wg, t4, st)  S of the thread's keys
 *                              kb + 32 wg + 8 j + 2 t4 + e (ring slot st) into
 *                              log2-unit logits, masked keys -inf;
 * MW_SCHED_ALT(_EARLY, _TMA) policies
 *   stage_q(a, q_gen)          Q [64, 576] of the item (rows past it zero)
 *                              in shared memory at q_gen on return (stored
 *                              here, or copies the constructor issued
 *                              waited for), all threads
 *                              (MW_SCHED_ALT_PROD: the consumers' 256);
 *   fill<WG, PART>(a, kb, stage, st)  by the 128 threads of warpgroup WG:
 *                              column blocks mw_fblk<WG, PART> of the tile
 *                              kb (< kend; keys past kend zeros) into its
 *                              stage (ring slot st = WG), thread t taking key
 *                              t / 2 at mw_fill_at; cp.async (the caller
 *                              commits each part) or stores; the fills of
 *                              one warpgroup come in tile order, part 0
 *                              then part 1, its tiles kb 128 apart;
 *   (MW_SCHED_ALT_TMA instead of fill: trow(a, kb) the cache row of
 *                              tile kb (< kend; a load, by one thread);
 *                              tfill<S, PART>(a, row, stage, bar) by one
 *                              thread: the column blocks mw_fblk<S, PART>
 *                              of the tile at cache row `row` into stage
 *                              S's slot at `stage`, completing on the
 *                              mbarrier bar with their byte count; W::args
 *                              must be usable as a __grid_constant__;)
 *   mul = logits(sc[8][4], a, scale_log2, kb, t4, st)  S of the thread's
 *                              keys kb + 8 j + 2 t4 + e (ring slot st) into
 *                              log2-unit logits, masked keys -inf, or (a
 *                              tile without masked keys, ALiBi or soft-cap)
 *                              left as they are: mul > 0 the factor that
 *                              takes them to log2 units (1 where applied),
 *                              which the row maxima and P's exponent apply.
 *   (MW_SCHED_ALT_PROD instead of fill, by the producer's 128 threads, thread
 *   t taking key t / 2 at mw_fill_at: type raw, the registers of one part;
 *   fetch<S, PART>(a, kt, r) its loads of part PART of tile kt (stage S),
 *   before the stage part is free; put<S, PART>(a, kt, r, stage, st) its
 *   stores into the stage; the fills of one stage come in tile order, part
 *   0 then part 1, its tiles kt 128 apart. The constructor runs in all 384
 *   threads; finish must hold exactly two CTA barriers, which the producer
 *   joins: ml_finish's.)
 *
 * The MW_SCHED_SPLIT tile loop, per 64-key tile (stage = its ring slot):
 *   1. wait for this thread's copies of the tile, barrier (the tile landed;
 *      both warpgroups' P V of the previous tile are done);
 *   2. issue S, then the copy of the next tile into the other stage (S first:
 *      the copy issued ahead of S, or in whole 128-byte lines per warp
 *      instruction, ran slower);
 *   3. S done: logits, the thread's row maxima into s_max, and P written
 *      against the current reference max m_run (the lazy max rarely moves);
 *   4. one barrier with a vote: when no row's max grew past m_run + MW_LAZY
 *      (the usual case) P is final; otherwise (the item's first tile, a
 *      jump) every thread takes its rows' maxima from s_max, moves the
 *      reference, rescales, rewrites P, and all meet at a second barrier;
 *   5. P V issued, the policy's land step for the next tile, P V waited for.
 */

#ifdef KVA_MLA_WGMMA_BODY
/* Part 0 of warpgroup WG's next tile kn (if < kend, the item's) into its stage, once
 * its local P V read the stage's part 0: cp.async or stores by the
 * warpgroup (committed), or (TMA) by its issuing thread `elect` once every
 * warp of the warpgroup is past the local P V, completing on `bar` (the
 * tile's cache row is row, W::trow's, looked up at the top of the pair). */
template <int WG, bool TMA, typename W>
static __device__ __forceinline__ void mw_fill0(W &wi, const typename W::args &a, int32_t kn,
                                                int32_t kend, uint32_t mine, uint32_t bar,
                                                bool elect, int32_t row)
{
    if constexpr (TMA) {
        mw_wg_sync<WG>();
        if (elect && kn < wi.kend) /* wi.kend == kend */
            wi.template tfill<WG, 0>(a, row, mine, bar);
    } else {
        if (kn < kend)
            wi.template fill<WG, 0>(a, kn, mine, WG);
        kva__cp_async_commit();
    }
}

/* MW_SCHED_ALT_PROD: S part 0 of warpgroup WG's tile at dk, issued and
 * committed as a group of its own once the producer filled it (the "full"
 * phase of parity ph of its stage's part 0), or at once where the warpgroup
 * has no such tile (`fill` false: the result is unused; a wgmma on a path of
 * its own would serialize every wgmma of the kernel). */
template <typename Ty, int WG>
static __device__ __forceinline__ void mw_s_part0_full(float (&sc)[8][4], uint64_t dq, uint64_t dk,
                                                       uint32_t bars, bool fill, uint32_t ph)
{
    if (fill)
        kva__mbar_wait(MW_PBAR(bars, 0, WG, 0), ph & 1u);
    kva__wgmma_fence();
    mw_s64<Ty, WG, 0, 4>(sc, dq, dk);
    kva__wgmma_commit();
}

/* MW_SCHED_ALT_PROD, by the producer warpgroup: part PART of tile kt into
 * ring stage S. Its global loads go out first (W::fetch, into registers),
 * then the part's "empty" phase of the stage's previous fill is waited for
 * (parity bit S of ph: the stage's next fill; a fresh mbarrier passes parity
 * 1 at once), the codes are converted into the stage (W::put), made visible
 * to the consumers' wgmmas, and the part's "full" mbarrier gets the
 * producer's 128 arrivals. */
template <int S, int PART, typename W>
static __device__ __forceinline__ void mw_pfill(W &wi, const typename W::args &a, int32_t kt,
                                                uint32_t sK, uint32_t bars, uint32_t ph)
{
    typename W::raw r;
    wi.template fetch<S, PART>(a, kt, r);
    kva__mbar_wait(MW_PBAR(bars, 1, S, PART), ((ph >> S) & 1u) ^ 1u);
    wi.template put<S, PART>(a, kt, r, sK + S * MW_KB, S);
    kva__fence_proxy_async(); /* the stores -> the consumers' wgmma reads */
    kva__mbar_arrive(MW_PBAR(bars, 0, S, PART));
}

/* MW_SCHED_ALT_PROD: the producer's fills of an item, pair by pair in the
 * order the consumers free the parts (part 0 of both stages after the local
 * P Vs, then part 1 after the remote ones); tile kb + 64 s goes to stage s.
 * Part 0 of the first pair is filled before the item's first CTA barrier
 * (the consumers stage Q meanwhile, then issue S over it at once; the ring
 * is free once the previous item's consumers arrived), which the producer
 * then joins. */
template <typename W>
static __device__ __forceinline__ void mw_produce(W &wi, const typename W::args &a, uint32_t sK,
                                                  uint32_t bars, uint32_t &ph)
{
    const int32_t k0 = wi.k0, kend = wi.kend;
    for (int32_t kb = k0; kb < kend; kb += 2 * MW_BN) {
        const bool have1 = kb + MW_BN < kend; /* CTA-uniform */
        mw_pfill<0, 0>(wi, a, kb, sK, bars, ph);
        if (have1)
            mw_pfill<1, 0>(wi, a, kb + MW_BN, sK, bars, ph);
        if (kb == k0)
            __syncthreads(); /* the item's first barrier (Q staged) */
        mw_pfill<0, 1>(wi, a, kb, sK, bars, ph);
        if (have1)
            mw_pfill<1, 1>(wi, a, kb + MW_BN, sK, bars, ph);
        ph ^= have1 ? 3u : 1u;
    }
    if (k0 >= kend)
        __syncthreads();
}

/* The alternating-tile loop of warpgroup WG over the item's pairs of tiles
 * (see the header comment); both warpgroups meet at the same named barriers
 * in each pair, also where a pair has no second tile (kend inside the
 * first). EARLY (MW_SCHED_ALT_EARLY): the S steps over part 0 of the next
 * tile are issued behind the remote P V, and issued even where the
 * warpgroup has no next tile (their result is then unused): on a path of
 * its own, ptxas serializes every wgmma of the kernel. */
template <typename Ty, int WG, int SCHED, typename W>
static __device__ __forceinline__ void
mw_alt_loop(W &wi, const typename W::args &a, uint32_t sQ, uint32_t sK, float *s_ref, int r0,
            int t4, float scale_log2, float (&o)[32][4], float m_run[2], float l_run[2],
            uint32_t bars, uint32_t &ph)
{
    static_assert(SCHED != MW_SCHED_SPLIT, "the split schedule writes s_max[1]: no s_ref -inf");
    constexpr bool PROD = SCHED == MW_SCHED_ALT_PROD;
    constexpr bool EARLY = SCHED == MW_SCHED_ALT_EARLY || PROD, TMA = SCHED == MW_SCHED_ALT_TMA;
    constexpr bool LEAN = mw_lean(SCHED);                /* the lean softmax (mla_wgmma_ops.cuh) */
    const bool elect = (threadIdx.x & (MW_WT - 1)) == 0; /* TMA: the warpgroup's issuing thread */
    const uint32_t mine = sK + WG * MW_KB, other = sK + (1 - WG) * MW_KB;
    const uint64_t dq = kva__wgmma_desc(sQ, 16, 1024);
    const uint64_t dk = kva__wgmma_desc(mine, 16, 1024);
    const uint64_t dv_mine = kva__wgmma_desc(mine, MW_BN * 128, 1024);
    const uint64_t dv_other = kva__wgmma_desc(other, MW_BN * 128, 1024);
    const uint64_t dp_other = kva__wgmma_desc(other + MW_PO, 16, 1024);
    const int32_t k0 = wi.k0, kend = wi.kend;
    float sc[8][4];

    if constexpr (PROD) /* S part 0 of the first tile once the producer filled it */
        mw_s_part0_full<Ty, WG>(sc, dq, dk, bars, k0 + WG * MW_BN < kend, ph);
    else if constexpr (EARLY) /* S part 0 of the first tile (both parts are committed) */
        mw_s_part0<Ty, WG, 1>(sc, dq, dk);
    for (int32_t kb = k0; kb < kend; kb += 2 * MW_BN) {
        const int32_t kt = kb + WG * MW_BN;                     /* this warpgroup's tile */
        const bool have = kt < kend, have1 = kb + MW_BN < kend; /* CTA-uniform */
        const int32_t kn = kt + 2 * MW_BN;                      /* its next tile */
        float mu[2] = {0.f, 0.f}, psum[2] = {0.f, 0.f};
        float mul = 1.f; /* the logits' factor left to P (W::logits) */
        /* TMA: the cache rows of the pair's two fills by the issuing thread
         * (its next tile's part 0, then part 1 of the other warpgroup's next
         * tile), looked up now so that the loads land during S. */
        int32_t row_n = 0, row_o = 0;
        if constexpr (TMA) {
            if (elect) {
                const int32_t ko = kb + (1 - WG) * MW_BN + 2 * MW_BN;
                if (kn < kend)
                    row_n = wi.trow(a, kn);
                if (ko < kend)
                    row_o = wi.trow(a, ko);
            }
        }

        if constexpr (EARLY) {
            /* The rest of S of the own tile (part 0's k-steps were issued
             * with the previous pair's remote P V) once part 1 landed (PROD:
             * its "full" mbarrier; a warpgroup without a tile waits for
             * nothing and its S is unused). */
            if constexpr (PROD) {
                if (have)
                    kva__mbar_wait(MW_PBAR(bars, 0, WG, 1), ph & 1u);
            } else {
                mw_landed<WG, 0>();
            }
            kva__wgmma_fence();
            mw_s64<Ty, WG, 4, 9>(sc, dq, dk);
            mw_s_done(sc);
            if (have)
                mul = wi.logits(sc, a, scale_log2, kt, t4, WG);
        } else if (have) {
            /* S of the own tile, each fill part waited for just before its
             * blocks (part 1 may still land while part 0's k-steps run). */
            if constexpr (TMA)
                kva__mbar_wait(MW_TBAR(bars, WG, 0), (ph >> WG) & 1u);
            else
                mw_landed<WG, 1>();
            kva__wgmma_fence();
            mw_s64<Ty, WG, 0, 4>(sc, dq, dk);
            if constexpr (TMA) {
                /* (the wait loop is a branch: the k-steps before it form a
                 * group of their own, fenced again after it) */
                kva__wgmma_commit();
                kva__mbar_wait(MW_TBAR(bars, WG, 1), (ph >> WG) & 1u);
                kva__wgmma_fence();
            } else {
                mw_landed<WG, 0>();
            }
            mw_s64<Ty, WG, 4, 9>(sc, dq, dk);
            mw_s_done(sc);
            mul = wi.logits(sc, a, scale_log2, kt, t4, WG);
            if constexpr (TMA)
                if (kt + MW_BN > kend) /* rows past the item's keys (warpgroup-uniform) */
                    mw_zero_rows<WG>(mine, kend - kt);
        }
        /* LEAN: the thread's tile maxima (in warpgroup 1 before it waits
         * for warpgroup 0's reference, which they do not need). */
        float mx[2] = {-INFINITY, -INFINITY};
        if constexpr (LEAN && WG == 1) {
            if (have)
#pragma unroll
                for (int hf = 0; hf < 2; hf++)
                    mx[hf] = mw_tmax(sc, hf) * mul;
        }
        if constexpr (WG == 1) {
            /* Adopt warpgroup 0's reference for this pair. */
            kva__named_bar(true, MW_BAR_SC0, ML_NT);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m0 = s_ref[r0 + 8 * hf];
                if (m0 != m_run[hf])
                    mw_move(o, m_run, l_run, hf, m0);
            }
            __syncwarp(); /* the quad's reads before its lane 0 writes below */
        }
        if (have) {
            /* The tile's row maxima (the factor mul > 0 applied to the max
             * of the unscaled logits); a row whose max grew past the lazy
             * headroom (or was -inf and is not now) moves the reference.
             * LEAN: the quads' shuffles only where some thread's own maxima
             * would move a row of the warp (rare), the same moves. */
            if constexpr (LEAN) {
                bool mv = false;
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if constexpr (WG == 0)
                        mx[hf] = mw_tmax(sc, hf) * mul;
                    mv |= mx[hf] > m_run[hf] + MW_LAZY; /* -inf + MW_LAZY is -inf */
                }
                if (__any_sync(0xffffffffu, mv)) {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        mx[hf] = mw_quad_max(mx[hf]);
                        if (mx[hf] > m_run[hf] + MW_LAZY)
                            mw_move(o, m_run, l_run, hf, mx[hf]);
                    }
                }
            } else {
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const float mx = kva__dmma_row_max<8>(sc, hf) * mul;
                    if (mx > m_run[hf] + MW_LAZY)
                        mw_move(o, m_run, l_run, hf, mx);
                }
            }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                mu[hf] = m_run[hf] == -INFINITY ? 0.f : m_run[hf];
                if (t4 == 0)
                    s_ref[r0 + 8 * hf] = m_run[hf];
            }
        }
        kva__named_bar(false, WG == 0 ? MW_BAR_SC0 : MW_BAR_SC1, ML_NT);
        if constexpr (LEAN && WG == 0) {
            /* P's work after the arrive that warpgroup 1 waits for: ptxas
             * otherwise sinks the arrive below P's FMAs and MUFUs. A load
             * stays after the barrier, and mu depends on it:
             * s_ref[MW_REF_NEG_INF] holds -inf (the kernel's), and mu is never
             * NaN. */
            const float z = s_ref[MW_REF_NEG_INF];
            mu[0] = fmaxf(mu[0], z);
            mu[1] = fmaxf(mu[1], z);
        }
        uint32_t pa[4][4];
        if (have) {
            mw_pack_p<Ty, LEAN>(sc, mu, mul, pa, psum);
            l_run[0] += psum[0];
            l_run[1] += psum[1];
            mw_pv_rs<Ty, WG>(o, pa, dv_mine); /* local P V, P from registers */
        }
        if constexpr (WG == 0) {
            /* Warpgroup 1's reference: rows it moved get O and P rescaled
             * (after the local P V read the old P), then P goes to stage 0. */
            kva__named_bar(true, MW_BAR_SC1, ML_NT);
            kva__wgmma_wait<0>();
            mw_o_fence(o);
            mw_a_fence(pa);
            if constexpr (PROD) /* the local P V read part 0 of stage 0 last */
                kva__mbar_arrive(MW_PBAR(bars, 1, 0, 0));
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m1 = s_ref[r0 + 8 * hf];
                if (m1 != m_run[hf]) {
                    mw_scale_p<Ty>(pa, hf, kva__ex2(m_run[hf] - m1)); /* 0 from -inf */
                    mw_move(o, m_run, l_run, hf, m1);
                }
            }
            mw_put_p<LEAN>(pa, mine + MW_PO, r0, t4);
            kva__fence_proxy_async(); /* P stores -> the other warpgroup's wgmma reads */
            kva__named_bar(false, MW_BAR_P0, ML_NT);
            /* Our value half of stage 0 is free: part 0 of the next tile
             * (EARLY: behind the remote P V). */
            if constexpr (!EARLY)
                mw_fill0<WG, TMA>(wi, a, kn, kend, mine, MW_TBAR(bars, WG, 0), elect, row_n);
            kva__named_bar(true, MW_BAR_P1, ML_NT);
            if (have1)
                mw_pv<Ty, WG>(o, dp_other, dv_other); /* remote P V */
            if constexpr (EARLY && !PROD)
                mw_fill0<WG, TMA>(wi, a, kn, kend, mine, MW_TBAR(bars, WG, 0), elect, row_n);
        } else {
            if (have) {
                mw_put_p<LEAN>(pa, mine + MW_PO, r0, t4);
                kva__fence_proxy_async();
            }
            kva__named_bar(false, MW_BAR_P1, ML_NT);
            kva__named_bar(true, MW_BAR_P0, ML_NT);
            mw_pv<Ty, WG>(o, dp_other, dv_other); /* remote P V */
            kva__wgmma_wait<1>();                 /* the local one */
            mw_a_fence(pa);
            if constexpr (PROD) {
                if (have) /* the local P V read part 0 of stage 1 last */
                    kva__mbar_arrive(MW_PBAR(bars, 1, 1, 0));
            } else {
                mw_fill0<WG, TMA>(wi, a, kn, kend, mine, MW_TBAR(bars, WG, 0), elect, row_n);
            }
        }
        /* (EARLY: S part 0 of the next tile queues behind the remote P V.)
         * The remote P V is waited for, the other warpgroup told, and part 1
         * of the next tile goes into what it read. */
        if constexpr (PROD) {
            if (have)
                ph ^= 1u; /* the parity of the stage's next fill */
            mw_s_part0_full<Ty, WG>(sc, dq, dk, bars, kn < kend, ph);
            kva__wgmma_wait<1>();
        } else if constexpr (EARLY) {
            mw_s_part0<Ty, WG, 0>(sc, dq, dk);
            kva__wgmma_wait<1>();
        } else {
            kva__wgmma_wait<0>();
        }
        mw_o_fence(o);
        if constexpr (TMA) {
            /* The reader that finished releases: this warpgroup's remote P V
             * was the last read of part 1 of the other stage, which now
             * takes part 1 of the other warpgroup's next tile. */
            mw_wg_sync<WG>();
            const int32_t ko = kb + (1 - WG) * MW_BN + 2 * MW_BN;
            if (elect && ko < kend)
                wi.template tfill<1 - WG, 1>(a, row_o, other, MW_TBAR(bars, 1 - WG, 1));
            ph ^= have1 ? 3u : 1u; /* the stages whose tile this pair consumed */
        } else if constexpr (PROD) {
            /* The remote P V was the last read of part 1 of the other stage
             * (warpgroup 0 reads stage 1 only where it had a tile). */
            if (WG == 1 || have1)
                kva__mbar_arrive(MW_PBAR(bars, 1, 1 - WG, 1));
        } else {
            kva__named_bar(false, WG == 0 ? MW_BAR_FREE1 : MW_BAR_FREE0, ML_NT);
            kva__named_bar(true, WG == 0 ? MW_BAR_FREE0 : MW_BAR_FREE1, ML_NT);
            if (kn < kend)
                wi.template fill<WG, 1>(a, kn, mine, WG);
            kva__cp_async_commit();
        }
    }
    if constexpr (EARLY)
        kva__wgmma_wait<0>(); /* the unused S part 0 past the item's last tile */
}

/* The first tile of warpgroup WG in its stage (both parts, committed; TMA:
 * issued by the warpgroup's first thread on the stage's mbarriers). */
template <int WG, typename W>
static __device__ __forceinline__ void mw_first(W &wi, const typename W::args &a, uint32_t sK,
                                                uint32_t bars)
{
    const int32_t kt = wi.k0 + WG * MW_BN;
    if constexpr (W::SCHED == MW_SCHED_ALT_TMA) {
        if ((threadIdx.x & (MW_WT - 1)) == 0 && kt < wi.kend) {
            const int32_t row = wi.trow(a, kt);
            wi.template tfill<WG, 0>(a, row, sK + WG * MW_KB, MW_TBAR(bars, WG, 0));
            wi.template tfill<WG, 1>(a, row, sK + WG * MW_KB, MW_TBAR(bars, WG, 1));
        }
    } else {
        if (kt < wi.kend)
            wi.template fill<WG, 0>(a, kt, sK + WG * MW_KB, WG);
        kva__cp_async_commit();
        if (kt < wi.kend)
            wi.template fill<WG, 1>(a, kt, sK + WG * MW_KB, WG);
        kva__cp_async_commit();
    }
}
#endif

template <typename Ty, typename W>
__global__ void __launch_bounds__(mw_nt<W>::NT, 1)
    mla_wgmma_kernel(const __grid_constant__ typename W::args a)
{
#ifdef KVA_MLA_WGMMA_BODY
    extern __shared__ __align__(1024) unsigned char mw_smem_raw[];
    __shared__ float s_max[2][64], s_sum[2][64];
    const uint32_t raw = kva__smem_u32(mw_smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + MW_QB, sP = sK + MW_NST * MW_KB;
    unsigned char *q_gen = mw_smem_raw + (sQ - raw);

    const int tid = threadIdx.x, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int wg = tid >> 7;                   /* warpgroup: key slice of S, column half of O */
    const int r0 = ((tid >> 5) & 3) * 16 + g4; /* the thread's rows r0 and r0 + 8 */
    const int32_t n_items = W::items(a);
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    const uint64_t dq = kva__wgmma_desc(sQ, 16, 1024);
    const uint64_t dk = kva__wgmma_desc(sK, 16, 1024);
    const uint64_t dv = kva__wgmma_desc(sK, MW_BN * 128, 1024);
    const uint64_t dp = kva__wgmma_desc(sP, 16, 1024);
    /* MW_SCHED_ALT_TMA: the ring's mbarriers (after the ring) and the parity
     * of each stage's next fill (bit s), carried across items. */
    const uint32_t bars = sP;
    uint32_t ph = 0;
    if constexpr (W::SCHED == MW_SCHED_ALT_TMA) {
        if (tid < 4)
            kva__mbar_init(bars + 8u * (uint32_t)tid, 1);
        __syncthreads();
    }
    /* Alternating tiles (LEAN, see mw_alt_loop): the float after s_ref =
     * s_max[0] (s_ref[MW_REF_NEG_INF], i.e. s_max[1][0]) is -inf, visible
     * after the item's first CTA barrier; s_max[1] is otherwise written only
     * by the MW_SCHED_SPLIT tile loop below, which does not run it. */
    static_assert(sizeof(s_max[0]) == MW_REF_NEG_INF * sizeof(float),
                  "s_ref[MW_REF_NEG_INF] must be the first float after s_max[0]");
    float *const s_ref = s_max[0];
    if constexpr (mw_lean(W::SCHED))
        if (tid == 0)
            s_ref[MW_REF_NEG_INF] = -INFINITY;
    /* MW_SCHED_ALT_PROD: the ring's full / empty mbarriers; warpgroup 2 is
     * the producer (its own item loop, the same items; it joins the
     * consumers' CTA barriers: the item's first, after Q, and ml_finish's
     * two), the others compute as in MW_SCHED_ALT_EARLY. ph: the parity of
     * each stage's next fill (producer: bit s; consumer: its own stage). */
    if constexpr (W::SCHED == MW_SCHED_ALT_PROD) {
        if (tid < 8)
            kva__mbar_init(bars + 8u * (uint32_t)tid, MW_WT);
        __syncthreads();
        if (wg == 2) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(MW_REG_P) : "memory");
            for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                W wi(a, it, sK, q_gen, r0);
                if (wi.skip)
                    continue;
                mw_produce(wi, a, sK, bars, ph);
                __syncthreads(); /* ml_finish: the row sums */
                __syncthreads(); /* ml_finish: its end */
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MW_REG_C) : "memory");
    }

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        W wi(a, it, sK, q_gen, r0);
        if (wi.skip)
            continue;
        if constexpr (W::SCHED != MW_SCHED_SPLIT) {
            /* Alternating tiles: each warpgroup's first tile (PROD: the
             * producer's), then Q. */
            if constexpr (W::SCHED != MW_SCHED_ALT_PROD) {
                if (wg == 0)
                    mw_first<0>(wi, a, sK, bars);
                else
                    mw_first<1>(wi, a, sK, bars);
            }
            wi.stage_q(a, q_gen);
            kva__fence_proxy_async(); /* Q's stores or copies -> the wgmma operand reads */
            __syncthreads();
        }

        /* O [64, 256] of this warpgroup: n8 tiles 16 h + n are columns
         * 256 wg + 128 h + 8 n + ... (two m64n128 accumulators). */
        float o[32][4];
#pragma unroll
        for (int n = 0; n < 32; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        if constexpr (W::SCHED == MW_SCHED_SPLIT) {
            const int32_t kend = wi.kend;
            const int32_t k0 = wi.k0;
            for (int32_t kb = k0; kb < kend; kb += MW_BN) {
                const int stage = ((kb - k0) / MW_BN) & 1;
                kva__cp_async_wait<0>();
                kva__fence_proxy_async(); /* cp.async and Q stores -> the wgmma operand reads */
                __syncthreads();          /* 1. tile kb landed; the other stage and P are free */
                const uint32_t st_off = (uint32_t)stage * MW_KB;

                /* 2. S = Q K^T for keys kb + 32 wg .. + 31: 36 k-steps over 576, in
                 * two accumulator chains (even and odd k-steps) summed afterwards.
                 * Warpgroup-uniform branches: each side's descriptors are then
                 * constant offsets from uniform bases. */
                float sc[4][4], sc2[4][4];
                if (wg == 0)
                    mw_s<Ty, 0>(sc, sc2, dq, dk + (st_off >> 4));
                else
                    mw_s<Ty, 1>(sc, sc2, dq, dk + (st_off >> 4));
                /* The next tile's copies go out while the tensor cores run S. */
                wi.next(a, kb + MW_BN, sK + (stage ^ 1) * MW_KB, stage ^ 1);
                kva__cp_async_commit();
                kva__wgmma_wait<0>();
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        kva__reg_fence(sc[j][e]);
                        kva__reg_fence(sc2[j][e]);
                        sc[j][e] += sc2[j][e];
                    }
                wi.logits(sc, a, scale_log2, kb, wg, t4, stage);

                /* 3. The thread's row maxima over its keys and 4 lanes; a row
                 * whose max grew past the lazy headroom (or was -inf and is not
                 * now) votes to move the reference. */
                bool move = false;
                float mu[2], psum[2];
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const float mx = kva__dmma_row_max<4>(sc, hf);
                    if (t4 == 0) /* MW_SCHED_SPLIT only: s_max[1][0] is LEAN's -inf */
                        s_max[wg][r0 + 8 * hf] = mx;
                    move |= mx > m_run[hf] + MW_LAZY; /* -inf + MW_LAZY is -inf */
                    mu[hf] = m_run[hf] == -INFINITY ? 0.f : m_run[hf];
                }
                mw_store_p<Ty>(sc, mu, sP, wg, r0, t4, psum);
                kva__fence_proxy_async(); /* P stores -> the wgmma operand reads */
                /* 4. Every thread's vote; the barrier also publishes s_max and P. */
                if (__syncthreads_or(move)) {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int r = r0 + 8 * hf;
                        float mx = fmaxf(m_run[hf], fmaxf(s_max[0][r], s_max[1][r]));
                        if (m_run[hf] != -INFINITY && !(mx > m_run[hf] + MW_LAZY))
                            mx = m_run[hf];
                        mu[hf] = mx == -INFINITY ? 0.f : mx;
                        const float alpha = kva__ex2(m_run[hf] - mu[hf]); /* 0 while m_run = -inf */
                        m_run[hf] = mx;
                        l_run[hf] *= alpha;
#pragma unroll
                        for (int n = 0; n < 32; n++) {
                            o[n][2 * hf] *= alpha;
                            o[n][2 * hf + 1] *= alpha;
                        }
                    }
                    /* P against the moved reference (nobody reads P before the
                     * barrier below). */
                    mw_store_p<Ty>(sc, mu, sP, wg, r0, t4, psum);
                    kva__fence_proxy_async();
                    __syncthreads();
                }
                l_run[0] += psum[0];
                l_run[1] += psum[1];

                /* 5. O += P V over the tile's 64 keys (4 k-steps) for value columns
                 * 256 wg + 128 h .. + 127: column blocks 4 wg + 2 h and + 1. */
                if (wg == 0)
                    mw_pv<Ty, 0>(o, dp, dv + (st_off >> 4));
                else
                    mw_pv<Ty, 1>(o, dp, dv + (st_off >> 4));
                wi.land(a, kb + MW_BN, sK + (stage ^ 1) * MW_KB, stage ^ 1);
                kva__wgmma_wait<0>();
                mw_o_fence(o);
            }
        } else {
            /* s_ref (s_max[0]) holds the alternating loop's shared reference max. */
            if (wg == 0)
                mw_alt_loop<Ty, 0, W::SCHED>(wi, a, sQ, sK, s_ref, r0, t4, scale_log2, o, m_run,
                                             l_run, bars, ph);
            else
                mw_alt_loop<Ty, 1, W::SCHED>(wi, a, sQ, sK, s_ref, r0, t4, scale_log2, o, m_run,
                                             l_run, bars, ph);
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */
        wi.finish(a, s_sum, wg, r0, t4, l_run, m_run, o);
    }
#endif
}

#endif
