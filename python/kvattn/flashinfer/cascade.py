"""kvattn's flashinfer.cascade: the names FlashInfer 0.7.2's flashinfer.cascade
holds that kvattn provides, the same objects as kvattn.flashinfer's."""

from . import (  # noqa: F401
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
