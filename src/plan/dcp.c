/*
 * dcp.c - the host helpers of decode context parallelism (DCP, docs/dcp.md):
 * which tokens of a request a rank holds and where it writes them.
 *
 * Token i of a request lives on rank (i / I) mod N; the rank's local token k
 * is its k-th token in position order, and local tokens fill the rank's
 * block-table row as any request's tokens fill an unsharded one. The plan
 * uses the same position maps (kva__dcp_local_count, kva__key_pos in
 * internal.h) for its masks.
 */
#include "internal.h"

/* Checks and resolves the DCP triple as kva_plan_create does (0 means 1) into
 * the fields of *d. fn names the caller. */
static kva_status resolve(const char *fn, int32_t size, int32_t rank, int32_t interleave,
                          kva_plan_desc *d)
{
    if (size < 0 || size > KVA_MAX_DCP)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: dcp_size = %d is outside [0, %d] (0 or 1 = unsharded)", fn, (int)size,
                         KVA_MAX_DCP);
    if (size < 1)
        size = 1;
    if (rank < 0 || rank >= size)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: dcp_rank = %d is outside [0, %d)", fn,
                         (int)rank, (int)size);
    if (interleave < 0 || interleave > KVA_MAX_SEQ_LEN)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: dcp_interleave = %d is outside [0, %d] (0 means 1)", fn,
                         (int)interleave, KVA_MAX_SEQ_LEN);
    d->dcp_size = size;
    d->dcp_rank = rank;
    d->dcp_interleave = interleave < 1 || size == 1 ? 1 : interleave;
    return KVA_STATUS_OK;
}

kva_status kva_dcp_local_lens(int32_t num_requests, const int32_t *seq_lens, int32_t dcp_size,
                              int32_t dcp_rank, int32_t dcp_interleave, int32_t *local_lens)
{
    kva__clear_error();
    kva_plan_desc d = {0};
    KVA_TRY(resolve(__func__, dcp_size, dcp_rank, dcp_interleave, &d));
    if (num_requests < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: num_requests = %d is negative", __func__,
                         (int)num_requests);
    if (num_requests == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(seq_lens);
    KVA_CHECK_PTR(local_lens);
    /* In place (local_lens == seq_lens) is fine: entry r is read, then
     * written; any other overlap would read entries already written. */
    const size_t rb = (size_t)num_requests * sizeof(int32_t);
    const kva__span out = {"local_lens", local_lens, rb, 0, 0};
    const kva__span in = {"seq_lens", seq_lens == local_lens ? NULL : seq_lens, rb, 0, 0};
    KVA_TRY(kva__check_disjoint(__func__, &out, 1, &in, 1));
    for (int32_t r = 0; r < num_requests; r++)
        if (seq_lens[r] < 0 || seq_lens[r] > KVA_MAX_SEQ_LEN)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE, "%s: seq_lens[%d] = %d is outside [0, %d]",
                             __func__, (int)r, (int)seq_lens[r], KVA_MAX_SEQ_LEN);
    for (int32_t r = 0; r < num_requests; r++)
        local_lens[r] = (int32_t)kva__dcp_local_count(&d, seq_lens[r]);
    return KVA_STATUS_OK;
}

/* The rank of global position i. */
static int32_t owner(const kva_plan_desc *d, int64_t i)
{
    return (int32_t)((i / d->dcp_interleave) % d->dcp_size);
}

kva_status kva_dcp_slots(int32_t dcp_size, int32_t dcp_rank, int32_t dcp_interleave,
                         int32_t block_size, const int32_t *block_table_row, int32_t row_len,
                         int32_t first_pos, int32_t count, int64_t *slots)
{
    kva__clear_error();
    kva_plan_desc d = {0};
    KVA_TRY(resolve(__func__, dcp_size, dcp_rank, dcp_interleave, &d));
    if (block_size < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: block_size = %d, must be >= 1", __func__,
                         (int)block_size);
    if (row_len < 0 || count < 0 || first_pos < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: row_len = %d, first_pos = %d, count = %d: none may be negative",
                         __func__, (int)row_len, (int)first_pos, (int)count);
    if ((int64_t)first_pos + count > KVA_MAX_SEQ_LEN)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                         "%s: first_pos + count = %lld is above KVA_MAX_SEQ_LEN = %d", __func__,
                         (long long)first_pos + count, KVA_MAX_SEQ_LEN);
    if (count == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(slots);
    if (row_len > 0)
        KVA_CHECK_PTR(block_table_row);
    const kva__span out = {"slots", slots, (size_t)count * sizeof(int64_t), 0, 0};
    const kva__span in = {"block_table_row", block_table_row, (size_t)row_len * sizeof(int32_t), 0,
                          0};
    KVA_TRY(kva__check_disjoint(__func__, &out, 1, &in, 1));
    /* Check every block the rank's tokens need before writing anything. */
    for (int64_t i = first_pos; i < (int64_t)first_pos + count; i++) {
        if (owner(&d, i) != d.dcp_rank)
            continue;
        const int64_t b = kva__dcp_local_count(&d, i) / block_size;
        if (b >= row_len || block_table_row[b] < 0)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: position %lld is local token %lld of rank %d, in block-table "
                             "entry %lld, but row_len = %d%s",
                             __func__, (long long)i, (long long)kva__dcp_local_count(&d, i),
                             (int)d.dcp_rank, (long long)b, (int)row_len,
                             b < row_len ? " and the entry is negative" : "");
    }
    for (int64_t i = first_pos; i < (int64_t)first_pos + count; i++) {
        int64_t slot = -1;
        if (owner(&d, i) == d.dcp_rank) {
            const int64_t k = kva__dcp_local_count(&d, i);
            slot = (int64_t)block_table_row[k / block_size] * block_size + k % block_size;
        }
        slots[i - first_pos] = slot;
    }
    return KVA_STATUS_OK;
}
