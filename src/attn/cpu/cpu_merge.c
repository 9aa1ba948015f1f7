/*
 * cpu_merge.c - LSE merges of the CPU backend: the second pass of split-KV
 * items, and kva_merge_states.
 *
 * Both combine partial results over disjoint key sets:
 *   top = max_s lse_s (and the sink), w_s = exp(lse_s - top),
 *   out = sum_s w_s out_s / W, lse = top + log W, W = sum_s w_s (+ exp(sink - top)).
 * A part whose lse is -inf has weight 0 and its out row is not read; if every
 * part is empty (and there is no sink) the row is 0 with lse -inf. A NaN lse
 * of a split part makes top, and so the whole row, NaN (kva_merge_states
 * leaves NaN to the arithmetic). Accumulation is fp32.
 * The N-way merge (kva__cpu_merge_rows) merges each row with AVX2 where the
 * context's ISA level allows (cpu_merge_avx2.c; bf16 rows with AVX-512 where
 * that is allowed, cpu_merge_avx512.c; KVA_CPU_ISA=avx2 or portable forces
 * the lower levels), on as many threads as its size pays for.
 */
#include "cpu_attn.h"

#include <math.h>

/* Row elements times parts a thread of a merge gets at least. A merge is
 * memory-bound and short (a decode step's DCP combine reads a few hundred KiB),
 * so a thread is worth its fork/join and wake-up (microseconds, tens when the
 * pool slept through a collective) only with this much work; smaller merges
 * use fewer threads, down to the caller's thread alone. */
#define KVA_CPU_MERGE_THREAD_WORK 65536

/* The threads of a merge of work row elements times parts. */
static int merge_threads(const kva_context *ctx, int64_t work)
{
    const int64_t nt = work / KVA_CPU_MERGE_THREAD_WORK;
    return nt < 1 ? 1 : nt > ctx->num_threads ? (int)ctx->num_threads : (int)nt;
}

void kva__cpu_merge_task(const kva__cpu_run *run, const kva__split_task *t)
{
    const kva_plan *plan = run->plan;
    const int32_t H = plan->d.num_heads, Dv = plan->d.head_dim_v;
    const int32_t G = H / plan->d.num_kv_heads;
    const int32_t M = t->nq * t->nh, ns = t->num_splits;
    const int32_t hbase = t->kv_head * G + t->h0;
    const int32_t tok0 = plan->query_start_loc[t->req] + t->i0;
    const size_t esz = kva_dtype_size(run->dt);
    const int64_t split_floats = (int64_t)M * (Dv + 1);
    const float *base = run->partials + t->ws_off;
    float acc[KVA_MAX_HEAD_DIM];

    for (int32_t m = 0; m < M; m++) {
        const int32_t h = hbase + m % t->nh;
        const float sink = run->sinks ? run->sinks[h] : -INFINITY;
        float top = sink;
        for (int32_t c = 0; c < ns; c++)
            top = kva__cpu_max_nan(base[c * split_floats + (int64_t)M * Dv + m], top);
        for (int32_t x = 0; x < Dv; x++)
            acc[x] = 0.0f;
        float W = 0.0f, lse = -INFINITY;
        if (top != -INFINITY) {
            for (int32_t c = 0; c < ns; c++) {
                const float *po = base + c * split_floats;
                const float l = po[(int64_t)M * Dv + m];
                if (l == -INFINITY)
                    continue;
                const float w = expf(l - top);
                const float *restrict o = po + (size_t)m * Dv;
                for (int32_t x = 0; x < Dv; x++)
                    acc[x] += w * o[x];
                W += w;
            }
            if (run->sinks)
                W += expf(sink - top);
            const float f = 1.0f / W;
            for (int32_t x = 0; x < Dv; x++)
                acc[x] *= f;
            lse = top + logf(W);
        }
        const int64_t row = (int64_t)(tok0 + m / t->nh) * H + h;
        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc, Dv);
        if (run->lse)
            run->lse[row] = lse;
    }
}

/* Merges one (token, head) row; a and b may alias out (every element is read
 * before it is written). */
static void merge_row(kva_dtype dt, int32_t Dv, const void *a, float la, const void *b, float lb,
                      void *out, float *lse_out)
{
    float fa[KVA_MAX_HEAD_DIM], fb[KVA_MAX_HEAD_DIM];
    /* NaN if either is; a +inf lse makes the weights inf / inf, NaN too, as
     * the reference computes them (kvattn_merge.h). */
    float top = kva__cpu_max_nan(la, lb);
    if (top == INFINITY)
        top = NAN;
    if (top == -INFINITY) {
        for (int32_t x = 0; x < Dv; x++)
            fa[x] = 0.0f;
        kva__cpu_store_row(out, dt, fa, Dv);
        *lse_out = -INFINITY;
        return;
    }
    /* A side of weight exactly 0 (lse -inf, or so far below the other that the
     * weight underflows) is not read: its row may hold anything, even NaN. */
    const float wa = la == top ? 1.0f : expf(la - top), wb = lb == top ? 1.0f : expf(lb - top);
    if (wa != 0.0f)
        kva__cpu_load_row(fa, a, dt, Dv);
    else
        memset(fa, 0, (size_t)Dv * sizeof(float));
    if (wb != 0.0f)
        kva__cpu_load_row(fb, b, dt, Dv);
    else
        memset(fb, 0, (size_t)Dv * sizeof(float));
    const float W = wa + wb;
    const float ca = wa / W, cb = wb / W;
    for (int32_t x = 0; x < Dv; x++)
        fa[x] = ca * fa[x] + cb * fb[x];
    kva__cpu_store_row(out, dt, fa, Dv);
    *lse_out = top + logf(W);
}

kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                 int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                 const float *lse_a, const void *out_b, const float *lse_b,
                                 void *out, float *lse_out)
{
    const int64_t rows = (int64_t)num_tokens * num_heads;
    const size_t row_bytes = (size_t)head_dim_v * kva_dtype_size(dtype);
    const int nt = merge_threads(ctx, rows * head_dim_v * 2);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        /* Read both lse values before the (possibly aliased) lse_out is written. */
        const float la = lse_a[i], lb = lse_b[i];
        merge_row(dtype, head_dim_v, (const unsigned char *)out_a + (size_t)i * row_bytes, la,
                  (const unsigned char *)out_b + (size_t)i * row_bytes, lb,
                  (unsigned char *)out + (size_t)i * row_bytes, &lse_out[i]);
    }
    return KVA_STATUS_OK;
}

kva_status kva__cpu_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                   int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                   const void *outs, int64_t out_stride, const float *lses,
                                   int64_t lse_stride, void *out, float *lse_out)
{
    kva__cpu_merge_rows(ctx, num_parts, num_tokens, num_heads, head_dim_v, dtype, outs, out_stride,
                        (int64_t)num_heads * head_dim_v, lses, lse_stride, num_heads, out, lse_out);
    return KVA_STATUS_OK;
}

/* What every row of one kva__cpu_merge_rows call shares. */
typedef struct merge_args {
    int32_t num_parts, num_heads, Dv;
    kva_dtype dtype;
    size_t esz, row_bytes;
    const unsigned char *outs;
    int64_t out_stride, out_tok;
    const float *lses;
    int64_t lse_stride, lse_tok;
    unsigned char *out;
    float *lse_out;
    int simd; /* the context's ISA level (kva__cpu_isa): AVX2 or higher takes the SIMD rows */
} merge_args;

#if KVA_X86_SIMD
/* dst = sum_p wts[p] * part p's row at row0 + p * out_stride elements, by the
 * highest row merge the ISA level allows. */
static void merge_row_simd(const merge_args *a, const unsigned char *row0, const float *wts,
                           unsigned char *dst)
{
    const size_t part_bytes = (size_t)a->out_stride * a->esz;
    if (a->dtype == KVA_DTYPE_BF16 && a->simd >= KVA__ISA_AVX512)
        kva__cpu_merge_row_bf16_avx512(a->Dv, a->num_parts, row0, part_bytes, wts, dst);
    else
        kva__cpu_merge_row_avx2(a->dtype, a->Dv, a->num_parts, row0, part_bytes, wts, dst);
}
#endif

/* Merges row n (head n % H of token n / H) of a merge_rows call. */
static void merge_rows_one(const merge_args *a, int64_t n);

/* Merges rows [8 b, 8 b + 8) of token t = b / blocks, blocks = ceil(H / 8)
 * per token: with AVX2 a whole block of 8 heads gets its weights in vectors
 * (kva__cpu_merge_weights8_avx2); other rows go one by one. */
static void merge_rows_block(const merge_args *a, int64_t b)
{
    const int32_t H = a->num_heads, blocks = (H + 7) / 8;
    const int64_t t = b / blocks;
    const int32_t h0 = (int32_t)(b % blocks) * 8, nh = H - h0 < 8 ? H - h0 : 8;
#if KVA_X86_SIMD
    if (a->simd >= KVA__ISA_AVX2 && nh == 8) {
        float w[KVA_MAX_DCP * 8], lse[8], wts[KVA_MAX_DCP];
        const unsigned special = kva__cpu_merge_weights8_avx2(
            a->num_parts, a->lses + t * a->lse_tok + h0, a->lse_stride, w, lse);
        for (int32_t l = 0; l < 8; l++) {
            const int64_t n = t * H + h0 + l;
            if (special >> l & 1u) {
                merge_rows_one(a, n);
                continue;
            }
            for (int32_t p = 0; p < a->num_parts; p++)
                wts[p] = w[p * 8 + l];
            if (a->lse_out)
                a->lse_out[n] = lse[l];
            merge_row_simd(a, a->outs + (size_t)(t * a->out_tok + (h0 + l) * a->Dv) * a->esz, wts,
                           a->out + (size_t)n * a->row_bytes);
        }
        return;
    }
#endif
    for (int32_t h = h0; h < h0 + nh; h++)
        merge_rows_one(a, t * H + h);
}

static void merge_rows_one(const merge_args *a, int64_t n)
{
    const int32_t num_parts = a->num_parts, Dv = a->Dv;
    const kva_dtype dtype = a->dtype;
    const size_t esz = a->esz;
    /* Row n is head h of token t; its parts sit at the token strides. */
    const int64_t t = n / a->num_heads, h = n % a->num_heads;
    const int64_t src = t * a->out_tok + h * Dv, ls = t * a->lse_tok + h;
    float acc[KVA_MAX_HEAD_DIM], wts[KVA_MAX_DCP];
    float m = -INFINITY;
    for (int32_t p = 0; p < num_parts; p++)
        m = kva__cpu_max_nan(a->lses[p * a->lse_stride + ls], m);
    if (m == INFINITY) /* exp(+inf) overflows: the weights are NaN (the reference's) */
        m = NAN;
    unsigned char *dst = a->out + (size_t)n * a->row_bytes;
    if (m != m || m == -INFINITY) { /* a NaN or +inf part, or no key in any part */
        for (int32_t c = 0; c < Dv; c++)
            acc[c] = m != m ? m : 0.0f;
        kva__cpu_store_row(dst, dtype, acc, Dv);
        if (a->lse_out)
            a->lse_out[n] = m;
        return;
    }
    /* The weights first, so each part's row is read once, already
     * normalized: acc = sum_p (w_p / W) out_p, one pass per part. */
    float w = 0.0f;
    for (int32_t p = 0; p < num_parts; p++) {
        /* exp(0) = 1 exactly: the largest part needs no expf. */
        const float l = a->lses[p * a->lse_stride + ls];
        wts[p] = l == m ? 1.0f : expf(l - m);
        w += wts[p];
    }
    const float inv = 1.0f / w;
    if (a->lse_out)
        a->lse_out[n] = m + logf(w);
#if KVA_X86_SIMD
    if (a->simd >= KVA__ISA_AVX2) {
        for (int32_t p = 0; p < num_parts; p++)
            wts[p] *= inv; /* 0 stays 0: that part is still not read */
        merge_row_simd(a, a->outs + (size_t)src * esz, wts, dst);
        return;
    }
#endif
    memset(acc, 0, (size_t)Dv * sizeof(float));
    for (int32_t p = 0; p < num_parts; p++) {
        if (wts[p] == 0.0f)
            continue; /* not read: its row may hold anything */
        const float wp = wts[p] * inv;
        const unsigned char *row = a->outs + ((size_t)(p * a->out_stride) + (size_t)src) * esz;
        if (dtype == KVA_DTYPE_F32) {
            const float *restrict r = (const float *)row;
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += wp * r[c];
        } else if (dtype == KVA_DTYPE_BF16) {
            const uint16_t *restrict r = (const uint16_t *)row;
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += wp * kva__cpu_bf16_to_f32(r[c]);
        } else {
            const uint16_t *restrict r = (const uint16_t *)row;
            for (int32_t c = 0; c < Dv; c++)
                acc[c] += wp * kva__cpu_f16_to_f32(r[c]);
        }
    }
    kva__cpu_store_row(dst, dtype, acc, Dv);
}

void kva__cpu_merge_rows(const kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                         int32_t num_heads, int32_t head_dim_v, kva_dtype dtype, const void *outs,
                         int64_t out_stride, int64_t out_tok, const float *lses, int64_t lse_stride,
                         int64_t lse_tok, void *out, float *lse_out)
{
    const int64_t rows = (int64_t)num_tokens * num_heads;
    merge_args a;
    a.num_parts = num_parts;
    a.num_heads = num_heads;
    a.Dv = head_dim_v;
    a.dtype = dtype;
    a.esz = kva_dtype_size(dtype);
    a.row_bytes = (size_t)head_dim_v * a.esz;
    a.outs = outs;
    a.out_stride = out_stride;
    a.out_tok = out_tok;
    a.lses = lses;
    a.lse_stride = lse_stride;
    a.lse_tok = lse_tok;
    a.out = out;
    a.lse_out = lse_out;
#if KVA_X86_SIMD
    a.simd = (int)kva__cpu_isa_of(&ctx->cpu_features);
#else
    a.simd = 0;
#endif
    const int nt = merge_threads(ctx, rows * head_dim_v * num_parts);
    const int64_t blocks = (int64_t)num_tokens * ((num_heads + 7) / 8);
    if (nt == 1) {
        /* No parallel region for a merge of one thread (a DCP combine of a
         * few decodes takes microseconds). */
        for (int64_t b = 0; b < blocks; b++)
            merge_rows_block(&a, b);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        merge_rows_block(&a, b);
}
