/* dev/qd38/one.cu - one instantiation of the quantized tensor-core decode
 * (decode_mma_quant.cuh) for static SASS counts on a machine without a GPU:
 * QD_FMT (0 int8, 1 fp8, 2 int8 K + 16-bit V) and QD_D, bf16 q, plain
 * schedule (as dm_pick_d). Built by dev/qd38/sass.sh. */
#include "decode_mma_quant.cuh"

#ifndef QD_FMT
#define QD_FMT 0
#endif
#ifndef QD_D
#define QD_D 128
#endif
template __global__ void decode_mma_kernel<qm_load<QD_FMT, __nv_bfloat16, QD_D>, false>(
    const kva__cuda_quant_mma_args);
