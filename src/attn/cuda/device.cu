/* device.cu - CUDA runtime probing for the CUDA backend (C-style CUDA). */
extern "C" {
#include "internal.h"
}

#include <cuda_runtime.h>

/* Number of CUDA devices visible; 0 when there is no driver or no GPU. */
extern "C" int kva__cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}
