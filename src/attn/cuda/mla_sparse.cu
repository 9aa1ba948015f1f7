/*
 * mla_sparse.cu - sparse absorbed MLA (DeepSeek V3.2, kva_mla_sparse_run) on
 * mma.sync (registry entry "mla_decode_mma_sm80": plans of H <= 32, every
 * plan without sm_90a, and any plan when forced; H > 32 runs on the wgmma
 * body, mla_sparse_wgmma.cu) and the host side of both kernels (the kernel
 * choice, launches, splits, workspace, merge): every query token attends only the
 * latent rows its own index list names, gathered from the paged cache (or
 * from a request's dense rows in the separate mode), on mma.sync m16n8k16
 * with fp32 accumulation. The body is the absorbed MLA decode's
 * (mla_decode_mma.cu, mla_decode_common.cuh) with two traits:
 *   the row source SRC: 16-bit latent rows of 1152 bytes (a bf16/f16 cache,
 *     or the dense rows the separate mode gathered), or fp8_ds_mla rows of
 *     656 bytes (codes, 4 tile scales, bf16 k_pe). fp8 rows are converted
 *     per tile into a 16-bit tile of the CODES (e4m3 values are exact in
 *     bf16 and f16); the scales enter in fp32: S = sum over the 4 c_kv
 *     tiles of s_tile(key) * (q_tile . codes_tile) + q_pe . k_pe, and P V
 *     uses P_tile = P * s_tile(key) for the value columns of each tile. So
 *     the keys and values are the cache's exact dequantized values (only P
 *     is rounded to 16 bits, as for every cache), not FlashMLA's bf16
 *     rounding of code * scale;
 *   the addressing (runtime): position p of the token's request through its
 *     block-table row, or dense row p of the request's gathered rows.
 *
 * Work: item = (query token t, head tile of M = 16 MT rows, key split). The
 * M rows are heads h0 .. h0 + M - 1 of ONE token (each token has its own
 * index list, so tokens never share a key tile): MT = 1, 2 or 4, the smallest
 * that holds H up to 64 (H 16 runs 16-row tiles, not 64), H > 64 in 64-row
 * tiles. A token's K index entries are cut into nsplit chunks when the items
 * are too few to fill the GPU; chunks are merged by sp_merge_kernel.
 *
 * Per key tile of BN entries: each thread reads the position of its key
 * (one iteration ahead, so the load overlaps the previous tile's math), turns
 * it into a row (entries past topk_length, -1 and positions outside
 * 0 .. seq_len - 1 are unused: zero-filled, their logits -inf) and copies
 * its 16-byte chunks of the row with cp.async into a ring of NST stages
 * (coalesced 16-byte loads of scattered rows; one row is TPK threads'
 * consecutive chunks). Then S = Q K^T over 576, the online softmax (in log2
 * units), P in shared memory, O += P V over the first 512 columns of the same
 * tile, as mla_decode_mma.cu. LSE includes the sink.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_sparse.h"
}
#include "cuda_check.h"
#include "mla_sparse_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Tile shape per (MT, SRC) as ml_cfg in mla_decode_mma.cu, plus (fp8) the
 * raw ring and the per-stage key validity words. */
template <int MT, bool FP8> struct sp_cfg {
    static constexpr int M = 16 * MT;
    static constexpr int BN = MT == 4 ? 32 : 64;
    static constexpr int NST = MT == 4 || (MT == 1 && FP8) ? 3 : 2; /* what fits 227 KB */
    static constexpr int KW = BN * MT / SP_NW;
    static constexpr int NBS = KW / 8;
    static constexpr int CW = ML_DV * MT / SP_NW;
    static constexpr int NBO = CW / 8;
    static constexpr int TILE = BN * ML_D * 2;
    static constexpr int RAW = FP8 ? BN * sp_ds_mla::ROW : 0; /* one raw stage */
    static constexpr int P_STRIDE = BN * 2 + 16;
    static constexpr int NP = FP8 ? 4 : 1; /* P copies: one per c_kv tile (its scales) */
    static constexpr int P_BYTES = 16 * MT * P_STRIDE;
    static constexpr int OFF_TILE = M * ML_D * 2;                     /* 16-bit tiles */
    static constexpr int OFF_RAW = OFF_TILE + (FP8 ? 1 : NST) * TILE; /* fp8 raw ring */
    static constexpr int OFF_P = OFF_RAW + NST * RAW;
    static constexpr int OFF_RED = OFF_P + NP * P_BYTES;
    static constexpr int OFF_OK = OFF_RED + 2 * SP_NW * 64 * 4;
    static constexpr int SMEM = OFF_OK + NST * BN * 4;
    static_assert(NBS >= 1 && KW % 8 == 0, "key slice of a warp");
    static_assert(SMEM <= 227 * 1024, "shared memory of one CTA");
};

/* Copies key k's row (zeros when unused) as key `key` of a tile at `dst`:
 * thread chunk c0, c0 + TPK, ...; records its validity in ok[key] (chunk
 * 0's thread). */
template <int BN, typename SRC>
static __device__ __forceinline__ void sp_issue(const sp_args &a, const sp_key &k, uint32_t dst,
                                                int *ok)
{
    constexpr int TPK = ML_NT / BN;
    const int key = threadIdx.x / TPK, c0 = threadIdx.x % TPK;
    const unsigned char *src = a.rows;
    if (k.ok)
        src += ((int64_t)k.blk * a.B + k.off) * SRC::ROW;
    if (c0 == 0)
        ok[key] = k.ok;
    for (int c = c0; c < SRC::CH; c += TPK) {
        const uint32_t d = SRC::FP8 ? (uint32_t)(key * SRC::ROW + c * 16) : ml_off<0>(key, c);
        kva__cp_async16(dst + d, src + (k.ok ? c * 16 : 0), k.ok ? 16 : 0);
    }
}

/* fp8_ds_mla raw rows [BN, 656] -> the 16-bit tile [BN, 576] (layout
 * ml_off<0>): c_kv chunk c (8 codes) as their exact 16-bit values (the
 * scales are applied in fp32 by the caller), k_pe copied. */
template <int BN, typename Ty>
static __device__ __forceinline__ void sp_codes(const unsigned char *raw, unsigned char *tile)
{
    for (int x = threadIdx.x; x < BN * ML_CH; x += ML_NT) {
        const int r = x / ML_CH, c = x - r * ML_CH;
        const unsigned char *row = raw + r * sp_ds_mla::ROW;
        uint4 v;
        if (c < ML_DV / 8) {
            const uint2 codes = *reinterpret_cast<const uint2 *>(row + c * 8);
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t word = i < 2 ? codes.x : codes.y;
                const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
                    (__nv_fp8x2_storage_t)((word >> (16 * (i & 1))) & 0xffffu), __NV_E4M3);
                const float2 f = __half22float2(__half2(h));
                w[i] = Ty::pack(f.x, f.y);
            }
            v = make_uint4(w[0], w[1], w[2], w[3]);
        } else { /* k_pe: bf16, as the q dtype (f16: exact in f16's normal range) */
            const uint4 b =
                *reinterpret_cast<const uint4 *>(row + ML_DV + 16 + (c - ML_DV / 8) * 16);
            const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                w[i] = Ty::pack(__uint_as_float(bw[i] << 16), __uint_as_float(bw[i] & 0xffff0000u));
            v = make_uint4(w[0], w[1], w[2], w[3]);
        }
        *reinterpret_cast<uint4 *>(tile + ml_off<0>(r, c)) = v;
    }
}

/*
 * Ty: kva__mma_bf16 or kva__mma_f16 (the q dtype, and the 16-bit rows'); MT:
 * row tiles of 16 per item; SRC: sp_rows16 or sp_ds_mla. One item per CTA.
 */
template <typename Ty, int MT, typename SRC>
__global__ void __launch_bounds__(ML_NT, 1) mla_sparse_kernel(const sp_args a)
{
    typedef sp_cfg<MT, SRC::FP8> C;
    typedef typename Ty::elem elem;
    constexpr int M = C::M, BN = C::BN, NST = C::NST, KW = C::KW, NBS = C::NBS, NBO = C::NBO;
    extern __shared__ __align__(128) unsigned char sp_smem[];
    const uint32_t sQ = kva__smem_u32(sp_smem);
    const uint32_t sTile = sQ + C::OFF_TILE, sRaw = sQ + C::OFF_RAW, sP = sQ + C::OFF_P;
    float(*s_max)[64] = (float(*)[64])(sp_smem + C::OFF_RED);
    float(*s_sum)[64] = (float(*)[64])(sp_smem + C::OFF_RED + SP_NW * 64 * 4);
    int *s_ok = (int *)(sp_smem + C::OFF_OK); /* [NST][BN] */

    /* The item: token, head tile, split; tokens of the other side exit. */
    const sp_item mi = sp_item_load<M>(a, blockIdx.x);
    if (mi.skip)
        return;
    const int32_t t = mi.t, split = mi.split, s = mi.s, kbeg = mi.kbeg, kend = mi.kend;
    const int32_t h0 = mi.h0, nrows = mi.nrows;
    const int32_t *bt_row = mi.bt_row, *idx_row = mi.idx_row;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const int rt = warp % MT, kg = warp / MT, row0 = rt * 16;
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    constexpr int TPK = ML_NT / BN;
    const int my_key = threadIdx.x / TPK;
    const uint32_t stage_bytes = SRC::FP8 ? C::RAW : C::TILE;
    const uint32_t ring = SRC::FP8 ? sRaw : sTile;

    /* The first NST - 1 tiles, the row of the next one and the position of
     * the one after, then Q. */
#pragma unroll
    for (int st = 0; st < NST - 1; st++) {
        const int32_t kb = kbeg + st * BN;
        if (kb < kend)
            sp_issue<BN, SRC>(a, sp_locate(a, bt_row, sp_pos(idx_row, kb + my_key, kend), s),
                              ring + st * stage_bytes, s_ok + st * BN);
        kva__cp_async_commit();
    }
    sp_key k_next = sp_locate(a, bt_row, sp_pos(idx_row, kbeg + (NST - 1) * BN + my_key, kend), s);
    int32_t p_next = sp_pos(idx_row, kbeg + NST * BN + my_key, kend);
    sp_stage_q<M, 0, elem>(a, mi, sp_smem);

    float o[NBO][4];
#pragma unroll
    for (int n = 0; n < NBO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[n][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    int stage = 0;
    for (int32_t kb = kbeg; kb < kend; kb += BN) {
        kva__cp_async_wait<NST - 2>();
        __syncthreads(); /* tile kb landed; the previous tile's stage, P and maxima are free */
        {
            const int32_t kn = kb + (NST - 1) * BN;
            const int ahead = stage == 0 ? NST - 1 : stage - 1;
            if (kn < kend) {
                sp_issue<BN, SRC>(a, k_next, ring + ahead * stage_bytes, s_ok + ahead * BN);
                k_next = sp_locate(a, bt_row, p_next, s);
                p_next = sp_pos(idx_row, kn + 2 * BN + my_key, kend);
            }
            kva__cp_async_commit();
        }
        uint32_t sk = sTile + stage * C::TILE;
        if (SRC::FP8) {
            sk = sTile;
            sp_codes<BN, Ty>(sp_smem + C::OFF_RAW + stage * C::RAW, sp_smem + C::OFF_TILE);
            __syncthreads(); /* the 16-bit tile */
        }

        /* The tile scales of the thread's keys key0 + 8 nt + 2 t4 + e (fp8). */
        const int key0 = kg * KW;
        float ksc[NBS][2][4];
        if (SRC::FP8) {
            const unsigned char *raw = sp_smem + C::OFF_RAW + stage * C::RAW;
#pragma unroll
            for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float4 v = *reinterpret_cast<const float4 *>(
                        raw + (key0 + nt * 8 + 2 * t4 + e) * sp_ds_mla::ROW + ML_DV);
                    ksc[nt][e][0] = v.x, ksc[nt][e][1] = v.y, ksc[nt][e][2] = v.z,
                    ksc[nt][e][3] = v.w;
                }
        }
        /* S = Q K^T for row tile rt and the warp's KW keys: per part (the 4
         * c_kv tiles of 8 k-steps, then k_pe's 4), each part times its key's
         * scale (fp8) into sc. */
        float sc[NBS][4];
#pragma unroll
        for (int nt = 0; nt < NBS; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[nt][e] = 0.f;
#pragma unroll
        for (int part = 0; part < 5; part++) {
            float ta[NBS][4], tb[NBS][4];
#pragma unroll
            for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ta[nt][e] = 0.f, tb[nt][e] = 0.f;
            if (part < 4)
                ml_qk<Ty, NBS, 8>(sQ, sk, row0, key0, part * 8, lane, ta, tb);
            else
                ml_qk<Ty, NBS, 4>(sQ, sk, row0, key0, 32, lane, ta, tb);
#pragma unroll
            for (int nt = 0; nt < NBS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = ta[nt][e] + tb[nt][e];
                    sc[nt][e] = SRC::FP8 && part < 4 ? fmaf(x, ksc[nt][e & 1][part & 3], sc[nt][e])
                                                     : sc[nt][e] + x;
                }
        }
        /* Logits in log2 units; unused keys -inf. */
        const int *ok = s_ok + stage * BN;
#pragma unroll
        for (int nt = 0; nt < NBS; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kt = key0 + nt * 8 + 2 * t4 + (e & 1);
                sc[nt][e] = ok[kt] ? sc[nt][e] * scale_log2 : -INFINITY;
            }
        float alpha[2], mu[2];
        const bool resc =
            ml_tile_max<NBS, SP_NW / MT>(sc, s_max, kg, row0 + g4, t4, m_run, l_run, alpha, mu);
        /* P (fp8: one copy per value tile, times the keys' scales of that tile). */
        ml_store_p<Ty, NBS, C::NP, C::P_STRIDE, C::P_BYTES>(sc, mu, sP, row0 + g4, key0, t4, l_run,
                                                            ksc);
        if (resc)
            ml_rescale<NBO>(o, alpha);
        __syncthreads(); /* P of every slice */

        /* O += P V over the warp's CW value columns of the tile (fp8: per value
         * tile of 128 columns, with that tile's P). */
        const int cc0 = kg * (C::CW / 8);
        constexpr int NBT = SRC::FP8 && NBO > 16 ? 16 : NBO; /* n8 tiles per P copy */
#pragma unroll
        for (int pt = 0; pt < NBO / NBT; pt++) {
            const int tp = SRC::FP8 ? (cc0 + pt * NBT) >> 4 : 0;
            ml_pv<Ty, BN, NBT, C::P_STRIDE>(sP + tp * C::P_BYTES, sk, row0, cc0 + pt * NBT, lane,
                                            o + pt * NBT);
        }
        stage = stage == NST - 1 ? 0 : stage + 1;
    }
    kva__cp_async_wait<0>();
    sp_finish<NBO, SP_NW / MT, Ty>(a, t, h0, nrows, split, s_sum, kg, row0 + g4, kg * C::CW, t4,
                                   l_run, m_run, o);
}

/* The split partials of tokens t0 .. t0 + nt - 1 merged with the sink: one
 * warp per (token, head), lanes over 16 columns each. */
template <typename Ty> __global__ void __launch_bounds__(128) sp_merge_kernel(const sp_args a)
{
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (n >= (int64_t)a.nt * a.H)
        return;
    const int32_t t = a.t0 + (int32_t)(n / a.H), h = (int32_t)(n % a.H);
    if (a.side) { /* only this launch's side */
        const int32_t r = sp_request(a, t);
        const int32_t q_len = __ldg(a.qsl + r + 1) - __ldg(a.qsl + r);
        if ((a.side == 1) != (q_len <= a.dthr))
            return;
    }
    const float *plse = a.ws + (int64_t)a.nt * a.H * a.nsplit * ML_DV + n * a.nsplit;
    float M = a.sinks ? a.sinks[h] * KVA__DMMA_LOG2E : -INFINITY;
    for (int p = 0; p < a.nsplit; p++)
        M = fmaxf(M, plse[p]);
    const float mt = M == -INFINITY ? 0.f : M;
    float acc[16], L = a.sinks ? exp2f(a.sinks[h] * KVA__DMMA_LOG2E - mt) : 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        acc[i] = 0.f;
    for (int p = 0; p < a.nsplit; p++) {
        const float w = exp2f(plse[p] - mt);
        if (w == 0.f)
            continue;
        L += w;
        const float4 *po = reinterpret_cast<const float4 *>(a.ws + (n * a.nsplit + p) * ML_DV);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = po[lane + 32 * i];
            acc[4 * i] += w * v.x;
            acc[4 * i + 1] += w * v.y;
            acc[4 * i + 2] += w * v.z;
            acc[4 * i + 3] += w * v.w;
        }
    }
    const float f = L > 0.f ? 1.f / L : 0.f;
    typename Ty::elem *dst = (typename Ty::elem *)a.out + ((int64_t)t * a.H + h) * ML_DV;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            Ty::store(dst + 4 * (lane + 32 * i) + e, acc[4 * i + e] * f);
    if (a.lse && lane == 0)
        a.lse[(int64_t)t * a.H + h] = L > 0.f ? (mt + log2f(L)) * KVA__DMMA_LN2 : -INFINITY;
}

/* ---- host side ---- */

typedef void (*sp_kernel_fn)(sp_args);

typedef struct sp_pick {
    sp_kernel_fn fn, merge;
    int smem, bn;
} sp_pick;

template <typename Ty, typename SRC> static sp_pick sp_pick_mt(int mt)
{
    sp_pick k;
    k.merge = sp_merge_kernel<Ty>;
    if (mt == 1)
        k.fn = mla_sparse_kernel<Ty, 1, SRC>, k.smem = sp_cfg<1, SRC::FP8>::SMEM,
        k.bn = sp_cfg<1, SRC::FP8>::BN;
    else if (mt == 2)
        k.fn = mla_sparse_kernel<Ty, 2, SRC>, k.smem = sp_cfg<2, SRC::FP8>::SMEM,
        k.bn = sp_cfg<2, SRC::FP8>::BN;
    else
        k.fn = mla_sparse_kernel<Ty, 4, SRC>, k.smem = sp_cfg<4, SRC::FP8>::SMEM,
        k.bn = sp_cfg<4, SRC::FP8>::BN;
    return k;
}

static sp_pick sp_choose(kva_dtype q_dtype, int fp8, int mt)
{
    if (q_dtype == KVA_DTYPE_F16)
        return fp8 ? sp_pick_mt<kva__mma_f16, sp_ds_mla>(mt)
                   : sp_pick_mt<kva__mma_f16, sp_rows16>(mt);
    return fp8 ? sp_pick_mt<kva__mma_bf16, sp_ds_mla>(mt)
               : sp_pick_mt<kva__mma_bf16, sp_rows16>(mt);
}

/* Row tiles of 16 per item for H heads: 1, 2 or 4. */
static int sp_mt(int32_t H)
{
    return H <= 16 ? 1 : H <= 32 ? 2 : 4;
}

/* 1 if the plan runs on the wgmma MLA body (mla_sparse_wgmma.cu), chosen in
 * kva_plan_create (kva__cuda_sparse_kernel). */
static int sp_wgmma(const kva_plan *p)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)p->device;
    return cp && cp->decode_kernel == KVA__CUDA_K_MLA_DECODE_WGMMA;
}

/* Head tiles per token and keys per tile of the plan's kernel. */
static void sp_geometry(const kva_plan *p, int32_t *tiles, int *bn)
{
    const int32_t H = p->d.num_heads;
    if (sp_wgmma(p)) {
        *tiles = (H + 63) / 64;
        *bn = 64;
        return;
    }
    const int mt = sp_mt(H);
    *tiles = (H + 16 * mt - 1) / (16 * mt);
    *bn = mt == 4 ? 32 : 64;
}

extern "C" int kva__cuda_sparse_kernel(const kva_context *ctx, const kva_plan *plan)
{
    const int fd = kva__context_forced_kernel(ctx, KVA__KERNEL_DECODE);
    if (fd == KVA__CUDA_K_MLA_DECODE_MMA)
        return KVA__CUDA_K_MLA_DECODE_MMA;
    return fd == KVA__CUDA_K_MLA_DECODE_WGMMA ||
                   (plan->d.num_heads > 32 && kva__cuda_prefill_wgmma_ready())
               ? KVA__CUDA_K_MLA_DECODE_WGMMA
               : KVA__CUDA_K_MLA_DECODE_MMA;
}

/* Key splits of a launch of `items` unsplit items over K entries of BN-key
 * tiles on num_sms SMs (one resident CTA each): none when the items fill two
 * waves, else enough to do so, each split at least 4 tiles. */
static int32_t sp_splits(int64_t items, int32_t K, int bn, int num_sms, int32_t *split_keys)
{
    const int64_t want = 2 * (int64_t)(num_sms > 0 ? num_sms : 1);
    int64_t n = items >= want || items == 0 ? 1 : (want + items - 1) / items;
    const int64_t most = ((int64_t)K + 4 * bn - 1) / (4 * bn);
    n = n < most ? n : most;
    n = n < 1 ? 1 : n;
    int64_t keys = ((int64_t)K + n - 1) / n;
    keys = (keys + bn - 1) / bn * bn;
    *split_keys = (int32_t)keys;
    return (int32_t)(((int64_t)K + keys - 1) / keys);
}

/* The launches of a plan: tokens, side, splits (host arrays of the plan). */
typedef struct sp_launch {
    int32_t t0, nt, side, r; /* r: the request of a dense (separate-mode) launch, else -1 */
    int32_t nsplit, split_keys;
    int64_t active; /* tokens that run */
} sp_launch;

/* Calls f(launch) for every launch of the plan, in run order: MIXED: one over
 * every token; SEPARATE: the decode tokens from the cache, then each prefill
 * request over its dense rows. */
template <typename F> static kva_status sp_for_launches(const kva_plan *p, int num_sms, F f)
{
    const kva_plan_desc *d = &p->d;
    const int32_t R = d->num_requests, T = p->query_start_loc[R];
    int32_t tiles = 0;
    int bn = 0;
    sp_geometry(p, &tiles, &bn);
    const int sep = d->sparse_mode == KVA_SPARSE_SEPARATE;
    int64_t decodes = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        decodes += !sep || q <= d->decode_threshold ? q : 0;
    }
    sp_launch l;
    if (decodes > 0) {
        l.t0 = 0, l.nt = T, l.side = sep ? 1 : 0, l.r = -1, l.active = decodes;
        l.nsplit = sp_splits(decodes * tiles, d->sparse_topk, bn, num_sms, &l.split_keys);
        KVA_TRY(f(l));
    }
    for (int32_t r = 0; sep && r < R; r++) {
        const int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        if (q <= d->decode_threshold)
            continue;
        l.t0 = p->query_start_loc[r], l.nt = q, l.side = 0, l.r = r, l.active = q;
        l.nsplit = sp_splits((int64_t)q * tiles, d->sparse_topk, bn, num_sms, &l.split_keys);
        KVA_TRY(f(l));
    }
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_sparse_workspace(const kva_context *ctx, const kva_plan *plan,
                                                 size_t *bytes, size_t *rows_off)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const int32_t H = plan->d.num_heads;
    size_t part = 0, dense = 0;
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    KVA_TRY(sp_for_launches(plan, st->num_sms, [&](const sp_launch &l) {
        if (l.nsplit > 1) {
            const size_t b = (size_t)l.nt * H * l.nsplit * (ML_DV + 1) * sizeof(float);
            part = b > part ? b : part;
        }
        if (l.r >= 0) {
            const size_t b = (size_t)plan->seq_lens[l.r] * ML_D * es;
            dense = b > dense ? b : dense;
        }
        return KVA_STATUS_OK;
    }));
    *rows_off = (part + 255u) & ~(size_t)255u;
    *bytes = *rows_off + dense;
    return KVA_STATUS_OK;
}

extern "C" int kva__cuda_sparse_supported(const kva_plan *plan)
{
    return plan->d.head_dim == ML_D && plan->d.head_dim_v == ML_DV &&
           (plan->d.q_dtype == KVA_DTYPE_BF16 || plan->d.q_dtype == KVA_DTYPE_F16);
}

extern "C" kva_status kva__cuda_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                                           const kva_cache *cache, const int32_t *indices,
                                           int64_t indices_stride, const int32_t *topk_length,
                                           const float *sinks, void *out, float *lse)
{
    kva__cuda_state *st = (kva__cuda_state *)ctx->state;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    const int fp8 = cd->quant == KVA_QUANT_FP8_DS_MLA;
    if (!kva__cuda_sparse_supported(plan) || cd->head_dim != ML_D || cd->head_dim_v != ML_DV ||
        (!fp8 && (cd->quant != KVA_QUANT_NONE || cd->dtype != d->q_dtype)))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_sparse_run: the CUDA sparse MLA covers D 576 / Dv 512, f16 or "
                         "bf16 q, over an fp8_ds_mla cache or a latent cache of the q dtype (got "
                         "D %d / Dv %d, q %s, cache %s / %s)",
                         (int)d->head_dim, (int)d->head_dim_v, kva_dtype_name(d->q_dtype),
                         kva_dtype_name(cd->dtype), kva_quant_name(cd->quant));
    if ((uintptr_t)q % 16 != 0)
        return kva__fail(
            KVA_STATUS_INVALID_ARGUMENT,
            "kva_mla_sparse_run: q = %p: the CUDA sparse kernel reads q rows in 16-byte "
            "chunks and needs q 16-byte aligned",
            q);
    size_t ws_bytes = 0, rows_off = 0;
    KVA_TRY(kva__cuda_sparse_workspace(ctx, plan, &ws_bytes, &rows_off));
    if (ws_bytes > ctx->workspace_bytes)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_sparse_run: the context's workspace (%zu bytes) is smaller "
                         "than the plan's %zu; was the plan built on this context?",
                         ctx->workspace_bytes, ws_bytes);
    const int mt = sp_mt(d->num_heads);
    cudaStream_t stream = (cudaStream_t)st->stream;
    sp_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.idx = indices;
    a.idx_stride = indices_stride;
    a.topk_len = topk_length;
    a.sinks = sinks;
    a.out = out;
    a.lse = lse;
    a.ws = (float *)ctx->workspace;
    a.qsl = st->meta.qsl;
    a.seq_lens = st->meta.seq_lens;
    a.bt = st->meta.block_table;
    a.R = d->num_requests;
    a.bt_stride = d->block_table_stride;
    a.B = cd->block_size;
    a.H = d->num_heads;
    a.K = d->sparse_topk;
    int bn = 0;
    sp_geometry(plan, &a.tiles, &bn);
    const int wgmma = sp_wgmma(plan);
    a.dthr = d->decode_threshold;
    a.scale = d->scale;
    return sp_for_launches(plan, st->num_sms, [&](const sp_launch &l) -> kva_status {
        const int dense = l.r >= 0;
        const sp_pick k = sp_choose(d->q_dtype, dense ? 0 : fp8, mt);
        sp_args b = a;
        b.t0 = l.t0, b.nt = l.nt, b.side = l.side, b.dense = dense;
        b.nsplit = l.nsplit, b.split_keys = l.split_keys;
        b.rows = (const unsigned char *)cache->k;
        if (dense) { /* request l.r's rows 0 .. s - 1, dequantized, into the workspace */
            void *rows = (char *)ctx->workspace + rows_off;
            KVA_TRY(kva__cuda_mla_gather_rows(
                ctx, cache,
                plan->block_table ? st->meta.block_table + (int64_t)l.r * d->block_table_stride
                                  : NULL,
                plan->seq_lens[l.r], rows, d->q_dtype));
            b.rows = (const unsigned char *)rows;
        }
        const int64_t grid = (int64_t)l.nt * a.tiles * l.nsplit;
        if (grid > 0x7fffffff)
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "kva_mla_sparse_run: %lld items exceed one launch", (long long)grid);
        if (wgmma) { /* persistent CTAs, one per SM */
            const int64_t n = grid < st->num_sms ? grid : st->num_sms;
            if (n > 0)
                KVA_TRY(
                    kva__cuda_sparse_wgmma_launch(&b, d->q_dtype, dense ? 0 : fp8, (int)n, stream));
        } else {
            KVA_CUDA_TRY(
                cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
            k.fn<<<(unsigned)grid, ML_NT, (size_t)k.smem, stream>>>(b);
            KVA_CUDA_LAUNCHED("mla_sparse_kernel");
        }
        if (l.nsplit > 1) {
            const int64_t rows = (int64_t)l.nt * a.H;
            k.merge<<<(unsigned)((rows + 3) / 4), 128, 0, stream>>>(b);
            KVA_CUDA_LAUNCHED("sp_merge_kernel");
        }
        return KVA_STATUS_OK;
    });
}
