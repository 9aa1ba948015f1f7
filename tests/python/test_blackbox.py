"""Black-box checks of the Python package's promises (session 35, api36):
odd shapes against the numpy reference with poisoned outputs, plan reuse,
run before plan, and bad arguments raising a KvaError subclass with nothing
written: integers a C int32 cannot hold (ctypes and numpy casts wrapped them
silently), read-only outputs, non-tensors, tensors on another device, the C8
loader on a checkpoint written here, the pool's bad counts."""

import ctypes
import json
import math
import struct

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from features import need_c8_loader, need_hash
from poison import fill, poisoned, untouched
from reference import attention

LOG2E = 1.0 / math.log(2.0)


def paged(rng, kv_lens, page, hkv, d, dv, layout="NHD", dtype=np.float32, spare=3):
    """(k_cache, v_cache) with random pages in a shuffled order, FlashInfer's
    CSR page table and each request's keys/values (request r without keys
    has no pages)."""
    npages = [-(-s // page) for s in kv_lens]
    nb = sum(npages) + spare
    perm = rng.permutation(nb).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    indices = perm[: indptr[-1]]
    last = np.array([s - (n - 1) * page if n else 0 for s, n in zip(kv_lens, npages)], np.int32)
    inner_k = (page, hkv, d) if layout == "NHD" else (hkv, page, d)
    inner_v = (page, hkv, dv) if layout == "NHD" else (hkv, page, dv)
    k = rng.standard_normal((nb,) + inner_k).astype(dtype)
    v = rng.standard_normal((nb,) + inner_v).astype(dtype)
    keys, values = [], []
    for r, s in enumerate(kv_lens):
        pg = indices[indptr[r]: indptr[r + 1]]
        kk, vv = k[pg], v[pg]
        if layout == "HND":
            kk, vv = kk.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
        keys.append(kk.reshape(-1, hkv, d)[:s])
        values.append(vv.reshape(-1, hkv, dv)[:s])
    return (k, v), indptr, indices, last, keys, values


def check(out, lse, ro, rl, tol):
    np.testing.assert_allclose(out.astype(np.float64), ro, rtol=tol, atol=tol)
    fin = np.isfinite(rl)
    np.testing.assert_array_equal(np.isfinite(lse), fin)
    np.testing.assert_allclose(lse[fin], rl[fin] * LOG2E, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", [
    # (d, page, h, hkv, layout, dtype, kv_lens)
    (8, 5, 6, 3, "NHD", np.float32, [1, 0, 11, 5]),
    (24, 1, 12, 1, "HND", np.float16, [7, 3]),
    (40, 3, 4, 4, "NHD", np.float16, [0]),
    (72, 7, 16, 2, "HND", np.float32, [29, 1, 14]),
])
def test_decode_odd_shapes_poisoned(case):
    d, page, h, hkv, layout, dt, kv_lens = case
    rng = np.random.default_rng(d)
    kv, indptr, indices, last, keys, values = paged(rng, kv_lens, page, hkv, d, d, layout, dt)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
    w.plan(indptr, indices, last, h, hkv, d, page, q_data_type=dt)
    r = len(kv_lens)
    q = rng.standard_normal((r, h, d)).astype(dt)
    out = np.full((r, h, d), np.nan, dt)
    lse = np.full((r, h), np.nan, np.float32)
    res = w.run(q, kv, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    ro, rl = attention(q, keys, values, [1] * r, causal=not min(kv_lens) == 0)
    check(out, lse, ro, rl, 2e-3 if dt == np.float16 else 1e-5)
    for i, s in enumerate(kv_lens):  # a request without keys: zeros, lse -inf
        if s == 0:
            assert (out[i] == 0).all() and np.isneginf(lse[i]).all()


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_odd_shapes_dv_and_reuse(causal):
    """Prefill with Dv != D, q_len == kv_len and q_len > kv_len (non-causal),
    run twice on two caches through one plan, then re-planned."""
    rng = np.random.default_rng(5 + causal)
    d, dv, page, h, hkv = 24, 8, 3, 6, 2
    q_lens = [4, 1, 6]
    kv_lens = [4, 9, 6 if causal else 2]
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    kv, indptr, indices, last, keys, values = paged(rng, kv_lens, page, hkv, d, dv)
    w.plan(qo, indptr, indices, last, h, hkv, d, page, head_dim_vo=dv, causal=causal,
           q_data_type="float32")
    q = rng.standard_normal((qo[-1], h, d)).astype(np.float32)
    out, lse = w.run(q, kv, return_lse=True)
    ro, rl = attention(q, keys, values, q_lens, causal=causal)
    check(out, lse, ro, rl, 1e-5)
    # The same plan over a second cache of the same shape: its own data.
    k2 = rng.standard_normal(kv[0].shape).astype(np.float32)
    v2 = rng.standard_normal(kv[1].shape).astype(np.float32)
    keys2 = [k2[indices[indptr[r]: indptr[r + 1]]].reshape(-1, hkv, d)[:s]
             for r, s in enumerate(kv_lens)]
    vals2 = [v2[indices[indptr[r]: indptr[r + 1]]].reshape(-1, hkv, dv)[:s]
             for r, s in enumerate(kv_lens)]
    out2, lse2 = w.run(q, (k2, v2), return_lse=True)
    check(out2, lse2, *attention(q, keys2, vals2, q_lens, causal=causal), 1e-5)
    # The first cache changed in place: the plan reads the new values.
    kv[1][...] = -kv[1]
    out3 = w.run(q, kv)
    np.testing.assert_allclose(out3, -out, rtol=1e-5, atol=1e-5)
    # Re-planned for another batch on the same wrapper.
    w.plan(qo[:2], indptr[:2], indices, last[:1], h, hkv, d, page, head_dim_vo=dv,
           causal=causal, q_data_type="float32")
    out4 = w.run(q[: qo[1]], kv)
    ro4, _ = attention(q[: qo[1]], keys[:1], [-values[0]], q_lens[:1], causal=causal)
    np.testing.assert_allclose(out4, ro4, rtol=1e-5, atol=1e-5)


def test_run_before_plan_every_wrapper():
    q = np.zeros((1, 2, 8), np.float32)
    kv = (np.zeros((2, 4, 2, 8), np.float32),) * 2
    with pytest.raises(kvattn.InvalidArgumentError, match="before plan"):
        fi.BatchDecodeWithPagedKVCacheWrapper(None).run(q, kv)
    with pytest.raises(kvattn.InvalidArgumentError, match="before plan"):
        fi.BatchPrefillWithPagedKVCacheWrapper(None).run(q, kv)
    with pytest.raises(kvattn.InvalidArgumentError, match="before plan"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(None).run(q, q, q)
    with pytest.raises(kvattn.InvalidArgumentError, match="before plan"):
        fi.BatchMLAPagedAttentionWrapper(None).run(q, q, q, q)


def _plan(ctx, **kw):
    a = dict(block_size=4, num_heads=2, num_kv_heads=2, head_dim=8, q_dtype="f32")
    a.update(kw)
    return kvattn.Plan(ctx, [0, 1], kw.pop("seq_lens", [3]), [[1]], **a)


def test_integers_c_cannot_hold_raise():
    """Values past int32 (or fractional) used to reach C wrapped or truncated
    (seq_lens 2**32 + 3 ran as 3, Pool(2**32 + 8) had 8 blocks,
    allocate(2**32 + 1) allocated one token)."""
    ctx = kvattn.Context("cpu")
    bt = [[1, 2]]
    for sl in (np.array([2**32 + 3], np.int64), [2.7], np.array([3.5])):
        with pytest.raises(kvattn.InvalidArgumentError, match="seq_lens"):
            kvattn.Plan(ctx, [0, 1], sl, bt, block_size=4, num_heads=2, num_kv_heads=2,
                        head_dim=8, q_dtype="f32")
    with pytest.raises(kvattn.InvalidArgumentError, match="block_table"):
        kvattn.Plan(ctx, [0, 1], [3], np.array([[2**32 + 1]]), block_size=4, num_heads=2,
                    num_kv_heads=2, head_dim=8, q_dtype="f32")
    for kw in (dict(num_heads=2**32 + 2), dict(block_size=2**32 + 4), dict(head_dim=8.0),
               dict(window_left=2**31)):
        with pytest.raises(kvattn.InvalidArgumentError):
            kvattn.Plan(ctx, [0, 1], [3], bt, **dict(dict(block_size=4, num_heads=2,
                                                        num_kv_heads=2, head_dim=8,
                                                        q_dtype="f32"), **kw))
    with pytest.raises(kvattn.InvalidArgumentError, match="num_blocks"):
        kvattn.Cache(ctx, 2**32 + 4, 4, 2, 8, dtype="f32")
    with pytest.raises(kvattn.InvalidArgumentError, match="num_threads"):
        kvattn.Context("cpu", 2**32 + 1)
    with pytest.raises(kvattn.InvalidArgumentError, match="num_blocks"):
        kvattn.Pool(2**32 + 8, 4)
    need_hash()  # the checks above ran; the rest needs a Pool with prefix caching
    p = kvattn.Pool(16, 4)
    rid, _ = p.add_request([1, 2, 3, 4, 5])
    before = (p.stats(), p.request_info(rid))
    with pytest.raises(kvattn.InvalidArgumentError):
        p.allocate(rid, 2**32 + 1)
    with pytest.raises(kvattn.InvalidArgumentError):
        p.append_tokens(rid, [2**40])
    with pytest.raises(kvattn.InvalidArgumentError):
        p.free("a")
    assert (p.stats(), p.request_info(rid)) == before
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.reorder_decode_first([1, 5, 1], 2**32 + 1)
    with pytest.raises(kvattn.ShapeMismatchError):
        kvattn.reorder_decode_first([[1, 5], [1, 2]])
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(kvattn.InvalidArgumentError):
        w.plan([0, 1], [2**32 + 1], [1], 2, 2, 8, 4, q_data_type="float32")
    with pytest.raises(kvattn.InvalidArgumentError):
        w.plan([0, 1], [1], [1], 2.5, 2, 8, 4, q_data_type="float32")
    # In range, any integer type still works.
    p2 = kvattn.Plan(ctx, [0, 1], np.array([3], np.int64), np.array([[1]], np.uint8),
                     block_size=np.int64(4), num_heads=2, num_kv_heads=2, head_dim=8,
                     q_dtype="f32")
    assert p2.info.max_seq_len == 3


def test_outputs_read_only_or_wrong_are_refused():
    ctx = kvattn.Context("cpu")
    cache = kvattn.Cache(ctx, 4, 4, 2, 8, dtype="f32")
    plan = _plan(ctx)
    q = np.ones((1, 2, 8), np.float32)
    ro = np.zeros((1, 2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        plan.run(q, cache, out=ro)
    assert (ro == 0).all()  # was written through its pointer before
    lse_ro = np.zeros((1, 2), np.float32)
    lse_ro.flags.writeable = False
    out = poisoned((1, 2, 8))
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        plan.run(q, cache, out=out, lse=lse_ro)
    assert untouched(out) and (lse_ro == 0).all()
    a = np.zeros((1, 2, 8), np.float32)
    la = np.zeros((1, 2), np.float32)
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        kvattn.merge_states(a, la, a, la, out=ro)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan([0, 1], [1], [3], 2, 2, 8, 4, q_data_type="float32")
    kv = (np.ones((2, 4, 2, 8), np.float32), np.ones((2, 4, 2, 8), np.float32))
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        w.run(q, kv, out=ro)
    bad = [
        (dict(q=q.tolist()), kvattn.InvalidArgumentError),
        (dict(q=q.astype(np.int32)), kvattn.DtypeMismatchError),
        (dict(q=np.ones((1, 2, 16), np.float32)[..., ::2]), kvattn.InvalidArgumentError),
        (dict(lse=np.zeros((1, 3), np.float32)), kvattn.ShapeMismatchError),
        (dict(lse=np.zeros((1, 2), np.float64)), kvattn.DtypeMismatchError),
    ]
    for kw, exc in bad:
        out = poisoned((1, 2, 8))
        a = dict(q=q, out=out)
        a.update(kw)
        qq = a.pop("q")
        with pytest.raises(exc):
            w.run(qq, kv, **a)
        assert untouched(out)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan([0, 1], [0, 3], 2, 2, 8, q_data_type="float32")
    k = np.ones((3, 2, 8), np.float32)
    with pytest.raises(kvattn.InvalidArgumentError, match="k:"):
        r.run(q, k.tolist(), k)
    with pytest.raises(kvattn.ShapeMismatchError):
        r.run(q, k[:2], k[:2])


def test_read_only_cache_storage_and_bad_alibi_count_are_refused():
    """A cache wrapped around caller storage is written by Cache.write: a
    read-only array is refused when wrapped (it was wrapped and written
    through); get_alibi_slopes of a count below 1 or not an integer raises a
    kvattn error (it raised math / type errors)."""
    ctx = kvattn.Context("cpu")
    k = np.zeros((2, 4, 2, 8), np.float32)
    v = np.zeros((2, 4, 2, 8), np.float32)
    k.flags.writeable = False
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        kvattn.Cache.from_tensors(ctx, k, v)
    kv = np.zeros((2, 2, 4, 2, 8), np.float32)
    kv.flags.writeable = False
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        kvattn.Cache.from_interleaved(ctx, kv)
    lat = np.zeros((2, 4, 576), np.float32)
    lat.flags.writeable = False
    with pytest.raises(kvattn.InvalidArgumentError, match="read-only"):
        kvattn.Cache.from_latent(ctx, lat)
    k.flags.writeable = True
    c = kvattn.Cache.from_tensors(ctx, k, v)  # writable storage still wraps
    c.write(np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32), [5])
    assert k[1, 1].sum() == 16 and v[1, 1].sum() == 16 and k.sum() == 16
    for bad in (0, -3, 2.0, True, "8"):
        with pytest.raises(kvattn.InvalidArgumentError, match="num_heads"):
            fi.get_alibi_slopes(bad)
    assert np.allclose(fi.get_alibi_slopes(np.int64(8)), 2.0 ** (-np.arange(1, 9)))


class _OnCuda:
    """A host array that says, through DLPack, that it lives on CUDA device 0."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kw):
        cap = self.a.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        p = get(cap, b"dltensor")
        ctypes.c_int32.from_address(p + 8).value = 2  # DLTensor.device.device_type
        return cap


def test_tensor_on_another_device_raises():
    ctx = kvattn.Context("cpu")
    cache = kvattn.Cache(ctx, 4, 4, 2, 8, dtype="f32")
    plan = _plan(ctx)
    out = poisoned((1, 2, 8))
    with pytest.raises(kvattn.InvalidArgumentError, match="q: tensor on cuda"):
        plan.run(_OnCuda(np.ones((1, 2, 8), np.float32)), cache, out=out)
    with pytest.raises(kvattn.InvalidArgumentError, match="out: tensor on cuda"):
        plan.run(np.ones((1, 2, 8), np.float32), cache,
                 out=_OnCuda(np.zeros((1, 2, 8), np.float32)))
    assert untouched(out)


def test_pool_bad_counts_raise_and_change_nothing():
    need_hash()
    p = kvattn.Pool(6, 2)
    rid, _ = p.add_request([1, 2, 3])
    p.allocate(rid, 3)
    p.append_tokens(rid, [1, 2, 3])
    before = (p.stats(), p.request_info(rid), p.block_table(rid).tolist())
    with pytest.raises(kvattn.InvalidArgumentError, match="count"):
        p.slots(rid, 0, -1)
    with pytest.raises(kvattn.InvalidArgumentError, match="row_len"):
        p.block_table(rid, -1)
    with pytest.raises(kvattn.OutOfRangeError, match="row_len"):
        p.block_table(rid, 1)  # shorter than its 2 blocks
    with pytest.raises(kvattn.PoolExhaustedError):
        p.allocate(rid, 100)
    with pytest.raises(kvattn.OutOfRangeError):
        p.slots(rid, 3, 2)  # position 4 is not allocated
    assert (p.stats(), p.request_info(rid), p.block_table(rid).tolist()) == before
    p.free(rid)
    with pytest.raises(kvattn.OutOfRangeError):
        p.free(rid)  # double free
    p.check()


def test_lists_are_checked_not_truncated():
    """A slot_mapping list [2.7] wrote slot 2; extra_key=5 became five zero
    bytes (colliding with b"\\0" * 5); odd pair lists hit numpy's reshape."""
    ctx = kvattn.Context("cpu")
    c = kvattn.Cache(ctx, 4, 4, 1, 8, dtype="f32")
    fill(c.k_array())
    k = np.ones((1, 1, 8), np.float32)
    for sm in ([2.7], [2**64]):
        with pytest.raises(kvattn.InvalidArgumentError, match="slot_mapping"):
            c.write(k, k, sm)
    assert untouched(c.k_array())
    c.write(k, k, [2])  # an integer list still works
    assert (c.k_array()[0, 2] == 1).all()
    with pytest.raises(kvattn.ShapeMismatchError, match="pairs"):
        c.copy_blocks([1, 2, 3])
    need_hash()  # the checks above ran; the rest needs a Pool with prefix caching
    p = kvattn.Pool(8, 4)
    with pytest.raises(kvattn.InvalidArgumentError, match="extra_key"):
        p.add_request([1, 2, 3, 4, 5], extra_key=5)
    assert p.stats()["num_requests"] == 0
    a, _ = p.add_request([1, 2, 3, 4, 5], extra_key="tenant")
    p.allocate(a, 5)
    p.append_tokens(a, [1, 2, 3, 4, 5])
    assert p.add_request([1, 2, 3, 4, 5], extra_key=b"tenant")[1] == 4  # str is its UTF-8
    assert p.add_request([1, 2, 3, 4, 5], extra_key=None)[1] == 0


def _safetensors(path, tensors):
    """tensors: name -> float32 array, written as safetensors (F32)."""
    header, off, blobs = {}, 0, []
    for n, a in tensors.items():
        b = np.ascontiguousarray(a, np.float32).tobytes()
        header[n] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_c8_loader_shards_and_bad_scales(tmp_path):
    need_c8_loader()
    hkv, d = 4, 8
    rng = np.random.default_rng(3)
    ks = rng.uniform(0.01, 1, hkv * d).astype(np.float32)
    vs = rng.uniform(0.01, 1, (hkv, d)).astype(np.float32)
    vo = rng.standard_normal(hkv * d).astype(np.float32)
    pre = "model.layers.2.self_attn."
    (tmp_path / "quant_model_description.json").write_text('{"kv_cache_type": "C8"}')
    _safetensors(tmp_path / "m.safetensors", {pre + "k_cache_scale": ks,
                                              pre + "v_cache_scale": vs,
                                              pre + "v_cache_offset": vo})
    s = kvattn.load_c8_scales(tmp_path, 2, hkv, d, tp_rank=1, tp_size=2)
    np.testing.assert_array_equal(s["k_scale"], ks[2 * d:])
    np.testing.assert_array_equal(s["v_scale"], vs.reshape(-1)[2 * d:])
    np.testing.assert_array_equal(s["v_offset"], vo[2 * d:])
    assert s["k_offset"] is None
    ctx = kvattn.Context("cpu")
    c = kvattn.Cache(ctx, 2, 4, 2, d, dtype="i8", quant="int8_channel", **s)
    assert c.quant == "int8_channel"
    # tp_size > Hkv: each rank one replicated head.
    s8 = kvattn.load_c8_scales(tmp_path, 2, hkv, d, tp_rank=5, tp_size=8)
    np.testing.assert_array_equal(s8["k_scale"], ks[2 * d: 3 * d])
    for bad in (dict(tp_rank=2, tp_size=2), dict(tp_size=3), dict(layer=-1)):
        a = dict(layer=2, tp_rank=0, tp_size=1)
        a.update(bad)
        with pytest.raises(kvattn.InvalidArgumentError):
            kvattn.load_c8_scales(tmp_path, a["layer"], hkv, d, a["tp_rank"], a["tp_size"])
    with pytest.raises(kvattn.IOError_, match="model.layers.3"):
        kvattn.load_c8_scales(tmp_path, 3, hkv, d)
    with pytest.raises(kvattn.ShapeMismatchError):
        kvattn.load_c8_scales(tmp_path, 2, 2, d)  # [32] scales for Hkv 2 * D 8
    # NaN / infinite / zero / negative scales are refused by the loader (naming
    # the tensor and the element), as the cache would refuse them.
    for v in (np.nan, np.inf, -0.5, 0.0):
        ks2 = ks.copy()
        ks2[5] = v
        _safetensors(tmp_path / "m.safetensors", {pre + "k_cache_scale": ks2,
                                                  pre + "v_cache_scale": vs})
        with pytest.raises(kvattn.InvalidArgumentError, match=r"k_cache_scale'\[5\]"):
            kvattn.load_c8_scales(tmp_path, 2, hkv, d)
        with pytest.raises(kvattn.InvalidArgumentError):
            kvattn.Cache(ctx, 2, 4, hkv, d, dtype="i8", quant="int8_channel", k_scale=ks2,
                         v_scale=vs)
    # A truncated file.
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(raw[:-7])
    with pytest.raises(kvattn.IOError_):
        kvattn.load_c8_scales(tmp_path, 2, hkv, d)
