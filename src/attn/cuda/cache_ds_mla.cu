/*
 * cache_ds_mla.cu - latent (MLA) device caches in FlashMLA's fp8_ds_mla rows,
 * and the read-back of device caches:
 *   ds_mla_write_kernel: kva_cache_write into an FP8_DS_MLA cache (vLLM's
 *     concat_and_cache_ds_mla): per 128-value tile of c_kv the scale
 *     s = max(amax / 448, FLT_MIN) and the codes fp8(x / s), then k_pe as
 *     bf16, byte-identical to the host writer (the conversions of
 *     quant_exact.cuh, IEEE division);
 *   cache_read_kernel: kva_cache_read of a device cache (MLA caches of every
 *     device format: f32 / f16 / bf16, fp8_e4m3 as code * k_scale (one f32
 *     multiply, as the host reads it), fp8_ds_mla; MHA caches of the
 *     unquantized formats), slot by slot; the
 *     same kernel gathers a request's rows 0 .. s - 1 through its block-table
 *     row into dense [s, Dc + Dr] rows (the sparse MLA's separate mode,
 *     mla_sparse.cu).
 * An fp8_ds_mla row (Dc a multiple of 128, Dr = D - Dc) is Dc codes, Dc / 128
 * float32 scales, Dr bf16 values: Dc + 4 Dc / 128 + 2 Dr bytes; B rows per
 * block, token after token (kva__ds_mla_row_bytes, src/core/internal.h).
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_sparse.h"
}
#include "cuda_check.h"
#include "quant_exact.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <float.h>
#include <math.h>
#include <string.h>

static cudaStream_t stream_of(const kva_context *ctx)
{
    return (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
}

/* ---- write ---- */

/* One CTA of 128 threads per token (grid-stride): warp w quantizes the tiles
 * w, w + 4, ... of c_kv (4 values per lane per tile), then the CTA copies
 * k_pe as bf16. c_kv [T, Dc] at k_stride, k_pe [T, Dr] at v_stride (source
 * elements); slots < 0 are padding, >= num_slots skipped. */
template <typename TS>
__global__ void __launch_bounds__(128)
    ds_mla_write_kernel(unsigned char *cache, const TS *ckv, int64_t ks, const TS *kpe, int64_t vs,
                        const int64_t *slots, int32_t T, int32_t Dc, int32_t Dr, int64_t row_bytes,
                        int64_t num_slots)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int32_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots)
            continue;
        unsigned char *row = cache + slot * row_bytes;
        float *scales = (float *)(row + Dc);
        const TS *src = ckv + (int64_t)t * ks;
        for (int32_t tile = warp; tile < Dc / 128; tile += 4) {
            float x[4], amax = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                x[i] = ld(src, tile * 128 + lane + 32 * i);
                amax = fmaxf(amax, fabsf(x[i]));
            }
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float s = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
#pragma unroll
            for (int i = 0; i < 4; i++) /* NaN / s is the canonical NaN here; keep the sign */
                row[tile * 128 + lane + 32 * i] = to_fp8(x[i] != x[i] ? x[i] : __fdiv_rn(x[i], s));
            if (lane == 0)
                scales[tile] = s;
        }
        uint16_t *pe = (uint16_t *)(scales + Dc / 128);
        for (int32_t c = threadIdx.x; c < Dr; c += blockDim.x)
            pe[c] = to_bf16(ld(kpe, (int64_t)t * vs + c));
    }
}

extern "C" kva_status kva__cuda_ds_mla_write(kva_context *ctx, kva_cache *cache, int32_t n,
                                             const void *k, int64_t ks, const void *v, int64_t vs,
                                             kva_dtype src_dtype, const int64_t *slots)
{
    const kva_cache_desc *d = &cache->desc;
    const int32_t Dc = d->head_dim_v, Dr = d->head_dim - d->head_dim_v;
    const int64_t rb = kva__ds_mla_row_bytes(d->head_dim, d->head_dim_v);
    const int64_t ns = (int64_t)d->num_blocks * d->block_size;
    const int grid = n < 65535 ? n : 65535;
    cudaStream_t s = stream_of(ctx);
    unsigned char *c = (unsigned char *)cache->k;
    if (src_dtype == KVA_DTYPE_F32)
        ds_mla_write_kernel<float><<<grid, 128, 0, s>>>(c, (const float *)k, ks, (const float *)v,
                                                        vs, slots, n, Dc, Dr, rb, ns);
    else if (src_dtype == KVA_DTYPE_F16)
        ds_mla_write_kernel<__half><<<grid, 128, 0, s>>>(
            c, (const __half *)k, ks, (const __half *)v, vs, slots, n, Dc, Dr, rb, ns);
    else
        ds_mla_write_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(c, (const __nv_bfloat16 *)k, ks,
                                                                (const __nv_bfloat16 *)v, vs, slots,
                                                                n, Dc, Dr, rb, ns);
    KVA_CUDA_LAUNCHED("ds_mla_write_kernel");
    return KVA_STATUS_OK;
}

/* ---- read-back ---- */

/* Source formats of the read kernel. */
enum { RD_F32 = 0, RD_F16, RD_BF16, RD_DS_MLA, RD_FP8 };

/* What one read covers: rows of the cache, where they go. */
typedef struct read_args {
    const unsigned char *cache; /* K storage */
    const unsigned char *vcache;
    const int64_t *slots;  /* [T] slots, or NULL: positions 0 .. T - 1 through bt_row */
    const int32_t *bt_row; /* the request's block-table row (slots == NULL) */
    void *k, *v;           /* destinations (either may be NULL) */
    int64_t ks, vs;        /* token strides of k and v in destination elements */
    int64_t num_slots;
    int32_t T, Hkv, kw, vw; /* elements per token: MHA Hkv * D / Hkv * Dv; MLA Dc / Dr */
    int32_t D, Dv, B, hnd, mla, fmt;
    int64_t row_bytes; /* fp8_ds_mla row bytes */
    float scale;       /* fp8_e4m3 MLA caches: the per-tensor k_scale */
} read_args;

/* Value of element x of token's K (is_v 0) or V row set, as float (exact). */
static __device__ __forceinline__ float rd_value(const read_args &a, int64_t slot, int is_v,
                                                 int32_t x)
{
    if (a.fmt == RD_DS_MLA) {
        const unsigned char *row = a.cache + slot * a.row_bytes;
        if (is_v) /* k_pe: bf16 after the codes and the scales */
            return __uint_as_float((uint32_t)((const uint16_t *)(row + a.kw + a.kw / 32))[x] << 16);
        const float s = ((const float *)(row + a.kw))[x / 128];
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[x], __NV_E4M3);
        return __half2float(__half(h)) * s; /* one f32 multiply, as the host reads it */
    }
    int64_t e;
    const unsigned char *base = a.cache;
    if (a.mla) { /* latent rows [c_kv | k_pe] of D elements */
        e = slot * a.D + (is_v ? a.kw : 0) + x;
    } else {
        const int32_t dim = is_v ? a.Dv : a.D, h = x / dim, c = x - h * dim;
        const int64_t block = slot / a.B, off = slot - block * a.B;
        const int64_t row =
            a.hnd ? (block * a.Hkv + h) * a.B + off : (block * a.B + off) * a.Hkv + h;
        e = row * dim + c;
        base = is_v ? a.vcache : a.cache;
    }
    if (a.fmt == RD_FP8) { /* MLA fp8_e4m3: code * k_scale, one f32 multiply */
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)base[e], __NV_E4M3);
        return __half2float(__half(h)) * a.scale;
    }
    if (a.fmt == RD_F32)
        return ((const float *)base)[e];
    if (a.fmt == RD_F16)
        return __half2float(((const __half *)base)[e]);
    return __bfloat162float(((const __nv_bfloat16 *)base)[e]);
}

static __device__ __forceinline__ void rd_store(void *p, kva_dtype dt, int64_t i, float x)
{
    if (dt == KVA_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == KVA_DTYPE_F16)
        ((uint16_t *)p)[i] = to_f16(x);
    else
        ((uint16_t *)p)[i] = to_bf16(x);
}

/* One CTA per token (grid-stride), threads over its K then V elements. */
__global__ void __launch_bounds__(256) cache_read_kernel(read_args a, kva_dtype dt)
{
    for (int32_t t = blockIdx.x; t < a.T; t += gridDim.x) {
        int64_t slot;
        if (a.slots)
            slot = a.slots[t];
        else
            slot = (int64_t)__ldg(a.bt_row + t / a.B) * a.B + t % a.B;
        if (slot < 0 || slot >= a.num_slots)
            continue;
        const int32_t nk = a.k ? a.kw : 0, nv = a.v ? a.vw : 0;
        for (int32_t e = threadIdx.x; e < nk + nv; e += blockDim.x) {
            const int is_v = e >= nk;
            const int32_t x = is_v ? e - nk : e;
            rd_store(is_v ? a.v : a.k, dt, (int64_t)t * (is_v ? a.vs : a.ks) + x,
                     rd_value(a, slot, is_v, x));
        }
    }
}

/* The read's arguments for cache c (formats checked by the caller). */
static read_args read_setup(const kva_cache *c)
{
    const kva_cache_desc *d = &c->desc;
    read_args a;
    memset(&a, 0, sizeof a);
    a.cache = (const unsigned char *)c->k;
    a.vcache = (const unsigned char *)c->v;
    a.num_slots = (int64_t)d->num_blocks * d->block_size;
    a.mla = d->kind == KVA_ATTN_MLA;
    a.Hkv = d->num_kv_heads;
    a.D = d->head_dim;
    a.Dv = d->head_dim_v;
    a.B = d->block_size;
    a.hnd = d->layout == KVA_LAYOUT_HND;
    a.kw = a.mla ? d->head_dim_v : d->num_kv_heads * d->head_dim;
    a.vw = a.mla ? d->head_dim - d->head_dim_v : d->num_kv_heads * d->head_dim_v;
    a.fmt = d->quant == KVA_QUANT_FP8_DS_MLA ? RD_DS_MLA
            : d->quant == KVA_QUANT_FP8_E4M3 ? RD_FP8
            : d->dtype == KVA_DTYPE_F32      ? RD_F32
            : d->dtype == KVA_DTYPE_F16      ? RD_F16
                                             : RD_BF16;
    a.row_bytes =
        d->quant == KVA_QUANT_FP8_DS_MLA ? kva__ds_mla_row_bytes(d->head_dim, d->head_dim_v) : 0;
    a.scale = d->quant == KVA_QUANT_FP8_E4M3 && c->k_scale ? c->k_scale[0] : 1.f;
    return a;
}

static kva_status read_launch(cudaStream_t s, const read_args &a, kva_dtype dt)
{
    const int grid = a.T < 65535 ? a.T : 65535;
    cache_read_kernel<<<grid, 256, 0, s>>>(a, dt);
    KVA_CUDA_LAUNCHED("cache_read_kernel");
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_cache_read(kva_context *ctx, const kva_cache *cache, int32_t n,
                                           const int64_t *slots, void *k, int64_t ks, void *v,
                                           int64_t vs, kva_dtype dst_dtype)
{
    const kva_cache_desc *d = &cache->desc;
    if (d->kind == KVA_ATTN_INDEX) /* index_cache.cu */
        return kva__cuda_index_cache_read(ctx, cache, n, slots, k, ks, dst_dtype);
    if (cache->device_id != ctx->device_id)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_cache_read: cache lives on device %d but the context uses %d",
                         (int)cache->device_id, (int)ctx->device_id);
    if (d->quant != KVA_QUANT_NONE && d->quant != KVA_QUANT_FP8_DS_MLA &&
        !(d->kind == KVA_ATTN_MLA && d->quant == KVA_QUANT_FP8_E4M3))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_cache_read: the CUDA backend reads back MLA caches and unquantized "
                         "MHA caches; this cache's format is %s (read it on a host copy: "
                         "kva_cache_swap_blocks)",
                         kva_quant_name(d->quant));
    read_args a = read_setup(cache);
    a.slots = slots;
    a.k = k;
    a.v = v;
    a.ks = ks;
    a.vs = vs;
    a.T = n;
    return read_launch(stream_of(ctx), a, dst_dtype);
}

extern "C" kva_status kva__cuda_mla_gather_rows(kva_context *ctx, const kva_cache *cache,
                                                const int32_t *bt_row, int32_t s, void *rows,
                                                kva_dtype dt)
{
    read_args a = read_setup(cache);
    const int64_t D = cache->desc.head_dim, es = kva_dtype_size(dt);
    a.bt_row = bt_row;
    a.k = rows;
    a.v = (char *)rows + (int64_t)cache->desc.head_dim_v * es;
    a.ks = D;
    a.vs = D;
    a.T = s;
    return read_launch(stream_of(ctx), a, dt);
}
