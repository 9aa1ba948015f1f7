/*
 * mla_cpu.h - the CPU backend's layer-level MLA (kva_mla_run).
 *
 * mla_cpu.c drives a run: it lists the work items (a decode request's heads
 * in groups of KVA_MLA_HEAD_GROUP, or one head of a prefill request), sizes
 * each thread's scratch and runs the items on an OpenMP team. When a run has
 * fewer items than twice its threads, each absorbed item's keys are split
 * into pieces run in parallel and merged by their LSE (split-KV). The item
 * bodies (mla_items.inc) are compiled once per ISA: mla_portable.c (plain
 * C), mla_avx2.c and mla_avx512.c (the same C, auto-vectorized for AVX2 /
 * AVX-512), the kernel registry's "mla_portable", "mla_avx2" and
 * "mla_avx512" (cpu_ops.c), and "mla_avx512bf16", whose absorbed items take
 * a bf16 cache's latent rows by vdpbf16ps (mla_bf16dot.inc). Sparse MLA runs the same items
 * (mla_sparse_cpu.c); under mla_avx512bf16 its items with bf16 queries take
 * bf16, gathered and fp8_ds_mla rows (dequantized to bf16) by the same
 * vdpbf16ps chunk body.
 */
#ifndef KVA_MLA_CPU_H
#define KVA_MLA_CPU_H

#include "internal.h"

/* Latent rows converted to fp32 together (absorbed path), and keys
 * decompressed together (compute-friendly path). */
#define KVA_MLA_CHUNK 64
/* Query heads of one absorbed-path item: every latent row read once serves
 * q_len * KVA_MLA_HEAD_GROUP attention rows. */
#define KVA_MLA_HEAD_GROUP 64
/* Split-KV of absorbed items: at least this many keys per piece, at most
 * this many pieces. */
#define KVA_MLA_SPLIT_MIN 512
#define KVA_MLA_MAX_SPLITS 32
/* Staged weights need an area per absorbed item: at most this many bytes of
 * them (larger steps absorb and project item by item). */
#define KVA_MLA_STAGED_BYTES ((size_t)64 << 20)

/* Everything an item needs. Shapes: q [T, H, Dn + Dr], w_uk [H, Dn, Dc],
 * w_uv [H, Dc, Dv] (q_dtype), out [T, H, Dv] (q_dtype), lse [T, H] or NULL. */
typedef struct kva__cpu_mla {
    const kva_plan *plan;
    const kva_cache *cache;
    const void *q, *w_uk, *w_uv;
    void *out;
    float *lse;
    int32_t H, D, Dc, Dr, Dn, Dv;
    int32_t max_q_len;  /* rows of the compute-friendly path's per-head state */
    float fp8_lut[256]; /* FP8 caches: code -> value * the cache's k scale */
    /* Sparse runs (kva_mla_sparse_run; idx NULL otherwise, Dn 0, Dv = Dc):
     * indices [T, idx_stride], topk_len [T] or NULL, sinks [H] or NULL, and
     * the bf16 rows [seq_len, D] a separate prefill gathered for the
     * request being run, or NULL (read the cache). */
    const int32_t *idx;
    int64_t idx_stride;
    const int32_t *topk_len;
    const float *sinks;
    const uint16_t *gather;
    /* Staged weights (mla_cpu.c; NULL otherwise): the absorbed items' areas,
     * area_floats apart, each its absorbed queries (area_qa_floats) then its
     * partial (latent output, row maxima, sums). */
    float *areas;
    size_t area_floats, area_qa_floats;
} kva__cpu_mla;

/* One work item: request r, heads h0 .. h0 + nh - 1; absorbed = 1 for the
 * absorbed (decode) path, 0 for the compute-friendly (prefill) path.
 * Split absorbed items (split > 1; Mp = q_len * nh rounded up to 16):
 * piece -1 absorbs the queries once into qa [Mp, D]; piece p < split
 * attends from qa to keys [k0, k1) and leaves its unnormalized latent
 * output o [Mp, Dc], row maxima mx [Mp] and sums l [Mp] in partial + p *
 * piece_floats; piece == split merges the pieces by their LSE and projects
 * and stores the rows. */
/* Staged weights (staged = 1; a step of more items than threads, mla_cpu.c):
 * piece -2 of head h0 absorbs that head's rows of every absorbed request into
 * their items' areas (W_UK[h0] read once per step), piece 0 of an absorbed
 * item (split 1) attends from its area's queries and leaves its partial there,
 * piece -3 of head h0 projects that head's rows by W_UV[h0] and stores them. */
typedef struct kva__cpu_mla_item {
    int32_t r, h0, nh, absorbed;
    int32_t staged;
    int32_t t; /* sparse items: the query token */
    int32_t split, piece;
    int64_t k0, k1;
    float *qa;      /* [Mp, D] absorbed queries of a split item, or NULL */
    float *partial; /* [split, piece_floats] of a split item, or NULL */
    size_t piece_floats;
} kva__cpu_mla_item;

typedef void (*kva__cpu_mla_item_fn)(const kva__cpu_mla *m, const kva__cpu_mla_item *it,
                                     float *scratch);

/* How a run splits its absorbed items over the keys. */
typedef struct kva__cpu_mla_split {
    int32_t split;        /* pieces per absorbed item; 1 = no split-KV */
    int32_t num_absorbed; /* absorbed items of the plan */
    size_t qa_floats;     /* floats of an item's absorbed queries, Mp * D at most */
    size_t piece_floats;  /* floats of one piece's partial, Mp * (Dc + 2) at most */
} kva__cpu_mla_split;

/* The split of plan's absorbed items on nt threads: split when the plan has
 * fewer items than threads, into up to 2 nt / items pieces of at least
 * KVA_MLA_SPLIT_MIN keys of its longest absorbed request, at most
 * KVA_MLA_MAX_SPLITS or ctx->mla_max_splits when set. */
void kva__cpu_mla_split_of(const kva_context *ctx, const kva_plan *plan, int32_t nt,
                           kva__cpu_mla_split *s);

/* Which keys of a chunk the rows of mla_pv see (mla_items.inc): row m sits
 * at position base + m / div relative to the chunk's first key and, when
 * causal, sees the keys before its limit min(n, max(0, base + m / div + 1));
 * otherwise all n. P . V stops at each row's limit, so that a key a row does
 * not see never enters its sum, not even as 0 * v (a NaN or infinite value
 * of such a key would make the row NaN). */
typedef struct kva__cpu_mla_vis {
    int64_t base;
    int32_t div;
    int32_t causal;
} kva__cpu_mla_vis;

static inline int32_t kva__cpu_mla_lim(const kva__cpu_mla_vis *v, int32_t m, int32_t n)
{
    const int64_t x = v->base + m / v->div + 1;
    return !v->causal || x >= n ? n : x < 0 ? 0 : (int32_t)x;
}

/* Floats of one thread's scratch, per path (mla_items.inc carves them in
 * this order). Absorbed, for M = q_len * heads rows padded to Mp, a multiple
 * of 16 (the score tile): qa [Mp, D], o [Mp, Dc], ST [C, Mp], mx [Mp],
 * l [Mp], kb [C, D], qaT [D, Mp], wrow [Dc + Dv], res [Dv], qrow [Dn + Dr].
 * Compute-friendly, for Q = q_len rows padded to Qp (a multiple of 32):
 * wukT [Dc, Dn], wuv [Dc, Dv], kb [C, D], kf [C, Dn + Dr], vv [C, Dv],
 * qsT [Qp / 32, Dn + Dr, 32], ST [C, Qp + 16], o [Qp, Dv], mx [Qp], l [Qp],
 * qrow [Dn + Dr + Dc]. */
static inline size_t kva__cpu_mla_floats(int absorbed, size_t rows, size_t D, size_t Dc, size_t Dr,
                                         size_t Dn, size_t Dv)
{
    const size_t C = KVA_MLA_CHUNK, Dq = Dn + Dr, Mp = (rows + 15) / 16 * 16;
    if (absorbed)
        return Mp * (2 * D + Dc + C + 2) + C * D + Dc + 2 * Dv + Dq;
    const size_t Qp = (rows + 31) / 32 * 32;
    return Dc * (Dn + Dv) + C * (D + Dq + Dv + 16) + Qp * (Dq + C + Dv + 2) + Dq + Dc;
}

/* Bytes of one thread's scratch for plan (a multiple of 64). */
size_t kva__cpu_mla_scratch_bytes(const kva_plan *plan);
/* Workspace bytes of kva_mla_run for plan built on ctx with nt threads (0
 * for a plan without MLA head sizes): nt scratch areas, then the split
 * partials. */
size_t kva__cpu_mla_workspace(const kva_context *ctx, const kva_plan *plan, int32_t nt);
/* kva__backend_ops.mla_run of the CPU backend. */
kva_status kva__cpu_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                            const void *w_uv, const kva_cache *cache, void *out, float *lse);

/* Fills m for a run of plan over cache (q, out, lse; the rest zero): the
 * shapes from the plan and, for an FP8 E4M3 cache, fp8_lut. */
void kva__cpu_mla_init(kva__cpu_mla *m, const kva_plan *plan, const kva_cache *cache, const void *q,
                       void *out, float *lse);
/* Sparse MLA (mla_sparse_cpu.c): workspace bytes of a sparse plan built
 * on ctx with nt threads (nt scratch areas of kva__cpu_mla_floats(1, heads
 * of an item, ...), then the separate mode's gathered bf16 rows), and the
 * run (kva__backend_ops.mla_sparse). */
size_t kva__cpu_sparse_workspace(const kva_plan *plan, int32_t nt);
kva_status kva__cpu_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                               const kva_cache *cache, const int32_t *indices,
                               int64_t indices_stride, const int32_t *topk_length,
                               const float *sinks, void *out, float *lse);

/* Runs one item with the given scratch (kva__cpu_mla_scratch_bytes bytes). */
void kva__cpu_mla_item_portable(const kva__cpu_mla *m, const kva__cpu_mla_item *it, float *scratch);
void kva__cpu_mla_item_avx2(const kva__cpu_mla *m, const kva__cpu_mla_item *it, float *scratch);
void kva__cpu_mla_item_avx512(const kva__cpu_mla *m, const kva__cpu_mla_item *it, float *scratch);
/* The AVX-512 items with the absorbed path's step 2 by AVX512_BF16 dot
 * products over a bf16 latent cache (mla_bf16dot.inc; other caches and
 * paths as kva__cpu_mla_item_avx512). */
void kva__cpu_mla_item_avx512bf16(const kva__cpu_mla *m, const kva__cpu_mla_item *it,
                                  float *scratch);
/* The item entry of the plan's MLA kernel (registry family KVA__KERNEL_MLA,
 * chosen when the plan was built; cpu_ops.c). */
kva__cpu_mla_item_fn kva__cpu_plan_mla_item(const kva_plan *plan);

#endif /* KVA_MLA_CPU_H */
