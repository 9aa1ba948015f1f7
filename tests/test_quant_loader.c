/*
 * test_quant_loader.c - kva_c8_scales_load on checkpoints this test writes
 * into temporary directories (quant_model_description.json, safetensors
 * shards, optionally model.safetensors.index.json): per-channel and scalar
 * tensors in F32/F16/BF16, the three naming schemes, tensor-parallel
 * sharding (fewer and more ranks than kv heads), and every error: missing
 * file, description without C8, malformed JSON, header length past the file,
 * unsupported dtype, wrong shape, offsets that disagree with the shape,
 * truncated data, a missing tensor, bad arguments.
 */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor to write: values are given as float and stored in dtype. */
typedef struct tensor {
    const char *name;
    const char *dtype; /* "F32", "F16", "BF16", or anything else (written as F32 bytes) */
    int rank;
    int64_t shape[2];
    const float *vals;
    int64_t bad_bytes; /* added to the end offset (offsets that disagree with the shape) */
} tensor;

static char tmpdir[256];

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

static void write_file(const char *name, const void *data, size_t n)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void write_text(const char *name, const char *text)
{
    write_file(name, text, strlen(text));
}

/* Writes a safetensors file; header_len_delta corrupts the length field and
 * truncate drops bytes from the end. */
static void write_safetensors(const char *name, const tensor *ts, int n, int64_t header_len_delta,
                              size_t truncate, const char *raw_header)
{
    char header[4096];
    size_t hl = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    unsigned char data[65536];
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const tensor *t = &ts[i];
        int64_t numel = 1;
        for (int d = 0; d < t->rank; d++)
            numel *= t->shape[d];
        const size_t esz = !strcmp(t->dtype, "F16") || !strcmp(t->dtype, "BF16") ? 2 : 4;
        const size_t begin = at;
        for (int64_t e = 0; e < numel; e++) {
            if (esz == 4) {
                uint32_t u;
                memcpy(&u, &t->vals[e], 4);
                for (int b = 0; b < 4; b++)
                    data[at++] = (unsigned char)(u >> (8 * b));
            } else {
                uint16_t h = !strcmp(t->dtype, "F16") ? kva_f32_to_f16(t->vals[e])
                                                      : kva_f32_to_bf16(t->vals[e]);
                data[at++] = (unsigned char)h;
                data[at++] = (unsigned char)(h >> 8);
            }
        }
        char shape[64] = "";
        if (t->rank == 1)
            snprintf(shape, sizeof shape, "%lld", (long long)t->shape[0]);
        else if (t->rank == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)t->shape[0],
                     (long long)t->shape[1]);
        hl += (size_t)snprintf(
            header + hl, sizeof header - hl,
            ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%lld]}", t->name,
            t->dtype, shape, begin, (long long)(at + t->bad_bytes));
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    if (raw_header) {
        hl = strlen(raw_header);
        memcpy(header, raw_header, hl);
    }
    unsigned char *file = malloc(8 + hl + at);
    const uint64_t len = (uint64_t)((int64_t)hl + header_len_delta);
    for (int b = 0; b < 8; b++)
        file[b] = (unsigned char)(len >> (8 * b));
    memcpy(file + 8, header, hl);
    memcpy(file + 8 + hl, data, at);
    write_file(name, file, 8 + hl + at - truncate);
    free(file);
}

/* A fresh empty temp directory for each checkpoint. */
static void new_dir(void)
{
    if (tmpdir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        CHECK(system(cmd) == 0);
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kva_ckpt_XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
}

#define C8_DESC "{\"model_quant_type\":\"W8A8\",\"kv_cache_type\":\"C8\"}"

enum { HKV = 4, D = 8, N = HKV * D };
static float ks[N], ko[N], vs[N], vo[N];

static void init_vals(void)
{
    for (int i = 0; i < N; i++) {
        ks[i] = 0.01f + 0.001f * (float)i;
        ko[i] = (float)(i % 7) - 3.0f;
        vs[i] = 0.02f + 0.0005f * (float)i;
        vo[i] = 0.25f * (float)(i % 5);
    }
}

/* Loads and returns the status; on failure checks *out untouched and the message. */
static kva_status load(int32_t layer, int32_t rank, int32_t tp, kva_c8_scales **out)
{
    *out = (kva_c8_scales *)(uintptr_t)0x1234;
    kva_status st = kva_c8_scales_load(tmpdir, layer, HKV, D, rank, tp, out);
    if (st != KVA_STATUS_OK)
        CHECK(*out == (kva_c8_scales *)(uintptr_t)0x1234);
    return st;
}

static void test_single_file_sharded(void)
{
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    tensor t[] = {
        {"model.layers.3.self_attn.k_cache_scale", "F32", 1, {N, 0}, ks, 0},
        {"model.layers.3.self_attn.k_cache_offset", "F32", 1, {N, 0}, ko, 0},
        {"model.layers.3.self_attn.v_cache_scale", "F32", 2, {HKV, D}, vs, 0},
        {"model.layers.3.self_attn.v_cache_offset", "F32", 1, {N, 0}, vo, 0},
        {"model.layers.2.self_attn.k_cache_scale", "F32", 1, {N, 0}, vs, 0},
    };
    write_safetensors("model-00001-of-00001.safetensors", t, 5, 0, 0, NULL);
    for (int32_t rank = 0; rank < 2; rank++) {
        kva_c8_scales *s = NULL;
        CHECK_OK(load(3, rank, 2, &s));
        if (!s)
            continue;
        CHECK(s->num_kv_heads == 2 && s->head_dim == D);
        CHECK(s->params.k_scale_len == 2 * D && s->params.v_offset_len == 2 * D);
        for (int i = 0; i < 2 * D; i++) {
            CHECK(s->params.k_scale[i] == ks[rank * 2 * D + i]);
            CHECK(s->params.k_offset[i] == ko[rank * 2 * D + i]);
            CHECK(s->params.v_scale[i] == vs[rank * 2 * D + i]);
            CHECK(s->params.v_offset[i] == vo[rank * 2 * D + i]);
        }
        /* The params create a C8 cache for this rank. */
        kva_context *ctx = NULL;
        CHECK_OK(kva_context_create(NULL, &ctx));
        kva_cache_desc cd = {4,           16,           s->num_kv_heads, D,
                             D,           KVA_DTYPE_I8, KVA_LAYOUT_NHD,  KVA_QUANT_INT8_CHANNEL,
                             KVA_ATTN_MHA};
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &cd, &s->params, &c));
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
        kva_c8_scales_free(s);
    }
    /* Every rank of tp 1 .. 16: rank r holds heads from floor(r * Hkv / tp)
     * on (max(1, Hkv / tp) of them), so ranks beyond the kv heads replicate
     * them in contiguous groups as vLLM's QKVParallelLinear does. */
    for (int32_t tp = 1; tp <= 16; tp *= 2)
        for (int32_t r = 0; r < tp; r++) {
            kva_c8_scales *sh = NULL;
            CHECK_OK(load(3, r, tp, &sh));
            if (!sh)
                continue;
            const int32_t first = r * HKV / tp, count = tp < HKV ? HKV / tp : 1;
            CHECK_MSG(sh->num_kv_heads == count && sh->params.k_scale_len == count * D,
                      "tp %d rank %d: %d heads", (int)tp, (int)r, (int)sh->num_kv_heads);
            for (int i = 0; i < count * D && sh->num_kv_heads == count; i++)
                CHECK_MSG(sh->params.k_scale[i] == ks[first * D + i] &&
                              sh->params.v_offset[i] == vo[first * D + i],
                          "tp %d rank %d element %d", (int)tp, (int)r, i);
            kva_c8_scales_free(sh);
        }
    /* tp_size 1: everything. */
    kva_c8_scales *s = NULL;
    CHECK_OK(load(3, 0, 1, &s));
    CHECK(s && s->num_kv_heads == HKV && s->params.k_scale[N - 1] == ks[N - 1]);
    kva_c8_scales_free(s);
    kva_c8_scales_free(NULL);
}

/* Index + two shards, F16/BF16, the k_proj.kv_cache_* names, scalar tensors,
 * no offsets for V, and more ranks than kv heads. */
static void test_index_shards(void)
{
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    const float one_ko = 2.0f, one_vs = 0.0625f;
    tensor a[] = {
        {"model.layers.0.self_attn.k_proj.kv_cache_scale", "F16", 1, {N, 0}, ks, 0},
        {"model.layers.0.self_attn.k_proj.kv_cache_offset", "BF16", 0, {0, 0}, &one_ko, 0},
    };
    tensor b[] = {{"model.layers.0.self_attn.v_proj.kv_cache_scale", "F32", 1, {1, 0}, &one_vs, 0}};
    write_safetensors("model-00001-of-00002.safetensors", a, 2, 0, 0, NULL);
    write_safetensors("model-00002-of-00002.safetensors", b, 1, 0, 0, NULL);
    /* A decoy shard the index does not name: must not be read. */
    write_text("zz-unlisted.safetensors", "garbage");
    write_text("model.safetensors.index.json",
               "{\"metadata\":{},\"weight_map\":{"
               "\"model.layers.0.self_attn.k_proj.kv_cache_scale\":\"model-00001-of-00002."
               "safetensors\","
               "\"model.layers.0.self_attn.k_proj.kv_cache_offset\":\"model-00001-of-00002."
               "safetensors\","
               "\"model.layers.0.self_attn.v_proj.kv_cache_scale\":\"model-00002-of-00002."
               "safetensors\"}}");
    /* tp 8 over 4 kv heads: ranks 2 and 3 share head 1. */
    for (int32_t rank = 2; rank < 4; rank++) {
        kva_c8_scales *s = NULL;
        CHECK_OK(load(0, rank, 8, &s));
        if (!s)
            continue;
        CHECK(s->num_kv_heads == 1);
        CHECK(s->params.k_scale_len == D);
        for (int i = 0; i < D; i++)
            CHECK(s->params.k_scale[i] == kva_f16_to_f32(kva_f32_to_f16(ks[D + i])));
        CHECK(s->params.k_offset_len == 1 && s->params.k_offset[0] == 2.0f);
        CHECK(s->params.v_scale_len == 1 && s->params.v_scale[0] == 0.0625f);
        CHECK(s->params.v_offset == NULL && s->params.v_offset_len == 0);
        kva_c8_scales_free(s);
    }
    /* The .attn. form, found by scanning (no index). */
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    tensor c[] = {
        {"model.layers.1.self_attn.attn.k_cache_scale", "BF16", 1, {N, 0}, ks, 0},
        {"model.layers.1.self_attn.attn.v_cache_scale", "F32", 1, {N, 0}, vs, 0},
    };
    write_safetensors("b.safetensors", c, 1, 0, 0, NULL);
    write_safetensors("a.safetensors", c + 1, 1, 0, 0, NULL);
    kva_c8_scales *s = NULL;
    CHECK_OK(load(1, 1, 4, &s));
    CHECK(s && s->params.k_scale[3] == kva_bf16_to_f32(kva_f32_to_bf16(ks[D + 3])));
    CHECK(s && s->params.v_scale[7] == vs[D + 7] && s->params.k_offset_len == 0);
    kva_c8_scales_free(s);
}

/* One failing load: status and a word of the message. */
static void expect_fail(int32_t layer, kva_status want, const char *word)
{
    kva_c8_scales *s;
    CHECK_STATUS(load(layer, 0, 1, &s), want);
    CHECK_ERROR_MENTIONS(word);
}

static void test_errors(void)
{
    const char *k = "model.layers.0.self_attn.k_cache_scale";
    const char *v = "model.layers.0.self_attn.v_cache_scale";
    tensor good[] = {{k, "F32", 1, {N, 0}, ks, 0}, {v, "F32", 1, {N, 0}, vs, 0}};

    new_dir(); /* no description */
    write_safetensors("m.safetensors", good, 2, 0, 0, NULL);
    expect_fail(0, KVA_STATUS_IO_ERROR, "quant_model_description.json");
    write_text("quant_model_description.json", "{\"kv_cache_type\": \"C8\""); /* malformed */
    expect_fail(0, KVA_STATUS_IO_ERROR, "JSON");
    write_text("quant_model_description.json", "{\"kv_cache_type\": \"FP16\"}");
    expect_fail(0, KVA_STATUS_UNSUPPORTED, "FP16");
    write_text("quant_model_description.json", "{\"model_quant_type\": \"W8A8\"}");
    expect_fail(0, KVA_STATUS_IO_ERROR, "kv_cache_type");
    write_text("quant_model_description.json", C8_DESC);
    kva_c8_scales *s = NULL;
    CHECK_OK(load(0, 0, 1, &s));
    kva_c8_scales_free(s);
    expect_fail(5, KVA_STATUS_IO_ERROR, "model.layers.5.self_attn.k_cache_scale"); /* missing */

    /* Header length past the end of the file. */
    write_safetensors("m.safetensors", good, 2, 100000, 0, NULL);
    expect_fail(0, KVA_STATUS_IO_ERROR, "header length");
    /* Too short for the length field. */
    write_text("m.safetensors", "abc");
    expect_fail(0, KVA_STATUS_IO_ERROR, "too short");
    /* Malformed header JSON. */
    write_safetensors("m.safetensors", good, 2, 0, 0, "{\"a\": [1, 2");
    expect_fail(0, KVA_STATUS_IO_ERROR, "header");
    /* An entry without data_offsets. */
    write_safetensors("m.safetensors", good, 0, 0, 0,
                      "{\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":\"F32\"}}");
    expect_fail(0, KVA_STATUS_IO_ERROR, "data_offsets");
    /* Unsupported dtype. */
    tensor bad_dt[] = {{k, "I8", 1, {N, 0}, ks, 0}, {v, "F32", 1, {N, 0}, vs, 0}};
    write_safetensors("m.safetensors", bad_dt, 2, 0, 0, NULL);
    expect_fail(0, KVA_STATUS_DTYPE_MISMATCH, "I8");
    /* Wrong shape (consistent offsets): [N/2] and [HKV, D + 1]-like. */
    tensor bad_shape[] = {{k, "F32", 1, {N / 2, 0}, ks, 0}, {v, "F32", 1, {N, 0}, vs, 0}};
    write_safetensors("m.safetensors", bad_shape, 2, 0, 0, NULL);
    expect_fail(0, KVA_STATUS_SHAPE_MISMATCH, "k_cache_scale");
    tensor bad_shape2[] = {{k, "F32", 2, {2, N / 2}, ks, 0}, {v, "F32", 1, {N, 0}, vs, 0}};
    write_safetensors("m.safetensors", bad_shape2, 2, 0, 0, NULL);
    expect_fail(0, KVA_STATUS_SHAPE_MISMATCH, "k_cache_scale");
    /* Offsets that disagree with shape x dtype. */
    tensor bad_off[] = {{k, "F32", 1, {N, 0}, ks, 4}, {v, "F32", 1, {N, 0}, vs, 0}};
    write_safetensors("m.safetensors", bad_off, 2, 0, 0, NULL);
    expect_fail(0, KVA_STATUS_IO_ERROR, "data_offsets");
    /* Truncated data. */
    write_safetensors("m.safetensors", good, 2, 0, 5, NULL);
    expect_fail(0, KVA_STATUS_IO_ERROR, "truncated");
    /* Index naming a file that is not there, and a tensor the file lacks. */
    write_safetensors("m.safetensors", good, 2, 0, 0, NULL);
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"model.layers.0.self_attn.k_cache_scale\":\"gone.safetensors\"}}");
    expect_fail(0, KVA_STATUS_IO_ERROR, "gone.safetensors");
    write_text("model.safetensors.index.json",
               "{\"weight_map\":{\"model.layers.0.self_attn.k_cache_scale\":\"m.safetensors\","
               "\"model.layers.0.self_attn.v_cache_scale\":\"m.safetensors\","
               "\"model.layers.0.self_attn.k_cache_offset\":\"m.safetensors\"}}");
    expect_fail(0, KVA_STATUS_IO_ERROR, "no such tensor");
    write_text("model.safetensors.index.json", "{\"metadata\":{}}");
    expect_fail(0, KVA_STATUS_IO_ERROR, "weight_map");
    /* No shards at all. */
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    expect_fail(0, KVA_STATUS_IO_ERROR, "safetensors");

    /* Bad arguments. */
    kva_c8_scales *o = (kva_c8_scales *)(uintptr_t)0x1234;
    CHECK_STATUS(kva_c8_scales_load(NULL, 0, HKV, D, 0, 1, &o), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, HKV, D, 0, 1, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_c8_scales_load(tmpdir, -1, HKV, D, 0, 1, &o), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("layer");
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, HKV, D, 2, 2 * 1, &o), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("tp_rank");
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, HKV, D, 0, 3, &o), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("tp_size");
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, HKV, D, 0, 6, &o), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, 0, D, 0, 1, &o), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_c8_scales_load(tmpdir, 0, HKV, 12, 0, 1, &o), KVA_STATUS_UNSUPPORTED);
    CHECK(o == (kva_c8_scales *)(uintptr_t)0x1234);
    CHECK_STATUS(kva_c8_scales_load("/nonexistent/kva", 0, HKV, D, 0, 1, &o), KVA_STATUS_IO_ERROR);
    CHECK_ERROR_MENTIONS("/nonexistent/kva");
}

/* Writes a safetensors file from a literal header: the length field says
 * len_field, then the header text, then data_bytes bytes of data (0.5f
 * floats, so a valid scale). */
static void write_st_raw(const char *name, const char *header, uint64_t len_field,
                         size_t data_bytes)
{
    const size_t hl = strlen(header);
    unsigned char *file = malloc(8 + hl + data_bytes);
    for (int b = 0; b < 8; b++)
        file[b] = (unsigned char)(len_field >> (8 * b));
    memcpy(file + 8, header, hl);
    const float half = 0.5f;
    for (size_t i = 0; i < data_bytes; i++)
        file[8 + hl + i] = ((const unsigned char *)&half)[i % 4];
    write_file(name, file, 8 + hl + data_bytes);
    free(file);
}

/* The header of one K and one V scale tensor [N] F32 with the given
 * data_offsets texts (and shape/dtype texts for K). */
static void header_kv(char *buf, size_t n, const char *k_dtype, const char *k_shape,
                      const char *k_offs, const char *v_offs)
{
    snprintf(buf, n,
             "{\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":%s,\"shape\":%s,"
             "\"data_offsets\":%s},"
             "\"model.layers.0.self_attn.v_cache_scale\":{\"dtype\":\"F32\",\"shape\":[%d],"
             "\"data_offsets\":%s}}",
             k_dtype, k_shape, k_offs, N, v_offs);
}

/*
 * Hostile and corrupt safetensors files: each gets a status and a message and
 * no crash or over-read (this test runs under ASan+UBSan in the sanitizer
 * build): huge or tiny header lengths, a header cut mid-JSON (no terminating
 * NUL anywhere), headers that are not objects, offsets that are negative,
 * fractional, beyond 2^53, reversed, overlapping, leaving gaps or past the
 * end, shapes whose element count overflows int64, bad dtype strings,
 * duplicate names, a huge (sparse) tensor where a scale is expected, and index
 * entries that are not file names. Valid files with entries out of offset
 * order still load.
 */
static void test_hostile_headers(void)
{
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    char h[2048], offs[64], voffs[64], shape[32];
    snprintf(offs, sizeof offs, "[0,%d]", 4 * N);
    snprintf(voffs, sizeof voffs, "[%d,%d]", 4 * N, 8 * N);
    snprintf(shape, sizeof shape, "[%d]", N);

    /* The well-formed baseline, its entries listed in reverse offset order. */
    snprintf(h, sizeof h,
             "{\"model.layers.0.self_attn.v_cache_scale\":{\"dtype\":\"F32\",\"shape\":[%d],"
             "\"data_offsets\":%s},\"__metadata__\":{\"format\":\"pt\"},"
             "\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":\"F32\",\"shape\":%s,"
             "\"data_offsets\":%s}}",
             N, voffs, shape, offs);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    kva_c8_scales *s = NULL;
    CHECK_OK(load(0, 0, 1, &s));
    CHECK(s && s->params.k_scale_len == N && s->params.k_scale[N - 1] == 0.5f);
    kva_c8_scales_free(s);
    /* Space padding after the JSON (as writers align the data section) is
     * fine; anything else after it is not. */
    char padded[2048];
    snprintf(padded, sizeof padded, "%s        ", h);
    write_st_raw("m.safetensors", padded, strlen(padded), 8 * N);
    CHECK_OK(load(0, 0, 1, &s));
    kva_c8_scales_free(s);
    snprintf(padded, sizeof padded, "%s  x     ", h);
    write_st_raw("m.safetensors", padded, strlen(padded), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "not a JSON object");
    snprintf(padded, sizeof padded, "%s{}", h);
    write_st_raw("m.safetensors", padded, strlen(padded), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "not a JSON object");
    /* Trailing bytes after the last tensor are tolerated. */
    write_st_raw("m.safetensors", h, strlen(h), 8 * N + 3);
    CHECK_OK(load(0, 0, 1, &s));
    kva_c8_scales_free(s);

    /* Header lengths: 2^64 - 1, 2^63, 2^32 + small, 0, 1, one byte short
     * (the JSON loses its closing brace; nothing NUL-terminates it). */
    const uint64_t lens[] = {UINT64_MAX, (uint64_t)1 << 63, ((uint64_t)1 << 32) + 16, 0,
                             1,          strlen(h) - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        write_st_raw("m.safetensors", h, lens[i], 8 * N);
        expect_fail(0, KVA_STATUS_IO_ERROR, "m.safetensors");
    }
    /* Headers that are not an object of entries. */
    const char *not_obj[] = {"[1, 2, 3]",   "null",
                             "\"str\"",     "{\"a\": 1}",
                             "{\"a\": {}}", "{\"\\u0000\": {\"data_offsets\": [0, 0]}, \"b\": 5}",
                             "  {}  x"};
    for (size_t i = 0; i < sizeof not_obj / sizeof not_obj[0]; i++) {
        write_st_raw("m.safetensors", not_obj[i], strlen(not_obj[i]), 0);
        kva_c8_scales *o;
        const kva_status st = load(0, 0, 1, &o);
        CHECK_MSG(st == KVA_STATUS_IO_ERROR, "header %s: status %s", not_obj[i],
                  kva_status_name(st));
    }

    /* Bad data_offsets of K (V fine where it can be). */
    char big[64];
    snprintf(big, sizeof big, "[0,%.0f]", 9007199254740994.0); /* 2^53 + 2 */
    const char *bad_offs[] = {"[-4,124]",    "[0.5,128.5]", "[\"0\",\"128\"]", "[0]",
                              "[0,128,256]", "[128,0]",     "[0,1e300]",       "{}",
                              "[0,-1e-300]", big,           "[0,1e20]",        "null"};
    for (size_t i = 0; i < sizeof bad_offs / sizeof bad_offs[0]; i++) {
        header_kv(h, sizeof h, "\"F32\"", shape, bad_offs[i], voffs);
        write_st_raw("m.safetensors", h, strlen(h), 8 * N);
        expect_fail(0, KVA_STATUS_IO_ERROR, "data_offsets");
    }
    /* Overlap, gap, not starting at 0, past the end. */
    char o1[64], o2[64];
    snprintf(o1, sizeof o1, "[0,%d]", 4 * N);
    snprintf(o2, sizeof o2, "[%d,%d]", 2 * N, 6 * N); /* overlaps K */
    header_kv(h, sizeof h, "\"F32\"", shape, o1, o2);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "overlap");
    snprintf(o2, sizeof o2, "[%d,%d]", 5 * N, 9 * N); /* gap after K */
    header_kv(h, sizeof h, "\"F32\"", shape, o1, o2);
    write_st_raw("m.safetensors", h, strlen(h), 9 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "gap");
    snprintf(o1, sizeof o1, "[%d,%d]", 4, 4 * N + 4); /* K does not start at 0 */
    snprintf(o2, sizeof o2, "[%d,%d]", 4 * N + 4, 8 * N + 4);
    header_kv(h, sizeof h, "\"F32\"", shape, o1, o2);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N + 4);
    expect_fail(0, KVA_STATUS_IO_ERROR, "gap");
    header_kv(h, sizeof h, "\"F32\"", shape, offs, voffs);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N - 1); /* last byte missing */
    expect_fail(0, KVA_STATUS_IO_ERROR, "truncated");

    /* Shapes: products that overflow int64 (2^62 * 4, 1e15^3), negative,
     * fractional, non-numeric, too many dimensions, zero elements. */
    const struct {
        const char *shape;
        kva_status want;
    } bad_shapes[] = {
        {"[4611686018427387904, 4]", KVA_STATUS_IO_ERROR}, /* dim > 1e15: not accepted */
        {"[1000000000000000, 1000000000000000, 1000000000000000]", KVA_STATUS_SHAPE_MISMATCH},
        {"[1099511627776, 1099511627776]", KVA_STATUS_SHAPE_MISMATCH},
        {"[1000000000000, 1000000000000]", KVA_STATUS_SHAPE_MISMATCH},    /* was int64 overflow */
        {"[0, 1000000000000000, 1000000000000000]", KVA_STATUS_IO_ERROR}, /* 0 elements: span */
        {"[-32]", KVA_STATUS_IO_ERROR},
        {"[31.5]", KVA_STATUS_IO_ERROR},
        {"[\"32\"]", KVA_STATUS_IO_ERROR},
        {"[1,1,1,1,1,1,1,1,32]", KVA_STATUS_SHAPE_MISMATCH},
        {"32", KVA_STATUS_IO_ERROR},
    };
    for (size_t i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; i++) {
        header_kv(h, sizeof h, "\"F32\"", bad_shapes[i].shape, offs, voffs);
        write_st_raw("m.safetensors", h, strlen(h), 8 * N);
        kva_c8_scales *o;
        const kva_status st = load(0, 0, 1, &o);
        CHECK_MSG(st == bad_shapes[i].want, "shape %s: status %s", bad_shapes[i].shape,
                  kva_status_name(st));
    }

    /* dtype strings: case matters, unknown names, not a string, a long one
     * (the message quotes at most 32 characters). */
    const struct {
        const char *dtype;
        kva_status want;
    } bad_dtypes[] = {
        {"\"f32\"", KVA_STATUS_DTYPE_MISMATCH},
        {"\"F64\"", KVA_STATUS_DTYPE_MISMATCH},
        {"\"\"", KVA_STATUS_DTYPE_MISMATCH},
        {"\"F32 \"", KVA_STATUS_DTYPE_MISMATCH},
        {"32", KVA_STATUS_IO_ERROR},
        {"null", KVA_STATUS_IO_ERROR},
        {"\"F32\\u0000x\"", KVA_STATUS_IO_ERROR}, /* NUL: cJSON would cut it to "F32" */
        {"\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
         "AAAAA"
         "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"",
         KVA_STATUS_DTYPE_MISMATCH},
    };
    for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
        header_kv(h, sizeof h, bad_dtypes[i].dtype, shape, offs, voffs);
        write_st_raw("m.safetensors", h, strlen(h), 8 * N);
        kva_c8_scales *o;
        const kva_status st = load(0, 0, 1, &o);
        CHECK_MSG(st == bad_dtypes[i].want, "dtype %s: status %s", bad_dtypes[i].dtype,
                  kva_status_name(st));
    }

    /* The same tensor name twice (parsers disagree on which one wins). */
    snprintf(h, sizeof h,
             "{\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":\"F32\",\"shape\":[%d],"
             "\"data_offsets\":%s},"
             "\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":\"F32\",\"shape\":[%d],"
             "\"data_offsets\":%s}}",
             N, offs, N, voffs);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "twice");

    /* A name with an embedded NUL (would read as the K scale's name), a raw
     * NUL byte in the header, and a description saying "C8\u0000...". */
    snprintf(
        h, sizeof h,
        "{\"model.layers.0.self_attn.k_cache_scale\\u0000x\":{\"dtype\":\"F32\",\"shape\":[%d],"
        "\"data_offsets\":%s},"
        "\"model.layers.0.self_attn.v_cache_scale\":{\"dtype\":\"F32\",\"shape\":[%d],"
        "\"data_offsets\":%s}}",
        N, offs, N, voffs);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "NUL");
    header_kv(h, sizeof h, "\"F32\"", shape, offs, voffs);
    write_st_raw("m.safetensors", h, strlen(h) + 1, 8 * N); /* the length covers the NUL */
    expect_fail(0, KVA_STATUS_IO_ERROR, "NUL");
    write_text("quant_model_description.json", "{\"kv_cache_type\": \"C8\\u0000FP16\"}");
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    expect_fail(0, KVA_STATUS_IO_ERROR, "quant_model_description.json");
    write_text("quant_model_description.json", C8_DESC);

    /* A tensor of 2^28 floats (a 1 GiB sparse file) where a scale is
     * expected: refused by its shape before anything is allocated or read. */
    snprintf(h, sizeof h,
             "{\"model.layers.0.self_attn.k_cache_scale\":{\"dtype\":\"F32\",\"shape\":[268435456],"
             "\"data_offsets\":[0,1073741824]}}");
    write_st_raw("m.safetensors", h, strlen(h), 0);
    char p[512];
    path_of(p, sizeof p, "m.safetensors");
    CHECK(truncate(p, (off_t)(8 + strlen(h)) + ((off_t)1 << 30)) == 0);
    expect_fail(0, KVA_STATUS_SHAPE_MISMATCH, "268435456");
    CHECK(unlink(p) == 0);

    /* Index entries that are not plain file names of the directory. */
    header_kv(h, sizeof h, "\"F32\"", shape, offs, voffs);
    write_st_raw("m.safetensors", h, strlen(h), 8 * N);
    const char *bad_files[] = {"\"..\"", "\"\"", "\".\"", "\"/etc/passwd\"", "5", "null"};
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        char idx[512];
        snprintf(idx, sizeof idx,
                 "{\"weight_map\":{\"model.layers.0.self_attn.k_cache_scale\":%s}}", bad_files[i]);
        write_text("model.safetensors.index.json", idx);
        kva_c8_scales *o;
        const kva_status st = load(0, 0, 1, &o);
        CHECK_MSG(st == KVA_STATUS_IO_ERROR, "index file %s: status %s", bad_files[i],
                  kva_status_name(st));
    }
}

/* Values no cache can use: NaN, +-inf, 0 and negative scales, NaN and +-inf
 * offsets (F32; the inf scale through F16, the NaN through BF16, and a scalar
 * tensor) are refused by the loader with INVALID_ARGUMENT naming the tensor
 * and the element's index in it, *out untouched. A bad value in another
 * rank's heads fails every rank alike (the whole tensor is checked). The same
 * arrays given to kva_cache_create_quant directly are refused there too. */
static void test_nonfinite_values(void)
{
    const float bad[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.5f, -0.0f};
    const char *const dts[] = {"BF16", "F16", "F32", "F32", "F32", "F32"};
    const char *names[] = {"k_cache_scale", "v_cache_offset"};
    const char *pnames[] = {"k_scale", "v_offset"};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(NULL, &ctx));
    for (int which = 0; which < 2; which++)
        for (int b = 0; b < 6; b++)
            for (int scalar = 0; scalar < 2; scalar++) {
                if (which == 1 && b >= 3) /* offsets may be 0 or negative */
                    continue;
                float k2[N], o2[N];
                memcpy(k2, ks, sizeof k2);
                memcpy(o2, vo, sizeof o2);
                float *dst = which == 0 ? k2 : o2;
                const int at = scalar ? 0 : N - 3; /* N - 3: head 3, rank 1 of tp 2 */
                dst[at] = bad[b];
                new_dir();
                write_text("quant_model_description.json", C8_DESC);
                const int64_t n = scalar ? 1 : N;
                tensor t[] = {
                    {"model.layers.0.self_attn.k_cache_scale",
                     which == 0 ? dts[b] : "F32",
                     1,
                     {which == 0 ? n : N, 0},
                     k2,
                     0},
                    {"model.layers.0.self_attn.v_cache_scale", "F32", 1, {N, 0}, vs, 0},
                    {"model.layers.0.self_attn.v_cache_offset",
                     "F32",
                     1,
                     {which == 1 ? n : N, 0},
                     o2,
                     0},
                };
                write_safetensors("m.safetensors", t, 3, 0, 0, NULL);
                char want[128];
                snprintf(want, sizeof want, "'model.layers.0.self_attn.%s'[%d]", names[which], at);
                for (int32_t rank = 0; rank < 2; rank++) {
                    kva_c8_scales *s = NULL;
                    const kva_status st = load(0, rank, 2, &s);
                    CHECK_STATUS(st, KVA_STATUS_INVALID_ARGUMENT);
                    CHECK_ERROR_MENTIONS(want);
                    if (st == KVA_STATUS_OK)
                        kva_c8_scales_free(s);
                }
                /* kva_cache_create_quant refuses the same arrays. */
                kva_quant_params qp = {0};
                qp.k_scale = k2;
                qp.k_scale_len = which == 0 ? n : N;
                qp.v_scale = vs;
                qp.v_scale_len = N;
                qp.v_offset = o2;
                qp.v_offset_len = which == 1 ? n : N;
                kva_cache_desc cd = {4,
                                     16,
                                     HKV,
                                     D,
                                     D,
                                     KVA_DTYPE_I8,
                                     KVA_LAYOUT_NHD,
                                     KVA_QUANT_INT8_CHANNEL,
                                     KVA_ATTN_MHA};
                kva_cache *c = (kva_cache *)(uintptr_t)0x5678;
                CHECK_STATUS(kva_cache_create_quant(ctx, &cd, &qp, &c),
                             KVA_STATUS_INVALID_ARGUMENT);
                CHECK_ERROR_MENTIONS(pnames[which]);
                CHECK(c == (kva_cache *)(uintptr_t)0x5678);
            }
    /* Edge values that are fine load as stored: the smallest F16 subnormal
     * scale, huge finite scales, negative and zero offsets. */
    float k2[N], o2[N];
    memcpy(k2, ks, sizeof k2);
    memcpy(o2, vo, sizeof o2);
    k2[1] = 5.9604645e-08f; /* 2^-24, F16's smallest subnormal */
    k2[2] = 65504.0f;
    o2[0] = -0.0f;
    o2[1] = -1000.0f;
    new_dir();
    write_text("quant_model_description.json", C8_DESC);
    tensor t[] = {
        {"model.layers.0.self_attn.k_cache_scale", "F16", 1, {N, 0}, k2, 0},
        {"model.layers.0.self_attn.v_cache_scale", "F32", 1, {N, 0}, vs, 0},
        {"model.layers.0.self_attn.v_cache_offset", "F32", 1, {N, 0}, o2, 0},
    };
    write_safetensors("m.safetensors", t, 3, 0, 0, NULL);
    kva_c8_scales *s = NULL;
    CHECK_OK(load(0, 0, 1, &s));
    if (s) {
        CHECK(s->params.k_scale[1] == k2[1] && s->params.k_scale[2] == k2[2]);
        CHECK(s->params.v_offset[1] == o2[1] && s->params.v_offset[0] == 0.0f);
        kva_c8_scales_free(s);
    }
    kva_context_destroy(ctx);
}

/* Directories where a file is expected (an index entry "", "." or "..", a
 * folder named like a shard, the description or the index a folder): each is
 * refused as not a regular file, not sized as a huge file. */
static void test_not_regular_files(void)
{
    init_vals();
    const tensor good[2] = {{"model.layers.0.self_attn.k_cache_scale", "F32", 1, {N, 0}, ks, 0},
                            {"model.layers.0.self_attn.v_cache_scale", "F32", 1, {N, 0}, vs, 0}};
    static const char *const entries[] = {"", ".", ".."};
    for (int i = 0; i < 3; i++) {
        new_dir();
        write_text("quant_model_description.json", C8_DESC);
        write_safetensors("m.safetensors", good, 2, 0, 0, NULL);
        char idx[256];
        snprintf(idx, sizeof idx,
                 "{\"weight_map\":{\"model.layers.0.self_attn.k_cache_scale\":\"%s\","
                 "\"model.layers.0.self_attn.v_cache_scale\":\"m.safetensors\"}}",
                 entries[i]);
        write_text("model.safetensors.index.json", idx);
        expect_fail(0, KVA_STATUS_IO_ERROR, "not a regular file");
    }
    static const char *const dirs[] = {"zz.safetensors", "model.safetensors.index.json",
                                       "quant_model_description.json"};
    for (int i = 0; i < 3; i++) {
        new_dir();
        if (i != 2)
            write_text("quant_model_description.json", C8_DESC);
        write_safetensors("m.safetensors", good, 2, 0, 0, NULL);
        char p[512];
        path_of(p, sizeof p, dirs[i]);
        CHECK(mkdir(p, 0700) == 0);
        expect_fail(0, KVA_STATUS_IO_ERROR, "not a regular file");
    }
}

int main(void)
{
    init_vals();
    RUN(test_single_file_sharded);
    RUN(test_index_shards);
    RUN(test_errors);
    RUN(test_hostile_headers);
    RUN(test_nonfinite_values);
    RUN(test_not_regular_files);
    if (tmpdir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return kva_test_finish();
}
