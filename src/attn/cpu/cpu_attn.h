/*
 * cpu_attn.h - internals of the CPU backend shared by its kernel files.
 *
 * A run executes the plan's work items (src/plan/partition.h) on an OpenMP
 * team: each thread takes items from a dynamic schedule and runs a kernel
 * variant on it with its own scratch area, then the team merges the partial
 * results of split items. All memory a run touches besides its arguments is
 * the context workspace, reserved by plan_build:
 *
 *   workspace = [ split partials: partial_floats fp32 ]
 *               [ scratch of thread 0 ] [ scratch of thread 1 ] ...
 */
#ifndef KVA_CPU_ATTN_H
#define KVA_CPU_ATTN_H

#include "../../plan/partition.h"

#include <stdint.h>
#include <string.h>

/* Keys loaded (and converted to fp32) together: the score/softmax/PV chunk. */
#define KVA_CPU_KEY_CHUNK 32
/* Most attention rows (query rows x heads of a GQA group) per item. */
#define KVA_CPU_MAX_ROWS 128
/* Preferred attention rows of a prefill query tile: 128 (32 queries x a GQA
 * group of 4) amortizes each K/V tile's conversion over twice the rows of 64
 * and ran 3% faster with the tiled variant (1 thread, 2k prefill, bf16). */
#define KVA_CPU_PREFILL_ROWS 128
/* Most keys of one tile of the tiled prefill variants (attn_prefill_tiled.inc). */
#define KVA_CPU_TILE_KEYS 96

/* Everything a kernel needs to run items of one call. */
typedef struct kva__cpu_run {
    const kva_plan *plan;
    const kva__partition *part;
    kva_dtype dt;    /* dtype of q and out */
    kva_dtype kv_dt; /* storage dtype of K/V rows (dt unless the cache is quantized) */
    const void *q;   /* [T, H, D] */
    /* K/V source: a paged cache, or (cache == NULL) ragged rows
     * k: [sum(seq_lens), Hkv, D], v: [sum(seq_lens), Hkv, Dv]. */
    const kva_cache *cache;
    const void *k, *v;
    const float *sinks;     /* [H] or NULL */
    void *out;              /* [T, H, Dv] */
    float *lse;             /* [T, H] or NULL */
    float *partials;        /* split partials, see kva__split_task */
    unsigned char *scratch; /* per-thread scratch areas */
    size_t scratch_stride;  /* bytes between two threads' areas (multiple of 64) */
} kva__cpu_run;

/* A thread's scratch, carved out of its area by kva__cpu_scratch_map. */
typedef struct kva__cpu_scratch {
    float *q;         /* [max_rows, D] query tile, scale folded in */
    float *acc;       /* [max_rows, Dv] unnormalized output accumulators */
    float *mx;        /* [max_rows] running max of the scores */
    float *sum;       /* [max_rows] running sum of exp(score - mx) */
    float *p;         /* [KEY_CHUNK] scores, then probabilities, of one row */
    float *kbuf;      /* [KEY_CHUNK, D] keys converted to fp32 */
    float *vbuf;      /* [KEY_CHUNK, Dv] values converted to fp32 */
    int32_t *lo;      /* [max_rows] first visible key of each query row of the tile */
    int32_t *hi;      /* [max_rows] one past the last visible key */
    const float **kp; /* [KEY_CHUNK] fp32 key rows of the chunk */
    const float **vp; /* [KEY_CHUNK] fp32 value rows of the chunk */
    void *tile;       /* area of the tiled prefill variants, see kva__cpu_tile */
} kva__cpu_scratch;

/* The tiled prefill variants' arrays (attn_prefill_tiled.inc), carved out of
 * kva__cpu_scratch.tile. Mp = MAX_ROWS (a multiple of 16), KT = TILE_KEYS;
 * arrays over rows hold one lane per attention row of the item. */
typedef struct kva__cpu_tile {
    float *qt;                  /* [D, Mp] query tile, transposed, scale folded in */
    float *st;                  /* [KT, Mp] scores, then probabilities, of one key tile */
    float *ot;                  /* [Dv, Mp] unnormalized outputs, transposed */
    float *kb;                  /* [KT, D] keys converted to fp32 */
    float *vb;                  /* [KT, Dv] values converted to fp32 */
    float *mx;                  /* [Mp] running max */
    float *sum;                 /* [Mp] running sum */
    float *alpha;               /* [Mp] rescale of the outputs for the current tile */
    float *muse;                /* [Mp] max the current tile's exponents subtract */
    float *cmax;                /* [Mp] max of the current tile's scores */
    float *slope;               /* [Mp] ALiBi slope of the row's head */
    float *row;                 /* [max(D, Dv)] one row in fp32 */
    int32_t *lo;                /* [Mp] first visible key of each row (clipped to the item) */
    int32_t *hi;                /* [Mp] one past the last visible key */
    int32_t *pos;               /* [Mp] query position of the row */
    const float **kp;           /* [KT] fp32 key rows of the tile */
    const float **vp;           /* [KT] fp32 value rows of the tile */
    const unsigned char **rows; /* [4, KT] K and V row pointers of this and the next tile */
} kva__cpu_tile;

/* Carves the tile area (64-byte aligned) for head sizes D, Dv. */
void kva__cpu_tile_map(void *area, int32_t D, int32_t Dv, kva__cpu_tile *t);

/* Bytes of one thread's scratch area (a multiple of 64). */
size_t kva__cpu_scratch_bytes(int32_t D, int32_t Dv);
/* Carves a thread's area (64-byte aligned) into its arrays. */
void kva__cpu_scratch_map(void *area, int32_t D, int32_t Dv, kva__cpu_scratch *s);

/* A kernel variant: computes one work item. */
typedef void (*kva__cpu_attn_fn)(const kva__cpu_run *run, const kva__work_item *it,
                                 kva__cpu_scratch *s);

/* Kernel variants (attn_v1.c, ...). */
void kva__cpu_attn_v1(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
/* Tiled prefill (attn_prefill_tiled.inc): AVX2+FMA+F16C, AVX-512 F/BW/VL/DQ. */
void kva__cpu_attn_v4(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
void kva__cpu_attn_v5(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
/* v5 with bf16 dot products for the scores (AVX512-BF16) when q and K are bf16. */
void kva__cpu_attn_v6(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);

/* Number of kernel variants, and variant v (1-based) or NULL when v is out of
 * range, not compiled in, or needs an ISA this CPU lacks. */
int kva__cpu_attn_num_variants(void);
kva__cpu_attn_fn kva__cpu_attn_variant(int v);
/* The variant the dispatcher picks for a plan (1-based). */
int kva__cpu_attn_choose(const kva_plan *plan);

/* Partitions the plan with pp (replacing any partition it has, keeping its
 * kernel variant), records the workspace it needs and reserves it in ctx.
 * plan_build calls it with the defaults; tests call it with other parameters. */
kva_status kva__cpu_plan_partition(kva_context *ctx, kva_plan *plan,
                                   const kva__partition_params *pp);

/* Merges the partials of split task t into out/lse, adding the sink once (cpu_merge.c). */
void kva__cpu_merge_task(const kva__cpu_run *run, const kva__split_task *t);

/* kva_merge_states for the CPU backend: threaded over tokens x heads. */
kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                 int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                 const float *lse_a, const void *out_b, const float *lse_b,
                                 void *out, float *lse_out);

/* max(a, b) that returns NaN if either is NaN (plain `a > b ? a : b` drops a
 * NaN a), so a NaN score reaches the row's max, lse and output. */
static inline float kva__cpu_max_nan(float a, float b)
{
    return a > b || a != a ? a : b;
}

/* Stores n fp32 values as dtype dt at dst (f16/bf16 round to nearest even). */
void kva__cpu_store_row(void *dst, kva_dtype dt, const float *src, int32_t n);
/* IEEE binary16 -> binary32, exact and branch-free: the exponent/mantissa bits
 * moved to binary32 positions give x * 2^-112 for normal and subnormal halves
 * (binary32 has room for both), so one multiply by 2^112 rebiases; inf and NaN
 * get the all-ones exponent instead. */
static inline float kva__cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &em, sizeof f);
    f *= 0x1p112f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = em >= (0x7c00u << 13) ? (em | 0x7f800000u) : u;
    u |= sign;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float kva__cpu_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Loads n values of dtype dt as fp32 (exact); vectorizable loops, inlined
 * into the kernels' per-key loops. */
static inline void kva__cpu_load_row(float *restrict dst, const void *restrict src, kva_dtype dt,
                                     int32_t n)
{
    if (dt == KVA_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dt == KVA_DTYPE_F16) {
        const uint16_t *restrict s = src;
        for (int32_t i = 0; i < n; i++)
            dst[i] = kva__cpu_f16_to_f32(s[i]);
    } else {
        const uint16_t *restrict s = src;
        for (int32_t i = 0; i < n; i++)
            dst[i] = kva__cpu_bf16_to_f32(s[i]);
    }
}

#endif /* KVA_CPU_ATTN_H */
