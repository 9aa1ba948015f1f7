/* ref_ops.c - the reference backend's operation table. */
#include "internal.h"

const kva__backend_ops kva__ref_ops = {
    .name = "ref",
};
