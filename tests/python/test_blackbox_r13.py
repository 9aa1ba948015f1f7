"""Session 42, api53: three defects of the Python package that api52 noted.

1. A FlashInfer wrapper made without context= and without a CUDA workspace
   holds the default context; after a caller closed it (default_context()
   then makes a new one), the wrapper's plan() and run() failed with
   NullPointerError ("ctx is NULL"). Now plan() plans on the new default
   context; run() of a plan made on the closed one is refused with a clear
   InvalidArgumentError (never run on the new context), nothing written. A
   closed context the caller gave is refused at plan() the same way.
2. _paged_metadata computed (pages - 1) * page_size + last_page_len in int32
   and wrapped past 2**31 - 1 keys (2**32 + 5 keys planned as 5): now
   InvalidArgumentError, the wrapper's earlier plan kept.
3. The trtllm functions truncated a fractional max_seq_len (int(12.5) = 12):
   FlashInfer 0.7.2 declares it int and its kernel call refuses floats with
   TypeError; now refused (an error both TypeError and InvalidArgumentError),
   ints, bools and numpy integers accepted as FlashInfer's."""

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from kvattn.flashinfer import decode as fi_decode
from kvattn.flashinfer import mla as fi_mla
from poison import poisoned, untouched
from reference import attention
from test_flashinfer import random_paged

D = 32


def _close_default():
    """Closes the process's CPU default context as a caller may, and makes
    the new one (so a wrapper that ran its old plan on whatever default
    context is current would find a live one)."""
    old = kvattn.default_context()
    with kvattn.default_context():
        pass  # closed on leaving
    new = kvattn.default_context()
    assert new is not old and new._h and not old._h
    return new


def _paged_case(kind):
    """(wrapper class, plan(w), run(w, out), out shape, the reference out)."""
    rng = np.random.default_rng(53)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, [30, 50], 8, 2, D, "NHD", np.float32, False)
    if kind == "decode":
        q = rng.standard_normal((2, 4, D)).astype(np.float32)
        want, _ = attention(q, keys, values, [1, 1], causal=True, scale=0.3)

        def plan(w, heads=4):
            w.plan(indptr, indices, last, heads, 2, D, 8, q_data_type="float32", sm_scale=0.3)
        cls = fi.BatchDecodeWithPagedKVCacheWrapper
    else:
        qo = np.array([0, 5, 12], np.int32)
        q = rng.standard_normal((12, 4, D)).astype(np.float32)
        want, _ = attention(q, keys, values, [5, 7], causal=True, scale=0.3)

        def plan(w, heads=4):
            w.plan(qo, indptr, indices, last, heads, 2, D, 8, causal=True,
                   q_data_type="float32", sm_scale=0.3)
        cls = fi.BatchPrefillWithPagedKVCacheWrapper
    return (lambda **kw: cls(None, "NHD", **kw)), plan, \
        (lambda w, out: w.run(q, paged, out=out)), q.shape, want


def _ragged_case():
    rng = np.random.default_rng(54)
    qo, kv = np.array([0, 4, 9], np.int32), np.array([0, 6, 11], np.int32)
    q = rng.standard_normal((9, 4, D)).astype(np.float32)
    k = rng.standard_normal((11, 2, D)).astype(np.float32)
    v = rng.standard_normal((11, 2, D)).astype(np.float32)
    want, _ = attention(q, [k[:6], k[6:]], [v[:6], v[6:]], [4, 5], causal=True)

    def plan(w, heads=4):
        w.plan(qo, kv, heads, 2, D, causal=True, q_data_type="float32")
    return (lambda **kw: fi.BatchPrefillWithRaggedKVCacheWrapper(None, **kw)), plan, \
        (lambda w, out: w.run(q, k, v, out=out)), q.shape, want


def _mla_case():
    from test_mla import CASES, Layer, NP_DT

    rng = np.random.default_rng(55)
    lay = Layer(rng, dt="f32", **CASES[0])
    kl = np.array(lay.seq_lens, np.int32)
    qa = lay.absorbed_q().astype(NP_DT["f32"])
    want, _ = lay.naive_latent(qa)

    def plan(w, heads=lay.h):
        w.plan(qo_indptr=lay.qsl, kv_indptr=lay.indptr, kv_indices=lay.indices, kv_len_arr=kl,
               num_heads=heads, head_dim_ckv=lay.dc, head_dim_kpe=lay.dr, page_size=lay.bs,
               causal=True, sm_scale=lay.scale, q_data_type="float32")
    return (lambda **kw: fi.BatchMLAPagedAttentionWrapper(None, **kw)), plan, \
        (lambda w, out: w.run(query=qa, kv_cache=lay.kv, out=out)), want.shape, want


CASES = {"decode": lambda: _paged_case("decode"), "prefill": lambda: _paged_case("prefill"),
         "ragged": _ragged_case, "mla": _mla_case}
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_wrapper_over_a_closed_default_context(kind):
    """A wrapper made with float_workspace_buffer=None: after the default
    context was closed (and made again), run() of the old plan raises
    InvalidArgumentError naming the closed context, out untouched; a new
    plan() plans on the new default context and runs as before."""
    make, plan, run, shape, want = CASES[kind]()
    w = make()
    plan(w)
    out = poisoned(shape)
    run(w, out)
    np.testing.assert_allclose(out, want, **TOL)
    before = out.copy()
    new = _close_default()
    out = poisoned(shape)
    with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
        run(w, out)  # the old plan is not run on the new context
    assert untouched(out)
    plan(w)
    assert w._ctx is new
    out = poisoned(shape)
    run(w, out)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_refused_plan_after_the_close_keeps_refusing_the_old_plan(kind):
    """A plan() refused after the default context was closed (num_heads not a
    multiple of num_kv_heads) leaves the old plan, still refused by run()
    (it is not run on the new context the wrapper now holds)."""
    make, plan, run, shape, _ = CASES[kind]()
    w = make()
    plan(w)
    _close_default()
    with pytest.raises(kvattn.KvaError):
        plan(w, heads=3 if kind != "mla" else 0)
    out = poisoned(shape)
    with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
        run(w, out)
    assert untouched(out)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_wrapper_over_a_closed_given_context(kind):
    """A context the caller gave (context=) and closed is not replaced:
    plan() raises InvalidArgumentError naming it, run() of the plan made
    before the close too; nothing written."""
    make, plan, run, shape, want = CASES[kind]()
    ctx = kvattn.Context("cpu", 1)
    w = make(context=ctx)
    plan(w)
    ctx.close()
    out = poisoned(shape)
    with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
        run(w, out)
    assert untouched(out)
    with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
        plan(w)


def test_paged_lengths_past_int32_refused():
    """(pages - 1) * page_size + last_page_len = 2**32 + 5 keys (65,537 pages
    of 65,536) is refused by the decode and the prefill wrapper's plan(),
    which keeps the earlier plan (a run gives its result); in int32 it
    wrapped to a 5-key request. 2**31 - 1 keys, an int32, still reaches C,
    whose own bound (KVA_MAX_SEQ_LEN) refuses it: the new check is not one
    short."""
    for kind in ("decode", "prefill"):
        make, plan, run, shape, want = CASES[kind]()
        w = make()
        plan(w)

        def big(pages, page, last):
            ip, ix = np.array([0, pages], np.int32), np.zeros(pages, np.int32)
            lp = np.array([last], np.int32)
            if kind == "decode":
                w.plan(ip, ix, lp, 4, 2, D, page, q_data_type="float32")
            else:
                w.plan(np.array([0, 1], np.int32), ip, ix, lp, 4, 2, D, page,
                       q_data_type="float32")

        with pytest.raises(kvattn.InvalidArgumentError, match="2\\*\\*31"):
            big(2 ** 16 + 1, 2 ** 16, 5)
        out = poisoned(shape)
        run(w, out)
        np.testing.assert_allclose(out, want, **TOL)
        with pytest.raises(kvattn.OutOfRangeError, match="2147483647"):
            big(2 ** 15, 2 ** 16, 2 ** 16 - 1)
        out = poisoned(shape)
        run(w, out)
        np.testing.assert_allclose(out, want, **TOL)


def _trtllm_calls():
    rng = np.random.default_rng(56)
    k = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    kv = rng.standard_normal((3, 4, 80)).astype(np.float32)
    qm = rng.standard_normal((1, 1, 4, 80)).astype(np.float32)
    bt, sl = np.array([[0, 1, 2]], np.int32), np.array([1])

    def dec(m, out=None):
        return fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, sl, m, out=out)

    def mla(m, out=None):
        return fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt, sl,
                                                            m, out=out)
    return ((dec, (1, 2, 8)), (mla, (1, 1, 4, 64)))


@pytest.mark.parametrize("bad", [12.5, 1.5, 12.0, np.float64(12.0), "12", None])
def test_trtllm_max_seq_len_not_an_integer_refused(bad):
    """max_seq_len is FlashInfer's int: a float (fractional or not), a string
    or None is refused, as its kernel call raises TypeError (the error is
    both TypeError and InvalidArgumentError), out untouched; int(12.5) used
    to truncate and run."""
    for f, shape in _trtllm_calls():
        out = poisoned(shape)
        with pytest.raises(TypeError, match="max_seq_len"):
            f(bad, out=out)
        with pytest.raises(kvattn.InvalidArgumentError, match="max_seq_len"):
            f(bad, out=out)
        assert untouched(out)


def test_trtllm_max_seq_len_integer_types_accepted():
    """FlashInfer's int argument takes Python ints, bools (an int) and numpy
    integers: each still runs, with the same result."""
    for f, shape in _trtllm_calls():
        want = f(12)
        for m in (np.int64(12), np.int32(12), np.uint16(12), 2 ** 40, True):
            out = poisoned(shape)
            f(m, out=out)
            np.testing.assert_array_equal(out, want)
        with pytest.raises(kvattn.InvalidArgumentError, match="max_seq_len"):
            f(0)  # seq_lens [1] > max_seq_len 0: the bound is still checked


@pytest.mark.parametrize("arg", ["kv_lora_rank", "qk_rope_head_dim"])
@pytest.mark.parametrize("bad", [64.5, 64.0, "64", None])
def test_trtllm_mla_head_dims_not_integers_refused(arg, bad):
    """kv_lora_rank and qk_rope_head_dim are FlashInfer's ints too: a float
    (int(64.5) = 64 used to run as 64), a string or None is refused with the
    argument's name, out untouched; the integer types still run."""
    rng = np.random.default_rng(57)
    kv = rng.standard_normal((3, 4, 80)).astype(np.float32)
    qm = rng.standard_normal((1, 1, 4, 80)).astype(np.float32)
    bt, sl = np.array([[0, 1, 2]], np.int32), np.array([1])
    dims = {"kv_lora_rank": 64, "qk_rope_head_dim": 16}

    def call(out=None, **kw):
        d = dict(dims, **kw)
        return fi_mla.trtllm_batch_decode_with_kv_cache_mla(
            qm, kv, None, 128, d["kv_lora_rank"], d["qk_rope_head_dim"], bt, sl, 12, out=out)
    want = call()
    out = poisoned((1, 1, 4, 64))
    with pytest.raises(TypeError, match=arg):
        call(out=out, **{arg: bad})
    with pytest.raises(kvattn.InvalidArgumentError, match=arg):
        call(out=out, **{arg: bad})
    assert untouched(out)
    out = poisoned((1, 1, 4, 64))
    call(out=out, **{arg: np.int64(dims[arg])})
    np.testing.assert_array_equal(out, want)
