/*
 * mla_run.cu - kva_mla_run on the CUDA backend: the layer-level MLA of a
 * mixed batch, the path chosen per request by the plan's decode threshold.
 *
 * Absorbed requests (q_len <= threshold; their Td tokens packed in the order
 * of the batch):
 *   1. q_abs [Td, H, Dc + Dr] = [q_nope . W_UK[h], q_pe]   (mla_gemm.cu)
 *   2. the absorbed decode kernel the plan chose (mla_decode_{mma,wgmma}.cu,
 *      called unchanged) over q_abs, with a packed query_start_loc in which
 *      the other requests have no rows; the partition of cuda_plan_build
 *      holds only these requests' items; split merge as kva_attention_run's
 *   3. out[t, h] = out_latent [Td, H, Dc] . W_UV[h], scattered to the batch's
 *      token rows (and the LSE likewise).
 * Compute-friendly requests (vLLM's chunked-context loop):
 *   round 0: the keys of the new tokens (the last min(q_len, seq_len) keys)
 *     are decompressed, K = [c_kv . W_UK^T, k_pe] (Dn + Dr) and
 *     V = c_kv . W_UV (Dv) per head, into the workspace as a paged cache of
 *     64-key blocks with one kv head per query head, and the tensor-core
 *     prefill (prefill_mma.h: wgmma at D 192 / Dv 128 on sm_90a) runs with
 *     the plan's mask;
 *   rounds 1..: the cached context (the keys before those) in chunks of C
 *     keys per request, non-causal (every query row sees all of them);
 *   each round's out and LSE are merged into an fp32 accumulator by LSE, and
 *   the last step writes out (a batch whose requests have no cached context
 *   has one round, written straight into out).
 * An FP8 E4M3 latent cache (one k_scale s): the absorbed requests run the
 * decode kernel's FP8 instantiation (s folded into the logits and the latent
 * output); the compute-friendly rounds decompress with the GEMM's FP8 A
 * format (codes converted exactly in shared memory, s applied to the fp32
 * result before its rounding) and copy k_pe as code * s, so K and V hold the
 * dequantized values rounded once, as from a 16-bit cache.
 * Everything is launched on the context's stream without a host sync; the
 * metadata (packed query_start_loc, token maps, per-round lengths, block
 * tables, tiles, latent row lists) was uploaded into the workspace by
 * kva_plan_create, so a captured graph replays plans of the same rounds.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_run.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of decompressed K and V (all heads) one context round may hold
 * across its requests; the new tokens' keys of round 0 are not bounded by
 * it (as vLLM, they are decompressed whole). */
#define KVA_CUDA_MLA_CHUNK_BYTES ((size_t)256 << 20)
/* Key rows per block of the decompressed workspace cache. */
#define KVA_CUDA_MLA_WS_BLOCK 64

static size_t al256(size_t x)
{
    return (x + 255u) & ~(size_t)255u;
}

/* ---- small kernels: LSE merge, final store, LSE scatter ---- */

template <typename T> __device__ __forceinline__ float ld_f(const T *p);
template <> __device__ __forceinline__ float ld_f(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
template <> __device__ __forceinline__ float ld_f(const __half *p)
{
    return __half2float(*p);
}
template <typename T> __device__ __forceinline__ void st_f(T *p, float x);
template <> __device__ __forceinline__ void st_f(__nv_bfloat16 *p, float x)
{
    *p = __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ void st_f(__half *p, float x)
{
    *p = __float2half_rn(x);
}

/* One warp per (compact prefill row c, head h): mode 0 copies round 0's
 * part / plse into acc / lacc; mode 1 merges a context round's part into
 * them where the row's request has keys in the round (seq[preq[c]] > 0): a
 * NaN lse in either makes the row NaN (out and lse), both -inf give 0 and
 * -inf, as kva__lse_merge (lse_merge.cuh); mode 2 stores acc to out and
 * lacc to lse (if not NULL). */
template <typename T>
__global__ void merge_kernel(int mode, int32_t Tp, int32_t H, int32_t Dv, const int32_t *ptok,
                             const int32_t *preq, const int32_t *seq, const T *part,
                             const float *plse, float *acc, float *lacc, T *out, float *lse)
{
    const int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (int64_t)Tp * H)
        return;
    const int32_t c = (int32_t)(w / H), h = (int32_t)(w % H);
    const int64_t t = ptok[c];
    float *a = acc + ((int64_t)c * H + h) * Dv;
    const T *pp = part + (t * H + h) * Dv;
    if (mode == 0) {
        for (int e = lane; e < Dv; e += 32)
            a[e] = ld_f(pp + e);
        if (lane == 0)
            lacc[(int64_t)c * H + h] = plse[t * H + h];
    } else if (mode == 1) {
        if (seq[preq[c]] <= 0)
            return;
        const float l1 = lacc[(int64_t)c * H + h], l2 = plse[t * H + h];
        /* fmaxf drops a NaN: a NaN lse (a NaN score in either part) beside
         * a part of lse -inf would give m = -inf, out 0 and lse -inf. */
        const bool nan = l1 != l1 || l2 != l2;
        const float m = fmaxf(l1, l2);
        float w1 = 0.f, w2 = 0.f, l = nan ? NAN : -INFINITY;
        if (!nan && m != -INFINITY) {
            w1 = expf(l1 - m), w2 = expf(l2 - m);
            l = m + logf(w1 + w2);
            const float inv = 1.f / (w1 + w2);
            w1 *= inv, w2 *= inv;
        }
        for (int e = lane; e < Dv; e += 32)
            a[e] = nan ? NAN : m == -INFINITY ? 0.f : a[e] * w1 + ld_f(pp + e) * w2;
        __syncwarp();
        if (lane == 0)
            lacc[(int64_t)c * H + h] = l;
    } else {
        T *o = out + (t * H + h) * Dv;
        for (int e = lane; e < Dv; e += 32)
            st_f(o + e, a[e]);
        if (lane == 0 && lse)
            lse[t * H + h] = lacc[(int64_t)c * H + h];
    }
}

/* lse[tok[c], h] = src[c, h] for c < M. */
__global__ void lse_scatter_kernel(int32_t M, int32_t H, const int32_t *tok, const float *src,
                                   float *lse)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= (int64_t)M * H)
        return;
    lse[(int64_t)tok[i / H] * H + i % H] = src[i];
}

/* ---- plan ---- */

extern "C" kva_status kva__cuda_mla_split(const kva_plan *plan, uint8_t *skip)
{
    const kva_plan_desc *d = &plan->d;
    int64_t Tp = 0;
    for (int32_t r = 0; r < d->num_requests; r++) {
        const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        skip[r] = q > d->decode_threshold;
        Tp += skip[r] ? q : 0;
    }
    const int32_t Dq = d->mla_qk_nope_head_dim + d->head_dim - d->head_dim_v;
    const int32_t Dv = d->mla_v_head_dim;
    if (Tp > 0 && !kva__cuda_prefill_supported(Dq, Dv, d->q_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_plan_create: the CUDA kva_mla_run runs compute-friendly requests "
                         "(q_len > decode_threshold = %d) on the tensor-core prefill, which takes "
                         "Dn + Dr = %d, Dv = %d only as D 192 / Dv 128 (sm_90a) or D = Dv in "
                         "{64, 128, 256}; this batch has %lld such tokens (raise decode_threshold "
                         "or use the reference / CPU backend)",
                         (int)d->decode_threshold, (int)Dq, (int)Dv, (long long)Tp);
    return KVA_STATUS_OK;
}

extern "C" void kva__cuda_mla_plan_free(kva__cuda_mla_plan *mp)
{
    if (!mp)
        return;
    free(mp->round);
    free(mp);
}

/* The keys [*j0, *j1) request r attends in round k of the compute-friendly
 * path (context chunks of C keys); 0 if it has none there (absorbed
 * requests, and context rounds past its context). Round 0: the last
 * min(q_len, seq_len) keys, those of the new tokens (any request above the
 * threshold takes part, even with none). */
static int round_keys(const kva_plan *plan, int32_t r, int32_t k, int32_t C, int64_t *j0,
                      int64_t *j1)
{
    const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
    const int32_t s = plan->seq_lens[r], nq = q < s ? q : s, ctxr = s - nq;
    *j0 = *j1 = 0;
    if (q <= plan->d.decode_threshold)
        return 0;
    if (k == 0) {
        *j0 = ctxr, *j1 = s;
        return 1;
    }
    *j0 = (int64_t)(k - 1) * C;
    *j1 = *j0 + C < ctxr ? *j0 + C : ctxr;
    return *j1 > *j0;
}

/* The longest q_len the MLA decode kernel sees: every request's for a
 * kernel-level plan, the absorbed requests' (q_len <= decode_threshold) for
 * a layer-level one (kva_mla_run sends the others to the prefill; 1 if none). */
extern "C" int32_t kva__cuda_mla_decode_q_len(const kva_plan *plan)
{
    if (plan->d.mla_qk_nope_head_dim == 0)
        return plan->info.max_q_len;
    int32_t mq = 1;
    for (int32_t r = 0; r < plan->d.num_requests; r++) {
        const int32_t q = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
        mq = q <= plan->d.decode_threshold && q > mq ? q : mq;
    }
    return mq;
}

extern "C" kva_status kva__cuda_context_mla_chunk(kva_context *ctx, int32_t keys)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (keys < 0 || keys > (1 << 20) || keys % 64 != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_mla_chunk: keys = %d (a multiple of 64, 0..2^20)",
                         (int)keys);
    ((kva__cuda_state *)ctx->state)->mla_chunk_keys = keys;
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_context_mla_gemm(kva_context *ctx, int mma)
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (mma < 0 || mma > 2)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_context_mla_gemm: mma = %d (0, 1, 2)", mma);
    ((kva__cuda_state *)ctx->state)->mla_gemm_mma = mma;
    return KVA_STATUS_OK;
}

/* Bump allocator of byte offsets (256-byte aligned). */
static size_t take(size_t *o, size_t bytes)
{
    const size_t at = *o;
    *o = al256(*o + bytes);
    return at;
}

extern "C" kva_status kva__cuda_mla_plan_build(kva_context *ctx, const kva_plan *plan, size_t base,
                                               int32_t chunk_keys,
                                               kva_status (*reserve)(kva_context *, size_t),
                                               void *stream, kva__cuda_mla_plan **out)
{
    *out = NULL;
    const kva_plan_desc *d = &plan->d;
    const int32_t R = d->num_requests, H = d->num_heads, T = plan->info.num_tokens;
    const int32_t Dc = d->head_dim_v, Dr = d->head_dim - d->head_dim_v;
    const int32_t Dn = d->mla_qk_nope_head_dim, Dv = d->mla_v_head_dim, Dq = Dn + Dr;
    const int32_t *qsl = plan->query_start_loc, *sl = plan->seq_lens;
    const int32_t WB = KVA_CUDA_MLA_WS_BLOCK;

    /* Requests: absorbed (q_len <= threshold), compute-friendly (the rest). */
    int32_t Td = 0, Tp = 0, Pctx = 0, stride0 = 1;
    int64_t max_ctx = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = qsl[r + 1] - qsl[r];
        if (q <= d->decode_threshold) {
            Td += q;
            continue;
        }
        Tp += q;
        const int32_t nq = q < sl[r] ? q : sl[r], ctxr = sl[r] - nq;
        const int32_t nb = (nq + WB - 1) / WB;
        stride0 = nb > stride0 ? nb : stride0;
        Pctx += ctxr > 0;
        max_ctx = ctxr > max_ctx ? ctxr : max_ctx;
    }
    int32_t C = chunk_keys;
    if (C <= 0) {
        const size_t per_key = (size_t)H * (size_t)(Dq + Dv) * 2u;
        const size_t keys = KVA_CUDA_MLA_CHUNK_BYTES / per_key / (size_t)(Pctx > 0 ? Pctx : 1);
        C = keys / WB * WB > (size_t)WB ? (int32_t)(keys / WB * WB) : WB;
    }
    const int32_t rounds_ctx = (int32_t)((max_ctx + C - 1) / C);
    const int32_t rounds = Tp > 0 ? 1 + rounds_ctx : 0;

    kva__cuda_mla_plan *mp = (kva__cuda_mla_plan *)calloc(1, sizeof *mp);
    if (mp)
        mp->round = (kva__cuda_mla_round *)calloc((size_t)(rounds > 0 ? rounds : 1),
                                                  sizeof(kva__cuda_mla_round));
    uint8_t *use = (uint8_t *)calloc((size_t)(R > 0 ? R : 1), 1);
    if (!mp || !mp->round || !use) {
        kva__cuda_mla_plan_free(mp);
        free(use);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
    }
    mp->Dn = Dn, mp->Dv = Dv, mp->Dc = Dc, mp->Dr = Dr;
    mp->Td = Td, mp->Tp = Tp, mp->rounds = rounds, mp->base = base;

    /* Layout: metadata first (one upload), then the buffers. */
    size_t o = 0;
    mp->off_qsl_d = take(&o, sizeof(int32_t) * ((size_t)R + 1));
    mp->off_dtok = take(&o, sizeof(int32_t) * (size_t)Td);
    mp->off_ptok = take(&o, sizeof(int32_t) * (size_t)Tp);
    mp->off_preq = take(&o, sizeof(int32_t) * (size_t)Tp);
    kva_status s = KVA_STATUS_OK;
    int32_t kw = 0;
    for (int32_t k = 0; k < rounds && s == KVA_STATUS_OK; k++) {
        kva__cuda_mla_round *rd = &mp->round[k];
        int32_t keys = 0;
        for (int32_t r = 0; r < R; r++) {
            int64_t j0, j1;
            use[r] = (uint8_t)round_keys(plan, r, k, C, &j0, &j1);
            keys += use[r] ? (int32_t)((j1 - j0 + WB - 1) / WB * WB) : 0;
        }
        kw = keys > kw ? keys : kw;
        const int64_t nt = kva__cuda_prefill_tiles_count_subset(R, qsl, use, H, H);
        if (nt < 0 || nt > INT32_MAX)
            s = kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                          "kva_plan_create: the MLA prefill tile count overflows");
        rd->keys = keys;
        rd->ntiles = (int32_t)nt;
        rd->bt_stride = k == 0 ? stride0 : C / WB;
        rd->causal = k == 0 ? d->causal : 0;
        rd->off_seq = take(&o, sizeof(int32_t) * (size_t)R);
        rd->off_bt = take(&o, sizeof(int32_t) * (size_t)R * (size_t)rd->bt_stride);
        rd->off_tiles = take(&o, sizeof(int32_t) * KVA__CUDA_PREFILL_TILE_INTS * (size_t)nt);
        rd->off_ntiles = take(&o, sizeof(int32_t));
        rd->off_src = take(&o, sizeof(int32_t) * (size_t)keys);
    }
    const size_t meta_bytes = o;
    mp->kw = kw;
    const size_t TH = (size_t)T * H, TdH = (size_t)Td * H, TpH = (size_t)Tp * H;
    mp->off_qabs = take(&o, TdH * (size_t)(Dc + Dr) * 2);
    mp->off_olat = take(&o, TdH * (size_t)Dc * 2);
    mp->off_lsed = take(&o, TdH * 4);
    mp->off_kws = take(&o, (size_t)kw * H * Dq * 2);
    mp->off_vws = take(&o, (size_t)kw * H * Dv * 2);
    const int multi = rounds > 1;
    mp->off_part = take(&o, multi ? TH * Dv * 2 : 0);
    mp->off_plse = take(&o, multi ? TH * 4 : 0);
    mp->off_acc = take(&o, multi ? TpH * Dv * 4 : 0);
    mp->off_lacc = take(&o, multi ? TpH * 4 : 0);
    mp->bytes = o;

    /* Host image of the metadata. */
    char *img = s == KVA_STATUS_OK ? (char *)calloc(meta_bytes > 0 ? meta_bytes : 1, 1) : NULL;
    if (s == KVA_STATUS_OK && !img)
        s = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory");
    if (s == KVA_STATUS_OK) {
        int32_t *qsl_d = (int32_t *)(img + mp->off_qsl_d), *dtok = (int32_t *)(img + mp->off_dtok);
        int32_t *ptok = (int32_t *)(img + mp->off_ptok), *preq = (int32_t *)(img + mp->off_preq);
        int32_t nd = 0, np = 0;
        qsl_d[0] = 0;
        for (int32_t r = 0; r < R; r++) {
            const int32_t q = qsl[r + 1] - qsl[r];
            const int dec = q <= d->decode_threshold;
            for (int32_t i = 0; i < q; i++) {
                if (dec)
                    dtok[nd++] = qsl[r] + i;
                else
                    ptok[np] = qsl[r] + i, preq[np++] = r;
            }
            qsl_d[r + 1] = nd;
        }
        const int32_t B = d->block_size;
        for (int32_t k = 0; k < rounds && s == KVA_STATUS_OK; k++) {
            kva__cuda_mla_round *rd = &mp->round[k];
            int32_t *seq = (int32_t *)(img + rd->off_seq), *bt = (int32_t *)(img + rd->off_bt);
            int32_t *src = (int32_t *)(img + rd->off_src);
            for (int32_t i = 0; i < rd->keys; i++)
                src[i] = -1;
            int32_t w0 = 0; /* the request's first key row in the workspace */
            for (int32_t r = 0; r < R; r++) {
                int64_t j0, j1;
                use[r] = (uint8_t)round_keys(plan, r, k, C, &j0, &j1);
                if (!use[r])
                    continue;
                seq[r] = (int32_t)(j1 - j0);
                for (int32_t b = 0; b * WB < j1 - j0; b++)
                    bt[(size_t)r * rd->bt_stride + b] = w0 / WB + b;
                for (int64_t j = j0; j < j1; j++) {
                    const int32_t blk =
                        plan->block_table[(size_t)r * d->block_table_stride + j / B];
                    src[w0 + (j - j0)] = (int32_t)((int64_t)blk * B + j % B);
                }
                w0 += (int32_t)((j1 - j0 + WB - 1) / WB * WB);
            }
            int32_t n = 0;
            s = kva__cuda_prefill_tiles_build_sections(R, qsl, seq, use, H, H, rd->causal, -1, 0, 0,
                                                       (int32_t *)(img + rd->off_tiles), rd->ntiles,
                                                       &n);
            *(int32_t *)(img + rd->off_ntiles) = n;
        }
    }
    free(use);
    if (s == KVA_STATUS_OK)
        s = reserve(ctx, base + mp->bytes);
    if (s == KVA_STATUS_OK && meta_bytes > 0) {
        const cudaError_t e = cudaMemcpyAsync((char *)ctx->workspace + base, img, meta_bytes,
                                              cudaMemcpyHostToDevice, (cudaStream_t)stream);
        if (e != cudaSuccess)
            s = kva__fail(KVA_STATUS_DEVICE_ERROR, "kva_plan_create: MLA metadata upload: %s",
                          cudaGetErrorString(e));
    }
    free(img);
    if (s != KVA_STATUS_OK) {
        kva__cuda_mla_plan_free(mp);
        return s;
    }
    *out = mp;
    return KVA_STATUS_OK;
}

/* ---- run ---- */

/* Phase timing of kva__cuda_mla_run_timed (benchmarks): an event after every
 * phase, the time since the previous event added to that phase's bin. NULL
 * in ordinary runs. */
typedef struct mla_timer {
    cudaEvent_t *ev;
    int *phase;
    int n, cap;
} mla_timer;

static kva_status mark(mla_timer *t, int phase, cudaStream_t st)
{
    if (!t || t->n >= t->cap)
        return KVA_STATUS_OK;
    KVA_CUDA_TRY(cudaEventRecord(t->ev[t->n], st));
    t->phase[t->n++] = phase;
    return KVA_STATUS_OK;
}

template <typename T>
static kva_status launch_merge(int mode, const kva__cuda_mla_plan *mp, int32_t H, char *ws,
                               const int32_t *seq, void *out, float *lse, cudaStream_t st)
{
    const int64_t warps = (int64_t)mp->Tp * H;
    const unsigned blocks = (unsigned)((warps * 32 + 255) / 256);
    merge_kernel<T><<<blocks, 256, 0, st>>>(
        mode, mp->Tp, H, mp->Dv, (const int32_t *)(ws + mp->off_ptok),
        (const int32_t *)(ws + mp->off_preq), seq, (const T *)(ws + mp->off_part),
        (const float *)(ws + mp->off_plse), (float *)(ws + mp->off_acc),
        (float *)(ws + mp->off_lacc), (T *)out, lse);
    KVA_CUDA_LAUNCHED("mla merge_kernel");
    return KVA_STATUS_OK;
}

static kva_status merge(int mode, const kva__cuda_mla_plan *mp, kva_dtype dt, int32_t H, char *ws,
                        const int32_t *seq, void *out, float *lse, cudaStream_t st)
{
    return dt == KVA_DTYPE_BF16 ? launch_merge<__nv_bfloat16>(mode, mp, H, ws, seq, out, lse, st)
                                : launch_merge<__half>(mode, mp, H, ws, seq, out, lse, st);
}

/* What both paths of a run read: the context's state, the plan's parts, the
 * stream, the MLA workspace region and the head sizes. */
typedef struct mla_env {
    kva__cuda_state *st;
    const kva__cuda_plan *cp;
    const kva__cuda_mla_plan *mp;
    const kva_plan_desc *d;
    cudaStream_t stream;
    char *ws;
    int32_t H, Dc, Dr, Dn, Dv, Dq, Dl; /* Dq = Dn + Dr, Dl = Dc + Dr */
} mla_env;

static mla_env env_of(kva_context *ctx, const kva_plan *plan)
{
    mla_env e;
    e.st = (kva__cuda_state *)ctx->state;
    e.cp = (const kva__cuda_plan *)plan->device;
    e.mp = e.cp->mla;
    e.d = &plan->d;
    e.stream = (cudaStream_t)e.st->stream;
    e.ws = (char *)ctx->workspace + e.mp->base;
    e.H = plan->d.num_heads, e.Dc = e.mp->Dc, e.Dr = e.mp->Dr, e.Dn = e.mp->Dn, e.Dv = e.mp->Dv;
    e.Dq = e.Dn + e.Dr, e.Dl = e.Dc + e.Dr;
    return e;
}

/* The absorbed requests: q_abs, the decode kernel + split merge, . W_UV. */
static kva_status run_absorbed(kva_context *ctx, const kva_plan *plan, const void *q,
                               const void *w_uk, const void *w_uv, const kva_cache *cache,
                               void *out, float *lse, mla_timer *tm)
{
    const mla_env e = env_of(ctx, plan);
    const int32_t *dtok = (const int32_t *)(e.ws + e.mp->off_dtok);
    void *qabs = e.ws + e.mp->off_qabs, *olat = e.ws + e.mp->off_olat;
    float *lsed = lse ? (float *)(e.ws + e.mp->off_lsed) : NULL;

    kva__cuda_mla_gemm_args g;
    memset(&g, 0, sizeof g);
    g.a = q, g.a_rows = dtok, g.lda = (int64_t)e.H * e.Dq, g.a_head = e.Dq;
    g.b = w_uk, g.ldb = e.Dc, g.b_head = (int64_t)e.Dn * e.Dc, g.b_kn = 1;
    g.c = qabs, g.ldc = (int64_t)e.H * e.Dl, g.c_head = e.Dl;
    g.M = e.mp->Td, g.N = e.Dc, g.K = e.Dn, g.heads = e.H, g.dtype = e.d->q_dtype;
    g.mma_only = e.st->mla_gemm_mma == 1;
    g.max_ctas = e.st->mla_gemm_mma == 2 ? 5 : 0;
    KVA_TRY(kva__cuda_mla_gemm(&g, e.stream));
    kva__cuda_mla_copy c;
    memset(&c, 0, sizeof c);
    c.src = (const char *)q + 2 * (size_t)e.Dn, c.src_rows = dtok, c.lds = (int64_t)e.H * e.Dq;
    c.src_head = e.Dq;
    c.dst = (char *)qabs + 2 * (size_t)e.Dc, c.ldd = (int64_t)e.H * e.Dl, c.dst_head = e.Dl;
    c.M = e.mp->Td, c.heads = e.H, c.width = e.Dr;
    KVA_TRY(kva__cuda_mla_copy_rows(&c, e.stream));

    kva__cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.meta = e.st->meta;
    a.meta.qsl = (const int32_t *)(e.ws + e.mp->off_qsl_d); /* the absorbed rows only */
    a.q = qabs;
    a.k = cache->k;
    a.v = cache->v;
    a.out = olat;
    a.lse = lsed;
    a.ws = (float *)ctx->workspace;
    a.H = e.H, a.Hkv = 1, a.G = e.H, a.D = e.d->head_dim, a.Dv = e.Dc;
    a.B = cache->desc.block_size;
    a.NB = cache->desc.num_blocks;
    a.layout_hnd = cache->desc.layout == KVA_LAYOUT_HND;
    a.causal = e.d->causal;
    a.window_left = -1;
    a.scale = e.d->scale;
    const int fp8 = cache->desc.quant == KVA_QUANT_FP8_E4M3;
    a.kv_fp8 = fp8;
    a.kv_scale = fp8 ? cache->k_scale[0] : 1.f;
    const int grid = e.st->num_sms * e.cp->per_sm;
    if (plan->part->num_items > 0) {
        if (e.cp->decode_kernel == KVA__CUDA_K_MLA_DECODE_WGMMA)
            KVA_TRY(kva__cuda_mla_wgmma_launch(&a, e.d->q_dtype, grid, e.stream));
        else
            KVA_TRY(kva__cuda_mla_decode_launch(&a, e.d->q_dtype, e.cp->rows, grid, e.stream));
    }
    if (plan->part->num_tasks > 0)
        KVA_TRY(kva__cuda_split_merge_launch(&a.meta, a.ws, NULL, olat, lsed, e.H, e.H, e.Dc,
                                             e.d->q_dtype, e.st->num_sms * 2, e.stream));

    memset(&g, 0, sizeof g);
    g.a = olat, g.lda = (int64_t)e.H * e.Dc, g.a_head = e.Dc;
    g.b = w_uv, g.ldb = e.Dv, g.b_head = (int64_t)e.Dc * e.Dv, g.b_kn = 1;
    g.c = out, g.c_rows = dtok, g.ldc = (int64_t)e.H * e.Dv, g.c_head = e.Dv;
    g.M = e.mp->Td, g.N = e.Dv, g.K = e.Dc, g.heads = e.H, g.dtype = e.d->q_dtype;
    g.mma_only = e.st->mla_gemm_mma == 1;
    g.max_ctas = e.st->mla_gemm_mma == 2 ? 5 : 0;
    KVA_TRY(kva__cuda_mla_gemm(&g, e.stream));
    if (lse) {
        const int64_t n = (int64_t)e.mp->Td * e.H;
        lse_scatter_kernel<<<(unsigned)((n + 255) / 256), 256, 0, e.stream>>>(e.mp->Td, e.H, dtok,
                                                                              lsed, lse);
        KVA_CUDA_LAUNCHED("mla lse_scatter_kernel");
    }
    return mark(tm, KVA__CUDA_MLA_PHASE_ABSORBED, e.stream);
}

/* The compute-friendly requests: per round, decompress, attend, merge. */
static kva_status run_compute(kva_context *ctx, const kva_plan *plan, const void *q,
                              const void *w_uk, const void *w_uv, const kva_cache *cache, void *out,
                              float *lse, mla_timer *tm)
{
    const mla_env e = env_of(ctx, plan);
    void *kws = e.ws + e.mp->off_kws, *vws = e.ws + e.mp->off_vws;
    const int multi = e.mp->rounds > 1;
    /* An FP8 cache: 1-byte rows, dequantized by the GEMM and the copy. */
    const int fp8 = cache->desc.quant == KVA_QUANT_FP8_E4M3;
    const float ks = fp8 ? cache->k_scale[0] : 1.f;
    const size_t ce = fp8 ? 1 : 2; /* bytes per cache element */
    for (int32_t k = 0; k < e.mp->rounds; k++) {
        const kva__cuda_mla_round *rd = &e.mp->round[k];
        const int32_t *src = (const int32_t *)(e.ws + rd->off_src);
        kva__cuda_mla_gemm_args g;
        memset(&g, 0, sizeof g);
        g.a = cache->k, g.a_rows = src, g.lda = e.Dl, g.a_head = 0;
        g.b = w_uk, g.ldb = e.Dc, g.b_head = (int64_t)e.Dn * e.Dc, g.b_kn = 0;
        g.c = kws, g.ldc = (int64_t)e.H * e.Dq, g.c_head = e.Dq;
        g.M = rd->keys, g.N = e.Dn, g.K = e.Dc, g.heads = e.H, g.dtype = e.d->q_dtype;
        g.a_fp8 = fp8, g.c_scale = ks, g.mma_only = e.st->mla_gemm_mma == 1;
        g.max_ctas = e.st->mla_gemm_mma == 2 ? 5 : 0;
        /* V = c_kv . W_UV: with Dn == Dv the pair's second product (one
         * pass over the latent rows), else a GEMM of its own */
        kva__cuda_mla_gemm_args gv = g;
        gv.b = w_uv, gv.ldb = e.Dv, gv.b_head = (int64_t)e.Dc * e.Dv, gv.b_kn = 1;
        gv.c = vws, gv.ldc = (int64_t)e.H * e.Dv, gv.c_head = e.Dv, gv.N = e.Dv;
        if (e.Dn == e.Dv) {
            g.b2 = gv.b, g.ldb2 = gv.ldb, g.b2_head = gv.b_head, g.b2_kn = gv.b_kn;
            g.c2 = gv.c, g.ldc2 = gv.ldc, g.c2_head = gv.c_head;
        }
        KVA_TRY(kva__cuda_mla_gemm(&g, e.stream));
        if (e.Dn != e.Dv)
            KVA_TRY(kva__cuda_mla_gemm(&gv, e.stream));
        kva__cuda_mla_copy c;
        memset(&c, 0, sizeof c);
        c.src = (const char *)cache->k + ce * (size_t)e.Dc, c.src_rows = src, c.lds = e.Dl;
        c.dst = (char *)kws + 2 * (size_t)e.Dn, c.ldd = (int64_t)e.H * e.Dq, c.dst_head = e.Dq;
        c.M = rd->keys, c.heads = e.H, c.width = e.Dr;
        c.src_fp8 = fp8, c.src_scale = ks, c.dtype = e.d->q_dtype;
        KVA_TRY(kva__cuda_mla_copy_rows(&c, e.stream));
        KVA_TRY(mark(tm, KVA__CUDA_MLA_PHASE_DECOMPRESS, e.stream));

        kva__cuda_prefill_args pa;
        memset(&pa, 0, sizeof pa);
        pa.q = q;
        pa.k = kws;
        pa.v = vws;
        pa.out = multi ? (void *)(e.ws + e.mp->off_part) : out;
        pa.lse = multi ? (float *)(e.ws + e.mp->off_plse) : lse;
        pa.query_start_loc = e.st->meta.qsl;
        pa.seq_lens = (const int32_t *)(e.ws + rd->off_seq);
        pa.block_table = (const int32_t *)(e.ws + rd->off_bt);
        pa.tiles = (const int32_t *)(e.ws + rd->off_tiles);
        pa.num_tiles = (const int32_t *)(e.ws + rd->off_ntiles);
        pa.grid_tiles = rd->ntiles;
        pa.block_table_stride = rd->bt_stride;
        pa.block_size = KVA_CUDA_MLA_WS_BLOCK;
        pa.num_blocks = e.mp->kw / KVA_CUDA_MLA_WS_BLOCK;
        pa.num_heads = e.H;
        pa.num_kv_heads = e.H;
        pa.head_dim = e.Dq;
        pa.head_dim_v = e.Dv;
        pa.dtype = e.d->q_dtype;
        pa.layout = KVA_LAYOUT_NHD;
        pa.scale = e.d->scale;
        pa.causal = rd->causal;
        pa.window_left = -1;
        pa.host_cache = &e.st->prefill_host;
        if (rd->ntiles > 0)
            KVA_TRY(kva__cuda_prefill_launch_kernel(&pa, e.stream, KVA__CUDA_PREFILL_AUTO));
        KVA_TRY(mark(tm, KVA__CUDA_MLA_PHASE_ATTENTION, e.stream));
        if (multi)
            KVA_TRY(merge(k == 0 ? 0 : 1, e.mp, e.d->q_dtype, e.H, e.ws,
                          (const int32_t *)(e.ws + rd->off_seq), out, lse, e.stream));
        KVA_TRY(mark(tm, KVA__CUDA_MLA_PHASE_MERGE, e.stream));
    }
    if (multi)
        KVA_TRY(merge(2, e.mp, e.d->q_dtype, e.H, e.ws, NULL, out, lse, e.stream));
    return mark(tm, KVA__CUDA_MLA_PHASE_MERGE, e.stream);
}

static kva_status run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                      const void *w_uv, const kva_cache *cache, void *out, float *lse,
                      mla_timer *tm)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva__cuda_mla_plan *mp = cp ? cp->mla : NULL;
    if (!mp)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: the plan has no layer-level MLA part");
    if (cache->desc.quant != KVA_QUANT_NONE && cache->desc.quant != KVA_QUANT_FP8_E4M3)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_run: the CUDA backend's layer-level MLA reads f16 / bf16 latent "
                         "caches (the dtype of q) and fp8_e4m3 ones; this cache is %s: use the "
                         "reference / CPU backend",
                         kva_quant_name(cache->desc.quant));
    if (((uintptr_t)q | (uintptr_t)w_uk | (uintptr_t)w_uv | (uintptr_t)out) % 16 != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_run: the CUDA backend needs 16-byte aligned q (%p), w_uk (%p), "
                         "w_uv (%p) and out (%p)",
                         q, w_uk, w_uv, out);
    const cudaStream_t st = (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
    KVA_TRY(mark(tm, -1, st));
    if (mp->Td > 0)
        KVA_TRY(run_absorbed(ctx, plan, q, w_uk, w_uv, cache, out, lse, tm));
    if (mp->Tp > 0)
        KVA_TRY(run_compute(ctx, plan, q, w_uk, w_uv, cache, out, lse, tm));
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_mla_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                        const void *w_uk, const void *w_uv, const kva_cache *cache,
                                        void *out, float *lse)
{
    return run(ctx, plan, q, w_uk, w_uv, cache, out, lse, NULL);
}

extern "C" kva_status kva__cuda_mla_run_timed(kva_context *ctx, const kva_plan *plan, const void *q,
                                              const void *w_uk, const void *w_uv,
                                              const kva_cache *cache, void *out, float *lse,
                                              float ms[KVA__CUDA_MLA_PHASES])
{
    kva__clear_error();
    KVA_TRY(kva__cuda_check_ctx(__func__, ctx));
    if (!plan || plan->backend != KVA_BACKEND_CUDA || !plan->device ||
        !((const kva__cuda_plan *)plan->device)->mla)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: not a layer-level CUDA MLA plan",
                         __func__);
    const kva__cuda_mla_plan *mp = ((const kva__cuda_plan *)plan->device)->mla;
    mla_timer t;
    t.cap = 8 + 3 * mp->rounds;
    t.n = 0;
    t.ev = (cudaEvent_t *)calloc((size_t)t.cap, sizeof(cudaEvent_t));
    t.phase = (int *)calloc((size_t)t.cap, sizeof(int));
    kva_status s = t.ev && t.phase
                       ? KVA_STATUS_OK
                       : kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", __func__);
    int made = 0;
    for (; s == KVA_STATUS_OK && made < t.cap; made++)
        if (cudaEventCreate(&t.ev[made]) != cudaSuccess)
            s = kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: cudaEventCreate failed", __func__);
    if (s == KVA_STATUS_OK)
        s = run(ctx, plan, q, w_uk, w_uv, cache, out, lse, &t);
    for (int i = 0; i < KVA__CUDA_MLA_PHASES; i++)
        ms[i] = 0.f;
    if (s == KVA_STATUS_OK && t.n > 0 && cudaEventSynchronize(t.ev[t.n - 1]) != cudaSuccess)
        s = kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: cudaEventSynchronize failed", __func__);
    for (int i = 1; s == KVA_STATUS_OK && i < t.n; i++) {
        float x = 0.f;
        if (cudaEventElapsedTime(&x, t.ev[i - 1], t.ev[i]) == cudaSuccess && t.phase[i] >= 0)
            ms[t.phase[i]] += x;
    }
    for (int i = 0; i < made; i++)
        cudaEventDestroy(t.ev[i]);
    free(t.ev);
    free(t.phase);
    return s;
}
