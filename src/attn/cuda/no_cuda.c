/* no_cuda.c - stands in for the CUDA sources when the build has no nvcc. */
#include "internal.h"

int kva__cuda_device_count(void)
{
    return 0;
}
