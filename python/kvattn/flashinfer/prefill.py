"""kvattn's flashinfer.prefill: the names FlashInfer 0.7.2's flashinfer.prefill
holds that kvattn provides, the same objects as kvattn.flashinfer's."""

from . import (  # noqa: F401
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    get_alibi_slopes,
)
from ._functions import get_seq_lens  # noqa: F401
