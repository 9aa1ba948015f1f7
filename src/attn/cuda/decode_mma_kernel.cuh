/*
 * decode_mma_kernel.cuh - the one body of the tensor-core decode
 * ("decode_mma_sm80"): decodes and speculative decodes on tensor cores
 * (mma.sync m16n8k16, fp32 accumulation), for the work items of the shared
 * partition (src/plan/partition.h) like the CUDA-core kernel (attn_simt.cu).
 * What the cache format changes enters as a load policy P (below):
 * decode_mma.cu holds the 16-bit policy (f16/bf16 K and V) and its host
 * side, decode_mma_quant.cuh the quantized one (int8/fp8 codes and their
 * scales), instantiated per format family in decode_mma_quant_{i8,fp8,v16}.cu
 * so the build compiles them in parallel.
 *
 * One CTA (4 warps) runs one item at a time (persistent grid: CTA b runs items
 * b, b + gridDim.x, ... of the device header's count). An item's up to 16
 * attention rows (nq query tokens x nh heads of one kv head) fill the M rows
 * of one m16 tile, so its K/V rows are read once for all of them. Warp w takes
 * key steps w, w + 4, ... of P::BNW keys (the balanced schedule: units of the
 * task's keys as they come, dm_steps), each warp with its own online softmax
 * and its own cp.async ring of P::NST stages; the warps merge at the end and
 * the CTA that writes a split task's last partial merges the task. Keys past
 * the item's end are zero-filled and their block-table entries never read.
 * The design (rings, masks, merge, programmatic dependent launch) is
 * docs/cuda-decode.md, "The decode kernels".
 *
 * A load policy P (a struct of static members) gives:
 *   Args                the kernel's argument struct; attn(q) its attention
 *                       arguments (kva__cuda_attn_args)
 *   Out                 the epilogue's store (kva__dmma_write's St)
 *   D, BNW, NT = BNW/8, NST, STAGE (bytes of one ring stage), SQ (bytes of
 *   staged Q before the rings), SMEM (dynamic shared bytes), MINB (CTAs per
 *   SM of __launch_bounds__), RAGGED (ragged caches served), ISSUE_FIRST
 *   (the ring's first steps issued before Q is staged)
 *   Item                what a thread keeps of the item's staged Q
 *   issue(q, bt_row, kvs, kvh, kb, kend, stage, lane): the warp's copies of
 *                       the step at kb into the stage at shared address stage
 *   OVERLAP (optional, default false): the next item's first copies go out
 *                       before the current item's epilogue (OVL in the body)
 *   ROWS_AHEAD (optional, default false), key_row(q, bt_row, kvs, kvh, kb,
 *                       kend, lane) and issue_row(q, row, kvh, kb, kend,
 *                       stage, lane): issue split into the lane's block-table
 *                       read (row: key_row's value) and the copies (the body
 *                       reads a step's rows one step ahead on the balanced
 *                       schedule; ROWS_AHEAD_PLAIN (optional, default false):
 *                       on the plain one too)
 *   stage_q(q, w, nrows, qs, smem, it, g4): Q of item w into smem (with
 *                       ISSUE_FIRST: then a barrier and it filled; else the
 *                       body's barrier follows)
 *   scores(sc, q, smem, stage_p, stage, it, lane): S of the step
 *   pv(o, sc, stage_p, stage, lane): O += P V of the step
 *   store_acc(dst, o, hf, t4): the thread's O row half hf into dst [D] fp32
 *   value(q, w, d, L, O): O of channel d in value units
 *   NX, PRESCALED (optional): extra accumulator tiles beside O, scores
 *                       already in log2 units (dm_nx, dm_prescaled below)
 * Items of at most 8 rows leave rows 8-15 of the m16 tile out of the
 * softmax (their P is 0).
 */
#ifndef KVA_CUDA_DECODE_MMA_KERNEL_CUH
#define KVA_CUDA_DECODE_MMA_KERNEL_CUH

extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "decode_mma_common.cuh"
#include "lse_merge.cuh"
#include "mma_ptx.cuh"

#include <atomic>
#include <math.h>
#include <stdint.h>

#define DM_NW 4  /* warps per CTA */
#define DM_BN 16 /* keys per tile */
#define DM_M KVA__CUDA_MMA_DECODE_ROWS
#define DM_CW 4 /* channels per thread in the epilogue's merge of the warps */

/* O += P V of a 16-key step with 16-bit V (Ty kva__mma_bf16 or kva__mma_f16):
 * P [16, 16] (sc, rounded to V's dtype) as the A operand, V [16, D] at shared
 * address sv (kva__swz chunks) by ldmatrix.trans. */
template <typename Ty, int D>
static __device__ __forceinline__ void kva__dmma_pv16(float o[D / 8][4], const float sc[2][4],
                                                      uint32_t sv, int lane)
{
    const int v_r = (lane & 7) + ((lane >> 3) & 1) * 8, v_c = lane >> 4;
    uint32_t pa[4];
    kva__dmma_pack_p<Ty>(sc, pa);
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
        uint32_t vb[4];
        kva__ldsm_x4_trans(sv + kva__swz<D>(v_r, dp * 2 + v_c), vb);
        Ty::mma(o[2 * dp], pa, vb[0], vb[1]);
        Ty::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
    }
}

/* Whether load policy P splits its copies of a step into the lanes' key
 * rows (P::key_row, one block-table read per lane) and the copies of those
 * rows (P::issue_row): then the body reads the block-table entries of a step
 * one step before it issues its copies (P::ROWS_AHEAD). */
template <typename P, typename = void> struct dm_rows_ahead {
    static constexpr bool value = false;
};
template <typename P> struct dm_rows_ahead<P, decltype((void)P::ROWS_AHEAD)> {
    static constexpr bool value = P::ROWS_AHEAD;
};
template <typename P, typename = void> struct dm_rows_ahead_plain {
    static constexpr bool value = false;
};
template <typename P> struct dm_rows_ahead_plain<P, decltype((void)P::ROWS_AHEAD_PLAIN)> {
    static constexpr bool value = P::ROWS_AHEAD_PLAIN;
};

/* Optional policy traits (default in brackets): P::NX [0] accumulator n8
 * tiles kept after O's D / 8 (rescaled with O by the online softmax, passed
 * to P::pv and P::store_acc: the quantized policy's sum of its f16 P times
 * the code bias); P::PRESCALED [false]: P::scores returns logits already
 * times scale * log2 e when there is no soft-cap (the policy folds the
 * softmax scale into its per-row factors). */
template <typename P, typename = void> struct dm_nx {
    static constexpr int value = 0;
};
template <typename P> struct dm_nx<P, decltype((void)P::NX)> {
    static constexpr int value = P::NX;
};
template <typename P, typename = void> struct dm_prescaled {
    static constexpr bool value = false;
};
template <typename P> struct dm_prescaled<P, decltype((void)P::PRESCALED)> {
    static constexpr bool value = P::PRESCALED;
};

/* Whether load policy P asks for the next item's first copies during the
 * current item's epilogue (P::OVERLAP; OVL in the body). */
template <typename P, typename = void> struct dm_overlap {
    static constexpr bool value = false;
};
template <typename P> struct dm_overlap<P, decltype((void)P::OVERLAP)> {
    static constexpr bool value = P::OVERLAP;
};

#define DM_UNIT 64        /* keys of a unit of the balanced schedule (split_align) */
#define DM_END 0x7fffffff /* no more steps */

/*
 * The key steps of one warp in one item, in order, then DM_END. A plain item
 * (and a split item the balanced schedule does not cover): the warp's steps
 * kb, kb + step, ... below uend (every DM_NW-th step of the item). A split
 * item on the balanced schedule: the task's keys [tk0, tk1), cut into
 * chunks of `chunk` keys (one per split item), are read in units of DM_UNIT
 * keys, each by one warp, BNW keys a step. Unit w of its item's chunk is
 * warp w's first (no wait); the others (units DM_NW.. of every chunk, dpc
 * per chunk) go to whichever warp of the task's items asks first, through
 * the task's grab count: a warp asks for its next unit when it starts one
 * (lane 0's atomic, whose result it reads at its next unit), so no warp
 * waits for the count, and every CTA of a single-wave grid stops within a
 * unit of the others whatever bandwidth its SM gets. A split item's partial
 * is the softmax state over the keys its warps took, whichever they were.
 */
template <int BNW> struct dm_steps {
    int32_t kb, uend, step;
    bool dyn, out;
    int32_t tk0, tk1, chunk, dpc;
    int *grab;
    int graw; /* lane 0: the unit taken for the warp's next refill */

    __device__ __forceinline__ int32_t next(int lane)
    {
        if (!dyn) {
            if (kb >= uend)
                return DM_END;
            const int32_t k = kb;
            kb += step;
            return k;
        }
        while (!out && kb >= uend)
            refill(lane);
        if (out)
            return DM_END;
        const int32_t k = kb;
        kb += BNW;
        return k;
    }

    /* The warp's next unit: the one its last ask got (d-th of the shared
     * units), asking for the one after if it lies inside the task. */
    __device__ __forceinline__ void refill(int lane)
    {
        const int32_t d = __shfl_sync(0xffffffffu, graw, 0);
        const int32_t c = dpc > 0 ? d / dpc : 0, j = DM_NW + (dpc > 0 ? d - c * dpc : 0);
        const int32_t key = tk0 + c * chunk + j * DM_UNIT;
        if (dpc <= 0 || key >= tk1) {
            out = true;
            return;
        }
        if (lane == 0)
            graw = atomicAdd(grab, 1);
        kb = key;
        uend = key + DM_UNIT < tk1 ? key + DM_UNIT : tk1;
    }
};

/* atomicAdd(p, 1) at device scope with acquire and release semantics (the
 * old value): one thread publishes the stores its CTA made before a barrier
 * (cumulativity) and sees every write that the earlier counts published. */
static __device__ __forceinline__ int dm_count_acq_rel(int *p)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(p) : "memory");
    return old;
}

/* The last-CTA merge of a split task (kva__merge_split_cta) from a copy in
 * shared memory: the CTA copies the task's nsplit partial blocks (contiguous
 * in the workspace: nsplit x nrows x (D + 1) floats from base) into smem
 * (bytes of free shared memory) with cp.async, every copy in flight at once,
 * and merges from there: one round trip to L2 instead of one per CH parts.
 * Returns false, having done nothing, where they do not fit or base is not
 * 16-byte aligned (the caller then merges from L2). */
template <typename T>
static __device__ __forceinline__ bool
dm_merge_smem(const float *base, int32_t nsplit, const kva__cuda_item &w, int32_t qs,
              const float *sinks, T *out, float *lse, int32_t H, int32_t G, int32_t D,
              unsigned char *smem, int32_t bytes)
{
    const int64_t n = (int64_t)nsplit * w.nq * w.nh * (D + 1); /* floats */
    if (n * (int64_t)sizeof(float) > bytes || ((uintptr_t)base & 15) != 0)
        return false;
    const uint32_t s0 = kva__smem_u32(smem);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x)
        kva__cp_async16(s0 + 16 * (uint32_t)i, base + 4 * i, 16);
    for (int64_t i = n / 4 * 4 + threadIdx.x; i < n; i += blockDim.x)
        kva__cp_async4(s0 + 4 * (uint32_t)i, base + i, 4);
    kva__cp_async_commit();
    kva__cp_async_wait<0>();
    __syncthreads(); /* every thread's copies landed */
    kva__merge_split_cta<T, true>((const float *)smem, nsplit, w, qs, sinks, out, lse, H, G, D);
    return true;
}

/* The decode of load policy P (above). Dynamic shared memory: Q (P::SQ
 * bytes) then the rings [NW][NST] stages; the warps' O [NW][16][D] fp32
 * reuse the rings' space for the final merge. */
template <typename P, bool BAL = false>
__global__ void __launch_bounds__(DM_NW * 32, P::MINB) decode_mma_kernel(const typename P::Args q)
{
    constexpr int D = P::D, NST = P::NST, STAGE = P::STAGE, BNW = P::BNW, NT = P::NT;
    constexpr int NO = D / 8;              /* n8 tiles of O */
    constexpr int NX = dm_nx<P>::value;    /* the policy's extra accumulator tiles */
    constexpr bool PRE = dm_prescaled<P>::value;
    const kva__cuda_attn_args &a = P::attn(q);
    extern __shared__ __align__(128) unsigned char dm_smem_buf[];
    __shared__ float s_m[DM_NW][DM_M], s_l[DM_NW][DM_M];
    __shared__ int s_last; /* this CTA wrote the last partial of its item's split task */
    /* OVL (the policy's OVERLAP): the warps' O [16, D] fp32 for the final
     * merge go to the last stage of each warp's own ring, and the CTA's next item's
     * first NST - 1 steps are issued into the other stages before the
     * epilogue (the warps' merge, the writes, the count and a last-CTA
     * merge), so its first bytes land during it. Else (the balanced
     * schedule, or a stage smaller than O) O goes to [NW][16][D] over the
     * rings after a barrier, and an item's copies start with the item. */
    constexpr bool OVL =
        !BAL && dm_overlap<P>::value && P::ISSUE_FIRST && P::STAGE >= DM_M * D * (int)sizeof(float);
    constexpr int WS = OVL ? NST * STAGE / (int)sizeof(float) : DM_M * D; /* floats per warp */
    float *s_acc = (float *)(dm_smem_buf + P::SQ) + (OVL ? (NST - 1) * STAGE / sizeof(float) : 0);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const uint32_t ring = kva__smem_u32(dm_smem_buf) + P::SQ + (uint32_t)warp * NST * STAGE;
    const unsigned char *ring_p = dm_smem_buf + P::SQ + (size_t)warp * NST * STAGE;
    /* Launched as a programmatic dependent (dm_launch_go): nothing of the
     * previous kernel's output (q, the cache, a merge's inputs) is read
     * before it has completed and its writes are visible. */
    kva__pdl_wait();
    /* The CTA's first item record is read with the header, not after it: the
     * chain to the first K/V copies is then header || item, block table,
     * copies (one dependent global read less per call). A CTA past the
     * item count reads a record it never uses (clamped to the section). */
    const int32_t cap = a.meta.items_cap;
    kva__cuda_item wn = a.meta.items[(int32_t)blockIdx.x < cap ? (int32_t)blockIdx.x : cap - 1];
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t tree_on = a.meta.hdr[KVA_CUDA_HDR_TREE]; /* tree_mask.cuh */
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    const bool ragged = P::RAGGED && a.ragged;

    constexpr int32_t STEP = DM_NW * BNW;
    /* The warp's copies of the first NST - 1 steps of item x (not on the
     * balanced schedule), into ring stages 0 .. NST - 2. */
    auto first_steps = [&](const kva__cuda_item &x) {
        const int32_t *btr = ragged ? nullptr : a.meta.block_table + (int64_t)x.req * bt_stride;
        const int64_t kv0 = ragged ? a.meta.kv_start[x.req] : 0;
#pragma unroll
        for (int st = 0; st < NST - 1; st++) {
            const int32_t kb = x.k0 + warp * BNW + st * STEP;
            if (kb < x.k1)
                P::issue(q, btr, kv0, x.kv_head, kb, x.k1, ring + st * STAGE, lane);
            kva__cp_async_commit();
        }
    };
    bool pre = false; /* OVL: the item's first steps went out in the previous epilogue */

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        const bool more = it + (int32_t)gridDim.x < n_items; /* the CTA has a next item */
        if (!more)
            kva__pdl_launch_dependents(); /* this CTA's last item: the next kernel may launch */
        const kva__cuda_item w = wn;      /* items[it], read before this iteration */
        if (more)
            wn = a.meta.items[it + gridDim.x]; /* the next one, in flight during this one */
        const int32_t nrows = w.nq * w.nh;
        const int32_t qs = a.meta.qsl[w.req];
        const int32_t q_len = a.meta.qsl[w.req + 1] - qs;
        const int32_t s = a.meta.seq_lens[w.req];
        const kva__cuda_tree tree = kva__cuda_tree_at(a.meta.tree, tree_on, qs, s, q_len);
        const int32_t *bt_row = ragged ? nullptr : a.meta.block_table + (int64_t)w.req * bt_stride;
        const int64_t kvs = ragged ? a.meta.kv_start[w.req] : 0;
        constexpr bool AHEAD = BAL && dm_rows_ahead<P>::value;
        constexpr bool AHEADP = !BAL && dm_rows_ahead<P>::value && dm_rows_ahead_plain<P>::value;
        static_assert(DM_UNIT % BNW == 0, "a unit is whole steps");
        /* A split item's partial block and its task (split count, keys),
         * read now (the epilogue has no dependent read); the balanced
         * schedule (dm_steps) where the task's chunks are whole units. */
        float *pblk = nullptr;
        int32_t nsplit = 0;
        dm_steps<BNW> g;
        g.dyn = false;
        g.out = false;
        g.kb = w.k0 + warp * BNW;
        g.uend = w.k1;
        g.step = STEP;
        kva__cuda_item wk = w; /* the keys the item's rows may read */
        if (w.task >= 0) {
            const kva__cuda_task &t = a.meta.tasks[w.task];
            pblk = a.ws + t.ws_off + (int64_t)w.split * nrows * (D + 1);
            nsplit = t.num_splits;
            const int32_t tk0 = t.k0, tk1 = t.k1, chunk = t.chunk;
            if (BAL && chunk % DM_UNIT == 0 && chunk >= DM_NW * DM_UNIT &&
                tk0 + w.split * chunk == w.k0) {
                g.dyn = true;
                g.tk0 = tk0;
                g.tk1 = tk1;
                g.chunk = chunk;
                g.dpc = chunk / DM_UNIT - DM_NW;
                g.grab = const_cast<int *>(&t.grab);
                g.graw = lane == 0 ? atomicAdd(g.grab, 1) : 0;
                g.kb = w.k0 + warp * DM_UNIT;
                g.uend = g.kb + DM_UNIT < w.k1 ? g.kb + DM_UNIT : w.k1;
                wk.k0 = tk0;
                wk.k1 = tk1;
            }
        }
        const int32_t kend = wk.k1;
        const int32_t kb0 = w.k0 + warp * BNW;

        /* The first NST - 1 steps of the warp's ring (pend: the steps issued
         * and not yet computed, in order); with AHEAD (AHEADP on the plain
         * schedule) also the lane's key row (nxt) of the step after them
         * (knext), issued in the first iteration, so no step waits for its
         * block-table read. */
        int32_t pend[NST - 1], knext = DM_END;
        decltype(P::key_row(q, bt_row, kvs, 0, 0, 0, 0)) nxt = -1;
        auto prologue = [&]() {
#pragma unroll
            for (int st = 0; st < NST - 1; st++) {
                if constexpr (BAL) {
                    pend[st] = g.next(lane);
                    if (pend[st] != DM_END)
                        P::issue(q, bt_row, kvs, w.kv_head, pend[st], kend, ring + st * STAGE,
                                 lane);
                    kva__cp_async_commit();
                }
            }
            if constexpr (!BAL) {
                if (!pre)
                    first_steps(w);
            }
            if constexpr (AHEADP) {
                const int32_t k = kb0 + (NST - 1) * STEP;
                if (k < kend)
                    nxt = P::key_row(q, bt_row, kvs, w.kv_head, k, kend, lane);
            }
            if constexpr (AHEAD) {
                knext = g.next(lane);
                if (knext != DM_END)
                    nxt = P::key_row(q, bt_row, kvs, w.kv_head, knext, kend, lane);
            }
        };
        typename P::Item qit;
        /* This thread's two rows g4 and g4 + 8: visible keys, position, slope. */
        int32_t lo[2], hi[2], pos[2], lo_all, hi_all;
        float slope[2];
        if constexpr (P::ISSUE_FIRST) {
            /* The copies' latency hides behind the staging of Q (its barrier inside). */
            prologue();
            P::stage_q(q, w, nrows, qs, dm_smem_buf, qit, g4);
            kva__dmma_rows(a, wk, nrows, s, q_len, g4, lo, hi, pos, slope, lo_all, hi_all, &tree);
        } else {
            P::stage_q(q, w, nrows, qs, dm_smem_buf, qit, g4);
            kva__dmma_rows(a, wk, nrows, s, q_len, g4, lo, hi, pos, slope, lo_all, hi_all, &tree);
            __syncthreads(); /* Q visible to every warp */
            prologue();
        }

        float o[NO + NX][4];
#pragma unroll
        for (int n = 0; n < NO + NX; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        /* Rows 8-15 of the m16 tile hold attention rows only for items of
         * more than 8 rows: else the softmax leaves them out (P 0). */
        const bool rows8 = nrows > DM_M / 2;
        int stage = 0;
        /* One step at kb: wait for its copies, S, the softmax, P V. */
        auto step = [&](int32_t kb) {
            kva__cp_async_wait<NST - 1>();
            __syncwarp(); /* the other lanes' copies of this step have landed */

            /* S [16, BNW]: sc[nt] is keys nt*8 .. +8. Element e: row
             * g4 + (e >> 1) * 8, key kb + nt * 8 + 2 * t4 + (e & 1). */
            float sc[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] = 0.f;
            P::scores(sc, q, dm_smem_buf, ring_p + stage * STAGE, ring + stage * STAGE, qit, lane);
            /* Logits in log2 units; the mask only where some row may not see
             * some key of the step. */
            kva__dmma_logits<BNW, PRE>(sc, a, scale_log2, kb, t4, lo_all, hi_all, lo, hi, pos,
                                       slope, &tree);
            kva__dmma_softmax<NO + NX, NT>(sc, m_run, l_run, o, rows8);
            P::pv(o, sc, ring_p + stage * STAGE, ring + stage * STAGE, lane);
            stage = stage == NST - 1 ? 0 : stage + 1;
        };
        if constexpr (BAL) {
            while (pend[0] != DM_END) {
                const int32_t kb = pend[0];
                /* Refill the stage the previous step used (every lane is past it). */
                __syncwarp();
                {
                    const int ahead = stage == 0 ? NST - 1 : stage - 1;
                    int32_t kn;
                    if constexpr (AHEAD) {
                        /* nxt was read an iteration ago; read the next step's now. */
                        kn = knext;
                        if (kn != DM_END)
                            P::issue_row(q, nxt, w.kv_head, kn, kend, ring + ahead * STAGE,
                                         lane);
                        kva__cp_async_commit();
                        knext = g.next(lane);
                        if (knext != DM_END)
                            nxt = P::key_row(q, bt_row, kvs, w.kv_head, knext, kend, lane);
                    } else {
                        kn = g.next(lane);
                        if (kn != DM_END)
                            P::issue(q, bt_row, kvs, w.kv_head, kn, kend, ring + ahead * STAGE,
                                     lane);
                        kva__cp_async_commit();
                    }
#pragma unroll
                    for (int i = 0; i + 1 < NST - 1; i++)
                        pend[i] = pend[i + 1];
                    pend[NST - 2] = kn;
                }
                step(kb);
            }
        } else {
            for (int32_t kb = kb0; kb < kend; kb += STEP) {
                /* Refill the stage the previous step used (every lane is past it). */
                __syncwarp();
                {
                    const int ahead = stage == 0 ? NST - 1 : stage - 1;
                    const int32_t kn = kb + (NST - 1) * STEP;
                    if constexpr (AHEADP) {
                        /* nxt was read an iteration ago; read the next step's now. */
                        if (kn < kend)
                            P::issue_row(q, nxt, w.kv_head, kn, kend, ring + ahead * STAGE,
                                         lane);
                        kva__cp_async_commit();
                        if (kn + STEP < kend)
                            nxt = P::key_row(q, bt_row, kvs, w.kv_head, kn + STEP, kend, lane);
                    } else {
                        if (kn < kend)
                            P::issue(q, bt_row, kvs, w.kv_head, kn, kend, ring + ahead * STAGE,
                                     lane);
                        kva__cp_async_commit();
                    }
                }
                step(kb);
            }
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */

        /* Row sums over the 4 lanes of a row; the warps' states to shared memory. */
        kva__dmma_row_sums(l_run);
        if constexpr (OVL)
            __syncwarp(); /* the warp is done with its own ring (O goes to its last stage) */
        else
            __syncthreads(); /* every warp is done with its ring (O goes over all of them) */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = g4 + hf * 8;
            P::store_acc(s_acc + (size_t)warp * WS + r * D, o, hf, t4);
            if (t4 == 0) {
                s_m[warp][r] = m_run[hf];
                s_l[warp][r] = l_run[hf];
            }
        }
        if constexpr (OVL) {
            /* The next item's first copies, into stages 0 .. NST - 2 (no
             * thread reads them before the next item's key loop). */
            pre = more;
            if (more)
                first_steps(wn);
        }
        __syncthreads();

        /* Combine the warps and write: DM_CW consecutive channels of one row
         * per thread (4 rows x D 128: one pass of the CTA). */
        constexpr int CW = DM_CW, NC = D / DM_CW;
        for (int32_t x = threadIdx.x; x < nrows * NC; x += DM_NW * 32) {
            const int32_t r = x / NC, d = (x - r * NC) * CW;
            float M, mu, L, O[CW];
            kva__dmma_merge<DM_NW, DM_M, D, WS, CW>(s_m, s_l, s_acc, r, d, M, mu, L, O);
#pragma unroll
            for (int i = 0; i < CW; i++)
                O[i] = P::value(q, w, d + i, L, O[i]);
            kva__dmma_write<D, typename P::Out, CW>(a, w, nrows, qs, r, d, M, mu, L, O, pblk);
        }
        if (w.task >= 0) {
            /* Publish the partial, then count it; the CTA that counts the
             * task's last split merges the task. The count is one thread's
             * acquire-release atomic after the barrier (the CTA's partial
             * stores are ordered before it through the barrier, and the
             * merger's reads after it through the next one), so no thread
             * waits on a fence of its own. The merger sets the count back
             * to 0 for the next run (or graph replay) of the plan. */
            __syncthreads();
            int *done = const_cast<int *>(&a.meta.tasks[w.task].done);
            if (threadIdx.x == 0)
                s_last = dm_count_acq_rel(done) == nsplit - 1;
            __syncthreads();
            if (s_last) {
                /* From shared memory where the rings are free: every warp
                 * is past its key loop and the warps' O were read (the
                 * barrier after the count), and no next item's copies are
                 * in flight (OVL issues them before the epilogue). */
                const float *tb = pblk - (int64_t)w.split * nrows * (D + 1);
                typename P::Out::elem *o16 = (typename P::Out::elem *)a.out;
                if ((OVL && more) ||
                    !dm_merge_smem(tb, nsplit, w, qs, a.sinks, o16, a.lse, a.H, a.G, D,
                                   dm_smem_buf + P::SQ, DM_NW * NST * STAGE))
                    kva__merge_split_cta(tb, nsplit, w, qs, a.sinks, o16, a.lse, a.H, a.G, D);
                if (threadIdx.x == 0) {
                    atomicExch(done, 0);
                    atomicExch(const_cast<int *>(&a.meta.tasks[w.task].grab), 0);
                }
            }
        }
        __syncthreads(); /* Q, s_acc (and without OVL the rings) are rewritten by the next item */
    }
}

/* Launches fn (a decode_mma_kernel) on stream s with grid CTAs of DM_NW
 * warps and smem dynamic shared bytes. With pdl (the caller's choice: eager
 * runs on a device of compute capability 9.0 or later) it is a programmatic
 * dependent launch: the grid may be scheduled while the kernel before it in
 * the stream drains (that kernel's CTAs allow it when they start their last
 * item), so the launch latency and the CTAs' start overlap its tail; the
 * body waits (kva__pdl_wait) before it reads anything. */
template <typename Args>
static cudaError_t dm_launch_go(void (*fn)(Args), int grid, int smem, cudaStream_t s, const Args &a,
                                int pdl)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(DM_NW * 32);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, fn, a);
}

/* The compute capability major of device dev, asked once per device and
 * process (the run path's host time is part of every per-call decode time);
 * *err gets a runtime error of the query (then 0). */
static inline int dm_cc_major(int dev, cudaError_t *err)
{
    static std::atomic<int> major_of[64]; /* compute capability major + 1; 0: not asked */
    int major = 0;
    *err = cudaSuccess;
    if (dev >= 0 && dev < 64 && major_of[dev].load() > 0)
        return major_of[dev].load() - 1;
    *err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (*err != cudaSuccess)
        return 0;
    if (dev >= 0 && dev < 64)
        major_of[dev].store(major + 1);
    return major;
}

/* Whether launches on stream s may be programmatic dependents: the stream is
 * not capturing a graph (graphs keep plain edges) and the current device has
 * compute capability 9.0 or later; *err gets a runtime error of the queries,
 * *eager (if given) whether s is not capturing. */
static inline int dm_pdl_ok(cudaStream_t s, cudaError_t *err, int *eager = nullptr)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    int dev = 0, major = 0;
    cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e == cudaSuccess)
        e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        major = dm_cc_major(dev, &e);
    *err = e;
    if (eager)
        *eager = e == cudaSuccess && cs == cudaStreamCaptureStatusNone;
    return e == cudaSuccess && cs == cudaStreamCaptureStatusNone && major >= 9;
}

/* A kernel of the family and its dynamic shared memory (bytes). */
template <typename Args> struct dm_launch {
    void (*fn)(Args);
    int smem;
};

/* The kernel of policy family Pol (Pol<D>) for head size D (64, 128 or 256;
 * fn NULL otherwise), with the balanced schedule of split items (BAL) or
 * without. */
template <template <int> class Pol, bool BAL = false>
static dm_launch<typename Pol<64>::Args> dm_pick_d(int32_t D)
{
    dm_launch<typename Pol<64>::Args> k = {NULL, 0};
    if (D == 64)
        k = {decode_mma_kernel<Pol<64>, BAL>, Pol<64>::SMEM};
    else if (D == 128)
        k = {decode_mma_kernel<Pol<128>, BAL>, Pol<128>::SMEM};
    else if (D == 256)
        k = {decode_mma_kernel<Pol<256>, BAL>, Pol<256>::SMEM};
    return k;
}

#endif /* KVA_CUDA_DECODE_MMA_KERNEL_CUH */
