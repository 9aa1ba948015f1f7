"""Black-box round sixteen (session 44, api56) of the Python package's
FlashInfer-compatible wrappers, each case written from docs/python.md's
promises and FlashInfer 0.7.2's documented semantics, checked against the
float64 oracle of reference.py, outputs poisoned.

Defect (each test below marked so fails on the code before its fix):
- docs/python.md: a kv / output dtype other than the query's raises
  UnsupportedError. FlashInfer takes its dtypes as torch dtypes or torch
  attribute names; one kvattn has no code for ("float8_e5m2",
  torch.float8_e5m2, float64, "float8_e4m3fn" when ml_dtypes is not loaded,
  the trtllm function's out_dtype "nvfp4") raised InvalidArgumentError "not
  a kvattn dtype" (a ValueError) instead. Now every wrapper (paged decode
  and prefill, ragged, MLA, the trtllm decode function) raises
  UnsupportedError for them, reads "float8_e4m3fn" as kvattn's fp8 dtype
  whether or not ml_dtypes is loaded, and a refused plan leaves the previous
  one standing.
Found and documented (docs/python.md), not changed: a causal prefill batch
mixing a multi-query request with a key-less single-query request (padding,
which FlashInfer computes as 0 / LSE -inf) is refused at plan() with
OutOfRangeError naming the request; the docs listed only the multi-query
case.
Coverage (passes on main): the CSR page table with indptr[0] > 0 (pages
before the batch's), 5-D HND caches, soft-cap with the base-2 LSE, the
ragged wrapper's kv_indptr[0] > 0, and a two-level cascade wrapper against
attention over the whole prefix.
"""

import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from kvattn.flashinfer import decode as fi_decode
from poison import poisoned, untouched
from reference import attention

LOG2E = 1.0 / math.log(2.0)


def _paged(rng, kv_lens, ps, hkv, d, layout, five=False, lead=0, dt=np.float32):
    """A paged cache (NP pages, shuffled) holding kv_lens keys per request,
    the requests' pages after `lead` pages of other requests in the indices:
    (cache, indptr, indices, last_page_len, keys [r], values [r])."""
    pages = [(s + ps - 1) // ps for s in kv_lens]
    n_pages = sum(pages) + lead + 3
    k = rng.standard_normal((n_pages, ps, hkv, d)).astype(dt)
    v = rng.standard_normal((n_pages, ps, hkv, d)).astype(dt)
    perm = rng.permutation(n_pages)
    indptr, indices, keys, vals, at = [lead], list(perm[:lead]), [], [], lead
    for s, n in zip(kv_lens, pages):
        ids = perm[at:at + n]
        at += n
        indices += list(ids)
        indptr.append(indptr[-1] + n)
        keys.append(k[ids].reshape(-1, hkv, d)[:s])
        vals.append(v[ids].reshape(-1, hkv, d)[:s])
    last = [s - (n - 1) * ps if n else 0 for s, n in zip(kv_lens, pages)]
    if layout == "HND":
        k, v = k.transpose(0, 2, 1, 3).copy(), v.transpose(0, 2, 1, 3).copy()
    cache = np.stack([k, v], 1) if five else (k, v)
    return (cache, np.array(indptr, np.int32), np.array(indices, np.int32),
            np.array(last, np.int32), keys, vals)


# ------------------------------------------------ kv / output dtypes kvattn cannot name

OTHER_DTYPES = ["float8_e5m2", "torch.float8_e5m2", "float8_e4m3fn", "torch.float8_e4m3fn",
                "int8", "uint8", "float64", np.float64]


@pytest.mark.parametrize("dt", OTHER_DTYPES)
@pytest.mark.parametrize("arg", ["kv_data_type", "o_data_type"])
def test_paged_wrappers_other_dtypes_unsupported(dt, arg):
    """Defect: a FlashInfer kv / o dtype kvattn has no code for raised
    InvalidArgumentError; it is UnsupportedError (docs/python.md), and the
    wrapper keeps its previous plan."""
    rng = np.random.default_rng(160)
    cache, ip, ix, lp, keys, vals = _paged(rng, [9, 4], 4, 2, 16, "NHD")
    q = rng.standard_normal((2, 4, 16)).astype(np.float32)
    want, _ = attention(q, keys, vals, [1, 1], causal=True)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(ip, ix, lp, 4, 2, 16, 4, q_data_type="float32")
    with pytest.raises(kvattn.UnsupportedError, match=arg):
        w.plan(ip[:2], ix, lp[:1], 4, 2, 16, 4, q_data_type="float32", **{arg: dt})
    np.testing.assert_allclose(w.run(q, cache), want, rtol=2e-5, atol=2e-5)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    qo = np.array([0, 1, 2], np.int32)
    p.plan(qo, ip, ix, lp, 4, 2, 16, 4, causal=True, q_data_type="float32")
    with pytest.raises(kvattn.UnsupportedError, match=arg):
        p.plan(qo, ip, ix, lp, 4, 2, 16, 4, causal=True, q_data_type="float32", **{arg: dt})
    np.testing.assert_allclose(p.run(q, cache), want, rtol=2e-5, atol=2e-5)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvattn.UnsupportedError, match=arg):
        r.plan(qo, np.array([0, 9, 13], np.int32), 4, 2, 16, causal=True,
               q_data_type="float32", **{arg: dt})


@pytest.mark.parametrize("dt", OTHER_DTYPES)
def test_mla_wrapper_other_dtypes_unsupported(dt):
    """Defect: as the paged wrappers', for the MLA wrapper's kv_data_type and
    output_dtype."""
    w = fi.BatchMLAPagedAttentionWrapper(None)
    args = dict(qo_indptr=np.array([0, 1], np.int32), kv_indptr=np.array([0, 1], np.int32),
                kv_indices=np.array([0], np.int32), kv_len_arr=np.array([3], np.int32),
                num_heads=2, head_dim_ckv=64, head_dim_kpe=16, page_size=4, causal=True,
                sm_scale=0.1, q_data_type="float32")
    w.plan(**args)
    for name in ("kv_data_type", "output_dtype"):
        with pytest.raises(kvattn.UnsupportedError, match=name):
            w.plan(**args, **{name: dt})


@pytest.mark.parametrize("dt", ["nvfp4", "float8_e5m2", "float8_e4m3fn", "float64"])
def test_trtllm_out_dtype_unsupported(dt):
    """Defect: trtllm_batch_decode_with_kv_cache's out_dtype other than the
    query's (FlashInfer's "nvfp4" output among them) is UnsupportedError, out
    untouched; "nvfp4" and "float8_e5m2" raised InvalidArgumentError."""
    rng = np.random.default_rng(161)
    k = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    bt = np.array([[0, 1, 2]], np.int32)
    out = poisoned((1, 2, 8))
    with pytest.raises(kvattn.UnsupportedError, match="out_dtype"):
        fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([9]), 12,
                                                    out=out, out_dtype=dt)
    assert untouched(out)
    ok = fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([9]), 12,
                                                     out_dtype="float32")
    assert np.isfinite(ok).all()


@pytest.mark.parametrize("name", ["int8", "uint8", "float8_e4m3fn"])
def test_torch_dtype_names_read(name):
    """torch's names of the dtypes kvattn has ("int8", "uint8",
    "float8_e4m3fn"; the last failed before the fix unless ml_dtypes was
    loaded) are read as those dtypes: as a q_data_type they reach kvattn's
    own check (the query is f32 / f16 / bf16) instead of being an unknown
    name."""
    rng = np.random.default_rng(162)
    cache, ip, ix, lp, _, _ = _paged(rng, [5], 4, 1, 8, "NHD")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvattn.KvaError) as e:
        w.plan(ip, ix, lp, 2, 1, 8, 4, q_data_type=name)
    assert "not a kvattn dtype" not in str(e.value)


# ---------------------------------------------------------------- semantics (coverage)

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("five", [False, True])
def test_decode_indptr_offset_softcap_lse(layout, five):
    """FlashInfer's CSR page table may start past 0 (indptr[0] > 0: pages of
    other batches first); a request of no pages has kv_len 0 (out 0, LSE
    -inf); soft-cap and the base-2 LSE; 5-D and (k, v) caches, NHD / HND."""
    rng = np.random.default_rng(163)
    kv_lens = [5, 1, 9, 0, 3]
    cache, ip, ix, lp, keys, vals = _paged(rng, kv_lens, 3, 2, 16, layout, five, lead=2)
    q = rng.standard_normal((5, 4, 16)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
    w.plan(ip, ix, lp, 4, 2, 16, 3, logits_soft_cap=4.0, q_data_type="float32")
    out, lse = w.run(q, cache, out=poisoned((5, 4, 16)), lse=poisoned((5, 4)),
                     return_lse=True)
    want, wl = attention(q, keys, vals, [1] * 5, causal=True, softcap=4.0)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, wl * LOG2E, rtol=2e-5, atol=2e-5)


def test_ragged_kv_indptr_offset():
    """The ragged wrapper's kv_indptr may start past 0: request r's keys are
    rows kv_indptr[r] .. kv_indptr[r + 1] of k / v."""
    rng = np.random.default_rng(164)
    kvi = np.array([4, 10, 13], np.int32)
    k = rng.standard_normal((15, 2, 8)).astype(np.float32)
    v = rng.standard_normal((15, 2, 8)).astype(np.float32)
    q = rng.standard_normal((5, 2, 8)).astype(np.float32)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(None, "NHD")
    w.plan(np.array([0, 2, 5], np.int32), kvi, 2, 2, 8, causal=True, q_data_type="float32")
    out, lse = w.run(q, k, v, out=poisoned((5, 2, 8)), return_lse=True)
    want, wl = attention(q, [k[4:10], k[10:13]], [v[4:10], v[10:13]], [2, 3], causal=True)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, wl * LOG2E, rtol=2e-5, atol=2e-5)


def test_cascade_two_levels_equal_whole_prefix():
    """MultiLevelCascadeAttentionWrapper: level 0 attends every query row to
    the shared pages (one "request" of all rows, not causal), level 1 each
    request's own pages causally; merged, the result is attention over the
    shared prefix followed by the own keys."""
    rng = np.random.default_rng(165)
    ps, own_lens, q_lens = 4, [3, 6, 1], [1, 2, 1]
    k = rng.standard_normal((8, ps, 2, 16)).astype(np.float32)
    v = rng.standard_normal((8, ps, 2, 16)).astype(np.float32)
    shared, own = [0, 1], [[2], [3, 4], [5]]
    q = rng.standard_normal((4, 4, 16)).astype(np.float32)
    w = fi.MultiLevelCascadeAttentionWrapper(2, None, "NHD")
    w.plan([np.array([0, 4], np.int32), np.array([0, 1, 3, 4], np.int32)],
           [np.array([0, 2], np.int32), np.array([0, 1, 3, 4], np.int32)],
           [np.array(shared, np.int32), np.array([2, 3, 4, 5], np.int32)],
           [np.array([4], np.int32), np.array([3, 2, 1], np.int32)],
           4, 2, 16, ps, causal=True, q_data_type="float32")
    out = w.run(q, (k, v))
    keys = [k[shared + own[r]].reshape(-1, 2, 16)[:8 + own_lens[r]] for r in range(3)]
    vals = [v[shared + own[r]].reshape(-1, 2, 16)[:8 + own_lens[r]] for r in range(3)]
    want, _ = attention(q, keys, vals, q_lens, causal=True)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_causal_padding_beside_a_prefill_refused():
    """A key-less single-query request (padding) in a causal batch with a
    multi-query request: the batch is planned causal and kvattn's causal
    plans need q_len <= kv_len, so plan() raises OutOfRangeError naming the
    request (docs/python.md) and the previous plan stands; with single-query
    requests only, the padding row is 0 / LSE -inf, as FlashInfer's."""
    rng = np.random.default_rng(166)
    cache, ip, ix, lp, keys, vals = _paged(rng, [6, 0], 4, 1, 8, "NHD")
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(np.array([0, 1, 2], np.int32), ip, ix, lp, 2, 1, 8, 4, causal=True,
           q_data_type="float32")
    out, lse = w.run(q, cache, return_lse=True)
    want, wl = attention(q, keys, vals, [1, 1], causal=False)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert np.isneginf(lse[1]).all() and not out[1].any()
    with pytest.raises(kvattn.OutOfRangeError, match="request 1"):
        w.plan(np.array([0, 3, 4], np.int32), ip, ix, lp, 2, 1, 8, 4, causal=True,
               q_data_type="float32")
    np.testing.assert_allclose(w.run(q, cache), want, rtol=2e-5, atol=2e-5)
