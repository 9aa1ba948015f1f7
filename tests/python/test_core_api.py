"""The core Python API used as a user would (round eight of the black-box
tests): argument forms docs/python.md promises to refuse, and object
lifetimes. Each case failed on main before its fix."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvattn
from features import need_c8_loader, need_hash
from poison import poisoned, untouched

RNG = np.random.default_rng(44)


@pytest.fixture(scope="module", params=["ref", "cpu"])
def ctx(request):
    c = kvattn.Context(request.param, num_threads=2)
    yield c
    c.close()


def _filled_cache(ctx, nb=6):
    c = kvattn.Cache(ctx, nb, 4, 2, 16, dtype="f32")
    k = RNG.standard_normal((nb * 4, 2, 16), np.float32)
    c.write(k, -k, np.arange(nb * 4))
    return c


@pytest.mark.parametrize("pairs", [
    [[0, 1, 2], [3, 4, 5]],          # [2, 3]: not (src, dst) rows
    [[[0, 1]], [[2, 3]]],            # 3-D
    np.zeros((2, 4), np.int32),
    [[0], [1]],                      # [2, 1]
])
def test_block_pairs_of_another_shape_raise_and_copy_nothing(ctx, pairs):
    # docs/python.md: pairs [n, 2]. A [2, 3] list used to be reshaped to
    # three pairs (0, 1), (2, 3), (4, 5) and copied.
    c = _filled_cache(ctx)
    dst = _filled_cache(ctx, 6)
    k0, v0 = c.k_array().copy(), c.v_array().copy()
    dk0 = dst.k_array().copy()
    with pytest.raises(kvattn.ShapeMismatchError, match="pairs"):
        c.copy_blocks(pairs)
    with pytest.raises(kvattn.ShapeMismatchError, match="pairs"):
        c.swap_blocks(dst, pairs)
    np.testing.assert_array_equal(c.k_array(), k0)
    np.testing.assert_array_equal(c.v_array(), v0)
    np.testing.assert_array_equal(dst.k_array(), dk0)


def test_block_pairs_forms_still_accepted(ctx):
    c = _filled_cache(ctx)
    for pairs in ([[1, 5]], np.array([[2, 4]], np.int64), [1, 3], np.zeros((0, 2), np.int32)):
        c.copy_blocks(pairs)
    np.testing.assert_array_equal(c.k_array()[5], c.k_array()[1])
    np.testing.assert_array_equal(c.k_array()[4], c.k_array()[2])
    np.testing.assert_array_equal(c.k_array()[3], c.k_array()[1])


@pytest.mark.parametrize("bad", [2.5, 2.0, "2", None, np.float64(2)])
def test_pool_counts_not_integers_raise_invalid_argument(bad):
    # docs/python.md: an integer argument that is fractional (or not an
    # integer) raises InvalidArgumentError; slots() and block_table() used
    # to raise numpy's TypeError from np.empty(2.5) (or build a row from
    # None) before the C call's check.
    need_hash()
    p = kvattn.Pool(16, 4)
    rid, _ = p.add_request(list(range(9)))
    p.allocate(rid, 9)
    with pytest.raises(kvattn.InvalidArgumentError):
        p.slots(rid, 0, bad)
    if bad is not None:  # row_len=None means "the request's own length"
        with pytest.raises(kvattn.InvalidArgumentError):
            p.block_table(rid, bad)
    np.testing.assert_array_equal(p.slots(rid, 0, np.int64(3)), p.slots(rid, 0, 3))
    assert p.block_table(rid, np.int32(4)).shape == (4,)


@pytest.mark.parametrize("big", [2**31, 2**40])
def test_pool_huge_counts_refused_before_allocating(big):
    # 2**40 used to reach np.empty first (a numpy MemoryError, not the
    # documented InvalidArgumentError for a value C's int32 cannot hold).
    need_hash()
    p = kvattn.Pool(16, 4)
    rid, _ = p.add_request([1, 2, 3])
    p.allocate(rid, 3)
    with pytest.raises(kvattn.InvalidArgumentError):
        p.slots(rid, 0, big)
    with pytest.raises(kvattn.InvalidArgumentError):
        p.block_table(rid, big)


@pytest.mark.parametrize("q_dtype", [["f16"], {"f16": 1}, bytearray(b"f16")])
def test_plan_unhashable_dtype_raises_invalid_argument(ctx, q_dtype):
    # The plan-descriptor template cache hashed q_dtype first: TypeError
    # "unhashable type" instead of the dtype check's InvalidArgumentError.
    with pytest.raises(kvattn.InvalidArgumentError, match="dtype"):
        kvattn.Plan(ctx, [0, 1], [4], [[0]], block_size=4, num_heads=2, num_kv_heads=2,
                    head_dim=16, q_dtype=q_dtype)


_AFTER_CLOSE = textwrap.dedent("""
    import numpy as np, kvattn
    ctx = kvattn.Context(%r)
    # 4 MiB of K: large enough that the allocator returns it to the system
    c = kvattn.Cache(ctx, 1024, 16, 4, 64, dtype="f32")
    k = np.arange(1024 * 16 * 4 * 64, dtype=np.float32).reshape(-1, 4, 64)
    c.write(k, k, np.arange(k.shape[0]))
    a, b = c.k_array(), c.v_array()
    c.close()
    c.close()
    ctx.close()
    print(float(a.sum(dtype=np.float64)) == float(k.sum(dtype=np.float64)),
          bool((b[3, 5] == k[3 * 16 + 5]).all()))
    try:
        c.k_array()
    except kvattn.KvaError as e:
        print(type(e).__name__)
""")


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_k_array_view_outlives_close(backend):
    # k_array() / v_array() are views of the cache's storage. close() used to
    # free it under live views (reading one afterwards read freed memory: a
    # crash for a large cache); now the storage goes when the last view does,
    # and the closed cache itself refuses further use.
    r = subprocess.run([sys.executable, "-c", _AFTER_CLOSE % backend], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["True", "True", "NullPointerError"], r.stdout


def test_close_without_views_frees_at_once(ctx):
    c = _filled_cache(ctx)
    c.close()
    assert c._h is None
    with pytest.raises(kvattn.NullPointerError):
        c.write(np.zeros((1, 2, 16), np.float32), np.zeros((1, 2, 16), np.float32), [0])


def test_ragged_plan_ignores_later_changes_to_callers_seq_lens(ctx):
    # A contiguous int32 seq_lens was kept by reference: run_ragged's row check
    # (kv_len_total) followed the caller's later edits while the C plan kept
    # the planned lengths, so a k / v of 1 row passed the check and C read 40
    # rows (past the end of k and v).
    from reference import attention

    qsl, sl = np.array([0, 2], np.int32), np.array([40], np.int32)
    plan = kvattn.Plan(ctx, qsl, sl, None, block_size=1, num_heads=4, num_kv_heads=2,
                       head_dim=16, q_dtype="f32", causal=True)
    sl[0], qsl[1] = 1, 1
    assert plan.kv_len_total == 40 and plan.num_tokens == 2
    q = RNG.standard_normal((2, 4, 16), np.float32)
    k = RNG.standard_normal((40, 2, 16), np.float32)
    v = RNG.standard_normal((40, 2, 16), np.float32)
    out = poisoned((2, 4, 16))
    with pytest.raises(kvattn.ShapeMismatchError, match="k: shape"):
        plan.run_ragged(q, k[:1].copy(), v[:1].copy(), out=out)
    assert untouched(out)
    plan.run_ragged(q, k, v, out=out)
    ro, _ = attention(q, [k], [v], [2], causal=True)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)


def test_default_context_after_a_caller_closed_it():
    # default_context() handed out the closed context again: merge_states
    # without ctx= (and the FlashInfer wrappers on the host) raised
    # NullPointerError "argument 'ctx' is NULL" for the rest of the process.
    with kvattn.default_context() as c:
        assert c.backend == "cpu"
    assert c._h is None
    d = kvattn.default_context()
    assert d is not c and d._h and d is kvattn.default_context()
    a = RNG.standard_normal((2, 3, 8), np.float32)
    la = RNG.standard_normal((2, 3), np.float32)
    out, lse = kvattn.merge_states(a, la, a, la)
    np.testing.assert_allclose(out, a, rtol=1e-6)
    np.testing.assert_allclose(lse, la + np.log(2), rtol=1e-5)


_NOT_KVA = [np.dtype(">f4"), np.dtype(">f2"), np.dtype(np.float64), np.dtype(np.int32)]


@pytest.mark.parametrize("dt", _NOT_KVA, ids=str)
def test_tensors_of_no_kvattn_dtype_raise_dtype_mismatch(ctx, dt):
    # Big-endian, float64 or int32 data: Cache.write and the from_* wrappers
    # passed the code -1 (or the index code 100) to C, which answered
    # InvalidArgumentError "src_dtype = -1 is not a kva_dtype"; merge_states
    # raised a bare KeyError(-1). Now DtypeMismatchError naming the dtype,
    # before any call, and nothing written.
    c = _filled_cache(ctx)
    k0 = c.k_array().copy()
    x = np.ones((2, 2, 16), dt)
    with pytest.raises(kvattn.DtypeMismatchError, match="k: dtype"):
        c.write(x, x, np.arange(2))
    with pytest.raises(kvattn.DtypeMismatchError, match="v: dtype"):
        c.write(np.ones((2, 2, 16), np.float32), x, np.arange(2))
    np.testing.assert_array_equal(c.k_array(), k0)
    ic = kvattn.Cache.index(ctx, 2, 4, 16, fp8=False, dtype="f32")
    with pytest.raises(kvattn.DtypeMismatchError):
        ic.write(np.ones((2, 16), dt), None, np.arange(2))
    mc = kvattn.Cache.mla(ctx, 2, 4, 64, 16, dtype="f32")
    with pytest.raises(kvattn.DtypeMismatchError):
        mc.write(np.ones((2, 64), dt), np.ones((2, 16), dt), np.arange(2))
    kk = np.zeros((2, 4, 2, 16), dt)
    with pytest.raises(kvattn.DtypeMismatchError):
        kvattn.Cache.from_tensors(ctx, kk, kk.copy())
    with pytest.raises(kvattn.DtypeMismatchError):
        kvattn.Cache.from_interleaved(ctx, np.zeros((2, 2, 4, 2, 16), dt))
    with pytest.raises(kvattn.DtypeMismatchError):
        kvattn.Cache.from_latent(ctx, np.zeros((2, 4, 80), dt), kv_lora_rank=64)
    a, la = np.ones((1, 2, 8), dt), np.zeros((1, 2), np.float32)
    with pytest.raises(kvattn.DtypeMismatchError, match="out_a: dtype"):
        kvattn.merge_states(a, la, a, la, ctx=ctx)
    out = np.full((1, 2, 8), 7, dt)
    with pytest.raises(kvattn.DtypeMismatchError):
        kvattn.merge_states(a, la, a, la, out=out, ctx=ctx)
    assert (out == 7).all()


def test_closed_objects_raise_and_close_twice_is_harmless():
    # Lifetimes as docs/python.md states them (passes on main: a guard).
    ctx = kvattn.Context("cpu")
    c = _filled_cache(ctx)
    plan = kvattn.Plan(ctx, [0, 1], [5], [[0, 1]], block_size=4, num_heads=2, num_kv_heads=2,
                       head_dim=16, q_dtype="f32")
    q = RNG.standard_normal((1, 2, 16), np.float32)
    ref = plan.run(q, c)
    ctx.close()
    ctx.close()
    out = poisoned(ref.shape, ref.dtype)
    with pytest.raises(kvattn.NullPointerError, match="ctx"):
        plan.run(q, c, out=out)
    assert untouched(out)
    assert c.k_array().shape == (6, 4, 2, 16)  # the cache outlives its context
    plan.close()
    plan.close()
    with pytest.raises(kvattn.NullPointerError, match="plan"):
        plan.info
    c.close()
    c.close()
    need_hash()  # the checks above ran; the rest needs a Pool with prefix caching
    p = kvattn.Pool(8, 4)
    p.close()
    p.close()
    with pytest.raises(kvattn.NullPointerError, match="pool"):
        p.stats()


@pytest.mark.parametrize("form", ["bytes", "non-ascii str", "undecodable name"])
def test_c8_loader_path_forms(tmp_path, form):
    # load_c8_scales passed str(checkpoint_dir) to C: a bytes path became
    # "b'/tmp/...'" (IOError_ for a directory that exists), a name that is not
    # UTF-8 (os.fsdecode(b"\xff") = "\udcff") raised UnicodeEncodeError, and
    # an int was taken as a path. Now os.fsencode, as open() does.
    need_c8_loader()
    from test_blackbox import _safetensors

    d = {"bytes": tmp_path, "non-ascii str": tmp_path / "ckpt \u00e9",
         "undecodable name": tmp_path / os.fsdecode(b"ckpt\xff")}[form]
    d.mkdir(exist_ok=True)
    ks = np.full(2 * 8, 0.5, np.float32)
    (d / "quant_model_description.json").write_text('{"kv_cache_type": "C8"}')
    _safetensors(d / "m.safetensors", {"model.layers.0.self_attn.k_cache_scale": ks,
                                       "model.layers.0.self_attn.v_cache_scale": ks})
    arg = bytes(d) if form == "bytes" else str(d)
    s = kvattn.load_c8_scales(arg, 0, 2, 8)
    np.testing.assert_array_equal(s["k_scale"], ks)
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.load_c8_scales(12, 0, 2, 8)  # neither str, bytes nor os.PathLike


def test_big_endian_bfloat16_raises_dtype_mismatch(ctx):
    # ml_dtypes' bfloat16 keeps its name in either byte order, and the view
    # mapped dtypes by name without checking the order: a big-endian bf16 q
    # or k / v was read byte-swapped (wrong results, no error) and a
    # big-endian out written in little-endian order. Needs ml_dtypes
    # (skipped without it, as numpy has no bfloat16).
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.dtype(ml_dtypes.bfloat16)
    be = bf.newbyteorder(">")
    c = kvattn.Cache(ctx, 4, 4, 2, 16, dtype="bf16")
    k = RNG.standard_normal((8, 2, 16)).astype(bf)
    c.write(k, -k, np.arange(8))
    k0 = c.k_array().copy()
    plan = kvattn.Plan(ctx, [0, 1], [8], [[0, 1]], block_size=4, num_heads=2, num_kv_heads=2,
                       head_dim=16, q_dtype="bf16")
    q = RNG.standard_normal((1, 2, 16)).astype(bf)
    with pytest.raises(kvattn.DtypeMismatchError, match="q: dtype"):
        plan.run(q.astype(be), c)
    out = np.full((1, 2, 16), 3, be)
    with pytest.raises(kvattn.DtypeMismatchError, match="out: dtype"):
        plan.run(q, c, out=out)
    assert (out.astype(np.float32) == 3).all()
    with pytest.raises(kvattn.DtypeMismatchError, match="k: dtype"):
        c.write(k.astype(be), (-k).astype(be), np.arange(8))
    np.testing.assert_array_equal(c.k_array(), k0)
    with pytest.raises(kvattn.InvalidArgumentError, match="not a kvattn dtype"):
        kvattn.Cache(ctx, 4, 4, 2, 16, dtype=be)
    assert plan.run(q, c).dtype == bf  # the native one still runs


def test_errors_survive_pickling():
    # Exceptions cross process boundaries by pickle (multiprocessing,
    # concurrent.futures). KvaError's constructor takes (message, status) but
    # pickle re-called it with the formatted text: str() came back as
    # "KVA_STATUS_X: KVA_STATUS_X: ..." and a KvaError of an unknown status
    # lost its name ("?: ...").
    import pickle

    with pytest.raises(kvattn.InvalidArgumentError) as ei:
        kvattn.Context("gpu")
    for e in (ei.value, kvattn.KvaError("boom", 42), kvattn.PoolExhaustedError("full")):
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e)
        assert (str(e2), e2.message, e2.status, e2.name) == (str(e), e.message, e.status, e.name)
    assert str(ei.value).count("KVA_STATUS_INVALID_ARGUMENT") == 1


def test_broadcast_token_dimension_refused(ctx):
    # A token dimension of stride 0 (np.broadcast_to, as_strided) passed the
    # Python checks and reached C as stride 0, which kvattn.h defines as
    # "contiguous": Cache.write read T consecutive rows from a buffer of one
    # (past its end; here the test's buffer has the rows, so main wrote the
    # wrong values), and run_indexer wrote T rows into one. Now refused
    # before the call, nothing written.
    from numpy.lib.stride_tricks import as_strided

    c = _filled_cache(ctx)
    k0 = c.k_array().copy()
    rows = RNG.standard_normal((3, 2, 16)).astype(np.float32)
    one = as_strided(rows, shape=(3, 2, 16), strides=(0,) + rows.strides[1:])
    with pytest.raises(kvattn.InvalidArgumentError, match="k: token stride 0"):
        c.write(one, rows, np.arange(3))
    with pytest.raises(kvattn.InvalidArgumentError, match="v: token stride 0"):
        c.write(rows, np.broadcast_to(rows[:1], (3, 2, 16)), np.arange(3))
    np.testing.assert_array_equal(c.k_array(), k0)
    ic = kvattn.Cache.index(ctx, 4, 4, 16, fp8=False, dtype="f32")
    ic.write(RNG.standard_normal((16, 16)).astype(np.float32), None, np.arange(16))
    plan = kvattn.Plan(ctx, [0, 3], [16], [[0, 1, 2, 3]], block_size=4, num_heads=2,
                       num_kv_heads=1, head_dim=16, q_dtype="f32", kind="index", sparse_topk=4)
    q = RNG.standard_normal((3, 2, 16)).astype(np.float32)
    w = RNG.standard_normal((3, 2)).astype(np.float32)
    buf = np.full(12, -5, np.int32)
    ind = as_strided(buf, shape=(3, 4), strides=(0, 4))
    with pytest.raises(kvattn.InvalidArgumentError, match="indices: row stride 0"):
        plan.run_indexer(q, w, ic, indices=ind)
    assert (buf == -5).all()
    assert plan.run_indexer(q[:1].repeat(3, 0), w, ic).shape == (3, 4)  # copies still run
