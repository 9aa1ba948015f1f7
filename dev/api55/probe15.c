/* probe15: the pool's extra key separates cache entries; its length limit; both hashes. */
#include "kvattn.h"
#include <stdio.h>
#include <stdlib.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-24s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    static char key[65537];
    for (int i = 0; i < 65537; i++) key[i] = (char)(i * 7);
    for (int h = 0; h < 2; h++) {
        kva_pool *p; kva_pool_desc d = {32, 4, (kva_pool_hash)h, 1};
        P(kva_pool_create(&d, &p));
        int32_t prompt[13]; for (int i = 0; i < 13; i++) prompt[i] = 1000 + i;
        int32_t a, b, cached;
        P(kva_pool_request_add(p, prompt, 13, key, 65536, &a, &cached));
        P(kva_pool_request_allocate(p, a, 13, 0));
        P(kva_pool_request_append_tokens(p, a, prompt, 13));
        P(kva_pool_request_add(p, prompt, 13, key, 65536, &b, &cached)); printf("   same key: cached %d (want 12)\n", cached);
        P(kva_pool_request_add(p, prompt, 13, key, 65535, &b, &cached)); printf("   key prefix: cached %d (want 0)\n", cached);
        P(kva_pool_request_add(p, prompt, 13, key + 1, 65536, &b, &cached)); printf("   other key: cached %d (want 0)\n", cached);
        P(kva_pool_request_add(p, prompt, 13, NULL, 0, &b, &cached)); printf("   no key: cached %d (want 0)\n", cached);
        P(kva_pool_request_add(p, prompt, 13, key, 65537, &b, &cached));
        /* prompt ending exactly at a block: hit capped */
        P(kva_pool_request_add(p, prompt, 12, key, 65536, &b, &cached)); printf("   12-token prompt: cached %d (want 8)\n", cached);
        P(kva_pool_check(p));
        kva_pool_destroy(p);
    }
    return 0;
}
