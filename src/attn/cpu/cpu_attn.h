/*
 * cpu_attn.h - internals of the CPU backend shared by its kernel files.
 *
 * A run executes the plan's work items (src/plan/partition.h) on an OpenMP
 * team: each thread takes items from a dynamic schedule and runs a kernel
 * on it with its own scratch area, then the team merges the partial
 * results of split items. The team has the running context's thread count,
 * capped by the scratch areas its workspace holds (plan_build reserves one
 * per thread of the context that built the plan). All memory a run touches besides its arguments is
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
 * group of 4) amortizes each K/V tile's conversion over twice the rows of 64. */
#define KVA_CPU_PREFILL_ROWS 128
/* Most keys of one tile of the tiled prefill kernels (prefill_tiled.inc). */
#define KVA_CPU_TILE_KEYS 96
/* Most attention rows of an item of the tiled prefill kernels. A plan whose
 * query rows all see the same keys (non-causal, no window or chunk: the
 * cascade's prefix pass, encoders) takes tiles of this many rows when its
 * prefill kernel is a tiled one (cpu_plan_build), so that each K/V tile is
 * read and converted once for twice KVA_CPU_PREFILL_ROWS rows: the prefix
 * pass of 64 decodes at GQA 4 is one item per kv head (before its key
 * splits) instead of two. */
#define KVA_CPU_TILE_ROWS 256
/* Decode groups (see "Groups" below): most items of one group, and most
 * attention rows of an item that may join one. */
#define KVA_CPU_GROUP_MAX 8
#define KVA_CPU_GROUP_ROWS 16

/* Everything a kernel needs to run items of one call. */
typedef struct kva__cpu_run {
    const kva_plan *plan;
    const kva__partition *part;
    kva_dtype dt;     /* dtype of q and out */
    kva_dtype kv_dt;  /* storage dtype of K rows, and of V rows except for
                         INT8_TOKEN_K_V16 (cache->v_elem gives V's size) */
    int quant;        /* 1: the cache is quantized, rows go through kva__cpu_dequant_chunk */
    int dequant_simd; /* kva__cpu_dequant_simd(&ctx->cpu_features), once per run */
    int vnni;         /* the CPU has AVX512_VNNI (decode_avx512bf16's int8 key scores) */
    const void *q;    /* [T, H, D] */
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
    float *pm;        /* [max_rows, KEY_CHUNK] probabilities of every row (SIMD kernels) */
    float *alpha;     /* [max_rows] rescale factor of each row's accumulators this chunk */
    int32_t *live;    /* [max_rows] 1 if the row takes part in this chunk's P.V */
    float *vs;        /* [2, 8, 16, 16] per-(head, key) partial dot products (SIMD kernels) */
    float *kbuf;      /* [KEY_CHUNK, D] keys converted to fp32 (decode_portable; the
                         SIMD decodes only for dtypes they do not read in place) */
    float *vbuf;      /* [KEY_CHUNK, Dv] values, likewise */
    int32_t *lo;      /* [max_rows] first visible key of each query row of the tile */
    int32_t *hi;      /* [max_rows] one past the last visible key */
    const float **kp; /* [KEY_CHUNK] fp32 key rows of the chunk */
    const float **vp; /* [KEY_CHUNK] fp32 value rows of the chunk */
    void *tile;       /* area of the tiled prefill kernels, see kva__cpu_tile */
    /* Query rows for the int8 dot-product scores of decode_avx512bf16
     * (VNNI, kva__cpu_kq_prepare_avx512 below): each row as 3 signed
     * base-256 digits of a 23-bit integer, qi [max_rows, 3, D]; qk
     * [max_rows, 2] its step and the key offsets' term; qc [max_rows, 4]
     * 128 x the digit sums (the codes' bias). */
    int8_t *qi;
    float *qk;
    int32_t *qc;
    int32_t *kt; /* [KVA_MAX_HEAD_DIM / 4, 16] 16 keys' int8 rows transposed by dwords */
    /* KVA_CPU_GROUP_MAX member states of a decode group, each
     * [GROUP_ROWS, D] q, [GROUP_ROWS, Dv] acc, mx, sum, lo, hi [GROUP_ROWS],
     * and qi, qk, qc of GROUP_ROWS rows (kva__cpu_scratch_member). */
    unsigned char *group;
} kva__cpu_scratch;

/* The tiled prefill kernels' arrays (prefill_tiled.inc), carved out of
 * kva__cpu_scratch.tile. Mp = TILE_ROWS (a multiple of 16), KT = TILE_KEYS;
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
/* The scratch of member i (< KVA_CPU_GROUP_MAX) of a decode group: s with the
 * per-item state (q, acc, mx, sum, lo, hi, qi, qk, qc; at most
 * KVA_CPU_GROUP_ROWS rows)
 * moved into the member's part of s->group; the arrays that live only
 * during one chunk step (pm, alpha, live, vs, kp, vp, kbuf, vbuf) stay
 * shared, since the members' chunk steps never overlap. */
void kva__cpu_scratch_member(const kva__cpu_scratch *s, int32_t i, int32_t D, int32_t Dv,
                             kva__cpu_scratch *member);

/* A kernel: computes one work item. */
typedef void (*kva__cpu_attn_fn)(const kva__cpu_run *run, const kva__work_item *it,
                                 kva__cpu_scratch *s);
/* A decode kernel's group entry: computes the n (2..KVA_CPU_GROUP_MAX) items
 * of a decode group (items[0..n): one request, query rows and key range,
 * different kv heads) interleaved chunk by chunk, each exactly as the kernel
 * computes it alone. */
typedef void (*kva__cpu_group_fn)(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                  kva__cpu_scratch *s);

/* The kernels, named by kind x ISA as in the backend's registry (cpu_ops.c;
 * docs/architecture.md, "The CPU backend"): each computes any work item
 * exactly like the reference; *_avx2*.c / *_avx512*.c files are compiled
 * with their ISA flags and called only after run-time detection. */
/* A value row of zeros (any row format: every format reads zero bytes as 0,
 * or as a finite -offset for int8 rows, which weight 0 makes 0). */
extern const float kva__cpu_zero_v[KVA_MAX_HEAD_DIM];

/* Tree plans (kva__tree_lanes): P . V of a query row runs over its chunk
 * keys [ta, te) with weight 0 for the tree keys it does not see, and
 * 0 * v is NaN for a NaN or infinite v. So the decode kernels point those
 * keys' value rows vp [KEY_CHUNK] at kva__cpu_zero_v for that query row
 * (saving them in saved [KEY_CHUNK]) and restore them after its P . V;
 * rows without a tree (all lanes set) skip both. */
static inline void kva__cpu_tree_hide_v(const float **vp, uint32_t tree, int32_t ta, int32_t te,
                                        const float **saved)
{
    for (int32_t t = ta; t < te; t++) {
        saved[t] = vp[t];
        if (!((tree >> t) & 1u))
            vp[t] = kva__cpu_zero_v;
    }
}
static inline void kva__cpu_tree_restore_v(const float **vp, int32_t ta, int32_t te,
                                           const float *const *saved)
{
    for (int32_t t = ta; t < te; t++)
        vp[t] = saved[t];
}

void kva__cpu_attn_portable(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
void kva__cpu_decode_avx2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
void kva__cpu_decode_avx512(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
void kva__cpu_decode_avx512bf16(const kva__cpu_run *run, const kva__work_item *it,
                                kva__cpu_scratch *s);
void kva__cpu_decode_avx2_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                kva__cpu_scratch *s);
void kva__cpu_decode_avx512_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                  kva__cpu_scratch *s);
void kva__cpu_decode_avx512bf16_group(const kva__cpu_run *run, const kva__work_item *items,
                                      int32_t n, kva__cpu_scratch *s);
void kva__cpu_prefill_avx2(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s);
void kva__cpu_prefill_avx512(const kva__cpu_run *run, const kva__work_item *it,
                             kva__cpu_scratch *s);
void kva__cpu_prefill_avx512bf16(const kva__cpu_run *run, const kva__work_item *it,
                                 kva__cpu_scratch *s);

/*
 * The query rows of a decode item over int8 keys for decode_avx512bf16's
 * VNNI scores (scores_rows_i8dot in decode_avx512_step.inc), in AVX-512
 * (decode_avx512.c; run only where the CPU has AVX-512 F/BW/VL/DQ). Row m
 * of q [M, D] (key scales folded in) becomes qn = rint(q_d / step) with
 * step = max_d |q_d| / 2^22, rounded in double (q_d * (2^22 / max|q|)) in
 * the current rounding mode and held to |qn| <= 2^22, as 3 signed base-256
 * digits qn = 2^16 a + 2^8 b + c (b, c in [-128, 127]): qi [M, 3, D] holds
 * a, b, c of each dim; qk [M, 2] = {step, (float) sum_d qn_d koff_d summed
 * in double in the order of d (0 where koff is NULL)}; qc [M, 4] = 128 x
 * the sums of a, b, c, then 0. koff [D]: the kv head's key offsets
 * (INT8_CHANNEL keys), or NULL. Returns 0, with qi, qk and qc unspecified,
 * where any |q_d| is not <= 3.4e38f (inf, NaN, or within 0.3 % of FLT_MAX):
 * the fp32 scores keep those rows' semantics.
 * tests/kq_scalar.h holds the scalar definition it matches bit for bit
 * (tests/test_cpu_kq.c).
 */
int kva__cpu_kq_prepare_avx512(const float *q, int32_t M, int32_t D, const float *koff, int8_t *qi,
                               float *qk, int32_t *qc);

/* Dispatch seam (docs/architecture.md, "Registry and dispatch"): a plan
 * carries the decode and the prefill kernel chosen at plan build
 * (part->variant_decode / variant_prefill, registry index + 1); run_items
 * picks per item by shape: an item of nq query rows x nh heads is
 * prefill-shaped when nq > KVA_CPU_DECODE_MAX_NQ, or nq >= 2 and nq * nh >=
 * KVA_CPU_TILED_MIN_ROWS (a speculative decode over a wide GQA group already
 * fills the tiled kernel's vectors); every other item runs the decode kernel. */
#define KVA_CPU_DECODE_MAX_NQ 4
#define KVA_CPU_TILED_MIN_ROWS 16
static inline int kva__cpu_item_prefill(int32_t nq, int32_t nh)
{
    return nq > KVA_CPU_DECODE_MAX_NQ || (nq >= 2 && nq * nh >= KVA_CPU_TILED_MIN_ROWS);
}
/* The name of the decode or the prefill kernel a CPU plan runs, and whether
 * the registry kernel `name` runs decode groups ("Groups" below; tests). */
const char *kva__cpu_plan_kernel(const kva_plan *plan, kva__kernel_family family);
int kva__cpu_kernel_groups(const char *name);

/* Groups (docs/architecture.md, "The CPU backend"): the decode items of one
 * request, query rows and key range over different kv heads, adjacent in the
 * plan and cut into groups of up to KVA_CPU_GROUP_MAX items
 * (part->group_start), run interleaved chunk by chunk by a decode kernel's
 * group entry. kva__cpu_groupable says which items may join a group. */
static inline int kva__cpu_groupable(const kva__work_item *it)
{
    return !kva__cpu_item_prefill(it->nq, it->nh) && it->nq * it->nh <= KVA_CPU_GROUP_ROWS;
}

/* Partitions the plan with pp (replacing any partition it has, keeping its
 * kernels), records the workspace it needs and reserves it in ctx.
 * plan_build calls it with the defaults; tests call it with other parameters. */
kva_status kva__cpu_plan_partition(kva_context *ctx, kva_plan *plan,
                                   const kva__partition_params *pp);

/* ---- pieces shared by the kernels (cpu_item.c) ---- */

/* Byte pointers of the K and V rows of one chunk of keys, and the per-token
 * key scales of an INT8_TOKEN_K cache (unset otherwise). */
typedef struct kva__cpu_chunk_rows {
    const unsigned char *k[KVA_CPU_KEY_CHUNK];
    const unsigned char *v[KVA_CPU_KEY_CHUNK];
    const float *ks[KVA_CPU_KEY_CHUNK];
} kva__cpu_chunk_rows;

/* Quantized caches: the portable kernel's chunk loader dequantizes the chunk's n
 * rows of kv head kvh into fp32 s->kbuf/vbuf through kva__cpu_dequant_chunk
 * (cpu_dequant.h) and points s->kp/vp at them (rows n.. repeat row 0). */
void kva__cpu_load_chunk_dequant(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                                 int32_t kvh, kva__cpu_scratch *s);

/* Locates the rows of keys c0 .. c0+n-1 of request r, kv head kvh (paged
 * cache: block id read once per block; ragged: kv_start[r] + j): byte
 * pointers of the K and V rows into kr/vr [n] and, for an INT8_TOKEN_K
 * cache and ks != NULL, of the per-token key scales into ks [n]. */
void kva__cpu_locate_rows(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                          const unsigned char **kr, const unsigned char **vr, const float **ks);
/* kva__cpu_locate_rows into one chunk's rows (n <= KVA_CPU_KEY_CHUNK). */
void kva__cpu_locate_chunk(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                           kva__cpu_chunk_rows *cr);
/* Prefetches the n rows of a chunk (kbytes / vbytes per K / V row). */
void kva__cpu_prefetch_chunk(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes,
                             size_t vbytes);

/* Where an item's rows live: row m = ii * nh + hh is token tok0 + ii, head hbase + hh. */
typedef struct kva__cpu_item_geom {
    int32_t hbase, tok0, q_len, seq, M;
} kva__cpu_item_geom;

/* Loads the item's query tile s->q [M, D] (fp32, scale folded in), each query
 * row's visible keys s->lo/hi [nq] clipped to [k0, k1), and clears mx, sum,
 * acc. */
void kva__cpu_item_begin(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                         kva__cpu_item_geom *g);
/* Stores the item's result: a split partial (out normalized over the chunk,
 * lse without the sink) or the final out/lse rows (the sink joins the
 * denominator). */
void kva__cpu_item_finish(const kva__cpu_run *run, const kva__work_item *it,
                          const kva__cpu_scratch *s, const kva__cpu_item_geom *g);

/* Merges the partials of split task t into out/lse, adding the sink once (cpu_merge.c). */
void kva__cpu_merge_task(const kva__cpu_run *run, const kva__split_task *t);

/* kva_merge_states for the CPU backend: threaded over tokens x heads. */
kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                 int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                 const float *lse_a, const void *out_b, const float *lse_b,
                                 void *out, float *lse_out);

/* kva_merge_states_n for the CPU backend: threaded over tokens x heads. */
kva_status kva__cpu_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                   int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                   const void *outs, int64_t out_stride, const float *lses,
                                   int64_t lse_stride, void *out, float *lse_out);

/* max(a, b) that returns NaN if either is NaN (plain `a > b ? a : b` drops a
 * NaN a), so a NaN score reaches the row's max, lse and output. */
static inline float kva__cpu_max_nan(float a, float b)
{
    return a > b || a != a ? a : b;
}

/* Stores n fp32 values as dtype dt at dst (f16/bf16 round to nearest even). */
void kva__cpu_store_row(void *dst, kva_dtype dt, const float *src, int32_t n);
/* One row of kva__cpu_merge_rows (cpu_merge_avx2.c; AVX2 + FMA + F16C only):
 * dst [Dv] in dt = sum_p wts[p] * part p's row, where part p's row is at
 * row0 + p * part_bytes (Dv elements of dt: F32, F16 or BF16). A part whose
 * weight is 0 is not read. Dv is a multiple of 8, at most KVA_MAX_HEAD_DIM. */
void kva__cpu_merge_row_avx2(kva_dtype dt, int32_t Dv, int32_t num_parts, const unsigned char *row0,
                             size_t part_bytes, const float *wts, void *dst);
/* kva__cpu_merge_row_avx2 for bf16 rows (cpu_merge_avx512.c; AVX-512 F/BW
 * only): the same contract with dt = BF16. */
void kva__cpu_merge_row_bf16_avx512(int32_t Dv, int32_t num_parts, const unsigned char *row0,
                                    size_t part_bytes, const float *wts, void *dst);
/* The weights of 8 rows of kva__cpu_merge_rows at once (cpu_merge_avx2.c):
 * part p's lses of the rows at l0 + p * stride [8]; w [num_parts, 8] gets
 * each part's normalized weight exp(l_p - m) / W per row (exactly 1 / W for
 * the largest part, 0 for l_p = -inf), lse [8] m + log W. Returns the bit
 * mask of the rows it does not handle (a NaN part, or every part -inf),
 * whose w and lse are left unspecified. */
unsigned kva__cpu_merge_weights8_avx2(int32_t num_parts, const float *l0, int64_t stride, float *w,
                                      float *lse);
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
