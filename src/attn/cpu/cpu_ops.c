/* cpu_ops.c - the CPU backend's operation table. */
#include "internal.h"

const kva__backend_ops kva__cpu_ops = {
    .name = "cpu",
};
