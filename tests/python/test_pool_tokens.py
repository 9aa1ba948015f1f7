"""Pool's token arguments: a 1-D sequence of ids, nothing flattened."""

import numpy as np
import pytest

import kvattn
from features import need_hash


def test_pool_tokens_must_be_1d():
    """Pool.add_request / append_tokens take a 1-D sequence of token ids: a
    2-D [B, T] batch (or a 0-D scalar) is refused with ShapeMismatchError and
    changes nothing, instead of being flattened into one request's B*T
    tokens."""
    need_hash()
    p = kvattn.Pool(num_blocks=16, block_size=4)
    with pytest.raises(kvattn.ShapeMismatchError, match="1-D"):
        p.add_request([[1, 2, 3, 4], [5, 6, 7, 8]])
    with pytest.raises(kvattn.ShapeMismatchError, match="1-D"):
        p.add_request(np.int32(5))
    rid, cached = p.add_request([1, 2, 3, 4, 5])
    assert (rid, cached) == (0, 0)  # the refused calls added no request
    p.allocate(rid, 5)
    with pytest.raises(kvattn.ShapeMismatchError, match="1-D"):
        p.append_tokens(rid, np.array([[1, 2, 3, 4, 5]]))
    p.append_tokens(rid, [1, 2, 3, 4, 5])
    assert p.add_request([1, 2, 3, 4, 5])[1] == 4  # one full block was appended, once
