/*
 * dcp_pos.cuh - the position trait of the CUDA mask code: where a row's
 * query and a key sit, so that causal masks, sliding windows and ALiBi use
 * GLOBAL positions in sharded (DCP) plans, as kva__row_keys / kva__key_pos
 * do on the host (internal.h).
 *
 * Unsharded (header word KVA_CUDA_HDR_DCP_N = 0): key j sits at position j;
 * query i of a request of s keys and q_len queries at s - q_len + i.
 * Sharded with masks (cuda_ctx.cu, dcp_accept): the header holds N, the rank
 * and the interleave I, meta.dcp_seq_lens the requests' global lengths S;
 * local key j sits at ((j / I) * N + rank) * I + j % I, query i at
 * S - q_len + i. Local keys grow with their global position, so the global
 * range a row sees is a contiguous range of local keys: the local keys
 * before its ends.
 */
#ifndef KVA_CUDA_DCP_POS_CUH
#define KVA_CUDA_DCP_POS_CUH

#include "cuda_backend.h"

#include <stdint.h>

/* The global position of local key j. */
static __device__ __forceinline__ int32_t kva__cuda_key_pos(const kva__cuda_meta &m, int32_t j)
{
    const int32_t n = m.hdr[KVA_CUDA_HDR_DCP_N];
    if (n <= 1)
        return j;
    const int32_t I = m.hdr[KVA_CUDA_HDR_DCP_I];
    return ((j / I) * n + m.hdr[KVA_CUDA_HDR_DCP_RANK]) * I + j % I;
}

/* Row i of request req (s local keys, q_len queries): the local keys
 * [lo, hi) its mask lets it see (before the work item's clamp) and its
 * position pos (ALiBi: slope * (key position - pos)). */
static __device__ __forceinline__ void kva__cuda_row_keys(const kva__cuda_meta &m, int causal,
                                                          int32_t window_left, int32_t req,
                                                          int32_t s, int32_t q_len, int32_t i,
                                                          int32_t &lo, int32_t &hi, int32_t &pos)
{
    const int32_t n = m.hdr[KVA_CUDA_HDR_DCP_N];
    const int32_t S = n > 1 ? m.dcp_seq_lens[req] : s;
    pos = S - q_len + i;
    hi = causal ? pos + 1 : S;
    lo = window_left >= 0 && pos - window_left > 0 ? pos - window_left : 0;
    if (n > 1) { /* global ends -> local keys before them (kva__dcp_local_count) */
        const int32_t I = m.hdr[KVA_CUDA_HDR_DCP_I], span = n * I;
        const int32_t off = m.hdr[KVA_CUDA_HDR_DCP_RANK] * I;
        int32_t rem = hi % span - off;
        hi = hi / span * I + (rem < 0 ? 0 : rem > I ? I : rem);
        rem = lo % span - off;
        lo = lo / span * I + (rem < 0 ? 0 : rem > I ? I : rem);
    }
}

#endif /* KVA_CUDA_DCP_POS_CUH */
