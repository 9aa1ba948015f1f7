"""kvattn's flashinfer.decode: the names FlashInfer 0.7.2's flashinfer.decode
holds that kvattn provides, the same objects as kvattn.flashinfer's."""

from . import BatchDecodeWithPagedKVCacheWrapper, get_alibi_slopes  # noqa: F401
from ._functions import (  # noqa: F401
    fast_decode_plan,
    get_seq_lens,
    trtllm_batch_decode_with_kv_cache,
    trtllm_batch_decode_with_kv_cache_mla,
)
