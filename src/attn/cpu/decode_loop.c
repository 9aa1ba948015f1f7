/*
 * decode_loop.c - the item loop of the SIMD decode kernels (decode_avx2,
 * decode_avx512, decode_avx512bf16), written once for every ISA: the ISA
 * enters as a descriptor (kva__cpu_decode_isa, decode_loop.h) holding its
 * chunk-step tables and its few vector helpers. Plain C (no ISA flags): the
 * vector work is all in the chunk steps.
 *
 * Per item: the query tile with the static key scales folded in (cpu_fold.h),
 * then chunk by chunk of KVA_CPU_KEY_CHUNK keys: load_chunk points s->kp/vp
 * at the chunk's rows in the cache in their storage format (scanning fp8 rows
 * for NaN codes; other storage dtypes converted to fp32 through
 * kva__cpu_load_row), and the step of the chunk's format pair, head size and
 * key order computes it while its loops prefetch the chunk PF_DIST ahead key
 * by key (spread over the compute the misses stay in flight; a burst of a
 * whole chunk fills the miss buffers). Decode groups (cpu_attn.h) run their items interleaved chunk
 * by chunk, each item's state in its own part of the scratch.
 */
#include "cpu_attn.h"

#if KVA_X86_SIMD

#include "decode_loop.h"

/* Whether the loops read the cache rows in place, in their storage format
 * (f32, f16, bf16 and the 1-byte rows of a quantized cache); other storage
 * dtypes are converted to fp32 per chunk by load_chunk. */
static int rows_in_place(const kva__cpu_run *run)
{
    const kva_dtype dt = run->kv_dt;
    return run->quant || dt == KVA_DTYPE_F32 || dt == KVA_DTYPE_F16 || dt == KVA_DTYPE_BF16;
}

/* Rows of a chunk for the steps: s->kp/vp [KEY_CHUNK] point at the cache
 * rows themselves in their storage format (rows n.. repeat row 0), with
 * fi->tok the per-token key scales (FMT_I8T); any other storage dtype is
 * converted to fp32 with kva__cpu_load_row. Sets fi->kf/vf to the formats
 * the steps read (FMT_FP8N for an fp8 chunk that holds a NaN code). */
static void load_chunk(const kva__cpu_run *run, const kva__cpu_decode_isa *isa,
                       const kva__cpu_chunk_rows *cr, int32_t n, kva__cpu_scratch *s, fold_info *fi)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    const kva_dtype dt = run->kv_dt;
    const int direct = rows_in_place(run);
    if (direct) {
        /* Read in place: the rows were prefetched into L2 while the chunk
         * PF_DIST before this one computed (pf_key_k/v). The restrict
         * pointers let the copy run without reloads (it did two per key). */
        const float **restrict kp = s->kp, **restrict vp = s->vp;
        const unsigned char *const *restrict ck = cr->k, *const *restrict cv = cr->v;
        for (int32_t t = 0; t < n; t++) {
            kp[t] = (const float *)ck[t];
            vp[t] = (const float *)cv[t];
        }
    } else
        for (int32_t t = 0; t < n; t++) {
            float *kd = s->kbuf + (size_t)t * D, *vd = s->vbuf + (size_t)t * Dv;
            kva__cpu_load_row(kd, cr->k[t], dt, D);
            kva__cpu_load_row(vd, cr->v[t], dt, Dv);
            s->kp[t] = kd;
            s->vp[t] = vd;
        }
    for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++) {
        s->kp[t] = s->kp[0];
        s->vp[t] = s->vp[0];
    }
    if (fi->kf == FMT_I8T) {
        for (int32_t t = 0; t < n; t++)
            fi->tok[t] = *cr->ks[t];
        for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++)
            fi->tok[t] = 0.0f;
    }
    /* NaN codes are rare: only such a chunk pays for mapping them. */
    if (run->quant && dt == KVA_DTYPE_FP8_E4M3)
        fi->kf = fi->vf = isa->fp8_nan(cr, n, (size_t)D, (size_t)Dv) ? FMT_FP8N : FMT_FP8;
    if (!direct)
        fi->kf = fi->vf = FMT_F32;
}

/* Chunks in flight per item: chunk c is computed while chunk c + PF_DIST is
 * prefetched (a ring of PF_DIST + 1 located chunks). */
enum { PF_DIST = 2 };

/* One item while it runs, alone or interleaved with the other members of
 * its decode group. */
typedef struct item_run {
    const kva__work_item *it;
    kva__cpu_scratch s; /* the thread's scratch, per-item state moved for group members */
    kva__cpu_item_geom g;
    fold_info fi;
    int slot; /* the step tables' D = Dv column (0, 1, 2 for 64, 128, 256), or -1: any */
    const kva__cpu_steps *dot; /* the vdpbf16ps steps (bf16 q and K), or NULL */
    kva__cpu_chunk_rows rows[PF_DIST + 1];
    int32_t nchunks;
} item_run;

/* The step for the item's current chunk: its row formats as load_chunk left
 * them, the item's head size column and key order. */
static kva__cpu_step_fn step_of(const kva__cpu_decode_isa *isa, const item_run *ir)
{
    const kva__cpu_steps *t =
        ir->dot ? ir->dot : isa->pairs[kva__cpu_fmt_pair(ir->fi.kf, ir->fi.vf)];
    const kva__cpu_step_fn f = ir->slot >= 0 ? t->d[ir->slot][ir->fi.ko] : NULL;
    return f ? f : t->any;
}

/* Starts item it: query tile, row formats (and the VNNI query digits where
 * the ISA scores int8 keys so), key order, the step table column for its
 * shapes, and the prefetch of its first PF_DIST chunks. ir->s must be set. */
static void item_open(const kva__cpu_run *run, const kva__cpu_decode_isa *isa,
                      const kva__work_item *it, item_run *ir)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    ir->it = it;
    kva__cpu_item_begin(run, it, &ir->s, &ir->g);
    kva__cpu_fold f;
    kva__cpu_fold_begin(run, it, ir->s.q, ir->g.M, &f);
    ir->fi.kf = f.kf, ir->fi.vf = f.vf, ir->fi.koff = f.koff, ir->fi.voff = f.voff;
    ir->fi.kq = 0;
    const int kf = ir->fi.kf;
    if (isa->kq_prepare && run->vnni && D % 4 == 0 &&
        (kf == FMT_I8 || kf == FMT_I8S || kf == FMT_I8T))
        ir->fi.kq = isa->kq_prepare(ir->s.q, ir->g.M, D, kf == FMT_I8 ? ir->fi.koff : NULL,
                                    ir->s.qi, ir->s.qk, ir->s.qc);
    /* Strided rows (NHD, Hkv > 1) read in place: key_at's order. */
    ir->fi.ko = isa->key_order && run->cache && run->cache->desc.layout == KVA_LAYOUT_NHD &&
                run->cache->desc.num_kv_heads > 1 && rows_in_place(run);
    ir->slot = D != Dv ? -1 : D == 64 ? 0 : D == 128 ? 1 : D == 256 ? 2 : -1;
    /* The VNNI P.V where the keys are scored by VNNI (the level and the CPU
     * have it; the query rows are finite). */
    ir->fi.vq = ir->fi.kq && (ir->fi.vf == FMT_I8 || ir->fi.vf == FMT_I8S) && Dv % 16 == 0;
    ir->dot =
        isa->bf16dot && run->dt == KVA_DTYPE_BF16 && run->kv_dt == KVA_DTYPE_BF16 && ir->slot >= 0
            ? isa->bf16dot
            : NULL;
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t v_esz = run->cache ? run->cache->v_elem : kv_esz;
    const int32_t C = KVA_CPU_KEY_CHUNK;
    ir->nchunks = (it->k1 - it->k0 + C - 1) / C;
    ir->fi.pf = NULL;
    ir->fi.pf_n = 0;
    ir->fi.pf_kbytes = (size_t)D * kv_esz;
    ir->fi.pf_vbytes = (size_t)Dv * v_esz;
    ir->fi.kesz = kv_esz;
    for (int32_t c = 0; c < PF_DIST && c < ir->nchunks; c++) {
        const int32_t a = it->k0 + c * C, n = it->k1 - a < C ? it->k1 - a : C;
        kva__cpu_locate_chunk(run, it->req, it->kv_head, a, n, &ir->rows[c]);
        kva__cpu_prefetch_chunk(&ir->rows[c], n, ir->fi.pf_kbytes, ir->fi.pf_vbytes);
    }
}

/* Computes chunk c of the item; its loops prefetch chunk c + PF_DIST. */
static void item_chunk(const kva__cpu_run *run, const kva__cpu_decode_isa *isa, item_run *ir,
                       int32_t c)
{
    const kva__work_item *it = ir->it;
    const int32_t C = KVA_CPU_KEY_CHUNK;
    const int32_t c0 = it->k0 + c * C;
    const int32_t c1 = c0 + C < it->k1 ? c0 + C : it->k1;
    if (c + PF_DIST < ir->nchunks) {
        const int32_t a = c0 + PF_DIST * C, n = it->k1 - a < C ? it->k1 - a : C;
        kva__cpu_chunk_rows *nr = &ir->rows[(c + PF_DIST) % (PF_DIST + 1)];
        kva__cpu_locate_chunk(run, it->req, it->kv_head, a, n, nr);
        ir->fi.pf = nr; /* prefetched by the loops of this chunk */
        ir->fi.pf_n = n;
    }
    load_chunk(run, isa, &ir->rows[c % (PF_DIST + 1)], c1 - c0, &ir->s, &ir->fi);
    step_of(isa, ir)(run, it, &ir->s, &ir->g, c0, c1, &ir->fi);
}

/* Ends the item: value scales, normalization, the result rows. */
static void item_close(const kva__cpu_run *run, const kva__cpu_decode_isa *isa, item_run *ir)
{
    if (ir->fi.vf == FMT_BF16)
        isa->acc_unpair(ir->s.acc, ir->g.M, run->plan->d.head_dim_v);
    kva__cpu_fold_end(run, ir->it, ir->s.acc, ir->g.M, ir->fi.vf);
    kva__cpu_item_finish(run, ir->it, &ir->s, &ir->g);
}

void kva__cpu_decode_item(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                          const kva__cpu_decode_isa *isa)
{
    item_run ir;
    ir.s = *s;
    item_open(run, isa, it, &ir);
    for (int32_t c = 0; c < ir.nchunks; c++)
        item_chunk(run, isa, &ir, c);
    item_close(run, isa, &ir);
}

/*
 * The n items of a decode group (cpu_attn.h, "Groups": one request and key
 * range, different kv heads), interleaved chunk by chunk: chunk c of every
 * member, then chunk c + 1. The members' rows of a block are then read
 * together (NHD: the kv heads of a token are adjacent), which the hardware
 * prefetchers follow, and each member's own prefetches run as before. Each
 * member keeps its state in its part of the group area; the result is
 * bitwise the same as running the items one after the other.
 */
void kva__cpu_decode_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                           kva__cpu_scratch *s, const kva__cpu_decode_isa *isa)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    item_run ir[KVA_CPU_GROUP_MAX];
    int32_t nchunks = 0;
    for (int32_t i = 0; i < n; i++) {
        kva__cpu_scratch_member(s, i, D, Dv, &ir[i].s);
        item_open(run, isa, &items[i], &ir[i]);
        nchunks = ir[i].nchunks > nchunks ? ir[i].nchunks : nchunks;
    }
    for (int32_t c = 0; c < nchunks; c++)
        for (int32_t i = 0; i < n; i++)
            if (c < ir[i].nchunks)
                item_chunk(run, isa, &ir[i], c);
    for (int32_t i = 0; i < n; i++)
        item_close(run, isa, &ir[i]);
}

#endif /* KVA_X86_SIMD */
