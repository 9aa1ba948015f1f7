/*
 * indexer.cu - DeepSeek V3.2's lightning indexer on CUDA (kva_indexer_run):
 *
 *   index_logits_kernel: one CTA per tile = (up to G consecutive query
 *     tokens of one request) x (a chunk of up to IDX_CHUNK keys). The
 *     tokens' queries [G, Hi, D] sit in shared memory for the whole tile;
 *     each step loads 128 keys once (FP8_TOKEN codes converted exactly to
 *     the q dtype, their scales aside) and every token reuses them: warp w
 *     computes S = Q [Hi, D] . K^T [D, 32 keys] on tensor cores (mma.sync
 *     m16n8k16, fp32 accumulators, 64 heads per pass), applies ReLU and the
 *     head weights in registers, sums the heads by shuffles and writes the
 *     32 logits (times the key scales) into the workspace row of its token.
 *   index_topk_kernel: one CTA per query token: a radix select on the
 *     logits' order-preserving keys (11 + 11 + 10 bits, shared-memory
 *     histograms, block scans) finds the K-th largest exactly: the first
 *     pass over the row finds the 11-bit bin of the K-th key, a second
 *     gathers the keys above that bin and copies the bin's own into shared
 *     memory, where the other two passes and the pick run (when the bin is
 *     too large, or the K-th key ties with keys left out, every pass reads
 *     the row and the pick ranks the equal ones by position); a bitonic
 *     sort of the K orders them (logit descending, position ascending, NaN
 *     last).
 *
 *   On sm_90a builds and devices, DeepSeek's shape (Hi 64, D 128) takes
 *   the wgmma logits kernel of indexer_wgmma.cu instead (same tiles); its
 *   FP8-q mode over FP8_TOKEN keys with B a multiple of 64 the
 *   warp-specialized kernel there, which also counts the top-K's first
 *   radix pass (the top-K then starts from those counts).
 *   index_qquant_kernel (indexer_qquant.cu): the FP8-q mode
 *     (kva_plan_desc.index_q_quant) quantizes each (token, head) row of q first, into the workspace
 * after the logits: e4m3 codes for the wgmma kernel's e4m3 products over FP8_TOKEN keys, else the
 * codes' exact values in the q dtype for the 16-bit kernels; the row scales go into the head
 * weights.
 *
 * The workspace holds logits [tokens of a pass, max_seq_len] float32; a
 * plan whose tokens need more than IDX_WS_FLOATS runs in several passes
 * (tests lower the limit with kva__cuda_context_indexer_test).
 * Shapes: q f16 or bf16, Hi and D multiples of 16, K <= IDX_TOPK_MAX; the
 * plan refuses the rest (the reference and CPU backends take them).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "indexer.cuh"
#include "prefill_mma.h" /* kva__cuda_prefill_wgmma_ready */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdlib.h>

template <typename M, bool FP8>
__global__ void __launch_bounds__(IDX_WARPS * 32)
    index_logits_kernel(const typename M::elem *q, const float *wts, const char *cache,
                        int64_t block_bytes, const int4 *tiles, const int32_t *tok_n,
                        const int32_t *bt, int32_t stride, int32_t Hi, int32_t D, int32_t B,
                        float *logits, int32_t smax, int32_t tok_base)
{
    typedef typename M::elem elem;
    extern __shared__ __align__(16) unsigned char smem[];
    const int4 tile = tiles[blockIdx.x];
    const int32_t r = tile.x, t0 = tile.y, nt = tile.z, k0 = tile.w;
    const int32_t DP = D + 8;                           /* padded rows: conflict-free ldmatrix */
    elem *qs = (elem *)smem;                            /* [G * Hi, DP] */
    elem *ks = qs + (size_t)nt * Hi * DP;               /* [IDX_KEYS, DP] */
    float *wsm = (float *)(ks + (size_t)IDX_KEYS * DP); /* [G * Hi] */
    float *scs = wsm + nt * Hi;                         /* [IDX_KEYS] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t c8 = D / 8;
    for (int32_t e = tid; e < nt * Hi * c8; e += blockDim.x) {
        const int32_t row = e / c8, c = e - row * c8;
        *(uint4 *)(qs + (size_t)row * DP + c * 8) =
            *(const uint4 *)(q + ((int64_t)t0 * Hi + row) * D + c * 8);
    }
    for (int32_t e = tid; e < nt * Hi; e += blockDim.x)
        wsm[e] = wts[(int64_t)t0 * Hi + e];
    const int32_t n_last = tok_n[t0 + nt - 1];
    const int32_t kend = n_last < k0 + IDX_CHUNK ? n_last : k0 + IDX_CHUNK;
    const int32_t *btr = bt + (int64_t)r * stride;
    const uint32_t qs_u = kva__smem_u32(qs), ks_u = kva__smem_u32(ks);
    for (int32_t kb = k0; kb < kend; kb += IDX_KEYS) {
        __syncthreads();                          /* the previous step's keys are consumed */
        const int32_t cpr = FP8 ? D / 16 : D / 8; /* 16-byte source chunks per key */
        for (int32_t e = tid; e < IDX_KEYS * cpr; e += blockDim.x) {
            const int32_t j = e / cpr, c = e - j * cpr, key = kb + j;
            if (key >= kend)
                continue; /* never stored: those columns are not written */
            const char *base = cache + (int64_t)btr[key / B] * block_bytes;
            const int32_t off = key % B;
            if (FP8) {
                const uint4 w = ld16(base + (int64_t)off * D + c * 16, block_bytes);
                uint4 lo, hi;
                cvt4<M>(w.x, lo.x, lo.y);
                cvt4<M>(w.y, lo.z, lo.w);
                cvt4<M>(w.z, hi.x, hi.y);
                cvt4<M>(w.w, hi.z, hi.w);
                *(uint4 *)(ks + (size_t)j * DP + c * 16) = lo;
                *(uint4 *)(ks + (size_t)j * DP + c * 16 + 8) = hi;
            } else {
                *(uint4 *)(ks + (size_t)j * DP + c * 8) =
                    *(const uint4 *)(base + ((int64_t)off * D + c * 8) * (int64_t)sizeof(elem));
            }
        }
        for (int32_t j = tid; j < IDX_KEYS; j += blockDim.x) {
            const int32_t key = kb + j;
            float s = 1.0f;
            if (FP8 && key < kend)
                s = *(const float *)(cache + (int64_t)btr[key / B] * block_bytes + (int64_t)B * D +
                                     (int64_t)(key % B) * 4);
            scs[j] = s;
        }
        __syncthreads();
        for (int32_t g = 0; g < nt; g++) {
            const int32_t n = tok_n[t0 + g];
            if (kb + warp * 32 >= n)
                continue; /* the warp's keys are all after this token */
            float part[4][2] = {};
            for (int32_t hg = 0; hg < Hi; hg += 64) {
                const int32_t mt = (Hi - hg) / 16 < 4 ? (Hi - hg) / 16 : 4;
                float acc[4][4][4] = {};
                for (int32_t kk = 0; kk < D; kk += 16) {
                    uint32_t b[4][2];
#pragma unroll
                    for (int np = 0; np < 2; np++) {
                        uint32_t x[4];
                        const int32_t row = warp * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                        kva__ldsm_x4(ks_u + (uint32_t)((row * DP + kk + ((lane >> 3) & 1) * 8) * 2),
                                     x);
                        b[2 * np][0] = x[0];
                        b[2 * np][1] = x[1];
                        b[2 * np + 1][0] = x[2];
                        b[2 * np + 1][1] = x[3];
                    }
#pragma unroll
                    for (int mi = 0; mi < 4; mi++) {
                        if (mi < mt) {
                            uint32_t a[4];
                            const int32_t row = g * Hi + hg + mi * 16 + (lane & 15);
                            kva__ldsm_x4(qs_u + (uint32_t)((row * DP + kk + (lane >> 4) * 8) * 2),
                                         a);
#pragma unroll
                            for (int ni = 0; ni < 4; ni++)
                                M::mma(acc[mi][ni], a, b[ni][0], b[ni][1]);
                        }
                    }
                }
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    if (mi < mt) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float wh =
                                wsm[g * Hi + hg + mi * 16 + (lane >> 2) + (e >= 2 ? 8 : 0)];
#pragma unroll
                            for (int ni = 0; ni < 4; ni++) {
                                const float x = acc[mi][ni][e];
                                part[ni][e & 1] += wh * (x < 0.0f ? 0.0f : x); /* NaN kept */
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float v = part[ni][c];
                    v += __shfl_xor_sync(0xffffffffu, v, 4);
                    v += __shfl_xor_sync(0xffffffffu, v, 8);
                    v += __shfl_xor_sync(0xffffffffu, v, 16);
                    part[ni][c] = v;
                }
            if (lane < 4) {
                float *out = logits + (int64_t)(t0 + g - tok_base) * smax;
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int32_t col = warp * 32 + ni * 8 + lane * 2 + c, key = kb + col;
                        if (key < n)
                            out[key] = part[ni][c] * scs[col];
                    }
            }
        }
    }
}

/* ---- top K ---- */

/* Block-wide exclusive scan of v (IDX_TOPK_THREADS threads); *total gets the sum. */
static __device__ __forceinline__ uint32_t block_scan(uint32_t v, uint32_t *sw, uint32_t *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    if (lane == 31)
        sw[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint32_t s = sw[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o)
                s += y;
        }
        sw[32 + lane] = s; /* inclusive warp offsets */
    }
    __syncthreads();
    const uint32_t res = x - v + (warp > 0 ? sw[32 + warp - 1] : 0u);
    *total = sw[32 + 31];
    __syncthreads(); /* sw may be reused */
    return res;
}

/* Appends v to dst at the next free place of counter *ctr for every thread
 * of the warp whose take is set (one atomic per warp). */
static __device__ __forceinline__ void warp_append(bool take, unsigned long long v,
                                                   unsigned long long *dst, uint32_t *ctr)
{
    const int lane = threadIdx.x & 31;
    const unsigned bal = __ballot_sync(0xffffffffu, take);
    uint32_t at = 0;
    if (lane == 0 && bal)
        at = atomicAdd(ctr, (uint32_t)__popc(bal));
    at = __shfl_sync(0xffffffffu, at, 0) + (uint32_t)__popc(bal & ((1u << lane) - 1u));
    if (take)
        dst[at] = v;
}

/* The shared state of one token's radix select. */
struct topk_sel {
    uint32_t bin, above, eq;
};

/* One radix pass (p = 0, 1, 2: bits 31-21, 20-10, 9-0) over the keys that
 * match prefix under mask: the row's n logits (BUF false) or the n
 * candidates of buf (BUF true: keys in the high words); given (p = 0
 * only, or NULL): the first pass's counts [IDX_HIST_BINS], as the
 * warp-specialized logits kernel counted them, in place of counting. Finds
 * the bin of the need-th largest; on return prefix / mask include it, need
 * counts what is still to take inside it and sel->eq holds the bin's count. */
template <bool BUF>
static __device__ void radix_pass(const float *row, const unsigned long long *buf, int32_t n, int p,
                                  uint32_t &prefix, uint32_t &mask, int32_t &need, uint32_t *hist,
                                  uint32_t *sw, topk_sel *sel, const uint32_t *given)
{
    const int tid = threadIdx.x, lane = tid & 31;
    const int shift = p == 0 ? 21 : p == 1 ? 10 : 0;
    const uint32_t nb = p < 2 ? 2048u : 1024u;
    for (uint32_t i = tid; i < nb; i += blockDim.x)
        hist[i] = given ? given[i] : 0u;
    __syncthreads();
    /* Logits crowd into few bins (above all in the first pass): the lanes
     * of a warp that share a bin add once, by a leader. */
    for (int32_t base = 0; !given && base < n; base += blockDim.x) {
        const int32_t j = base + tid;
        uint32_t bin = 0xffffffffu;
        if (j < n) {
            const uint32_t key = BUF ? (uint32_t)(buf[j] >> 32) : kva__index_order_key(row[j]);
            if ((key & mask) == prefix)
                bin = (key >> shift) & (nb - 1);
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin != 0xffffffffu && lane == __ffs(peers) - 1)
            atomicAdd(&hist[bin], (uint32_t)__popc(peers));
    }
    __syncthreads();
    /* Thread i holds bins nb-1-2i and nb-2-2i: counts from the top. */
    const uint32_t i2 = 2u * tid;
    const uint32_t c0 = i2 < nb ? hist[nb - 1 - i2] : 0u;
    const uint32_t c1 = i2 + 1 < nb ? hist[nb - 2 - i2] : 0u;
    uint32_t total;
    const uint32_t e0 = block_scan(c0 + c1, sw, &total);
    if (e0 < (uint32_t)need && e0 + c0 >= (uint32_t)need) {
        sel->bin = nb - 1 - i2;
        sel->above = e0;
    } else if (e0 + c0 < (uint32_t)need && e0 + c0 + c1 >= (uint32_t)need) {
        sel->bin = nb - 2 - i2;
        sel->above = e0 + c0;
    }
    __syncthreads();
    need -= (int32_t)sel->above;
    prefix |= sel->bin << shift;
    mask |= (nb - 1) << shift;
    if (tid == 0)
        sel->eq = hist[sel->bin];
    __syncthreads();
}

/*
 * One CTA per token. The K-th largest order key comes from a radix select
 * (bits 31-21, 20-10, 9-0). Usually the first pass's bin of the K-th key
 * holds few keys: a second pass over the row then appends every key of a
 * higher bin to cand and copies those of that bin into buf (dynamic shared
 * memory, IDX_TOPK_BUF entries), and the last two radix passes and the
 * final pick run over buf alone (two passes over the row in all). When
 * that bin is larger than buf, or the boundary tie needs position ranks,
 * or full is set (tests, benchmarks), every pass reads the whole row.
 * ghist ([tokens of the pass, IDX_HIST_BINS], or NULL): the first pass's
 * counts from the warp-specialized logits kernel, which then reads no row
 * (unless full).
 */
__global__ void __launch_bounds__(IDX_TOPK_THREADS)
    index_topk_kernel(const float *logits, int32_t smax, int32_t tok_base, const int32_t *tok_n,
                      int32_t K, int32_t *indices, int64_t istride, int32_t *topk_length, int full,
                      const uint32_t *ghist)
{
    /* The row is read from the workspace (mostly L2) in each pass: keeping
     * it in shared memory (128 KB at 32k keys, one CTA per SM) measured
     * slower on the H100 (bench/results/h100_2026-11-27_indexer.txt). */
    __shared__ uint32_t hist[2048];
    __shared__ unsigned long long cand[IDX_TOPK_MAX];
    __shared__ uint32_t sw[64];
    __shared__ uint32_t s_cnt, s_nbuf;
    __shared__ topk_sel sel;
    extern __shared__ unsigned long long buf[]; /* [IDX_TOPK_BUF] */
    const int32_t t = tok_base + blockIdx.x, n = tok_n[t];
    const float *row = logits + (int64_t)blockIdx.x * smax;
    const int tid = threadIdx.x;
    const int32_t m = n < K ? n : K;
    if (n <= K) {
        for (int32_t j = tid; j < n; j += blockDim.x)
            cand[j] =
                (unsigned long long)kva__index_order_key(row[j]) << 32 | (uint32_t) ~(uint32_t)j;
    } else {
        uint32_t prefix = 0, mask = 0;
        int32_t need = K;
        radix_pass<false>(row, NULL, n, 0, prefix, mask, need, hist, sw, &sel,
                          ghist && !full ? ghist + (int64_t)blockIdx.x * IDX_HIST_BINS : NULL);
        const bool small = !full && sel.eq <= IDX_TOPK_BUF;
        if (tid == 0)
            s_cnt = s_nbuf = 0;
        __syncthreads();
        if (small) {
            /* Keys above the bin go to cand (K - need of them), the bin's to buf. */
            for (int32_t base = 0; base < n; base += blockDim.x) {
                const int32_t j = base + tid;
                const uint32_t key = j < n ? kva__index_order_key(row[j]) : 0u;
                const unsigned long long v =
                    (unsigned long long)key << 32 | (uint32_t) ~(uint32_t)j;
                warp_append(j < n && (key & mask) > prefix, v, cand, &s_cnt);
                warp_append(j < n && (key & mask) == prefix, v, buf, &s_nbuf);
            }
            __syncthreads();
            const int32_t nbuf = (int32_t)s_nbuf;
            radix_pass<true>(NULL, buf, nbuf, 1, prefix, mask, need, hist, sw, &sel, NULL);
            radix_pass<true>(NULL, buf, nbuf, 2, prefix, mask, need, hist, sw, &sel, NULL);
            if (sel.eq == (uint32_t)need) { /* every key equal to the K-th is taken */
                for (int32_t base = 0; base < nbuf; base += blockDim.x) {
                    const int32_t i = base + tid;
                    const bool ok = i < nbuf && (uint32_t)(buf[i] >> 32) >= prefix;
                    warp_append(ok, ok ? buf[i] : 0ull, cand, &s_cnt);
                }
            } else if (tid == 0) {
                s_cnt = 0; /* ranks by position: the full pick below */
            }
            __syncthreads();
        } else {
            radix_pass<false>(row, NULL, n, 1, prefix, mask, need, hist, sw, &sel, NULL);
            radix_pass<false>(row, NULL, n, 2, prefix, mask, need, hist, sw, &sel, NULL);
        }
        /* prefix = the K-th largest key; K - need keys are above it. When
         * every key equal to it is taken (no tie at the boundary, the usual
         * case), all are appended in any order (the sort below orders them);
         * else the equal ones are ranked by position, lowest first. */
        const int32_t gt = K - need;
        const bool all_eq = sel.eq == (uint32_t)need;
        if (!small || !all_eq) {
            uint32_t run = 0;
            for (int32_t base = 0; base < n; base += blockDim.x) {
                const int32_t j = base + tid;
                const uint32_t key = j < n ? kva__index_order_key(row[j]) : 0u;
                const unsigned long long v =
                    (unsigned long long)key << 32 | (uint32_t) ~(uint32_t)j;
                warp_append(j < n && (key > prefix || (all_eq && key == prefix)), v, cand, &s_cnt);
                if (!all_eq) {
                    const uint32_t eq = j < n && key == prefix;
                    uint32_t total;
                    const uint32_t rank = run + block_scan(eq, sw, &total);
                    if (eq && rank < (uint32_t)need)
                        cand[gt + rank] = v;
                    run += total;
                }
            }
        }
    }
    __syncthreads();
    int32_t P = 1;
    while (P < m)
        P <<= 1;
    for (int32_t i = m + tid; i < P; i += blockDim.x)
        cand[i] = 0ull; /* below every real entry */
    __syncthreads();
    for (int32_t k = 2; k <= P; k <<= 1)
        for (int32_t j = k >> 1; j > 0; j >>= 1) {
            /* Pair q compares i (q with a 0 inserted at j's bit) and i + j. */
            for (int32_t q = tid; q < P / 2; q += blockDim.x) {
                const int32_t i = 2 * q - (q & (j - 1)), x = i + j;
                const unsigned long long a = cand[i], b = cand[x];
                const bool desc = (i & k) == 0;
                if (desc ? a < b : a > b) {
                    cand[i] = b;
                    cand[x] = a;
                }
            }
            __syncthreads();
        }
    int32_t *out = indices + (int64_t)t * istride;
    for (int32_t k = tid; k < K; k += blockDim.x)
        out[k] = k < m ? (int32_t) ~(uint32_t)cand[k] : -1;
    if (topk_length && tid == 0)
        topk_length[t] = m;
}

/* ---- plan and run ---- */

template <typename M, bool FP8> static void *logits_fn()
{
    return (void *)index_logits_kernel<M, FP8>;
}

/* The logits kernel of a q dtype, key format (fp8: FP8_TOKEN), kernel
 * family (wg: sm_90a wgmma) and FP8-q mode (qf8: e4m3 products, wgmma over
 * FP8_TOKEN keys only; elsewhere the FP8-q mode runs the 16-bit kernels on
 * the codes' exact values). */
static void *pick(kva_dtype q_dtype, int fp8, int wg, int qf8)
{
    if (wg)
        return kva__cuda_index_wg_fn(q_dtype, fp8, qf8);
    if (q_dtype == KVA_DTYPE_BF16)
        return fp8 ? logits_fn<kva__mma_bf16, true>() : logits_fn<kva__mma_bf16, false>();
    return fp8 ? logits_fn<kva__mma_f16, true>() : logits_fn<kva__mma_f16, false>();
}

static size_t smem_bytes(int32_t G, int32_t Hi, int32_t D)
{
    return ((size_t)G * Hi + IDX_KEYS) * (size_t)(D + 8) * 2 + ((size_t)G * Hi + IDX_KEYS) * 4;
}

extern "C" void kva__cuda_indexer_plan_free(kva__cuda_index_plan *ip)
{
    if (!ip)
        return;
    if (ip->dev)
        cudaFree(ip->dev);
    free(ip->pass);
    free(ip);
}

extern "C" kva_status kva__cuda_indexer_plan_build(kva_context *ctx, kva_plan *plan)
{
    static const char fn[] = "kva_plan_create";
    const kva_plan_desc *d = &plan->d;
    const int32_t Hi = d->num_heads, D = d->head_dim, K = d->sparse_topk, R = d->num_requests;
    if (d->q_dtype == KVA_DTYPE_F32 || Hi % 16 != 0 || D % 16 != 0 || K > IDX_TOPK_MAX)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: the CUDA indexer takes f16/bf16 q, num_heads and head_dim multiples "
                         "of 16 and sparse_topk <= %d (got %s, %d, %d, %d); the reference and CPU "
                         "backends take the rest",
                         fn, IDX_TOPK_MAX, kva_dtype_name(d->q_dtype), (int)Hi, (int)D, (int)K);
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    /* DeepSeek's shape takes the sm_90a kernel where the build and device
     * have it (tests may force the mma.sync one). */
    const int wg = Hi == IDX_WG_HI && D == IDX_WG_D && !(st->index_no_wgmma & 1) &&
                   kva__cuda_prefill_wgmma_ready();
    int32_t G = wg ? IDX_WG_G : IDX_MAX_G;
    while (!wg && G > 1 && smem_bytes(G, Hi, D) > IDX_SMEM_MAX)
        G--;
    if (!wg && smem_bytes(G, Hi, D) > IDX_SMEM_MAX)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: num_heads %d x head_dim %d: the CUDA indexer's queries do not fit "
                         "its shared memory",
                         fn, (int)Hi, (int)D);
    KVA_CUDA_TRY(cudaSetDevice(ctx->device_id));
    const int32_t T = plan->info.num_tokens;
    const int32_t smax = plan->info.max_seq_len > 0 ? plan->info.max_seq_len : 1;
    /* Tiles, grouped into passes of at most IDX_WS_FLOATS logits (or the
     * test's limit, kva__cuda_context_indexer_test). */
    const size_t ws_floats =
        st->index_pass_floats > 0 ? (size_t)st->index_pass_floats : IDX_WS_FLOATS;
    const int64_t per_pass =
        (int64_t)(ws_floats / (size_t)smax) > G ? (int64_t)(ws_floats / (size_t)smax) : G;
    int64_t ntiles = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q0 = plan->query_start_loc[r], ql = plan->query_start_loc[r + 1] - q0;
        const int32_t s = plan->seq_lens[r];
        for (int32_t g0 = 0; g0 < ql; g0 += G) {
            const int32_t nt = ql - g0 < G ? ql - g0 : G, nmax = s - ql + g0 + nt;
            ntiles += (nmax + IDX_CHUNK - 1) / IDX_CHUNK;
        }
    }
    if (ntiles > INT32_MAX / 2)
        return kva__fail(KVA_STATUS_UNSUPPORTED, "%s: too many indexer tiles (%lld)", fn,
                         (long long)ntiles);
    const int64_t bt_n = (int64_t)R * d->block_table_stride;
    const size_t bytes = (size_t)ntiles * sizeof(int4) + ((size_t)T + (size_t)bt_n + 1) * 4;
    char *host = (char *)malloc(bytes);
    kva__cuda_index_plan *ip = (kva__cuda_index_plan *)calloc(1, sizeof *ip);
    int32_t *pass = (int32_t *)malloc(((size_t)T + 2) * 2 * sizeof(int32_t));
    if (!host || !ip || !pass) {
        free(host);
        free(ip);
        free(pass);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int4 *tiles = (int4 *)host;
    int32_t *tok_n = (int32_t *)(tiles + ntiles);
    int32_t *bt = tok_n + T;
    int32_t nt_done = 0, np = 0, pass_t0 = 0;
    int64_t longest = 0;
    pass[0] = 0;
    pass[1] = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q0 = plan->query_start_loc[r], ql = plan->query_start_loc[r + 1] - q0;
        const int32_t s = plan->seq_lens[r];
        for (int32_t i = 0; i < ql; i++)
            tok_n[q0 + i] = s - ql + i + 1;
        for (int32_t g0 = 0; g0 < ql; g0 += G) {
            const int32_t nt = ql - g0 < G ? ql - g0 : G, nmax = s - ql + g0 + nt;
            if (q0 + g0 + nt - pass_t0 > per_pass) { /* start a new pass here */
                np++;
                pass_t0 = q0 + g0;
                pass[2 * np] = nt_done;
                pass[2 * np + 1] = pass_t0;
            }
            for (int32_t k0 = 0; k0 < nmax; k0 += IDX_CHUNK)
                tiles[nt_done++] = make_int4(r, q0 + g0, nt, k0);
            if (q0 + g0 + nt - pass_t0 > longest)
                longest = q0 + g0 + nt - pass_t0;
        }
    }
    np++;
    pass[2 * np] = nt_done;
    pass[2 * np + 1] = T;
    if (bt_n > 0)
        memcpy(bt, plan->block_table, (size_t)bt_n * 4);
    ip->pass = pass;
    ip->num_passes = np;
    ip->num_tiles = nt_done;
    ip->G = G;
    ip->smax = smax;
    ip->stride = d->block_table_stride;
    ip->wg = wg;
    ip->qf8 = d->index_q_quant == KVA_QUANT_FP8_TOKEN;
    ip->topk_full = st->index_topk_full;
    ip->smem = wg ? kva__cuda_index_wg_smem() : smem_bytes(G, Hi, D);
    /* The FP8-q mode over FP8_TOKEN keys (the cache's format is known at
     * run time) with pages of 64 keys inside a block: the warp-specialized
     * kernel, unless tests force the other wgmma one. */
    if (wg && ip->qf8 && d->block_size % 64 == 0 && !(st->index_no_wgmma & 4)) {
        ip->tmap_encode = kva__cuda_index_ws_encoder();
        if (cudaDeviceGetAttribute(&ip->num_sms, cudaDevAttrMultiProcessorCount, ctx->device_id) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            ip->num_sms = 0;
        }
        if (st->index_no_wgmma & 8)
            ip->num_sms = 2;
        ip->ws = ip->tmap_encode != NULL && ip->num_sms > 0;
    }
    kva__cuda_plan *cp = (kva__cuda_plan *)calloc(1, sizeof *cp);
    if (!cp) {
        free(host);
        kva__cuda_indexer_plan_free(ip);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    cp->index = ip;
    plan->device = cp; /* released by cuda_plan_release on any failure below */
    cudaError_t e = cudaMalloc(&ip->dev, bytes);
    if (e == cudaSuccess)
        e = cudaMemcpy(ip->dev, host, bytes, cudaMemcpyHostToDevice);
    free(host);
    if (e == cudaSuccess) {
        /* The smem limit of every kernel this plan may run: the largest any
         * plan uses, so a plan made later never lowers an earlier one's. */
        const int lim = wg ? (int)ip->smem : IDX_SMEM_MAX;
        for (int i = 0; i < 3 && e == cudaSuccess; i++)
            e = cudaFuncSetAttribute(pick(d->q_dtype, i > 0, wg, i == 2 && ip->qf8),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, lim);
        if (e == cudaSuccess && ip->ws)
            e = cudaFuncSetAttribute(kva__cuda_index_ws_fn(),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)kva__cuda_index_ws_smem());
        if (e == cudaSuccess) /* its candidate buffer, past the 48 KB default */
            e = cudaFuncSetAttribute(index_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)(IDX_TOPK_BUF * sizeof(unsigned long long)));
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: indexer plan upload: %s", fn,
                         cudaGetErrorString(e));
    }
    ip->tiles = (const int4 *)ip->dev;
    ip->tok_n = (const int32_t *)(ip->tiles + ntiles);
    ip->bt = ip->tok_n + T;
    /* Logits [longest, smax], then for the FP8-q mode q's codes [T, Hi, D]
     * (up to 2 bytes each) and the scaled weights [T, Hi]. */
    size_t ws = (size_t)longest * (size_t)smax * sizeof(float);
    if (ip->qf8) {
        ip->qc_off = (ws + 255) & ~(size_t)255;
        ip->wq_off = ip->qc_off + (((size_t)T * Hi * D * 2 + 255) & ~(size_t)255);
        ws = ip->wq_off + (size_t)T * Hi * sizeof(float);
    }
    if (ip->ws) { /* the first radix pass's counts [longest, IDX_HIST_BINS] */
        ip->hist_off = (ws + 255) & ~(size_t)255;
        ws = ip->hist_off + (size_t)longest * IDX_HIST_BINS * 4;
    }
    KVA_TRY(kva__context_reserve_workspace(ctx, ws));
    plan->workspace_bytes = ws;
    plan->info.num_work_items = nt_done;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_indexer_test(kva_context *ctx, int64_t pass_floats,
                                                     int flags)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (pass_floats < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_indexer_test: pass_floats = %lld (>= 0)",
                         (long long)pass_floats);
    kva__cuda_state *st = (kva__cuda_state *)ctx->state;
    st->index_pass_floats = pass_floats;
    /* Bits 0, 2, 3 of flags (the logits kernels) stay in index_no_wgmma. */
    st->index_no_wgmma = flags & 13;
    st->index_topk_full = (flags & 2) != 0;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                                        const float *weights, const kva_cache *cache,
                                        int32_t *indices, int64_t indices_stride,
                                        int32_t *topk_length)
{
    return kva__cuda_indexer_parts(ctx, plan, q, weights, cache, indices, indices_stride,
                                   topk_length, 3);
}

extern "C" kva_status kva__cuda_indexer_parts(kva_context *ctx, const kva_plan *plan, const void *q,
                                              const float *weights, const kva_cache *cache,
                                              int32_t *indices, int64_t indices_stride,
                                              int32_t *topk_length, int parts)
{
    static const char fn[] = "kva_indexer_run";
    const kva__cuda_index_plan *ip = ((const kva__cuda_plan *)plan->device)->index;
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: cache lives on device %d but the context uses %d", fn,
                         (int)cache->device_id, (int)ctx->device_id);
    if ((uintptr_t)q % 16 != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: q = %p: the CUDA indexer reads q in 16-byte vectors (align it)", fn,
                         q);
    const kva_plan_desc *d = &plan->d;
    const int fp8 = cache->desc.quant == KVA_QUANT_FP8_TOKEN;
    const int64_t bb = cache->k_block_elems * (int64_t)cache->elem_size;
    cudaStream_t s = (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
    float *ws = (float *)ctx->workspace;
    /* The FP8-q mode: q quantized once for every pass (part of the logits
     * step); the logits kernels then read the codes and scaled weights. */
    const int qf8 = ip->qf8 && ip->wg && fp8; /* e4m3 x e4m3 products */
    if (ip->qf8 && (parts & 1)) {
        void *qc = (char *)ctx->workspace + ip->qc_off;
        float *wq = (float *)((char *)ctx->workspace + ip->wq_off);
        const int64_t rows = (int64_t)plan->info.num_tokens * d->num_heads;
        const int32_t D = d->head_dim;
        kva__cuda_index_qquant(d->q_dtype, qf8, q, weights, rows, D, qc, wq, s);
        KVA_CUDA_LAUNCHED("index_qquant_kernel");
        q = qc;
        weights = wq;
    }
    for (int32_t p = 0; p < ip->num_passes; p++) {
        const int32_t a = ip->pass[2 * p], b = ip->pass[2 * p + 2];
        const int32_t t0 = ip->pass[2 * p + 1], t1 = ip->pass[2 * p + 3];
        uint32_t *ghist = NULL; /* the first radix pass's counts (warp-specialized kernel) */
        if (qf8 && ip->ws)
            ghist = (uint32_t *)((char *)ctx->workspace + ip->hist_off);
        if ((parts & 1) && b > a && ghist) {
            KVA_CUDA_TRY(cudaMemsetAsync(ghist, 0, (size_t)(t1 - t0) * IDX_HIST_BINS * 4, s));
            const kva__cuda_index_ws_args wa = {ip->tmap_encode,
                                                q,
                                                weights,
                                                (const char *)cache->k,
                                                bb,
                                                cache->desc.num_blocks,
                                                d->block_size,
                                                plan->info.num_tokens,
                                                ip->tiles + a,
                                                b - a,
                                                ip->tok_n,
                                                ip->bt,
                                                ip->stride,
                                                ws,
                                                ip->smax,
                                                t0,
                                                ghist,
                                                ip->num_sms};
            if (!kva__cuda_index_ws_launch(&wa, s))
                return kva__fail(KVA_STATUS_DEVICE_ERROR,
                                 "%s: the driver refused the indexer's tensor maps (cache %p, "
                                 "%d blocks of %d tokens)",
                                 fn, cache->k, (int)cache->desc.num_blocks, (int)d->block_size);
            KVA_CUDA_LAUNCHED("index_logits_ws_kernel");
        }
        if ((parts & 1) && b > a && !ghist) {
            void *args[] = {(void *)&q,
                            (void *)&weights,
                            (void *)&cache->k,
                            (void *)&bb,
                            (void *)&ip->tiles,
                            (void *)&ip->tok_n,
                            (void *)&ip->bt,
                            (void *)&ip->stride,
                            (void *)&d->num_heads,
                            (void *)&d->head_dim,
                            (void *)&d->block_size,
                            (void *)&ws,
                            (void *)&ip->smax,
                            (void *)&t0};
            const int4 *tiles = ip->tiles + a;
            args[4] = (void *)&tiles;
            KVA_CUDA_TRY(cudaLaunchKernel(
                pick(d->q_dtype, fp8, ip->wg, qf8), dim3((unsigned)(b - a)),
                dim3(ip->wg ? IDX_WG_THREADS : IDX_WARPS * 32), args, ip->smem, s));
        }
        if ((parts & 2) && t1 > t0) {
            index_topk_kernel<<<(unsigned)(t1 - t0), IDX_TOPK_THREADS,
                                IDX_TOPK_BUF * sizeof(unsigned long long), s>>>(
                ws, ip->smax, t0, ip->tok_n, d->sparse_topk, indices, indices_stride, topk_length,
                ip->topk_full, ghist);
            KVA_CUDA_LAUNCHED("index_topk_kernel");
        }
    }
    return KVA_STATUS_OK;
}
