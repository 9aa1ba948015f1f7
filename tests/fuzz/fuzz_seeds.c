/*
 * fuzz_seeds.c - writes the seed corpora of the fuzz harnesses:
 *   fuzz_seeds C8_DIR DESC_DIR
 * C8_DIR gets checkpoints like those of tests/test_quant_loader.c (the
 * three naming schemes, F32/F16/BF16 and scalar tensors, with and without
 * model.safetensors.index.json, tensor-parallel ranks) in the input format
 * of fuzz_c8_loader.c; DESC_DIR gets cache + write + plan inputs in the
 * format of fuzz_desc.c for the shapes and formats the tests use (every
 * quantized format, NHD/HND, decodes and prefills, ALiBi, windows).
 */
#include "kvattn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
    unsigned char b[1 << 16];
    size_t n;
} buf;

static void put(buf *o, const void *p, size_t n)
{
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void u8(buf *o, int x)
{
    o->b[o->n++] = (unsigned char)x;
}
static void u32(buf *o, uint32_t x)
{
    for (int i = 0; i < 4; i++)
        u8(o, (int)(x >> (8 * i)) & 0xff);
}
/* fz_i32's raw form: a selector >= 0xc0, then the 4 bytes. */
static void i32(buf *o, int32_t x)
{
    u8(o, 0xc0);
    u32(o, (uint32_t)x);
}
/* fz_f32's raw form. */
static void f32(buf *o, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u8(o, 0xa0);
    u32(o, u);
}

static void save(const char *dir, const char *name, const buf *o)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(1);
    }
    fwrite(o->b, 1, o->n, f);
    fclose(f);
}

/* ---- C8 checkpoints ---- */

/* A safetensors file with tensors name[i] of dtype dt, shape [n] (or [] when n == 0). */
static void safetensors(buf *o, int nt, const char *const *names, const char *dt, int n)
{
    char header[4096];
    size_t hl = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    const int esz = strcmp(dt, "F32") == 0 ? 4 : 2, numel = n ? n : 1;
    for (int i = 0; i < nt; i++) {
        char shape[32] = "";
        if (n)
            snprintf(shape, sizeof shape, "%d", n);
        hl += (size_t)snprintf(header + hl, sizeof header - hl,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%d,%d]}",
                               names[i], dt, shape, i * numel * esz, (i + 1) * numel * esz);
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    const uint64_t len = hl;
    for (int b = 0; b < 8; b++)
        u8(o, (int)(len >> (8 * b)) & 0xff);
    put(o, header, hl);
    for (int i = 0; i < nt * numel; i++) {
        const float v = 0.01f + 0.001f * (float)(i % 32);
        if (esz == 4) {
            u32(o, *(const uint32_t *)&v);
        } else {
            const uint16_t h = strcmp(dt, "F16") == 0 ? kva_f32_to_f16(v) : kva_f32_to_bf16(v);
            u8(o, h & 0xff);
            u8(o, h >> 8);
        }
    }
}

static void sep(buf *o)
{
    put(o, "\x00KVA\x00", 5);
}

static void c8_seeds(const char *dir)
{
    static const char *const schemes[3] = {"model.layers.%d.self_attn.%s_cache_%s",
                                           "model.layers.%d.self_attn.attn.%s_cache_%s",
                                           "model.layers.%d.self_attn.%s_proj.kv_cache_%s"};
    static const char *const dts[3] = {"F32", "F16", "BF16"};
    int k = 0;
    for (int s = 0; s < 3; s++)
        for (int di = 0; di < 3; di++)
            for (int variant = 0; variant < 3; variant++) {
                /* variant 0: one shard, no index; 1: index + two shards; 2: scalars. */
                const int layer = (s + di) % 3, hkv = 4, d = 8;
                char names[4][128];
                const char *np[4];
                const char *kv[2] = {"k", "v"}, *what[2] = {"scale", "offset"};
                for (int i = 0; i < 4; i++) {
                    snprintf(names[i], sizeof names[i], schemes[s], layer, kv[i / 2], what[i % 2]);
                    np[i] = names[i];
                }
                buf *o = calloc(1, sizeof *o);
                u8(o, layer);
                u8(o, hkv - 1);
                u8(o, d / 8 - 1);
                u8(o, variant == 1 ? 1 : 0); /* tp_size 2 for the index variant */
                u8(o, variant == 1 ? 1 : 0);
                const char *desc = "{\"model_quant_type\":\"W8A8\",\"kv_cache_type\":\"C8\"}";
                put(o, desc, strlen(desc));
                sep(o);
                const int n = variant == 2 ? 0 : hkv * d;
                if (variant == 1) {
                    char idx[2048];
                    size_t il = (size_t)snprintf(idx, sizeof idx, "{\"weight_map\":{");
                    for (int i = 0; i < 4; i++)
                        il += (size_t)snprintf(idx + il, sizeof idx - il, "%s\"%s\":\"%s\"",
                                               i ? "," : "", names[i],
                                               i < 2 ? "model-00001-of-00002.safetensors"
                                                     : "model-00002-of-00002.safetensors");
                    il += (size_t)snprintf(idx + il, sizeof idx - il, "}}");
                    put(o, idx, il);
                    sep(o);
                    safetensors(o, 2, np, dts[di], n);
                    sep(o);
                    safetensors(o, 2, np + 2, dts[di], n);
                } else {
                    sep(o); /* no index */
                    safetensors(o, 4, np, dts[di], n);
                }
                char name[32];
                snprintf(name, sizeof name, "c8_%02d", k++);
                save(dir, name, o);
                free(o);
            }
}

/* ---- descriptors ---- */

typedef struct dseed {
    int32_t nb, b, hkv, d, dv;
    kva_dtype dt;
    kva_layout layout;
    kva_quant quant;
    kva_dtype qdt;
    int32_t h, r, window, causal, alibi;
} dseed;

static void desc_seed(const char *dir, const char *name, const dseed *s)
{
    buf *o = calloc(1, sizeof *o);
    u8(o, 1); /* CPU context */
    i32(o, s->nb), i32(o, s->b), i32(o, s->hkv), i32(o, s->d), i32(o, s->dv);
    i32(o, (int32_t)s->dt), i32(o, (int32_t)s->layout), i32(o, (int32_t)s->quant);
    /* Scale arrays: k_scale Hkv*D (selector 3), k_offset Hkv*D, v_scale, v_offset
     * Hkv*Dv (4); fp8: per head (2); the fill value 0.02. */
    const int fp8 = s->quant == KVA_QUANT_FP8_E4M3, tok = s->quant == KVA_QUANT_INT8_TOKEN_K;
    const int none = 0x0a; /* length 0, NULL */
    u8(o, fp8 ? 2 : tok ? none : 3), u8(o, fp8 || tok ? none : 3);
    u8(o, fp8 ? 2 : 4), u8(o, fp8 ? none : 4);
    f32(o, 0.02f);
    u8(o, s->quant != KVA_QUANT_NONE && s->quant != KVA_QUANT_INT8_TOKEN_K_V16); /* params */
    /* Write 6 tokens from f32 to slots 0, 5, -1, 9, 3, 12. */
    u8(o, 6), u8(o, 0), u8(o, 0x80), u8(o, 0x80);
    const int slots[6] = {1, 6, 0, 10, 4, 13}; /* fz_range(-1, 40) bytes: value + 1 */
    for (int t = 0; t < 6; t++)
        u8(o, 0x80), u8(o, slots[t]);
    f32(o, 0.5f);
    /* Plan: r requests, q_lens 1, 3, 1, 5..., seq_lens 9, 12, 4, 20. */
    u8(o, s->r), u8(o, 0x10), u8(o, 0x10);
    const int ql[4] = {1, 3, 1, 5}, sl[4] = {9, 12, 4, 20};
    for (int i = 0; i < s->r; i++)
        u8(o, 0x20), u8(o, ql[i % 4]), u8(o, 0x20), u8(o, sl[i % 4]);
    u8(o, 0x08), u8(o, 0x08);          /* query_start_loc, seq_lens given */
    u8(o, 0x40), u8(o, 6);             /* stride 6 */
    u8(o, 0x20);                       /* a block table */
    for (int i = 0; i < 6 * s->r; i++) /* entries i % 5 */
        u8(o, 0x10);
    u8(o, 0x40); /* block_size = the cache's */
    i32(o, 1);   /* decode_threshold */
    u8(o, 0x40), u8(o, s->h / s->hkv - 1);
    u8(o, 0x40), u8(o, 0x40), u8(o, 0x40); /* Hkv, D, Dv = the cache's */
    u8(o, 0x20), u8(o, s->qdt);
    f32(o, 0.0f); /* scale: 1/sqrt(D) */
    i32(o, s->causal);
    i32(o, s->window);
    u8(o, 0x40); /* no soft-cap */
    u8(o, s->alibi ? 0 : 0x40);
    if (s->alibi)
        f32(o, 0.5f);
    u8(o, 1); /* sinks */
    save(dir, name, o);
    free(o);
}

static void desc_seeds(const char *dir)
{
    const dseed seeds[] = {
        {16, 4, 2, 16, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_DTYPE_F16, 4, 3, -1, 1,
         0},
        {16, 4, 2, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_HND, KVA_QUANT_NONE, KVA_DTYPE_F32, 8, 4, 3, 1,
         1},
        {16, 4, 2, 16, 8, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_DTYPE_BF16, 2, 2, -1,
         0, 0},
        {16, 4, 2, 16, 0, KVA_DTYPE_I8, KVA_LAYOUT_NHD, KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_F32, 4, 3,
         -1, 1, 0},
        {16, 5, 1, 24, 0, KVA_DTYPE_I8, KVA_LAYOUT_HND, KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_BF16, 4,
         4, -1, 1, 1},
        {16, 4, 2, 16, 0, KVA_DTYPE_F16, KVA_LAYOUT_HND, KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_F16,
         2, 3, 5, 1, 0},
        {16, 4, 2, 16, 0, KVA_DTYPE_FP8_E4M3, KVA_LAYOUT_NHD, KVA_QUANT_FP8_E4M3, KVA_DTYPE_F16, 6,
         2, -1, 1, 0},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "desc_%02zu", i);
        desc_seed(dir, name, &seeds[i]);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: fuzz_seeds C8_DIR DESC_DIR\n");
        return 2;
    }
    c8_seeds(argv[1]);
    desc_seeds(argv[2]);
    return 0;
}
