"""kvattn.flashinfer against FlashInfer 0.7.2 (flashinfer-python 0.7.2.post1):
the deprecated forward() / forward_return_lse(), whose arguments replace the
plan's mask and scale; the prefill run()'s lse_base / lse_layout; plan() and
constructor keywords added in 0.7 (is_causal, uniform_q_len, jit_args,
variant_owns_mask); get_alibi_slopes' arguments. Each result is checked
against the numpy reference; the signatures themselves are frozen in
test_fi_signatures.py."""

import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from reference import attention
from test_flashinfer import random_paged

LOG2E = 1.0 / math.log(2.0)
D = 64


def _paged(seed, kv_lens=(30, 50)):
    rng = np.random.default_rng(seed)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, list(kv_lens), 8, 2, D, "NHD", np.float32, False)
    return rng, paged, indptr, indices, last, keys, values


def test_decode_forward_arguments_replace_the_plans():
    """FlashInfer's decode forward(q, kv, pos_encoding_mode, q_scale, k_scale,
    v_scale, window_left, logits_soft_cap, sm_scale, ...) sets the wrapper's
    mask and scale (defaults included) and runs: a positional k_scale is a
    k_scale, forward(q, kv) drops the plan's sm_scale and soft cap, and later
    run() calls keep forward()'s values. kvattn's forward was run(), which
    kept the plan's and refused positional arguments."""
    rng, paged, indptr, indices, last, keys, values = _paged(41)
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, D, 8, q_data_type="float32", sm_scale=0.3,
           logits_soft_cap=5.0)
    planned, _ = attention(q, keys, values, [1, 1], causal=True, scale=0.3, softcap=5.0)
    np.testing.assert_allclose(w.run(q, paged), planned, rtol=1e-5, atol=1e-5)
    plain, plain_lse = attention(q, keys, values, [1, 1], causal=True)
    assert np.abs(plain - planned).max() > 1e-2  # the check below can fail
    np.testing.assert_allclose(w.forward(q, paged), plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.run(q, paged), plain, rtol=1e-5, atol=1e-5)
    # positional: pos_encoding_mode, q_scale, k_scale, v_scale, window_left
    out = w.forward(q, paged, "NONE", None, 0.5, 2.0, 6)
    ro, _ = attention(q, keys, values, [1, 1], causal=True, window_left=6,
                      scale=0.5 / math.sqrt(D))
    np.testing.assert_allclose(out, 2.0 * ro, rtol=1e-5, atol=1e-5)
    out, lse = w.forward_return_lse(q, paged, sm_scale=0.2)
    ro, rl = attention(q, keys, values, [1, 1], causal=True, scale=0.2)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, rl * LOG2E, rtol=1e-5, atol=1e-4)
    with pytest.raises(kvattn.UnsupportedError, match="ROPE"):
        w.forward(q, paged, "ROPE_LLAMA")
    fresh = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvattn.InvalidArgumentError, match="before plan"):
        fresh.forward(q, paged)


def test_prefill_forward_arguments_replace_the_plans():
    """The paged prefill forward(q, kv, causal, pos_encoding_mode,
    use_fp16_qk_reduction, k_scale, v_scale, window_left, logits_soft_cap,
    sm_scale, ...): a positional causal is the causal flag."""
    rng, paged, indptr, indices, last, keys, values = _paged(42)
    qo = np.array([0, 5, 12], np.int32)
    q = rng.standard_normal((12, 4, D)).astype(np.float32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(qo, indptr, indices, last, 4, 2, D, 8, q_data_type="float32", sm_scale=0.3)
    full, _ = attention(q, keys, values, [5, 7], causal=False, scale=0.3)
    np.testing.assert_allclose(w.run(q, paged), full, rtol=1e-5, atol=1e-5)
    causal, causal_lse = attention(q, keys, values, [5, 7], causal=True)
    np.testing.assert_allclose(w.forward(q, paged, True), causal, rtol=1e-5, atol=1e-5)
    out, lse = w.forward_return_lse(q, paged, True, "NONE", False, None, 3.0)
    np.testing.assert_allclose(out, 3.0 * causal, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, causal_lse * LOG2E, rtol=1e-5, atol=1e-4)
    ro, _ = attention(q, keys, values, [5, 7], causal=False, scale=0.25, window_left=9)
    np.testing.assert_allclose(w.forward(q, paged, sm_scale=0.25, window_left=9), ro,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.run(q, paged), ro, rtol=1e-5, atol=1e-5)


def _ragged(seed):
    rng = np.random.default_rng(seed)
    qo = np.array([0, 4, 9], np.int32)
    kv = np.array([0, 6, 11], np.int32)
    q = rng.standard_normal((9, 4, 32)).astype(np.float32)
    k = rng.standard_normal((11, 2, 32)).astype(np.float32)
    v = rng.standard_normal((11, 2, 32)).astype(np.float32)
    return qo, kv, q, k, v, [k[:6], k[6:]], [v[:6], v[6:]]


def test_ragged_forward_arguments_replace_the_plans():
    qo, kv, q, k, v, keys, values = _ragged(43)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    w.plan(qo, kv, 4, 2, 32, causal=False, q_data_type="float32", logits_soft_cap=4.0)
    causal, causal_lse = attention(q, keys, values, [4, 5], causal=True)
    np.testing.assert_allclose(w.forward(q, k, v, True), causal, rtol=1e-5, atol=1e-5)
    out, lse = w.forward_return_lse(q, k, v, True, sm_scale=0.3)
    ro, rl = attention(q, keys, values, [4, 5], causal=True, scale=0.3)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, rl * LOG2E, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(w.run(q, k, v), ro, rtol=1e-5, atol=1e-5)


def _prefill_runs():
    """(run(**kw) of the paged and the ragged prefill wrappers, their
    reference out and natural-log LSE [T, H], T, H)."""
    rng, paged, indptr, indices, last, keys, values = _paged(44)
    qo = np.array([0, 5, 12], np.int32)
    q = rng.standard_normal((12, 4, D)).astype(np.float32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(qo, indptr, indices, last, 4, 2, D, 8, causal=True, q_data_type="float32")
    ro, rl = attention(q, keys, values, [5, 7], causal=True)
    rqo, rkv, rq, rk, rv, rkeys, rvalues = _ragged(45)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan(rqo, rkv, 4, 2, 32, causal=True, q_data_type="float32")
    ro2, rl2 = attention(rq, rkeys, rvalues, [4, 5], causal=True)
    return [(lambda **kw: w.run(q, paged, **kw), ro, rl),
            (lambda **kw: r.run(rq, rk, rv, **kw), ro2, rl2)]


@pytest.mark.parametrize("which", [0, 1])
def test_prefill_lse_base_and_layout(which):
    """FlashInfer 0.7's prefill run(lse_base="log2" | "ln", lse_layout="NH" |
    "HN"): the returned LSE in that base, [T, H] or a contiguous [H, T]; a
    given "HN" lse is written and returned; without return_lse a given lse
    is [T, H] base 2. kvattn raised TypeError for both keywords."""
    run, ro, rl = _prefill_runs()[which]
    t, h = rl.shape
    for base, mul in (("log2", LOG2E), ("ln", 1.0)):
        out, lse = run(return_lse=True, lse_base=base)
        np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(lse, rl * mul, rtol=1e-5, atol=1e-4)
        out, lse = run(return_lse=True, lse_base=base, lse_layout="HN")
        assert lse.shape == (h, t) and lse.flags.c_contiguous
        np.testing.assert_allclose(lse, (rl * mul).T, rtol=1e-5, atol=1e-4)
        given = np.full((h, t), np.nan, np.float32)
        out, lse = run(return_lse=True, lse_base=base, lse_layout="HN", lse=given)
        assert lse is given
        np.testing.assert_allclose(given, (rl * mul).T, rtol=1e-5, atol=1e-4)
    given = np.full((t, h), np.nan, np.float32)
    out = run(lse=given, lse_base="ln", lse_layout="HN")  # not returned: [T, H], base 2
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(given, rl * LOG2E, rtol=1e-5, atol=1e-4)
    out = poison.poisoned(ro.shape, np.float32)
    for kw, err in ((dict(lse_base="e"), ValueError), (dict(lse_layout="TH"), ValueError),
                    (dict(lse_layout="HN", lse=np.zeros((t, h), np.float32)),
                     kvattn.ShapeMismatchError),
                    (dict(lse_layout="HN", lse=np.zeros((t, h), np.float32).T),
                     kvattn.InvalidArgumentError)):
        with pytest.raises(err):
            run(return_lse=True, out=out, **kw)
        assert poison.untouched(out)


def test_custom_variant_arguments_raise():
    """jit_args (a custom JIT attention variant: the caller's own logits or
    mask code) and variant_owns_mask were accepted and ignored, so the run
    computed the default variant; they raise UnsupportedError now."""
    for cls in (fi.BatchDecodeWithPagedKVCacheWrapper, fi.BatchPrefillWithPagedKVCacheWrapper,
                fi.BatchPrefillWithRaggedKVCacheWrapper):
        with pytest.raises(kvattn.UnsupportedError, match="jit_args"):
            cls(None, "NHD", jit_args=["my_variant", "float16"])
        cls(None, "NHD", jit_args=None, backend="fa2")
    for cls in (fi.BatchPrefillWithPagedKVCacheWrapper, fi.BatchPrefillWithRaggedKVCacheWrapper):
        with pytest.raises(kvattn.UnsupportedError, match="variant_owns_mask"):
            cls(None, "NHD", variant_owns_mask=True)
        cls(None, "NHD", jit_kwargs={"x": 1}, variant_owns_mask=False)


def test_decode_is_causal_and_uniform_q_len():
    """Decode plan(is_causal=): FlashInfer 0.7 accepts only what q_len_per_req
    implies (None, or q_len_per_req > 1) and raises otherwise; the prefill
    wrappers' uniform_q_len is a scheduling hint and changes nothing."""
    rng, paged, indptr, indices, last, keys, values = _paged(46)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    w.plan(indptr, indices, last, 4, 2, D, 8, q_data_type="float32", is_causal=False)
    ro, _ = attention(q, keys, values, [1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, paged), ro, rtol=1e-5, atol=1e-5)
    w.plan(indptr, indices, last, 4, 2, D, 8, q_data_type="float32", q_len_per_req=2,
           is_causal=True)
    for n, c in ((1, True), (2, False)):
        with pytest.raises(kvattn.UnsupportedError, match="is_causal"):
            w.plan(indptr, indices, last, 4, 2, D, 8, q_data_type="float32", q_len_per_req=n,
                   is_causal=c)
    qo = np.array([0, 5, 12], np.int32)
    q = rng.standard_normal((12, 4, D)).astype(np.float32)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    p.plan(qo, indptr, indices, last, 4, 2, D, 8, causal=True, q_data_type="float32",
           uniform_q_len=4)
    ro, _ = attention(q, keys, values, [5, 7], causal=True)
    np.testing.assert_allclose(p.run(q, paged), ro, rtol=1e-5, atol=1e-5)
    rqo, rkv, rq, rk, rv, rkeys, rvalues = _ragged(47)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan(rqo, rkv, 4, 2, 32, causal=True, q_data_type="float32", uniform_q_len=4)
    ro, _ = attention(rq, rkeys, rvalues, [4, 5], causal=True)
    np.testing.assert_allclose(r.run(rq, rk, rv), ro, rtol=1e-5, atol=1e-5)


def test_get_alibi_slopes_arguments():
    """flashinfer.utils.get_alibi_slopes(n_heads, device=None): the keyword
    name and device (a torch tensor there)."""
    np.testing.assert_array_equal(fi.get_alibi_slopes(n_heads=8), 2.0 ** -np.arange(1, 9))
    torch = pytest.importorskip("torch")
    t = fi.get_alibi_slopes(12, device="cpu")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy(), fi.get_alibi_slopes(12))


class _Metadata:
    """Duck-typed FlashInfer MLAPlanMetadata (its dataclass fields)."""

    def __init__(self, **kw):
        for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "cum_seq_lens_q",
                  "block_tables", "seq_lens", "max_q_len"):
            setattr(self, n, kw.get(n))


def test_mla_plan_and_run_forms_of_flashinfer_07():
    """FlashInfer 0.7's MLA plan(): keyword metadata (CSR, dense page table or
    a metadata object) and the run contract keywords; run(query=, kv_cache=)
    with packed or split tensors. Each form gives the CSR / split result;
    keywords that would change the result raise with nothing written."""
    from test_mla import CASES, Layer, NP_DT, close

    rng = np.random.default_rng(48)
    lay = Layer(rng, dt="f32", **CASES[0])
    kl = np.array(lay.seq_lens, np.int32)
    qa = lay.absorbed_q().astype(NP_DT["f32"])
    want, want_lse = lay.naive_latent(qa)
    ckv, kpe = lay.kv[..., : lay.dc], lay.kv[..., lay.dc:]
    dims = dict(num_heads=lay.h, head_dim_ckv=lay.dc, head_dim_kpe=lay.dr, page_size=lay.bs,
                causal=True, sm_scale=lay.scale, q_data_type="float32")
    csr = dict(qo_indptr=lay.qsl, kv_indptr=lay.indptr, kv_indices=lay.indices, kv_len_arr=kl)
    dense = dict(cum_seq_lens_q=lay.qsl, block_tables=lay.block_table, seq_lens=kl)
    w = fi.BatchMLAPagedAttentionWrapper(None)
    for meta in (csr, dense, dict(metadata=_Metadata(**csr)), dict(metadata=_Metadata(**dense)),
                 dict(metadata=_Metadata(**csr, **dense))):
        w.plan(**meta, **dims, query_layout="split", kv_cache_layout="packed",
               lse_mode="base2", output_dtype="float32", enable_pdl=True, max_q_len=4)
        for q_kw in (dict(query=qa), dict(query=(qa[..., : lay.dc], qa[..., lay.dc:]))):
            for kv_kw in (dict(kv_cache=lay.kv), dict(kv_cache=(ckv, kpe))):
                out, lse = w.run(**q_kw, **kv_kw, return_lse=True)
                close(out, want, "f32")
                np.testing.assert_allclose(lse, want_lse * LOG2E, atol=1e-4, rtol=1e-5)
    out = poison.poisoned(want.shape, np.float32)
    for kw in (dict(sinks=np.zeros(lay.h, np.float32)), dict(bmm1_scale=1.0),
               dict(bmm2_scale=1.0), dict(skip_softmax_threshold_scale_factor=0.1)):
        with pytest.raises(kvattn.UnsupportedError):
            w.run(query=qa, kv_cache=lay.kv, out=out, **kw)
        assert poison.untouched(out)
    for kw, what in ((dict(query=qa, q_nope=qa, kv_cache=lay.kv), "together"),
                     (dict(query=qa), "ckv_cache"), (dict(kv_cache=lay.kv), "q_nope")):
        with pytest.raises(kvattn.InvalidArgumentError, match=what):
            w.run(**kw, out=out)
        assert poison.untouched(out)
    for kw in (dict(output_scale="per-tensor"), dict(scale_mode="kv-per-tensor"),
               dict(skip_softmax=True), dict(use_sinks=True), dict(output_dtype="float16")):
        with pytest.raises(kvattn.UnsupportedError):
            w.plan(**csr, **dims, **kw)
    for kw in (dict(lse_mode="base10"), dict(query_layout="interleaved")):
        with pytest.raises(ValueError):
            w.plan(**csr, **dims, **kw)
    with pytest.raises(kvattn.InvalidArgumentError, match="metadata"):
        w.plan(**dims, metadata=_Metadata(**csr), qo_indptr=lay.qsl)
    with pytest.raises(kvattn.InvalidArgumentError, match="needs"):
        w.plan(**dims, cum_seq_lens_q=lay.qsl)
    with pytest.raises(kvattn.InvalidArgumentError, match="num_heads"):
        w.plan(**csr, **dict(dims, num_heads=None))


def test_torch_lse_layout_and_forward():
    """The same with torch CPU tensors: an "HN" / "ln" LSE is a contiguous
    torch tensor, a given one is written in place; forward() on tensors."""
    torch = pytest.importorskip("torch")
    qo, kv, q, k, v, keys, values = _ragged(49)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    r.plan(torch.from_numpy(qo), torch.from_numpy(kv), 4, 2, 32, causal=True,
           q_data_type=torch.float32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    ro, rl = attention(q, keys, values, [4, 5], causal=True)
    given = torch.full((4, 9), float("nan"))
    out, lse = r.run(tq, tk, tv, return_lse=True, lse_base="ln", lse_layout="HN", lse=given)
    assert lse is given and lse.is_contiguous()
    np.testing.assert_allclose(given.numpy(), rl.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-5, atol=1e-5)
    out, lse = r.forward_return_lse(tq, tk, tv, True, sm_scale=0.3)
    ro, rl = attention(q, keys, values, [4, 5], causal=True, scale=0.3)
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), rl * LOG2E, rtol=1e-5, atol=1e-4)


def test_forward_with_the_plans_values_keeps_the_plan():
    """forward() whose arguments equal the current ones runs the standing
    plan (no replan per layer); a changed one replans."""
    rng, paged, indptr, indices, last, keys, values = _paged(50)
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(indptr, indices, last, 4, 2, D, 8, q_data_type="float32")
    first = w.forward(q, paged)
    plans = dict(w._plans)
    np.testing.assert_array_equal(w.forward(q, paged), first)
    assert w._plans == plans
    w.forward(q, paged, sm_scale=0.2)
    assert w._plans != plans
