/*
 * decode_mma.cu - the tensor-core decode ("decode_mma_sm80"): decodes and
 * speculative decodes on tensor cores (mma.sync m16n8k16, fp32 accumulation),
 * for the work items of the shared partition (src/plan/partition.h) like the
 * CUDA-core kernel (attn_simt.cu).
 *
 * One CTA (4 warps) runs one item at a time (persistent grid: CTA b runs items
 * b, b + gridDim.x, ... of the count in the device header). An item holds up
 * to 16 attention rows (nq query tokens x nh heads of one kv head), packed
 * into the M dimension of one m16 tile: a decode of a GQA-4 model fills 4 of
 * the 16 rows, a speculative decode of 4 tokens all 16, so the K/V rows of
 * the item are read once for every row (the CUDA-core kernel keeps 4 or 8
 * rows per item and read K/V once per item).
 *
 *   - Q [16, D] (rows past the item's zero) is staged in shared memory once
 *     per item, XOR-swizzled in 16-byte chunks, and read with ldmatrix.
 *   - The item's keys are cut into tiles of 16; warp w takes tiles w, w + 4,
 *     ... and keeps its own online-softmax state (m, l and O [16, D] in mma
 *     accumulators). Each warp copies its tiles (K and V [16, D], gathered
 *     through the block table: NHD or HND, any block size, ragged as NHD with
 *     B = 1) with cp.async into a private ring of NST stages in shared memory
 *     (NST - 1 tiles in flight per warp; 1-3 CTAs per SM by D: 128-144 KB in
 *     flight per SM), so warps never wait for each other inside the key loop.
 *   - S = Q K^T [16, 16] per tile (D / 16 k-steps x 2 mma); scores in log2
 *     units (scale * log2 e), soft-cap and ALiBi on CTA-uniform branches, the
 *     mask per element only on tiles not fully visible to every row (causal
 *     inside the speculative tokens, window, chunk edges).
 *   - P (rounded to the input dtype, as FlashAttention) stays in registers as
 *     the A operand of O += P V (ldmatrix.trans of V).
 *   - At the end the warps merge through shared memory (the ring's space) and
 *     the CTA writes out/lse, or the split partial that split_merge_kernel
 *     (split_merge.cu) combines; the sink enters there or here, once.
 * Keys at or past the item's end are zero-filled (cp.async with source size
 * 0) and their block-table entries never read, so NaN in unused cache slots
 * cannot reach P V.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "decode_mma_common.cuh"
#include "mma_ptx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#define DM_NW 4  /* warps per CTA */
#define DM_BN 16 /* keys per tile */
#define DM_M KVA__CUDA_MMA_DECODE_ROWS

/* Ring stages per warp for head size D (NST - 1 tiles in flight). */
template <int D> struct dm_cfg {
    static constexpr int NST = D == 64 ? 4 : 3;
    static constexpr int TILE = DM_BN * D * 2; /* bytes of K (or V) of one tile */
    static constexpr int SMEM = DM_M * D * 2 + DM_NW * NST * 2 * TILE;
    static constexpr int MINB = D == 64 ? 3 : D == 128 ? 2 : 1;
};

/* Row index (in rows of D elements) of key j for the item's kv head: paged
 * NHD (block * B + off) * Hkv + kvh, HND (block * Hkv + kvh) * B + off;
 * ragged: (kv_start + j) * Hkv + kvh. */
static __device__ __forceinline__ int64_t dm_key_row(const kva__cuda_attn_args &a,
                                                     const int32_t *bt_row, int64_t kvs,
                                                     int32_t kvh, int32_t j)
{
    if (a.ragged)
        return (kvs + j) * a.Hkv + kvh;
    const int32_t blk = j / a.B, off = j - blk * a.B;
    const int64_t block = __ldg(bt_row + blk);
    return a.layout_hnd ? (block * a.Hkv + kvh) * a.B + off : (block * a.B + off) * a.Hkv + kvh;
}

/* The warp copies K and V of the 16 keys kb.. (zeros past kend) into one ring
 * stage: lane l computes the row of key l & 15, the others get it by shuffle;
 * chunk x = lane + 32 i is key x / (D/8), chunk x % (D/8). */
template <int D>
static __device__ __forceinline__ void dm_issue(const kva__cuda_attn_args &a, const int32_t *bt_row,
                                                int64_t kvs, int32_t kvh, int32_t kb, int32_t kend,
                                                uint32_t sk, uint32_t sv, int lane)
{
    constexpr int CH = D / 8;
    const int32_t jl = kb + (lane & 15);
    const int64_t mine = jl < kend ? dm_key_row(a, bt_row, kvs, kvh, jl) : -1;
    const char *kp = (const char *)a.k, *vp = (const char *)a.v;
#pragma unroll
    for (int i = 0; i < DM_BN * CH / 32; i++) {
        const int x = lane + 32 * i, key = x / CH, c = x % CH;
        const int64_t row = __shfl_sync(0xffffffffu, mine, key);
        const bool ok = row >= 0;
        const int64_t boff = ok ? row * (int64_t)(D * 2) + c * 16 : 0;
        kva__cp_async16(sk + kva__swz<D>(key, c), kp + boff, ok ? 16 : 0);
        kva__cp_async16(sv + kva__swz<D>(key, c), vp + boff, ok ? 16 : 0);
    }
}

/*
 * Ty: kva__mma_bf16 or kva__mma_f16; D: head size (= Dv). Dynamic shared memory: Q [16, D]
 * then the rings [NW][NST][K/V][16, D]; the warps' O [NW][16][D] fp32 reuse the
 * rings' space for the final merge.
 */
template <typename Ty, int D>
__global__ void __launch_bounds__(DM_NW * 32, dm_cfg<D>::MINB)
    decode_mma_kernel(const kva__cuda_attn_args a)
{
    typedef typename Ty::elem elem;
    constexpr int NST = dm_cfg<D>::NST, TILE = dm_cfg<D>::TILE;
    constexpr int CH = D / 8;
    constexpr int NO = D / 8; /* n8 tiles of O */
    extern __shared__ __align__(128) unsigned char dm_smem_buf[];
    __shared__ float s_m[DM_NW][DM_M], s_l[DM_NW][DM_M];
    const uint32_t sQ = kva__smem_u32(dm_smem_buf);
    float *s_acc = (float *)(dm_smem_buf + DM_M * D * 2); /* [NW][16][D] after the loop */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const uint32_t ring = sQ + DM_M * D * 2 + (uint32_t)warp * NST * 2 * TILE;
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t tree_on = a.meta.hdr[KVA_CUDA_HDR_TREE]; /* tree_mask.cuh */
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    /* Lane offsets of the ldmatrix addresses (rows and chunks of the x4 sets). */
    const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
    const int k_r = (lane & 7) + (lane >> 4) * 8, k_c = (lane >> 3) & 1;
    const int v_r = (lane & 7) + ((lane >> 3) & 1) * 8, v_c = lane >> 4;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        const kva__cuda_item w = a.meta.items[it];
        const int32_t nrows = w.nq * w.nh;
        const int32_t qs = a.meta.qsl[w.req];
        const int32_t q_len = a.meta.qsl[w.req + 1] - qs;
        const int32_t s = a.meta.seq_lens[w.req];
        const kva__cuda_tree tree = kva__cuda_tree_at(a.meta.tree, tree_on, qs, s, q_len);
        const int32_t *bt_row =
            a.ragged ? nullptr : a.meta.block_table + (int64_t)w.req * bt_stride;
        const int64_t kvs = a.ragged ? a.meta.kv_start[w.req] : 0;

        /* Q rows into shared memory (zeros past nrows). */
        for (int x = threadIdx.x; x < DM_M * CH; x += DM_NW * 32) {
            const int r = x / CH, c = x % CH;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < nrows) {
                const int32_t qi = r / w.nh, hh = r - qi * w.nh;
                const int32_t head = w.kv_head * a.G + w.h0 + hh;
                const elem *qrow = (const elem *)a.q + ((int64_t)(qs + w.i0 + qi) * a.H + head) * D;
                v = __ldg(reinterpret_cast<const uint4 *>(qrow) + c);
            }
            *reinterpret_cast<uint4 *>(dm_smem_buf + kva__swz<D>(r, c)) = v;
        }
        /* This thread's two rows g4 and g4 + 8: visible keys, position, slope. */
        int32_t lo[2], hi[2], pos[2], lo_all, hi_all;
        float slope[2];
        kva__dmma_rows(a, w, nrows, s, q_len, g4, lo, hi, pos, slope, lo_all, hi_all, &tree);
        __syncthreads(); /* Q visible to every warp */

        float o[NO][4];
#pragma unroll
        for (int n = 0; n < NO; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        const int32_t kend = w.k1;
        const int32_t kb0 = w.k0 + warp * DM_BN;
        constexpr int32_t STEP = DM_NW * DM_BN;
#pragma unroll
        for (int st = 0; st < NST - 1; st++) {
            const int32_t kb = kb0 + st * STEP;
            if (kb < kend)
                dm_issue<D>(a, bt_row, kvs, w.kv_head, kb, kend, ring + st * 2 * TILE,
                            ring + st * 2 * TILE + TILE, lane);
            kva__cp_async_commit();
        }
        int stage = 0;
        for (int32_t kb = kb0; kb < kend; kb += STEP) {
            /* Refill the stage the previous tile used (every lane is past it). */
            __syncwarp();
            {
                const int ahead = stage == 0 ? NST - 1 : stage - 1;
                const int32_t kn = kb + (NST - 1) * STEP;
                if (kn < kend)
                    dm_issue<D>(a, bt_row, kvs, w.kv_head, kn, kend, ring + ahead * 2 * TILE,
                                ring + ahead * 2 * TILE + TILE, lane);
                kva__cp_async_commit();
            }
            kva__cp_async_wait<NST - 1>();
            __syncwarp(); /* the other lanes' copies of this tile have landed */
            const uint32_t sk = ring + stage * 2 * TILE, sv = sk + TILE;

            /* S = Q K^T [16, 16]: s[nt] is keys nt*8 .. +8. */
            float sc[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[4], kf[4];
                kva__ldsm_x4(sQ + kva__swz<D>(q_r, kk * 2 + q_c), qa);
                kva__ldsm_x4(sk + kva__swz<D>(k_r, kk * 2 + k_c), kf);
                Ty::mma(sc[0], qa, kf[0], kf[1]);
                Ty::mma(sc[1], qa, kf[2], kf[3]);
            }
            /* Logits in log2 units; the mask only where some row may not see
             * some key of the tile. Element e: row g4 + (e >> 1) * 8, key
             * kb + nt * 8 + 2 * t4 + (e & 1). */
            kva__dmma_logits<DM_BN>(sc, a, scale_log2, kb, t4, lo_all, hi_all, lo, hi, pos, slope,
                                    &tree);
            kva__dmma_softmax<NO>(sc, m_run, l_run, o);
            /* O += P V: P [16, 16] as the A operand, V [16, D] by ldmatrix.trans. */
            uint32_t pa[4];
            kva__dmma_pack_p<Ty>(sc, pa);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vb[4];
                kva__ldsm_x4_trans(sv + kva__swz<D>(v_r, dp * 2 + v_c), vb);
                Ty::mma(o[2 * dp], pa, vb[0], vb[1]);
                Ty::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
            }
            stage = stage == NST - 1 ? 0 : stage + 1;
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */

        /* Row sums over the 4 lanes of a row; the warps' states to shared memory. */
        kva__dmma_row_sums(l_run);
        __syncthreads(); /* every warp is done with its ring */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = g4 + hf * 8;
            float *dst = s_acc + ((size_t)warp * DM_M + r) * D;
#pragma unroll
            for (int n = 0; n < NO; n++)
                *reinterpret_cast<float2 *>(dst + n * 8 + 2 * t4) =
                    make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
            if (t4 == 0) {
                s_m[warp][r] = m_run[hf];
                s_l[warp][r] = l_run[hf];
            }
        }
        __syncthreads();

        /* Combine the warps and write: element (r, d) per thread. */
        for (int32_t x = threadIdx.x; x < nrows * D; x += DM_NW * 32) {
            const int32_t r = x / D, d = x - r * D;
            float M, mu, L, O;
            kva__dmma_merge<DM_NW, DM_M, D>(s_m, s_l, s_acc, r, d, M, mu, L, O);
            kva__dmma_write<D, Ty>(a, w, nrows, qs, r, d, M, mu, L, O);
        }
        __syncthreads(); /* Q, s_acc and the rings are rewritten by the next item */
    }
}

/* ---- host side ---- */

typedef void (*dm_kernel_fn)(kva__cuda_attn_args);

typedef struct dm_launch {
    dm_kernel_fn fn;
    int smem;
} dm_launch;

template <typename Ty> static dm_launch dm_pick_d(int32_t D)
{
    dm_launch k = {NULL, 0};
    if (D == 64)
        k = {decode_mma_kernel<Ty, 64>, dm_cfg<64>::SMEM};
    else if (D == 128)
        k = {decode_mma_kernel<Ty, 128>, dm_cfg<128>::SMEM};
    else if (D == 256)
        k = {decode_mma_kernel<Ty, 256>, dm_cfg<256>::SMEM};
    return k;
}

static dm_launch dm_pick(kva_dtype dt, int32_t D)
{
    if (dt == KVA_DTYPE_BF16)
        return dm_pick_d<kva__mma_bf16>(D);
    if (dt == KVA_DTYPE_F16)
        return dm_pick_d<kva__mma_f16>(D);
    dm_launch none = {NULL, 0};
    return none;
}

extern "C" int kva__cuda_decode_mma_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype)
{
    return head_dim == head_dim_v && (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
           (dtype == KVA_DTYPE_BF16 || dtype == KVA_DTYPE_F16);
}

extern "C" int kva__cuda_decode_mma_ctas_per_sm(kva_dtype dtype, int32_t head_dim)
{
    const dm_launch k = dm_pick(dtype, head_dim);
    if (!k.fn)
        return 0;
    int n = 0;
    if (cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k.fn, DM_NW * 32, (size_t)k.smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" kva_status kva__cuda_decode_mma_launch(const kva__cuda_attn_args *a, kva_dtype dtype,
                                                  int grid, void *stream)
{
    const dm_launch k = dm_pick(dtype, a->D);
    if (!k.fn || a->Dv != a->D)
        return kva__fail(
            KVA_STATUS_UNSUPPORTED,
            "kva_attention_run: the tensor-core decode does not cover D = %d, Dv = %d, "
            "dtype = %s (D in {64, 128, 256}, Dv == D, f16 or bf16)",
            (int)a->D, (int)a->Dv, kva_dtype_name(dtype));
    /* The limit is per function and device; plan_build raised it through the
     * occupancy query, set again here for a context on another device. */
    KVA_CUDA_TRY(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
    k.fn<<<grid, DM_NW * 32, (size_t)k.smem, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("decode_mma_kernel");
    return KVA_STATUS_OK;
}
