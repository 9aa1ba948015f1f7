/*
 * dcp_nccl_kernels.cu - the device work of the NCCL combine (dcp_nccl.c),
 * compiled into kvattn_nccl. One kernel on each side of the collective, so a
 * combine is three enqueued operations (A2A: pack, grouped send/recv, merge)
 * or four (AG_RS: all-gather, rescale, reduce-scatter, convert):
 *   a2a_pack: this rank's partial rows of the heads of every OTHER rank k,
 *     with their lses, into k's block of the send buffer ([T][Hn][Dv] in the
 *     output dtype, then [T][Hn] float32); this rank's own rows are not
 *     copied (the merge reads them where the attention wrote them).
 *   a2a_merge: the LSE-weighted merge of the N parts of each row of this
 *     rank's heads (the N - 1 received blocks and the local partial), one
 *     rounding to the output dtype; writes lse_out.
 *   agrs_rescale: after the all-gather of the LSEs, each (token, head) row of
 *     this rank's partial weighted by exp(lse_part - lse), lse = log sum_p
 *     exp(lse_p), stored in float32 destination-major ([N][T][Hn][Dv]: block
 *     k holds the rows of rank k's heads) for ncclReduceScatter; the rows of
 *     this rank's own heads also give lse_out.
 *   agrs_convert: the reduced float32 rows [T*Hn*Dv] into the output dtype.
 * Row semantics are kva_merge_states_n's: a part whose weight is 0 is not
 * read (its partial may hold anything), all parts -inf give 0 and -inf, any
 * NaN lse gives a NaN row and lse.
 * Every kernel gives a thread one run of V elements of a row: V = 16 bytes
 * worth (8 f16/bf16, 4 f32) when the caller's tensors are 16-byte aligned
 * (VEC; one 16-byte access per run), else V = 1.
 */
#include "kvattn.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ float to_f<__half>(__half x)
{
    return __half2float(x);
}
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half from_f<__half>(float x)
{
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* A run of V elements of T, read and written as one 16-byte access when
 * VEC (the pointer is then 16-byte aligned), element by element otherwise. */
template <typename T, bool VEC> struct run_io {
    static constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
    static __device__ __forceinline__ void load(const T *p, float (&x)[V])
    {
        if (VEC) {
            const uint4 u = *reinterpret_cast<const uint4 *>(p);
            const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
            for (int i = 0; i < V; i++)
                x[i] = to_f(e[i]);
        } else {
            x[0] = to_f(p[0]);
        }
    }
    static __device__ __forceinline__ void store(T *p, const float (&x)[V])
    {
        if (VEC) {
            uint4 u;
            T *e = reinterpret_cast<T *>(&u);
#pragma unroll
            for (int i = 0; i < V; i++)
                e[i] = from_f<T>(x[i]);
            *reinterpret_cast<uint4 *>(p) = u;
        } else {
            p[0] = from_f<T>(x[0]);
        }
    }
};

/* V floats to p (16-byte aligned when VEC: V is then 4 or 8). */
template <int V, bool VEC>
__device__ __forceinline__ void store_floats(float *p, const float (&x)[V])
{
    if (VEC) {
#pragma unroll
        for (int i = 0; i < V; i += 4)
            *reinterpret_cast<float4 *>(p + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++)
            p[i] = x[i];
    }
}

/* The merged lse of a row's N part lses lse_of(p): its max *m, whether any
 * is NaN, and the sum of exp(lse_p - m) (0 when every part is -inf). */
template <typename F>
__device__ __forceinline__ float lse_sum(int32_t N, F lse_of, float *m_out, bool *nan_out)
{
    float m = -INFINITY;
    bool nan = false;
    for (int32_t p = 0; p < N; p++) {
        const float l = lse_of(p);
        nan |= l != l;
        m = l > m ? l : m;
    }
    float sum = 0.f;
    if (!nan && m != -INFINITY)
        for (int32_t p = 0; p < N; p++)
            sum += expf(lse_of(p) - m);
    *m_out = m;
    *nan_out = nan;
    return sum;
}

/* Pack (see the top). Work item i < T*H*units copies copy unit u of row
 * n = t*H + h (out_part [T*H][units] in units U); the T*H items after it
 * copy lse_part [T*H]. Block k of send starts at k * block bytes: out rows
 * [T][Hn][units], then lses [T][Hn] at out_bytes. */
template <typename U>
__global__ void __launch_bounds__(256)
    a2a_pack_kernel(int32_t N, int32_t Tn, int32_t H, int32_t rank, int32_t units, size_t block,
                    size_t out_bytes, const U *out_part, const float *lse_part, char *send)
{
    const int32_t Hn = H / N;
    const int64_t rows = (int64_t)Tn * H, outs = rows * units;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < outs + rows; i += stride) {
        const bool is_out = i < outs;
        const int64_t n = is_out ? i / units : i - outs;
        const int32_t t = (int32_t)(n / H), h = (int32_t)(n % H), k = h / Hn;
        if (k == rank)
            continue;
        const int64_t r = (int64_t)t * Hn + h % Hn; /* the row in k's block */
        char *b = send + (size_t)k * block;
        if (is_out)
            reinterpret_cast<U *>(b)[r * units + i % units] = out_part[i];
        else
            reinterpret_cast<float *>(b + out_bytes)[r] = lse_part[n];
    }
}

/* Merge (see the top). out [T][Hn][Dv], lse_out [T][Hn] (or NULL): row
 * n = t*Hn + j merges part p = rank (out_part [T][H][Dv] row t*H + rank*Hn + j,
 * lse_part likewise) and, for p != rank, row n of recv's block p (laid out
 * as the pack's). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256)
    a2a_merge_kernel(int32_t N, int32_t Tn, int32_t H, int32_t Dv, int32_t rank, size_t block,
                     size_t out_bytes, const T *out_part, const float *lse_part, const char *recv,
                     T *out, float *lse_out)
{
    typedef run_io<T, VEC> io;
    constexpr int V = io::V;
    const int32_t Hn = H / N, runs = Dv / V;
    const int64_t rows = (int64_t)Tn * Hn;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * runs; i += stride) {
        const int64_t n = i / runs;
        const int32_t c = (int32_t)(i % runs) * V;
        const int64_t own = (n / Hn) * H + (int64_t)rank * Hn + n % Hn;
        auto lse_of = [&](int32_t p) {
            return p == rank
                       ? lse_part[own]
                       : reinterpret_cast<const float *>(recv + (size_t)p * block + out_bytes)[n];
        };
        float m, x[V], acc[V];
        bool nan;
        const float sum = lse_sum(N, lse_of, &m, &nan);
        if (nan || m == -INFINITY) {
#pragma unroll
            for (int e = 0; e < V; e++)
                acc[e] = nan ? NAN : 0.f;
            io::store(out + n * Dv + c, acc);
            if (lse_out && c == 0)
                lse_out[n] = nan ? NAN : -INFINITY;
            continue;
        }
#pragma unroll
        for (int e = 0; e < V; e++)
            acc[e] = 0.f;
        for (int32_t p = 0; p < N; p++) {
            const float wp = expf(lse_of(p) - m);
            if (wp == 0.f)
                continue;
            const T *src = p == rank
                               ? out_part + own * Dv
                               : reinterpret_cast<const T *>(recv + (size_t)p * block) + n * Dv;
            io::load(src + c, x);
#pragma unroll
            for (int e = 0; e < V; e++)
                acc[e] += wp * x[e];
        }
        const float inv = 1.f / sum;
#pragma unroll
        for (int e = 0; e < V; e++)
            acc[e] *= inv;
        io::store(out + n * Dv + c, acc);
        if (lse_out && c == 0)
            lse_out[n] = m + logf(sum);
    }
}

/* Rescale (see the top). lses [N][T*H] (gathered), lse_part [T*H], out_part
 * [T*H][Dv]; send [N][T][Hn][Dv] float32; lse_out [T][Hn] (or NULL) for the
 * heads of rank `rank`. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256)
    agrs_rescale_kernel(int32_t N, int32_t Tn, int32_t H, int32_t Dv, int32_t rank,
                        const float *lses, const float *lse_part, const T *out_part, float *send,
                        float *lse_out)
{
    typedef run_io<T, VEC> io;
    constexpr int V = io::V;
    const int32_t Hn = H / N, runs = Dv / V;
    const int64_t rows = (int64_t)Tn * H;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * runs; i += stride) {
        const int64_t n = i / runs;
        const int32_t c = (int32_t)(i % runs) * V;
        float m;
        bool nan;
        const float sum = lse_sum(
            N, [&](int32_t p) { return lses[p * rows + n]; }, &m, &nan);
        float lse = -INFINITY, w = 0.f;
        if (nan)
            lse = w = NAN;
        else if (m != -INFINITY)
            lse = m + logf(sum), w = expf(lse_part[n] - lse);
        const int32_t t = (int32_t)(n / H), h = (int32_t)(n % H), k = h / Hn;
        float x[V];
        if (w == 0.f) {
#pragma unroll
            for (int e = 0; e < V; e++)
                x[e] = 0.f;
        } else {
            io::load(out_part + n * Dv + c, x);
#pragma unroll
            for (int e = 0; e < V; e++)
                x[e] *= w;
        }
        store_floats<V, VEC>(send + (((int64_t)k * Tn + t) * Hn + h % Hn) * Dv + c, x);
        if (lse_out && c == 0 && k == rank)
            lse_out[(int64_t)t * Hn + h % Hn] = lse;
    }
}

/* Convert: n floats of src (a multiple of V) into dst. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) agrs_convert_kernel(int64_t n, const float *src, T *dst)
{
    typedef run_io<T, VEC> io;
    constexpr int V = io::V;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / V; i += stride) {
        float x[V];
        if (VEC) {
#pragma unroll
            for (int e = 0; e < V; e += 4) {
                const float4 f = reinterpret_cast<const float4 *>(src + i * V)[e / 4];
                x[e] = f.x, x[e + 1] = f.y, x[e + 2] = f.z, x[e + 3] = f.w;
            }
        } else {
            x[0] = src[i];
        }
        io::store(dst + i * V, x);
    }
}

/* Blocks of 256 threads for `work` work items, at most 65535 (the kernels
 * stride over the rest). */
static int grid_of(int64_t work)
{
    const int64_t g = (work + 255) / 256;
    return g < 1 ? 1 : g > 65535 ? 65535 : (int)g;
}

/* The launches of kernel template K for dtype dt (F32, F16 or BF16) and VEC,
 * its arguments after the type: one switch for the three entry points. */
#define DISPATCH(dt, vec, LAUNCH)                                                                  \
    do {                                                                                           \
        if (dt == KVA_DTYPE_F32)                                                                   \
            vec ? LAUNCH(float, true) : LAUNCH(float, false);                                      \
        else if (dt == KVA_DTYPE_F16)                                                              \
            vec ? LAUNCH(__half, true) : LAUNCH(__half, false);                                    \
        else                                                                                       \
            vec ? LAUNCH(__nv_bfloat16, true) : LAUNCH(__nv_bfloat16, false);                      \
    } while (0)

/* The pack on stream s: es bytes per element; vec: out_part 16-byte aligned
 * (send and block are). Shapes above. */
extern "C" cudaError_t kva__dcp_nccl_a2a_pack(cudaStream_t s, size_t es, int vec, int32_t N,
                                              int32_t Tn, int32_t H, int32_t Dv, int32_t rank,
                                              size_t block, size_t out_bytes, const void *out_part,
                                              const float *lse_part, void *send)
{
    const size_t unit = vec ? 16 : es;
    const int32_t units = (int32_t)((size_t)Dv * es / unit);
    const int grid = grid_of((int64_t)Tn * H * (units + 1));
    char *b = (char *)send;
    if (vec)
        a2a_pack_kernel<uint4><<<grid, 256, 0, s>>>(N, Tn, H, rank, units, block, out_bytes,
                                                    (const uint4 *)out_part, lse_part, b);
    else if (es == 4)
        a2a_pack_kernel<uint32_t><<<grid, 256, 0, s>>>(N, Tn, H, rank, units, block, out_bytes,
                                                       (const uint32_t *)out_part, lse_part, b);
    else
        a2a_pack_kernel<uint16_t><<<grid, 256, 0, s>>>(N, Tn, H, rank, units, block, out_bytes,
                                                       (const uint16_t *)out_part, lse_part, b);
    return cudaGetLastError();
}

/* The merge on stream s (vec: out_part and out 16-byte aligned). */
extern "C" cudaError_t kva__dcp_nccl_a2a_merge(cudaStream_t s, kva_dtype dt, int vec, int32_t N,
                                               int32_t Tn, int32_t H, int32_t Dv, int32_t rank,
                                               size_t block, size_t out_bytes, const void *out_part,
                                               const float *lse_part, const void *recv, void *out,
                                               float *lse_out)
{
    const int64_t work = (int64_t)Tn * (H / N) * Dv / (vec ? 16 / (int64_t)kva_dtype_size(dt) : 1);
#define MERGE(T, V)                                                                                \
    a2a_merge_kernel<T, V><<<grid_of(work), 256, 0, s>>>(N, Tn, H, Dv, rank, block, out_bytes,     \
                                                         (const T *)out_part, lse_part,            \
                                                         (const char *)recv, (T *)out, lse_out)
    DISPATCH(dt, vec, MERGE);
#undef MERGE
    return cudaGetLastError();
}

/* The rescale on stream s (vec: out_part 16-byte aligned). */
extern "C" cudaError_t kva__dcp_nccl_rescale(cudaStream_t s, kva_dtype dt, int vec, int32_t N,
                                             int32_t Tn, int32_t H, int32_t Dv, int32_t rank,
                                             const float *lses, const float *lse_part,
                                             const void *out_part, float *send, float *lse_out)
{
    const int64_t work = (int64_t)Tn * H * Dv / (vec ? 16 / (int64_t)kva_dtype_size(dt) : 1);
#define RESCALE(T, V)                                                                              \
    agrs_rescale_kernel<T, V><<<grid_of(work), 256, 0, s>>>(N, Tn, H, Dv, rank, lses, lse_part,    \
                                                            (const T *)out_part, send, lse_out)
    DISPATCH(dt, vec, RESCALE);
#undef RESCALE
    return cudaGetLastError();
}

/* n float32 elements of src into dst in dtype F16 or BF16 on stream s (vec:
 * dst 16-byte aligned and n a multiple of 8). */
extern "C" cudaError_t kva__dcp_nccl_convert(cudaStream_t s, kva_dtype dt, int vec, int64_t n,
                                             const float *src, void *dst)
{
    const int grid = grid_of(vec ? n / 8 : n);
    if (dt == KVA_DTYPE_F16)
        vec ? agrs_convert_kernel<__half, true><<<grid, 256, 0, s>>>(n, src, (__half *)dst)
            : agrs_convert_kernel<__half, false><<<grid, 256, 0, s>>>(n, src, (__half *)dst);
    else
        vec ? agrs_convert_kernel<__nv_bfloat16, true>
            <<<grid, 256, 0, s>>>(n, src, (__nv_bfloat16 *)dst)
            : agrs_convert_kernel<__nv_bfloat16, false>
            <<<grid, 256, 0, s>>>(n, src, (__nv_bfloat16 *)dst);
    return cudaGetLastError();
}
