"""Arguments documented as a bool or an enum (polish45, session 41): a
string, int or None where a bool is documented is InvalidArgumentError naming
the argument, not its truth ("no" was true); a bool where an enum, dtype or
integer is documented is refused too (True == 1 picked the enum's value 1).
numpy and torch bool scalars are bools."""

import numpy as np
import pytest

import kvattn
from features import need_hash
from poison import fill, poisoned, untouched

try:
    import torch
except ImportError:  # the CPU venv of CI has no torch: its cases skip
    torch = None

RNG = np.random.default_rng(45)
NOT_BOOLS = ["no", "", "False", 0, 1, None, 1.0, [True]]


def _bools():
    b = [True, False, np.True_, np.False_, np.array(True), np.array(False)]
    if torch is not None:
        b += [torch.tensor(True), torch.tensor(False)]
    return b


def _plan(ctx, **kw):
    kw.setdefault("q_dtype", "f32")
    return kvattn.Plan(ctx, [0, 2], [6], [[0, 1]], block_size=4, num_heads=2, num_kv_heads=1,
                       head_dim=16, **kw)


def _cache(ctx):
    c = kvattn.Cache(ctx, 2, 4, 1, 16, dtype="f32")
    c.k_array()[:] = RNG.standard_normal(c.k_array().shape)
    c.v_array()[:] = RNG.standard_normal(c.v_array().shape)
    return c


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_pool_enable_prefix_caching_not_bool(bad):
    with pytest.raises(kvattn.InvalidArgumentError, match="enable_prefix_caching"):
        kvattn.Pool(16, 4, enable_prefix_caching=bad)


@pytest.mark.parametrize("flag", _bools())
def test_pool_enable_prefix_caching_bools(flag):
    """A bool of any kind is taken at its value: a prompt added twice hits
    the cache only with prefix caching on."""
    if flag:
        need_hash()
    p = kvattn.Pool(16, 4, enable_prefix_caching=flag)
    r, _ = p.add_request(list(range(9)))
    p.allocate(r, 9)
    p.append_tokens(r, list(range(9)))
    _, cached = p.add_request(list(range(9)))
    assert cached == (8 if bool(flag) else 0)


@pytest.mark.parametrize("bad", [True, False, np.True_])
def test_pool_hash_bool_refused(bad):
    with pytest.raises(kvattn.InvalidArgumentError, match="hash"):
        kvattn.Pool(16, 4, hash=bad)


@pytest.mark.parametrize("h", ["sha256", "xxh3_128", 0, 1])
def test_pool_hash_names_and_codes(h):
    need_hash(h)
    kvattn.Pool(16, 4, hash=h).check()


@pytest.mark.parametrize("bad", [True, np.True_])
def test_pool_request_id_bool_refused(bad):
    need_hash()
    p = kvattn.Pool(16, 4)
    rs = [p.add_request([1, 2, 3])[0] for _ in range(2)]
    assert 1 in rs  # so that True == 1 would name a live request
    with pytest.raises(kvattn.InvalidArgumentError, match="integer"):
        p.allocate(bad, 3)
    with pytest.raises(kvattn.InvalidArgumentError, match="integer"):
        p.free(bad)
    assert [p.request_info(r)["num_blocks"] for r in rs] == [0, 0]  # nothing allocated or freed
    p.check()


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_plan_causal_not_bool(bad):
    ctx = kvattn.Context("cpu", 1)
    with pytest.raises(kvattn.InvalidArgumentError, match="causal"):
        _plan(ctx, causal=bad)


def test_plan_causal_bools_at_their_value():
    """causal=np.False_ (or a 0-d torch bool) is the non-causal mask, after a
    plan of causal=True on the same context (whose template is cached)."""
    ctx = kvattn.Context("cpu", 1)
    c = _cache(ctx)
    q = RNG.standard_normal((2, 2, 16)).astype(np.float32)
    on = _plan(ctx, causal=True).run(q, c)
    off = _plan(ctx, causal=False).run(q, c)
    assert not np.allclose(on, off)
    for flag in _bools():
        got = _plan(ctx, causal=flag).run(q, c)
        np.testing.assert_array_equal(got, on if bool(flag) else off)


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_run_return_lse_not_bool(bad):
    """run / run_ragged: a non-bool return_lse raises before any output is
    written (the given out keeps its poison)."""
    ctx = kvattn.Context("cpu", 1)
    c = _cache(ctx)
    plan = _plan(ctx)
    q = RNG.standard_normal((2, 2, 16)).astype(np.float32)
    out = poisoned((2, 2, 16))
    with pytest.raises(kvattn.InvalidArgumentError, match="return_lse"):
        plan.run(q, c, out=out, return_lse=bad)
    assert untouched(out)
    kv = RNG.standard_normal((6, 1, 16)).astype(np.float32)
    rag = kvattn.Plan(ctx, [0, 2], [6], None, block_size=1, num_heads=2, num_kv_heads=1,
                      head_dim=16, q_dtype="f32")
    with pytest.raises(kvattn.InvalidArgumentError, match="return_lse"):
        rag.run_ragged(q, kv, kv, out=out, return_lse=bad)
    assert untouched(out)


@pytest.mark.parametrize("flag", _bools())
def test_run_return_lse_bools(flag):
    ctx = kvattn.Context("cpu", 1)
    c = _cache(ctx)
    q = RNG.standard_normal((2, 2, 16)).astype(np.float32)
    res = _plan(ctx).run(q, c, return_lse=flag)
    assert isinstance(res, tuple) == bool(flag)


def _index_plan(ctx):
    c = kvattn.Cache.index(ctx, 2, 4, head_dim=16, fp8=False, dtype="f32")
    fill(c.k_array())
    c.k_array()[:] = RNG.standard_normal(c.k_array().shape)
    p = kvattn.Plan(ctx, [0, 2], [6], [[0, 1]], block_size=4, num_heads=2, num_kv_heads=1,
                    head_dim=16, q_dtype="f32", kind="index", sparse_topk=4)
    return p, c


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_run_indexer_return_lengths_not_bool(bad):
    ctx = kvattn.Context("cpu", 1)
    plan, c = _index_plan(ctx)
    q = RNG.standard_normal((2, 2, 16)).astype(np.float32)
    w = RNG.standard_normal((2, 2)).astype(np.float32)
    ind = np.full((2, 4), -5, np.int32)
    with pytest.raises(kvattn.InvalidArgumentError, match="return_lengths"):
        plan.run_indexer(q, w, c, indices=ind, return_lengths=bad)
    assert np.all(ind == -5)
    assert isinstance(plan.run_indexer(q, w, c, return_lengths=np.True_), tuple)


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_cache_index_fp8_not_bool(bad):
    ctx = kvattn.Context("cpu", 1)
    with pytest.raises(kvattn.InvalidArgumentError, match="fp8"):
        kvattn.Cache.index(ctx, 2, 4, head_dim=16, fp8=bad)


@pytest.mark.parametrize("bad", [True, False, np.True_])
def test_enums_and_dtypes_refuse_bools(bad):
    """backend, kind, sparse_mode, dtypes and integers (num_threads): a bool is not the enum's
    code 0 / 1 (main took backend=True as "cpu", dtype=True as f16)."""
    with pytest.raises(kvattn.InvalidArgumentError, match="backend"):
        kvattn.Context(bad, 1)
    ctx = kvattn.Context("cpu", 1)
    with pytest.raises(kvattn.InvalidArgumentError, match="kind"):
        _plan(ctx, kind=bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="sparse_mode"):
        _plan(ctx, sparse_mode=bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="dtype"):
        _plan(ctx, q_dtype=bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="dtype"):
        kvattn.Cache(ctx, 2, 4, 1, 16, dtype=bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="num_threads"):
        kvattn.Context("cpu", bad)


@pytest.mark.parametrize("flag", _bools())
def test_plan_cascade_bools_are_on_off(flag):
    """Plan(cascade=True / False) is documented as "on" / "off"; numpy and
    torch bools too."""
    ctx = kvattn.Context("cpu", 1)
    _plan(ctx, cascade=flag)
