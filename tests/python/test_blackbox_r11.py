"""Black-box round eleven (session 41, api48) of the Python package: promises
found untested. Cache.write's "heads and channels of a token must be
contiguous" for a single token (main checked it only for two or more tokens
and wrote a strided single token's wrong elements), and Pool.block_table's
row of a given length (row_len 0 returned an empty, truncated row where any
other short length raises)."""

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from features import need_hash
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
    need_hash()
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


def _decode_setup(rng, layout="NHD"):
    page, hkv, h, d, nb = 4, 1, 2, 8, 6
    shape = (nb, page, hkv, d) if layout == "NHD" else (nb, hkv, page, d)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
    w.plan(np.array([0, 2, 4], np.int32), np.array([0, 1, 2, 3], np.int32),
           np.array([3, 4], np.int32), h, hkv, d, page, q_data_type="float32")
    q = rng.standard_normal((2, h, d)).astype(np.float32)
    return w, q, k, v


@pytest.mark.parametrize("form", ["pair", "5d"])
def test_fi_strided_out_inside_cache_refused(form):
    """A strided out (token / head strides, dense rows: FlashInfer writes it
    through its strides, kvattn stages it) inside the paged cache's storage
    is refused as a contiguous one is (kvattn.h, Aliasing), and the cache is
    unchanged: main staged it, ran, and copied the result over the cache's
    pages."""
    rng = np.random.default_rng(21)
    w, q, k, v = _decode_setup(rng)
    kv = (k, v) if form == "pair" else np.stack([k, v], axis=1)
    kk = kv[0] if form == "pair" else kv[:, 0]
    before = np.array(kv[0] if form == "pair" else kv, copy=True)
    for out in (kk[4:6].reshape(2, 2, 16)[:, :, :8],    # strided, in K's last blocks
                kk[4].reshape(-1)[:32].reshape(2, 2, 8)):  # contiguous (C's own check)
        with pytest.raises(kvattn.InvalidArgumentError, match="overlaps"):
            w.run(q, kv, out=out)
        np.testing.assert_array_equal(kv[0] if form == "pair" else kv, before)


@pytest.mark.parametrize("staged", ["out", "lse", "both"])
def test_fi_out_lse_overlap_refused(staged):
    """out and lse overlapping each other are refused when either is staged
    (strided): kvattn then sees temporaries and the copies back would write
    one over the other. Nothing is written to the shared buffer."""
    rng = np.random.default_rng(22)
    w, q, k, v = _decode_setup(rng)
    buf = np.empty(256, np.float32)
    fill(buf)
    if staged in ("out", "both"):
        out = buf[:64].reshape(2, 2, 16)[:, :, :8]
    else:
        out = buf[:32].reshape(2, 2, 8)
    lse = buf[4:12].reshape(2, 4)[:, :2] if staged in ("lse", "both") else buf[4:8].reshape(2, 2)
    with pytest.raises(kvattn.InvalidArgumentError, match="overlap"):
        w.run(q, (k, v), out=out, lse=lse, return_lse=True)
    assert untouched(buf)


def test_fi_strided_outputs_beside_inputs_run():
    """The allowed form: strided out and lse that overlap nothing are written
    through their strides with the values of a plain run (a check that the
    new refusals above refuse only overlaps)."""
    rng = np.random.default_rng(23)
    w, q, k, v = _decode_setup(rng)
    ro, rl = w.run(q, (k, v), return_lse=True)
    buf = np.empty(256, np.float32)
    fill(buf)
    out = buf[:64].reshape(2, 2, 16)[:, :, :8]
    lse = buf[64:72].reshape(2, 4)[:, :2]
    o, l = w.run(q, (k, v), out=out, lse=lse, return_lse=True)
    np.testing.assert_array_equal(out, ro)
    np.testing.assert_array_equal(lse, rl)
    assert untouched(buf[:64].reshape(2, 2, 16)[:, :, 8:]) and untouched(buf[72:])


def test_fi_mla_strided_out_inside_latent_cache_refused():
    """The MLA wrapper: a strided out inside the latent cache (the ckv_cache /
    kpe_cache views of one [NP, B, Dc + Dr] tensor) is refused and the cache
    unchanged."""
    rng = np.random.default_rng(24)
    h, dc, dr, page = 2, 16, 8, 4
    kv = rng.standard_normal((4, page, dc + dr)).astype(np.float32)
    ckv, kpe = kv[..., :dc], kv[..., dc:]
    w = fi.BatchMLAPagedAttentionWrapper(None)
    w.plan(np.array([0, 1], np.int32), np.array([0, 2], np.int32),
           np.array([0, 1], np.int32), np.array([6], np.int32), h, dc, dr, page, False,
           1.0 / np.sqrt(dc + dr), np.float32, np.float32)
    q_nope = rng.standard_normal((1, h, dc)).astype(np.float32)
    q_pe = rng.standard_normal((1, h, dr)).astype(np.float32)
    before = kv.copy()
    out = kv[3].reshape(-1)[:64].reshape(1, h, 32)[:, :, :dc]  # head stride 32
    with pytest.raises(kvattn.InvalidArgumentError, match="overlaps"):
        w.run(q_nope, q_pe, ckv, kpe, out=out)
    np.testing.assert_array_equal(kv, before)


def test_fi_contiguous_out_over_strided_q_refused():
    """A strided q (a slice of a fused qkv row, which the wrapper packs into a
    copy) and a contiguous out that covers its bytes: refused, as for a
    contiguous q (kvattn's own check sees only the copy); q unchanged."""
    rng = np.random.default_rng(25)
    w, q, k, v = _decode_setup(rng)
    qkv = np.zeros((2, 2, 16), np.float32)
    qkv[:, :, :8] = q
    qs = qkv[:, :, :8]
    before = qkv.copy()
    with pytest.raises(kvattn.InvalidArgumentError, match="overlaps the input q"):
        w.run(qs, (k, v), out=qkv.reshape(-1)[8:40].reshape(2, 2, 8))
    np.testing.assert_array_equal(qkv, before)
    # Beside it: runs, the plain run's values.
    out = np.empty((2, 2, 8), np.float32)
    np.testing.assert_array_equal(w.run(qs, (k, v), out=out), w.run(q, (k, v)))
