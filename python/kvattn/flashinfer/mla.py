"""kvattn's flashinfer.mla: BatchMLAPagedAttentionWrapper, the same object as
kvattn.flashinfer's (FlashInfer 0.7.2's trtllm_batch_decode_with_kv_cache_mla
is not provided: docs/python.md)."""

from . import BatchMLAPagedAttentionWrapper  # noqa: F401
