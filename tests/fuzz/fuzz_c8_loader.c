/*
 * fuzz_c8_loader.c - libFuzzer harness for kva_c8_scales_load, the reader
 * of untrusted checkpoint files (quant_model_description.json,
 * model.safetensors.index.json, *.safetensors headers and data).
 *
 * Input: 5 bytes of arguments (layer 0..3, Hkv_total 1..8, D 8..32,
 * tp_size 1..8, tp_rank as a signed byte), then up to 4 parts separated by
 * FUZZ_SEP, written as the checkpoint's files (a missing part is a missing
 * file): the description, the index (absent when the part is empty), and
 * two shards model-00001-of-00002.safetensors, model-00002-of-00002.safetensors.
 * Checks beyond ASan/UBSan: a failure leaves a message and *out NULL; a
 * success returns the shape asked for and scale arrays of a length the
 * header allows (1 or Hkv * D), offsets too (or NULL, 0).
 */
#define _POSIX_C_SOURCE 200809L
#include "kvattn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_SEP "\x00KVA\x00"
#define FUZZ_SEP_LEN 5

static char g_dir[64];
static const char *const kFiles[4] = {
    "quant_model_description.json", "model.safetensors.index.json",
    "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void put(int i, const uint8_t *p, size_t n, int present)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, kFiles[i]);
    unlink(path);
    if (!present)
        return;
    FILE *f = fopen(path, "wb");
    if (!f)
        __builtin_trap();
    if (n && fwrite(p, 1, n, f) != n)
        __builtin_trap();
    fclose(f);
}

/* Next part of [*p, end) up to the separator (or the end). */
static const uint8_t *next_part(const uint8_t **p, const uint8_t *end, size_t *n)
{
    const uint8_t *s = *p;
    if (s > end)
        return NULL;
    const uint8_t *q = s;
    while (q + FUZZ_SEP_LEN <= end && memcmp(q, FUZZ_SEP, FUZZ_SEP_LEN) != 0)
        q++;
    if (q + FUZZ_SEP_LEN > end)
        q = end;
    *n = (size_t)(q - s);
    *p = q == end ? end + 1 : q + FUZZ_SEP_LEN;
    return s;
}

static int len_ok(int64_t len, int64_t full)
{
    return len == 1 || len == full;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(g_dir, sizeof g_dir, "%s/kva_fuzz_c8_XXXXXX", base);
        if (!mkdtemp(g_dir))
            __builtin_trap();
    }
    if (size < 5)
        return 0;
    const int32_t layer = data[0] % 4, hkv = 1 + data[1] % 8, d = 8 * (1 + data[2] % 4);
    const int32_t tp_size = 1 + data[3] % 8, tp_rank = (int8_t)data[4];
    const uint8_t *p = data + 5, *end = data + size;
    for (int i = 0; i < 4; i++) {
        size_t n = 0;
        const uint8_t *part = next_part(&p, end, &n);
        put(i, part, n, part != NULL && (i != 1 || n > 0));
    }
    kva_c8_scales *s = NULL;
    kva_status st = kva_c8_scales_load(g_dir, layer, hkv, d, tp_rank, tp_size, &s);
    if (st != KVA_STATUS_OK) {
        if (s != NULL || kva_last_error()[0] == '\0')
            __builtin_trap();
        return 0;
    }
    if (!s || kva_last_error()[0] != '\0')
        __builtin_trap();
    const int32_t hr = tp_size <= hkv ? hkv / tp_size : 1;
    const int64_t full = (int64_t)hr * d;
    const kva_quant_params *q = &s->params;
    if (s->num_kv_heads != hr || s->head_dim != d || !q->k_scale || !q->v_scale ||
        !len_ok(q->k_scale_len, full) || !len_ok(q->v_scale_len, full) ||
        (q->k_offset && !len_ok(q->k_offset_len, full)) ||
        (q->v_offset && !len_ok(q->v_offset_len, full)))
        __builtin_trap();
    /* Every value is readable (ASan checks the extent). */
    volatile float acc = 0.0f;
    for (int64_t i = 0; i < q->k_scale_len; i++)
        acc += q->k_scale[i];
    for (int64_t i = 0; i < q->v_scale_len; i++)
        acc += q->v_scale[i];
    for (int64_t i = 0; q->k_offset && i < q->k_offset_len; i++)
        acc += q->k_offset[i];
    for (int64_t i = 0; q->v_offset && i < q->v_offset_len; i++)
        acc += q->v_offset[i];
    (void)acc;
    kva_c8_scales_free(s);
    return 0;
}
