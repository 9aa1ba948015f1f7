"""Black-box round twelve (session 42, api52) of the Python package.

Defects: zero-token calls with numpy arrays (numpy gives an empty array
strides of 0, which the row-layout checks refused: Cache.write of no token,
merge_states_n of no row; torch tensors passed), and the trtllm functions'
seq_lens past int32, silently wrapped (2**32 + 5 keys ran as 5).
Coverage without a defect: very long single requests (past 64k keys, with a
window, local chunks + soft-cap + sinks, a block size of 7, DCP ranks merged)
on the CPU backend against a float64 oracle on sampled rows, and
Plan.update() across mask kinds (trees, none, cascade auto / off, q_len 0
requests, block sizes 1 / 3 / 16) bit-equal to a fresh plan, a refused update
leaving the plan as it was."""

import numpy as np
import pytest

import kvattn
from kvattn.flashinfer import decode as fi_decode
from kvattn.flashinfer import mla as fi_mla
from poison import fill, poisoned, untouched

try:
    import ml_dtypes
except ImportError:  # bf16 cases skip
    ml_dtypes = None


# ---------------------------------------------------------------- zero-token calls

@pytest.mark.parametrize("kind", ["mha_f32", "mha_f16", "mla", "index"])
def test_zero_token_write_from_numpy(kind):
    """Cache.write of no token (numpy arrays of 0 rows, strides 0) is a
    no-op, as kva_cache_write with num_tokens 0: nothing written."""
    ctx = kvattn.Context("cpu", 1)
    empty = np.zeros(0, np.int64)
    if kind.startswith("mha"):
        dt = np.float32 if kind == "mha_f32" else np.float16
        c = kvattn.Cache(ctx, 3, 4, 2, 8, dtype="f32" if dt is np.float32 else "f16")
        k, v = np.zeros((0, 2, 8), dt), np.zeros((0, 2, 8), dt)
    elif kind == "mla":
        c = kvattn.Cache.mla(ctx, 3, 4, kv_lora_rank=64, qk_rope_head_dim=16, dtype="f32")
        k, v = np.zeros((0, 64), np.float32), np.zeros((0, 16), np.float32)
    else:
        c = kvattn.Cache.index(ctx, 3, 4, head_dim=128, fp8=False, dtype="f32")
        k, v = np.zeros((0, 128), np.float32), None
    arrays = [c.k_array()] + ([c.v_array()] if kind.startswith("mha") else [])
    for a in arrays:
        fill(a)
    assert k.strides == (0,) * k.ndim  # the numpy behaviour the old checks tripped on
    c.write(k, v, empty)
    assert all(untouched(a) for a in arrays)


def test_zero_row_merge_states_n_from_numpy():
    """merge_states_n of P parts of no row returns empty results (numpy and
    torch alike); the given out / lse stay as they are."""
    out, lse = kvattn.merge_states_n(np.zeros((3, 0, 2, 8), np.float32),
                                     np.zeros((3, 0, 2), np.float32))
    assert out.shape == (0, 2, 8) and lse.shape == (0, 2)
    o, l = np.zeros((0, 2, 8), np.float16), np.zeros((0, 2), np.float32)
    r = kvattn.merge_states_n(np.zeros((2, 0, 2, 8), np.float16), np.zeros((2, 0, 2), np.float32),
                              out=o, lse=l)
    assert r[0] is o and r[1] is l


def test_empty_arrays_keep_their_other_checks():
    """The dense strides of an empty array do not excuse anything else: a
    wrong head count, dtype or zero-head merge is still refused."""
    ctx = kvattn.Context("cpu", 1)
    c = kvattn.Cache(ctx, 3, 4, 2, 8, dtype="f32")
    with pytest.raises(kvattn.ShapeMismatchError):
        c.write(np.zeros((0, 3, 8), np.float32), np.zeros((0, 3, 8), np.float32),
                np.zeros(0, np.int64))
    with pytest.raises(kvattn.InvalidArgumentError, match="num_heads"):
        kvattn.merge_states_n(np.zeros((2, 1, 0, 8), np.float32), np.zeros((2, 1, 0), np.float32))
    # A non-empty strided stack is still refused where a part is not contiguous.
    outs = np.zeros((2, 3, 2, 16), np.float32)[..., ::2]
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        kvattn.merge_states_n(outs, np.zeros((2, 3, 2), np.float32))


# ---------------------------------------------------------------- trtllm seq_lens past int32

def test_trtllm_seq_lens_past_int32_refused():
    """seq_lens are read as int64 (any integer dtype); one past int32 (with a
    max_seq_len that admits it) is refused, out untouched, where it used to
    wrap (2**32 + 5 ran as 5 keys)."""
    rng = np.random.default_rng(12)
    k = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    bt = np.array([[0, 1, 2]], np.int32)
    ok = fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([5]), 12)
    assert np.isfinite(ok).all()
    out = poisoned((1, 2, 8))
    with pytest.raises(kvattn.InvalidArgumentError, match="int32"):
        fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([2**32 + 5]),
                                                    2**40, out=out)
    assert untouched(out)
    kv = rng.standard_normal((3, 4, 80)).astype(np.float32)
    qm = rng.standard_normal((1, 1, 4, 80)).astype(np.float32)
    fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt, np.array([5]), 12)
    out = poisoned((1, 1, 4, 64))
    with pytest.raises(kvattn.InvalidArgumentError, match="int32"):
        fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt,
                                                     np.array([2**32 + 5]), 2**40, out=out)
    assert untouched(out)


# ---------------------------------------------------------------- very long requests

H, HKV, D = 4, 2, 16


def _long_oracle(q, keys, vals, pos, window=-1, chunk=0, softcap=0.0, sink=None, dcp=None):
    """Row at position pos (q [H, D]) over keys / vals [s, Hkv, D] float64,
    written from kvattn.h's text; dcp (N, rank, I): that rank's partial."""
    j = np.arange(keys.shape[0])
    vis = j <= pos
    if window >= 0:
        vis &= pos - j <= window
    if chunk:
        vis &= j // chunk == pos // chunk
    if dcp is not None:
        vis &= (j // dcp[2]) % dcp[0] == dcp[1]
    out, lse = np.zeros((H, D)), np.zeros(H)
    for h in range(H):
        kh = h // (H // HKV)
        sc = keys[vis, kh] @ q[h] / np.sqrt(D)
        if softcap:
            sc = softcap * np.tanh(sc / softcap)
        allsc = sc if sink is None else np.concatenate([sc, [sink[h]]])
        m = allsc.max()
        den = np.exp(allsc - m).sum()
        out[h] = (np.exp(sc - m) / den) @ vals[vis, kh]
        lse[h] = m + np.log(den)
    return out, lse


def _long_cache(ctx, rng, s, b, dtype, layout):
    nb = -(-s // b) + 1
    cache = kvattn.Cache(ctx, nb, b, HKV, D, dtype=dtype, layout=layout)
    keys = rng.standard_normal((s, HKV, D)).astype(np.float32)
    vals = rng.standard_normal((s, HKV, D)).astype(np.float32)
    perm = (rng.permutation(nb - 1) + 1).astype(np.int32)
    pos = np.arange(s)
    cache.write(keys, vals, perm[pos // b].astype(np.int64) * b + pos % b)
    return cache, perm[None, :], keys, vals


@pytest.mark.parametrize("s,ql,b,dtype,layout,window,chunk,softcap", [
    (65536, 1, 16, "f16", "NHD", -1, 0, 0.0),
    (70001, 40, 7, "f16", "HND", -1, 0, 0.0),
    (131073, 2, 16, "f32", "NHD", 1000, 0, 0.0),
    (100000, 5, 32, "bf16", "HND", -1, 8192, 30.0),
])
def test_long_request_vs_oracle(s, ql, b, dtype, layout, window, chunk, softcap):
    """One request of 64k - 131k keys on the CPU backend (its key splits and
    merges), rows sampled against a float64 oracle of the cache's rounded
    keys; outputs poisoned first."""
    if dtype == "bf16" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    rng = np.random.default_rng(s)
    ctx = kvattn.Context("cpu", num_threads=2)
    cache, bt, keys, vals = _long_cache(ctx, rng, s, b, dtype, layout)
    cast = {"f16": np.float16, "f32": np.float32,
            "bf16": ml_dtypes.bfloat16 if ml_dtypes else None}[dtype]
    kc, vc = keys.astype(cast).astype(np.float64), vals.astype(cast).astype(np.float64)
    q = rng.standard_normal((ql, H, D)).astype(cast)
    sink = rng.standard_normal(H).astype(np.float32) if softcap else None
    plan = kvattn.Plan(ctx, [0, ql], [s], bt, block_size=b, num_heads=H, num_kv_heads=HKV,
                       head_dim=D, q_dtype=dtype, window_left=window, attention_chunk=chunk,
                       softcap=softcap)
    out, lse = poisoned((ql, H, D), cast), poisoned((ql, H))
    plan.run(q, cache, out=out, lse=lse, sinks=sink)
    tol = 1e-4 if dtype == "f32" else 2e-2
    for i in sorted({0, ql - 1, *rng.integers(0, ql, 4).tolist()}):
        want, wl = _long_oracle(q[i].astype(np.float64), kc, vc, s - ql + i, window, chunk,
                                softcap, sink)
        np.testing.assert_allclose(out[i].astype(np.float64), want, rtol=tol, atol=tol,
                                   err_msg="row %d" % i)
        np.testing.assert_allclose(lse[i], wl, rtol=1e-4, atol=1e-4, err_msg="row %d" % i)


def test_long_request_dcp_ranks_merged():
    """100,003 keys sharded over 3 ranks (interleave 16): each rank's partial
    against the oracle's, and merge_states_n of the three against the
    unsharded oracle."""
    rng = np.random.default_rng(31)
    s, ql, b, n, il = 100003, 3, 16, 3, 16
    ctx = kvattn.Context("cpu", num_threads=2)
    keys = rng.standard_normal((s, HKV, D)).astype(np.float32)
    vals = rng.standard_normal((s, HKV, D)).astype(np.float32)
    q = rng.standard_normal((ql, H, D)).astype(np.float32)
    outs, lses = np.empty((n, ql, H, D), np.float32), np.empty((n, ql, H), np.float32)
    for rank in range(n):
        loc = int(kvattn.dcp_local_lens([s], n, rank, il)[0])
        nb = -(-loc // b) + 1
        row = (rng.permutation(nb - 1) + 1).astype(np.int32)
        cache = kvattn.Cache(ctx, nb, b, HKV, D, dtype="f32")
        cache.write(keys, vals, kvattn.dcp_slots(row, 0, s, dcp_size=n, dcp_rank=rank,
                                                 block_size=b, dcp_interleave=il))
        plan = kvattn.Plan(ctx, [0, ql], [s], row[None, :], block_size=b, num_heads=H,
                           num_kv_heads=HKV, head_dim=D, q_dtype="f32", dcp_size=n,
                           dcp_rank=rank, dcp_interleave=il)
        outs[rank], lses[rank] = poisoned((ql, H, D)), poisoned((ql, H))
        plan.run(q, cache, out=outs[rank], lse=lses[rank])
        want, wl = _long_oracle(q[ql - 1].astype(np.float64), keys.astype(np.float64),
                                vals.astype(np.float64), s - 1, dcp=(n, rank, il))
        np.testing.assert_allclose(outs[rank][ql - 1], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(lses[rank][ql - 1], wl, rtol=1e-5, atol=1e-5)
    out, lse = kvattn.merge_states_n(outs, lses)
    for i in range(ql):
        want, wl = _long_oracle(q[i].astype(np.float64), keys.astype(np.float64),
                                vals.astype(np.float64), s - ql + i)
        np.testing.assert_allclose(out[i], want, rtol=1e-4, atol=1e-4, err_msg="row %d" % i)
        np.testing.assert_allclose(lse[i], wl, rtol=1e-5, atol=1e-5, err_msg="row %d" % i)


# ---------------------------------------------------------------- update across mask kinds

def _step(rng, r, b, trees, nblocks):
    ql = [int(rng.choice([0, 1, 1, 3, 4])) for _ in range(r)]
    sl = [x + int(rng.integers(0, 30)) for x in ql]
    bt = rng.integers(1, nblocks, size=(r, max(-(-max(sl) // b), 1))).astype(np.int32)
    if r > 1 and rng.random() < 0.5:
        bt[1:, 0] = bt[0, 0]  # a shared first block: a cascade group for "auto"
    tree = None
    if trees and rng.random() < 0.6:
        tree = [[-1 if k == 0 or rng.random() < 0.3 else int(rng.integers(0, k))
                 for k in range(x)] for x in ql]
    return np.concatenate([[0], np.cumsum(ql)]).astype(np.int32), np.array(sl, np.int32), bt, tree


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_update_across_mask_kinds(backend):
    """A plan updated through steps with and without draft trees (q_len 0
    requests among them), over chunked, windowed and cascade (auto / off)
    options and block sizes 1 / 3 / 16, runs bit-equal to a fresh plan of the
    step with the same info; a refused update (a token its own parent) leaves
    the plan computing the previous step."""
    rng = np.random.default_rng(52)
    ctx = kvattn.Context(backend, num_threads=2)
    nblocks = 120
    for trial in range(24):
        b = int(rng.choice([1, 3, 16]))
        chunk, window = int(rng.choice([0, 0, 5])), int(rng.choice([-1, -1, 4]))
        trees = chunk == 0 and window < 0
        cache = kvattn.Cache(ctx, nblocks, b, 1, 8, dtype="f32")
        allk = rng.standard_normal((nblocks * b, 1, 8)).astype(np.float32)
        cache.write(allk, allk[::-1].copy(), np.arange(nblocks * b, dtype=np.int64))
        kw = dict(block_size=b, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32",
                  window_left=window, attention_chunk=chunk,
                  cascade=str(rng.choice(["auto", "off"])))
        qsl, sl, bt, tree = _step(rng, int(rng.integers(1, 4)), b, trees, nblocks)
        plan = kvattn.Plan(ctx, qsl, sl, bt, tree=tree, **kw)
        for _ in range(3):
            qsl, sl, bt, tree = _step(rng, int(rng.integers(1, 4)), b, trees, nblocks)
            fresh = kvattn.Plan(ctx, qsl, sl, bt, tree=tree, **kw)
            q = rng.standard_normal((int(qsl[-1]), 2, 8)).astype(np.float32)
            want, wl = fresh.run(q, cache, return_lse=True)
            plan.update(qsl, sl, bt, tree=tree)
            out, lse = poisoned(want.shape), poisoned(wl.shape)
            plan.run(q, cache, out=out, lse=lse)
            assert np.array_equal(out, want) and np.array_equal(lse, wl), (trial, kw)
            for f in ("num_tokens", "num_decodes", "num_prefills", "max_q_len", "max_seq_len",
                      "num_work_items", "num_cascade_groups", "cascade_rows", "cascade_chunks"):
                assert getattr(plan.info, f) == getattr(fresh.info, f), (trial, f)
            if trees and qsl[-1] >= 1:
                with pytest.raises(kvattn.KvaError):
                    plan.update(qsl, sl, bt, tree=[[0] * int(x) for x in np.diff(qsl)])
                again = poisoned(want.shape)
                plan.run(q, cache, out=again)
                assert np.array_equal(again, want)
            fresh.close()
        plan.close()


# ---------------------------------------------------------------- the functions' kept wrappers

def test_trtllm_functions_after_the_default_context_was_closed():
    """The trtllm functions keep one wrapper per device (no context=): after a
    caller closed the default context (which default_context() then makes
    again), the next call runs on a live context instead of failing on the
    kept wrapper's closed one ("ctx is NULL") for the rest of the process."""
    rng = np.random.default_rng(13)
    k = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    kv = rng.standard_normal((3, 4, 80)).astype(np.float32)
    qm = rng.standard_normal((1, 1, 4, 80)).astype(np.float32)
    bt = np.array([[0, 1, 2]], np.int32)

    def both():
        return (fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([9]),
                                                            12),
                fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt,
                                                             np.array([9]), 12))

    before = both()
    with kvattn.default_context():
        pass  # closed on leaving
    after = both()
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- the plan template's key

@pytest.mark.parametrize("name,good,bad", [
    ("q_dtype", 1, True), ("kind", 0, False), ("sparse_mode", 0, False),
    ("index_q_quant", 0, False), ("attention_chunk", 1, True), ("dcp_size", 1, True),
    ("dcp_interleave", 1, True), ("decode_threshold", 1, True), ("window_left", 1, True),
    ("num_heads", 2, 2.0), ("head_dim", 8, np.float64(8.0)),
])
def test_plan_template_does_not_skip_argument_checks(name, good, bad):
    """Plan keeps a per-context descriptor per option set; a value equal to
    an earlier one but of another type (True == 1, 2.0 == 2 hash alike) is
    checked as on a fresh context (refused), not let through by the earlier
    plan's template."""
    kw = dict(block_size=16, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32")

    def plan(ctx, value):
        return kvattn.Plan(ctx, [0, 1], [5], [[1]], **dict(kw, **{name: value}))

    with pytest.raises(kvattn.KvaError):
        plan(kvattn.Context("cpu", 1), bad)  # the rule, on a fresh context
    ctx = kvattn.Context("cpu", 1)
    plan(ctx, good).close()
    with pytest.raises(kvattn.KvaError):
        plan(ctx, bad)
