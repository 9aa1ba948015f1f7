"""kvattn.flashinfer against the numpy reference on a randomized grid
(FlashInfer's tolerance: rtol = atol = 1e-3 for f16 against an f32/f64
reference), LSE in base 2, and bad inputs raising exceptions."""

import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from reference import attention

LOG2E = 1.0 / math.log(2.0)


def random_paged(rng, kv_lens, page_size, hkv, d, layout, dtype, five_d, spare=2):
    """A paged cache filled with random K/V and FlashInfer's CSR page table."""
    npages = [max(1, -(-s // page_size)) for s in kv_lens]
    nb = sum(npages) + spare
    perm = rng.permutation(nb).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    indices = perm[: indptr[-1]]
    last = np.array([s - (n - 1) * page_size for s, n in zip(kv_lens, npages)], np.int32)
    inner = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
    if five_d:
        kv = rng.standard_normal((nb, 2) + inner).astype(dtype)
        k_cache, v_cache, paged = kv[:, 0], kv[:, 1], kv
    else:
        k_cache = rng.standard_normal((nb,) + inner).astype(dtype)
        v_cache = rng.standard_normal((nb,) + inner).astype(dtype)
        paged = (k_cache, v_cache)
    keys, values = [], []
    for r, s in enumerate(kv_lens):
        pages = indices[indptr[r]: indptr[r + 1]]
        kk, vv = k_cache[pages], v_cache[pages]
        if layout == "HND":
            kk, vv = kk.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
        keys.append(kk.reshape(-1, hkv, d)[:s])
        values.append(vv.reshape(-1, hkv, d)[:s])
    return paged, indptr, indices, last, keys, values


def grid(seed, n):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        c = dict(
            layout=rng.choice(["NHD", "HND"]),
            dtype=rng.choice([np.float16, np.float32]),
            page_size=int(rng.choice([1, 3, 16])),
            heads=[(4, 4), (8, 2), (6, 1), (4, 1)][rng.integers(4)],
            d=int(rng.choice([32, 64, 128])),
            window_left=int(rng.choice([-1, -1, 5, 40])),
            soft_cap=rng.choice([None, 30.0]),
            sm_scale=rng.choice([None, 0.11]),
            five_d=bool(rng.integers(2)),
            alibi=bool(rng.integers(4) == 0),
        )
        if c["alibi"]:  # ALiBi with a soft-cap is refused (test_alibi_with_soft_cap_raises)
            c["soft_cap"] = None
        yield rng, c


def alibi_gap(q_lens, kv_lens, alibi):
    """[T, H]: FlashInfer's ALiBi LSE minus kvattn's (natural log): its bias
    counts key and query from the request's start, slope * (j - i), kvattn's
    from the query's position, slope * (j - (kv_len - q_len + i))."""
    if alibi is None:
        return 0.0
    rows = np.repeat(np.asarray(kv_lens) - np.asarray(q_lens), q_lens)
    return rows[:, None] * np.asarray(alibi, np.float64)[None, :]


def flashinfer_alibi_attention(q, keys, values, q_lens, slopes, causal=True, scale=None):
    """FlashInfer's ALiBi as its DefaultAttention computes it, in float64:
    logit = scale * q.k + slope * (kv_idx - qo_idx) with kv_idx, qo_idx
    counted from the request's first key and query (decode: qo_idx 0), the
    causal mask bottom-right. Returns out and the base-2 LSE FlashInfer
    returns."""
    q = np.asarray(q, np.float64)
    t_all, h, d = q.shape
    scale = scale or 1.0 / math.sqrt(d)
    out = np.zeros((t_all, h, values[0].shape[2]))
    lse2 = np.zeros((t_all, h))
    t0 = 0
    for r, ql in enumerate(q_lens):
        k, v = np.asarray(keys[r], np.float64), np.asarray(values[r], np.float64)
        s, group = k.shape[0], h // k.shape[1]
        for qo_idx in range(ql):
            kv_idx = np.arange(s)
            vis = kv_idx <= s - ql + qo_idx if causal else np.ones(s, bool)
            for hh in range(h):
                logit = scale * (k[:, hh // group] @ q[t0 + qo_idx, hh]) + \
                    slopes[hh] * (kv_idx - qo_idx)
                logit = logit[vis]
                m = logit.max()
                e = np.exp(logit - m)
                out[t0 + qo_idx, hh] = (e / e.sum()) @ v[vis, hh // group]
                lse2[t0 + qo_idx, hh] = (m + np.log(e.sum())) * LOG2E
        t0 += ql
    return out, lse2


def test_alibi_lse_matches_flashinfer():
    """With ALiBi the wrappers return FlashInfer's LSE (its bias is larger
    than kvattn's by slope * (kv_len - q_len) per row), outputs as before."""
    rng = np.random.default_rng(21)
    slopes = fi.get_alibi_slopes(4).astype(np.float64)
    kv_lens = [30, 50, 7]
    paged, indptr, indices, last, keys, values = random_paged(
        rng, kv_lens, 8, 2, 32, "NHD", np.float32, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 32, 8, pos_encoding_mode="ALIBI",
           q_data_type="float32")
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    out, lse = w.run(q, paged, return_lse=True)
    fo, fl = flashinfer_alibi_attention(q, keys, values, [1, 1, 1], slopes)
    np.testing.assert_allclose(out, fo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, fl, rtol=1e-5, atol=1e-4)
    # kvattn's own LSE differs by slope * (kv_len - 1): the check can fail.
    _, kl = attention(q, keys, values, [1, 1, 1], causal=True, alibi=slopes)
    assert np.abs(kl * LOG2E - fl).max() > 1.0

    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    q_lens = [3, 4, 7]
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    p.plan(qo, indptr, indices, last, 4, 2, 32, 8, causal=True, pos_encoding_mode="ALIBI",
           q_data_type="float32")
    q = rng.standard_normal((14, 4, 32)).astype(np.float32)
    out, lse = p.run(q, paged, return_lse=True)
    fo, fl = flashinfer_alibi_attention(q, keys, values, q_lens, slopes)
    np.testing.assert_allclose(out, fo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, fl, rtol=1e-5, atol=1e-4)

    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    r.plan(qo, kv, 4, 2, 32, causal=True, pos_encoding_mode="ALIBI", q_data_type="float32")
    k = np.concatenate(keys).astype(np.float32)
    v = np.concatenate(values).astype(np.float32)
    out, lse = r.run(q, k, v, return_lse=True)
    np.testing.assert_allclose(out, fo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, fl, rtol=1e-5, atol=1e-4)


def tol(dtype):
    return 1e-3 if dtype == np.float16 else 1e-5


@pytest.mark.parametrize("seed", range(6))
def test_decode_wrapper_grid(seed):
    for rng, c in grid(100 + seed, 5):
        h, hkv = c["heads"]
        kv_lens = rng.integers(1, 70, size=int(rng.integers(1, 6))).tolist()
        paged, indptr, indices, last, keys, values = random_paged(
            rng, kv_lens, c["page_size"], hkv, c["d"], c["layout"], c["dtype"], c["five_d"])
        w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(16, np.uint8), c["layout"])
        w.plan(indptr, indices, last, h, hkv, c["d"], c["page_size"],
               pos_encoding_mode="ALIBI" if c["alibi"] else "NONE",
               window_left=c["window_left"], logits_soft_cap=c["soft_cap"],
               q_data_type=c["dtype"], sm_scale=c["sm_scale"])
        q = rng.standard_normal((len(kv_lens), h, c["d"])).astype(c["dtype"])
        out, lse = w.run(q, paged, return_lse=True)
        alibi = fi.get_alibi_slopes(h) if c["alibi"] else None
        ro, rl = attention(q, keys, values, [1] * len(kv_lens), causal=True,
                           window_left=c["window_left"], softcap=c["soft_cap"] or 0.0,
                           scale=c["sm_scale"], alibi=alibi)
        t = tol(c["dtype"])
        np.testing.assert_allclose(out.astype(np.float64), ro, rtol=t, atol=t, err_msg=str(c))
        rl = rl + alibi_gap([1] * len(kv_lens), kv_lens, alibi)
        np.testing.assert_allclose(lse, rl * LOG2E, rtol=t, atol=t, err_msg=str(c))
        out2 = w.run(q, paged)  # without lse: the same output
        np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("seed", range(6))
def test_prefill_wrapper_grid(seed):
    for rng, c in grid(200 + seed, 4):
        h, hkv = c["heads"]
        r = int(rng.integers(1, 4))
        q_lens = rng.integers(1, 12, size=r)
        kv_lens = (q_lens + rng.integers(0, 30, size=r)).tolist()
        causal = bool(rng.integers(2))
        paged, indptr, indices, last, keys, values = random_paged(
            rng, kv_lens, c["page_size"], hkv, c["d"], c["layout"], c["dtype"], c["five_d"])
        qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        w = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(16, np.uint8), c["layout"])
        w.plan(qo, indptr, indices, last, h, hkv, c["d"], c["page_size"], causal=causal,
               pos_encoding_mode="ALIBI" if c["alibi"] else "NONE",
               window_left=c["window_left"], logits_soft_cap=c["soft_cap"],
               sm_scale=c["sm_scale"], q_data_type=c["dtype"])
        q = rng.standard_normal((qo[-1], h, c["d"])).astype(c["dtype"])
        out, lse = w.run(q, paged, return_lse=True)
        alibi = fi.get_alibi_slopes(h) if c["alibi"] else None
        ro, rl = attention(q, keys, values, q_lens.tolist(), causal=causal,
                           window_left=c["window_left"], softcap=c["soft_cap"] or 0.0,
                           scale=c["sm_scale"], alibi=alibi)
        t = tol(c["dtype"])
        np.testing.assert_allclose(out.astype(np.float64), ro, rtol=t, atol=t, err_msg=str(c))
        rl = rl + alibi_gap(q_lens, kv_lens, alibi)
        np.testing.assert_allclose(lse, rl * LOG2E, rtol=t, atol=t, err_msg=str(c))


def test_run_time_window_and_scales():
    rng = np.random.default_rng(7)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, 64, "NHD", np.float32, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32")
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    out = w.run(q, paged, window_left=6, k_scale=0.5, v_scale=2.0)
    ro, _ = attention(q, keys, values, [1, 1], causal=True, window_left=6,
                      scale=0.5 / math.sqrt(64))
    np.testing.assert_allclose(out, 2.0 * ro, rtol=1e-5, atol=1e-5)


def test_ragged_prefill_wrapper():
    rng = np.random.default_rng(8)
    qo = np.array([0, 4, 9], np.int32)
    kv = np.array([0, 6, 11], np.int32)
    q = rng.standard_normal((9, 4, 32)).astype(np.float16)
    k = rng.standard_normal((11, 2, 32)).astype(np.float16)
    v = rng.standard_normal((11, 2, 32)).astype(np.float16)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    w.plan(qo, kv, 4, 2, 32, causal=True, q_data_type="float16")
    out, lse = w.run(q, k, v, return_lse=True)
    ro, rl = attention(q, [k[:6], k[6:]], [v[:6], v[6:]], [4, 5], causal=True)
    np.testing.assert_allclose(out.astype(np.float64), ro, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(lse, rl * LOG2E, rtol=1e-3, atol=1e-3)


def test_zero_sm_scale_raises():
    """FlashInfer's sm_scale = 0 (or run()'s q_scale * k_scale = 0) makes every
    logit 0; kvattn's scale 0 means 1/sqrt(D), so the wrappers refuse it
    rather than attend with 1/sqrt(D). A tiny nonzero scale still runs and
    gives the uniform weights of the reference."""
    rng = np.random.default_rng(12)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, 64, "NHD", np.float32, False)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvattn.UnsupportedError, match="sm_scale"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", sm_scale=0.0)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvattn.UnsupportedError, match="sm_scale"):
        p.plan(np.array([0, 1, 2], np.int32), indptr, indices, last, 4, 2, 64, 8,
               q_data_type="float32", sm_scale=0.0)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    with pytest.raises(kvattn.UnsupportedError, match="sm_scale"):
        r.plan(np.array([0, 1], np.int32), np.array([0, 5], np.int32), 4, 2, 64,
               q_data_type="float32", sm_scale=0.0)
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32")
    for kw in (dict(k_scale=0.0), dict(q_scale=0.0)):
        with pytest.raises(kvattn.UnsupportedError, match="sm_scale"):
            w.run(q, paged, **kw)
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", sm_scale=1e-30)
    ro, _ = attention(q, keys, values, [1, 1], causal=True, scale=1e-30)
    np.testing.assert_allclose(w.run(q, paged), ro, rtol=1e-5, atol=1e-5)


def test_alibi_with_soft_cap_raises():
    """FlashInfer adds the ALiBi bias to the scaled logit before the soft-cap's
    tanh (its DefaultAttention variant), kvattn after it (kvattn.h), so the
    wrappers refuse the pair instead of computing something else; ALiBi alone
    and the soft-cap alone still plan."""
    rng = np.random.default_rng(13)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, 64, "NHD", np.float32, False)
    qo, kv = np.array([0, 1, 2], np.int32), np.array([0, 5, 9], np.int32)
    calls = [
        lambda **kw: fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD").plan(
            indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", **kw),
        lambda **kw: fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD").plan(
            qo, indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", **kw),
        lambda **kw: fi.BatchPrefillWithRaggedKVCacheWrapper(None).plan(
            qo, kv, 4, 2, 64, q_data_type="float32", **kw),
    ]
    for call in calls:
        with pytest.raises(kvattn.UnsupportedError, match="ALIBI.*logits_soft_cap"):
            call(pos_encoding_mode="ALIBI", logits_soft_cap=30.0)
        call(pos_encoding_mode="ALIBI", logits_soft_cap=None)
        call(pos_encoding_mode="ALIBI", logits_soft_cap=0.0)
        call(pos_encoding_mode="NONE", logits_soft_cap=30.0)


def _strided(rng, shape, dtype):
    """A random tensor of shape [N, H, D] whose rows are strided, as q sliced
    from a fused qkv projection: every token's row is followed by 3 more."""
    n, h, d = shape
    fused = rng.standard_normal((n, 4 * h * d)).astype(dtype)
    x = fused[:, h * d: 2 * h * d].reshape(n, h, d)
    assert not x.flags.c_contiguous and x.base is not None
    return x


def test_strided_q_runs_as_contiguous():
    """FlashInfer reads q (and the ragged k / v) through their strides; the
    wrappers copy such tensors and give the bytes of the contiguous call."""
    rng = np.random.default_rng(14)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, 64, "NHD", np.float16, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float16", logits_soft_cap=20.0)
    q = _strided(rng, (2, 4, 64), np.float16)
    q_before = q.copy()
    out, lse = w.run(q, paged, return_lse=True)
    ref_out, ref_lse = w.run(np.ascontiguousarray(q), paged, return_lse=True)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    np.testing.assert_array_equal(q, q_before)  # the caller's q is only read
    assert out.flags.c_contiguous and not np.isnan(out).any()
    ro, _ = attention(q, keys, values, [1, 1], causal=True, softcap=20.0)
    np.testing.assert_allclose(out.astype(np.float64), ro, rtol=1e-3, atol=1e-3)

    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    qo = np.array([0, 3, 7], np.int32)
    p.plan(qo, indptr, indices, last, 4, 2, 64, 8, causal=True, q_data_type="float16")
    q = _strided(rng, (7, 4, 64), np.float16)
    out = poison.poisoned((7, 4, 64), np.float16)
    p.run(q, paged, out=out)
    np.testing.assert_array_equal(out, p.run(np.ascontiguousarray(q), paged))

    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    kv = np.array([0, 6, 11], np.int32)
    r.plan(qo, kv, 4, 2, 32, causal=True, q_data_type="float32")
    q = _strided(rng, (7, 4, 32), np.float32)
    k, v = _strided(rng, (11, 2, 32), np.float32), _strided(rng, (11, 2, 32), np.float32)
    out, lse = r.run(q, k, v, return_lse=True)
    co, cl = r.run(*(np.ascontiguousarray(x) for x in (q, k, v)), return_lse=True)
    np.testing.assert_array_equal(out, co)
    np.testing.assert_array_equal(lse, cl)
    # A strided last dimension: FlashInfer's kernels need it dense, the wrapper refuses it.
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        r.run(np.repeat(q, 2, axis=2)[..., ::2], k, v)


def _strided_nan(shape, dtype):
    """A NaN tensor [N, H, D] whose token rows are strided (out as a slice of
    a wider buffer), and the buffer, to check the bytes around it."""
    n, h, d = shape
    buf = poison.poisoned((n, 3 * h * d), dtype)
    return buf[:, h * d: 2 * h * d].reshape(n, h, d), buf


def test_strided_out_runs_as_contiguous():
    """FlashInfer writes out (and lse) through their token / head strides; the
    wrappers run into a contiguous temporary and copy it there: the bytes of
    the contiguous call, nothing written beside the slice."""
    rng = np.random.default_rng(15)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, 64, "NHD", np.float16, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float16")
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    ref_out, ref_lse = w.run(q, paged, return_lse=True)
    out, buf = _strided_nan((2, 4, 64), np.float16)
    o, l = w.run(q, paged, out=out, return_lse=True, v_scale=0.5)
    assert o is out
    np.testing.assert_array_equal(out, (ref_out * np.float16(0.5)).astype(np.float16))
    np.testing.assert_array_equal(l, ref_lse)
    assert poison.untouched(buf[:, :4 * 64]) and poison.untouched(buf[:, 8 * 64:])
    # lse [T, H] with a token stride (a column slice of a wider buffer).
    lse_buf = poison.poisoned((2, 12), np.float32)
    lse = lse_buf[:, 4:8]
    out2, buf2 = _strided_nan((2, 4, 64), np.float16)
    o, l = w.run(q, paged, out=out2, lse=lse, return_lse=True)
    assert o is out2 and l is lse
    np.testing.assert_array_equal(out2, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    assert poison.untouched(lse_buf[:, :4]) and poison.untouched(lse_buf[:, 8:])
    # A strided last dimension is still refused, nothing written.
    bad = poison.poisoned((2, 4, 128), np.float16)
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        w.run(q, paged, out=bad[..., ::2])
    assert poison.untouched(bad)
    # A strided out over q is refused as a contiguous one is.
    fused = rng.standard_normal((2, 3 * 4 * 64)).astype(np.float16)
    qf = fused[:, :4 * 64].reshape(2, 4, 64)
    keep = fused.copy()
    with pytest.raises(kvattn.InvalidArgumentError, match="overlaps"):
        w.run(qf, paged, out=fused[:, 64: 5 * 64].reshape(2, 4, 64))
    np.testing.assert_array_equal(fused, keep)

    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    qo = np.array([0, 3, 7], np.int32)
    p.plan(qo, indptr, indices, last, 4, 2, 64, 8, causal=True, q_data_type="float16")
    q = rng.standard_normal((7, 4, 64)).astype(np.float16)
    out, buf = _strided_nan((7, 4, 64), np.float16)
    assert p.run(q, paged, out=out) is out
    np.testing.assert_array_equal(out, p.run(q, paged))

    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    kv = np.array([0, 6, 11], np.int32)
    r.plan(qo, kv, 4, 2, 32, causal=True, q_data_type="float32")
    q = rng.standard_normal((7, 4, 32)).astype(np.float32)
    k = rng.standard_normal((11, 2, 32)).astype(np.float32)
    v = rng.standard_normal((11, 2, 32)).astype(np.float32)
    co, cl = r.run(q, k, v, return_lse=True)
    out, buf = _strided_nan((7, 4, 32), np.float32)
    o, l = r.run(q, k, v, out=out, return_lse=True)
    assert o is out
    np.testing.assert_array_equal(out, co)
    np.testing.assert_array_equal(l, cl)
    assert poison.untouched(buf[:, :4 * 32]) and poison.untouched(buf[:, 8 * 32:])


def test_merge_state_base2():
    rng = np.random.default_rng(9)
    va = rng.standard_normal((6, 4, 32)).astype(np.float16)
    vb = rng.standard_normal((6, 4, 32)).astype(np.float16)
    sa = rng.standard_normal((6, 4)).astype(np.float32) * 3
    sb = rng.standard_normal((6, 4)).astype(np.float32) * 3
    v, s = fi.merge_state(va, sa, vb, sb)
    wa, wb = np.exp2(sa.astype(np.float64)), np.exp2(sb.astype(np.float64))
    ref = (wa[..., None] * va + wb[..., None] * vb) / (wa + wb)[..., None]
    np.testing.assert_allclose(v.astype(np.float64), ref, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(s, np.log2(wa + wb), rtol=1e-5, atol=1e-5)
    # In place, with a mask: only the masked rows change.
    v2, s2 = va.copy(), sa.copy()
    mask = np.array([True, False, True, True, False, True])
    fi.merge_state_in_place(v2, s2, vb, sb, mask=mask)
    np.testing.assert_array_equal(v2[~mask], va[~mask])
    np.testing.assert_allclose(v2[mask].astype(np.float64), ref[mask], rtol=1e-3, atol=1e-3)
    v3, s3 = va.copy(), sa.copy()
    fi.merge_state_in_place(v3, s3, vb, sb)
    np.testing.assert_allclose(s3, np.log2(wa + wb), rtol=1e-5, atol=1e-5)


def test_merge_states_many():
    rng = np.random.default_rng(10)
    v = rng.standard_normal((5, 7, 3, 16)).astype(np.float32)
    s = rng.standard_normal((5, 7, 3)).astype(np.float32) * 2
    vm, sm = fi.merge_states(v, s)
    w = np.exp2(s.astype(np.float64))
    ref = (w[..., None] * v).sum(1) / w.sum(1)[..., None]
    np.testing.assert_allclose(vm, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sm, np.log2(w.sum(1)), rtol=1e-5, atol=1e-5)
    v1 = v[:1, :1].copy()
    fi.merge_states(v[:1], s[:1])
    np.testing.assert_array_equal(v[:1, :1], v1)  # input untouched


def _planned_decode():
    rng = np.random.default_rng(11)
    paged, indptr, indices, last, _, _ = random_paged(rng, [9, 17], 4, 2, 32, "NHD",
                                                      np.float16, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(indptr, indices, last, 4, 2, 32, 4)
    return w, paged, rng


def test_bad_inputs_raise():
    w, paged, rng = _planned_decode()
    q = rng.standard_normal((2, 4, 32)).astype(np.float16)
    out = poison.poisoned((2, 4, 32), np.float16)
    bad = [
        (dict(q=q[:1]), kvattn.ShapeMismatchError),  # plan/run shape mismatch
        (dict(q=rng.standard_normal((2, 4, 64)).astype(np.float16)), kvattn.ShapeMismatchError),
        (dict(q=q.astype(np.float32)), kvattn.DtypeMismatchError),
        (dict(paged=(paged[0][:, :2], paged[1][:, :2])), kvattn.ShapeMismatchError),
        (dict(paged=(paged[0], paged[1].astype(np.float32))), kvattn.InvalidArgumentError),
        (dict(paged=(paged[0].astype(np.float32),) * 2), kvattn.UnsupportedError),
        (dict(paged=(paged[0], paged[1], paged[1])), kvattn.InvalidArgumentError),
        (dict(paged=paged[0]), kvattn.ShapeMismatchError),
        (dict(paged=(paged[0][:, :, :, ::2], paged[1][:, :, :, ::2])), kvattn.ShapeMismatchError),
        (dict(out=np.zeros((2, 4, 32), np.float32)), kvattn.DtypeMismatchError),
    ]
    for kw, exc in bad:
        a = dict(q=q, paged=paged)
        a.update(kw)
        with pytest.raises(exc):
            w.run(a["q"], a["paged"], out=kw.get("out", out))
        assert poison.untouched(out)
    with pytest.raises(kvattn.InvalidArgumentError):
        fi.BatchDecodeWithPagedKVCacheWrapper(None).run(q, paged)  # run before plan
    with pytest.raises(kvattn.KvaError):  # page id beyond the cache: caught by kvattn
        w2 = fi.BatchDecodeWithPagedKVCacheWrapper(None)
        w2.plan([0, 1], [10 ** 6], [1], 4, 2, 32, 4)
        w2.run(q[:1], paged)
    with pytest.raises(kvattn.InvalidArgumentError):
        w.plan([0, 2, 1], [0, 1], [1, 1], 4, 2, 32, 4)  # decreasing indptr
    with pytest.raises(kvattn.InvalidArgumentError):
        w.plan([0, 1], [0], [5], 4, 2, 32, 4)  # last_page_len > page_size
    with pytest.raises(kvattn.UnsupportedError):
        w.plan([0, 1], [0], [1], 4, 2, 32, 4, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(kvattn.UnsupportedError):  # a custom mask that is no draft tree
        fi.BatchPrefillWithPagedKVCacheWrapper(None).plan(
            [0, 1], [0, 1], [0], [1], 4, 2, 32, 4, custom_mask=np.zeros(1, bool))
    with pytest.raises(kvattn.KvaError):
        w.plan([0, 1], [0], [1], 3, 2, 32, 4)  # H not a multiple of Hkv
