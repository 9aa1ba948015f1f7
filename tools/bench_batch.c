/*
 * bench_batch.c - the step `kvattn bench` times: request lengths per mode,
 * shuffled block tables, random q/K/V, the cache fill, and the work counts.
 */
#include "bench.h"
#include "cli_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *bench_mode_name(bench_mode m)
{
    return m == BENCH_DECODE ? "decode" : m == BENCH_PREFILL ? "prefill" : "mixed";
}

void bench_opts_init(bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = BENCH_DECODE;
    o->batch = -1;
    o->context = -1;
    o->q_len = -1;
    o->heads = 32;
    o->kv_heads = 8;
    o->head_dim = 128;
    o->head_dim_v = 0;
    o->block_size = 16;
    o->dtype = KVA_DTYPE_BF16;
    o->kv_quant = KVA_QUANT_NONE;
    o->layout = KVA_LAYOUT_NHD;
    o->causal = 1;
    o->window = -1;
    o->chunk = 0;
    o->softcap = 0.0f;
    o->backend = KVA_BACKEND_CPU;
    o->threads = 0;
    o->iters = 0;
    o->warmup = 2;
    o->seed = 1234;
}

void bench_opts_resolve(bench_opts *o)
{
    /* Defaults per mode, sized so that one run on a 2-core machine takes tens of
     * milliseconds (decode) to a few hundred (prefill, mixed). */
    static const int32_t defaults[3][3] = {
        /* batch, context, q_len */
        {16, 4096, 1},  /* decode: 16 requests, 4096 cached tokens each */
        {2, 0, 512},    /* prefill: 2 prompts of 512 tokens, no cached context */
        {16, 2048, 128} /* mixed: 16 decodes + one 128-token chunk, all after 2048 tokens */
    };
    if (o->batch < 0)
        o->batch = defaults[o->mode][0];
    if (o->context < 0)
        o->context = defaults[o->mode][1];
    if (o->q_len < 0)
        o->q_len = defaults[o->mode][2];
    if (o->head_dim_v == 0)
        o->head_dim_v = o->head_dim;
}

/* ---- random data ---- */

#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void bench_fill(void *p, kva_dtype dt, size_t n, uint64_t *s)
{
    /* Uniform on [-sqrt(3), sqrt(3)): unit variance, so q.k * 1/sqrt(D) has
     * unit variance and the softmax is neither flat nor one-hot. Two values per
     * 64-bit draw keeps filling gigabytes of cache fast. */
    const float a = 1.7320508f * 0x1.0p-23f;
    /* splitmix64 is a counter: draw j sees the state s0 + (j + 1) * gamma, so
     * the draws of a large fill (a cache of gigabytes) are made on all
     * threads, with the values of the one sequential stream. */
    const uint64_t s0 = *s;
    const size_t draws = (n + 1) / 2;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (draws >= ((size_t)1 << 18))
#endif
    for (size_t j = 0; j < draws; j++) {
        const size_t i = 2 * j;
        uint64_t st = s0 + (uint64_t)j * SPLITMIX_GAMMA;
        uint64_t z = splitmix64(&st);
        float x[2] = {(float)(int32_t)((uint32_t)(z >> 40) - (1u << 23)) * a,
                      (float)(int32_t)((uint32_t)((z >> 8) & 0xffffffu) - (1u << 23)) * a};
        for (size_t k = 0; k < 2 && i + k < n; k++) {
            if (dt == KVA_DTYPE_F32)
                ((float *)p)[i + k] = x[k];
            else if (dt == KVA_DTYPE_F16)
                ((uint16_t *)p)[i + k] = kva_f32_to_f16(x[k]);
            else
                ((uint16_t *)p)[i + k] = kva_f32_to_bf16(x[k]);
        }
    }
    *s = s0 + (uint64_t)draws * SPLITMIX_GAMMA;
}

void bench_poison(void *p, kva_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = NAN;
        else
            ((uint16_t *)p)[i] = dt == KVA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
    }
}

/* ---- the batch ---- */

void bench_batch_free(bench_batch *b)
{
    free(b->query_start_loc);
    free(b->seq_lens);
    free(b->block_table);
    free(b->q);
    free(b->out);
    free(b->lse);
    free(b->k_new);
    free(b->v_new);
    free(b->slot_new);
    free(b->k_ragged);
    free(b->v_ragged);
    free(b->src_token);
    free(b->slopes);
    free(b->sinks);
    free(b->tree_parents);
    memset(b, 0, sizeof *b);
}

static kva_status oom(bench_batch *b)
{
    bench_batch_free(b);
    return KVA_STATUS_OUT_OF_MEMORY;
}

kva_status bench_batch_build(const bench_opts *o, bench_batch *b)
{
    memset(b, 0, sizeof *b);
    const int32_t R = o->mode == BENCH_MIXED ? o->batch + 1 : o->batch;
    const int32_t B = o->block_size;
    const size_t es = kva_dtype_size(o->dtype);
    b->num_requests = R;
    b->query_start_loc = calloc((size_t)R + 1, sizeof(int32_t));
    b->seq_lens = calloc((size_t)R + 1, sizeof(int32_t));
    if (!b->query_start_loc || !b->seq_lens)
        return oom(b);

    /* Lengths: every request of a mode has the same shape, except the mixed
     * mode's last request, the chunked prefill. */
    int64_t T = 0, nb_total = 0;
    int32_t nb_max = 0;
    for (int32_t r = 0; r < R; r++) {
        int32_t q = o->mode == BENCH_MIXED && r < o->batch ? 1 : o->q_len;
        int32_t s = o->context + q;
        b->query_start_loc[r] = (int32_t)T;
        b->seq_lens[r] = s;
        T += q;
        int32_t nb = (s + B - 1) / B;
        nb_total += nb;
        if (nb > nb_max)
            nb_max = nb;
    }
    if (T > INT32_MAX || nb_total > INT32_MAX)
        return oom(b);
    b->query_start_loc[R] = (int32_t)T;
    b->num_tokens = (int32_t)T;
    b->num_blocks = nb_total > 0 ? (int32_t)nb_total : 1;
    b->block_table_stride = nb_max > 0 ? nb_max : 1;

    /* Block tables: a random permutation of all block ids handed out in order,
     * so consecutive blocks of a request are scattered like a pool's. */
    uint64_t rng = o->seed;
    int32_t *perm = malloc((size_t)b->num_blocks * sizeof *perm);
    b->block_table = calloc((size_t)R * (size_t)b->block_table_stride + 1, sizeof(int32_t));
    if (!perm || !b->block_table) {
        free(perm);
        return oom(b);
    }
    for (int32_t i = 0; i < b->num_blocks; i++)
        perm[i] = i;
    for (int32_t i = b->num_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(splitmix64(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 0;
    for (int32_t r = 0; r < R; r++) {
        int32_t nb = (b->seq_lens[r] + B - 1) / B;
        for (int32_t k = 0; k < nb; k++)
            b->block_table[(size_t)r * b->block_table_stride + k] = perm[next++];
    }
    free(perm);

    /* Tensors of the step. */
    const size_t H = (size_t)o->heads, Hkv = (size_t)o->kv_heads;
    const size_t D = (size_t)o->head_dim, Dv = (size_t)o->head_dim_v;
    const size_t Tz = (size_t)T + 1; /* +1: never malloc(0) */
    b->q = malloc(Tz * H * D * es);
    b->out = malloc(Tz * H * Dv * es);
    b->lse = malloc(Tz * H * sizeof(float));
    b->k_new = malloc(Tz * Hkv * D * es);
    b->v_new = malloc(Tz * Hkv * Dv * es);
    b->slot_new = malloc(Tz * sizeof(int64_t));
    if (!b->q || !b->out || !b->lse || !b->k_new || !b->v_new || !b->slot_new)
        return oom(b);
    if (o->alibi || o->sinks) {
        b->slopes = malloc(H * sizeof(float));
        b->sinks = malloc(H * sizeof(float));
        if (!b->slopes || !b->sinks)
            return oom(b);
        /* Slopes of the ALiBi paper's geometric series; sinks uniform with
         * unit variance (logits comparable to the scores). */
        for (size_t h = 0; h < H; h++)
            b->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)H);
        bench_fill(b->sinks, KVA_DTYPE_F32, H, &rng);
        if (!o->alibi) {
            free(b->slopes);
            b->slopes = NULL;
        }
        if (!o->sinks) {
            free(b->sinks);
            b->sinks = NULL;
        }
    }
    if (o->tree != BENCH_TREE_NONE) {
        /* Each request's q_len tokens form one tree, parents before children. */
        b->tree_parents = malloc(Tz * sizeof(int32_t));
        if (!b->tree_parents)
            return oom(b);
        for (int32_t r = 0; r < R; r++) {
            const int32_t q0 = b->query_start_loc[r], q = b->query_start_loc[r + 1] - q0;
            for (int32_t i = 0; i < q; i++)
                b->tree_parents[q0 + i] = o->tree == BENCH_TREE_CHAIN  ? i - 1
                                          : o->tree == BENCH_TREE_STAR ? (i == 0 ? -1 : 0)
                                          : i == 0                     ? -1
                                                   : (int32_t)(splitmix64(&rng) % (uint64_t)i);
        }
    }
    bench_fill(b->q, o->dtype, (size_t)T * H * D, &rng);
    bench_fill(b->k_new, o->dtype, (size_t)T * Hkv * D, &rng);
    bench_fill(b->v_new, o->dtype, (size_t)T * Hkv * Dv, &rng);
    for (int32_t r = 0; r < R; r++) {
        int32_t q0 = b->query_start_loc[r], q = b->query_start_loc[r + 1] - q0;
        int32_t s = b->seq_lens[r];
        const int32_t *row = b->block_table + (size_t)r * b->block_table_stride;
        for (int32_t i = 0; i < q; i++) {
            int32_t j = s - q + i; /* position of the new token */
            b->slot_new[q0 + i] = (int64_t)row[j / B] * B + j % B;
        }
    }
    return KVA_STATUS_OK;
}

void bench_plan_desc(const bench_opts *o, const bench_batch *b, kva_plan_desc *d)
{
    memset(d, 0, sizeof *d);
    d->num_requests = b->num_requests;
    d->query_start_loc = b->query_start_loc;
    d->seq_lens = b->seq_lens;
    d->block_table = o->ragged ? NULL : b->block_table;
    d->block_table_stride = b->block_table_stride;
    d->block_size = o->block_size;
    /* Spec decode: q_len tokens per request still count as decodes. */
    d->decode_threshold = o->mode == BENCH_DECODE ? o->q_len : 1;
    d->num_heads = o->heads;
    d->num_kv_heads = o->kv_heads;
    d->head_dim = o->head_dim;
    d->head_dim_v = o->head_dim_v;
    d->q_dtype = o->dtype;
    d->scale = 0.0f;
    d->causal = o->causal;
    d->window_left = o->window;
    d->attention_chunk = o->chunk;
    d->tree_parents = b->tree_parents;
    d->softcap = o->softcap;
    d->alibi_slopes = b->slopes;
}

kva_status bench_cache_create(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                              kva_cache **out)
{
    kva_cache_desc desc = {.num_blocks = b->num_blocks,
                           .block_size = o->block_size,
                           .num_kv_heads = o->kv_heads,
                           .head_dim = o->head_dim,
                           .head_dim_v = o->head_dim_v,
                           .dtype = o->dtype,
                           .layout = o->layout,
                           .quant = o->kv_quant};
    /* Quantized formats: scalar scales fitted to the data (cli_quant.h). */
    kva_cli_quant q;
    const kva_quant_params *pp = kva_cli_quant_setup(o->kv_quant, o->dtype, &q, &desc.dtype);
    return kva_cache_create_quant(ctx, &desc, pp, out);
}

kva_status bench_cache_write_new(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                                 kva_cache *cache)
{
    return kva_cache_write(ctx, cache, b->num_tokens, b->k_new, 0, b->v_new, 0, o->dtype,
                           b->slot_new);
}

kva_status bench_cache_fill(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                            kva_cache *cache)
{
    /* Context tokens go through kva_cache_write in chunks, as the engine's
     * earlier steps would have written them. */
    enum { CHUNK = 4096 };
    const size_t es = kva_dtype_size(o->dtype);
    const size_t kw = (size_t)o->kv_heads * (size_t)o->head_dim;
    const size_t vw = (size_t)o->kv_heads * (size_t)o->head_dim_v;
    const int32_t B = o->block_size;
    void *k = malloc(CHUNK * kw * es), *v = malloc(CHUNK * vw * es);
    int64_t *slots = malloc(CHUNK * sizeof *slots);
    kva_status st = KVA_STATUS_OK;
    if (!k || !v || !slots) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto done;
    }
    uint64_t rng = o->seed ^ 0x5eedcafeull;
    for (int32_t r = 0; r < b->num_requests && st == KVA_STATUS_OK; r++) {
        int32_t q = b->query_start_loc[r + 1] - b->query_start_loc[r];
        int32_t ctx_len = b->seq_lens[r] - q;
        const int32_t *row = b->block_table + (size_t)r * b->block_table_stride;
        for (int32_t j0 = 0; j0 < ctx_len && st == KVA_STATUS_OK; j0 += CHUNK) {
            int32_t n = ctx_len - j0 < CHUNK ? ctx_len - j0 : CHUNK;
            bench_fill(k, o->dtype, (size_t)n * kw, &rng);
            bench_fill(v, o->dtype, (size_t)n * vw, &rng);
            for (int32_t i = 0; i < n; i++) {
                int32_t j = j0 + i;
                slots[i] = (int64_t)row[j / B] * B + j % B;
            }
            st = kva_cache_write(ctx, cache, n, k, 0, v, 0, o->dtype, slots);
        }
    }
    if (st == KVA_STATUS_OK)
        st = bench_cache_write_new(ctx, o, b, cache);
done:
    free(k);
    free(v);
    free(slots);
    return st;
}

kva_status bench_ragged_fill(const bench_opts *o, bench_batch *b)
{
    int64_t rows = 0;
    for (int32_t r = 0; r < b->num_requests; r++)
        rows += b->seq_lens[r];
    const size_t es = kva_dtype_size(o->dtype);
    const size_t kn = (size_t)rows * (size_t)o->kv_heads * (size_t)o->head_dim;
    const size_t vn = (size_t)rows * (size_t)o->kv_heads * (size_t)o->head_dim_v;
    b->k_ragged = malloc(kn * es + 1);
    b->v_ragged = malloc(vn * es + 1);
    if (!b->k_ragged || !b->v_ragged)
        return KVA_STATUS_OUT_OF_MEMORY;
    uint64_t rng = o->seed ^ 0x7a66edull;
    bench_fill(b->k_ragged, o->dtype, kn, &rng);
    bench_fill(b->v_ragged, o->dtype, vn, &rng);
    return KVA_STATUS_OK;
}

/* ---- work counts ---- */

/* The first key position pos sees under the window and the local chunk. */
static int64_t first_key(const bench_opts *o, int64_t pos)
{
    int64_t lo = o->window >= 0 && pos - o->window > 0 ? pos - o->window : 0;
    if (o->chunk > 0 && pos > 0 && pos - pos % o->chunk > lo)
        lo = pos - pos % o->chunk;
    return lo;
}

/* Visible keys of query position pos in a request of seq_len s (the rule of
 * kva_attention_run: j < s, causal j <= pos, window pos - j <= window_left,
 * chunk j / C == pos / C). */
static int64_t visible_keys(const bench_opts *o, int64_t s, int64_t pos)
{
    int64_t hi = o->causal && pos < s - 1 ? pos : s - 1;
    int64_t lo = first_key(o, pos);
    return hi >= lo ? hi - lo + 1 : 0;
}

double bench_request_pairs(const bench_opts *o, int32_t q, int32_t s)
{
    double n = 0;
    for (int32_t i = 0; i < q; i++)
        n += (double)visible_keys(o, s, (int64_t)s - q + i);
    return n * o->heads;
}

bench_counts bench_count(const bench_opts *o, const bench_batch *b)
{
    bench_counts c = {0, 0, 0};
    /* Bytes of one key's K and V rows of one kv head, as stored (quantized
     * formats: 1-byte elements, 16-bit V for int8_token_k_v16, plus the
     * 4-byte per-token key scale of the int8_token_k formats). */
    const double es = (double)kva_dtype_size(o->dtype);
    double row_bytes = (o->head_dim + o->head_dim_v) * es;
    if (o->kv_quant == KVA_QUANT_INT8_CHANNEL || o->kv_quant == KVA_QUANT_FP8_E4M3)
        row_bytes = o->head_dim + o->head_dim_v;
    else if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K)
        row_bytes = o->head_dim + o->head_dim_v + 4.0;
    else if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16)
        row_bytes = o->head_dim + 2.0 * o->head_dim_v + 4.0;
    for (int32_t r = 0; r < b->num_requests; r++) {
        int32_t q = b->query_start_loc[r + 1] - b->query_start_loc[r];
        int32_t s = b->seq_lens[r];
        if (b->tree_parents) {
            /* A tree token sees the committed keys, its ancestors and itself. */
            const int32_t *par = b->tree_parents + b->query_start_loc[r];
            for (int32_t i = 0; i < q; i++) {
                int64_t n = (int64_t)s - q;
                for (int32_t t = i; t >= 0; t = par[t])
                    n++;
                c.pairs += (double)n * o->heads;
            }
        } else {
            c.pairs += bench_request_pairs(o, q, s);
        }
        /* Keys some query of the request sees: the union of the rows' ranges
         * ends at s - 1 (the last query's position) and starts at the first
         * query's window or chunk start. A key read by several queries (or
         * query heads of a group) counts once per kv head. */
        int64_t first = (int64_t)s - q;
        int64_t lo = first_key(o, first);
        if (q > 0 && s > lo)
            c.kv_bytes += (double)(s - lo) * o->kv_heads * row_bytes;
    }
    c.flops = c.pairs * (2.0 * o->head_dim + 2.0 * o->head_dim_v);
    return c;
}
