/*
 * mla_decode_common.cuh - the per-item steps the absorbed MLA decode kernels
 * (mla_decode_mma.cu on mma.sync, mla_decode_wgmma.cu on sm_90a wgmma) share:
 * the latent-row geometry, the two shared-memory layouts of a [rows, 576]
 * tile, the paged gather of key tiles by cp.async, the staging of Q, and the
 * end-of-item row sums and stores (decode_mma_common.cuh's epilogue), and
 * the FP8 E4M3 latent rows' loads and conversion.
 *
 * A latent row is D = 576 elements (c_kv 512 | k_pe 64) = 72 chunks of 16
 * bytes; the values are its first 512 columns (chunks 0 .. 63).
 *
 * FP8_E4M3 latent caches (one per-tensor k_scale s for the whole row): the
 * kernels convert the codes exactly into the 16-bit tile (e4m3 -> f16 is
 * exact, and so is f16 -> f32 -> bf16) and fold s out of the tile: the
 * logits are (q . code) * (scale * s) and the latent output (P . code) * s,
 * applied once per row in ml_finish. So the 16-bit body runs unchanged on
 * the codes, and no element is multiplied by s.
 */
#ifndef KVA_CUDA_MLA_DECODE_COMMON_CUH
#define KVA_CUDA_MLA_DECODE_COMMON_CUH

#include "cuda_check.h"
#include "decode_mma_common.cuh"
#include "mma_ptx.cuh"
#include "quant_cvt.cuh"

#include <stdint.h>

#define ML_D 576  /* latent row: Dc + Dr */
#define ML_DV 512 /* values: the first Dc columns */
#define ML_CH 72  /* 16-byte chunks per latent row */
#define ML_NT 256 /* threads per CTA of both kernels */

/*
 * Byte offset of chunk c of row r in a [ROWS, 576] tile.
 * ROWS = 0 (ldmatrix layout, mma.sync): rows of 1152 bytes, chunk c at
 *   c ^ (r & 7) (72 is a multiple of 8, so it stays in its group; rows are
 *   9 x 128 bytes apart, so the 8 rows of an ldmatrix hit 8 bank groups).
 * ROWS > 0 (wgmma layout): 9 column blocks of [ROWS][64 elements], 128-byte
 *   swizzle (chunk c of row r at chunk (c % 8) ^ (r % 8) of its 128-byte
 *   row), the K-major operand layout of wgmma_ptx.cuh; needs a 1024-byte
 *   aligned tile and ROWS a multiple of 8.
 */
template <int ROWS> static __device__ __forceinline__ uint32_t ml_off(int r, int c)
{
    if (ROWS == 0)
        return kva__swz<ML_D>(r, c);
    return (uint32_t)((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Item `it` of the uploaded plan and its request's geometry. */
struct ml_item {
    kva__cuda_item w;
    int32_t nrows, qs, q_len, s; /* rows nq * nh, first token, q_len, seq_len */
    const int32_t *bt_row;       /* the request's block-table row */
};
static __device__ __forceinline__ ml_item ml_item_load(const kva__cuda_attn_args &a, int32_t it,
                                                       int32_t bt_stride)
{
    ml_item m;
    m.w = a.meta.items[it];
    m.nrows = m.w.nq * m.w.nh;
    m.qs = a.meta.qsl[m.w.req];
    m.q_len = a.meta.qsl[m.w.req + 1] - m.qs;
    m.s = a.meta.seq_lens[m.w.req];
    m.bt_row = a.meta.block_table + (int64_t)m.w.req * bt_stride;
    return m;
}

/* The cache row (physical block * B + offset) that thread t of NT threads
 * copies in the tile of keys kb .. kb + BN - 1 (ml_issue_row), or -1 from
 * kend on (no block-table entry read). Separate from the copy so that a
 * kernel can load it a tile ahead. */
template <int BN, int NT = ML_NT>
static __device__ __forceinline__ int64_t ml_row(const kva__cuda_attn_args &a,
                                                 const int32_t *bt_row, int32_t kb, int32_t kend,
                                                 int t = threadIdx.x)
{
    const int32_t j = kb + t / (NT / BN);
    if (j >= kend)
        return -1;
    const int32_t blk = j / a.B;
    return (int64_t)__ldg(bt_row + blk) * a.B + (j - blk * a.B);
}

/* NT threads (thread t of them; the CTA's ML_NT by default) copy latent rows
 * [576] of `rows` (16-bit elements) into a tile at `stage` in layout ROWS:
 * thread t takes key t / TPK (row `row`, e.g. from ml_row; zeros where it
 * is -1) and chunks t % TPK + TPK * i. */
template <int BN, int ROWS, int NT = ML_NT>
static __device__ __forceinline__ void ml_issue_row_at(const void *rows, int64_t row,
                                                       uint32_t stage, int t = threadIdx.x)
{
    constexpr int TPK = NT / BN;     /* threads per key: 2, 4 or 8 */
    constexpr int CPT = ML_CH / TPK; /* chunks per thread: 36, 18 or 9 */
    static_assert(ML_CH % TPK == 0 && NT % BN == 0, "tile gather");
    const int key = t / TPK, c0 = t % TPK;
    /* Past kend the copies read nothing (size 0) at the cache's first row. */
    const bool ok = row >= 0;
    const char *src = (const char *)rows + (ok ? row * (int64_t)(ML_D * 2) + c0 * 16 : 0);
    if constexpr (ROWS > 0 && 8 % TPK == 0) {
        /* wgmma layout: chunk c0 + TPK i sits in column block i / U at
         * swizzled position (c0 + TPK (i % U)) ^ (key % 8), U = 8 / TPK, so
         * U base addresses plus constants give every copy's address. */
        constexpr int U = 8 / TPK > 0 ? 8 / TPK : 1;
        uint32_t base[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            base[u] = stage + (uint32_t)(key * 128 + (((c0 + TPK * u) ^ (key & 7)) << 4));
#pragma unroll
        for (int i = 0; i < CPT; i++)
            kva__cp_async16(base[i % U] + (uint32_t)((i / U) * ROWS * 128), src + TPK * 16 * i,
                            ok ? 16 : 0);
    } else {
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = c0 + TPK * i;
            kva__cp_async16(stage + ml_off<ROWS>(key, c), src + TPK * 16 * i, ok ? 16 : 0);
        }
    }
}

/* ml_issue_row_at over the cache of a (the latent rows of the tile at kb). */
template <int BN, int ROWS, int NT = ML_NT>
static __device__ __forceinline__ void ml_issue_row(const kva__cuda_attn_args &a, int64_t row,
                                                    uint32_t stage, int t = threadIdx.x)
{
    ml_issue_row_at<BN, ROWS, NT>(a.k, row, stage, t);
}

/* ml_row and ml_issue_row in one step (the block-table entry read just before
 * the copies). */
template <int BN, int ROWS, int NT = ML_NT>
static __device__ __forceinline__ void ml_issue(const kva__cuda_attn_args &a, const int32_t *bt_row,
                                                int32_t kb, int32_t kend, uint32_t stage,
                                                int t = threadIdx.x)
{
    ml_issue_row<BN, ROWS, NT>(a, ml_row<BN, NT>(a, bt_row, kb, kend, t), stage, t);
}

/* FP8 latent rows [576 bytes] of a tile into a raw stage [BN, 576] (row r
 * at r * 576, no swizzle) by cp.async: thread t (of NT) takes key t / TPK
 * (cache row `row`, e.g. from ml_row; zeros where it is -1) and 16-byte
 * chunks t % TPK + TPK i of its 36. */
template <int BN, int NT = ML_NT>
static __device__ __forceinline__ void ml_issue_fp8_row(const kva__cuda_attn_args &a, int64_t row,
                                                        uint32_t stage, int t = threadIdx.x)
{
    constexpr int TPK = NT / BN;
    const int key = t / TPK, c0 = t % TPK;
    const bool ok = row >= 0;
    const char *src = (const char *)a.k + (ok ? row * (int64_t)ML_D : 0);
#pragma unroll
    for (int i = 0; i < (ML_D / 16 + TPK - 1) / TPK; i++) {
        const int c = c0 + TPK * i;
        if (c < ML_D / 16)
            kva__cp_async16(stage + (uint32_t)(key * ML_D + c * 16), src + (ok ? c * 16 : 0),
                            ok ? 16 : 0);
    }
}

/* Rows row0 .. row0 + R - 1 of a landed raw stage [BN, 576] of FP8 codes
 * -> the same rows of the 16-bit tile [BN, 576] in layout ml_off<0> (exact
 * values; keys past the item's end are zero codes, hence zeros), by the 32
 * lanes of one warp: each 16-byte chunk of codes becomes two 16-byte chunks
 * of the tile (lane l takes chunks l, l + 32, ... of the R x 36; the 8 lanes
 * of a shared-memory phase hit distinct banks on both sides). The mma
 * kernel's warps convert the rows of their own S slice, so only the warps
 * that share a slice meet before S; the caller orders the rest. */
template <int R, typename Ty>
static __device__ __forceinline__ void ml_fp8_rows(const unsigned char *raw, unsigned char *tile,
                                                   int row0, int lane)
{
    constexpr int N = R * (ML_D / 16);
#pragma unroll 3
    for (int x = lane; x < N; x += 32) {
        const int r = row0 + x / (ML_D / 16), c = x % (ML_D / 16);
        const uint4 codes = *reinterpret_cast<const uint4 *>(raw + r * ML_D + c * 16);
        *reinterpret_cast<uint4 *>(tile + ml_off<0>(r, 2 * c)) =
            kva__fp8x8_as<Ty>(make_uint2(codes.x, codes.y));
        *reinterpret_cast<uint4 *>(tile + ml_off<0>(r, 2 * c + 1)) =
            kva__fp8x8_as<Ty>(make_uint2(codes.z, codes.w));
    }
}

/* Q rows of item w ([M, 576], zeros past nrows) into shared memory at sq in
 * layout ROWS, by the CTA's ML_NT threads. Row r is token i0 + r / nh, head
 * h0 + r % nh of the request starting at token qs (Hkv = 1, so the heads
 * are the query heads). ASYNC = false: plain 16-byte loads and stores, done
 * on return (each thread's load -> store pairs run one after another).
 * ASYNC = true: 16-byte cp.async copies (rows past nrows zero-filled, reading
 * nothing), not committed: all of a thread's copies are in flight at once,
 * and the caller commits them and waits for the group before the wgmma
 * operand reads. */
template <int M, int ROWS, typename elem, bool ASYNC = false>
static __device__ __forceinline__ void ml_stage_q(const kva__cuda_attn_args &a,
                                                  const kva__cuda_item &w, int32_t nrows,
                                                  int32_t qs, unsigned char *sq)
{
    for (int x = threadIdx.x; x < M * ML_CH; x += ML_NT) {
        const int r = x / ML_CH, c = x - r * ML_CH;
        if constexpr (ASYNC) {
            /* Past nrows: row 0's address (valid), nothing read. */
            const bool ok = r < nrows;
            const int32_t qi = ok ? r / w.nh : 0, hh = ok ? r - qi * w.nh : 0;
            const elem *qrow =
                (const elem *)a.q + ((int64_t)(qs + w.i0 + qi) * a.H + w.h0 + hh) * ML_D;
            kva__cp_async16(kva__smem_u32(sq + ml_off<ROWS>(r, c)),
                            reinterpret_cast<const uint4 *>(qrow) + c, ok ? 16 : 0);
        } else {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < nrows) {
                const int32_t qi = r / w.nh, hh = r - qi * w.nh;
                const elem *qrow =
                    (const elem *)a.q + ((int64_t)(qs + w.i0 + qi) * a.H + w.h0 + hh) * ML_D;
                v = __ldg(reinterpret_cast<const uint4 *>(qrow) + c);
            }
            *reinterpret_cast<uint4 *>(sq + ml_off<ROWS>(r, c)) = v;
        }
    }
}

/* The barrier of the threads that compute an item: the whole CTA
 * (__syncthreads), or with CONS the ML_NT compute threads only (barrier 0
 * counting ML_NT threads), for kernels whose CTA has producer warps past
 * them that never take part (mla_decode_mma.cuh's ml_tiles::NPW). */
template <bool CONS> static __device__ __forceinline__ void ml_sync()
{
    if constexpr (CONS)
        asm volatile("bar.sync 0, %0;\n" ::"n"(ML_NT) : "memory");
    else
        __syncthreads();
}

/* The softmax sums of rows r0 and r0 + 8 (each thread's quad summed) into
 * s_sum[slice], then a barrier (ml_sync<CONS>); ml_row_sum adds row r over
 * the NS slices. */
template <bool CONS = false>
static __device__ __forceinline__ void ml_publish_sums(float (*s_sum)[64], int slice, int r0,
                                                       int t4, float l_run[2])
{
    kva__dmma_row_sums(l_run);
    if (t4 == 0) {
        s_sum[slice][r0] = l_run[0];
        s_sum[slice][r0 + 8] = l_run[1];
    }
    ml_sync<CONS>();
}
template <int NS>
static __device__ __forceinline__ float ml_row_sum(const float (*s_sum)[64], int r)
{
    float L = 0.f;
#pragma unroll
    for (int k = 0; k < NS; k++)
        L += s_sum[k][r];
    return L;
}

/* Where ml_finish puts row r of an item: a split partial's row [512] at
 * base + row and its lse at base[lse]; or the token and query head of its
 * out row [512] and lse (row tok * H + head; the head also picks the sink). */
struct ml_part {
    float *base;
    int64_t row, lse;
};
struct ml_out {
    int64_t tok;
    int32_t head;
};

/* The destination policy of the dense decode's items (item w of the uploaded
 * plan, request starting at token qs): split partials in the item's block of
 * its task's workspace ([nrows, 512] then [nrows] lse in natural-log units;
 * the block may start at any float offset, so rows are stored per float), or
 * out [T, H, 512] and lse [T, H] of query head kv_head G + h0 + r % nh, token
 * qs + i0 + r / nh. vsc multiplies the values (an FP8 cache's k_scale; 1 for
 * 16-bit caches). */
struct ml_dst {
    static constexpr bool PAIRS = false;             /* partial rows 8-byte aligned */
    static constexpr float LSE_UNIT = KVA__DMMA_LN2; /* partial lse = (mu + log2 L) LSE_UNIT */
    const kva__cuda_attn_args &a;
    const kva__cuda_item &w;
    int32_t nrows, qs;
    float vsc;
    __device__ __forceinline__ bool partials() const
    {
        return w.task >= 0;
    }
    __device__ __forceinline__ ml_part part(int32_t r) const
    {
        const kva__cuda_task t = a.meta.tasks[w.task];
        float *blk = a.ws + t.ws_off + (int64_t)w.split * nrows * (ML_DV + 1);
        return {blk, (int64_t)r * ML_DV, (int64_t)nrows * ML_DV + r};
    }
    __device__ __forceinline__ ml_out out(int32_t r) const
    {
        const int32_t qi = r / w.nh, hh = r - qi * w.nh;
        const int32_t head = w.kv_head * a.G + w.h0 + hh;
        return {qs + w.i0 + qi, head};
    }
};

/* End of an item (every MLA kernel, dense and sparse; destinations from the
 * policy Dst: ml_dst or sp_dst, mla_sparse_common.cuh): l_run of the thread's
 * rows r0 and r0 + 8 summed over its 4 lanes and over the NS key slices of
 * the CTA (through s_sum [NS][64], slice `slice`), then the thread's
 * accumulators written: o[n][e] is row r0 + 8 (e / 2), value column
 * col0 + 8 n + 2 t4 + e % 2 (NB n8 tiles), running max m_run in log2 units.
 * The values of kva__dmma_write (split partial relative to its own sum and
 * its lse, or out with the sink and lse), but the per-row factors are
 * computed once and out is stored in pairs: written per element, this code
 * was over 12,000 instructions per kernel, fetched cold once per item. A row
 * without weight (m_run -inf) gives out 0 and lse -inf (or the sink's); a NaN
 * sum gives NaN. Ends with every thread past s_sum. Its two barriers are
 * ml_sync<CONS>: CONS when the caller's CTA has producer warps that do not
 * take part (the compute threads 0 .. ML_NT - 1 meet alone). */
template <int NB, int NS, typename Ty, bool CONS = false, typename Dst>
static __device__ __forceinline__ void ml_finish(const Dst &d, float (*s_sum)[64], int slice,
                                                 int r0, int col0, int t4, float l_run[2],
                                                 const float m_run[2], const float (*o)[4])
{
    typedef typename Ty::elem elem;
    ml_publish_sums<CONS>(s_sum, slice, r0, t4, l_run);
    const bool lead = col0 == 0 && t4 == 0; /* the thread holding column 0 writes lse */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int32_t r = r0 + 8 * hf;
        if (r >= d.nrows)
            continue;
        const float L = ml_row_sum<NS>(s_sum, r);
        const float Mx = m_run[hf], mu = Mx == -INFINITY ? 0.f : Mx;
        const ml_out q = d.out(r);
        if (d.partials()) { /* split partial relative to its own L, then lse */
            const ml_part p = d.part(r);
            float *dst = p.base + p.row + col0 + 2 * t4;
            const float inv = L > 0.f ? d.vsc / L : 0.f;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                if constexpr (Dst::PAIRS) {
                    *reinterpret_cast<float2 *>(dst + n * 8) =
                        make_float2(o[n][2 * hf] * inv, o[n][2 * hf + 1] * inv);
                } else {
                    dst[n * 8] = o[n][2 * hf] * inv;
                    dst[n * 8 + 1] = o[n][2 * hf + 1] * inv;
                }
            }
            if (lead)
                p.base[p.lse] =
                    L > 0.f ? (mu + log2f(L)) * Dst::LSE_UNIT : (L == 0.f ? -INFINITY : L);
            continue;
        }
        float Mt = Mx, sink2 = -INFINITY;
        if (d.a.sinks) {
            sink2 = d.a.sinks[q.head] * KVA__DMMA_LOG2E;
            Mt = fmaxf(Mx, sink2);
        }
        const float mt = Mt == -INFINITY ? 0.f : Mt;
        const float cf = exp2f(Mx - mt); /* 0 without weight, even beside a very low sink */
        const float Lt = L * cf + (d.a.sinks ? exp2f(sink2 - mt) : 0.f);
        /* out = O cf / Lt; a row without weight gives 0 (Lt = 0) or Lt (NaN). */
        const bool pos = Lt > 0.f;
        const float f = pos ? cf / Lt * d.vsc : 0.f, f0 = pos || Lt == 0.f ? 0.f : Lt;
        elem *dst = (elem *)d.a.out + (q.tok * d.a.H + q.head) * ML_DV + col0 + 2 * t4;
        if (((uintptr_t)d.a.out & 3) == 0) {
#pragma unroll
            for (int n = 0; n < NB; n++)
                *reinterpret_cast<uint32_t *>(dst + n * 8) =
                    Ty::pack(o[n][2 * hf] * f + f0, o[n][2 * hf + 1] * f + f0);
        } else {
#pragma unroll
            for (int n = 0; n < NB; n++) {
                Ty::store(dst + n * 8, o[n][2 * hf] * f + f0);
                Ty::store(dst + n * 8 + 1, o[n][2 * hf + 1] * f + f0);
            }
        }
        if (d.a.lse && lead)
            d.a.lse[q.tok * d.a.H + q.head] =
                pos ? (mt + log2f(Lt)) * KVA__DMMA_LN2 : (Lt == 0.f ? -INFINITY : Lt);
    }
    ml_sync<CONS>(); /* s_sum, Q and the ring are rewritten by the next item */
}

/* mma.sync steps of the kernels with [rows, 576] tiles in layout ml_off<0>
 * (mla_decode_mma.cu, mla_sparse.cu). S (+)= Q K^T of row tile row0 against
 * keys key0 .. key0 + 8 NBS - 1 over k-steps kk0 .. kk0 + STEPS - 1 (STEPS
 * even), in two chains: sa the even k-steps, sb the odd ones. */
template <typename Ty, int NBS, int STEPS>
static __device__ __forceinline__ void ml_qk(uint32_t sQ, uint32_t sk, int row0, int key0, int kk0,
                                             int lane, float (*sa)[4], float (*sb)[4])
{
    const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
    const int k_r = (lane & 7) + (lane >> 4) * 8, k_c = (lane >> 3) & 1;
#pragma unroll 4
    for (int kk = kk0; kk < kk0 + STEPS; kk += 2) {
        uint32_t qa[4], qb[4];
        kva__ldsm_x4(sQ + ml_off<0>(row0 + q_r, kk * 2 + q_c), qa);
        kva__ldsm_x4(sQ + ml_off<0>(row0 + q_r, kk * 2 + 2 + q_c), qb);
        if (NBS == 1) {
            /* Keys key0 .. + 7, chunks 2 kk .. 2 kk + 3: two k-steps. */
            uint32_t kf[4];
            kva__ldsm_x4(sk + ml_off<0>(key0 + (lane & 7), kk * 2 + (lane >> 3)), kf);
            Ty::mma(sa[0], qa, kf[0], kf[1]);
            Ty::mma(sb[0], qb, kf[2], kf[3]);
        } else {
#pragma unroll
            for (int np = 0; np < NBS / 2; np++) {
                uint32_t kf[4], kh[4];
                kva__ldsm_x4(sk + ml_off<0>(key0 + np * 16 + k_r, kk * 2 + k_c), kf);
                kva__ldsm_x4(sk + ml_off<0>(key0 + np * 16 + k_r, kk * 2 + 2 + k_c), kh);
                Ty::mma(sa[2 * np], qa, kf[0], kf[1]);
                Ty::mma(sa[2 * np + 1], qa, kf[2], kf[3]);
                Ty::mma(sb[2 * np], qb, kh[0], kh[1]);
                Ty::mma(sb[2 * np + 1], qb, kh[2], kh[3]);
            }
        }
    }
}

/* O += P V: P [16, BN] of row tile row0 (rows P_STRIDE bytes apart at sP, the
 * input dtype), V = value chunks cc0 .. cc0 + NBO - 1 of the BN rows of the
 * tile at sk (ldmatrix.trans); o: NBO n8 tiles. */
template <typename Ty, int BN, int NBO, int P_STRIDE>
static __device__ __forceinline__ void ml_pv(uint32_t sP, uint32_t sk, int row0, int cc0, int lane,
                                             float (*o)[4])
{
    const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
    const int v_r = (lane & 7) + ((lane >> 3) & 1) * 8, v_c = lane >> 4;
#pragma unroll
    for (int kp = 0; kp < BN / 16; kp++) {
        uint32_t pa[4];
        kva__ldsm_x4(sP + (uint32_t)((row0 + q_r) * P_STRIDE + (kp * 2 + q_c) * 16), pa);
#pragma unroll
        for (int dp = 0; dp < NBO / 2; dp++) {
            uint32_t vb[4];
            kva__ldsm_x4_trans(sk + ml_off<0>(kp * 16 + v_r, cc0 + dp * 2 + v_c), vb);
            Ty::mma(o[2 * dp], pa, vb[0], vb[1]);
            Ty::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
        }
    }
}

/* P = 2^(sc - mu) of rows r0, r0 + 8 and the warp's keys key0 + 8 nt + 2 t4
 * + e in the input dtype into NP copies of the shared P tile (rows P_STRIDE
 * bytes apart, copies P_BYTES apart; copy tp times ksc[nt][e][tp] when NP >
 * 1: the sparse kernel's per-key value scales); the unscaled row sums are
 * added to l_run. */
template <typename Ty, int NBS, int NP, int P_STRIDE, int P_BYTES>
static __device__ __forceinline__ void ml_store_p(const float (*sc)[4], const float mu[2],
                                                  uint32_t sP, int r0, int key0, int t4,
                                                  float l_run[2], const float (*ksc)[2][4])
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NBS; nt++) {
            const float p0 = kva__ex2(sc[nt][2 * hf] - mu[hf]);
            const float p1 = kva__ex2(sc[nt][2 * hf + 1] - mu[hf]);
            sum += p0 + p1;
            const uint32_t addr =
                sP + (uint32_t)((r0 + 8 * hf) * P_STRIDE + (key0 + nt * 8 + 2 * t4) * 2);
#pragma unroll
            for (int tp = 0; tp < NP; tp++) {
                const uint32_t pv =
                    NP > 1 ? Ty::pack(p0 * ksc[nt][0][tp], p1 * ksc[nt][1][tp]) : Ty::pack(p0, p1);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr + tp * P_BYTES), "r"(pv)
                             : "memory");
            }
        }
        l_run[hf] += sum;
    }
}

/* O rows r0 and r0 + 8 times alpha (NBO n8 tiles). */
template <int NBO>
static __device__ __forceinline__ void ml_rescale(float (*o)[4], const float alpha[2])
{
#pragma unroll
    for (int n = 0; n < NBO; n++) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

/* The running max of rows r0 and r0 + 8 over this tile: the thread's keys
 * (NB n8 tiles of sc), its 4 lanes, then the NS slices through s_max [NS][64]
 * (one barrier inside). Returns the rescale factors of the old state in alpha
 * and updates m_run; l_run is rescaled. */
template <int NB, int NS>
static __device__ __forceinline__ bool ml_tile_max(const float (*sc)[4], float (*s_max)[64],
                                                   int slice, int r0, int t4, float m_run[2],
                                                   float l_run[2], float alpha[2], float mu[2])
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float mx = kva__dmma_row_max<NB>(sc, hf);
        if (t4 == 0)
            s_max[slice][r0 + 8 * hf] = mx;
    }
    __syncthreads(); /* every slice's maxima */
    bool resc = false;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = m_run[hf];
#pragma unroll
        for (int k = 0; k < NS; k++)
            mx = fmaxf(mx, s_max[k][r0 + 8 * hf]);
        mu[hf] = mx == -INFINITY ? 0.f : mx;
        alpha[hf] = kva__ex2(m_run[hf] - mu[hf]); /* 0 while m_run = -inf */
        resc |= mx != m_run[hf];
        m_run[hf] = mx;
        l_run[hf] *= alpha[hf];
    }
    return __any_sync(0xffffffffu, resc);
}

/* ---- host side: both kernels take kva__cuda_attn_args and ML_NT threads ---- */

typedef void (*ml_kernel_fn)(kva__cuda_attn_args);

/* Resident CTAs per SM of fn with smem bytes of dynamic shared memory (its
 * limit raised first); 0 if it cannot run. */
static inline int ml_ctas_per_sm(ml_kernel_fn fn, int smem)
{
    int n = 0;
    if (!fn ||
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, ML_NT, (size_t)smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Launches fn with `grid` persistent CTAs on stream. The shared-memory limit
 * is per function and device: plan_build raised it through the occupancy
 * query; set again for a context on another device. */
static inline kva_status ml_launch(ml_kernel_fn fn, int smem, const kva__cuda_attn_args *a,
                                   int grid, void *stream)
{
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    fn<<<grid, ML_NT, (size_t)smem, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("mla_decode kernel");
    return KVA_STATUS_OK;
}

#endif
