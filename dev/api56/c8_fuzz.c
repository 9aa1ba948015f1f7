/*
 * c8_fuzz.c - api56's mutation probe of kva_c8_scales_load (dev/, not a
 * test): a valid checkpoint (description, one or two safetensors shards,
 * optionally an index) is written, then its files are mutated at random
 * (bytes of the JSON header replaced by characters and tokens JSON parsers
 * trip on, the length field changed, the file cut or extended) and loaded.
 * Every load must return a status (no crash, no sanitizer report); an OK
 * load must hold finite scales > 0 and finite offsets of the documented
 * lengths. Build quant_loader.c alone with AddressSanitizer over the rest
 * of the static library:
 *   gcc -O1 -g -fsanitize=address,undefined -Iinclude -Isrc/core -DKVA_HAVE_CJSON \
 *       dev/api56/c8_fuzz.c src/cache/quant_loader.c build/libkvattn.a -lcjson -lm \
 *       -fopenmp -lcrypto -lxxhash -o /tmp/c8_fuzz && /tmp/c8_fuzz ITERS SEED
 */
#define _POSIX_C_SOURCE 200809L
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t st = 88172645463325252ull;
static uint64_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
}
static int ri(int n)
{
    return (int)(rnd() % (uint64_t)n);
}

static char dir[256];

static void put(const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

enum { HKV = 4, D = 8, N = HKV * D };

/* A safetensors file of the tensors: names[i] with n[i] floats (1 or N). */
static size_t make_st(unsigned char *buf, const char **names, const int *n, int cnt, int dt16)
{
    char hdr[4096];
    size_t hl = (size_t)snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t at = 0;
    unsigned char data[8192];
    for (int i = 0; i < cnt; i++) {
        size_t b = at;
        for (int e = 0; e < n[i]; e++) {
            float v = 0.01f + 0.003f * (float)e;
            if (dt16) {
                uint16_t h = kva_f32_to_bf16(v);
                data[at++] = (unsigned char)h, data[at++] = (unsigned char)(h >> 8);
            } else {
                uint32_t u;
                memcpy(&u, &v, 4);
                for (int k = 0; k < 4; k++)
                    data[at++] = (unsigned char)(u >> (8 * k));
            }
        }
        hl +=
            (size_t)snprintf(hdr + hl, sizeof hdr - hl,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                             names[i], dt16 ? "BF16" : "F32", n[i] == 1 ? "" : "32", b, at);
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(buf + 8, hdr, hl);
    memcpy(buf + 8 + hl, data, at);
    return 8 + hl + at;
}

static const char *tokens[] = {"-1",
                               "1e308",
                               "1e999",
                               "-0",
                               "0.5",
                               "9007199254740993",
                               "[]",
                               "{}",
                               "\"",
                               "\\",
                               "\\u0000",
                               "\\ud800",
                               "null",
                               "true",
                               ",",
                               ":",
                               "[",
                               "]",
                               "{",
                               "}",
                               "\"F16\"",
                               "\"I64\"",
                               "18446744073709551615",
                               " ",
                               "\"__metadata__\"",
                               "\"shape\"",
                               "\"data_offsets\"",
                               "[0,0]"};

/* Mutates buf [*n] (capacity cap) in place. */
static void mutate(unsigned char *buf, size_t *n, size_t cap, int is_st)
{
    const int k = 1 + ri(3);
    for (int m = 0; m < k; m++) {
        const int what = ri(is_st ? 7 : 4);
        if (*n == 0)
            return;
        if (what == 0) { /* replace a byte */
            buf[ri((int)*n)] = (unsigned char)ri(256);
        } else if (what == 1) { /* replace a byte by a printable JSON character */
            const char *cs = "{}[],:\"\\-+.eE0123456789 ";
            buf[ri((int)*n)] = (unsigned char)cs[ri((int)strlen(cs))];
        } else if (what == 2 || what == 3) { /* splice a token in (over the header) */
            const char *t = tokens[ri((int)(sizeof tokens / sizeof tokens[0]))];
            const size_t tl = strlen(t), at = (size_t)ri((int)*n);
            const size_t del = (size_t)ri(6);
            if (*n + tl >= cap)
                continue;
            size_t tail = *n - at > del ? *n - at - del : 0;
            memmove(buf + at + tl, buf + at + (*n - at - tail), tail);
            memcpy(buf + at, t, tl);
            *n = at + tl + tail;
        } else if (what == 4) { /* the length field */
            uint64_t len = 0;
            for (int b = 7; b >= 0; b--)
                len = (len << 8) | buf[b];
            const int64_t delta[] = {-1, 1, -8, 8, 1 << 20, -(int64_t)len, (int64_t)1 << 40};
            len += (uint64_t)delta[ri(7)];
            for (int b = 0; b < 8; b++)
                buf[b] = (unsigned char)(len >> (8 * b));
        } else if (what == 5) { /* truncate */
            *n = (size_t)ri((int)*n);
        } else { /* extend */
            const size_t add = (size_t)ri(64);
            if (*n + add < cap) {
                memset(buf + *n, ri(256), add);
                *n += add;
            }
        }
    }
}

int main(int argc, char **argv)
{
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    if (argc > 2)
        st += (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull;
    snprintf(dir, sizeof dir, "/tmp/api56_c8_XXXXXX");
    if (!mkdtemp(dir))
        return 2;
    int counts[KVA_STATUS_COUNT_ + 1] = {0}, bad = 0;
    for (int it = 0; it < iters; it++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -f '%s'/*", dir);
        if (system(cmd) != 0)
            return 2;
        const char desc[] = "{\"kv_cache_type\":\"C8\"}";
        unsigned char dbuf[256];
        size_t dn = sizeof desc - 1;
        memcpy(dbuf, desc, dn);
        const int layer = ri(2), two = ri(2), index = ri(2), dt16 = ri(2);
        const char *n0[3] = {"model.layers.0.self_attn.k_cache_scale",
                             "model.layers.0.self_attn.k_cache_offset",
                             "model.layers.1.self_attn.attn.k_cache_scale"};
        const char *n1[3] = {"model.layers.0.self_attn.v_cache_scale",
                             "model.layers.1.self_attn.v_proj.kv_cache_scale",
                             "model.layers.1.self_attn.v_proj.kv_cache_offset"};
        const int c0[3] = {N, 1, N}, c1[3] = {1, N, N};
        unsigned char a[16384], b[16384];
        size_t an = make_st(a, n0, c0, two ? 3 : 3, dt16), bn = 0;
        if (two)
            bn = make_st(b, n1, c1, 3, dt16);
        else {
            /* One shard holding all six: rebuild a with every name. */
            const char *all[6] = {n0[0], n0[1], n0[2], n1[0], n1[1], n1[2]};
            const int ca[6] = {N, 1, N, 1, N, N};
            an = make_st(a, all, ca, 6, dt16);
        }
        char ix[2048];
        size_t ixn = 0;
        if (index) {
            ixn = (size_t)snprintf(ix, sizeof ix, "{\"metadata\":{},\"weight_map\":{");
            for (int i = 0; i < 3; i++)
                ixn += (size_t)snprintf(ix + ixn, sizeof ix - ixn, "%s\"%s\":\"a.safetensors\"",
                                        i ? "," : "", n0[i]);
            for (int i = 0; i < 3; i++)
                ixn += (size_t)snprintf(ix + ixn, sizeof ix - ixn, ",\"%s\":\"%s.safetensors\"",
                                        n1[i], two ? "b" : "a");
            ixn += (size_t)snprintf(ix + ixn, sizeof ix - ixn, "}}");
        }
        const int target = ri(index ? 4 : 3);
        if (target == 0)
            mutate(a, &an, sizeof a, 1);
        else if (target == 1 && two)
            mutate(b, &bn, sizeof b, 1);
        else if (target == 2)
            mutate(dbuf, &dn, sizeof dbuf, 0);
        else if (index)
            mutate((unsigned char *)ix, &ixn, sizeof ix, 0);
        put("quant_model_description.json", dbuf, dn);
        put("a.safetensors", a, an);
        if (two)
            put("b.safetensors", b, bn);
        if (index)
            put("model.safetensors.index.json", ix, ixn);
        const int tp = 1 << ri(3), rank = ri(tp);
        kva_c8_scales *s = NULL;
        kva_status r = kva_c8_scales_load(dir, layer, HKV, D, rank, tp, &s);
        counts[r < KVA_STATUS_COUNT_ ? r : KVA_STATUS_COUNT_]++;
        if (r == KVA_STATUS_OK) {
            const kva_quant_params *p = &s->params;
            const int hr = tp <= HKV ? HKV / tp : 1;
            int ok = s->num_kv_heads == hr && s->head_dim == D && p->k_scale && p->v_scale &&
                     (p->k_scale_len == 1 || p->k_scale_len == hr * D) &&
                     (p->v_scale_len == 1 || p->v_scale_len == hr * D);
            for (int64_t i = 0; ok && i < p->k_scale_len; i++)
                ok = isfinite(p->k_scale[i]) && p->k_scale[i] > 0;
            for (int64_t i = 0; ok && i < p->v_scale_len; i++)
                ok = isfinite(p->v_scale[i]) && p->v_scale[i] > 0;
            for (int64_t i = 0; ok && p->k_offset && i < p->k_offset_len; i++)
                ok = isfinite(p->k_offset[i]);
            if (!ok) {
                bad++;
                fprintf(stderr, "iter %d: OK load with bad contents\n", it);
            }
            kva_c8_scales_free(s);
        } else if (s != NULL || !kva_last_error()[0]) {
            bad++;
            fprintf(stderr, "iter %d: %s wrote out or gave no message\n", it, kva_status_name(r));
        }
    }
    for (int i = 0; i <= KVA_STATUS_COUNT_; i++)
        if (counts[i])
            printf("%-28s %d\n", i < KVA_STATUS_COUNT_ ? kva_status_name(i) : "(other)", counts[i]);
    printf("bad %d\n", bad);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0 || bad != 0;
}
