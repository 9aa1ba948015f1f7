/*
 * attn_portable.c - CPU attention kernel decode_portable and prefill_portable (one
 * function, the fallback of both families): GQA-packed online softmax.
 *
 * One call computes one work item (nq query rows x nh heads of one GQA group
 * against keys [k0, k1) of one request and kv head) in chunks of KEY_CHUNK
 * keys, in portable C for the auto-vectorizer; the steps are
 * docs/architecture.md, "The portable kernel". Chunk location, prefetch, the
 * query tile and the final store live in cpu_item.c, shared with the AVX2
 * and AVX-512 kernels.
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

/* Points s->kp/vp [n] at fp32 rows of the chunk, converting f16/bf16 rows
 * into kbuf/vbuf (once for all heads of the group). */
static void load_chunk(const kva__cpu_run *run, const kva__cpu_chunk_rows *cr, int32_t n,
                       int32_t kvh, kva__cpu_scratch *s)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    if (run->quant) {
        kva__cpu_load_chunk_dequant(run, cr, n, kvh, s);
        return;
    }
    if (run->kv_dt == KVA_DTYPE_F32) {
        for (int32_t t = 0; t < n; t++) {
            s->kp[t] = (const float *)cr->k[t];
            s->vp[t] = (const float *)cr->v[t];
        }
        return;
    }
    for (int32_t t = 0; t < n; t++) {
        kva__cpu_load_row(s->kbuf + (size_t)t * D, cr->k[t], run->kv_dt, D);
        kva__cpu_load_row(s->vbuf + (size_t)t * Dv, cr->v[t], run->kv_dt, Dv);
        s->kp[t] = s->kbuf + (size_t)t * D;
        s->vp[t] = s->vbuf + (size_t)t * Dv;
    }
}

/*
 * Online-softmax update of attention row m (query head h, position pos) with
 * the keys [a, e) of the chunk starting at c0 that the tree lanes
 * (kva__tree_lanes, all ones without a tree) leave visible.
 *
 * Non-finite scores follow the reference: a NaN score makes the row's sum
 * (and its max, when no finite score came before) NaN, so out and lse become
 * NaN whatever the key split; scores of -inf have weight 0, and while every
 * score so far is -inf the row is left untouched (exp(-inf - -inf) would be
 * NaN), so it stays empty (sum 0).
 */
static inline void update_row(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m, int32_t h,
                              int32_t pos, int32_t c0, int32_t a, int32_t e, uint32_t tree)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const float *restrict qm = s->q + (size_t)m * D;
    float *restrict p = s->p;
    const int32_t n = e - a;
    const float **kp = s->kp + (a - c0);
    const float **vp = s->vp + (a - c0);

    /* Scores, then soft-cap and ALiBi in their own loops (no branch per key).
     * The chunk max skips NaN scores (a plain compare, which vectorizes): a
     * NaN score makes its exp, and so the row's sum, NaN instead. */
    float cmax = -INFINITY;
    if (plan->d.softcap > 0.0f || plan->alibi_slopes) {
        for (int32_t t = 0; t < n; t++)
            p[t] = dot8(qm, kp[t], D);
        if (plan->d.softcap > 0.0f) {
            const float cap = plan->d.softcap, inv_cap = 1.0f / cap;
            for (int32_t t = 0; t < n; t++)
                p[t] = cap * tanhf(p[t] * inv_cap);
        }
        if (plan->alibi_slopes) {
            const float slope = plan->alibi_slopes[h];
            for (int32_t t = 0; t < n; t++)
                p[t] += slope * (float)(kva__key_pos(&plan->d, a + t) - pos);
        }
        for (int32_t t = 0; t < n; t++)
            cmax = p[t] > cmax ? p[t] : cmax;
    } else {
        for (int32_t t = 0; t < n; t++) {
            const float x = dot8(qm, kp[t], D);
            p[t] = x;
            cmax = x > cmax ? x : cmax;
        }
    }
    /* A tree plan's row: keys of the chunk its lanes (kva__tree_lanes) hide get -inf. */
    if (tree != 0xffffffffu) {
        cmax = -INFINITY;
        for (int32_t t = 0; t < n; t++) {
            if (!((tree >> (a - c0 + t)) & 1u))
                p[t] = -INFINITY;
            cmax = p[t] > cmax ? p[t] : cmax;
        }
    }
    const float mold = s->mx[m];
    float mnew = kva__cpu_max_nan(mold, cmax);
    if (mnew == -INFINITY) {
        /* Every score so far is -inf (weight exp(-inf) = 0: nothing to add,
         * and exp(-inf - -inf) would be NaN) or NaN (the row becomes NaN). */
        int nan = 0;
        for (int32_t t = 0; t < n; t++)
            nan |= p[t] != p[t];
        if (!nan)
            return;
        mnew = NAN;
    }
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
        axpy4(acc, p[t], vp[t], p[t + 1], vp[t + 1], p[t + 2], vp[t + 2], p[t + 3], vp[t + 3], Dv);
    for (; t < n; t++)
        axpy1(acc, p[t], vp[t], Dv);
}

void kva__cpu_attn_portable(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const int32_t r = it->req, nq = it->nq, nh = it->nh;
    kva__cpu_item_geom g;
    kva__cpu_item_begin(run, it, s, &g);

    /* Rows of the current and of the next chunk (prefetched one chunk ahead). */
    kva__cpu_chunk_rows rows[2];
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t kbytes = (size_t)D * kv_esz, vbytes = (size_t)Dv * kv_esz;
    int cur = 0;
    if (it->k0 < it->k1)
        kva__cpu_locate_chunk(
            run, r, it->kv_head, it->k0,
            it->k1 - it->k0 < KVA_CPU_KEY_CHUNK ? it->k1 - it->k0 : KVA_CPU_KEY_CHUNK, &rows[0]);
    for (int32_t c0 = it->k0; c0 < it->k1; c0 += KVA_CPU_KEY_CHUNK) {
        const int32_t c1 = c0 + KVA_CPU_KEY_CHUNK < it->k1 ? c0 + KVA_CPU_KEY_CHUNK : it->k1;
        if (c1 < it->k1) {
            const int32_t n2 = it->k1 - c1 < KVA_CPU_KEY_CHUNK ? it->k1 - c1 : KVA_CPU_KEY_CHUNK;
            kva__cpu_locate_chunk(run, r, it->kv_head, c1, n2, &rows[cur ^ 1]);
            kva__cpu_prefetch_chunk(&rows[cur ^ 1], n2, kbytes, vbytes);
        }
        load_chunk(run, &rows[cur], c1 - c0, it->kv_head, s);
        cur ^= 1;
        for (int32_t ii = 0; ii < nq; ii++) {
            const int32_t a = s->lo[ii] > c0 ? s->lo[ii] : c0;
            const int32_t e = s->hi[ii] < c1 ? s->hi[ii] : c1;
            if (a >= e)
                continue;
            const int32_t pos = g.seq - g.q_len + it->i0 + ii;
            const uint32_t tree = kva__tree_lanes(plan, r, it->i0 + ii, c0);
            const float *saved[KVA_CPU_KEY_CHUNK];
            if (tree != 0xffffffffu)
                kva__cpu_tree_hide_v(s->vp, tree, a - c0, e - c0, saved);
            for (int32_t hh = 0; hh < nh; hh++)
                update_row(run, s, ii * nh + hh, g.hbase + hh, pos, c0, a, e, tree);
            if (tree != 0xffffffffu)
                kva__cpu_tree_restore_v(s->vp, a - c0, e - c0, saved);
        }
    }
    kva__cpu_item_finish(run, it, s, &g);
}
