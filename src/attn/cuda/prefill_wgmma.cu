/*
 * prefill_wgmma.cu - the sm_90a (Hopper) paged prefill kernel on warpgroup
 * matrix instructions (wgmma.mma_async), variants 6..8 of prefill_mma.h.
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
 * k-step (one per 64-column block of V).
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

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_WGMMA_BODY 1
#endif

#define WG_M KVA__CUDA_PREFILL_TILE_M /* rows per CTA (128) */
#define WG_D 128                      /* head size */
#define WG_BN 128                     /* keys per K/V tile */
#define WG_THREADS 256
#define WG_LOG2E 1.4426950408889634f
#define WG_LN2 0.6931471805599453f
/* Bytes of one [rows, 128] operand in the swizzled layout. */
#define WG_TILE_BYTES(rows) ((rows) * WG_D * 2)

/* Byte offset of 16-byte chunk ch (0..15) of row r in a swizzled [rows, 128]
 * operand: column block ch / 8 ([rows][64] each), chunk (ch % 8) ^ (r % 8). */
#ifdef KVA_WGMMA_BODY
static __device__ __forceinline__ uint32_t wg_swz(int r, int ch, int rows)
{
    return (uint32_t)((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
#endif

/* wgmma by element type. */
template <typename Ty> struct wg_ops;
template <> struct wg_ops<kva__mma_bf16> {
#ifdef KVA_WGMMA_BODY
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int sc)
    {
        kva__wgmma_ss_m64n128_bf16(d, a, b, sc);
    }
    static __device__ __forceinline__ void rs(float d[64], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_bf16_tb(d, a, b, 1);
    }
    static __device__ __forceinline__ void rs64(float d[32], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n64_bf16_tb(d, a, b, 1);
    }
#endif
};
template <> struct wg_ops<kva__mma_f16> {
#ifdef KVA_WGMMA_BODY
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int sc)
    {
        kva__wgmma_ss_m64n128_f16(d, a, b, sc);
    }
    static __device__ __forceinline__ void rs(float d[64], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_f16_tb(d, a, b, 1);
    }
    static __device__ __forceinline__ void rs64(float d[32], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n64_f16_tb(d, a, b, 1);
    }
#endif
};

/*
 * NST: K/V stages (2 or 3). PV_SPLIT: P V as two n64 products per k-step.
 * Dynamic shared memory (from a 1024-byte aligned base): Q [128, 128], then K
 * [NST][128, 128], then V [NST][128, 128], all swizzled (wg_swz).
 */
template <int NST, bool PV_SPLIT, typename Ty>
__global__ void __launch_bounds__(WG_THREADS, 1)
    prefill_wgmma_kernel(const kva__cuda_prefill_args a)
{
#ifdef KVA_WGMMA_BODY
    constexpr int D = WG_D, BN = WG_BN, CPR = D / 8;
    constexpr uint32_t QB = WG_TILE_BYTES(WG_M), KB = WG_TILE_BYTES(BN);
    typedef typename Ty::elem elem;
    typedef wg_ops<Ty> W;

    const int tile_idx = blockIdx.x;
    if (tile_idx >= *a.num_tiles)
        return;
    const int32_t *tile = a.tiles + (size_t)tile_idx * KVA__CUDA_PREFILL_TILE_INTS;
    const int r = tile[0], m0 = tile[1], kvh = tile[2];

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = kva__smem_u32(smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + QB;
    const uint32_t sV = sK + NST * KB;

    const int tid = threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7, wq = (tid >> 5) & 3; /* warpgroup, warp in it */
    const int g4 = lane >> 2, t4 = lane & 3;
    const int H = a.num_heads, G = a.num_heads / a.num_kv_heads;
    const int q_start = a.query_start_loc[r];
    const int q_len = a.query_start_loc[r + 1] - q_start;
    const int seq_len = a.seq_lens[r];
    const int rows = q_len * G;
    const int B = a.block_size;
    const int bt_stride =
        a.block_table_stride_dev ? *a.block_table_stride_dev : a.block_table_stride;
    const int32_t *bt = a.block_table + (size_t)r * bt_stride;
    const int has_window = a.window_left >= 0 && a.window_left < KVA_MAX_SEQ_LEN;
    const int window = a.window_left;

    const int m_last = min(m0 + WG_M, rows) - 1;
    const int pos_min = seq_len - q_len + m0 / G;
    const int pos_max = seq_len - q_len + m_last / G;
    const int kv_lo = has_window ? max(0, pos_min - window) : 0;
    const int kv_hi = a.causal ? min(seq_len, pos_max + 1) : seq_len;

    /* ---- Q: rows m0 .. m0 + 127 (zeros past the request), first copy group ---- */
    const elem *q = (const elem *)a.q;
    for (int idx = tid; idx < WG_M * CPR; idx += WG_THREADS) {
        const int row = idx / CPR, ch = idx % CPR, pm = m0 + row;
        const elem *src = q;
        int bytes = 0;
        if (pm < rows) {
            const int i = pm / G, g = pm - (pm / G) * G;
            src = q + ((size_t)(q_start + i) * H + (size_t)kvh * G + g) * D + ch * 8;
            bytes = 16;
        }
        kva__cp_async16(sQ + wg_swz(row, ch, WG_M), src, bytes);
    }

    /* K/V gather (as prefill_mma): thread copies chunk lch of rows lrow + 16 k;
     * rows outside [kv_lo, kv_hi) are zero-filled without reading the block
     * table or the cache. */
    constexpr int KV_RPP = WG_THREADS / CPR; /* 16 */
    constexpr int KV_ITERS = BN / KV_RPP;    /* 8 */
    const int lrow = tid / CPR, lch = tid % CPR;
    const elem *kc = (const elem *)a.k, *vc = (const elem *)a.v;
    const int Hkv = a.num_kv_heads;
    const int nhd = a.layout == KVA_LAYOUT_NHD;
    const int64_t blk_stride = (int64_t)B * Hkv * D;
    const int row_stride = nhd ? Hkv * D : D;
    const int head_off = (nhd ? kvh * D : kvh * B * D) + lch * 8;
    const int b_shift = (B & (B - 1)) == 0 ? __ffs(B) - 1 : -1;
    const uint32_t swz_lane = wg_swz(lrow, lch, BN); /* + row offset 16 k * 128 */
    auto kv_blocks = [&](int n0, int blk[KV_ITERS]) {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int j = n0 + lrow + k * KV_RPP;
            const int bi = b_shift >= 0 ? j >> b_shift : j / B;
            blk[k] = j >= kv_lo && j < kv_hi ? bt[bi] : 0;
        }
    };
    auto kv_copy = [&](int st, int n0, const int blk[KV_ITERS]) {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int j = n0 + lrow + k * KV_RPP;
            const int o = b_shift >= 0 ? j & (B - 1) : j % B;
            const bool in = j >= kv_lo && j < kv_hi;
            const int64_t off = in ? (int64_t)blk[k] * blk_stride + (o * row_stride + head_off) : 0;
            const uint32_t so = (uint32_t)st * KB + swz_lane + (uint32_t)(k * KV_RPP * 128);
            kva__cp_async16(sK + so, kc + off, in ? 16 : 0);
            kva__cp_async16(sV + so, vc + off, in ? 16 : 0);
        }
    };

    /* Rows of this thread: tile rows 64 wg + 16 wq + g4 + 8 hf. */
    int pos[2], head[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int pm = min(m0 + wg * 64 + wq * 16 + hf * 8 + g4, m_last);
        const int i = pm / G;
        pos[hf] = seq_len - q_len + i;
        head[hf] = kvh * G + (pm - i * G);
    }
    const float scale = a.scale > 0.0f ? a.scale : rsqrtf((float)D);
    const float softcap = a.softcap;
    const float score_mul = softcap > 0.0f ? scale / softcap : 0.0f;
    const float cap_mul = softcap * WG_LOG2E;
    const float scale_log2 = scale * WG_LOG2E;

    /* Descriptors: Q rows of this warpgroup (K-major, SBO 1024); K and V of
     * stage 0 (K-major; V MN-major with LBO = one column block = BN rows). */
    const uint64_t dq0 = kva__wgmma_desc(sQ + (uint32_t)wg * 64 * 128, 16, 1024);
    const uint64_t dk0 = kva__wgmma_desc(sK, 16, 1024);
    const uint64_t dv0 = kva__wgmma_desc(sV, BN * 128, 1024);

    float o[64], s[64];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < 64; e++) {
        o[e] = 0.0f;
        s[e] = 0.0f;
    }

    const int n_first = kv_lo / BN;
    const int n_last = kv_hi > kv_lo ? (kv_hi - 1) / BN : n_first - 1;
    /* Prologue: tiles n_last .. n_last - NST + 2 (one copy group each; Q is in
     * the first). */
#pragma unroll
    for (int p = 0; p < NST - 1; p++) {
        const int n = n_last - p;
        if (n >= n_first) {
            int blk[KV_ITERS];
            kv_blocks(n * BN, blk);
            kv_copy(p, n * BN, blk);
        }
        kva__cp_async_commit();
    }

    for (int n = n_last, it = 0; n >= n_first; n--, it++) {
        const int st = it % NST;
        kva__cp_async_wait<NST - 2>(); /* this thread's copies of tile n landed */
        kva__fence_proxy_async();      /* ... visible to wgmma */
        __syncthreads();               /* everyone's; stage (it - 1) % NST is free */

        /* S = Q K^T: [64, 128] per warpgroup. */
        const uint64_t dk = dk0 + ((uint64_t)(st * KB) >> 4);
        kva__wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            W::ss(s, dq0 + (uint64_t)(((kk >> 2) * WG_M * 128 + (kk & 3) * 32) >> 4),
                  dk + (uint64_t)(((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4), kk > 0);
        kva__wgmma_commit();

        /* Copy of tile n - NST + 1 into stage (it + NST - 1) % NST meanwhile. */
        {
            const int nn = n - (NST - 1);
            if (nn >= n_first) {
                int blk[KV_ITERS];
                kv_blocks(nn * BN, blk);
                kv_copy((it + NST - 1) % NST, nn * BN, blk);
            }
            kva__cp_async_commit();
        }
        kva__wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; e++)
            kva__reg_fence(s[e]);

        /* Softmax (log2 units), as prefill_mma: s[4 nb + e] is row hf = e / 2,
         * key n0 + 8 nb + 2 t4 + e % 2. */
        const int n0 = n * BN;
        const int need_mask = (n0 + BN > seq_len) || (a.causal && n0 + BN - 1 > pos_min) ||
                              (has_window && (int64_t)pos_max - n0 > window);
        const int transform = need_mask || softcap > 0.0f || a.alibi_slopes != NULL;
        const float mul = transform ? 1.0f : scale_log2;
        if (transform) {
            float sl[2] = {0.0f, 0.0f};
            if (a.alibi_slopes) {
                sl[0] = a.alibi_slopes[head[0]] * WG_LOG2E;
                sl[1] = a.alibi_slopes[head[1]] * WG_LOG2E;
            }
#pragma unroll
            for (int e = 0; e < 64; e++) {
                const int hf = (e >> 1) & 1;
                const int j = n0 + (e >> 2) * 8 + 2 * t4 + (e & 1);
                float x = s[e];
                x = softcap > 0.0f ? cap_mul * tanhf(x * score_mul) : x * scale_log2;
                x += sl[hf] * (float)(j - pos[hf]);
                const int p_ = pos[hf];
                const bool vis = j < seq_len && (!a.causal || j <= p_) &&
                                 (!has_window || p_ - j <= window);
                s[e] = vis ? x : -INFINITY;
            }
        }
        float m_new[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
                mx = fmaxf(mx, fmaxf(s[4 * nb + 2 * hf], s[4 * nb + 2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            m_new[hf] = fmaxf(m_run[hf], mx * mul);
        }
        /* Lazy rescaling: the reference max moves only when a row of the warp
         * grows past it by more than 8 (weights stay <= 2^8). */
        if (__any_sync(0xffffffffu, m_new[0] > m_run[0] + 8.0f || m_new[1] > m_run[1] + 8.0f)) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m_use = m_new[hf] == -INFINITY ? 0.0f : m_new[hf];
                const float alpha = kva__ex2(m_run[hf] - m_use);
                m_run[hf] = m_new[hf];
                l_run[hf] *= alpha;
#pragma unroll
                for (int nb = 0; nb < D / 8; nb++) {
                    o[4 * nb + 2 * hf] *= alpha;
                    o[4 * nb + 2 * hf + 1] *= alpha;
                }
            }
        }
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float m_use = m_run[hf] == -INFINITY ? 0.0f : m_run[hf];
            float sum = 0.0f;
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++) {
                const float p0 = kva__ex2(fmaf(s[4 * nb + 2 * hf], mul, -m_use));
                const float p1 = kva__ex2(fmaf(s[4 * nb + 2 * hf + 1], mul, -m_use));
                sum += p0 + p1;
                /* A fragment of k-step nb / 2: regs {0, 1} key cols 0..7
                 * (rows g, g + 8), {2, 3} cols 8..15. */
                pa[nb >> 1][(nb & 1) * 2 + hf] = Ty::pack(p0, p1);
            }
            l_run[hf] += sum; /* per-thread partial */
        }

        /* O += P V: V [BN, 128] as MN-major B, k-step kk = keys 16 kk .. + 15. */
        const uint64_t dv = dv0 + ((uint64_t)(st * KB) >> 4);
        kva__wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const uint64_t d = dv + (uint64_t)((kk * 16 * 128) >> 4);
            if (PV_SPLIT) {
                W::rs64(o, pa[kk], d);
                W::rs64(o + 32, pa[kk], d + (uint64_t)((BN * 128) >> 4));
            } else {
                W::rs(o, pa[kk], d);
            }
        }
        kva__wgmma_commit();
        kva__wgmma_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; e++)
            kva__reg_fence(o[e]);
    }
    kva__cp_async_wait<0>();

    /* ---- epilogue: sink, normalization, out and lse (as prefill_mma) ---- */
    elem *out = (elem *)a.out;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_run[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float m = m_run[hf];
        float f = 1.0f;
        if (a.sinks) {
            const float sink2 = a.sinks[head[hf]] * WG_LOG2E;
            const float m_f = fmaxf(m, sink2);
            f = kva__ex2(m - m_f);
            l = l * f + kva__ex2(sink2 - m_f);
            m = m_f;
        }
        const float inv = l == 0.0f ? 0.0f : f / l;
        const float lse = l == 0.0f ? -INFINITY : (m + __log2f(l)) * WG_LN2;
        const int pm = m0 + wg * 64 + wq * 16 + hf * 8 + g4;
        if (pm >= rows)
            continue;
        const int i = pm / G;
        const size_t orow = (size_t)(q_start + i) * H + head[hf];
        elem *dst = out + orow * D;
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++) {
            const uint32_t v = Ty::pack(o[4 * nb + 2 * hf] * inv, o[4 * nb + 2 * hf + 1] * inv);
            *(uint32_t *)(dst + nb * 8 + 2 * t4) = v;
        }
        if (a.lse && t4 == 0)
            a.lse[orow] = lse;
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

template <typename Ty>
static kva_status launch_wg_dtype(const kva__cuda_prefill_args *a, cudaStream_t st, int variant)
{
    switch (variant) {
    case 6:
        return launch_wg<2, false, Ty>(a, st);
    case 7:
        return launch_wg<3, false, Ty>(a, st);
    default:
        return launch_wg<2, true, Ty>(a, st);
    }
}

/* Called by kva__cuda_prefill_launch_variant after its argument checks, for
 * variants 6..8 that exist (D = Dv = 128, f16/bf16, sm_90a build and device). */
extern "C" kva_status kva__cuda_prefill_wgmma_launch(const kva__cuda_prefill_args *a, void *stream,
                                                     int variant)
{
    cudaStream_t st = (cudaStream_t)stream;
    return a->dtype == KVA_DTYPE_BF16 ? launch_wg_dtype<kva__mma_bf16>(a, st, variant)
                                      : launch_wg_dtype<kva__mma_f16>(a, st, variant);
}
