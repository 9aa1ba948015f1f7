/* probe1: host helpers at their edges (DCP, merges, reorder, convert). */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)

int main(void)
{
    int32_t sl[4] = {10, 0, 7, 1 << 30}, ll[4] = {-5, -5, -5, -5};
    /* local lens */
    P(kva_dcp_local_lens(-1, sl, 2, 0, 1, ll));
    P(kva_dcp_local_lens(4, sl, 257, 0, 1, ll));
    P(kva_dcp_local_lens(4, sl, -1, 0, 1, ll));
    P(kva_dcp_local_lens(4, sl, 2, 2, 1, ll));
    P(kva_dcp_local_lens(4, sl, 2, -1, 1, ll));
    P(kva_dcp_local_lens(4, sl, 2, 0, -1, ll));
    P(kva_dcp_local_lens(4, sl, 0, 5, 0, ll));
    P(kva_dcp_local_lens(4, sl, 1, 1, 0, ll));
    int32_t neg[2] = {-1, 3};
    P(kva_dcp_local_lens(2, neg, 2, 0, 1, ll));
    int32_t big[2] = {(1 << 30) + 1, 3};
    P(kva_dcp_local_lens(2, big, 2, 0, 1, ll));
    int32_t big2[1] = {INT32_MAX};
    P(kva_dcp_local_lens(1, big2, 2, 0, 1, ll));
    printf("ll %d %d %d %d\n", ll[0], ll[1], ll[2], ll[3]);
    /* N * I overflow */
    for (int r = 0; r < 3; r++) {
        int32_t one[1] = {1 << 30}, o = -5;
        P(kva_dcp_local_lens(1, one, 256, r, 1 << 24, &o));
        printf("  N256 I2^24 rank %d: %d (want %lld)\n", r, o, r < 64 ? (long long)(1 << 24) : 0LL);
        P(kva_dcp_local_lens(1, one, 3, r, 1 << 30, &o));
        printf("  N3 I2^30 rank %d: %d (want %d)\n", r, o, r == 0 ? 1 << 30 : 0);
        P(kva_dcp_local_lens(1, one, 3, r, INT32_MAX, &o));
        printf("  N3 Imax rank %d: %d (want %d)\n", r, o, r == 0 ? 1 << 30 : 0);
    }
    P(kva_dcp_local_lens(4, sl, 2, 0, 1, sl + 1));
    P(kva_dcp_local_lens(0, NULL, 2, 0, 1, NULL));
    P(kva_dcp_local_lens(1, NULL, 2, 0, 1, ll));
    P(kva_dcp_local_lens(1, sl, 2, 0, 1, NULL));

    /* slots */
    int32_t row[4] = {3, 5, -1, 7};
    int64_t slots[8];
    for (int i = 0; i < 8; i++) slots[i] = -99;
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, -1, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, INT32_MAX, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, INT32_MAX - 1, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 0, row, 4, 0, 2, slots));
    P(kva_dcp_slots(2, 0, 1, -4, row, 4, 0, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 4, row, -1, 0, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, 0, -1, slots));
    P(kva_dcp_slots(2, 2, 1, 4, row, 4, 0, 2, slots));
    P(kva_dcp_slots(257, 0, 1, 4, row, 4, 0, 2, slots));
    P(kva_dcp_slots(2, 0, -2, 4, row, 4, 0, 2, slots));
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, 16, 2, slots)); /* pos 16 local 8 -> row[2] = -1 */
    printf("slots %lld %lld\n", (long long)slots[0], (long long)slots[1]);
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, 0, 8, slots));
    printf("slots"); for (int i = 0; i < 8; i++) printf(" %lld", (long long)slots[i]); printf("\n");
    P(kva_dcp_slots(2, 1, 1, 4, NULL, 0, 0, 1, slots)); /* token 0 on rank 0: rank 1 has none */
    printf("slots0 %lld\n", (long long)slots[0]);
    P(kva_dcp_slots(2, 0, 1, 4, row, 4, 0, 0, NULL));
    /* huge block size * id */
    int32_t rowb[1] = {INT32_MAX};
    P(kva_dcp_slots(1, 0, 1, 65536, rowb, 1, 5, 1, slots));
    printf("slot %lld want %lld\n", (long long)slots[0], (long long)INT32_MAX * 65536 + 5);
    /* first_pos near 2^30 with interleave overflow */
    int32_t rowc[2] = {9, 11};
    P(kva_dcp_slots(3, 1, 1 << 29, 1 << 30, rowc, 2, (1 << 29) + 3, 2, slots));
    printf("slot %lld %lld want %lld %lld\n", (long long)slots[0], (long long)slots[1], 9LL * (1 << 30) + 3, 9LL * (1 << 30) + 4);

    /* reorder */
    int32_t ql[4] = {1, 5, 0, 2}, perm[4] = {-7, -7, -7, -7}, nd = -7;
    P(kva_batch_reorder_decode_first(-1, ql, 1, perm, &nd));
    P(kva_batch_reorder_decode_first(4, ql, -1, perm, &nd));
    printf("perm %d %d %d %d nd %d\n", perm[0], perm[1], perm[2], perm[3], nd);
    int32_t qn[2] = {1, -3};
    P(kva_batch_reorder_decode_first(2, qn, 1, perm, &nd));
    printf("perm %d %d nd %d\n", perm[0], perm[1], nd);
    P(kva_batch_reorder_decode_first(4, ql, INT32_MAX, perm, &nd));
    printf("perm %d %d %d %d nd %d\n", perm[0], perm[1], perm[2], perm[3], nd);

    /* merges */
    kva_context *ctx;
    kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0};
    P(kva_context_create(&cd, &ctx));
    enum { T = 2, H = 2, DV = 8 };
    float outs[3][T * H * DV], lses[3][T * H], out[T * H * DV], lo[T * H];
    for (int p = 0; p < 3; p++) { for (int i = 0; i < T * H * DV; i++) outs[p][i] = (float)(p + 1); for (int i = 0; i < T * H; i++) lses[p][i] = (float)p; }
    P(kva_merge_states_n(ctx, 0, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 257, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, -1, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, T * H * DV - 1, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, -1, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, T * H - 1, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, -5, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, INT64_MAX / 2, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, INT64_MAX / 2, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, INT64_MAX, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_I8, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, H, 7, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, 0, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, T, 4097, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states_n(ctx, 3, 0, H, DV, KVA_DTYPE_F32, NULL, 0, NULL, 0, NULL, NULL));
    P(kva_merge_states_n(ctx, 3, 0, H, 7, KVA_DTYPE_F32, NULL, 0, NULL, 0, NULL, NULL));
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, NULL));
    /* huge T * H * Dv: out-of-int32 part size */
    P(kva_merge_states_n(ctx, 1, INT32_MAX, 4096, 576, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    P(kva_merge_states(ctx, INT32_MAX, 4096, 576, KVA_DTYPE_F32, outs[0], lses[0], outs[1], lses[1], out, lo));
    /* lse +inf */
    for (int i = 0; i < T * H; i++) { lses[0][i] = INFINITY; lses[1][i] = 0; lses[2][i] = -INFINITY; }
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    printf("+inf: out %g lse %g\n", out[0], lo[0]);
    for (int i = 0; i < T * H; i++) { lses[0][i] = INFINITY; lses[1][i] = INFINITY; }
    P(kva_merge_states_n(ctx, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    printf("+inf x2: out %g lse %g\n", out[0], lo[0]);
    P(kva_merge_states(ctx, T, H, DV, KVA_DTYPE_F32, outs[0], lses[0], outs[1], lses[1], out, lo));
    printf("merge +inf x2: out %g lse %g\n", out[0], lo[0]);
    kva_context *rc;
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
    P(kva_context_create(&rd, &rc));
    P(kva_merge_states_n(rc, 3, T, H, DV, KVA_DTYPE_F32, outs, 0, (float *)lses, 0, out, lo));
    printf("ref +inf x2: out %g lse %g\n", out[0], lo[0]);

    /* convert */
    float cv[4] = {1, 2, 3, 4};
    P(kva_convert(cv, KVA_DTYPE_F32, cv, KVA_DTYPE_F32, 4));
    P(kva_convert(cv, KVA_DTYPE_F32, cv, KVA_DTYPE_F16, 4));
    P(kva_convert(cv, KVA_DTYPE_F32, (char *)cv + 2, KVA_DTYPE_F16, 4));
    P(kva_convert(cv, KVA_DTYPE_F32, cv, KVA_DTYPE_I8, 4));
    P(kva_convert(NULL, KVA_DTYPE_F32, NULL, KVA_DTYPE_F16, 0));
    P(kva_convert(cv, KVA_DTYPE_F32, cv, KVA_DTYPE_F32, SIZE_MAX));
    if (getenv("CONV")) P(kva_convert(cv, KVA_DTYPE_F32, (char*)cv + 8, KVA_DTYPE_F32, SIZE_MAX / 2));
    /* contexts */
    kva_context *c2 = (kva_context *)0x1;
    kva_context_desc bad = {KVA_BACKEND_CPU, -1, 0};
    P(kva_context_create(&bad, &c2)); printf("c2 %p\n", (void *)c2);
    bad.num_threads = KVA_MAX_THREADS + 1; P(kva_context_create(&bad, &c2));
    bad.num_threads = KVA_MAX_THREADS; P(kva_context_create(&bad, &c2)); kva_context_destroy(c2);
    bad.backend = (kva_backend)7; bad.num_threads = 1; P(kva_context_create(&bad, &c2));
    bad.backend = KVA_BACKEND_CUDA; P(kva_context_create(&bad, &c2));
    bad.backend = KVA_BACKEND_REF; bad.num_threads = -3; P(kva_context_create(&bad, &c2));
    bad.backend = KVA_BACKEND_REF; bad.num_threads = 99999; P(kva_context_create(&bad, &c2)); if (c2) { printf("ref threads %d\n", kva_context_num_threads(c2)); }
    P(kva_context_create(NULL, NULL));
    kva_context_destroy(ctx);
    kva_context_destroy(rc);
    return 0;
}
