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
 *      lse without the sink) for the merge pass. A row is empty exactly when
 *      its sum is 0 (no key, or only -inf scores); a NaN score makes the
 *      sum NaN, which the partial's lse and the merge carry to the output,
 *      so NaN rows do not depend on the split.
 *
 * Written in portable C for the auto-vectorizer (restrict pointers, inner
 * loops over D, fp32 accumulators in small arrays); no ISA-specific code, so
 * the default x86-64 build runs SSE2 (no FMA). The rows of the next chunk are
 * prefetched while the current one computes.
 *
 * Measured with `kvattn bench` (2-core x86-64 VM with AVX2/FMA/AVX-512,
 * Release, bf16, H=32 Hkv=8 D=128 B=16, NHD):
 *   decode 16 x 2048 keys, 2 threads: 20 ms, 6.7 GB/s of K/V, 27 GFLOP/s;
 *   1 thread: 14 GFLOP/s both with 64 keys (in cache) and 2048 keys, so
 *   the kernel is compute-bound at ~5 flops/cycle, not memory-bound;
 *   prefill 1024 tokens causal, 2 threads: 216 ms, 40 GFLOP/s.
 * Soft-cap and ALiBi run as separate passes over a row's chunk of scores
 * (no per-key branches, 1/cap precomputed); f16/bf16 rows load through the
 * inline kva__cpu_load_row. 1 thread, decode 4 x 4096 keys, best of 11:
 * softcap 30: 29.3 -> 24.5 ms; bf16, f16, f32 and a 512-token prefill
 * unchanged within noise (20.0, 48-49, 22, 110-113 ms).
 * Tried and dropped: compiler target_clones (AVX2, x86-64-v4) of this kernel
 * ran at half speed; four dot products per q load (dot8x4) ran slower (8
 * GFLOP/s single thread) with GCC 12. The next step is hand-written AVX2 and
 * AVX-512 kernels with runtime dispatch (kva__cpu_attn_variant).
 */
#include "cpu_attn.h"
#include "cpu_dequant.h"

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

/* Byte pointers of the K and V rows of one chunk of keys, and the per-token
 * key scales of an INT8_TOKEN_K cache. */
typedef struct chunk_rows {
    const unsigned char *k[KVA_CPU_KEY_CHUNK];
    const unsigned char *v[KVA_CPU_KEY_CHUNK];
    const float *ks[KVA_CPU_KEY_CHUNK];
} chunk_rows;

/*
 * Locates the rows of keys c0 .. c0+n-1 of request r, kv head kvh: for the
 * paged cache the block id is read once per block, then the block's rows are
 * a fixed stride apart; ragged rows are kv_start[r] + j.
 */
static void locate_chunk(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                         chunk_rows *cr)
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
        const size_t vstep =
            (cd->layout == KVA_LAYOUT_NHD ? (size_t)cd->num_kv_heads : 1) * Dv * vesz;
        const unsigned char *kbase = run->cache->k, *vbase = run->cache->v;
        int32_t j = c0;
        while (j < c0 + n) {
            int32_t blk = bt[j / B], off = j % B;
            int32_t cnt = B - off < c0 + n - j ? B - off : c0 + n - j;
            const unsigned char *kp = kbase + (size_t)kva__cache_row(cd, blk, off, kvh, D) * esz;
            const unsigned char *vp = vbase + (size_t)kva__cache_row(cd, blk, off, kvh, Dv) * vesz;
            for (int32_t t = 0; t < cnt; t++) {
                cr->k[j - c0 + t] = kp + (size_t)t * kstep;
                cr->v[j - c0 + t] = vp + (size_t)t * vstep;
            }
            if (tsc) {
                const float *ts = tsc + kva__token_scale_index(cd, blk, off, kvh);
                for (int32_t t = 0; t < cnt; t++)
                    cr->ks[j - c0 + t] = ts + t;
            }
            j += cnt;
        }
    } else {
        const int32_t Hkv = plan->d.num_kv_heads;
        const int64_t row0 = plan->kv_start[r] + c0;
        const unsigned char *kb = run->k, *vb = run->v;
        for (int32_t t = 0; t < n; t++) {
            cr->k[t] = kb + (size_t)(((row0 + t) * Hkv + kvh) * D) * esz;
            cr->v[t] = vb + (size_t)(((row0 + t) * Hkv + kvh) * Dv) * esz;
        }
    }
}

/* Asks for the n rows of a chunk to be brought into the cache while the
 * current chunk computes: rows of a paged cache are scattered (NHD rows of
 * one kv head are Hkv*D elements apart, blocks are anywhere), which the
 * hardware prefetchers do not follow. */
static void prefetch_chunk(const chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes)
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

/* Points s->kp/vp [n] at fp32 rows of the chunk, converting f16/bf16 rows
 * into kbuf/vbuf (once for all heads of the group); rows of a quantized
 * cache are dequantized into kbuf/vbuf by kva__cpu_dequant_chunk with the
 * scales of kv head kvh. */
static void load_chunk(const kva__cpu_run *run, const chunk_rows *cr, int32_t n, int32_t kvh,
                       kva__cpu_scratch *s)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    if (run->quant) {
        kva__cpu_dequant_chunk(run, kvh, n, cr->k, cr->ks, cr->v, s->kbuf, s->vbuf);
        for (int32_t t = 0; t < n; t++) {
            s->kp[t] = s->kbuf + (size_t)t * D;
            s->vp[t] = s->vbuf + (size_t)t * Dv;
        }
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
 * the keys [a, e) of the chunk starting at c0.
 *
 * Non-finite scores follow the reference: a NaN score makes the row's sum
 * (and its max, when no finite score came before) NaN, so out and lse become
 * NaN whatever the key split; scores of -inf have weight 0, and while every
 * score so far is -inf the row is left untouched (exp(-inf - -inf) would be
 * NaN), so it stays empty (sum 0).
 */
static inline void update_row(const kva__cpu_run *run, kva__cpu_scratch *s, int32_t m, int32_t h,
                              int32_t pos, int32_t c0, int32_t a, int32_t e)
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
                p[t] += slope * (float)(a + t - pos);
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

    /* Rows of the current and of the next chunk (prefetched one chunk ahead). */
    chunk_rows rows[2];
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    const size_t kbytes = (size_t)D * kv_esz,
                 vbytes = (size_t)Dv * (run->cache ? run->cache->v_elem : kv_esz);
    int cur = 0;
    if (it->k0 < it->k1)
        locate_chunk(run, r, it->kv_head, it->k0,
                     it->k1 - it->k0 < KVA_CPU_KEY_CHUNK ? it->k1 - it->k0 : KVA_CPU_KEY_CHUNK,
                     &rows[0]);
    for (int32_t c0 = it->k0; c0 < it->k1; c0 += KVA_CPU_KEY_CHUNK) {
        const int32_t c1 = c0 + KVA_CPU_KEY_CHUNK < it->k1 ? c0 + KVA_CPU_KEY_CHUNK : it->k1;
        if (c1 < it->k1) {
            const int32_t n2 = it->k1 - c1 < KVA_CPU_KEY_CHUNK ? it->k1 - c1 : KVA_CPU_KEY_CHUNK;
            locate_chunk(run, r, it->kv_head, c1, n2, &rows[cur ^ 1]);
            prefetch_chunk(&rows[cur ^ 1], n2, kbytes, vbytes);
        }
        load_chunk(run, &rows[cur], c1 - c0, it->kv_head, s);
        cur ^= 1;
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
        const int32_t ii = m / nh, h = hbase + m % nh;
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
        const int64_t row = (int64_t)(tok0 + ii) * H + h;
        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc, Dv);
        if (run->lse)
            run->lse[row] = lse;
    }
}
