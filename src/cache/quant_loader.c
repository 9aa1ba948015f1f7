/*
 * quant_loader.c - kva_c8_scales_load: the C8 k/v cache scales and offsets of
 * one layer, read from a checkpoint directory and sharded to a
 * tensor-parallel rank.
 *
 * A safetensors file is: an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {"dtype", "shape", "data_offsets": [begin, end]}, plus an
 * optional "__metadata__"}), then the data section, to which data_offsets are
 * relative. Only the header and the bytes of the tensors asked for are read,
 * so multi-gigabyte shards cost a few small reads. JSON is parsed with cJSON.
 *
 * Every malformed input gets a status and a message naming the file and the
 * problem: a missing file or tensor, a header length past the file, JSON that
 * does not parse or lacks a field, a NUL inside the JSON, duplicate names,
 * offsets that are not integers in [0, 2^53], overlap, leave gaps or
 * disagree with the shape and dtype, data past the end of the file
 * (truncated), a dtype other than F32/F16/BF16, a shape whose element count
 * passes 2^40 or is neither 1 nor Hkv_total * D (checked before reading).
 *
 * Built only with cJSON (CMake KVA_WITH_CJSON, which defines KVA_HAVE_CJSON);
 * quant_loader_off.c stands in for it otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include "internal.h"

#ifdef KVA_HAVE_CJSON
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char fn[] = "kva_c8_scales_load";

/* Largest JSON file (description, index) and safetensors header accepted. */
#define KVA_JSON_MAX_BYTES (64u << 20)

/* Joins dir and name into a fresh string; NULL when out of memory. */
static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Size of an open file (fseeko/ftello: 64-bit offsets). */
static kva_status file_size(FILE *f, const char *path, uint64_t *out)
{
    /* fopen succeeds on a directory (a shard or index entry named "..", a
     * folder called x.safetensors), whose "size" would be nonsense. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode))
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: '%s' is not a regular file", fn, path);
    if (fseeko(f, 0, SEEK_END) != 0)
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot seek in '%s'", fn, path);
    off_t n = ftello(f);
    if (n < 0 || fseeko(f, 0, SEEK_SET) != 0)
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot seek in '%s'", fn, path);
    *out = (uint64_t)n;
    return KVA_STATUS_OK;
}

/* 1 if JSON text buf [n] holds a NUL: a raw zero byte or a \u0000 escape.
 * cJSON decodes strings into NUL-terminated C strings, so "F32\u0000x" would
 * compare equal to "F32"; such text is refused instead. */
static int json_has_nul(const char *buf, size_t n)
{
    if (memchr(buf, 0, n))
        return 1;
    for (size_t i = 0; i + 1 < n; i++) {
        if (buf[i] != '\\')
            continue;
        if (buf[i + 1] == 'u' && i + 5 < n && !memcmp(buf + i + 2, "0000", 4))
            return 1;
        i++; /* skip the escaped character (\\ included) */
    }
    return 0;
}

/* Parses JSON text buf [n] that must hold one value and nothing after it but
 * whitespace (safetensors headers are padded with spaces); NULL otherwise,
 * or when the text holds a NUL. */
static cJSON *json_parse(const char *buf, size_t n)
{
    if (json_has_nul(buf, n))
        return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!j)
        return NULL;
    for (const char *p = end; p && p < buf + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(j);
            return NULL;
        }
    return j;
}

/* Reads and parses a JSON file. missing_ok: a missing file gives OK with *out NULL. */
static kva_status json_file(const char *path, int missing_ok, cJSON **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (missing_ok)
            return KVA_STATUS_OK;
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot open '%s'", fn, path);
    }
    uint64_t n = 0;
    kva_status st = file_size(f, path, &n);
    char *buf = NULL;
    if (st == KVA_STATUS_OK && n > KVA_JSON_MAX_BYTES)
        st = kva__fail(KVA_STATUS_IO_ERROR, "%s: '%s' is %llu bytes, larger than %u", fn, path,
                       (unsigned long long)n, KVA_JSON_MAX_BYTES);
    if (st == KVA_STATUS_OK && !(buf = malloc((size_t)n + 1)))
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory reading '%s'", fn, path);
    if (st == KVA_STATUS_OK && fread(buf, 1, (size_t)n, f) != (size_t)n)
        st = kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot read '%s'", fn, path);
    fclose(f);
    if (st == KVA_STATUS_OK) {
        *out = json_parse(buf, (size_t)n);
        if (!*out || !cJSON_IsObject(*out)) {
            cJSON_Delete(*out);
            *out = NULL;
            st = kva__fail(KVA_STATUS_IO_ERROR, "%s: '%s' is not a JSON object", fn, path);
        }
    }
    free(buf);
    return st;
}

/* ---- safetensors ---- */

typedef struct st_file {
    char *path;
    FILE *f;
    cJSON *header;
    uint64_t data_begin; /* 8 + N */
    uint64_t size;       /* file size in bytes */
} st_file;

static void st_close(st_file *s)
{
    if (s->f)
        fclose(s->f);
    cJSON_Delete(s->header);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* Largest data offset accepted: 2^53, below which JSON numbers (doubles) are
 * exact integers. */
#define KVA_ST_MAX_OFFSET 9007199254740992.0

/* Entry t's data_offsets [begin, end] as integers: both non-negative whole
 * numbers <= 2^53 with begin <= end; 0 when they are not. */
static int st_offsets(const cJSON *t, uint64_t *begin, uint64_t *end)
{
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return 0;
    const cJSON *b = cJSON_GetArrayItem(offs, 0), *e = cJSON_GetArrayItem(offs, 1);
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e))
        return 0;
    const double bd = b->valuedouble, ed = e->valuedouble;
    if (!(bd >= 0 && ed >= bd && ed <= KVA_ST_MAX_OFFSET) || bd != (double)(uint64_t)bd ||
        ed != (double)(uint64_t)ed)
        return 0;
    *begin = (uint64_t)bd;
    *end = (uint64_t)ed;
    return 1;
}

/* One header entry, for the whole-header checks. */
typedef struct st_span {
    const char *name;
    uint64_t begin, end;
} st_span;

static int cmp_span_name(const void *a, const void *b)
{
    return strcmp(((const st_span *)a)->name, ((const st_span *)b)->name);
}

static int cmp_span_begin(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Checks the whole header as the safetensors format defines it, so that a
 * hostile or corrupt file is refused before any tensor is read: every entry
 * but "__metadata__" is an object with integer data_offsets [begin, end]; no
 * name appears twice (JSON parsers disagree on which duplicate wins); and
 * the entries, sorted by begin, tile the data section from byte 0 without
 * gaps or overlaps and end inside the file (past it: truncated). Bytes after
 * the last tensor are tolerated. */
static kva_status st_validate(const char *path, const cJSON *header, uint64_t data_bytes)
{
    int n = 0;
    for (const cJSON *t = header->child; t; t = t->next)
        n++;
    st_span *sp = malloc(sizeof(st_span) * (size_t)(n > 0 ? n : 1));
    if (!sp)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for the header of '%s'", fn,
                         path);
    kva_status st = KVA_STATUS_OK;
    int m = 0;
    for (const cJSON *t = header->child; t && st == KVA_STATUS_OK; t = t->next) {
        if (t->string && !strcmp(t->string, "__metadata__"))
            continue;
        if (!cJSON_IsObject(t) || !st_offsets(t, &sp[m].begin, &sp[m].end))
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: '%s': entry '%s' has no valid data_offsets [begin, end] "
                           "(integers, 0 <= begin <= end <= 2^53)",
                           fn, path, t->string ? t->string : "?");
        sp[m].name = t->string ? t->string : "";
        m++;
    }
    if (st == KVA_STATUS_OK && m > 1) {
        qsort(sp, (size_t)m, sizeof *sp, cmp_span_name);
        for (int i = 1; i < m && st == KVA_STATUS_OK; i++)
            if (!strcmp(sp[i - 1].name, sp[i].name))
                st = kva__fail(KVA_STATUS_IO_ERROR,
                               "%s: '%s': tensor '%s' appears twice in the header", fn, path,
                               sp[i].name);
    }
    if (st == KVA_STATUS_OK) {
        qsort(sp, (size_t)m, sizeof *sp, cmp_span_begin);
        uint64_t at = 0;
        for (int i = 0; i < m && st == KVA_STATUS_OK; i++) {
            if (sp[i].begin != at)
                st = kva__fail(KVA_STATUS_IO_ERROR,
                               "%s: '%s': tensor '%s' has data_offsets [%llu, %llu], but the "
                               "previous tensor ends at byte %llu (%s)",
                               fn, path, sp[i].name, (unsigned long long)sp[i].begin,
                               (unsigned long long)sp[i].end, (unsigned long long)at,
                               sp[i].begin < at ? "overlap" : "gap");
            at = sp[i].end;
        }
        if (st == KVA_STATUS_OK && at > data_bytes)
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: '%s': the tensors end at data byte %llu but the file holds %llu "
                           "data bytes (truncated)",
                           fn, path, (unsigned long long)at, (unsigned long long)data_bytes);
    }
    free(sp);
    return st;
}

/* Opens a safetensors file (takes ownership of path) and parses its header. */
static kva_status st_open(char *path, st_file *s)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->f = fopen(path, "rb");
    if (!s->f) {
        kva_status st = kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot open '%s'", fn, path);
        st_close(s);
        return st;
    }
    kva_status st = file_size(s->f, path, &s->size);
    unsigned char len8[8];
    if (st == KVA_STATUS_OK && (s->size < 8 || fread(len8, 1, 8, s->f) != 8))
        st = kva__fail(KVA_STATUS_IO_ERROR,
                       "%s: '%s' is %llu bytes, too short for a safetensors header length", fn,
                       path, (unsigned long long)s->size);
    uint64_t n = 0;
    if (st == KVA_STATUS_OK) {
        for (int i = 7; i >= 0; i--)
            n = (n << 8) | len8[i];
        if (n < 2 || n > KVA_JSON_MAX_BYTES || n > s->size - 8)
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: '%s': header length %llu is invalid for a file of %llu bytes", fn,
                           path, (unsigned long long)n, (unsigned long long)s->size);
    }
    char *buf = NULL;
    if (st == KVA_STATUS_OK && !(buf = malloc((size_t)n)))
        st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for the header of '%s'", fn,
                       path);
    if (st == KVA_STATUS_OK && fread(buf, 1, (size_t)n, s->f) != (size_t)n)
        st = kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot read the header of '%s'", fn, path);
    if (st == KVA_STATUS_OK) {
        if (json_has_nul(buf, (size_t)n))
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: '%s': the safetensors header contains a NUL character", fn, path);
        else if (!(s->header = json_parse(buf, (size_t)n)) || !cJSON_IsObject(s->header))
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: '%s': the safetensors header is not a JSON object", fn, path);
        else
            st = st_validate(path, s->header, s->size - 8 - n);
    }
    free(buf);
    s->data_begin = 8 + n;
    if (st != KVA_STATUS_OK)
        st_close(s);
    return st;
}

/* Reads tensor `name` (an entry of s's header) as float: *out [*count]
 * (malloc'ed). Checks dtype, shape and offsets against each other and the
 * file, and refuses any element count but 1 and `full` (the loader's scalar
 * or [Hkv_total * D]) before reading, so a huge tensor costs no allocation. */
static kva_status st_read(const st_file *s, const cJSON *t, const char *name, int64_t full,
                          float **out, int64_t *count, int32_t *rank, int64_t dims[2])
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    uint64_t ub = 0, ue = 0;
    if (!cJSON_IsObject(t) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
        !st_offsets(t, &ub, &ue))
        return kva__fail(KVA_STATUS_IO_ERROR,
                         "%s: '%s': entry '%s' lacks dtype, shape or data_offsets [2]", fn, s->path,
                         name);
    size_t esz = 0;
    kva_dtype kd = KVA_DTYPE_F32;
    if (!strcmp(dt->valuestring, "F32"))
        esz = 4, kd = KVA_DTYPE_F32;
    else if (!strcmp(dt->valuestring, "F16"))
        esz = 2, kd = KVA_DTYPE_F16;
    else if (!strcmp(dt->valuestring, "BF16"))
        esz = 2, kd = KVA_DTYPE_BF16;
    else
        return kva__fail(KVA_STATUS_DTYPE_MISMATCH,
                         "%s: '%s': tensor '%s' has dtype \"%.32s\" (F32, F16 or BF16 expected)",
                         fn, s->path, name, dt->valuestring);
    const int nd = cJSON_GetArraySize(shape);
    if (nd > 8)
        return kva__fail(KVA_STATUS_SHAPE_MISMATCH, "%s: '%s': tensor '%s' has %d dimensions", fn,
                         s->path, name, nd);
    /* numel stays <= 2^40: each factor is checked against 2^40 / numel
     * before the multiplication (no int64 overflow on hostile shapes). */
    const int64_t max_numel = (int64_t)1 << 40;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *e = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0) || e->valuedouble > 1e15 ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return kva__fail(KVA_STATUS_IO_ERROR,
                             "%s: '%s': tensor '%s': shape[%d] is not a non-negative integer", fn,
                             s->path, name, i);
        const int64_t dim = (int64_t)e->valuedouble;
        if (numel > 0 && dim > max_numel / numel)
            return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                             "%s: '%s': tensor '%s' has more than 2^40 elements", fn, s->path,
                             name);
        numel *= dim;
        if (i < 2)
            dims[i] = dim;
    }
    if (ue - ub != (uint64_t)numel * esz)
        return kva__fail(KVA_STATUS_IO_ERROR,
                         "%s: '%s': tensor '%s': data_offsets span %llu bytes but shape and "
                         "dtype %s need %llu",
                         fn, s->path, name, (unsigned long long)(ue - ub), dt->valuestring,
                         (unsigned long long)numel * esz);
    if (s->data_begin + ue > s->size)
        return kva__fail(KVA_STATUS_IO_ERROR,
                         "%s: '%s': tensor '%s' ends at byte %llu but the file has %llu bytes "
                         "(truncated)",
                         fn, s->path, name, (unsigned long long)(s->data_begin + ue),
                         (unsigned long long)s->size);
    if (numel != 1 && numel != full)
        return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                         "%s: tensor '%s' has %lld elements (rank %d); expected a scalar or "
                         "[num_kv_heads_total * head_dim] = %lld",
                         fn, name, (long long)numel, nd, (long long)full);
    unsigned char *raw = malloc((size_t)numel * esz + 1);
    float *vals = malloc(sizeof(float) * (size_t)(numel > 0 ? numel : 1));
    if (!raw || !vals) {
        free(raw);
        free(vals);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for tensor '%s'", fn, name);
    }
    if (fseeko(s->f, (off_t)(s->data_begin + ub), SEEK_SET) != 0 ||
        fread(raw, 1, (size_t)numel * esz, s->f) != (size_t)numel * esz) {
        free(raw);
        free(vals);
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: '%s': cannot read tensor '%s'", fn, s->path,
                         name);
    }
    /* Little-endian elements, assembled byte by byte (any host, any alignment). */
    for (int64_t i = 0; i < numel; i++) {
        const unsigned char *p = raw + (size_t)i * esz;
        if (kd == KVA_DTYPE_F32) {
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&vals[i], &u, 4);
        } else {
            uint16_t h = (uint16_t)(p[0] | p[1] << 8);
            vals[i] = kd == KVA_DTYPE_F16 ? kva_f16_to_f32(h) : kva_bf16_to_f32(h);
        }
    }
    free(raw);
    *out = vals;
    *count = numel;
    *rank = nd;
    return KVA_STATUS_OK;
}

/* ---- lookup ---- */

/* The checkpoint: its index (weight_map) or the sorted list of its shards. */
typedef struct ckpt {
    const char *dir;
    cJSON *index;  /* model.safetensors.index.json, or NULL */
    char **shards; /* without an index: *.safetensors names, sorted */
    int num_shards;
} ckpt;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static kva_status ckpt_open(const char *dir, ckpt *c)
{
    memset(c, 0, sizeof *c);
    c->dir = dir;
    char *ip = path_join(dir, "model.safetensors.index.json");
    if (!ip)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    kva_status st = json_file(ip, 1, &c->index);
    free(ip);
    KVA_TRY(st);
    if (c->index) {
        if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(c->index, "weight_map"))) {
            cJSON_Delete(c->index);
            c->index = NULL;
            return kva__fail(KVA_STATUS_IO_ERROR,
                             "%s: '%s/model.safetensors.index.json' has no weight_map object", fn,
                             dir);
        }
        return KVA_STATUS_OK;
    }
    DIR *d = opendir(dir);
    if (!d)
        return kva__fail(KVA_STATUS_IO_ERROR, "%s: cannot open directory '%s'", fn, dir);
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n <= 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
            continue;
        if (c->num_shards == cap) {
            cap = cap ? 2 * cap : 8;
            char **grown = realloc(c->shards, sizeof(char *) * (size_t)cap);
            if (!grown)
                break;
            c->shards = grown;
        }
        if (!(c->shards[c->num_shards] = strdup(e->d_name)))
            break;
        c->num_shards++;
    }
    closedir(d);
    if (c->num_shards > 1)
        qsort(c->shards, (size_t)c->num_shards, sizeof(char *), cmp_str);
    if (c->num_shards == 0)
        return kva__fail(KVA_STATUS_IO_ERROR,
                         "%s: '%s' has neither model.safetensors.index.json nor *.safetensors", fn,
                         dir);
    return KVA_STATUS_OK;
}

static void ckpt_close(ckpt *c)
{
    cJSON_Delete(c->index);
    for (int i = 0; i < c->num_shards; i++)
        free(c->shards[i]);
    free(c->shards);
    memset(c, 0, sizeof *c);
}

/* Finds tensor `name`: OK with *found 1 and its values, or OK with *found 0. */
static kva_status ckpt_find(const ckpt *c, const char *name, int64_t full, int *found, float **vals,
                            int64_t *count, int32_t *rank, int64_t dims[2])
{
    *found = 0;
    if (c->index) {
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(c->index, "weight_map");
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(wm, name);
        if (!file)
            return KVA_STATUS_OK;
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/'))
            return kva__fail(KVA_STATUS_IO_ERROR,
                             "%s: the index maps '%s' to something that is not a file name", fn,
                             name);
        char *p = path_join(c->dir, file->valuestring);
        if (!p)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
        st_file s;
        KVA_TRY(st_open(p, &s));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s.header, name);
        kva_status st = KVA_STATUS_OK;
        if (!t)
            st = kva__fail(KVA_STATUS_IO_ERROR,
                           "%s: the index maps '%s' to '%s', which has no such tensor", fn, name,
                           s.path);
        else
            st = st_read(&s, t, name, full, vals, count, rank, dims);
        st_close(&s);
        *found = st == KVA_STATUS_OK;
        return st;
    }
    for (int i = 0; i < c->num_shards; i++) {
        char *p = path_join(c->dir, c->shards[i]);
        if (!p)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
        st_file s;
        KVA_TRY(st_open(p, &s));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s.header, name);
        kva_status st = KVA_STATUS_OK;
        if (t) {
            st = st_read(&s, t, name, full, vals, count, rank, dims);
            *found = st == KVA_STATUS_OK;
        }
        st_close(&s);
        if (t)
            return st;
    }
    return KVA_STATUS_OK;
}

/* The name patterns checkpoints use for layer i's tensors ({k,v}, {scale,offset}). */
static const char *const patterns[] = {
    "model.layers.%d.self_attn.%s_cache_%s",
    "model.layers.%d.self_attn.attn.%s_cache_%s",
    "model.layers.%d.self_attn.%s_proj.kv_cache_%s",
};

/* Loads one of k/v scale/offset of layer, sharded to heads [h0, h0 + hr):
 * *out [*len] (1 for a scalar, hr * D otherwise); NULL/0 when an optional
 * tensor is absent. */
static kva_status load_one(const ckpt *c, int32_t layer, const char *kv, const char *what,
                           int required, int32_t hkv_total, int32_t D, int32_t h0, int32_t hr,
                           float **out, int64_t *len)
{
    *out = NULL;
    *len = 0;
    char name[256];
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        snprintf(name, sizeof name, patterns[i], (int)layer, kv, what);
        int found = 0;
        float *vals = NULL;
        int64_t n = 0, dims[2] = {0, 0};
        int32_t rank = 0;
        KVA_TRY(ckpt_find(c, name, (int64_t)hkv_total * D, &found, &vals, &n, &rank, dims));
        if (!found)
            continue;
        const int64_t full = (int64_t)hkv_total * D;
        const int scalar = n == 1 && rank <= 1 && full != 1;
        const int flat = n == full && (rank == 1 || (rank == 2 && dims[0] == hkv_total));
        if (!scalar && !flat && !(n == 1 && full == 1)) {
            free(vals);
            return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                             "%s: tensor '%s' has %lld elements (rank %d); expected a scalar or "
                             "[num_kv_heads_total * head_dim] = [%d * %d]",
                             fn, name, (long long)n, (int)rank, (int)hkv_total, (int)D);
        }
        /* Every element of the tensor (all ranks' heads, so every rank fails
         * alike) must be a value kva_cache_create_quant takes. */
        const int scale = !strcmp(what, "scale");
        for (int64_t e = 0; e < n; e++)
            if (!isfinite(vals[e]) || (scale && !(vals[e] > 0.0f))) {
                const double x = vals[e];
                free(vals);
                return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                 "%s: tensor '%s'[%lld] = %g: a %s must be %s", fn, name,
                                 (long long)e, x, what, scale ? "finite and > 0" : "finite");
            }
        if (n == 1) {
            *out = vals;
            *len = 1;
            return KVA_STATUS_OK;
        }
        /* This rank's heads are a contiguous slice of [Hkv_total, D]. */
        memmove(vals, vals + (size_t)h0 * D, sizeof(float) * (size_t)hr * D);
        *out = vals;
        *len = (int64_t)hr * D;
        return KVA_STATUS_OK;
    }
    if (required) {
        snprintf(name, sizeof name, patterns[0], (int)layer, kv, what);
        return kva__fail(KVA_STATUS_IO_ERROR,
                         "%s: tensor '%s' (or its .attn. / %s_proj.kv_cache_%s form) is not in "
                         "the checkpoint",
                         fn, name, kv, what);
    }
    return KVA_STATUS_OK;
}

/* Checks that the description says kv_cache_type C8. */
static kva_status check_description(const char *dir)
{
    char *p = path_join(dir, "quant_model_description.json");
    if (!p)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    cJSON *j = NULL;
    kva_status st = json_file(p, 0, &j);
    if (st == KVA_STATUS_OK) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "kv_cache_type");
        if (!cJSON_IsString(t))
            st = kva__fail(KVA_STATUS_IO_ERROR, "%s: '%s' has no string \"kv_cache_type\"", fn, p);
        else if (strcmp(t->valuestring, "C8") != 0)
            st = kva__fail(KVA_STATUS_UNSUPPORTED,
                           "%s: '%s' says kv_cache_type \"%s\"; only \"C8\" is supported", fn, p,
                           t->valuestring);
    }
    cJSON_Delete(j);
    free(p);
    return st;
}

kva_status kva_c8_scales_load(const char *checkpoint_dir, int32_t layer, int32_t num_kv_heads_total,
                              int32_t head_dim, int32_t tp_rank, int32_t tp_size,
                              kva_c8_scales **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(checkpoint_dir);
    KVA_CHECK_PTR(out);
    if (layer < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: layer = %d is negative", fn, (int)layer);
    if (num_kv_heads_total < 1 || num_kv_heads_total > KVA_MAX_HEADS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_kv_heads_total = %d is outside [1, %d]", fn,
                         (int)num_kv_heads_total, KVA_MAX_HEADS);
    if (!kva__head_dim_ok(head_dim))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: head_dim = %d is not supported (multiples of 8 from 8 to %d)", fn,
                         (int)head_dim, KVA_MAX_HEAD_DIM);
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: tp_rank = %d, tp_size = %d: need 0 <= tp_rank < tp_size", fn,
                         (int)tp_rank, (int)tp_size);
    int32_t h0, hr;
    if (tp_size <= num_kv_heads_total) {
        if (num_kv_heads_total % tp_size != 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: num_kv_heads_total = %d is not divisible by tp_size = %d", fn,
                             (int)num_kv_heads_total, (int)tp_size);
        hr = num_kv_heads_total / tp_size;
        h0 = tp_rank * hr;
    } else {
        if (tp_size % num_kv_heads_total != 0)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: tp_size = %d is not a multiple of num_kv_heads_total = %d", fn,
                             (int)tp_size, (int)num_kv_heads_total);
        hr = 1;
        h0 = tp_rank / (tp_size / num_kv_heads_total);
    }
    KVA_TRY(check_description(checkpoint_dir));
    ckpt c;
    KVA_TRY(ckpt_open(checkpoint_dir, &c));
    float *arr[4] = {NULL, NULL, NULL, NULL};
    int64_t len[4] = {0, 0, 0, 0};
    const char *kv[4] = {"k", "k", "v", "v"}, *what[4] = {"scale", "offset", "scale", "offset"};
    kva_status st = KVA_STATUS_OK;
    for (int i = 0; i < 4 && st == KVA_STATUS_OK; i++)
        st = load_one(&c, layer, kv[i], what[i], i % 2 == 0, num_kv_heads_total, head_dim, h0, hr,
                      &arr[i], &len[i]);
    ckpt_close(&c);
    kva_c8_scales *s = NULL;
    float *data = NULL;
    if (st == KVA_STATUS_OK) {
        s = calloc(1, sizeof *s);
        data = malloc(sizeof(float) * (size_t)(len[0] + len[1] + len[2] + len[3] + 1));
        if (!s || !data)
            st = kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    if (st == KVA_STATUS_OK) {
        /* One owned buffer behind the four arrays of params. */
        const float **dst[4] = {&s->params.k_scale, &s->params.k_offset, &s->params.v_scale,
                                &s->params.v_offset};
        int64_t *dlen[4] = {&s->params.k_scale_len, &s->params.k_offset_len, &s->params.v_scale_len,
                            &s->params.v_offset_len};
        size_t at = 0;
        for (int i = 0; i < 4; i++) {
            if (!arr[i])
                continue;
            memcpy(data + at, arr[i], sizeof(float) * (size_t)len[i]);
            *dst[i] = data + at;
            *dlen[i] = len[i];
            at += (size_t)len[i];
        }
        s->data = data;
        s->num_kv_heads = hr;
        s->head_dim = head_dim;
        *out = s;
    } else {
        free(s);
        free(data);
    }
    for (int i = 0; i < 4; i++)
        free(arr[i]);
    return st;
}

void kva_c8_scales_free(kva_c8_scales *scales)
{
    if (!scales)
        return;
    free(scales->data);
    free(scales);
}
#endif /* KVA_HAVE_CJSON */
