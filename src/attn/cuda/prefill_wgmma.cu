/*
 * prefill_wgmma.cu - host side of the sm_90a wgmma prefill kernel
 * (prefill_wgmma_kernel.cuh: the kernel and how it works; its
 * instantiations per head-size pair: prefill_wgmma_d{64,128,192,256}.cu):
 * whether the build and device can run it, the TMA tensor maps over the
 * paged cache, and the dispatch on (D, Dv).
 */
#include "prefill_wgmma_kernel.cuh"

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

/* Fills tm for the TMA kernel (wg_tmaps) of bn keys per K/V tile (boxes of
 * min(B, bn) rows); tm->ok = 0 where the cache cannot be described or the
 * driver refuses (the kernel then uses cp.async only). With a host cache
 * (a->host_cache) the encoder is looked up once and the maps are reused while
 * they describe the same tensors with the same boxes. */
void kva__wg_tmaps_encode(const kva__cuda_prefill_args *a, wg_tmaps *tm, int bn)
{
    const int32_t DK = a->head_dim, DV = a->head_dim_v;
    static_assert(sizeof(wg_tmaps) <= sizeof(((kva__cuda_prefill_host_cache *)0)->tmaps),
                  "host cache too small for the tensor maps");
    kva__cuda_prefill_host_cache *hc = a->host_cache;
    memset(tm, 0, sizeof *tm);
    const int B = a->block_size;
    if (a->num_blocks <= 0 || B < 8 || (B & (B - 1)) != 0)
        return;
    if (hc && hc->tm_valid && hc->tm_k == a->k && hc->tm_v == a->v && hc->tm_nb == a->num_blocks &&
        hc->tm_b == B && hc->tm_hkv == a->num_kv_heads && hc->tm_layout == (int32_t)a->layout &&
        hc->tm_dtype == (int32_t)a->dtype && hc->tm_dk == DK && hc->tm_dv == DV &&
        hc->tm_bn == bn) {
        memcpy(tm, hc->tmaps, sizeof *tm);
        return;
    }
    void *fn = hc ? hc->tmap_encode : NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn) {
            (void)cudaGetLastError();
            return;
        }
        if (hc)
            hc->tmap_encode = fn;
    }
    PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const int nhd = a->layout == KVA_LAYOUT_NHD, R = B < bn ? B : bn;
    const cuuint64_t Hkv = (cuuint64_t)a->num_kv_heads;
    const cuuint32_t box[4] = {64, nhd ? 1u : (cuuint32_t)R, nhd ? (cuuint32_t)R : 1u, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const CUtensorMapDataType dt = a->dtype == KVA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    for (int i = 0; i < 2; i++) {
        /* (D, Hkv, B, NB) for NHD, (D, B, Hkv, NB) for HND, D = DK for K and
         * DV for V; strides in bytes of dimensions 1..3. */
        const cuuint64_t d = (cuuint64_t)(i ? DV : DK), row = d * 2;
        const cuuint64_t dims[4] = {d, nhd ? Hkv : (cuuint64_t)B, nhd ? (cuuint64_t)B : Hkv,
                                    (cuuint64_t)a->num_blocks};
        const cuuint64_t strides[3] = {row, row * dims[1], row * dims[1] * dims[2]};
        CUresult r = encode(i ? &tm->v : &tm->k, dt, 4, (void *)(i ? a->v : a->k), dims, strides,
                            box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) {
            memset(tm, 0, sizeof *tm);
            return;
        }
    }
    tm->ok = 1;
    tm->box_rows = R;
    if (hc) {
        memcpy(hc->tmaps, tm, sizeof *tm);
        hc->tm_k = a->k;
        hc->tm_v = a->v;
        hc->tm_nb = a->num_blocks;
        hc->tm_b = B;
        hc->tm_hkv = a->num_kv_heads;
        hc->tm_layout = (int32_t)a->layout;
        hc->tm_dtype = (int32_t)a->dtype;
        hc->tm_dk = DK;
        hc->tm_dv = DV;
        hc->tm_bn = bn;
        hc->tm_valid = 1;
    }
}

extern "C" int kva__cuda_prefill_wgmma_dims(int32_t head_dim, int32_t head_dim_v)
{
    return (head_dim == 128 && head_dim_v == 128) || (head_dim == 64 && head_dim_v == 64) ||
           (head_dim == 192 && head_dim_v == 128) || (head_dim == 256 && head_dim_v == 256);
}

/* Called by kva__cuda_prefill_launch_kernel after its argument checks (head
 * sizes kva__cuda_prefill_wgmma_dims, f16/bf16, sm_90a build and device). */
extern "C" kva_status kva__cuda_prefill_wgmma_launch(const kva__cuda_prefill_args *a, void *stream,
                                                     int tma)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (a->head_dim == 128 && a->head_dim_v == 128)
        return a->narrow ? kva__wg_launch_d128n(a, st, tma) : kva__wg_launch_d128(a, st, tma);
    if (a->head_dim == 64 && a->head_dim_v == 64)
        return kva__wg_launch_d64(a, st, tma);
    if (a->head_dim == 192 && a->head_dim_v == 128)
        return kva__wg_launch_d192(a, st, tma);
    if (a->head_dim == 256 && a->head_dim_v == 256)
        return kva__wg_launch_d256(a, st, tma); /* one tile shape: a->narrow is not read */
    return kva__fail(
        KVA_STATUS_UNSUPPORTED,
        "kva__cuda_prefill_launch_kernel: the wgmma prefill does not serve D = %d, Dv = %d",
        (int)a->head_dim, (int)a->head_dim_v);
}
