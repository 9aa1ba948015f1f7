/*
 * cache_quant.cu - quantized device caches on the CUDA backend: creation of
 * their device scale arrays, the quantizing kva_cache_write, and the int8
 * NaN policy.
 *
 * The write is bit-identical to the host path (src/cache/quant.c): the same
 * float32 arithmetic with IEEE division and addition (__fdiv_rn, __fadd_rn:
 * never contracted); tests/cuda/test_cuda_quant.c compares the device cache
 * with a CPU-written one byte for byte.
 *
 * NaN policy (docs/cuda.md, "Quantized caches"): a write into a cache with
 * int8 rows runs quant_check_kernel (atomicMin of the first bad element's key
 * into the cache's reject word) then quant_write_kernel (returns at once when
 * the word is set), so a rejected write leaves the cache unchanged; the
 * status is waited for outside capture, else deferred to
 * kva_cuda_cache_write_status(). FP8 caches store NaN and need neither.
 *
 * FP8_E4M3 MLA (latent) caches: mla_fp8_write_kernel quantizes each token's
 * row [c_kv | k_pe] as a whole with the cache's one k_scale, fp8(x / s) as
 * the host's write_latent (src/cache/cache_write.c) does.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "quant_exact.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVA_QW_THREADS 256
#define KVA_REJECT_NONE 0xffffffffffffffffull

static cudaStream_t stream_of(const kva_context *ctx)
{
    return (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
}

static int has_int8(kva_quant q)
{
    return kva__quant_is_int8(q, 0) || kva__quant_is_int8(q, 1);
}

/* ---- creation ---- */

extern "C" kva_status kva__cuda_cache_quant_init(const kva_context *ctx, kva_cache *c)
{
    const kva_cache_desc *d = &c->desc;
    const size_t hkv = (size_t)d->num_kv_heads;
    const size_t sbytes = 2 * hkv * ((size_t)d->head_dim + (size_t)d->head_dim_v) * sizeof(float);
    void *p = NULL;
    KVA_TRY(kva__cuda_alloc(ctx, sbytes, &p));
    c->dev_scales = (float *)p;
    KVA_CUDA_TRY(cudaMemcpy(c->dev_scales, c->k_scale, sbytes, cudaMemcpyHostToDevice));
    if (d->quant == KVA_QUANT_INT8_TOKEN_K || d->quant == KVA_QUANT_INT8_TOKEN_K_V16) {
        /* [NB, Hkv, B] float32, zero: a slot never written dequantizes to 0. */
        const size_t tb = (size_t)d->num_blocks * (size_t)d->block_size * hkv * sizeof(float);
        KVA_TRY(kva__cuda_alloc(ctx, tb, &p));
        c->k_token_scale = (float *)p;
        KVA_CUDA_TRY(cudaMemset(c->k_token_scale, 0, tb));
    }
    if (has_int8(d->quant)) {
        /* [0] this write's record, [1] the first rejected write not yet reported. */
        KVA_TRY(kva__cuda_alloc(ctx, 2 * sizeof(unsigned long long), &p));
        c->dev_reject = (unsigned long long *)p;
        KVA_CUDA_TRY(cudaMemset(c->dev_reject, 0xff, 2 * sizeof(unsigned long long)));
    }
    return KVA_STATUS_OK;
}

extern "C" void kva__cuda_cache_quant_free(kva_cache *c)
{
    kva__cuda_free(c->device_id, c->k_token_scale);
    kva__cuda_free(c->device_id, c->dev_scales);
    kva__cuda_free(c->device_id, c->dev_reject);
    c->k_token_scale = NULL;
    c->dev_scales = NULL;
    c->dev_reject = NULL;
}

/* ---- kernels ---- */

/* Shape and format of a quantizing write. */
typedef struct qwrite_args {
    int8_t *k;       /* K storage (int8 or fp8 codes) */
    void *v;         /* V storage (int8, fp8, or f16/bf16 for V16) */
    float *kts;      /* [NB, Hkv, B] per-token key scales, or NULL */
    const float *sc; /* device k_scale [Hkv*D], k_offset, v_scale [Hkv*Dv], v_offset */
    const int64_t *slots;
    unsigned long long *reject; /* reject words [2], or NULL (fp8: nothing to reject) */
    int32_t record;             /* a rejection is recorded in reject[1] (deferred status) */
    int64_t ks, vs;             /* token strides in source elements */
    int64_t num_slots;          /* NB * B */
    int32_t T, Hkv, D, Dv, B;
    int32_t hnd, quant, v16_bf16;
} qwrite_args;

/* Row index of (block, off, head) in the cache layout. */
__device__ __forceinline__ int64_t cache_row(const qwrite_args &a, int64_t block, int64_t off,
                                             int32_t h)
{
    return a.hnd ? (block * a.Hkv + h) * a.B + off : (block * a.B + off) * a.Hkv + h;
}

/*
 * Scan of the rows a write would store as int8 (one CTA per token, grid-
 * stride; threads over the K then the V elements of the token): NaN anywhere,
 * and +-inf in per-token key rows. The smallest key (t << 33 | is_v << 32 |
 * head * dim + channel), i.e. the host's first bad element, wins.
 */
template <typename TS>
__global__ void __launch_bounds__(KVA_QW_THREADS)
    quant_check_kernel(qwrite_args a, const TS *k, const TS *v)
{
    const int k8 = a.quant != KVA_QUANT_FP8_E4M3;
    const int v8 = a.quant == KVA_QUANT_INT8_CHANNEL || a.quant == KVA_QUANT_INT8_TOKEN_K;
    const int tok = a.quant == KVA_QUANT_INT8_TOKEN_K || a.quant == KVA_QUANT_INT8_TOKEN_K_V16;
    const int32_t nk = a.Hkv * a.D, nv = a.Hkv * a.Dv;
    for (int32_t t = blockIdx.x; t < a.T; t += gridDim.x) {
        const int64_t slot = a.slots[t];
        if (slot < 0 || slot >= a.num_slots)
            continue;
        for (int32_t e = threadIdx.x; e < nk + nv; e += blockDim.x) {
            const int is_v = e >= nk;
            const int32_t x = is_v ? e - nk : e;
            if (!(is_v ? v8 : k8))
                continue;
            const float f = is_v ? ld(v, (int64_t)t * a.vs + x) : ld(k, (int64_t)t * a.ks + x);
            const bool bad = f != f || (!is_v && tok && isinf(f));
            if (bad)
                atomicMin(a.reject, ((unsigned long long)t << 33) |
                                        ((unsigned long long)is_v << 32) | (unsigned)x);
        }
    }
}

/*
 * The quantizing scatter: one CTA per token (grid-stride), one warp per row of
 * the token (Hkv K rows, then Hkv V rows), lanes over the row's channels.
 * Returns at once when the check kernel rejected the write.
 */
template <typename TS>
__global__ void __launch_bounds__(KVA_QW_THREADS)
    quant_write_kernel(qwrite_args a, const TS *k, const TS *v)
{
    if (a.reject && a.reject[0] != KVA_REJECT_NONE) {
        if (a.record && blockIdx.x == 0 && threadIdx.x == 0)
            atomicCAS(&a.reject[1], KVA_REJECT_NONE, a.reject[0]);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const bool tok = a.kts != nullptr;
    const float *ks = a.sc, *ko = ks + (int64_t)a.Hkv * a.D;
    const float *vsc = ko + (int64_t)a.Hkv * a.D, *vo = vsc + (int64_t)a.Hkv * a.Dv;
    for (int32_t t = blockIdx.x; t < a.T; t += gridDim.x) {
        const int64_t slot = a.slots[t];
        if (slot < 0 || slot >= a.num_slots)
            continue;
        const int64_t block = slot / a.B, off = slot % a.B;
        for (int32_t w = warp; w < 2 * a.Hkv; w += nw) {
            const int is_v = w >= a.Hkv;
            const int32_t h = is_v ? w - a.Hkv : w;
            const int32_t dim = is_v ? a.Dv : a.D;
            const int64_t row = cache_row(a, block, off, h);
            const TS *src = is_v ? v + (int64_t)t * a.vs + (int64_t)h * dim
                                 : k + (int64_t)t * a.ks + (int64_t)h * dim;
            if (!is_v && tok) {
                float amax = 0.0f;
                for (int32_t c = lane; c < dim; c += 32)
                    amax = fmaxf(amax, fabsf(ld(src, c)));
#pragma unroll
                for (int o = 16; o >= 1; o >>= 1)
                    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                const float s = __fdiv_rn(amax, 127.0f);
                if (lane == 0)
                    a.kts[(block * a.Hkv + h) * a.B + off] = s;
                int8_t *dst = a.k + row * a.D;
                for (int32_t c = lane; c < dim; c += 32)
                    dst[c] = s > 0.0f ? to_i8(__fdiv_rn(ld(src, c), s)) : (int8_t)0;
                continue;
            }
            const float *sc = (is_v ? vsc : ks) + (int64_t)h * dim;
            const float *of = (is_v ? vo : ko) + (int64_t)h * dim;
            if (is_v && a.quant == KVA_QUANT_INT8_TOKEN_K_V16) {
                uint16_t *dst = (uint16_t *)a.v + row * a.Dv;
                for (int32_t c = lane; c < dim; c += 32)
                    dst[c] = a.v16_bf16 ? to_bf16(ld(src, c)) : to_f16(ld(src, c));
            } else if (a.quant == KVA_QUANT_FP8_E4M3) {
                uint8_t *dst = (uint8_t *)(is_v ? a.v : (void *)a.k) + row * dim;
                for (int32_t c = lane; c < dim; c += 32) {
                    /* NaN / s is the canonical NaN on the GPU; the host keeps the sign. */
                    const float x = ld(src, c);
                    dst[c] = to_fp8(x != x ? x : __fdiv_rn(x, sc[c]));
                }
            } else {
                int8_t *dst = (int8_t *)(is_v ? a.v : (void *)a.k) + row * dim;
                for (int32_t c = lane; c < dim; c += 32)
                    dst[c] = to_i8(__fadd_rn(__fdiv_rn(ld(src, c), sc[c]), of[c]));
            }
        }
    }
}

/*
 * FP8_E4M3 latent rows: one CTA per token (grid-stride), threads over the D =
 * Dc + Dr channels of its row [c_kv (k [T, ks]) | k_pe (v [T, vs])], slot =
 * the row (Hkv = 1); rows [NB * B, D] of 1-byte codes at dst, s the k_scale.
 */
template <typename TS>
__global__ void __launch_bounds__(KVA_QW_THREADS)
    mla_fp8_write_kernel(uint8_t *dst, const TS *ckv, const TS *kpe, const int64_t *slots,
                         int32_t T, int64_t ks, int64_t vs, int32_t D, int32_t Dc,
                         int64_t num_slots, float s)
{
    for (int32_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots)
            continue;
        uint8_t *row = dst + slot * D;
        for (int32_t c = threadIdx.x; c < D; c += blockDim.x) {
            const float x = c < Dc ? ld(ckv, (int64_t)t * ks + c) : ld(kpe, (int64_t)t * vs + c - Dc);
            /* NaN / s is the canonical NaN on the GPU; the host keeps the sign. */
            row[c] = to_fp8(x != x ? x : __fdiv_rn(x, s));
        }
    }
}

template <typename TS>
static kva_status launch_mla(cudaStream_t s, const kva_cache *c, int32_t n, const void *k,
                             int64_t ks, const void *v, int64_t vs, const int64_t *slots)
{
    const kva_cache_desc *d = &c->desc;
    const int grid = n < 65535 ? n : 65535;
    mla_fp8_write_kernel<TS><<<grid, KVA_QW_THREADS, 0, s>>>(
        (uint8_t *)c->k, (const TS *)k, (const TS *)v, slots, n, ks, vs, d->head_dim,
        d->head_dim_v, (int64_t)d->num_blocks * d->block_size, c->k_scale[0]);
    KVA_CUDA_LAUNCHED("mla_fp8_write_kernel");
    return KVA_STATUS_OK;
}

template <typename TS>
static kva_status launch(cudaStream_t s, const qwrite_args &a, const void *k, const void *v)
{
    const int grid = a.T < 65535 ? a.T : 65535;
    if (a.reject) {
        KVA_CUDA_TRY(cudaMemsetAsync(a.reject, 0xff, sizeof(unsigned long long), s));
        quant_check_kernel<TS><<<grid, KVA_QW_THREADS, 0, s>>>(a, (const TS *)k, (const TS *)v);
        KVA_CUDA_LAUNCHED("quant_check_kernel");
    }
    quant_write_kernel<TS><<<grid, KVA_QW_THREADS, 0, s>>>(a, (const TS *)k, (const TS *)v);
    KVA_CUDA_LAUNCHED("quant_write_kernel");
    return KVA_STATUS_OK;
}

/* Turns a reject word read back from the device into the host backends'
 * status and message (the bad value is copied from the device source). */
static kva_status report_reject(const kva_cache *c, unsigned long long rec, const void *k,
                                int64_t ks, const void *v, int64_t vs, kva_dtype src_dtype)
{
    const kva_cache_desc *d = &c->desc;
    const int32_t t = (int32_t)(rec >> 33);
    const int is_v = (int)((rec >> 32) & 1u);
    const int64_t x = (int64_t)(rec & 0xffffffffu);
    const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
    const size_t es = kva_dtype_size(src_dtype);
    unsigned char raw[4] = {0, 0, 0, 0};
    double val = NAN; /* the value itself is only known while the source is */
    if (k && v) {
        const int64_t e = (int64_t)t * (is_v ? vs : ks) + x;
        const char *p = (const char *)(is_v ? v : k) + e * (int64_t)es;
        if (cudaMemcpy(raw, p, es, cudaMemcpyDeviceToHost) == cudaSuccess)
            val = (double)kva__load_f(raw, src_dtype, 0);
        (void)cudaGetLastError();
    }
    const int no_inf =
        !is_v && (d->quant == KVA_QUANT_INT8_TOKEN_K || d->quant == KVA_QUANT_INT8_TOKEN_K_V16);
    return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                     "kva_cache_write: %s[token %d, head %lld, channel %lld] = %g: quant %s "
                     "cannot store %s; nothing was written",
                     is_v ? "v" : "k", (int)t, (long long)(x / dim), (long long)(x % dim), val,
                     kva_quant_name(d->quant),
                     no_inf ? "NaN or infinite keys (per-token scale)" : "NaN");
}

extern "C" kva_status kva__cuda_cache_write_quant(kva_context *ctx, kva_cache *cache,
                                                  int32_t num_tokens, const void *k, int64_t ks,
                                                  const void *v, int64_t vs, kva_dtype src_dtype,
                                                  const int64_t *slot_mapping)
{
    const kva_cache_desc *d = &cache->desc;
    cudaStream_t s = stream_of(ctx);
    if (d->kind == KVA_ATTN_MLA) { /* FP8_E4M3 latent rows (cache_ops.cu allows no other) */
        if (src_dtype == KVA_DTYPE_F32)
            return launch_mla<float>(s, cache, num_tokens, k, ks, v, vs, slot_mapping);
        if (src_dtype == KVA_DTYPE_F16)
            return launch_mla<__half>(s, cache, num_tokens, k, ks, v, vs, slot_mapping);
        return launch_mla<__nv_bfloat16>(s, cache, num_tokens, k, ks, v, vs, slot_mapping);
    }
    qwrite_args a;
    memset(&a, 0, sizeof a);
    a.k = (int8_t *)cache->k;
    a.v = cache->v;
    a.kts = cache->k_token_scale;
    a.sc = cache->dev_scales;
    a.slots = slot_mapping;
    a.reject = cache->dev_reject;
    a.ks = ks;
    a.vs = vs;
    a.num_slots = (int64_t)d->num_blocks * d->block_size;
    a.T = num_tokens;
    a.Hkv = d->num_kv_heads;
    a.D = d->head_dim;
    a.Dv = d->head_dim_v;
    a.B = d->block_size;
    a.hnd = d->layout == KVA_LAYOUT_HND;
    a.quant = (int32_t)d->quant;
    a.v16_bf16 = d->dtype == KVA_DTYPE_BF16;
    if (a.reject) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        KVA_CUDA_TRY(cudaStreamIsCapturing(s, &cs));
        a.record = cs != cudaStreamCaptureStatusNone ||
                   ((const kva__cuda_state *)ctx->state)->deferred_write_status;
    }
    if (src_dtype == KVA_DTYPE_F32)
        KVA_TRY(launch<float>(s, a, k, v));
    else if (src_dtype == KVA_DTYPE_F16)
        KVA_TRY(launch<__half>(s, a, k, v));
    else
        KVA_TRY(launch<__nv_bfloat16>(s, a, k, v));
    if (!a.reject)
        return KVA_STATUS_OK;
    /* The synchronous status (see the header comment): not during capture. */
    if (a.record)
        return KVA_STATUS_OK;
    unsigned long long rec = KVA_REJECT_NONE;
    KVA_CUDA_TRY(cudaMemcpyAsync(&rec, a.reject, sizeof rec, cudaMemcpyDeviceToHost, s));
    KVA_CUDA_TRY(cudaStreamSynchronize(s));
    if (rec == KVA_REJECT_NONE)
        return KVA_STATUS_OK;
    return report_reject(cache, rec, k, ks, v, vs, src_dtype);
}

extern "C" kva_status kva_cuda_cache_write_status(kva_context *ctx, const kva_cache *cache)
{
    kva__clear_error();
    KVA_CHECK_PTR(ctx);
    KVA_CHECK_PTR(cache);
    if (ctx->backend != KVA_BACKEND_CUDA || !ctx->state || cache->mem != ctx->ops->memory)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cuda_cache_write_status: ctx backend '%s' and cache memory '%s': "
                         "both must be cuda",
                         kva_backend_name(ctx->backend), cache->mem->name);
    if (!cache->dev_reject)
        return KVA_STATUS_OK;
    cudaStream_t s = stream_of(ctx);
    unsigned long long rec = KVA_REJECT_NONE;
    KVA_CUDA_TRY(
        cudaMemcpyAsync(&rec, cache->dev_reject + 1, sizeof rec, cudaMemcpyDeviceToHost, s));
    KVA_CUDA_TRY(cudaMemsetAsync(cache->dev_reject + 1, 0xff, sizeof rec, s));
    KVA_CUDA_TRY(cudaStreamSynchronize(s));
    if (rec == KVA_REJECT_NONE)
        return KVA_STATUS_OK;
    return report_reject(cache, rec, NULL, 0, NULL, 0, KVA_DTYPE_F32);
}
