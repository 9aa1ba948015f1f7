"""Black-box round eleven (session 41, api48) of the Python package: promises
found untested. Cache.write's "heads and channels of a token must be
contiguous" for a single token (main checked it only for two or more tokens
and wrote a strided single token's wrong elements), and Pool.block_table's
row of a given length (row_len 0 returned an empty, truncated row where any
other short length raises)."""

import numpy as np
import pytest

import kvattn
from poison import fill, untouched


def _cache(ctx, hkv=2, d=8, nb=4, b=2):
    c = kvattn.Cache(ctx, nb, b, hkv, d, dtype="f32")
    fill(c.k_array())
    fill(c.v_array())
    return c


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("which", ["channels", "heads"])
def test_write_noncontiguous_token_rows_refused(n, which):
    """A token row whose channels (every other element) or heads (every other
    head) are not contiguous is refused for any token count, and the cache
    keeps its poison: kva_cache_write would read the row's Hkv * D elements
    contiguously."""
    ctx = kvattn.Context("cpu", 1)
    c = _cache(ctx)
    rng = np.random.default_rng(11 + n)
    if which == "channels":
        k = rng.standard_normal((n, 2, 16)).astype(np.float32)[:, :, ::2]
    else:
        k = rng.standard_normal((n, 4, 8)).astype(np.float32)[:, ::2]
    v = np.ascontiguousarray(k)
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        c.write(k, v, np.arange(n, dtype=np.int64))
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        c.write(v, k, np.arange(n, dtype=np.int64))
    assert untouched(c.k_array()) and untouched(c.v_array())


@pytest.mark.parametrize("n", [1, 3])
def test_write_fused_qkv_slices(n):
    """The allowed strided form: k and v as slices of a fused QKV row
    [n, (H + 2 Hkv) * D] (token-strided, each token's heads contiguous),
    written at the right slots, one token or several."""
    ctx = kvattn.Context("cpu", 1)
    c = _cache(ctx)
    h, hkv, d = 4, 2, 8
    qkv = np.random.default_rng(7).standard_normal((n, (h + 2 * hkv) * d)).astype(np.float32)
    k = qkv[:, h * d:(h + hkv) * d].reshape(n, hkv, d)
    v = qkv[:, (h + hkv) * d:].reshape(n, hkv, d)
    slots = np.array([5, 0, 3][:n], np.int64)
    c.write(k, v, slots)
    ka, va = c.k_array().reshape(-1, hkv, d), c.v_array().reshape(-1, hkv, d)
    np.testing.assert_array_equal(ka[slots], k)
    np.testing.assert_array_equal(va[slots], v)
    others = np.setdiff1d(np.arange(ka.shape[0]), slots)
    assert untouched(ka[others]) and untouched(va[others])


def test_pool_block_table_short_row():
    """A row shorter than the request's blocks raises OutOfRangeError for every
    given length, 0 included (the C call takes row_len 0 as a query of the
    count only); a long row is 0-padded; the default is the request's own."""
    p = kvattn.Pool(16, 4)
    rid, _ = p.add_request(list(range(1, 10)))
    p.allocate(rid, 9)
    n = p.request_info(rid)["num_blocks"]
    assert n == 3
    for row_len in (0, 1, n - 1):
        with pytest.raises(kvattn.OutOfRangeError, match="row_len"):
            p.block_table(rid, row_len)
    row = p.block_table(rid)
    assert row.shape == (n,) and (row > 0).all()
    long = p.block_table(rid, n + 2)
    np.testing.assert_array_equal(long[:n], row)
    assert (long[n:] == 0).all()
    # A request without blocks: row_len 0 is its whole row.
    rid2, _ = p.add_request([1])
    assert p.block_table(rid2, 0).shape == (0,)
    assert p.block_table(rid2).shape == (0,)
