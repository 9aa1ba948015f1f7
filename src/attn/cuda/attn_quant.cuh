/*
 * attn_quant.cuh - the load policy of the CUDA-core attention kernel
 * (simt_kernel.cuh) over quantized caches (KVA_QUANT_INT8_CHANNEL,
 * INT8_TOKEN_K, INT8_TOKEN_K_V16, FP8_E4M3), instantiated per format family
 * (attn_quant_i8.cu, attn_quant_fp8.cu, attn_quant_v16.cu) so the build
 * compiles them in parallel; attn_quant.cu holds the host side.
 *
 * The design is docs/cuda.md, "decode_simt over quantized caches": each lane
 * reads 1-byte K and V codes (2-byte V for INT8_TOKEN_K_V16) with 16-byte
 * loads (8-byte for the ROWS = 8 instantiation and head sizes not a multiple
 * of 16) and dequantizes them in registers (attn_quant_ld.cuh); static key
 * scales are folded into q once per unit (offsets as one constant per row,
 * qo), per-token key scales multiply each score, V scales and offsets the
 * output at the end (out_d = s_d (acc_d - o_d l) / l). Units of work: the
 * plan's items and, with prefill tiles, each tile's 128 packed rows cut into
 * 128 / ROWS units over the request's keys (NARROW: only the keys some row of
 * the unit sees).
 */
#ifndef KVA_CUDA_ATTN_QUANT_CUH
#define KVA_CUDA_ATTN_QUANT_CUH

#include "simt_kernel.cuh" /* first: kvattn.h for attn_quant_ld.cuh */
#include "attn_quant_ld.cuh"

typedef struct qa_args {
    kva__cuda_meta meta;
    const int32_t *ptiles; /* [n, 4] prefill tiles {r, m0, kvh, 0}, or NULL */
    const void *q;         /* [T, H, D] in qdt */
    const uint8_t *k;      /* K codes in the cache layout */
    const uint8_t *v;      /* V codes (or f16/bf16) in the cache layout */
    const float *kts;      /* [NB, Hkv, B] per-token key scales, or NULL */
    const float *ks, *ko;  /* [Hkv, D] static K scale / offset */
    const float *vs, *vo;  /* [Hkv, Dv] static V scale / offset */
    const float *sinks;    /* [H] or NULL */
    void *out;             /* [T, H, Dv] in qdt */
    float *lse;            /* [T, H] or NULL */
    float *ws;             /* split partials */
    int32_t H, Hkv, G, D, Dv, B;
    int32_t isub; /* units per item (item rows up to isub * ROWS); 0: items run elsewhere */
    int32_t layout_hnd, causal, window_left, chunk, has_alibi, qdt; /* chunk: attention_chunk */
    float scale, softcap;
} qa_args;

/* Unit u of the persistent loop: the plan's items cut into isub units of
 * ROWS rows (sub-unit major: units sub * n_items + item, so the empty sub-
 * units of short items come last), then the prefill tiles' units of ROWS
 * rows; returns 0 for a unit past its item's (or request's) rows. */
template <int ROWS>
__device__ __forceinline__ int qa_get_unit(const qa_args &a, int32_t u, int32_t n_items,
                                           kva__simt_unit &w)
{
    const int32_t n_iu = n_items * a.isub;
    if (u < n_iu) {
        const int32_t sub = u / n_items, i = u - sub * n_items;
        const kva__cuda_item it = a.meta.items[i];
        w.req = it.req, w.kvh = it.kv_head, w.h0 = it.h0, w.nh = it.nh, w.i0 = it.i0;
        w.ntot = it.nq * it.nh;
        w.mstart = sub * ROWS;
        const int32_t left = w.ntot - w.mstart;
        w.nrows = left < ROWS ? left : ROWS;
        w.k0 = it.k0, w.k1 = it.k1;
        w.task = it.task, w.split = it.split;
        return w.nrows > 0;
    }
    constexpr int SUB = KVA__CUDA_PREFILL_TILE_M / ROWS;
    const int32_t t = (u - n_iu) / SUB, sub = (u - n_iu) - t * SUB;
    const int32_t *tile = a.ptiles + (int64_t)t * KVA__CUDA_PREFILL_TILE_INTS;
    w.req = tile[0], w.kvh = tile[2], w.h0 = 0, w.nh = a.G, w.i0 = 0;
    const int32_t q_len = a.meta.qsl[w.req + 1] - a.meta.qsl[w.req];
    w.mstart = tile[1] + sub * ROWS;
    const int32_t left = q_len * a.G - w.mstart;
    w.nrows = left < ROWS ? left : ROWS;
    w.ntot = 0;
    w.k0 = 0, w.k1 = a.meta.seq_lens[w.req];
    w.task = -1, w.split = 0;
    return w.nrows > 0;
}

/*
 * The policy (simt_kernel.cuh says what each member is). LK lanes per key
 * row; lane li holds K channels li*CB .. +CB (one chunk) and V chunks c < VB
 * of CB bytes: channels (li + c*LK)*VV .. +VV.
 */
template <int FMT, int CB> struct qa_load {
    typedef qa_args Args;
    static constexpr int VB = FMT >= QF_I8_F16 ? 2 : 1;
    static constexpr int CHUNKS = 1, KE = CB, NCV = VB, VV = CB / VB, U = 2;
    static constexpr bool RING = false, GROW_SKIP = true, NARROW = true, QO = FMT == QF_I8;
    struct Regs {
        chunk<CB> k[U], v[U][VB];
        float ts[U]; /* per-token key scales (INT8_TOKEN_K*) */
    };

    template <int ROWS>
    static __device__ __forceinline__ int32_t units(const Args &a, int32_t n_items)
    {
        const int32_t n_tiles = a.ptiles ? a.meta.hdr[KVA_CUDA_HDR_PTILES] : 0;
        return n_items * a.isub + n_tiles * (KVA__CUDA_PREFILL_TILE_M / ROWS);
    }
    template <int ROWS>
    static __device__ __forceinline__ bool unit(const Args &a, int32_t u, int32_t n_items,
                                                kva__simt_unit &w)
    {
        return qa_get_unit<ROWS>(a, u, n_items, w);
    }
    static __device__ __forceinline__ bool ragged(const Args &)
    {
        return false;
    }

    /* q times the static K scales (unit scales for the per-token formats);
     * o: this lane's share of qo, the row's sum of q'_c o_c (INT8_CHANNEL
     * offsets). An infinite q'_c is left out of it, as kva__q_offset_dot
     * does for the tensor-core kernels: -inf o_c there made every score of
     * the row inf - inf = NaN; without it the channel adds q'_c c, whose
     * sign is the code's (kvattn.h's INT8_CHANNEL exception). */
    template <int LK>
    static __device__ __forceinline__ void load_q(const Args &a, int64_t row, int32_t kvh, int li,
                                                  float (&q)[KE], float &o)
    {
        const int d0 = li * KE;
        if (d0 < a.D) {
            const int64_t qb = row * a.D + d0;
            const int64_t sb = (int64_t)kvh * a.D + d0;
#pragma unroll
            for (int e = 0; e < KE; e++) {
                const float x = ::load_q(a.q, a.qdt, qb + e) * a.ks[sb + e];
                q[e] = x;
                if constexpr (FMT == QF_I8)
                    o = fmaf(isinf(x) ? 0.f : x, a.ko[sb + e], o);
            }
        }
    }

    template <int LK>
    static __device__ __forceinline__ void issue(const Args &a, const kva__simt_addr &ka,
                                                 const int32_t *bt_row, int64_t, int32_t kb, int g,
                                                 int li, int32_t kend, Regs &r)
    {
        constexpr int KPW = 32 / LK;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t j = kb + u * KPW + g;
            zero(r.k[u]);
#pragma unroll
            for (int c = 0; c < VB; c++)
                zero(r.v[u][c]);
            r.ts[u] = 0.f;
            if (j < kend) {
                int64_t tsi;
                const int64_t row = kva__simt_key_row(a.B, ka, bt_row, false, 0, j, &tsi);
                if (li * CB < a.D)
                    r.k[u] = ldc<CB>(a.k + row * a.D + li * CB);
#pragma unroll
                for (int c = 0; c < VB; c++) {
                    const int d0 = (li + c * LK) * VV;
                    if (d0 < a.Dv)
                        r.v[u][c] = ldc<CB>(a.v + (row * a.Dv + d0) * VB);
                }
                if (a.kts)
                    r.ts[u] = __ldg(a.kts + tsi);
            }
        }
    }
    template <int LK>
    static __device__ __forceinline__ void issue_async(const Args &, const kva__simt_addr &,
                                                       const int32_t *, int64_t, int32_t, int, int,
                                                       int32_t, uint4 *)
    {
    }
    static __device__ __forceinline__ void ring_read(const uint4 *, Regs &) {}

    static __device__ __forceinline__ void k_float(const Regs &r, int u, float (&kf)[KE])
    {
        deq_k<FMT, CB>(r.k[u], kf);
    }
    static __device__ __forceinline__ void v_float(const Regs &r, int u, int c, float (&vf)[VV])
    {
        deq_v<FMT, CB>(r.v[u][c], vf);
    }
    /* K per token: s_t * dot; K static: dot - qo. */
    static __device__ __forceinline__ float score(const Args &a, const Regs &r, int u, float dot,
                                                  float qo)
    {
        return a.kts ? dot * r.ts[u] : dot - qo;
    }
    /* The static V scales and offsets (per-token formats: V as stored). */
    static __device__ __forceinline__ float value(const Args &a, int32_t kvh, int32_t d, float O,
                                                  float L)
    {
        if constexpr (FMT == QF_I8 || FMT == QF_FP8) {
            const int64_t sv = (int64_t)kvh * a.Dv + d;
            return FMT == QF_I8 ? a.vs[sv] * (O - a.vo[sv] * L) : a.vs[sv] * O;
        }
        return O;
    }
    static __device__ __forceinline__ void store(const Args &a, int64_t i, float o)
    {
        store_out(a.out, a.qdt, i, o);
    }
};

typedef kva__simt_launch<qa_args> qa_launch;

template <int FMT, int ROWS, int CB> static qa_launch qa_pick_lk(int lk)
{
    typedef qa_load<FMT, CB> P;
    if constexpr (CB == 16) {
        return lk <= 8 ? kva__simt_make<P, 8, ROWS>() : kva__simt_make<P, 16, ROWS>();
    } else {
        return lk <= 8    ? kva__simt_make<P, 8, ROWS>()
               : lk <= 16 ? kva__simt_make<P, 16, ROWS>()
                          : kva__simt_make<P, 32, ROWS>();
    }
}

template <int FMT> static qa_launch qa_pick_fmt(int rows16, int lk)
{
    return rows16 ? qa_pick_lk<FMT, 4, 16>(lk) : qa_pick_lk<FMT, 8, 8>(lk);
}

/* attn_quant_{i8,fp8,v16}.cu: the instantiation of format fmt (QF_*) for
 * ROWS 4 with 16-byte chunks (rows16) or ROWS 8 with 8-byte ones, lk lanes. */
qa_launch kva__qa_pick_i8(int rows16, int lk);
qa_launch kva__qa_pick_fp8(int rows16, int lk);
qa_launch kva__qa_pick_v16(int fmt, int rows16, int lk);

#endif /* KVA_CUDA_ATTN_QUANT_CUH */
