"""kvattn.flashinfer's submodules and decode functions against FlashInfer
0.7.2: the names serving engines import from flashinfer.decode / .prefill /
.cascade / .mla / .page / .utils (frozen in fi_signatures_072.MODULES by
dev/api46/freeze_fi_signatures.py), fast_decode_plan, get_seq_lens and
trtllm_batch_decode_with_kv_cache, each checked against the numpy reference
or the decode wrapper. Their signatures are in test_fi_signatures.py."""

import functools
import importlib
import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from fi_signatures_072 import MODULES
from reference import attention
from test_flashinfer import random_paged

# FlashInfer 0.7.2 names kvattn deliberately does not provide (docs/python.md says why).
LEFT_OUT = {"append_paged_kv_cache", "get_batch_indices_positions"}
# kvattn.flashinfer's own top-level extra (FlashInfer keeps it in .utils / .decode / .prefill).
TOP_EXTRA = {"get_alibi_slopes"}
TOL = dict(rtol=1e-5, atol=1e-5)


def _module(name):
    return fi if name == "" else importlib.import_module("kvattn.flashinfer." + name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_holds_flashinfers_names(name):
    """Each submodule holds what FlashInfer's holds (less LEFT_OUT), the same
    object wherever a name appears, as in FlashInfer (flashinfer.cascade
    .BatchDecodeWithPagedKVCacheWrapper is flashinfer.decode's)."""
    mod = _module(name)
    for n in MODULES[name]:
        if n in LEFT_OUT:
            assert not hasattr(mod, n), "%s is listed as left out but exists" % n
            continue
        assert hasattr(mod, n), "kvattn.flashinfer.%s lacks %s" % (name, n)
        for other in MODULES:
            if n in MODULES[other] or (other == "" and n in TOP_EXTRA):
                assert getattr(_module(other), n, None) is getattr(mod, n), (name, other, n)


def test_module_check_can_fail():
    """The frozen module lists name real kvattn objects: a module lacking a
    name, or holding another object, is seen."""
    assert "BatchDecodeWithPagedKVCacheWrapper" in MODULES["cascade"]
    cls = fi.decode.BatchDecodeWithPagedKVCacheWrapper
    assert fi.cascade.BatchDecodeWithPagedKVCacheWrapper is cls
    assert not hasattr(fi.page, "BatchDecodeWithPagedKVCacheWrapper")
    assert fi.decode.get_seq_lens is fi.page.get_seq_lens is fi.get_seq_lens
    assert fi.decode.fast_decode_plan is not fi.BatchDecodeWithPagedKVCacheWrapper.plan


def test_engine_import_lines():
    """The import statements of SGLang's and vLLM's FlashInfer backends, with
    kvattn.flashinfer in place of flashinfer."""
    from kvattn.flashinfer import BatchDecodeWithPagedKVCacheWrapper  # noqa: F401
    from kvattn.flashinfer.cascade import merge_state, merge_states  # noqa: F401
    from kvattn.flashinfer.decode import (  # noqa: F401
        fast_decode_plan, get_seq_lens, trtllm_batch_decode_with_kv_cache)
    from kvattn.flashinfer.mla import BatchMLAPagedAttentionWrapper  # noqa: F401
    from kvattn.flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper  # noqa: F401
    from kvattn.flashinfer.utils import get_alibi_slopes  # noqa: F401
    import kvattn.flashinfer.page as page

    assert page.get_seq_lens is get_seq_lens


def test_get_seq_lens():
    """(pages - 1) * page_size + last_page_len, a request without pages
    counting its last_page_len (FlashInfer's clamp); numpy in, numpy out."""
    indptr = np.array([0, 3, 3, 4, 9], np.int32)
    last = np.array([5, 2, 16, 1], np.int32)
    got = fi.get_seq_lens(indptr, last, 16)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, [37, 2, 16, 65])


def _decode_case(seed, kv_lens=(30, 50, 9), page=8, hkv=2, h=4, d=64, layout="NHD"):
    rng = np.random.default_rng(seed)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, list(kv_lens), page, hkv, d, layout, np.float32, False)
    q = rng.standard_normal((len(kv_lens), h, d)).astype(np.float32)
    return rng, paged, indptr, indices, last, keys, values, q


def test_fast_decode_plan_is_plan():
    """fast_decode_plan(w, ...) and w.plan = partial(fast_decode_plan, w)
    (SGLang's CUDA-graph replan) plan as plan() does: results of the new
    batch, its sm_scale / window / soft cap, and no recursion through the
    replaced w.plan."""
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(51)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8, q_data_type="float32",
                        sm_scale=0.2, logits_soft_cap=3.0)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True, scale=0.2, softcap=3.0)
    np.testing.assert_allclose(w.run(q, paged), ref, **TOL)
    w.plan = functools.partial(fi.decode.fast_decode_plan, w)
    # a second batch: the first two requests, a window
    w.plan(indptr[:3], indices, last[:2], 4, 2, 64, 8, "NONE", 7, None, None, None,
           "float32")  # positional: ..., window_left, soft cap, q_data_type, kv, data_type
    ref2, _ = attention(q[:2], keys[:2], values[:2], [1, 1], causal=True, window_left=7)
    plain, _ = attention(q[:2], keys[:2], values[:2], [1, 1], causal=True)
    assert np.abs(ref2 - plain).max() > 1e-2  # the window matters here
    np.testing.assert_allclose(w.run(q[:2], paged), ref2, **TOL)


def test_fast_decode_plan_dtypes_and_q_len_per_req():
    """q_data_type None means data_type, else float16 (FlashInfer's
    fast_decode_plan), so a float32 run after a plan without dtypes is
    refused; data_type fills q and kv; q_len_per_req > 1 is causal among
    the request's rows."""
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(52)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8)
    with pytest.raises(kvattn.KvaError):
        w.run(q, paged)  # planned float16, q and cache are float32
    fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8, data_type="float32")
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, paged), ref, **TOL)
    q3 = rng.standard_normal((9, 4, 64)).astype(np.float32)
    fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8, data_type="float32",
                        q_len_per_req=3)
    ref3, _ = attention(q3, keys, values, [3, 3, 3], causal=True)
    full3, _ = attention(q3, keys, values, [3, 3, 3], causal=False)
    assert np.abs(ref3 - full3).max() > 1e-2
    np.testing.assert_allclose(w.run(q3, paged), ref3, **TOL)


def test_fast_decode_plan_global_override_indptr():
    """global_override_indptr_cpu is the host copy of indptr and is what the
    plan reads; one that differs from a host indptr raises and leaves the
    standing plan as it was; self must be a kvattn decode wrapper."""
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(53)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8, data_type="float32",
                        global_override_indptr_cpu=indptr.copy())
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, paged), ref, **TOL)
    bad = indptr.copy()
    bad[1] -= 1
    with pytest.raises(kvattn.InvalidArgumentError, match="global_override_indptr_cpu"):
        fi.fast_decode_plan(w, indptr, indices, last, 4, 2, 64, 8, data_type="float32",
                            sm_scale=0.1, global_override_indptr_cpu=bad)
    np.testing.assert_allclose(w.run(q, paged), ref, **TOL)
    with pytest.raises(kvattn.InvalidArgumentError, match="self"):
        fi.fast_decode_plan(fi.BatchPrefillWithPagedKVCacheWrapper(None), indptr, indices,
                            last, 4, 2, 64, 8)


def _dense(indptr, indices, rng, pad=-7):
    """FlashInfer's CSR page table as trtllm's dense block_tables, the unused
    entries filled with pad (never read)."""
    r = len(indptr) - 1
    width = int(np.diff(indptr).max()) + 2
    bt = np.full((r, width), pad, np.int32)
    for i in range(r):
        p = indices[indptr[i]:indptr[i + 1]]
        bt[i, :len(p)] = p
    return bt


@pytest.mark.parametrize("layout,form", [("HND", "tuple"), ("HND", "5d"), ("NHD", "tuple"),
                                         ("NHD", "5d")])
def test_trtllm_decode_matches_reference(layout, form):
    """bmm1_scale is the whole softmax scale, bmm2_scale scales the output,
    window_left and sinks as the wrappers'; kv_cache as a (k, v) pair or one
    [P, 2, ...] tensor, HND by default; block_tables padding is not read;
    out= is written and returned; a request of length 0 gives zeros."""
    kv_lens = [30, 50, 9, 0]
    rng = np.random.default_rng(54)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, kv_lens, 8, 2, 64, layout, np.float32, form == "5d")
    q = rng.standard_normal((4, 4, 64)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    bt = _dense(indptr, indices, rng)
    sl = np.array(kv_lens, np.uint32)
    out = np.full((4, 4, 64), np.nan, np.float32)
    kw = {} if layout == "HND" else dict(kv_layout="NHD")
    got = fi.decode.trtllm_batch_decode_with_kv_cache(
        q, paged, None, bt, sl, 64, bmm1_scale=0.09, bmm2_scale=0.5, window_left=20,
        out=out, sinks=sinks, **kw)
    assert got is out
    ref, _ = attention(q, keys, values, [1, 1, 1, 1], causal=False, scale=0.09, window_left=20,
                       sinks=sinks)
    np.testing.assert_allclose(out, 0.5 * ref, **TOL)
    assert not out[3].any()
    # defaults: scale 1.0 (no 1/sqrt(D)), no window, no sinks; a fresh output
    got = fi.decode.trtllm_batch_decode_with_kv_cache(q[:3], paged, None, bt[:3], sl[:3], 50,
                                                      **kw)
    ref, _ = attention(q[:3], keys[:3], values[:3], [1, 1, 1], causal=True, scale=1.0)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("five_d,hkv", [(False, 2), (True, 2), (True, 1), (False, 1)])
def test_trtllm_decode_transposed_pages(five_d, hkv):
    """vLLM permutes its NHD cache [P, 2, page, Hkv, D] to HND shape
    [P, 2, Hkv, page, D] (a strided view) and passes kv_layout "HND": the
    pages are read in place in their own layout, giving the reference (with
    one kv head too, whose dimension's stride addresses nothing)."""
    rng = np.random.default_rng(60)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50, 9], 8, hkv, 64, "NHD", np.float32, five_d)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    view = paged.transpose(0, 1, 3, 2, 4) if five_d else \
        tuple(x.transpose(0, 2, 1, 3) for x in paged)
    bt = _dense(indptr, indices, rng)
    got = fi.decode.trtllm_batch_decode_with_kv_cache(q, view, None, bt, np.array([30, 50, 9]),
                                                      50, bmm1_scale=0.1)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True, scale=0.1)
    np.testing.assert_allclose(got, ref, **TOL)


def test_wrapper_reads_one_kv_head_pages_through_a_transpose():
    """With one kv head, NHD pages [P, page, 1, D] transposed to HND shape
    [P, 1, page, D] are dense HND pages (the size-1 dimension's stride
    addresses nothing): the decode wrapper planned "HND" reads them in place."""
    rng = np.random.default_rng(64)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50, 9], 8, 1, 64, "NHD", np.float32, True)
    view = paged.transpose(0, 1, 3, 2, 4)
    assert view.strides[2] != 8 * 64 * 4  # not the strides of a contiguous HND tensor
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    w.plan(indptr, indices, last, 4, 1, 64, 8, q_data_type="float32")
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, view), ref, **TOL)


def test_trtllm_decode_shared_kv_rows_refused():
    """A [P, 1, ...] kv_cache (K and V the same rows, read twice by
    FlashInfer) raises UnsupportedError: a kvattn cache cannot alias K and V.
    Nothing is written."""
    rng = np.random.default_rng(55)
    kv = rng.standard_normal((6, 1, 2, 4, 32)).astype(np.float32)  # HND, page 4
    bt = np.array([[3, 1], [5, 0]], np.int32)
    q = rng.standard_normal((2, 2, 32)).astype(np.float32)
    out = np.full((2, 2, 32), 7.0, np.float32)
    with pytest.raises(kvattn.UnsupportedError, match="same rows"):
        fi.decode.trtllm_batch_decode_with_kv_cache(q, kv, None, bt, np.array([7, 5]), 8,
                                                    out=out)
    assert (out == 7.0).all()


_REFUSED = [
    dict(q_len_per_req=2), dict(cum_seq_lens_q=np.array([0, 1, 2, 3]), max_q_len=1),
    dict(mask=np.zeros((3, 1, 2), np.uint16)), dict(return_lse=True),
    dict(lse=np.zeros((3, 4), np.float32)), dict(o_scale=2.0), dict(o_sf_scale=1.0),
    dict(kv_cache_sf=(1, 2)), dict(skip_softmax_threshold_scale_factor=1.0),
    dict(uses_shared_paged_kv_idx=False), dict(enable_block_sparse_attention=True),
    dict(cp_world=2), dict(causal_seqlens_kv_global=np.zeros(3, np.int32)),
    dict(bmm1_scale_log2=np.zeros(1, np.float32)), dict(request_order=np.zeros(3, np.int32)),
    dict(out_dtype="float16"), dict(bmm1_scale=0.0)]


@pytest.mark.parametrize("kw", _REFUSED, ids=lambda kw: ",".join(kw))
def test_trtllm_decode_refuses_what_it_cannot_match(kw):
    """Each argument whose FlashInfer meaning kvattn cannot give raises
    UnsupportedError and writes nothing."""
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(56, layout="HND")
    bt = _dense(indptr, indices, rng)
    out = np.full((3, 4, 64), 7.0, np.float32)
    with pytest.raises(kvattn.UnsupportedError):
        fi.decode.trtllm_batch_decode_with_kv_cache(q, paged, None, bt,
                                                    np.array([30, 50, 9]), 50, out=out, **kw)
    assert (out == 7.0).all()
    # the same call without the argument runs (the refusal was the argument's)
    fi.decode.trtllm_batch_decode_with_kv_cache(q, paged, None, bt, np.array([30, 50, 9]), 50,
                                                out=out, bmm1_scale=1 / math.sqrt(64))
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(out, ref, **TOL)


def test_trtllm_decode_bad_inputs():
    """seq_lens beyond max_seq_len, a block_tables of the wrong height, an
    unknown backend or layout: an error, nothing written."""
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(57, layout="HND")
    bt = _dense(indptr, indices, rng)
    sl = np.array([30, 50, 9])
    out = np.full((3, 4, 64), 7.0, np.float32)
    f = fi.decode.trtllm_batch_decode_with_kv_cache
    with pytest.raises(kvattn.InvalidArgumentError, match="max_seq_len"):
        f(q, paged, None, bt, sl, 49, out=out)
    with pytest.raises(kvattn.InvalidArgumentError, match="block_tables"):
        f(q, paged, None, bt[:2], sl, 50, out=out)
    with pytest.raises(kvattn.KvaError):
        f(q, paged, None, bt, sl, 50, out=out, backend="cudnn")
    with pytest.raises(kvattn.KvaError):
        f(q, paged, None, bt, sl, 50, out=out, kv_layout="NDH")
    assert (out == 7.0).all()


def test_torch_fast_decode_plan_reads_the_host_indptr_and_trtllm_scalars():
    """torch: with a device indptr (here a "meta" tensor, which has no data
    to read), fast_decode_plan plans from global_override_indptr_cpu, as
    FlashInfer's; trtllm_batch_decode_with_kv_cache takes uint32 seq_lens
    and one-element tensor scales (FlashInfer's forms) and returns a tensor."""
    torch = pytest.importorskip("torch")
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(58, layout="HND")
    tq = torch.from_numpy(q)
    tkv = tuple(torch.from_numpy(x) for x in paged)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "HND")
    meta = torch.empty(4, dtype=torch.int32, device="meta")
    fi.decode.fast_decode_plan(w, meta, torch.from_numpy(indices), torch.from_numpy(last), 4,
                               2, 64, 8, data_type=torch.float32,
                               global_override_indptr_cpu=torch.from_numpy(indptr))
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(w.run(tq, tkv).numpy(), ref, **TOL)
    bt = torch.from_numpy(_dense(indptr, indices, rng))
    sl = torch.tensor([30, 50, 9], dtype=torch.uint32)
    got = fi.decode.trtllm_batch_decode_with_kv_cache(
        tq, tkv, torch.empty(16, dtype=torch.uint8), bt, sl, 50,
        bmm1_scale=torch.tensor([0.07]), bmm2_scale=torch.tensor(2.0))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True, scale=0.07)
    np.testing.assert_allclose(got.numpy(), 2.0 * ref, **TOL)


def test_torch_trtllm_decode_refuses_cuda_graph_capture(monkeypatch):
    """During CUDA graph capture the call raises (it plans on the host per
    call, so a captured metadata upload would replay stale) and writes
    nothing. The VM has no GPU: the capture test (_capturing, a CUDA query
    with torch.cuda.is_current_stream_capturing()) is stubbed."""
    torch = pytest.importorskip("torch")
    rng, paged, indptr, indices, last, keys, values, q = _decode_case(59, layout="HND")
    tq, tkv = torch.from_numpy(q), tuple(torch.from_numpy(x) for x in paged)
    bt = torch.from_numpy(_dense(indptr, indices, rng))
    out = torch.full((3, 4, 64), 7.0)
    from kvattn.flashinfer import _functions

    assert not _functions._capturing(tq)  # a CPU tensor
    monkeypatch.setattr(_functions, "_capturing", lambda query: True)
    with pytest.raises(kvattn.UnsupportedError, match="capture"):
        fi.decode.trtllm_batch_decode_with_kv_cache(tq, tkv, None, bt,
                                                    torch.tensor([30, 50, 9]), 50, out=out)
    assert (out == 7.0).all()
    monkeypatch.undo()
    fi.decode.trtllm_batch_decode_with_kv_cache(tq, tkv, None, bt, torch.tensor([30, 50, 9]), 50,
                                                out=out, bmm1_scale=0.125)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(out.numpy(), ref, **TOL)


def _mla_case(seed, kv_lens=(40, 17, 0, 9), page=16, h=4, dc=64, dr=16, four_d=False):
    """A latent cache [P, page, Dc + Dr] (or [P, 1, page, ...]) with a dense
    block table padded with -5, absorbed queries [B, 1, H, Dc + Dr] and
    each request's latent rows [s, 1, Dc + Dr]."""
    rng = np.random.default_rng(seed)
    npages = [max(1, -(-s // page)) for s in kv_lens]
    nb = sum(npages) + 2
    kv = rng.standard_normal((nb, page, dc + dr)).astype(np.float32)
    perm = rng.permutation(nb).astype(np.int32)
    bt = np.full((len(kv_lens), max(npages) + 1), -5, np.int32)
    rows, at = [], 0
    for r, (s, n) in enumerate(zip(kv_lens, npages)):
        bt[r, :n] = perm[at:at + n]
        rows.append(kv[perm[at:at + n]].reshape(-1, 1, dc + dr)[:s])
        at += n
    q = rng.standard_normal((len(kv_lens), 1, h, dc + dr)).astype(np.float32)
    cache = kv[:, None] if four_d else kv
    return cache, bt, np.array(kv_lens, np.int32), q, rows


@pytest.mark.parametrize("four_d", [False, True])
def test_trtllm_mla_decode_matches_reference(four_d):
    """MLA decode: query [B, 1, H, Dc + Dr] over latent rows, values c_kv;
    bmm1_scale the softmax scale, bmm2_scale a factor on the output; out [B,
    1, H, Dc] written in place; an lse in the base return_lse_base names; a
    request without keys gives zeros."""
    cache, bt, sl, q, rows = _mla_case(61, four_d=four_d)
    f = fi.mla.trtllm_batch_decode_with_kv_cache_mla
    out = np.full((4, 1, 4, 64), np.nan, np.float32)
    got = f(q, cache, None, 32, 64, 16, bt, sl, 40, out=out, bmm1_scale=0.06, bmm2_scale=0.5)
    assert got is out
    ref, rl = attention(q[:, 0], rows, [r[..., :64] for r in rows], [1] * 4, causal=False,
                        scale=0.06)
    np.testing.assert_allclose(out[:, 0], 0.5 * ref, **TOL)
    assert not out[2].any()
    got, lse = f(q, cache, None, 32, 64, 16, bt, sl, 40, bmm1_scale=0.06, return_lse=True,
                 return_lse_base="basee")
    assert got.shape == (4, 1, 4, 64)
    np.testing.assert_allclose(got[:, 0], ref, **TOL)
    np.testing.assert_allclose(lse[[0, 1, 3]], rl[[0, 1, 3]], rtol=1e-5, atol=1e-4)
    given = np.full((4, 4), np.nan, np.float32)
    got = f(q, cache, None, 32, 64, 16, bt, sl, 40, bmm1_scale=0.06, lse=given,
            return_lse_base="base2")  # a given lse is written without return_lse
    assert got.shape == (4, 1, 4, 64)
    np.testing.assert_allclose(given[[0, 1, 3]], rl[[0, 1, 3]] / math.log(2), rtol=1e-5,
                               atol=1e-4)


_MLA_REFUSED = [
    dict(sparse_mla_top_k=8), dict(sparse_mla_top_k_lens=np.ones(4, np.int32)),
    dict(backend="sparse"), dict(backend="cake"), dict(cum_seq_lens_q=np.arange(5), max_q_len=1),
    dict(return_lse=True), dict(lse=np.zeros((4, 4), np.float32)),
    dict(sinks=np.zeros(4, np.float32)), dict(skip_softmax_threshold_scale_factor=1.0),
    dict(use_fp16_softmax=True), dict(uses_shared_paged_kv_idx=False), dict(enable_dcp=True),
    dict(cp_world=2), dict(bmm1_scale=0.0)]


@pytest.mark.parametrize("kw", _MLA_REFUSED, ids=lambda kw: ",".join(kw))
def test_trtllm_mla_decode_refuses_what_it_cannot_match(kw):
    """UnsupportedError for each argument kvattn cannot honour, nothing
    written; without it the same call runs."""
    cache, bt, sl, q, rows = _mla_case(62)
    out = np.full((4, 1, 4, 64), 7.0, np.float32)
    f = fi.decode.trtllm_batch_decode_with_kv_cache_mla
    with pytest.raises(kvattn.UnsupportedError):
        f(q, cache, None, 32, 64, 16, bt, sl, 40, out=out, **kw)
    assert (out == 7.0).all()
    f(q, cache, None, 32, 64, 16, bt, sl, 40, out=out, bmm1_scale=0.1)
    ref, _ = attention(q[:, 0], rows, [r[..., :64] for r in rows], [1] * 4, causal=False,
                       scale=0.1)
    np.testing.assert_allclose(out[:, 0], ref, **TOL)


def test_trtllm_mla_decode_bad_inputs():
    """Two query rows per request (speculative decoding) are refused; a
    query / kv_cache width other than kv_lora_rank + qk_rope_head_dim,
    seq_lens past max_seq_len and an unknown return_lse_base raise; nothing
    is written."""
    cache, bt, sl, q, rows = _mla_case(63)
    out = np.full((4, 1, 4, 64), 7.0, np.float32)
    f = fi.mla.trtllm_batch_decode_with_kv_cache_mla
    with pytest.raises(kvattn.UnsupportedError, match="q_len_per_request 2"):
        f(np.concatenate([q, q], 1), cache, None, 32, 64, 16, bt, sl, 40)
    with pytest.raises(kvattn.InvalidArgumentError, match="kv_lora_rank"):
        f(q, cache, None, 32, 48, 16, bt, sl, 40, out=out)
    with pytest.raises(kvattn.InvalidArgumentError, match="max_seq_len"):
        f(q, cache, None, 32, 64, 16, bt, sl, 39, out=out)
    with pytest.raises(kvattn.KvaError):
        f(q, cache, None, 32, 64, 16, bt, sl, 40, out=out, return_lse=True,
          return_lse_base="base10")
    assert (out == 7.0).all()
