/*
 * attn_v1.c - CPU attention kernel, variant 1: GQA-packed online softmax.
 *
 * One call computes one work item: nq query rows x nh heads of one GQA group
 * (M = nq * nh attention rows) against keys [k0, k1) of one request and one
 * kv head.
 *
 *   1. The M query rows are loaded into an fp32 tile [M, D] with the softmax
 *      scale folded in.
 *   2. Keys are walked in chunks of KEY_CHUNK. For each chunk the key and
 *      value rows are located once (block id resolved once per block, then
 *      the rows of the block are consecutive in the cache) and, for f16/bf16,
 *      converted to fp32 once for the whole group.
 *   3. Each row only touches the part of the chunk it can see (causal and
 *      window ranges are contiguous per row), so masks cost nothing inside
 *      the range: scores = <q, k> (8-lane fp32 partial sums), soft-cap,
 *      ALiBi, then the online softmax update (running max, running sum,
 *      rescale of the accumulators) and acc += p * v four keys at a time.
 *   4. Unsplit items normalize (adding the sink to the denominator) and store
 *      out/lse; split items store a partial (out normalized over the chunk,
 *      lse without the sink) for the merge pass.
 *
 * Written in portable C for the auto-vectorizer (restrict pointers, inner
 * loops over D, fp32 accumulators in small arrays); no ISA-specific code.
 * Measured (2-core x86-64, baseline SSE2 code, -O3): see the report in
 * tests/test_cpu.c's benchmark mode / the commit message.
 */
#include "cpu_attn.h"

#include <math.h>

/* <a, b> over n (multiple of 8) floats with 8 independent partial sums, so the
 * compiler can vectorize without reassociating a single sum. */
static inline float dot8(const float *restrict a, const float *restrict b, int32_t n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int32_t d = 0; d < n; d += 8)
        for (int32_t l = 0; l < 8; l++)
            acc[l] += a[d + l] * b[d + l];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* acc[0..n) += p0 v0 + p1 v1 + p2 v2 + p3 v3 (one pass over acc for four keys). */
static inline void axpy4(float *restrict acc, float p0, const float *restrict v0, float p1,
                         const float *restrict v1, float p2, const float *restrict v2, float p3,
                         const float *restrict v3, int32_t n)
{
    for (int32_t d = 0; d < n; d++)
        acc[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
}

static inline void axpy1(float *restrict acc, float p, const float *restrict v, int32_t n)
{
    for (int32_t d = 0; d < n; d++)
        acc[d] += p * v[d];
}

/*
 * Points kp/vp [n] at the fp32 rows of keys c0 .. c0+n-1 of request r, kv
 * head kvh, converting f16/bf16 rows into kbuf/vbuf.
 */
static void gather_chunk(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                         kva__cpu_scratch *s)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const size_t esz = kva_dtype_size(run->dt);
    const unsigned char *krow[KVA_CPU_KEY_CHUNK];
    const unsigned char *vrow[KVA_CPU_KEY_CHUNK];
    if (run->cache) {
        const kva_cache_desc *cd = &run->cache->desc;
        const int32_t B = cd->block_size;
        const int32_t *bt = plan->block_table + (int64_t)r * plan->d.block_table_stride;
        /* Elements between the rows of consecutive tokens of one block. */
        const int64_t kstep = cd->layout == KVA_LAYOUT_NHD ? (int64_t)cd->num_kv_heads * D : D;
        const int64_t vstep = cd->layout == KVA_LAYOUT_NHD ? (int64_t)cd->num_kv_heads * Dv : Dv;
        const unsigned char *kbase = run->cache->k, *vbase = run->cache->v;
        int32_t j = c0;
        while (j < c0 + n) {
            int32_t blk = bt[j / B], off = j % B;
            int32_t cnt = B - off < c0 + n - j ? B - off : c0 + n - j;
            const unsigned char *kp = kbase + (size_t)kva__cache_row(cd, blk, off, kvh, D) * esz;
            const unsigned char *vp = vbase + (size_t)kva__cache_row(cd, blk, off, kvh, Dv) * esz;
            for (int32_t t = 0; t < cnt; t++) {
                krow[j - c0 + t] = kp + (size_t)(t * kstep) * esz;
                vrow[j - c0 + t] = vp + (size_t)(t * vstep) * esz;
            }
            j += cnt;
        }
    } else {
        const int32_t Hkv = plan->d.num_kv_heads;
        const int64_t row0 = plan->kv_start[r] + c0;
        const unsigned char *kb = run->k, *vb = run->v;
        for (int32_t t = 0; t < n; t++) {
            krow[t] = kb + (size_t)(((row0 + t) * Hkv + kvh) * D) * esz;
            vrow[t] = vb + (size_t)(((row0 + t) * Hkv + kvh) * Dv) * esz;
        }
    }
    if (run->dt == KVA_DTYPE_F32) {
        for (int32_t t = 0; t < n; t++) {
            s->kp[t] = (const float *)krow[t];
            s->vp[t] = (const float *)vrow[t];
        }
    } else {
        for (int32_t t = 0; t < n; t++) {
            kva__cpu_load_row(s->kbuf + (size_t)t * D, krow[t], run->dt, D);
            kva__cpu_load_row(s->vbuf + (size_t)t * Dv, vrow[t], run->dt, Dv);
            s->kp[t] = s->kbuf + (size_t)t * D;
            s->vp[t] = s->vbuf + (size_t)t * Dv;
        }
    }
}

/*
 * Online-softmax update of attention row m (query head h, position pos) with
 * the keys [a, e) of the chunk starting at c0.
 */
static inline void update_row(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m,
                              int32_t h, int32_t pos, int32_t c0, int32_t a, int32_t e)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const float cap = plan->d.softcap;
    const float slope = plan->alibi_slopes ? plan->alibi_slopes[h] : 0.0f;
    const float *restrict qm = s->q + (size_t)m * D;
    float *restrict p = s->p;
    const int32_t n = e - a;
    const float **kp = s->kp + (a - c0);
    const float **vp = s->vp + (a - c0);

    float cmax = -INFINITY;
    for (int32_t t = 0; t < n; t++) {
        float x = dot8(qm, kp[t], D);
        if (cap > 0.0f)
            x = cap * tanhf(x / cap);
        if (plan->alibi_slopes)
            x += slope * (float)(a + t - pos);
        p[t] = x;
        cmax = x > cmax ? x : cmax;
    }
    const float mold = s->mx[m];
    const float mnew = mold > cmax ? mold : cmax;
    const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
    float psum = 0.0f;
    for (int32_t t = 0; t < n; t++) {
        p[t] = expf(p[t] - mnew);
        psum += p[t];
    }
    s->mx[m] = mnew;
    s->sum[m] = s->sum[m] * alpha + psum;
    float *restrict acc = s->acc + (size_t)m * Dv;
    if (alpha != 1.0f)
        for (int32_t d = 0; d < Dv; d++)
            acc[d] *= alpha;
    int32_t t = 0;
    for (; t + 4 <= n; t += 4)
        axpy4(acc, p[t], vp[t], p[t + 1], vp[t + 1], p[t + 2], vp[t + 2], p[t + 3], vp[t + 3],
              Dv);
    for (; t < n; t++)
        axpy1(acc, p[t], vp[t], Dv);
}

void kva__cpu_attn_v1(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    const kva_plan *plan = run->plan;
    const kva_plan_desc *d = &plan->d;
    const int32_t H = d->num_heads, D = d->head_dim, Dv = d->head_dim_v;
    const int32_t G = H / d->num_kv_heads;
    const int32_t r = it->req, nq = it->nq, nh = it->nh;
    const int32_t hbase = it->kv_head * G + it->h0;
    const int32_t tok0 = plan->query_start_loc[r] + it->i0;
    const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
    const int32_t seq = plan->seq_lens[r];
    const int32_t M = nq * nh;
    const size_t esz = kva_dtype_size(run->dt);

    /* Query tile [M, D], row m = ii * nh + hh is token tok0 + ii, head hbase + hh
     * (the heads of one token are consecutive in q, so the tile is too). */
    for (int32_t ii = 0; ii < nq; ii++) {
        const unsigned char *src =
            (const unsigned char *)run->q + (size_t)(((int64_t)(tok0 + ii) * H + hbase) * D) * esz;
        float *dst = s->q + (size_t)ii * nh * D;
        kva__cpu_load_row(dst, src, run->dt, nh * D);
        for (int32_t x = 0; x < nh * D; x++)
            dst[x] *= d->scale;
        int32_t lo, hi;
        kva__row_keys(d, seq, q_len, it->i0 + ii, &lo, &hi);
        s->lo[ii] = lo > it->k0 ? lo : it->k0;
        s->hi[ii] = hi < it->k1 ? hi : it->k1;
    }
    for (int32_t m = 0; m < M; m++) {
        s->mx[m] = -INFINITY;
        s->sum[m] = 0.0f;
    }
    memset(s->acc, 0, (size_t)M * Dv * sizeof(float));

    for (int32_t c0 = it->k0; c0 < it->k1; c0 += KVA_CPU_KEY_CHUNK) {
        const int32_t c1 = c0 + KVA_CPU_KEY_CHUNK < it->k1 ? c0 + KVA_CPU_KEY_CHUNK : it->k1;
        gather_chunk(run, r, it->kv_head, c0, c1 - c0, s);
        for (int32_t ii = 0; ii < nq; ii++) {
            const int32_t a = s->lo[ii] > c0 ? s->lo[ii] : c0;
            const int32_t e = s->hi[ii] < c1 ? s->hi[ii] : c1;
            if (a >= e)
                continue;
            const int32_t pos = seq - q_len + it->i0 + ii;
            for (int32_t hh = 0; hh < nh; hh++)
                update_row(run, s, ii * nh + hh, hbase + hh, pos, c0, a, e);
        }
    }

    if (it->task >= 0) {
        /* Partial of chunk it->split: out [M, Dv] normalized over the chunk, then lse [M]. */
        const kva__split_task *t = &run->part->tasks[it->task];
        float *po = run->partials + t->ws_off + (int64_t)it->split * M * (Dv + 1);
        float *pl = po + (size_t)M * Dv;
        for (int32_t m = 0; m < M; m++) {
            const float l = s->sum[m];
            const float f = l > 0.0f ? 1.0f / l : 0.0f;
            const float *acc = s->acc + (size_t)m * Dv;
            float *o = po + (size_t)m * Dv;
            for (int32_t x = 0; x < Dv; x++)
                o[x] = acc[x] * f;
            pl[m] = l > 0.0f ? s->mx[m] + logf(l) : -INFINITY;
        }
        return;
    }

    /* Final rows: the sink joins the denominator only. */
    for (int32_t m = 0; m < M; m++) {
        const int32_t ii = m / nh, h = hbase + m % nh;
        const float mx = s->mx[m], l = s->sum[m];
        float f, lse;
        if (run->sinks) {
            const float sink = run->sinks[h];
            const float top = mx > sink ? mx : sink;
            const float wk = l > 0.0f ? expf(mx - top) : 0.0f;
            const float den = l * wk + expf(sink - top);
            f = wk / den;
            lse = top + logf(den);
        } else if (l > 0.0f) {
            f = 1.0f / l;
            lse = mx + logf(l);
        } else {
            f = 0.0f;
            lse = -INFINITY;
        }
        float *acc = s->acc + (size_t)m * Dv;
        for (int32_t x = 0; x < Dv; x++)
            acc[x] *= f;
        const int64_t row = (int64_t)(tok0 + ii) * H + h;
        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc,
                           Dv);
        if (run->lse)
            run->lse[row] = lse;
    }
}
