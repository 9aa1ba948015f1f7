/*
 * dcp_nccl_nop.cu - an empty kernel for dcp_nccl_bench's floor of a combine
 * built as kernels around NCCL collectives: the bare collectives with an
 * empty kernel in each place where the combine runs one (its launch and the
 * dependency waits, no work).
 */
#include <cuda_runtime.h>

__global__ void dcp_bench_nop_kernel(void) {}

/* One empty kernel of one 256-thread CTA on s (the combine's kernels use
 * 256-thread CTAs; at decode sizes a few of them). */
extern "C" cudaError_t dcp_bench_nop(cudaStream_t s)
{
    dcp_bench_nop_kernel<<<1, 256, 0, s>>>();
    return cudaGetLastError();
}
