/*
 * prefill_mma.h - the tensor-core paged prefill kernel of the CUDA backend
 * (FlashAttention-2 style on mma.sync m16n8k16, fp32 accumulation).
 *
 * Self-contained C interface: no CUDA types, the stream is an opaque pointer
 * (a cudaStream_t, NULL for the legacy default stream). The kernel computes
 * exactly kva_attention_run's semantics (include/kvattn.h) for the rows it is
 * given: paged cache (NHD or HND, any block size B >= 1), causal (bottom-right
 * aligned), window_left, soft-cap, ALiBi, sinks, LSE, GQA/MQA.
 *
 * One CTA computes one tile of KVA__CUDA_PREFILL_TILE_M packed rows (row
 * m = i * G + g: token i, query head kvh * G + g) of one (request r, kv head);
 * the tile list [capacity][4] int32 {r, m0, kvh, 0} is built on the host
 * (kva__cuda_prefill_tiles_build_sections, heaviest first) and uploaded with its count;
 * CTAs past *num_tiles exit, so a captured launch replays with new tiles
 * (docs/cuda-prefill.md, "Tiles and CUDA graphs").
 *
 * Supported shapes: kva__cuda_prefill_supported(). Everything the kernel
 * reads or writes is device memory; the launch never synchronizes.
 */
#ifndef KVA_CUDA_PREFILL_MMA_H
#define KVA_CUDA_PREFILL_MMA_H

#include "kvattn.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Packed (token, group head) rows per tile (= per CTA). */
#define KVA__CUDA_PREFILL_TILE_M 128
/* int32 entries per tile in the tile array: {r, m0, kvh, 0}. */
#define KVA__CUDA_PREFILL_TILE_INTS 4
/* The prefill kernels (kva__cuda_prefill_launch_kernel); the CUDA backend's
 * registry (cuda_kernels.cu) names them. */
typedef enum kva__cuda_prefill_kernel {
    KVA__CUDA_PREFILL_AUTO = 0,  /* the dispatcher's choice (kva__cuda_prefill_kernel_default) */
    KVA__CUDA_PREFILL_MMA = 1,   /* mma.sync, sm_80+, D = Dv 64/128/256 (prefill_mma.cu) */
    KVA__CUDA_PREFILL_WGMMA = 2, /* sm_90a wgmma, D/Dv 64/64, 128/128, 192/128, 256/256;
                                    cp.async K/V */
    KVA__CUDA_PREFILL_WGMMA_TMA = 3, /* the same with in-range K/V tiles loaded by TMA */
} kva__cuda_prefill_kernel;

/* Host-side values a caller may keep across launches on one device (the
 * CUDA context does; tests and benchmarks pass none): what the wgmma
 * launchers would otherwise ask the runtime and the driver at every launch
 * (SM count, the tensor-map encoder and the K/V tensor maps, the kernels'
 * shared-memory attribute). Zero-initialize it; the launchers fill it. */
typedef struct kva__cuda_prefill_host_cache {
    int num_sms;       /* 0 until asked */
    void *tmap_encode; /* cuTensorMapEncodeTiled, NULL until looked up */
    uint64_t
        attr_set[2]; /* bit 2 i + t: dynamic shared-memory attribute of the wgmma kernel
                        of head-size pair i (prefill_wgmma.cu), TMA t, set ([0] f16, [1] bf16) */
    /* The last K/V tensor maps encoded (prefill_wgmma.cu wg_tmaps, as bytes)
     * and what they describe: reused while k, v, NB, B, Hkv, layout, dtype,
     * D, Dv and the keys per K/V tile (the box rows) are the same. */
    int tm_valid;
    const void *tm_k, *tm_v;
    int32_t tm_nb, tm_b, tm_hkv, tm_layout, tm_dtype, tm_dk, tm_dv, tm_bn;
    uint64_t tmaps[48];
} kva__cuda_prefill_host_cache;

typedef struct kva__cuda_prefill_args {
    /* Tensors (device memory). */
    const void *q;                         /* [T, H, D] dtype, contiguous */
    const void *k;                         /* NHD: [NB, B, Hkv, D]; HND: [NB, Hkv, B, D] dtype */
    const void *v;                         /* NHD: [NB, B, Hkv, Dv]; HND: [NB, Hkv, B, Dv] dtype */
    void *out;                             /* [T, H, Dv] dtype */
    float *lse;                            /* [T, H] float32 natural log, or NULL */
    const float *sinks;                    /* [H] float32 sink logits, or NULL */
    const float *alibi_slopes;             /* [H] float32, or NULL */
    const int32_t *query_start_loc;        /* [R + 1] */
    const int32_t *seq_lens;               /* [R] */
    const int32_t *block_table;            /* [R, block_table_stride] */
    const int32_t *tiles;                  /* [grid_tiles, 4] from the tile builder (below) */
    const int32_t *num_tiles;              /* [1] tiles in use (<= grid_tiles) */
    const int32_t *block_table_stride_dev; /* [1] or NULL: when set, the block-table
                                              stride is read from device memory (so a
                                              captured launch replays plans of another
                                              stride) and block_table_stride is unused */
    const uint64_t *tree;                  /* [T] draft-tree words of the query tokens
                                              (tree_mask.cuh), read while *tree_on != 0 */
    const int32_t *tree_on;                /* [1] or NULL (no tree): the device header's
                                              KVA_CUDA_HDR_TREE, so a captured launch
                                              replays tree and plain plans alike */
    int32_t *sched; /* [2] int32, zero before the launch, or NULL: the wgmma kernels'
                       dynamic CTA-tile schedule (prefill_wgmma.cuh wg_sched), whose
                       counters the launch's last CTA sets back to zero, so launches
                       on one stream (and graph replays) may share them, concurrent
                       launches may not; NULL: the static snake order. Other
                       kernels ignore it. */
    /* Scalars. */
    int32_t grid_tiles; /* CTAs launched (the tile array's capacity); 0 launches nothing */
    int32_t block_table_stride;
    int32_t block_size;      /* B >= 1 */
    int32_t num_blocks;      /* NB of k and v, or 0 if unknown (the TMA kernel then gathers
                                every tile by cp.async) */
    int32_t num_heads;       /* H, a multiple of num_kv_heads */
    int32_t num_kv_heads;    /* Hkv */
    int32_t head_dim;        /* D */
    int32_t head_dim_v;      /* Dv (kva__cuda_prefill_supported) */
    kva_dtype dtype;         /* F16 or BF16: q, k, v and out */
    kva_layout layout;       /* KVA_LAYOUT_NHD or KVA_LAYOUT_HND */
    float scale;             /* softmax scale; 0 means 1/sqrt(D) */
    int32_t causal;          /* bottom-right aligned causal mask */
    int32_t window_left;     /* < 0 or >= KVA_MAX_SEQ_LEN: no window */
    int32_t attention_chunk; /* > 0: local attention chunk C (kva__first_key); else none */
    float softcap;           /* > 0: s = cap * tanh(s / cap); else none */
    int32_t narrow;          /* 1: the wgmma kernels' narrow tile shape (64 rows and 64 keys
                                per CTA tile, two CTAs per SM: prefill_wgmma.cuh wg_dims) at
                                D = Dv 128, for batches of short requests (the plan's
                                choice); 0, and every other kernel and head size: the wide one */
    kva__cuda_prefill_host_cache *host_cache; /* host memory, or NULL: ask at every launch */
} kva__cuda_prefill_args;

/* The argument checks the prefill launchers share (kva__cuda_prefill_launch_kernel,
 * kva__cuda_qprefill_launch; fn: the caller's name for messages): grid_tiles
 * >= 0 and, when it is > 0, the tensors and metadata arrays, heads, block
 * size, layout, and the alignment of q, k, v (16 bytes: cp.async and 16-byte
 * loads of rows) and out (4 bytes). KVA_STATUS_INVALID_ARGUMENT or OK. */
kva_status kva__cuda_prefill_check(const kva__cuda_prefill_args *a, const char *fn);

/* 1 if some prefill kernel supports head sizes (D, Dv) with dtype: D = Dv in
 * {64, 128, 256}, or D 192 / Dv 128 where the wgmma kernel runs
 * (kva__cuda_prefill_wgmma_ready); dtype F16 or BF16; else 0. */
int kva__cuda_prefill_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype);

/*
 * Number of tiles the requests r with use_req[r] != 0 (host array [R]; NULL =
 * all; the CUDA backend's run path sends only its prefills here) need: sum
 * over them of ceil(q_len * (H / Hkv) / TILE_M) * Hkv. Reads host arrays
 * query_start_loc [R + 1]; returns -1 if a q_len is negative or the count
 * overflows int32.
 */
int64_t kva__cuda_prefill_tiles_count_subset(int32_t num_requests, const int32_t *query_start_loc,
                                             const uint8_t *use_req, int32_t num_heads,
                                             int32_t num_kv_heads);

/*
 * Fills the host buffer tiles [capacity, 4] int32 with the tiles of the same
 * requests, heaviest first (estimated by the number of keys the tile's rows
 * can see under the causal mask, the window and attention_chunk (0 = none),
 * which moves a tile's first key like the window: kva__first_key), and
 * *num_tiles with their count. section_keys > 0 lists the tiles section after
 * section, each section a run of (request, kv head) groups (requests longest
 * first) that together read at most section_keys keys, heaviest first within
 * a section, so that a section's K/V stays in the L2 cache while its query
 * tiles reread it; section_keys <= 0: one section. Host arrays:
 * query_start_loc [R + 1], seq_lens [R]. Returns KVA_STATUS_OUT_OF_RANGE
 * (nothing written) when capacity is too small, KVA_STATUS_INVALID_ARGUMENT
 * for bad metadata, KVA_STATUS_OUT_OF_MEMORY if the sort's scratch cannot be
 * allocated.
 */
kva_status kva__cuda_prefill_tiles_build_sections(
    int32_t num_requests, const int32_t *query_start_loc, const int32_t *seq_lens,
    const uint8_t *use_req, int32_t num_heads, int32_t num_kv_heads, int32_t causal,
    int32_t window_left, int32_t attention_chunk, int64_t section_keys, int32_t *tiles,
    int32_t capacity, int32_t *num_tiles);

/*
 * Launches kernel (KVA__CUDA_PREFILL_AUTO: the dispatcher's choice; the run
 * path passes the plan's, tests and benchmarks each kernel) on stream (a
 * cudaStream_t, may be NULL). Checks the arguments it can check without
 * reading device memory, sets the kernel's shared-memory limit, launches, and
 * checks cudaGetLastError(). Never synchronizes. KVA_STATUS_UNSUPPORTED for
 * shapes kva__cuda_prefill_supported rejects, KVA_STATUS_INVALID_ARGUMENT for
 * a kernel that does not exist for D on this build and device,
 * KVA_STATUS_DEVICE_ERROR (with the CUDA error string) on a launch failure.
 */
kva_status kva__cuda_prefill_launch_kernel(const kva__cuda_prefill_args *args, void *stream,
                                           kva__cuda_prefill_kernel kernel);

/* 1 if kernel exists for head sizes D, Dv (mma.sync: D = Dv in {64, 128,
 * 256}; the wgmma kernels: kva__cuda_prefill_wgmma_dims on a build with
 * sm_90a code and a compute capability 9.0 device). */
int kva__cuda_prefill_kernel_exists(int32_t head_dim, int32_t head_dim_v,
                                    kva__cuda_prefill_kernel kernel);
/* The kernel the dispatcher runs for D, Dv, block size B and NB (0 =
 * unknown): on sm_90a for the wgmma head sizes the wgmma kernel, with TMA
 * where B is a power of two >= 16 and NB is known; else mma.sync. */
kva__cuda_prefill_kernel kva__cuda_prefill_kernel_default(int32_t head_dim, int32_t head_dim_v,
                                                          int32_t block_size, int32_t num_blocks);

/* prefill_wgmma.cu: 1 if the build has sm_90a device code (KVA_CUDA_SM90A,
 * CMAKE_CUDA_ARCHITECTURES naming 90a) and the current device has compute
 * capability 9.0; else 0 (also without a device). */
int kva__cuda_prefill_wgmma_ready(void);
/* prefill_wgmma.cu: 1 if the wgmma kernel is written for head sizes (D, Dv):
 * (64, 64), (128, 128), (192, 128), (256, 256). */
int kva__cuda_prefill_wgmma_dims(int32_t head_dim, int32_t head_dim_v);
/* Launches the wgmma kernel (arguments already checked by
 * kva__cuda_prefill_launch_kernel; head sizes kva__cuda_prefill_wgmma_dims,
 * f16/bf16); tma: load the
 * in-range K/V tiles by TMA (KVA__CUDA_PREFILL_WGMMA_TMA). */
kva_status kva__cuda_prefill_wgmma_launch(const kva__cuda_prefill_args *args, void *stream,
                                          int tma);

#ifdef __cplusplus
}
#endif

#endif /* KVA_CUDA_PREFILL_MMA_H */
