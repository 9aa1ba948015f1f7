"""kvattn's flashinfer.page: get_seq_lens (FlashInfer 0.7.2's page helpers
append_paged_kv_cache and get_batch_indices_positions are not provided)."""

from ._functions import get_seq_lens  # noqa: F401
