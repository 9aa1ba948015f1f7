/*
 * quant_loader_off.c - kva_c8_scales_load in a build without cJSON (CMake
 * KVA_WITH_CJSON=OFF): the call is refused with KVA_STATUS_UNSUPPORTED, so
 * the core library links without libcjson. quant_loader.c is the real loader.
 */
#include "internal.h"

#include <stdlib.h>

#ifndef KVA_HAVE_CJSON
kva_status kva_c8_scales_load(const char *checkpoint_dir, int32_t layer, int32_t num_kv_heads_total,
                              int32_t head_dim, int32_t tp_rank, int32_t tp_size,
                              kva_c8_scales **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(checkpoint_dir);
    KVA_CHECK_PTR(out);
    (void)layer;
    (void)num_kv_heads_total;
    (void)head_dim;
    (void)tp_rank;
    (void)tp_size;
    return kva__fail(KVA_STATUS_UNSUPPORTED,
                     "kva_c8_scales_load: this build of kvattn has no checkpoint loader (it was "
                     "configured with KVA_WITH_CJSON=OFF); load the scales yourself and pass "
                     "them to kva_cache_create_quant");
}

void kva_c8_scales_free(kva_c8_scales *scales)
{
    if (!scales)
        return;
    free(scales->data);
    free(scales);
}
#endif
