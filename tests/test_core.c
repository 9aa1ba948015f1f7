/* test_core.c - status codes, error messages, contexts. */
#include "harness.h"

static void test_status_names(void)
{
    CHECK(strcmp(kva_status_name(KVA_STATUS_OK), "KVA_STATUS_OK") == 0);
    CHECK(strcmp(kva_status_name(KVA_STATUS_NULL_POINTER), "KVA_STATUS_NULL_POINTER") == 0);
    CHECK(strcmp(kva_status_name((kva_status)999), "KVA_STATUS_UNKNOWN") == 0);
    for (int s = 0; s < KVA_STATUS_COUNT_; s++) {
        CHECK(strncmp(kva_status_name((kva_status)s), "KVA_STATUS_", 11) == 0);
        CHECK(strlen(kva_status_string((kva_status)s)) > 0);
    }
}

static void test_context(void)
{
    kva_context *ctx = NULL;
    CHECK_STATUS(kva_context_create(NULL, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    CHECK_OK(kva_context_create(NULL, &ctx));
    CHECK(ctx != NULL);
    CHECK(kva_context_backend(ctx) == KVA_BACKEND_CPU);
    CHECK(kva_context_num_threads(ctx) >= 1);
    CHECK(strcmp(kva_last_error(), "") == 0);
    kva_context_destroy(ctx);

    kva_context_desc d = {KVA_BACKEND_REF, 0, 0};
    CHECK_OK(kva_context_create(&d, &ctx));
    CHECK(kva_context_num_threads(ctx) == 1);
    kva_context_destroy(ctx);

    d.backend = (kva_backend)42;
    ctx = NULL;
    CHECK_STATUS(kva_context_create(&d, &ctx), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(ctx == NULL);
    CHECK_ERROR_MENTIONS("backend");
    d.backend = KVA_BACKEND_CPU;
    d.num_threads = -3;
    CHECK_STATUS(kva_context_create(&d, &ctx), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_threads");
    CHECK(ctx == NULL);
    d.num_threads = KVA_MAX_THREADS + 1; /* would make the OpenMP runtime exit the process */
    CHECK_STATUS(kva_context_create(&d, &ctx), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_threads = 1025");
    CHECK(ctx == NULL);
    kva_context_destroy(NULL);
}

int main(void)
{
    RUN(test_status_names);
    RUN(test_context);
    return kva_test_finish();
}
