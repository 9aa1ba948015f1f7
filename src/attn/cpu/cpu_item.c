/*
 * cpu_item.c - the parts of a work item every kernel variant shares: locating
 * and prefetching the K/V rows of a chunk, loading the query tile, and
 * storing the item's result (final rows or a split partial). They run once
 * per chunk or once per item, never per key, so they are ordinary functions
 * compiled for the baseline ISA.
 */
#include "cpu_attn.h"
#include "cpu_dequant.h"

#include <math.h>

/* 64-byte aligned: the SIMD decodes load whole vectors of it. */
_Alignas(64) const float kva__cpu_zero_v[KVA_MAX_HEAD_DIM];

void kva__cpu_locate_rows(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                          const unsigned char **kr, const unsigned char **vr, const float **ks)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const size_t esz = kva_dtype_size(run->kv_dt);
    if (run->cache) {
        const kva_cache_desc *cd = &run->cache->desc;
        /* K and V elements differ in size only for INT8_TOKEN_K_V16. */
        const size_t vesz = run->cache->v_elem;
        const float *tsc = run->cache->k_token_scale; /* [NB, Hkv, B] or NULL */
        const int32_t B = cd->block_size;
        const int32_t *bt = plan->block_table + (int64_t)r * plan->d.block_table_stride;
        /* Bytes between the rows of consecutive tokens of one block. */
        const size_t kstep =
            (cd->layout == KVA_LAYOUT_NHD ? (size_t)cd->num_kv_heads : 1) * D * esz;
        /* V rows sit in rows of width Dv, or in the K rows of an MLA cache
         * (kva__cache_v_dim: the latent row's first Dv columns). */
        const int64_t vdim = kva__cache_v_dim(cd);
        const size_t vstep =
            (cd->layout == KVA_LAYOUT_NHD ? (size_t)cd->num_kv_heads : 1) * vdim * vesz;
        const unsigned char *kbase = run->cache->k, *vbase = run->cache->v;
        int32_t j = c0;
        while (j < c0 + n) {
            int32_t blk = bt[j / B], off = j % B;
            int32_t cnt = B - off < c0 + n - j ? B - off : c0 + n - j;
            const unsigned char *kp = kbase + (size_t)kva__cache_row(cd, blk, off, kvh, D) * esz;
            const unsigned char *vp =
                vbase + (size_t)kva__cache_row(cd, blk, off, kvh, vdim) * vesz;
            for (int32_t t = 0; t < cnt; t++) {
                kr[j - c0 + t] = kp + (size_t)t * kstep;
                vr[j - c0 + t] = vp + (size_t)t * vstep;
            }
            if (tsc && ks) {
                const float *ts = tsc + kva__token_scale_index(cd, blk, off, kvh);
                for (int32_t t = 0; t < cnt; t++)
                    ks[j - c0 + t] = ts + t;
            }
            j += cnt;
        }
    } else {
        const int32_t Hkv = plan->d.num_kv_heads;
        const int64_t row0 = plan->kv_start[r] + c0;
        const unsigned char *kb = run->k, *vb = run->v;
        for (int32_t t = 0; t < n; t++) {
            kr[t] = kb + (size_t)(((row0 + t) * Hkv + kvh) * D) * esz;
            vr[t] = vb + (size_t)(((row0 + t) * Hkv + kvh) * Dv) * esz;
        }
    }
}

void kva__cpu_locate_chunk(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                           kva__cpu_chunk_rows *cr)
{
    kva__cpu_locate_rows(run, r, kvh, c0, n, cr->k, cr->v, cr->ks);
}

/* Rows of a paged cache are scattered (NHD rows of one kv head are Hkv*D
 * elements apart, blocks are anywhere), which the hardware prefetchers do not
 * follow, so the next chunk's rows are requested explicitly. */
void kva__cpu_prefetch_chunk(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes)
{
#if defined(__GNUC__)
    for (int32_t t = 0; t < n; t++) {
        for (size_t b = 0; b < kbytes; b += 64)
            __builtin_prefetch(cr->k[t] + b, 0, 1);
        for (size_t b = 0; b < vbytes; b += 64)
            __builtin_prefetch(cr->v[t] + b, 0, 1);
    }
#else
    (void)cr;
    (void)n;
    (void)kbytes;
    (void)vbytes;
#endif
}

void kva__cpu_item_begin(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s,
                         kva__cpu_item_geom *g)
{
    const kva_plan *plan = run->plan;
    const kva_plan_desc *d = &plan->d;
    const int32_t H = d->num_heads, D = d->head_dim, Dv = d->head_dim_v;
    const int32_t G = H / d->num_kv_heads;
    const int32_t r = it->req, nq = it->nq, nh = it->nh;
    const size_t esz = kva_dtype_size(run->dt);
    g->hbase = it->kv_head * G + it->h0;
    g->tok0 = plan->query_start_loc[r] + it->i0;
    g->q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
    g->seq = plan->seq_lens[r];
    g->M = nq * nh;

    /* The heads of one token are consecutive in q, so the tile rows of one
     * query row are too. */
    for (int32_t ii = 0; ii < nq; ii++) {
        const unsigned char *src = (const unsigned char *)run->q +
                                   (size_t)(((int64_t)(g->tok0 + ii) * H + g->hbase) * D) * esz;
        float *dst = s->q + (size_t)ii * nh * D;
        kva__cpu_load_row(dst, src, run->dt, nh * D);
        for (int32_t x = 0; x < nh * D; x++)
            dst[x] *= d->scale;
        int32_t lo, hi;
        kva__row_keys(d, g->seq, g->q_len, it->i0 + ii, &lo, &hi);
        s->lo[ii] = lo > it->k0 ? lo : it->k0;
        s->hi[ii] = hi < it->k1 ? hi : it->k1;
    }
    for (int32_t m = 0; m < g->M; m++) {
        s->mx[m] = -INFINITY;
        s->sum[m] = 0.0f;
    }
    memset(s->acc, 0, (size_t)g->M * Dv * sizeof(float));
}

void kva__cpu_item_finish(const kva__cpu_run *run, const kva__work_item *it,
                          const kva__cpu_scratch *s, const kva__cpu_item_geom *g)
{
    const kva_plan *plan = run->plan;
    const int32_t H = plan->d.num_heads, Dv = plan->d.head_dim_v;
    const int32_t M = g->M, nh = it->nh;
    const size_t esz = kva_dtype_size(run->dt);

    if (it->task >= 0) {
        /* Partial of chunk it->split: out [M, Dv] normalized over the chunk, then lse [M]. */
        const kva__split_task *t = &run->part->tasks[it->task];
        float *po = run->partials + t->ws_off + (int64_t)it->split * M * (Dv + 1);
        float *pl = po + (size_t)M * Dv;
        for (int32_t m = 0; m < M; m++) {
            /* sum is exactly 0 only for a row that saw no key of weight > 0 in
             * this chunk; a NaN sum stays NaN in out and lse. */
            const float l = s->sum[m];
            const float f = l == 0.0f ? 0.0f : 1.0f / l;
            const float *acc = s->acc + (size_t)m * Dv;
            float *o = po + (size_t)m * Dv;
            for (int32_t x = 0; x < Dv; x++)
                o[x] = acc[x] * f;
            pl[m] = l == 0.0f ? -INFINITY : s->mx[m] + logf(l);
        }
        return;
    }

    /* Final rows: the sink joins the denominator only. */
    for (int32_t m = 0; m < M; m++) {
        const int32_t ii = m / nh, h = g->hbase + m % nh;
        const float mx = s->mx[m], l = s->sum[m];
        float f, lse;
        if (run->sinks) {
            const float sink = run->sinks[h];
            const float top = kva__cpu_max_nan(mx, sink);
            const float wk = l == 0.0f ? 0.0f : expf(mx - top);
            const float den = l * wk + expf(sink - top);
            f = wk / den;
            lse = top + logf(den);
        } else if (l == 0.0f) {
            f = 0.0f;
            lse = -INFINITY;
        } else {
            f = 1.0f / l;
            lse = mx + logf(l);
        }
        float *acc = s->acc + (size_t)m * Dv;
        for (int32_t x = 0; x < Dv; x++)
            acc[x] *= f;
        const int64_t row = (int64_t)(g->tok0 + ii) * H + h;
        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc, Dv);
        if (run->lse)
            run->lse[row] = lse;
    }
}

void kva__cpu_load_chunk_dequant(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                                 int32_t kvh, kva__cpu_scratch *s)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    kva__cpu_dequant_chunk(run, kvh, n, cr->k, cr->ks, cr->v, s->kbuf, s->vbuf);
    for (int32_t t = 0; t < n; t++) {
        s->kp[t] = s->kbuf + (size_t)t * D;
        s->vp[t] = s->vbuf + (size_t)t * Dv;
    }
    for (int32_t t = n; t < KVA_CPU_KEY_CHUNK; t++) {
        s->kp[t] = s->kp[0];
        s->vp[t] = s->vp[0];
    }
}
