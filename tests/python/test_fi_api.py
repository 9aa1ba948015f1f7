"""kvattn.flashinfer against FlashInfer's documented wrapper signatures (its
current decode / prefill / ragged / MLA / cascade wrappers): the keywords
and argument order its plan() and run() take, what they raise, and the
multi-level cascade wrapper, each checked against the numpy reference."""

import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from reference import attention
from test_flashinfer import flashinfer_alibi_attention, random_paged

LOG2E = 1.0 / math.log(2.0)


def _decode_setup(seed=31, kv_lens=(30, 50), dtype=np.float32):
    rng = np.random.default_rng(seed)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, list(kv_lens), 8, 2, 64, "NHD", dtype, False)
    return rng, paged, indptr, indices, last, keys, values


def test_decode_plan_positional_order_is_flashinfers():
    """FlashInfer's decode plan() takes (..., q_data_type, kv_data_type,
    o_data_type, data_type, sm_scale, ...): a positional sm_scale lands in
    sm_scale, and o_data_type is a keyword it knows."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup()
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, "NONE", -1, None, "float32", "float32",
           "float32", None, 0.2)
    ro, _ = attention(q, keys, values, [1, 1], causal=True, scale=0.2)
    np.testing.assert_allclose(w.run(q, paged), ro, rtol=1e-5, atol=1e-5)
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", o_data_type="float32")
    ro, _ = attention(q, keys, values, [1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, paged), ro, rtol=1e-5, atol=1e-5)
    with pytest.raises(kvattn.UnsupportedError, match="o_data_type"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32",
               o_data_type="float16")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", window_right=0)
    with pytest.raises(kvattn.UnsupportedError, match="window_right"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", window_right=4)


@pytest.mark.parametrize("alibi", [False, True])
def test_decode_q_len_per_req(alibi):
    """plan(q_len_per_req=n): n query rows per request, causal among
    themselves (FlashInfer's speculative decode); the same as the prefill
    wrapper with qo_indptr = n * arange(R + 1)."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(32, (30, 50, 7))
    n = 3
    q = rng.standard_normal((3 * n, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    mode = "ALIBI" if alibi else "NONE"
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", q_len_per_req=n,
           pos_encoding_mode=mode)
    out, lse = w.run(q, paged, return_lse=True)
    if alibi:
        ro, rl2 = flashinfer_alibi_attention(q, keys, values, [n] * 3,
                                             fi.get_alibi_slopes(4).astype(np.float64))
    else:
        ro, rl = attention(q, keys, values, [n] * 3, causal=True)
        rl2 = rl * LOG2E
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, rl2, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(w.run(q, paged, q_len_per_req=n), out)
    keep = poison.poisoned((3 * n, 4, 64), np.float32)
    with pytest.raises(kvattn.InvalidArgumentError, match="q_len_per_req"):
        w.run(q, paged, q_len_per_req=2, out=keep)
    assert poison.untouched(keep)
    # run()'s copy takes what plan()'s does: an integer >= 1, never truncated
    # (3.5 and "3" would pass the row check as 3).
    for bad in (3.5, 3.0, "3", np.float64(3), 0, -1, True):
        with pytest.raises(kvattn.InvalidArgumentError, match="q_len_per_req"):
            w.run(q, paged, q_len_per_req=bad, out=keep)
        assert poison.untouched(keep)
    np.testing.assert_array_equal(w.run(q, paged, q_len_per_req=np.int64(n)), out)
    with pytest.raises(kvattn.InvalidArgumentError, match="q_len_per_req"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", q_len_per_req=8)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(kvattn.InvalidArgumentError, match="q_len_per_req"):
            w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32", q_len_per_req=bad)


def test_run_keywords_of_flashinfer():
    """run() keywords of FlashInfer's paged wrappers: the kernel-choice hints
    are accepted, NVFP4 scale factors and skip-softmax refused with nothing
    written."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(33)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32")
    ref = w.run(q, paged)
    for kw in (dict(skip_softmax_threshold_scale_factor=None, kv_cache_sf=None),
               dict(use_fp16_softmax=True, uses_spcompress=False, enable_pdl=True)):
        np.testing.assert_array_equal(w.run(q, paged, **kw), ref)
    for kw, what in ((dict(kv_cache_sf=(paged[0], paged[1])), "kv_cache_sf"),
                     (dict(skip_softmax_threshold_scale_factor=0.1), "skip_softmax")):
        out = poison.poisoned((2, 4, 64), np.float32)
        with pytest.raises(kvattn.UnsupportedError, match=what):
            w.run(q, paged, out=out, **kw)
        assert poison.untouched(out)
    with pytest.raises(TypeError):
        w.run(q, paged, no_such_keyword=1)


def test_multi_item_scoring_raises():
    """FlashInfer's multi-item scoring arguments mask keys between items; the
    prefill wrappers refuse them instead of attending over every item, and
    keywords FlashInfer does not know raise TypeError, as in FlashInfer."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(34)
    qo, kv = np.array([0, 3, 7], np.int32), np.array([0, 6, 11], np.int32)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    plans = [lambda **kw: p.plan(qo, indptr, indices, last, 4, 2, 64, 8, causal=True, **kw),
             lambda **kw: r.plan(qo, kv, 4, 2, 32, causal=True, **kw)]
    for plan in plans:
        for kw in (dict(token_pos_in_items_ptr=np.zeros(7, np.uint16)),
                   dict(prefix_len_ptr=np.array([1, 1], np.uint32)),
                   dict(max_item_len_ptr=np.ones(2, np.uint16)),
                   dict(token_pos_in_items_len=20)):
            with pytest.raises(kvattn.UnsupportedError, match="multi-item"):
                plan(**kw)
        plan(prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=True)
        with pytest.raises(TypeError):
            plan(no_such_keyword=1)


def test_ragged_plan_dtypes_and_run_scales():
    """The ragged wrapper: o_data_type other than q's is refused (it was
    ignored, giving q's dtype); q / k / v / o scales other than 1 and
    positional extras are refused (they were ignored)."""
    rng = np.random.default_rng(35)
    qo, kv = np.array([0, 3, 7], np.int32), np.array([0, 6, 11], np.int32)
    q = rng.standard_normal((7, 4, 32)).astype(np.float16)
    k = rng.standard_normal((11, 2, 32)).astype(np.float16)
    v = rng.standard_normal((11, 2, 32)).astype(np.float16)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    with pytest.raises(kvattn.UnsupportedError, match="o_data_type"):
        r.plan(qo, kv, 4, 2, 32, causal=True, o_data_type="float32")
    r.plan(qo, kv, 4, 2, 32, causal=True, q_data_type="float16", o_data_type="float16")
    ref = r.run(q, k, v)
    ro, _ = attention(q, [k[:6], k[6:]], [v[:6], v[6:]], [3, 4], causal=True)
    np.testing.assert_allclose(ref.astype(np.float64), ro, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(r.run(q, k, v, q_scale=1.0, k_scale=None, v_scale=1,
                                        o_scale=1.0, kv_cache_sf=None), ref)
    for kw in (dict(k_scale=0.5), dict(q_scale=2.0), dict(v_scale=2.0), dict(o_scale=0.5)):
        out = poison.poisoned((7, 4, 32), np.float16)
        with pytest.raises(kvattn.UnsupportedError, match="scale"):
            r.run(q, k, v, out=out, **kw)
        assert poison.untouched(out)
    with pytest.raises(kvattn.InvalidArgumentError, match="positional"):
        r.run(q, k, v, 0.5)


def test_mla_run_fp8_keywords():
    """The MLA wrapper's run() knows FlashInfer's fp8 keywords: None runs,
    a value raises UnsupportedError (16-bit pages only)."""
    rng = np.random.default_rng(36)
    m = fi.BatchMLAPagedAttentionWrapper(None)
    m.plan(np.array([0, 1]), np.array([0, 1]), np.array([0]), np.array([5]), 4, 64, 16, 8,
           False, 0.1, "float16", "float16")
    kv = rng.standard_normal((1, 8, 80)).astype(np.float16)
    qn = rng.standard_normal((1, 4, 64)).astype(np.float16)
    qp = rng.standard_normal((1, 4, 16)).astype(np.float16)
    ref = m.run(qn, qp, kv[..., :64], kv[..., 64:])
    same = m.run(qn, qp, kv[..., :64], kv[..., 64:], o_scale=None, ckv_scale=None,
                 ckv_scale_arr=None, kpe_scale=None)
    np.testing.assert_array_equal(same, ref)
    for kw in (dict(o_scale=1.0), dict(ckv_scale=0.5), dict(kpe_scale=0.5),
               dict(ckv_scale_arr=np.ones((1, 8, 1), np.float32))):
        with pytest.raises(kvattn.UnsupportedError):
            m.run(qn, qp, kv[..., :64], kv[..., 64:], **kw)


def test_merge_state_converts_lse_to_f32():
    """FlashInfer's merge_state / merge_states take any float LSE and convert
    it to float32; so do the wrappers (a float16 LSE raised before)."""
    rng = np.random.default_rng(37)
    va = rng.standard_normal((5, 3, 16)).astype(np.float16)
    vb = rng.standard_normal((5, 3, 16)).astype(np.float16)
    sa = (rng.standard_normal((5, 3)) * 3).astype(np.float16)
    sb = (rng.standard_normal((5, 3)) * 3).astype(np.float16)
    v, s = fi.merge_state(va, sa, vb, sb)
    v32, s32 = fi.merge_state(va, sa.astype(np.float32), vb, sb.astype(np.float32))
    assert s.dtype == np.float32
    np.testing.assert_array_equal(v, v32)
    np.testing.assert_array_equal(s, s32)
    V = np.stack([va, vb], 1)
    S = np.stack([sa, sb], 1)
    vm, sm = fi.merge_states(V, S)
    np.testing.assert_array_equal(vm, v32)
    np.testing.assert_allclose(sm, s32, rtol=1e-6, atol=1e-6)


def _cascade_case(rng, layout, five_d, dtype=np.float32, d=32):
    """A shared prefix of 3 pages for all R = 3 requests, then each request's
    own pages; returns the cache, the per-level arrays and, per request,
    its whole key / value sequence."""
    b, hkv, nb = 4, 2, 16
    shared = np.array([5, 0, 9], np.int32)
    unique_lens = [6, 1, 9]
    own = [np.array([2, 7], np.int32), np.array([11], np.int32), np.array([3, 12, 14], np.int32)]
    inner = (b, hkv, d) if layout == "NHD" else (hkv, b, d)
    if five_d:
        kv = rng.standard_normal((nb, 2) + inner).astype(dtype)
        kc, vc, paged = kv[:, 0], kv[:, 1], kv
    else:
        kc = rng.standard_normal((nb,) + inner).astype(dtype)
        vc = rng.standard_normal((nb,) + inner).astype(dtype)
        paged = (kc, vc)

    def seq(c, pages, n):
        x = c[pages]
        if layout == "HND":
            x = x.transpose(0, 2, 1, 3)
        return x.reshape(-1, hkv, d)[:n]

    keys = [np.concatenate([seq(kc, shared, 12), seq(kc, o, n)]) for o, n in zip(own, unique_lens)]
    values = [np.concatenate([seq(vc, shared, 12), seq(vc, o, n)])
              for o, n in zip(own, unique_lens)]
    levels = dict(
        qo=[np.array([0, 3], np.int32), np.arange(4, dtype=np.int32)],
        indptr=[np.array([0, 3], np.int32), np.array([0, 2, 3, 6], np.int32)],
        indices=[shared, np.concatenate(own)],
        last=[np.array([4], np.int32), np.array([2, 1, 1], np.int32)])
    return paged, levels, keys, values


@pytest.mark.parametrize("layout,five_d", [("NHD", False), ("HND", True)])
def test_multi_level_cascade_wrapper(layout, five_d):
    """MultiLevelCascadeAttentionWrapper (flashinfer.cascade): a shared
    prefix level and a per-request level, merged, equals attention over each
    request's whole sequence (decode queries, causal)."""
    rng = np.random.default_rng(38)
    paged, lv, keys, values = _cascade_case(rng, layout, five_d)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    w = fi.MultiLevelCascadeAttentionWrapper(2, None, layout)
    w.plan(lv["qo"], lv["indptr"], lv["indices"], lv["last"], 4, 2, 32, 4, causal=True,
           q_data_type="float32")
    out = w.run(q, paged)
    ro, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    # Prefill rows: every query row sees the whole shared level, its own
    # request's pages causally.
    q_lens = [2, 1, 3]
    qp = rng.standard_normal((6, 4, 32)).astype(np.float32)
    w.plan([np.array([0, 6], np.int32), np.array([0, 2, 3, 6], np.int32)], lv["indptr"],
           lv["indices"], lv["last"], 4, 2, 32, 4, causal=True, q_data_type="float32")
    rp, _ = attention(qp, keys, values, q_lens, causal=True)
    np.testing.assert_allclose(w.run(qp, paged), rp, rtol=1e-5, atol=1e-5)
    # Three levels: the shared prefix split into two levels of its own.
    w3 = fi.MultiLevelCascadeAttentionWrapper(3, None, layout)
    w3.plan([lv["qo"][0]] * 2 + [lv["qo"][1]],
            [np.array([0, 1], np.int32), np.array([0, 2], np.int32), lv["indptr"][1]],
            [lv["indices"][0][:1], lv["indices"][0][1:], lv["indices"][1]],
            [np.array([4], np.int32), np.array([4], np.int32), lv["last"][1]],
            4, 2, 32, 4, causal=True, q_data_type="float32", sm_scale=0.3)
    ro3, _ = attention(q, keys, values, [1, 1, 1], causal=True, scale=0.3)
    np.testing.assert_allclose(w3.run(q, paged), ro3, rtol=1e-5, atol=1e-5)
    with pytest.raises(kvattn.InvalidArgumentError, match="levels"):
        w.plan(lv["qo"][:1], lv["indptr"], lv["indices"], lv["last"], 4, 2, 32, 4)
    with pytest.raises(kvattn.InvalidArgumentError, match="num_levels"):
        fi.MultiLevelCascadeAttentionWrapper(0, None)


def test_given_lse_is_written_and_out_returned():
    """FlashInfer's run() returns (out, lse) only with return_lse; an lse
    passed without it is still written (its kernels take the buffer) and
    run() returns out alone. Before, the wrappers returned a tuple."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(39)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32")
    want, want_lse = w.run(q, paged, return_lse=True)
    lse = np.full((2, 4), np.nan, np.float32)
    res = w.run(q, paged, lse=lse)
    assert isinstance(res, np.ndarray)
    np.testing.assert_array_equal(res, want)
    np.testing.assert_array_equal(lse, want_lse)
    qo, kv = np.array([0, 3, 7], np.int32), np.array([0, 6, 11], np.int32)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan(qo, kv, 4, 2, 32, causal=True, q_data_type="float32")
    qr = rng.standard_normal((7, 4, 32)).astype(np.float32)
    k = rng.standard_normal((11, 2, 32)).astype(np.float32)
    v = rng.standard_normal((11, 2, 32)).astype(np.float32)
    want, want_lse = r.run(qr, k, v, return_lse=True)
    lse = np.full((7, 4), np.nan, np.float32)
    res = r.run(qr, k, v, lse=lse)
    assert isinstance(res, np.ndarray)
    np.testing.assert_array_equal(res, want)
    np.testing.assert_array_equal(lse, want_lse)
    m = fi.BatchMLAPagedAttentionWrapper(None)
    m.plan(np.array([0, 1]), np.array([0, 1]), np.array([0]), np.array([5]), 4, 64, 16, 8,
           False, 0.1, "float32", "float32")
    kvl = rng.standard_normal((1, 8, 80)).astype(np.float32)
    qn = rng.standard_normal((1, 4, 64)).astype(np.float32)
    qp = rng.standard_normal((1, 4, 16)).astype(np.float32)
    want, want_lse = m.run(qn, qp, kvl[..., :64], kvl[..., 64:], return_lse=True)
    lse = np.full((1, 4), np.nan, np.float32)
    res = m.run(qn, qp, kvl[..., :64], kvl[..., 64:], lse=lse)
    assert isinstance(res, np.ndarray)
    np.testing.assert_array_equal(res, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_causal_batch_with_empty_requests():
    """A causal batch of single-query requests where some have no keys
    (padding): FlashInfer's causal mask leaves such a row nothing to see, out
    0 and LSE -inf; the wrappers plan it (kvattn's causal plans need q_len <=
    kv_len, so they plan without the mask, which single queries do not
    need). Paged prefill, ragged and MLA; q_len > kv_len with more queries
    is still refused."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(40, (0, 30, 50))
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    qo = np.arange(4, dtype=np.int32)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    p.plan(qo, np.array([0, 0, 4, 11], np.int32), indices[1:], np.array([0, 6, 2], np.int32),
           4, 2, 64, 8, causal=True, q_data_type="float32")
    out, lse = p.run(q, paged, return_lse=True)
    ro, rl = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    np.testing.assert_allclose(lse[1:], rl[1:] * LOG2E, rtol=1e-5, atol=1e-5)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan(qo, np.array([0, 0, 30, 80], np.int32), 4, 2, 64, causal=True,
           q_data_type="float32")
    out, lse = r.run(q, np.concatenate(keys).astype(np.float32),
                     np.concatenate(values).astype(np.float32), return_lse=True)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    m = fi.BatchMLAPagedAttentionWrapper(None)
    m.plan(np.array([0, 1, 2]), np.array([0, 0, 1]), np.array([0]), np.array([0, 5]), 4, 64,
           16, 8, True, 0.1, "float32", "float32")
    kv = rng.standard_normal((1, 8, 80)).astype(np.float32)
    qm = rng.standard_normal((2, 4, 80)).astype(np.float32)
    out, lse = m.run(qm[..., :64], qm[..., 64:], kv[..., :64], kv[..., 64:], return_lse=True)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    lat = kv[0, :5, None, :]  # request 1's 5 latent rows as [5, 1, 80] keys
    ro, rl = attention(qm[1:], [lat], [lat[..., :64]], [1], causal=True, scale=0.1)
    np.testing.assert_allclose(out[1:], ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[1:], rl * LOG2E, rtol=1e-5, atol=1e-5)
    with pytest.raises(kvattn.OutOfRangeError):  # 2 queries, no key: still refused
        p.plan(np.array([0, 2, 3, 4], np.int32), np.array([0, 0, 4, 11], np.int32),
               indices[1:], np.array([0, 6, 2], np.int32), 4, 2, 64, 8, causal=True,
               q_data_type="float32")


def test_dtype_mismatch_is_a_value_error():
    """FlashInfer raises ValueError for a q or out dtype that does not match
    the plan (_check_cached_qkv_data_type, check_shape_dtype_device); the
    wrappers' DtypeMismatchError is a ValueError too (and still a TypeError)."""
    rng, paged, indptr, indices, last, keys, values = _decode_setup(41)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="float32")
    q = rng.standard_normal((2, 4, 64))
    with pytest.raises(ValueError):
        w.run(q.astype(np.float16), paged)
    out = poison.poisoned((2, 4, 64), np.float16)
    with pytest.raises(ValueError):
        w.run(q.astype(np.float32), paged, out=out)
    assert poison.untouched(out)
    assert issubclass(kvattn.DtypeMismatchError, TypeError)


def test_unknown_names_raise_key_error():
    """FlashInfer raises KeyError for an unknown kv_layout or
    pos_encoding_mode; the wrappers' error is a KeyError too (and kvattn's
    InvalidArgumentError); ROPE_LLAMA, a name FlashInfer knows, stays
    UnsupportedError."""
    for make in (lambda: fi.BatchDecodeWithPagedKVCacheWrapper(None, "NDH"),
                 lambda: fi.BatchPrefillWithPagedKVCacheWrapper(None, "nhd"),
                 lambda: fi.BatchPrefillWithRaggedKVCacheWrapper(None, "XYZ"),
                 lambda: fi.MultiLevelCascadeAttentionWrapper(2, None, "HDN")):
        with pytest.raises(KeyError, match="kv_layout"):
            make()
        with pytest.raises(kvattn.InvalidArgumentError):
            make()
    rng, paged, indptr, indices, last, keys, values = _decode_setup(42)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    plans = (lambda **kw: w.plan(indptr, indices, last, 4, 2, 64, 8, **kw),
             lambda **kw: r.plan(np.array([0, 1]), np.array([0, 3]), 4, 2, 64, **kw))
    for plan in plans:
        with pytest.raises(KeyError, match="pos_encoding_mode"):
            plan(pos_encoding_mode="ALiBi")
        with pytest.raises(kvattn.UnsupportedError):
            plan(pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(kvattn.UnsupportedError, match="NHD"):  # a known name kvattn lacks
        fi.BatchPrefillWithRaggedKVCacheWrapper(None, "HND")
