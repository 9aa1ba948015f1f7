/*
 * decode_mma.cu - the tensor-core decode (decode_mma_kernel.cuh) over 16-bit
 * caches (bf16 or f16 K and V in the q dtype): its load policy and host side.
 *
 *   - Q [16, D] is staged in shared memory as it is, XOR-swizzled in 16-byte
 *     chunks, and read with ldmatrix.
 *   - Steps of 16 keys (K and V [16, D] per stage, the same swizzle); 1-3
 *     CTAs per SM by D (128-144 KB in flight per SM).
 *   - S = Q K^T [16, 16] per step (D / 16 k-steps x 2 mma); P (rounded to the
 *     input dtype, as FlashAttention) is the A operand of O += P V
 *     (ldmatrix.trans of V).
 */
#include "decode_mma_kernel.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

/* The load policy (decode_mma_kernel.cuh) of 16-bit K and V: Ty
 * kva__mma_bf16 or kva__mma_f16, head size D (= Dv). A stage holds K then V
 * [16, D] (TILE bytes each); Q [16, D] comes first. */
template <typename Ty, int D_> struct dm_load16 {
    typedef kva__cuda_attn_args Args;
    typedef Ty Out;
    static constexpr int D = D_, BNW = DM_BN, NT = BNW / 8;
    static constexpr int NST = D == 64 ? 4 : 3; /* ring stages per warp */
    static constexpr int TILE = DM_BN * D * 2;  /* bytes of K (or V) of one step */
    static constexpr int STAGE = 2 * TILE, SQ = DM_M * D * 2;
    static constexpr int SMEM = SQ + DM_NW * NST * STAGE;
    static constexpr int MINB = D == 64 ? 3 : D == 128 ? 2 : 1;
    /* The first copies go out before Q is staged, so an item's first K/V
     * bytes are in flight during the Q loads: one dependent trip less per
     * item, for the single-wave shapes whose time is mostly that chain
     * (docs/cuda-decode.md, "The fixed cost of a decode call"; measured with the
     * dependent launch in bench/results/h200_2026-11-27_dec24.txt, alone
     * within noise in h200_2026-11-27_dcp6.txt). */
    static constexpr bool RAGGED = true, ISSUE_FIRST = true;
    /* The body reads a step's block-table entries (key_row) one step before
     * it issues the step's copies (issue_row), so a warp never waits for
     * its block table between two steps (docs/cuda-decode.md, "The fixed cost of
     * a decode call"). */
    static constexpr bool ROWS_AHEAD = true;
    /* The CTA's next item's first copies go out before this item's epilogue
     * (the quantized policy does without: it gained nothing there;
     * bench/results/h200_2026-11-27_dec26.txt). */
    static constexpr bool OVERLAP = true;
    struct Item {
    };

    static __device__ __forceinline__ const kva__cuda_attn_args &attn(const Args &a)
    {
        return a;
    }

    /* The row of key kb + (lane & 15) (-1 at or past kend): the lane's
     * block-table read for the step at kb. */
    static __device__ __forceinline__ int64_t key_row(const Args &a, const int32_t *bt_row,
                                                      int64_t kvs, int32_t kvh, int32_t kb,
                                                      int32_t kend, int lane)
    {
        const int32_t jl = kb + (lane & 15);
        return jl < kend ? dm_key_row(a, bt_row, kvs, kvh, jl) : -1;
    }

    /* The warp copies K and V of the step's 16 keys (mine: the lane's
     * key_row) into the stage at st (zeros for rows -1): the others get lane
     * l's row by shuffle; chunk x = lane + 32 i is key x / (D/8), chunk
     * x % (D/8). */
    static __device__ __forceinline__ void issue_row(const Args &a, int64_t mine, int32_t,
                                                     int32_t, int32_t, uint32_t st, int lane)
    {
        constexpr int CH = D / 8;
        const char *kp = (const char *)a.k, *vp = (const char *)a.v;
        const uint64_t pol = kva__l2_evict_first(); /* K/V are read once per call */
#pragma unroll
        for (int i = 0; i < DM_BN * CH / 32; i++) {
            const int x = lane + 32 * i, key = x / CH, c = x % CH;
            const int64_t row = __shfl_sync(0xffffffffu, mine, key);
            const bool ok = row >= 0;
            const int64_t boff = ok ? row * (int64_t)(D * 2) + c * 16 : 0;
            kva__cp_async16_pol(st + kva__swz<D>(key, c), kp + boff, ok ? 16 : 0, pol);
            kva__cp_async16_pol(st + TILE + kva__swz<D>(key, c), vp + boff, ok ? 16 : 0, pol);
        }
    }

    /* The copies of the step at kb (keys past kend zero-filled). */
    static __device__ __forceinline__ void issue(const Args &a, const int32_t *bt_row, int64_t kvs,
                                                 int32_t kvh, int32_t kb, int32_t kend, uint32_t st,
                                                 int lane)
    {
        issue_row(a, key_row(a, bt_row, kvs, kvh, kb, kend, lane), kvh, kb, kend, st, lane);
    }

    /* Q rows into shared memory (zeros past nrows), then a barrier. */
    static __device__ __forceinline__ void stage_q(const Args &a, const kva__cuda_item &w,
                                                   int32_t nrows, int32_t qs, unsigned char *smem,
                                                   Item &, int)
    {
        typedef typename Ty::elem elem;
        constexpr int CH = D / 8;
        for (int x = threadIdx.x; x < DM_M * CH; x += DM_NW * 32) {
            const int r = x / CH, c = x % CH;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < nrows) {
                const int32_t qi = r / w.nh, hh = r - qi * w.nh;
                const int32_t head = w.kv_head * a.G + w.h0 + hh;
                const elem *qrow = (const elem *)a.q + ((int64_t)(qs + w.i0 + qi) * a.H + head) * D;
                v = __ldg(reinterpret_cast<const uint4 *>(qrow) + c);
            }
            *reinterpret_cast<uint4 *>(smem + kva__swz<D>(r, c)) = v;
        }
        __syncthreads(); /* ISSUE_FIRST: Q visible to every warp */
    }

    /* S = Q K^T [16, 16]: ldmatrix of Q and K (x4 sets: rows and chunks of
     * the lane's addresses). */
    static __device__ __forceinline__ void scores(float sc[NT][4], const Args &,
                                                  const unsigned char *smem, const unsigned char *,
                                                  uint32_t sk, const Item &, int lane)
    {
        const uint32_t sQ = kva__smem_u32(smem);
        const int q_r = (lane & 7) + ((lane >> 3) & 1) * 8, q_c = lane >> 4;
        const int k_r = (lane & 7) + (lane >> 4) * 8, k_c = (lane >> 3) & 1;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[4], kf[4];
            kva__ldsm_x4(sQ + kva__swz<D>(q_r, kk * 2 + q_c), qa);
            kva__ldsm_x4(sk + kva__swz<D>(k_r, kk * 2 + k_c), kf);
            Ty::mma(sc[0], qa, kf[0], kf[1]);
            Ty::mma(sc[1], qa, kf[2], kf[3]);
        }
    }

    static __device__ __forceinline__ void pv(float o[D / 8][4], const float sc[NT][4],
                                              const unsigned char *, uint32_t st, int lane)
    {
        kva__dmma_pv16<Ty, D>(o, sc, st + TILE, lane);
    }

    /* Row half hf of O: channels 8 n + 2 t4 (+1). */
    static __device__ __forceinline__ void store_acc(float *dst, const float o[D / 8][4], int hf,
                                                     int t4)
    {
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(dst + n * 8 + 2 * t4) =
                make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
    }

    static __device__ __forceinline__ float value(const Args &, const kva__cuda_item &, int32_t,
                                                  float, float O)
    {
        return O;
    }
};

/* ---- host side ---- */

/* cudaFuncSetAttribute(fn, MaxDynamicSharedMemorySize, smem) once per kernel
 * and device (the attribute stays set; every plan build sets it too, through
 * the occupancy query): the call costs host time on every run, and a
 * per-call decode time includes the run path's host time. */
static cudaError_t dm_smem_limit(void (*fn)(kva__cuda_attn_args), int smem, int dev)
{
    static std::atomic<uint32_t> done[64]; /* bit i: all[i] on that device */
    void (*const all[])(kva__cuda_attn_args) = {
        decode_mma_kernel<dm_load16<kva__mma_bf16, 64>>,
        decode_mma_kernel<dm_load16<kva__mma_bf16, 128>>,
        decode_mma_kernel<dm_load16<kva__mma_bf16, 256>>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 64>>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 128>>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 256>>,
        decode_mma_kernel<dm_load16<kva__mma_bf16, 64>, true>,
        decode_mma_kernel<dm_load16<kva__mma_bf16, 128>, true>,
        decode_mma_kernel<dm_load16<kva__mma_bf16, 256>, true>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 64>, true>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 128>, true>,
        decode_mma_kernel<dm_load16<kva__mma_f16, 256>, true>};
    constexpr int N = (int)(sizeof all / sizeof all[0]);
    int i = 0;
    cudaError_t e = cudaSuccess;
    while (i < N && all[i] != fn)
        i++;
    const bool known = dev >= 0 && dev < 64 && i < N;
    if (known && ((done[dev].load() >> i) & 1u))
        return cudaSuccess;
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && known)
        done[dev].fetch_or(1u << i);
    return e;
}

template <int D> using dm_load_bf16 = dm_load16<kva__mma_bf16, D>;
template <int D> using dm_load_f16 = dm_load16<kva__mma_f16, D>;

/* The kernel for dtype and D, with the balanced schedule of split items or
 * without (the plan's choice, kva__cuda_plan.balanced). */
static dm_launch<kva__cuda_attn_args> dm_pick(kva_dtype dt, int32_t D, int balanced)
{
    if (dt == KVA_DTYPE_BF16)
        return balanced ? dm_pick_d<dm_load_bf16, true>(D) : dm_pick_d<dm_load_bf16>(D);
    if (dt == KVA_DTYPE_F16)
        return balanced ? dm_pick_d<dm_load_f16, true>(D) : dm_pick_d<dm_load_f16>(D);
    return dm_launch<kva__cuda_attn_args>{NULL, 0};
}

extern "C" int kva__cuda_decode_mma_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype)
{
    return head_dim == head_dim_v && (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
           (dtype == KVA_DTYPE_BF16 || dtype == KVA_DTYPE_F16);
}

extern "C" int kva__cuda_decode_mma_ctas_per_sm(kva_dtype dtype, int32_t head_dim)
{
    const dm_launch<kva__cuda_attn_args> k = dm_pick(dtype, head_dim, 0);
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
                                                  int grid, int balanced, int eager, int device,
                                                  void *stream)
{
    const dm_launch<kva__cuda_attn_args> k = dm_pick(dtype, a->D, balanced);
    if (!k.fn || a->Dv != a->D)
        return kva__fail(
            KVA_STATUS_UNSUPPORTED,
            "kva_attention_run: the tensor-core decode does not cover D = %d, Dv = %d, "
            "dtype = %s (D in {64, 128, 256}, Dv == D, f16 or bf16)",
            (int)a->D, (int)a->Dv, kva_dtype_name(dtype));
    /* The limit is per function and device; plan_build raised it through the
     * occupancy query, set again here for a context on another device. The
     * caller knows the device and whether the stream captures, so the run
     * path asks the runtime for neither (its host time is part of every
     * per-call decode time). */
    KVA_CUDA_TRY(dm_smem_limit(k.fn, k.smem, device));
    cudaError_t e = cudaSuccess;
    const int pdl = eager && dm_cc_major(device, &e) >= 9;
    KVA_CUDA_TRY(e);
    KVA_CUDA_TRY(dm_launch_go(k.fn, grid, k.smem, (cudaStream_t)stream, *a, pdl));
    KVA_CUDA_LAUNCHED("decode_mma_kernel");
    return KVA_STATUS_OK;
}
