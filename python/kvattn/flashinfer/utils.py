"""kvattn's flashinfer.utils: get_alibi_slopes, the same object as
kvattn.flashinfer's."""

from . import get_alibi_slopes  # noqa: F401
