/*
 * indexer_cpu.c - the CPU lightning indexer (kva_indexer_run on the CPU
 * backend).
 *
 * Threads take query tokens. For its token a thread converts q [Hi, D] to
 * float once (an FP8-q plan: to its e4m3 codes' values, the row scales
 * folded into the head weights), then walks the keys 0 .. pos in tiles of W (8 on AVX2, 16 on
 * AVX-512, 8 portable): the tile's rows are loaded straight into [D, W]
 * order (FP8_TOKEN codes through a 256-entry table, the per-token scales
 * aside) and scored by the ISA's tile kernel (indexer_cpu.h) into the
 * token's logit row. The top K are then
 * selected without a full sort: a three-pass radix select on the logits'
 * order-preserving 32-bit keys finds the K-th largest key exactly, one pass
 * collects the keys above it and the lowest positions equal to it, and only
 * those K are sorted (logit descending, position ascending).
 */
#include "indexer_cpu.h"

#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

/* Bytes of one thread's scratch, each part 64-byte aligned: q [Hi, D] and
 * the tile [D, W] as float, the e4m3 table [256] (in a part of [D, W]
 * floats or 1 KiB), scales [W], logits/keys [S], candidates [K] uint64,
 * the radix histogram [2048], the head weights [Hi] of an FP8-q plan. */
static size_t align64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}
static size_t lut_bytes(size_t D)
{
    const size_t b = align64(D * KVA_INDEX_TILE_MAX * 4);
    return b > 1024 ? b : 1024;
}
static size_t thread_bytes(const kva_plan *plan)
{
    const kva_plan_desc *d = &plan->d;
    const size_t D = (size_t)d->head_dim, W = KVA_INDEX_TILE_MAX;
    return align64((size_t)d->num_heads * D * 4) + align64(D * W * 4) + lut_bytes(D) +
           align64(W * 4) + align64((size_t)plan->info.max_seq_len * 4) +
           align64((size_t)d->sparse_topk * 8) + align64(2048 * 4) +
           align64((size_t)d->num_heads * 4);
}

size_t kva__cpu_indexer_workspace(const kva_plan *plan, int32_t nt)
{
    return plan->d.kind == KVA_ATTN_INDEX ? (size_t)nt * thread_bytes(plan) : 0;
}

/* The portable tile kernel (W = 8), same contract as the SIMD ones. */
static void tile_portable(const float *q, const float *w, const float *kt, const float *sc,
                          int32_t Hi, int32_t D, float *out)
{
    float logit[8] = {0};
    for (int32_t h = 0; h < Hi; h++) {
        float acc[8] = {0};
        for (int32_t c = 0; c < D; c++)
            for (int j = 0; j < 8; j++)
                acc[j] += q[(int64_t)h * D + c] * kt[c * 8 + j];
        for (int j = 0; j < 8; j++)
            logit[j] += w[h] * (acc[j] < 0.0f ? 0.0f : acc[j]); /* NaN stays NaN */
    }
    for (int j = 0; j < 8; j++)
        out[j] = logit[j] * sc[j];
}

/* An order-preserving key of a logit: larger floats get larger keys, -0
 * equals +0, and NaN gets 0, below every number (listed last). */
static inline uint32_t order_key(float x)
{
    if (x != x)
        return 0;
    if (x == 0.0f)
        x = 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sorts candidates descending: (key << 32 | ~position), i.e. larger key
 * first, then lower position. */
static int cmp_desc(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Lists the top K of the n keys key [n] into row [K] (then -1). */
static void select_top(uint32_t *key, int32_t n, int32_t K, uint64_t *cand, uint32_t *hist,
                       int32_t *row)
{
    int32_t m = 0;
    if (n <= K) {
        for (int32_t j = 0; j < n; j++)
            cand[m++] = (uint64_t)key[j] << 32 | (uint32_t) ~(uint32_t)j;
    } else {
        /* Radix select of the K-th largest key: 11, 11 and 10 bits. */
        static const int shift[3] = {21, 10, 0}, bits[3] = {11, 11, 10};
        uint32_t prefix = 0, mask = 0;
        int32_t need = K;
        for (int p = 0; p < 3; p++) {
            const uint32_t nb = 1u << bits[p];
            memset(hist, 0, nb * sizeof *hist);
            for (int32_t j = 0; j < n; j++)
                if ((key[j] & mask) == prefix)
                    hist[(key[j] >> shift[p]) & (nb - 1)]++;
            uint32_t b = nb - 1;
            int32_t above = 0;
            while ((int32_t)hist[b] < need - above) {
                above += (int32_t)hist[b];
                b--;
            }
            need -= above;
            prefix |= b << shift[p];
            mask |= (nb - 1) << shift[p];
        }
        /* prefix is the K-th largest key; need of its equals are listed. */
        for (int32_t j = 0; j < n; j++) {
            if (key[j] > prefix || (key[j] == prefix && need-- > 0))
                cand[m++] = (uint64_t)key[j] << 32 | (uint32_t) ~(uint32_t)j;
        }
    }
    qsort(cand, (size_t)m, sizeof *cand, cmp_desc);
    for (int32_t k = 0; k < K; k++)
        row[k] = k < m ? (int32_t) ~(uint32_t)cand[k] : -1;
}

/* Loads key (block, off) into column j of the tile kt [D, W]; returns its
 * scale. lut [256]: the e4m3 values (FP8_TOKEN). */
static float load_column(const kva_cache *c, int64_t block, int64_t off, const float *lut,
                         float *kt, int32_t j, int W)
{
    const kva_cache_desc *d = &c->desc;
    const int32_t D = d->head_dim;
    const char *base = (const char *)c->k + block * c->k_block_elems * (int64_t)c->elem_size;
    if (d->quant == KVA_QUANT_FP8_TOKEN) {
        const uint8_t *codes = (const uint8_t *)base + off * D;
        for (int32_t i = 0; i < D; i++)
            kt[i * W + j] = lut[codes[i]];
        float s;
        memcpy(&s, base + (int64_t)d->block_size * D + off * 4, sizeof s);
        return s;
    }
    if (d->dtype == KVA_DTYPE_F32) {
        const float *row = (const float *)base + off * D;
        for (int32_t i = 0; i < D; i++)
            kt[i * W + j] = row[i];
    } else if (d->dtype == KVA_DTYPE_BF16) {
        const uint16_t *row = (const uint16_t *)base + off * D;
        for (int32_t i = 0; i < D; i++) {
            const uint32_t u = (uint32_t)row[i] << 16;
            memcpy(kt + i * W + j, &u, 4);
        }
    } else {
        const uint16_t *row = (const uint16_t *)base + off * D;
        for (int32_t i = 0; i < D; i++)
            kt[i * W + j] = kva_f16_to_f32(row[i]);
    }
    return 1.0f;
}

/* Scores the keys 0 .. n-1 of one token of request r into logit [n]. */
static void score_token(const kva_plan *plan, const kva_cache *cache, const int32_t *bt,
                        const float *q, const float *w, int32_t n, kva__index_tile_fn tile, int W,
                        float *kt, const float *lut, float *sc, float *logit)
{
    const int32_t D = plan->d.head_dim, Hi = plan->d.num_heads, B = plan->d.block_size;
    for (int32_t j0 = 0; j0 < n; j0 += W) {
        const int32_t nk = n - j0 < W ? n - j0 : W;
        for (int32_t j = 0; j < W; j++) {
            /* Past the last key, repeat it: computed, never stored. */
            const int32_t p = j0 + (j < nk ? j : nk - 1);
            sc[j] = load_column(cache, bt[p / B], p % B, lut, kt, j, W);
        }
        float out[KVA_INDEX_TILE_MAX];
        tile(q, w, kt, sc, Hi, D, out);
        memcpy(logit + j0, out, (size_t)nk * sizeof *out);
    }
}

kva_status kva__cpu_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                            const float *weights, const kva_cache *cache, int32_t *indices,
                            int64_t indices_stride, int32_t *topk_length)
{
    const kva_plan_desc *d = &plan->d;
    const int32_t Hi = d->num_heads, D = d->head_dim, K = d->sparse_topk;
    const int32_t T = plan->info.num_tokens, R = d->num_requests;
    kva__index_tile_fn tile = tile_portable;
    int W = 8;
    const kva__cpu_isa isa = kva__cpu_isa_of(&ctx->cpu_features);
#if KVA_X86_SIMD
    if (isa >= KVA__ISA_AVX512)
        tile = kva__index_tile_avx512, W = 16;
    else if (isa >= KVA__ISA_AVX2)
        tile = kva__index_tile_avx2, W = 8;
#else
    (void)isa;
#endif
    const size_t tb = thread_bytes(plan);
    /* Threads: the context's, as far as its workspace holds their scratch
     * (a plan built on a context of fewer threads reserved fewer areas, and
     * this context's reservation need only hold the plan's bytes), as the
     * other CPU runs do. */
    int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    if ((size_t)nt > ctx->workspace_bytes / tb)
        nt = (int)(ctx->workspace_bytes / tb);
    nt = nt < 1 ? 1 : nt;
    (void)nt; /* unused without OpenMP */
#pragma omp parallel num_threads(nt) if (nt > 1 && T > 1)
    {
        int tid = 0;
#if defined(_OPENMP)
        tid = omp_get_thread_num();
#endif
        char *ws = (char *)ctx->workspace + (size_t)tid * tb;
        float *qf = (float *)ws;
        float *kt = (float *)(ws + align64((size_t)Hi * D * 4));
        float *lut = (float *)((char *)kt + align64((size_t)D * KVA_INDEX_TILE_MAX * 4));
        float *sc = (float *)((char *)lut + lut_bytes((size_t)D));
        for (int c = 0; c < 256; c++)
            lut[c] = kva_fp8_e4m3_to_f32((uint8_t)c);
        float *logit = (float *)((char *)sc + align64(KVA_INDEX_TILE_MAX * 4));
        uint64_t *cand = (uint64_t *)((char *)logit + align64((size_t)plan->info.max_seq_len * 4));
        uint32_t *hist = (uint32_t *)((char *)cand + align64((size_t)K * 8));
        float *wq = (float *)((char *)hist + align64(2048 * 4));
        int32_t r = 0;
#pragma omp for schedule(dynamic, 1)
        for (int32_t t = 0; t < T; t++) {
            while (r + 1 < R && plan->query_start_loc[r + 1] <= t)
                r++;
            while (r > 0 && plan->query_start_loc[r] > t)
                r--;
            const int32_t q0 = plan->query_start_loc[r];
            const int32_t ql = plan->query_start_loc[r + 1] - q0;
            const int32_t n = plan->seq_lens[r] - ql + (t - q0) + 1; /* keys 0 .. pos */
            for (int64_t e = 0; e < (int64_t)Hi * D; e++)
                qf[e] = kva__load_f(q, d->q_dtype, (size_t)((int64_t)t * Hi * D + e));
            const float *w = weights + (int64_t)t * Hi;
            if (d->index_q_quant == KVA_QUANT_FP8_TOKEN) {
                /* Each head's row becomes its codes' values (exact), its
                 * scale goes into the head weight: w s relu(c . k) =
                 * w relu(c s . k) since s > 0. */
                uint8_t codes[KVA_MAX_HEAD_DIM];
                for (int32_t h = 0; h < Hi; h++) {
                    float *qh = qf + (int64_t)h * D;
                    const float s = kva__index_fp8_quant_row(qh, D, codes);
                    for (int32_t c = 0; c < D; c++)
                        qh[c] = lut[codes[c]];
                    wq[h] = w[h] * s;
                }
                w = wq;
            }
            score_token(plan, cache, plan->block_table + (int64_t)r * d->block_table_stride, qf, w,
                        n, tile, W, kt, lut, sc, logit);
            uint32_t *key = (uint32_t *)logit; /* in place */
            for (int32_t j = 0; j < n; j++)
                key[j] = order_key(logit[j]);
            select_top(key, n, K, cand, hist, indices + (int64_t)t * indices_stride);
            if (topk_length)
                topk_length[t] = n < K ? n : K;
        }
    }
    return KVA_STATUS_OK;
}
