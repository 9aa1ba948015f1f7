"""The core API (Context, Cache, Plan, run, merge_states, Pool) against the
numpy reference, and its errors: every bad input raises a KvaError subclass
with a message, and leaves outputs and caches untouched."""

import numpy as np
import pytest

import kvattn
from features import need_hash
from poison import poisoned, untouched
from reference import attention

RNG = np.random.default_rng(21)


@pytest.fixture(scope="module", params=["ref", "cpu"])
def ctx(request):
    c = kvattn.Context(request.param, num_threads=2)
    yield c
    c.close()


def make_batch(rng, q_lens, ctx_lens, block_size, num_blocks_extra=3):
    """A block table over a shuffled pool of blocks: (seq_lens, block_table, slots per request)."""
    seq_lens = np.asarray([c + q for c, q in zip(ctx_lens, q_lens)], np.int32)
    nblk = [(-(-s // block_size)) for s in seq_lens]
    total = sum(nblk) + num_blocks_extra
    perm = rng.permutation(total).astype(np.int32)
    bt = np.zeros((len(q_lens), max(max(nblk), 1)), np.int32)
    at = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[at: at + n]
        at += n
    slots = [bt[r, np.arange(s) // block_size] * block_size + np.arange(s) % block_size
             for r, s in enumerate(seq_lens)]
    return seq_lens, bt, slots, total


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_write_run_matches_reference(ctx, layout, dtype):
    npdt = np.float32 if dtype == "f32" else np.float16
    for case in range(4):
        h, hkv = [(4, 4), (8, 2), (6, 1), (4, 2)][case]
        d, dv = [(64, 64), (40, 40), (32, 48), (128, 128)][case]
        b = [16, 5, 1, 7][case]
        q_lens = RNG.integers(1, 6, size=3).tolist() + [1]
        ctx_lens = RNG.integers(0, 40, size=4).tolist()
        seq_lens, bt, slots, nb = make_batch(RNG, q_lens, ctx_lens, b)
        cache = kvattn.Cache(ctx, nb, b, hkv, d, dv, dtype=dtype, layout=layout)
        keys, values = [], []
        for r, s in enumerate(seq_lens):
            k = RNG.standard_normal((s, hkv, d)).astype(npdt)
            v = RNG.standard_normal((s, hkv, dv)).astype(npdt)
            cache.write(k, v, slots[r])
            keys.append(k)
            values.append(v)
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        q = RNG.standard_normal((qsl[-1], h, d)).astype(npdt)
        causal = case != 2
        window = [-1, 9, -1, 4][case]
        softcap = [0.0, 0.0, 5.0, 0.0][case]
        alibi = np.linspace(0.1, 0.8, h).astype(np.float32) if case == 3 else None
        sinks = RNG.standard_normal(h).astype(np.float32) if case == 1 else None
        plan = kvattn.Plan(ctx, qsl, seq_lens, bt, block_size=b, num_heads=h, num_kv_heads=hkv,
                           head_dim=d, head_dim_v=dv, q_dtype=dtype, causal=causal,
                           window_left=window, softcap=softcap, alibi_slopes=alibi)
        out = np.full((qsl[-1], h, dv), np.nan, npdt)
        lse = np.full((qsl[-1], h), np.nan, np.float32)
        res = plan.run(q, cache, out=out, lse=lse, sinks=sinks)
        assert res[0] is out and res[1] is lse
        ro, rl = attention(q, keys, values, q_lens, causal=causal, window_left=window,
                           softcap=softcap, alibi=alibi, sinks=sinks)
        tol = 1e-5 if dtype == "f32" else 1e-3
        np.testing.assert_allclose(out.astype(np.float64), ro, rtol=tol, atol=tol)
        np.testing.assert_allclose(lse, rl, rtol=tol, atol=tol)
        info = plan.info
        assert info.num_tokens == qsl[-1] and info.max_seq_len == seq_lens.max()
        # The cache holds what was written (host view of its storage).
        ka = cache.k_array()
        blk, off = slots[0][0] // b, slots[0][0] % b
        row = ka[blk, off] if layout == "NHD" else ka[blk, :, off]
        np.testing.assert_array_equal(row, keys[0][0])


def test_run_allocates_outputs_and_run_alias(ctx):
    seq_lens, bt, slots, nb = make_batch(RNG, [1, 1], [10, 20], 4)
    cache = kvattn.Cache(ctx, nb, 4, 2, 16, dtype="f32")
    for r, s in enumerate(seq_lens):
        cache.write(RNG.standard_normal((s, 2, 16), np.float32),
                    RNG.standard_normal((s, 2, 16), np.float32), slots[r])
    plan = kvattn.Plan(ctx, [0, 1, 2], seq_lens, bt, block_size=4, num_heads=4, num_kv_heads=2,
                       head_dim=16, q_dtype="f32")
    q = RNG.standard_normal((2, 4, 16), np.float32)
    out = plan.run(q, cache)
    out2, lse = kvattn.run(plan, q, cache, return_lse=True)
    assert out.shape == (2, 4, 16) and lse.shape == (2, 4) and lse.dtype == np.float32
    np.testing.assert_array_equal(out, out2)
    assert plan.info.state == "decode_only"


def test_plan_update_equals_fresh_plan(ctx):
    """Plan.update (kva_plan_update) re-plans in place: each step's outputs
    equal a fresh Plan's bit for bit; a bad batch raises and changes nothing."""
    b, h, hkv, d = 4, 8, 2, 32
    cache = kvattn.Cache(ctx, 200, b, hkv, d, dtype="f32")
    ka, va = cache.k_array(), cache.v_array()
    ka[...] = RNG.standard_normal(ka.shape)
    va[...] = RNG.standard_normal(va.shape)
    kw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, q_dtype="f32")
    plan = None
    for step in range(6):
        q_lens = RNG.integers(1, 5, size=int(RNG.integers(1, 6))).tolist()
        ctx_lens = RNG.integers(0, 60, size=len(q_lens)).tolist()
        seq_lens, bt, _, _ = make_batch(RNG, q_lens, ctx_lens, b)
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        if plan is None:
            plan = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw)
        else:
            assert plan.update(qsl, seq_lens, bt) is plan
        fresh = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw)
        q = RNG.standard_normal((qsl[-1], h, d)).astype(np.float32)
        out, lse = plan.run(q, cache, return_lse=True)
        ref_out, ref_lse = fresh.run(q, cache, return_lse=True)
        np.testing.assert_array_equal(out, ref_out)
        np.testing.assert_array_equal(lse, ref_lse)
        assert plan.num_tokens == qsl[-1] and plan.info.num_tokens == qsl[-1]
    bad = bt.copy()
    bad[0, 0] = -1
    with pytest.raises(kvattn.OutOfRangeError):
        plan.update(qsl, seq_lens, bad)
    np.testing.assert_array_equal(plan.run(q, cache), ref_out)


def test_run_ragged(ctx):
    q_lens, s_lens = [3, 5], [4, 5]
    qsl = np.array([0, 3, 8], np.int32)
    q = RNG.standard_normal((8, 4, 32), np.float32)
    k = RNG.standard_normal((9, 2, 32), np.float32)
    v = RNG.standard_normal((9, 2, 32), np.float32)
    plan = kvattn.Plan(ctx, qsl, s_lens, None, block_size=1, num_heads=4, num_kv_heads=2,
                       head_dim=32, q_dtype="f32", causal=True)
    out, lse = plan.run_ragged(q, k, v, return_lse=True)
    ro, rl = attention(q, [k[:4], k[4:]], [v[:4], v[4:]], q_lens, causal=True)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)


def test_merge_states_formula(ctx):
    a = RNG.standard_normal((5, 3, 16)).astype(np.float32)
    b = RNG.standard_normal((5, 3, 16)).astype(np.float32)
    la = RNG.standard_normal((5, 3)).astype(np.float32)
    lb = RNG.standard_normal((5, 3)).astype(np.float32)
    la[0, 0] = -np.inf
    out, lse = kvattn.merge_states(a, la, b, lb, ctx=ctx)
    wa, wb = np.exp(la.astype(np.float64)), np.exp(lb.astype(np.float64))
    ref = (wa[..., None] * a + wb[..., None] * b) / (wa + wb)[..., None]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, np.log(wa + wb), rtol=1e-5, atol=1e-6)


def test_merge_states_overlap_raises(ctx):
    """merge_states in place (out / lse the inputs themselves) runs; an out
    overlapping an input any other way raises, nothing written."""
    buf = RNG.standard_normal((3, 5, 3, 16)).astype(np.float32)
    a, b = buf[0], buf[1]
    la = RNG.standard_normal((5, 3)).astype(np.float32)
    lb = RNG.standard_normal((5, 3)).astype(np.float32)
    want, want_lse = kvattn.merge_states(a, la, b, lb, ctx=ctx)
    keep = buf.copy()
    flat = buf.reshape(-1)
    shifted = flat[16: 16 + 5 * 3 * 16].reshape(5, 3, 16)  # out_a one head row on
    with pytest.raises(kvattn.InvalidArgumentError, match="out_a"):
        kvattn.merge_states(a, la, b, lb, out=shifted, ctx=ctx)
    np.testing.assert_array_equal(buf, keep)
    out, lse = kvattn.merge_states(a, la, b, lb, out=a, lse=la, ctx=ctx)
    assert out is a and lse is la
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(la, want_lse)


def test_copy_and_swap_blocks(ctx):
    c = kvattn.Cache(ctx, 6, 4, 2, 16, dtype="f32")
    k = RNG.standard_normal((24, 2, 16), np.float32)
    c.write(k, k, np.arange(24))
    c.copy_blocks([[1, 5]])
    np.testing.assert_array_equal(c.k_array()[5], c.k_array()[1])
    host = kvattn.Cache(ctx, 3, 4, 2, 16, dtype="f32")
    c.swap_blocks(host, [[2, 0], [3, 2]])
    np.testing.assert_array_equal(host.k_array()[0], c.k_array()[2])
    np.testing.assert_array_equal(host.v_array()[2], c.v_array()[3])


def test_from_interleaved(ctx):
    kv = RNG.standard_normal((3, 2, 4, 2, 16)).astype(np.float32)
    c = kvattn.Cache.from_interleaved(ctx, kv)
    assert c.num_blocks == 5
    kn = RNG.standard_normal((1, 2, 16)).astype(np.float32)
    vn = RNG.standard_normal((1, 2, 16)).astype(np.float32)
    c.write(kn, vn, [2 * 2 * 4 + 3])  # page 2, offset 3 = block 4
    np.testing.assert_array_equal(kv[2, 0, 3], kn[0])
    np.testing.assert_array_equal(kv[2, 1, 3], vn[0])


def test_from_tensors_shares_memory(ctx):
    k = np.zeros((4, 8, 2, 16), np.float16)
    v = np.zeros((4, 8, 2, 16), np.float16)
    c = kvattn.Cache.from_tensors(ctx, k, v)
    kn = RNG.standard_normal((3, 2, 16)).astype(np.float16)
    c.write(kn, kn, [9, 10, 31])
    np.testing.assert_array_equal(k[1, 1], kn[0])
    np.testing.assert_array_equal(v[3, 7], kn[2])


def test_write_from_the_cache_itself_raises(ctx):
    """k / v rows inside the cache's own storage (kvattn.h's aliasing rule):
    InvalidArgumentError naming both, the storage unchanged; rows in the
    buffer right after the storage are fine."""
    buf = RNG.standard_normal(2 * 4 * 8 * 2 * 16 + 3 * 2 * 16).astype(np.float16)
    k = buf[: 4 * 8 * 2 * 16].reshape(4, 8, 2, 16)
    v = buf[4 * 8 * 2 * 16: 2 * 4 * 8 * 2 * 16].reshape(4, 8, 2, 16)
    rows = buf[2 * 4 * 8 * 2 * 16:].reshape(3, 2, 16)
    c = kvattn.Cache.from_tensors(ctx, k, v)
    keep = buf.copy()
    with pytest.raises(kvattn.InvalidArgumentError, match="cache K.*overlaps|overlaps.*cache K"):
        c.write(k[2, :3], rows, [0, 1, 2])
    with pytest.raises(kvattn.InvalidArgumentError, match="overlaps"):
        c.write(rows, v[0, 5:8], [0, 1, 2])
    np.testing.assert_array_equal(buf, keep)
    c.write(rows, rows, [0, 1, 2])  # touching V's end: runs
    np.testing.assert_array_equal(k[0, :3], rows)


def test_quantized_cache_int8():
    ctx = kvattn.Context("cpu", 1)
    hkv, d = 2, 32
    c = kvattn.Cache(ctx, 4, 8, hkv, d, dtype="i8", quant="int8_channel",
                     k_scale=np.full(hkv * d, 0.04, np.float32), v_scale=[0.04])
    assert c.quant == "int8_channel" and c.dtype == "i8"
    k = RNG.standard_normal((8, hkv, d)).astype(np.float32)
    c.write(k, k, np.arange(8))
    np.testing.assert_allclose(c.k_array()[0].astype(np.float32) * 0.04, k, atol=0.0201)
    bad = k.copy()
    bad[3, 1, 5] = np.nan
    before = c.k_array().copy()
    with pytest.raises(kvattn.InvalidArgumentError, match="NaN|nan"):
        c.write(bad, k, np.arange(8))
    np.testing.assert_array_equal(c.k_array(), before)


def _decode_setup(ctx):
    seq_lens, bt, slots, nb = make_batch(RNG, [1, 1], [7, 3], 4)
    cache = kvattn.Cache(ctx, nb, 4, 2, 16, dtype="f32")
    plan = kvattn.Plan(ctx, [0, 1, 2], seq_lens, bt, block_size=4, num_heads=4, num_kv_heads=2,
                       head_dim=16, q_dtype="f32")
    return cache, plan


def test_run_bad_inputs_raise_and_leave_outputs(ctx):
    cache, plan = _decode_setup(ctx)
    q = RNG.standard_normal((2, 4, 16), np.float32)
    out = poisoned((2, 4, 16))
    cases = [
        (dict(q=q[:1]), kvattn.ShapeMismatchError),
        (dict(q=q.astype(np.float16)), kvattn.DtypeMismatchError),
        (dict(q=np.ascontiguousarray(q.transpose(1, 0, 2)).transpose(1, 0, 2)),
         kvattn.InvalidArgumentError),
        (dict(out=np.zeros((2, 4, 8), np.float32)), kvattn.ShapeMismatchError),
        (dict(lse=np.zeros((2, 4), np.float64)), kvattn.DtypeMismatchError),
        (dict(sinks=np.zeros(3, np.float32)), kvattn.ShapeMismatchError),
        (dict(cache=kvattn.Cache(ctx, 4, 8, 2, 16, dtype="f32")), kvattn.ShapeMismatchError),
        (dict(cache=kvattn.Cache(ctx, 4, 4, 2, 16, dtype="f16")), kvattn.KvaError),
        (dict(q=[[1.0]]), kvattn.InvalidArgumentError),
    ]
    for kw, exc in cases:
        args = dict(q=q, cache=cache, out=out)
        args.update(kw)
        with pytest.raises(exc) as ei:
            plan.run(args.pop("q"), args.pop("cache"), **args)
        assert ei.value.message
        assert untouched(out), kw


def test_plan_errors_carry_last_error(ctx):
    with pytest.raises(kvattn.KvaError) as ei:
        kvattn.Plan(ctx, [0, 2], [1], [[0]], block_size=4, num_heads=4, num_kv_heads=2,
                    head_dim=16, q_dtype="f32")  # causal q_len 2 > seq_len 1
    assert ei.value.status != 0 and "seq_lens" in str(ei.value)
    with pytest.raises(kvattn.ShapeMismatchError):
        kvattn.Plan(ctx, [0, 1, 2], [1], [[0]], block_size=4, num_heads=4, num_kv_heads=2,
                    head_dim=16)
    with pytest.raises(kvattn.UnsupportedError):
        kvattn.Plan(ctx, [0, 1], [1], [[0]], block_size=4, num_heads=4, num_kv_heads=2,
                    head_dim=12)
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.Context("gpu")
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.Cache(ctx, 4, 4, 2, 16, dtype="f64")


def test_cache_write_bad_inputs(ctx):
    c = kvattn.Cache(ctx, 2, 4, 2, 16, dtype="f32")
    k = RNG.standard_normal((3, 2, 16), np.float32)
    before = c.k_array().copy()
    with pytest.raises(kvattn.OutOfRangeError):
        c.write(k, k, [0, 1, 8])  # slot 8 >= NB*B
    with pytest.raises(kvattn.ShapeMismatchError):
        c.write(k, k, [0, 1])
    with pytest.raises(kvattn.ShapeMismatchError):
        c.write(k[:, :1], k[:, :1], [0, 1, 2])
    with pytest.raises(kvattn.OutOfRangeError):
        c.copy_blocks([[0, 5]])
    np.testing.assert_array_equal(c.k_array(), before)


def test_pool_flow():
    need_hash()
    pool = kvattn.Pool(16, 4)
    prompt = np.arange(10, dtype=np.int32)
    rid, cached = pool.add_request(prompt)
    assert cached == 0
    pool.allocate(rid, 10)
    row = pool.block_table(rid)
    slots = pool.slots(rid, 0, 10)
    assert row.shape == (3,) and slots.shape == (10,)
    np.testing.assert_array_equal(slots // 4, row[np.arange(10) // 4])
    pool.append_tokens(rid, prompt)
    assert pool.request_info(rid)["num_tokens"] == 10
    rid2, cached2 = pool.add_request(prompt)
    assert cached2 == 8  # two full blocks hit
    fork, copy = pool.fork(rid)
    assert copy is not None and len(copy) == 2
    pool.check()
    st = pool.stats()
    assert st["num_requests"] == 3 and st["hit_tokens"] == 8
    for r in (rid, rid2, fork):
        pool.free(r)
    with pytest.raises(kvattn.OutOfRangeError):
        pool.free(rid)
    small = kvattn.Pool(3, 4)
    r, _ = small.add_request(np.arange(20))
    with pytest.raises(kvattn.PoolExhaustedError):
        small.allocate(r, 20)


def test_c8_loader_missing_dir(tmp_path):
    with pytest.raises((kvattn.IOError_, kvattn.UnsupportedError)) as ei:
        kvattn.load_c8_scales(tmp_path / "none", 0, 2, 64)
    assert ei.value.message


def test_version_and_backends():
    assert kvattn.__version__.count(".") == 2
    assert kvattn.backend_available("ref") and kvattn.backend_available("cpu")
    assert kvattn.reorder_decode_first([3, 1, 1, 4]) [1] == 2


def test_torch_without_neg_bit(monkeypatch):
    """A torch older than 1.10 has no Tensor.is_neg (nor a negative bit): a
    tensor is viewed as usual instead of failing with AttributeError."""
    import sys
    import types

    from kvattn import _tensor

    fake = types.ModuleType("torch")

    class Tensor:  # torch < 1.10: no is_neg
        pass

    fake.Tensor = Tensor
    monkeypatch.setitem(sys.modules, "torch", fake)
    seen = []
    monkeypatch.setattr(_tensor, "_torch_view", lambda x, torch: seen.append(x) or "view")
    t = Tensor()
    assert _tensor.view(t, "q") == "view" and seen == [t]

    class NegTensor(Tensor):  # torch >= 1.10 with the bit set
        def is_neg(self):
            return True

    with pytest.raises(kvattn.InvalidArgumentError, match="negative bit"):
        _tensor.view(NegTensor(), "q")
