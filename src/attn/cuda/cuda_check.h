/*
 * cuda_check.h - runtime-call checking for the CUDA backend's .cu files.
 * KVA_CUDA_TRY(call) returns KVA_STATUS_DEVICE_ERROR naming the call and the
 * runtime's message; KVA_CUDA_LAUNCHED() checks the last launch.
 */
#ifndef KVA_CUDA_CHECK_H
#define KVA_CUDA_CHECK_H

#include <cuda_runtime.h>

#define KVA_CUDA_TRY(call)                                                                         \
    do {                                                                                           \
        cudaError_t kva_cuda_e_ = (call);                                                          \
        if (kva_cuda_e_ != cudaSuccess)                                                            \
            return kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: %s failed: %s (%s)", __func__, #call,   \
                             cudaGetErrorName(kva_cuda_e_), cudaGetErrorString(kva_cuda_e_));      \
    } while (0)

#define KVA_CUDA_LAUNCHED(name)                                                                    \
    do {                                                                                           \
        cudaError_t kva_cuda_e_ = cudaGetLastError();                                              \
        if (kva_cuda_e_ != cudaSuccess)                                                            \
            return kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: launch of %s failed: %s (%s)",          \
                             __func__, name, cudaGetErrorName(kva_cuda_e_),                        \
                             cudaGetErrorString(kva_cuda_e_));                                     \
    } while (0)

#endif /* KVA_CUDA_CHECK_H */
