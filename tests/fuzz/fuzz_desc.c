/*
 * fuzz_desc.c - libFuzzer harness for the cache and plan descriptors (every
 * field, int32 edges) on the reference and CPU backends:
 *   1. a cache descriptor through kva_cache_create_from (validation only, no
 *      allocation, any size) and, when its storage is small, through
 *      kva_cache_create_quant with fuzzed scale arrays;
 *   2. a write of up to 16 tokens with fuzzed slots, strides and src dtype;
 *   3. a plan descriptor (up to 8 requests: query_start_loc, seq_lens,
 *      block table, every scalar field, ALiBi slopes, the attention kind,
 *      MLA head sizes and DCP fields; the cache kind too) through
 *      kva_plan_create, and, when the plan is small and fits the cache,
 *      kva_attention_run into NaN-poisoned outputs.
 * The library must return a status (never crash, never touch memory it was
 * not given; ASan/UBSan watch), and a failing call must leave a message
 * naming a cause. Arrays the harness passes are sized from the descriptor
 * the way the header says, capped where the descriptor asks for more memory
 * than a fuzz run may take (such cases stop before the call that reads it).
 */
#include "fuzz_util.h"
#include "kvattn.h"

#include <math.h>
#include <stdlib.h>

/* A failing call leaves a message; trap (a finding) otherwise. */
static kva_status chk(kva_status s)
{
    if (s != KVA_STATUS_OK && kva_last_error()[0] == '\0')
        __builtin_trap();
    if (s == KVA_STATUS_OK && kva_last_error()[0] != '\0')
        __builtin_trap();
    return s;
}

static kva_context *g_ctx[2];

static const kva_dtype kFloatDt[4] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16, KVA_DTYPE_I8};

static kva_cache_desc read_cache_desc(fz *f)
{
    kva_cache_desc d;
    memset(&d, 0, sizeof d); /* fields added later (kind) must not be stack garbage */
    d.num_blocks = fz_i32(f);
    d.block_size = fz_i32(f);
    d.num_kv_heads = fz_i32(f);
    d.head_dim = fz_i32(f);
    d.head_dim_v = fz_i32(f);
    d.dtype = (kva_dtype)fz_i32(f);
    d.layout = (kva_layout)fz_i32(f);
    d.quant = (kva_quant)fz_i32(f);
    const uint8_t k = fz_u8(f); /* mostly MHA, often MLA, sometimes any value */
    d.kind = k < 0xc0 ? KVA_ATTN_MHA : k < 0xf8 ? KVA_ATTN_MLA : (kva_attn_kind)fz_i32(f);
    return d;
}

/* Elements of K (or V) storage, or -1 if it exceeds cap. */
static int64_t store_elems(const kva_cache_desc *d, int32_t dim, int64_t cap)
{
    if (d->num_blocks < 1 || d->block_size < 1 || d->num_kv_heads < 1 || dim < 1)
        return -1;
    int64_t n = (int64_t)d->num_blocks * d->block_size;
    if (n > cap || (n *= d->num_kv_heads) > cap || (n *= dim) > cap)
        return -1;
    return n;
}

/* Scale arrays of fuzzed lengths (0, 1, Hkv, Hkv * D or raw) and values. */
static void read_params(fz *f, const kva_cache_desc *d, float *buf, int64_t cap,
                        kva_quant_params *p)
{
    const int32_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const int64_t lens[5] = {0, 1, d->num_kv_heads, (int64_t)d->num_kv_heads * d->head_dim,
                             (int64_t)d->num_kv_heads * dv};
    const float **ptrs[4] = {&p->k_scale, &p->k_offset, &p->v_scale, &p->v_offset};
    int64_t *lp[4] = {&p->k_scale_len, &p->k_offset_len, &p->v_scale_len, &p->v_offset_len};
    for (int i = 0; i < 4; i++) {
        const uint8_t s = fz_u8(f);
        int64_t len = s < 0xf0 ? lens[s % 5] : fz_i32(f);
        *ptrs[i] = (s & 0x8) ? NULL : buf + (size_t)i * (cap / 4);
        *lp[i] = len;
        if (len > cap / 4)
            *lp[i] = cap / 4; /* the array the harness has */
    }
    const float fill = fz_f32(f);
    for (int64_t i = 0; i < cap; i++)
        buf[i] = (i % 7 == 3) ? fill : 0.01f + (float)(i % 13) * 0.003f;
}

static void fuzz_write(fz *f, kva_context *ctx, kva_cache *c, const kva_cache_desc *d)
{
    const int32_t T = fz_range(f, 0, 16);
    const kva_dtype sdt = kFloatDt[fz_u8(f) % 4];
    int64_t ks = fz_u8(f) < 0x40 ? fz_i32(f) : 0, vs = fz_u8(f) < 0x40 ? fz_i32(f) : 0;
    const int32_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    /* Source rows: K and V of all kv heads; an MLA cache takes c_kv (Dc = Dv)
     * as k and k_pe (Dr = D - Dc, which may exceed Dc) as v. */
    const int mla = d->kind == KVA_ATTN_MLA;
    const int64_t rk = mla ? dv : (int64_t)d->num_kv_heads * d->head_dim;
    const int64_t rv = mla ? d->head_dim - dv : (int64_t)d->num_kv_heads * dv;
    const int64_t sk = ks > 0 ? ks : rk, sv = vs > 0 ? vs : rv;
    if (sk > (1 << 16) || sv > (1 << 16))
        return;
    const size_t es = 4;
    float *k = malloc((size_t)(T * sk + rk + 1) * es), *v = malloc((size_t)(T * sv + rv + 1) * es);
    int64_t slots[16];
    for (int32_t t = 0; t < T; t++)
        slots[t] = fz_u8(f) < 0x80 ? fz_i32(f) : fz_range(f, -1, 40);
    const float x = fz_f32(f);
    for (int64_t i = 0; i < T * sk + rk + 1; i++)
        k[i] = (i % 5 == 1) ? x : (float)(i % 11) * 0.1f - 0.5f;
    for (int64_t i = 0; i < T * sv + rv + 1; i++)
        v[i] = (float)(i % 9) * 0.1f - 0.4f;
    chk(kva_cache_write(ctx, c, T, k, ks, v, vs, sdt, slots));
    free(k);
    free(v);
}

/* Plan over up to 8 requests; runs it when small. */
static void fuzz_plan(fz *f, kva_context *ctx, kva_cache *c, const kva_cache_desc *cd)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    const int32_t R = fz_range(f, 0, 8);
    d.num_requests = R;
    if (fz_u8(f) < 0x10) { /* a negative count or fewer requests than the arrays hold */
        const int32_t n = fz_i32(f);
        d.num_requests = n > R ? R : n;
    }
    int32_t qsl[9], sl[8];
    qsl[0] = fz_u8(f) < 0x10 ? fz_i32(f) : 0;
    for (int32_t r = 0; r < R; r++) {
        const uint8_t s = fz_u8(f);
        const int64_t next = s < 0x20 ? fz_i32(f) : (int64_t)qsl[r] + fz_range(f, 0, 6);
        qsl[r + 1] = next > INT32_MAX ? INT32_MAX : (int32_t)next;
        sl[r] = fz_u8(f) < 0x20 ? fz_i32(f) : fz_range(f, 0, 40);
    }
    d.query_start_loc = fz_u8(f) < 0x08 ? NULL : qsl;
    d.seq_lens = fz_u8(f) < 0x08 ? NULL : sl;
    d.block_table_stride = fz_u8(f) < 0x40 ? fz_i32(f) : fz_range(f, 0, 12);
    int32_t *bt = NULL;
    const int use_bt = fz_u8(f) >= 0x20;
    if (use_bt && d.block_table_stride > 0 && (int64_t)d.block_table_stride * R <= (1 << 16)) {
        bt = malloc(sizeof(int32_t) * ((size_t)d.block_table_stride * R + 1));
        for (int64_t i = 0; i < (int64_t)d.block_table_stride * R; i++)
            bt[i] = fz_u8(f) < 0x10 ? fz_i32(f) : (int32_t)(i % 5);
    } else if (use_bt && (d.block_table_stride <= 0 || R == 0)) {
        bt = malloc(sizeof(int32_t));
    } else if (use_bt) {
        return; /* more table than the harness can give */
    }
    d.block_table = bt;
    d.block_size = fz_u8(f) < 0x40 ? fz_i32(f) : cd->block_size;
    d.decode_threshold = fz_i32(f);
    if (fz_u8(f) < 0x40) {
        d.num_heads = fz_i32(f);
    } else {
        const int64_t h = (int64_t)cd->num_kv_heads * fz_range(f, 1, 4);
        d.num_heads = h > INT32_MAX ? INT32_MAX : h < INT32_MIN ? INT32_MIN : (int32_t)h;
    }
    d.num_kv_heads = fz_u8(f) < 0x40 ? fz_i32(f) : cd->num_kv_heads;
    d.head_dim = fz_u8(f) < 0x40 ? fz_i32(f) : cd->head_dim;
    d.head_dim_v = fz_u8(f) < 0x40 ? fz_i32(f) : cd->head_dim_v;
    d.q_dtype = fz_u8(f) < 0x20 ? (kva_dtype)fz_i32(f) : kFloatDt[fz_u8(f) % 3];
    d.scale = fz_f32(f);
    d.causal = fz_i32(f);
    d.window_left = fz_i32(f);
    d.softcap = fz_u8(f) < 0x40 ? fz_f32(f) : 0.0f;
    float *slopes = NULL;
    if (fz_u8(f) < 0x40 && d.num_heads > 0 && d.num_heads <= KVA_MAX_HEADS) {
        slopes = malloc(sizeof(float) * (size_t)d.num_heads);
        const float s = fz_f32(f);
        for (int32_t h = 0; h < d.num_heads; h++)
            slopes[h] = h == 0 ? s : 0.25f / (float)(h + 1);
    }
    d.alibi_slopes = slopes;
    d.kind = fz_u8(f) < 0xf0 ? cd->kind : (kva_attn_kind)fz_i32(f);
    if (d.kind == KVA_ATTN_MLA && fz_u8(f) < 0x80) { /* the layer-level head sizes */
        d.mla_qk_nope_head_dim = fz_u8(f) < 0x20 ? fz_i32(f) : 8 * fz_range(f, 0, 24);
        d.mla_v_head_dim = fz_u8(f) < 0x20 ? fz_i32(f) : 8 * fz_range(f, 0, 24);
    }
    if (fz_u8(f) < 0x30) { /* a sharded (DCP) plan */
        d.dcp_size = fz_u8(f) < 0x20 ? fz_i32(f) : fz_range(f, 0, 8);
        d.dcp_rank = fz_u8(f) < 0x20 ? fz_i32(f) : fz_range(f, 0, 8);
        d.dcp_interleave = fz_u8(f) < 0x20 ? fz_i32(f) : fz_range(f, 0, 16);
    }
    /* A valid plan costs time and memory linear in its query tokens, up to
     * KVA_MAX_SEQ_LEN (2^30): ~1.3 GB and over a minute in this -O0 build
     * (tests/fuzz/findings/README.md). Steps of more than 2^20 query tokens
     * within that limit are skipped as a fuzz run cannot afford them; values
     * past the limit still go in (they are rejected before any work). */
    for (int32_t r = 0; r <= R; r++)
        if (qsl[r] > (1 << 20) && qsl[r] <= KVA_MAX_SEQ_LEN) {
            free(bt);
            free(slopes);
            return;
        }
    kva_plan *p = NULL;
    if (chk(kva_plan_create(ctx, &d, &p)) == KVA_STATUS_OK) {
        kva_plan_info info;
        if (chk(kva_plan_get_info(p, &info)) != KVA_STATUS_OK)
            __builtin_trap();
        const int32_t dv = d.head_dim_v ? d.head_dim_v : d.head_dim;
        const int64_t T = info.num_tokens;
        int64_t work = 0;
        for (int32_t r = 0; r < R; r++)
            work += ((int64_t)qsl[r + 1] - qsl[r]) * sl[r];
        if (c && T * d.num_heads * (d.head_dim > dv ? d.head_dim : dv) <= (1 << 18) &&
            work * d.num_heads * d.head_dim <= (1 << 18)) {
            const size_t es = kva_dtype_size(d.q_dtype);
            void *q = malloc((size_t)T * d.num_heads * d.head_dim * es + 1);
            void *out = malloc((size_t)T * d.num_heads * dv * es + 1);
            float *lse = malloc(sizeof(float) * (size_t)T * d.num_heads + 1);
            memset(q, 0x3c, (size_t)T * d.num_heads * d.head_dim * es);
            float sinks[KVA_MAX_HEADS];
            for (int32_t h = 0; h < d.num_heads; h++)
                sinks[h] = 0.5f;
            const int use_sinks = fz_u8(f) & 1;
            chk(kva_attention_run(ctx, p, q, c, use_sinks ? sinks : NULL, out, lse));
            free(q);
            free(out);
            free(lse);
        }
        kva_plan_destroy(p);
    } else if (p != NULL) {
        __builtin_trap(); /* a failure must not hand out a plan */
    }
    free(bt);
    free(slopes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ctx[0]) {
        kva_context_desc r = {KVA_BACKEND_REF, 0, 0}, cpu = {KVA_BACKEND_CPU, 1, 0};
        if (kva_context_create(&r, &g_ctx[0]) != KVA_STATUS_OK ||
            kva_context_create(&cpu, &g_ctx[1]) != KVA_STATUS_OK)
            __builtin_trap();
    }
    fz f = {data, size};
    kva_context *ctx = g_ctx[fz_u8(&f) & 1];
    kva_cache_desc cd = read_cache_desc(&f);
    /* 1. Validation of any size (caller-owned storage, never read here). */
    static float dummy[64];
    kva_cache *c = NULL;
    if (chk(kva_cache_create_from(ctx, &cd, dummy, dummy, &c)) == KVA_STATUS_OK) {
        kva_cache_desc got;
        if (kva_cache_get_desc(c, &got) != KVA_STATUS_OK || got.head_dim_v == 0)
            __builtin_trap();
        kva_cache_destroy(c);
        c = NULL;
    } else if (c) {
        __builtin_trap();
    }
    /* 2. Real storage when small. */
    const int32_t dv = cd.head_dim_v ? cd.head_dim_v : cd.head_dim;
    const int64_t cap = 1 << 20;
    if (store_elems(&cd, cd.head_dim, cap) >= 0 && store_elems(&cd, dv, cap) >= 0) {
        enum { PCAP = 4 * 4096 };
        static float pbuf[PCAP];
        kva_quant_params qp;
        read_params(&f, &cd, pbuf, PCAP, &qp);
        const int with_params = fz_u8(&f) & 1;
        if (chk(kva_cache_create_quant(ctx, &cd, with_params ? &qp : NULL, &c)) == KVA_STATUS_OK) {
            void *k, *v;
            kva_cache_data(c, &k, &v);
            /* An MLA cache has no V storage (v NULL, 0 bytes): memset(NULL, 0, 0)
             * is still undefined. */
            if (k)
                memset(k, 0, (size_t)cd.num_blocks * kva_cache_block_bytes_k(c));
            if (v)
                memset(v, 0, (size_t)cd.num_blocks * kva_cache_block_bytes_v(c));
            float *ts = NULL;
            kva_cache_token_scales(c, &ts);
            if (ts)
                memset(ts, 0, (size_t)cd.num_blocks * kva_cache_block_bytes_scales(c));
            fuzz_write(&f, ctx, c, &cd);
        } else if (c) {
            __builtin_trap();
        }
    }
    /* 3. A plan against that cache (or none). */
    fuzz_plan(&f, ctx, c, &cd);
    kva_cache_destroy(c);
    return 0;
}
