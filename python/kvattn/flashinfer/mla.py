"""kvattn's flashinfer.mla: BatchMLAPagedAttentionWrapper and
trtllm_batch_decode_with_kv_cache_mla, the same objects as kvattn.flashinfer's
and kvattn.flashinfer.decode's (as in FlashInfer 0.7.2)."""

from . import BatchMLAPagedAttentionWrapper  # noqa: F401
from ._functions import trtllm_batch_decode_with_kv_cache_mla  # noqa: F401
