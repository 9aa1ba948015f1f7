/* status.c - status names, descriptions and the thread-local error message. */
#include "internal.h"

#include <stdio.h>

#define KVA_ERROR_CAPACITY 512

/* Thread-local so that concurrent contexts report their own failures. */
static _Thread_local char kva_error_message[KVA_ERROR_CAPACITY];

const char *kva_status_name(kva_status status)
{
    switch (status) {
#define KVA_X_(name, desc)                                                                         \
    case KVA_STATUS_##name:                                                                        \
        return "KVA_STATUS_" #name;
        KVA_STATUS_LIST(KVA_X_)
#undef KVA_X_
    default:
        return "KVA_STATUS_UNKNOWN";
    }
}

const char *kva_status_string(kva_status status)
{
    switch (status) {
#define KVA_X_(name, desc)                                                                         \
    case KVA_STATUS_##name:                                                                        \
        return desc;
        KVA_STATUS_LIST(KVA_X_)
#undef KVA_X_
    default:
        return "unknown status code";
    }
}

const char *kva_last_error(void)
{
    return kva_error_message;
}

void kva__clear_error(void)
{
    kva_error_message[0] = '\0';
}

kva_status kva__fail(kva_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kva_error_message, sizeof kva_error_message, fmt, ap);
    va_end(ap);
    return status;
}

const char *kva_version(void)
{
    return KVA_VERSION_STRING;
}
