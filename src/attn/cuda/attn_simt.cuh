/*
 * attn_simt.cuh - the load policy of the CUDA-core attention kernel
 * (simt_kernel.cuh) for f32/f16/bf16 caches, paged or ragged: q, K/V and out
 * in the element type T. Instantiated per dtype (attn_simt_f32.cu,
 * attn_simt_f16.cu, attn_simt_bf16.cu) so the build compiles them in
 * parallel; attn_simt.cu holds the host side.
 *
 * Lane li of a group of LK lanes holds NCH chunks of 16 bytes (VEC elements)
 * of a key and a value row: channels (li + c*LK)*VEC .. +VEC for c < NCH.
 * f16/bf16 load through the cp.async ring of the kernel (3 CTAs/SM at 4 rows,
 * more bytes in flight) and reduce with the transposing step of
 * attn_xpose.cuh where U*ROWS >= LK; f32 loads into registers.
 */
#ifndef KVA_CUDA_ATTN_SIMT_CUH
#define KVA_CUDA_ATTN_SIMT_CUH

#include "simt_kernel.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef kva__simt_launch<kva__cuda_attn_args> attn_launch;

/* ---- element conversions (16-byte vectors of VEC elements) ---- */

template <typename T> struct vec_of;
template <> struct vec_of<float> {
    static constexpr int n = 4;
};
template <> struct vec_of<__half> {
    static constexpr int n = 8;
};
template <> struct vec_of<__nv_bfloat16> {
    static constexpr int n = 8;
};

__device__ __forceinline__ void to_float(const uint4 &u, float *f, const float *)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void bf2(uint32_t w, float *f)
{
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void to_float(const uint4 &u, float *f, const __nv_bfloat16 *)
{
    bf2(u.x, f);
    bf2(u.y, f + 2);
    bf2(u.z, f + 4);
    bf2(u.w, f + 6);
}
__device__ __forceinline__ void h2(uint32_t w, float *f)
{
    __half2 h = *reinterpret_cast<__half2 *>(&w);
    float2 x = __half22float2(h);
    f[0] = x.x;
    f[1] = x.y;
}
__device__ __forceinline__ void to_float(const uint4 &u, float *f, const __half *)
{
    h2(u.x, f);
    h2(u.y, f + 2);
    h2(u.z, f + 4);
    h2(u.w, f + 6);
}

__device__ __forceinline__ void store_elem(float *p, size_t i, float x)
{
    p[i] = x;
}
__device__ __forceinline__ void store_elem(__half *p, size_t i, float x)
{
    p[i] = __float2half_rn(x);
}
__device__ __forceinline__ void store_elem(__nv_bfloat16 *p, size_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

__device__ __forceinline__ uint4 ldg16(const void *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

/* The policy (simt_kernel.cuh says what each member is). */
template <typename T, int NCH> struct simt_load {
    typedef kva__cuda_attn_args Args;
    static constexpr int VEC = vec_of<T>::n, CHUNKS = NCH, KE = NCH * VEC, NCV = NCH, VV = VEC;
    static constexpr int U = NCH == 1 ? 4 : 2;
    static constexpr bool RING = VEC == 8, GROW_SKIP = false, NARROW = false, QO = false;
    struct Regs {
        uint4 k[U][NCH], v[U][NCH];
    };

    template <int ROWS> static __device__ __forceinline__ int32_t units(const Args &, int32_t n)
    {
        return n;
    }
    template <int ROWS>
    static __device__ __forceinline__ bool unit(const Args &a, int32_t u, int32_t,
                                                kva__simt_unit &w)
    {
        kva__simt_item_unit(a.meta.items[u], w);
        return true;
    }
    static __device__ __forceinline__ bool ragged(const Args &a)
    {
        return a.ragged;
    }

    template <int LK>
    static __device__ __forceinline__ void load_q(const Args &a, int64_t row, int32_t, int li,
                                                  float (&q)[KE], float &)
    {
        const T *qrow = (const T *)a.q + row * a.D;
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            const int d0 = (li + c * LK) * VEC;
            if (d0 < a.D)
                to_float(ldg16(qrow + d0), q + c * VEC, (const T *)nullptr);
        }
    }

    /* The 16-byte K and V chunks of the U keys kb + u*KPW + g (keys >= kend:
     * the block-table read clamped to key kend - 1, zeros instead of loads),
     * into registers or, ASYNC, copied into the lane's slots of one ring
     * stage (slot (u, c, K/V) at stage + ((u*NCH + c)*2 + kv)*32). */
    template <int LK, bool ASYNC>
    static __device__ __forceinline__ void copy(const Args &a, const kva__simt_addr &ka,
                                                const int32_t *bt_row, int64_t kvs, int32_t kb,
                                                int g, int li, int32_t kend, Regs &r, uint4 *stage)
    {
        constexpr int KPW = 32 / LK;
        const T *kp = (const T *)a.k;
        const T *vp = (const T *)a.v;
        int64_t row[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t j = kb + u * KPW + g;
            int64_t tsi;
            ok[u] = j < kend;
            row[u] = kva__simt_key_row(a.B, ka, bt_row, a.ragged, kvs, ok[u] ? j : kend - 1, &tsi);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                const int d0 = (li + c * LK) * VEC;
                const bool kok = ok[u] && d0 < a.D, vok = ok[u] && d0 < a.Dv;
                if constexpr (ASYNC) {
                    kva__simt_cp16(stage + ((u * NCH + c) * 2) * 32,
                                   kok ? kp + row[u] * a.D + d0 : kp, kok ? 16 : 0);
                    kva__simt_cp16(stage + ((u * NCH + c) * 2 + 1) * 32,
                                   vok ? vp + row[u] * a.Dv + d0 : vp, vok ? 16 : 0);
                } else {
                    r.k[u][c] = kok ? ldg16(kp + row[u] * a.D + d0) : make_uint4(0, 0, 0, 0);
                    r.v[u][c] = vok ? ldg16(vp + row[u] * a.Dv + d0) : make_uint4(0, 0, 0, 0);
                }
            }
        }
    }
    template <int LK>
    static __device__ __forceinline__ void issue(const Args &a, const kva__simt_addr &ka,
                                                 const int32_t *bt_row, int64_t kvs, int32_t kb,
                                                 int g, int li, int32_t kend, Regs &r)
    {
        copy<LK, false>(a, ka, bt_row, kvs, kb, g, li, kend, r, nullptr);
    }
    template <int LK>
    static __device__ __forceinline__ void
    issue_async(const Args &a, const kva__simt_addr &ka, const int32_t *bt_row, int64_t kvs,
                int32_t kb, int g, int li, int32_t kend, uint4 *stage)
    {
        Regs unused;
        copy<LK, true>(a, ka, bt_row, kvs, kb, g, li, kend, unused, stage);
    }
    static __device__ __forceinline__ void ring_read(const uint4 *cur, Regs &r)
    {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                r.k[u][c] = cur[((u * NCH + c) * 2) * 32];
                r.v[u][c] = cur[((u * NCH + c) * 2 + 1) * 32];
            }
    }

    static __device__ __forceinline__ void k_float(const Regs &r, int u, float (&kf)[KE])
    {
#pragma unroll
        for (int c = 0; c < NCH; c++)
            to_float(r.k[u][c], kf + c * VEC, (const T *)nullptr);
    }
    static __device__ __forceinline__ void v_float(const Regs &r, int u, int c, float (&vf)[VV])
    {
        to_float(r.v[u][c], vf, (const T *)nullptr);
    }
    static __device__ __forceinline__ float score(const Args &, const Regs &, int, float dot, float)
    {
        return dot;
    }
    static __device__ __forceinline__ float value(const Args &, int32_t, int32_t, float O, float)
    {
        return O;
    }
    static __device__ __forceinline__ void store(const Args &a, int64_t i, float o)
    {
        store_elem((T *)a.out, (size_t)i, o);
    }
};

/* The instantiation for element type T covering dmax channels with ROWS rows
 * (f16/bf16: 8 elements per 16 bytes, so 32 lanes cover D = 256 with one
 * chunk; f32 needs two chunks per lane past D = 128). */
template <typename T, int ROWS> static attn_launch simt_pick_rows(int32_t dmax)
{
    constexpr int VEC = vec_of<T>::n;
    const int chunks = (dmax + VEC - 1) / VEC;
    if (chunks <= 8)
        return kva__simt_make<simt_load<T, 1>, 8, ROWS>();
    if (chunks <= 16)
        return kva__simt_make<simt_load<T, 1>, 16, ROWS>();
    if constexpr (VEC == 8)
        return kva__simt_make<simt_load<T, 1>, 32, ROWS>();
    else {
        if (chunks <= 32)
            return kva__simt_make<simt_load<T, 1>, 32, ROWS>();
        return kva__simt_make<simt_load<T, 2>, 32, ROWS>();
    }
}

template <typename T> static attn_launch simt_pick(int32_t dmax, int rows)
{
    return rows <= 4 ? simt_pick_rows<T, 4>(dmax) : simt_pick_rows<T, 8>(dmax);
}

/* attn_simt_{f32,f16,bf16}.cu: the instantiation for dmax channels and rows. */
attn_launch kva__simt_pick_f32(int32_t dmax, int rows);
attn_launch kva__simt_pick_f16(int32_t dmax, int rows);
attn_launch kva__simt_pick_bf16(int32_t dmax, int rows);

#endif /* KVA_CUDA_ATTN_SIMT_CUH */
