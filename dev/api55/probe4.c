/* probe4: pool edges. */
#include "kvattn.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
static void stats(kva_pool *p) { kva_pool_stats s; kva_pool_get_stats(p, &s); printf("     stats used %d free %d cached %d req %d q %lld hit %lld; check %s\n", s.num_used_blocks, s.num_free_blocks, s.num_cached_blocks, s.num_requests, (long long)s.query_tokens, (long long)s.hit_tokens, kva_status_name(kva_pool_check(p))); }
int main(void)
{
    kva_pool *p = NULL;
    kva_pool_desc d = {1, 4, 0, 1};
    P(kva_pool_create(&d, &p));
    d.num_blocks = 2; d.block_size = 65537; P(kva_pool_create(&d, &p));
    d.block_size = 0; P(kva_pool_create(&d, &p));
    d.block_size = 65536; d.num_blocks = (1 << 30) + 1; P(kva_pool_create(&d, &p));
    d.num_blocks = 2; d.hash = 2; P(kva_pool_create(&d, &p));
    d.hash = 0; d.enable_prefix_caching = 2; P(kva_pool_create(&d, &p)); kva_pool_destroy(p); p = NULL;
    d.enable_prefix_caching = -1; P(kva_pool_create(&d, &p)); kva_pool_destroy(p); p = NULL;
    d.num_blocks = 9; d.block_size = 4; d.enable_prefix_caching = 1;
    P(kva_pool_create(&d, &p));
    int32_t prompt[20]; for (int i = 0; i < 20; i++) prompt[i] = 100 + i;
    int32_t id = -5, cached = -5;
    P(kva_pool_request_add(p, prompt, 0, NULL, 0, &id, &cached)); printf("     id %d cached %d\n", id, cached);
    P(kva_pool_request_add(p, prompt, -1, NULL, 0, &id, &cached));
    P(kva_pool_request_add(p, prompt, 5, NULL, 65537, &id, &cached));
    P(kva_pool_request_add(p, prompt, 5, NULL, 3, &id, &cached));
    P(kva_pool_request_add(p, prompt, 5, "x", 0, &id, &cached));
    P(kva_pool_request_add(p, prompt, 5, "abc", 3, &id, &id));
    P(kva_pool_request_add(p, prompt, 9, NULL, 0, &id, &cached)); printf("     id %d cached %d\n", id, cached);
    P(kva_pool_request_allocate(p, id, 9, 0)); stats(p);
    P(kva_pool_request_allocate(p, id, INT32_MAX, 0)); stats(p);
    P(kva_pool_request_allocate(p, id, INT32_MAX - 4, 10)); stats(p);
    P(kva_pool_request_allocate(p, id, -1, 0)); stats(p);
    P(kva_pool_request_allocate(p, id, 0, -1)); stats(p);
    P(kva_pool_request_allocate(p, 99, 1, 0));
    P(kva_pool_request_allocate(p, -1, 1, 0));
    P(kva_pool_request_append_tokens(p, id, prompt, 10)); stats(p); /* 10 > 9 allocated? allocation covers 12 */
    P(kva_pool_request_append_tokens(p, id, prompt, 3)); stats(p); /* 13 > 12 */
    P(kva_pool_request_append_tokens(p, id, prompt, -1));
    P(kva_pool_request_append_tokens(p, id, NULL, 1));
    P(kva_pool_request_append_tokens(p, id, NULL, 0));
    kva_pool_request_info in; P(kva_pool_request_get_info(p, id, &in)); printf("     tokens %d blocks %d cached %d\n", in.num_tokens, in.num_blocks, in.num_cached_tokens);
    int64_t sl[16]; for (int i = 0; i < 16; i++) sl[i] = -77;
    P(kva_pool_request_slots(p, id, -1, 2, sl));
    P(kva_pool_request_slots(p, id, 0, -1, sl));
    P(kva_pool_request_slots(p, id, 11, 2, sl)); printf("     sl %lld %lld\n", (long long)sl[0], (long long)sl[1]);
    P(kva_pool_request_slots(p, id, INT32_MAX, 2, sl));
    P(kva_pool_request_slots(p, id, 0, 0, NULL));
    P(kva_pool_request_slots(p, id, 0, 12, sl));
    int32_t row[8]; for (int i = 0; i < 8; i++) row[i] = -9; int32_t nbk = -9;
    P(kva_pool_request_block_table(p, id, row, -1, &nbk));
    P(kva_pool_request_block_table(p, id, row, 2, &nbk)); printf("     row %d %d %d nb %d\n", row[0], row[1], row[2], nbk);
    P(kva_pool_request_block_table(p, id, NULL, 0, &nbk)); printf("     nb %d\n", nbk);
    P(kva_pool_request_block_table(p, id, NULL, 3, &nbk));
    P(kva_pool_request_block_table(p, id, row, 8, NULL)); printf("     row"); for (int i = 0; i < 8; i++) printf(" %d", row[i]); printf("\n");
    P(kva_pool_request_drop_window(p, id, -1));
    P(kva_pool_request_drop_chunk(p, id, 0));
    P(kva_pool_request_drop_chunk(p, id, -4));
    P(kva_pool_request_drop_window(p, id, INT32_MAX)); stats(p);
    int32_t fid, cp[2] = {-9, -9};
    P(kva_pool_request_fork(p, id, &fid, cp)); printf("     fork %d copy %d %d\n", fid, cp[0], cp[1]); stats(p);
    P(kva_pool_request_fork(p, id, &fid, NULL));
    P(kva_pool_request_fork(p, 77, &fid, cp));
    P(kva_pool_request_drop_window(p, id, 0)); stats(p);
    P(kva_pool_request_block_table(p, id, row, 8, NULL)); printf("     row"); for (int i = 0; i < 8; i++) printf(" %d", row[i]); printf("\n");
    P(kva_pool_request_slots(p, id, 11, 1, sl)); printf("     sl %lld\n", (long long)sl[0]);
    P(kva_pool_request_slots(p, id, 12, 1, sl)); printf("     sl %lld\n", (long long)sl[0]);
    P(kva_pool_request_slots(p, id, 0, 1, sl));
    P(kva_pool_request_allocate(p, id, 1, 0)); stats(p);
    P(kva_pool_request_slots(p, id, 12, 1, sl)); printf("     sl %lld\n", (long long)sl[0]);
    P(kva_pool_request_drop_chunk(p, id, 5)); stats(p);
    P(kva_pool_reset_prefix_cache(p));
    P(kva_pool_request_free(p, id)); stats(p);
    P(kva_pool_request_free(p, id));
    P(kva_pool_request_free(p, fid)); stats(p);
    P(kva_pool_reset_prefix_cache(p)); stats(p);
    /* exhaustion: 8 usable blocks */
    int32_t a;
    P(kva_pool_request_add(p, prompt, 20, NULL, 0, &a, NULL));
    P(kva_pool_request_allocate(p, a, 20, 13)); stats(p);
    P(kva_pool_request_allocate(p, a, 20, 12)); stats(p);
    P(kva_pool_request_append_tokens(p, a, prompt, 20)); stats(p);
    int32_t b;
    P(kva_pool_request_add(p, prompt, 20, NULL, 0, &b, &cached)); printf("     cached %d\n", cached); stats(p);
    P(kva_pool_request_fork(p, a, &fid, cp)); printf("     fork %d copy %d %d\n", fid, cp[0], cp[1]); stats(p);
    P(kva_pool_request_fork(p, b, &fid, cp)); printf("     fork %d copy %d %d\n", fid, cp[0], cp[1]); stats(p);
    /* fork with 0 tokens */
    int32_t z;
    P(kva_pool_request_add(p, prompt + 3, 1, NULL, 0, &z, NULL));
    P(kva_pool_request_fork(p, z, &fid, cp)); printf("     fork %d copy %d %d\n", fid, cp[0], cp[1]); stats(p);
    kva_pool_destroy(p);
    /* B = 1 pool, prompt of 1 token */
    d.block_size = 1; d.num_blocks = 3; P(kva_pool_create(&d, &p));
    P(kva_pool_request_add(p, prompt, 1, NULL, 0, &a, &cached)); printf("     cached %d\n", cached);
    P(kva_pool_request_allocate(p, a, 1, 0));
    P(kva_pool_request_append_tokens(p, a, prompt, 1)); stats(p);
    P(kva_pool_request_add(p, prompt, 2, NULL, 0, &b, &cached)); printf("     cached %d\n", cached); stats(p);
    P(kva_pool_request_add(p, prompt, 1, NULL, 0, &b, &cached)); printf("     cached %d\n", cached); stats(p);
    kva_pool_destroy(p);
    return 0;
}
