/*
 * mma_ptx.cuh - the PTX wrappers shared by the tensor-core kernels
 * (decode_mma.cu, decode_mma_quant.cu, prefill_mma.cu): cp.async, ldmatrix,
 * ex2 and mma.sync m16n8k16 with fp32 accumulation, the element-type
 * traits (bf16, f16) of the mma operands and the programmatic dependent
 * launch controls (sm_90).
 */
#ifndef KVA_CUDA_MMA_PTX_CUH
#define KVA_CUDA_MMA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Shared-memory address of a generic pointer into shared memory. */
static __device__ __forceinline__ uint32_t kva__smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16-byte global -> shared copy; src_bytes 0 writes zeros and reads nothing
 * (src must still be a valid address). */
static __device__ __forceinline__ void kva__cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
/* An L2 cache policy for data a kernel reads once (a decode's K/V stream):
 * the lines it brings into L2 are the first evicted, so the small metadata
 * every call reads first (header, items, block table) and the split
 * partials stay in L2 from one call to the next instead of being pushed out
 * by a stream larger than L2. */
static __device__ __forceinline__ uint64_t kva__l2_evict_first()
{
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
/* kva__cp_async16 under L2 cache policy pol (kva__l2_evict_first). */
static __device__ __forceinline__ void kva__cp_async16_pol(uint32_t dst, const void *src,
                                                           int src_bytes, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes), "l"(pol)
                 : "memory");
}
/* 4-byte global -> shared copy (zero-fill when src_bytes = 0). */
static __device__ __forceinline__ void kva__cp_async4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void kva__cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void kva__cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Four 8x8 b16 matrices (r[i] from the addresses of lanes 8i .. 8i + 7). */
static __device__ __forceinline__ void kva__ldsm_x4(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
static __device__ __forceinline__ void kva__ldsm_x4_trans(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* 2^x (approximate, flush to zero). */
static __device__ __forceinline__ float kva__ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Byte offset of 16-byte chunk c of row r in a swizzled [rows, D] tile of
 * 2-byte elements (D / 8 chunks per row, chunk c of row r lives at
 * c ^ (r & 7); D / 8 >= 8). */
template <int D> static __device__ __forceinline__ uint32_t kva__swz(int r, int c)
{
    return (uint32_t)((r * (D / 8) + (c ^ (r & 7))) * 16);
}

/* Element types: C [16, 8] += A [16, 16] B [16, 8], fp32 pair packing into
 * the A operand, scalar store. */
struct kva__mma_bf16 {
    typedef __nv_bfloat16 elem;
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void store(elem *p, float x)
    {
        *p = __float2bfloat16_rn(x);
    }
};
struct kva__mma_f16 {
    typedef __half elem;
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void store(elem *p, float x)
    {
        *p = __float2half_rn(x);
    }
};

/* Programmatic dependent launch (sm_90+; no-ops on earlier passes and in a
 * grid not launched as a dependent): kva__pdl_wait blocks until the kernels
 * the grid depends on have completed and their writes are visible;
 * kva__pdl_launch_dependents lets the next kernel in the stream launch once
 * every CTA of this grid has called it or exited. */
static __device__ __forceinline__ void kva__pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void kva__pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#endif
