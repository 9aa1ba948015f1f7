"""MLA through the Python package (Cache kind="mla", Plan.run_mla, and the
FlashInfer-style BatchMLAPagedAttentionWrapper) against a numpy naive MLA in
float64 on random data: every head attends with key [c_kv . W_UK[h]^T, k_pe]
and value c_kv . W_UV[h], nothing absorbed (the truth both library paths
must match). Bad inputs raise and leave the outputs unchanged."""

import math

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from reference import attention

LOG2E = 1.0 / math.log(2.0)
# Tolerances as tests/test_mla.c's (fp32 sums over Dc-wide rows): f32 5e-5,
# f16 8e-4 absolute + 2e-3 relative.
TOL = {"f32": (5e-5, 5e-5), "f16": (8e-4, 2e-3)}
NP_DT = {"f32": np.float32, "f16": np.float16}


class Layer:
    """A random MLA layer and a batch over a shuffled latent cache."""

    def __init__(self, rng, h, dc, dr, dn, dv, bs, q_lens, seq_lens, dt):
        self.h, self.dc, self.dr, self.dn, self.dv, self.bs = h, dc, dr, dn, dv, bs
        self.q_lens, self.seq_lens = list(q_lens), list(seq_lens)
        npages = [max(1, -(-s // bs)) for s in seq_lens]
        nb = sum(npages) + 2
        perm = rng.permutation(nb).astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
        self.indices = perm[: self.indptr[-1]]
        width = max(npages)
        self.block_table = np.zeros((len(seq_lens), width), np.int32)
        for r, n in enumerate(npages):
            self.block_table[r, :n] = self.indices[self.indptr[r]: self.indptr[r + 1]]
        npd = NP_DT[dt]
        # Unit-variance latent rows, weights of variance 1/Dc (scores O(1)).
        self.kv = rng.standard_normal((nb, bs, dc + dr)).astype(npd)
        t = sum(q_lens)
        self.q = rng.standard_normal((t, h, dn + dr)).astype(npd)
        self.w_uk = (rng.standard_normal((h, dn, dc)) / math.sqrt(dc)).astype(npd)
        self.w_uv = (rng.standard_normal((h, dc, dv)) / math.sqrt(dc)).astype(npd)
        self.qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        self.scale = 1.0 / math.sqrt(dn + dr)

    def rows(self, r):
        """Request r's latent rows [s, Dc + Dr] in float64."""
        s = self.seq_lens[r]
        pages = self.indices[self.indptr[r]: self.indptr[r + 1]]
        return self.kv[pages].reshape(-1, self.dc + self.dr)[:s].astype(np.float64)

    def naive(self, causal=True):
        """The naive (decompressed) MLA: out [T, H, Dv], natural lse [T, H]."""
        keys, values = [], []
        uk, uv = self.w_uk.astype(np.float64), self.w_uv.astype(np.float64)
        for r in range(len(self.seq_lens)):
            c = self.rows(r)
            ckv, kpe = c[:, : self.dc], c[:, self.dc:]
            k_nope = np.einsum("sc,hnc->shn", ckv, uk)
            kpe_h = np.broadcast_to(kpe[:, None, :], (c.shape[0], self.h, self.dr))
            keys.append(np.concatenate([k_nope, kpe_h], axis=-1))
            values.append(np.einsum("sc,hcv->shv", ckv, uv))
        return attention(self.q, keys, values, self.q_lens, causal=causal, scale=self.scale)

    def absorbed_q(self):
        """[q_nope . W_UK[h], q_pe] [T, H, Dc + Dr] in float64."""
        q = self.q.astype(np.float64)
        ql = np.einsum("thn,hnc->thc", q[..., : self.dn], self.w_uk.astype(np.float64))
        return np.concatenate([ql, q[..., self.dn:]], axis=-1)

    def naive_latent(self, qa):
        """Attention of absorbed queries qa [T, H, Dc + Dr] over the latent
        rows (MQA, values = c_kv): out [T, H, Dc], lse."""
        keys = [self.rows(r)[:, None, :] for r in range(len(self.seq_lens))]
        values = [k[..., : self.dc] for k in keys]
        return attention(qa, keys, values, self.q_lens, causal=True, scale=self.scale)

    def plan(self, ctx, dt, thr=1):
        return kvattn.Plan(ctx, self.qsl, self.seq_lens, self.block_table,
                           block_size=self.bs, num_heads=self.h, num_kv_heads=1,
                           head_dim=self.dc + self.dr, head_dim_v=self.dc, q_dtype=dt,
                           scale=self.scale, decode_threshold=thr, kind="mla",
                           mla_qk_nope_head_dim=self.dn, mla_v_head_dim=self.dv)


def close(got, want, dt):
    atol, rtol = TOL[dt]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=atol, rtol=rtol)


# Decodes, a speculative decode of 3 and a chunked prefill after context, in
# one plan: thresholds 1 and 4 send the q_len-3 request down either path.
CASES = [
    dict(h=3, dc=64, dr=16, dn=32, dv=24, bs=16, q_lens=[1, 1, 3, 9], seq_lens=[1, 40, 17, 70]),
    dict(h=16, dc=128, dr=64, dn=64, dv=64, bs=64, q_lens=[1, 2, 33], seq_lens=[129, 64, 100]),
]


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("thr", [1, 4])
def test_run_mla_matches_naive(backend, dt, case, thr):
    rng = np.random.default_rng(100 + case)
    lay = Layer(rng, dt=dt, **CASES[case])
    ctx = kvattn.Context(backend, num_threads=2)
    cache = kvattn.Cache.mla(ctx, lay.kv.shape[0], lay.bs, lay.dc, lay.dr, dtype=dt)
    assert cache.kind == "mla" and cache.head_dim == lay.dc + lay.dr
    cache.k_array()[:, :, 0, :] = lay.kv
    plan = lay.plan(ctx, dt, thr)
    out = np.full((sum(lay.q_lens), lay.h, lay.dv), np.nan, NP_DT[dt])
    lse = np.full((sum(lay.q_lens), lay.h), np.nan, np.float32)
    res = plan.run_mla(lay.q, lay.w_uk, lay.w_uv, cache, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    want, want_lse = lay.naive()
    close(out, want, dt)
    np.testing.assert_allclose(lse, want_lse, atol=5e-5, rtol=1e-5)
    # Allocated outputs; the absorbed kernel-level call on the same plan.
    close(plan.run_mla(lay.q, lay.w_uk, lay.w_uv, cache), want, dt)
    qa = lay.absorbed_q().astype(NP_DT[dt])  # the reference sees the same rounded query
    lat, lat_lse = plan.run(qa, cache, return_lse=True)
    want_lat, want_lat_lse = lay.naive_latent(qa)
    close(lat, want_lat, dt)
    np.testing.assert_allclose(lat_lse, want_lat_lse, atol=5e-5, rtol=1e-5)


def test_cache_write_latent_rows():
    """write(c_kv, k_pe, slots) puts [c_kv | k_pe] at each slot, skips < 0."""
    rng = np.random.default_rng(7)
    ctx = kvattn.Context("cpu")
    cache = kvattn.Cache.mla(ctx, 4, 8, 32, 16, dtype="f32")
    before = rng.standard_normal(cache.k_array().shape).astype(np.float32)
    cache.k_array()[...] = before
    ckv = rng.standard_normal((5, 32)).astype(np.float32)
    kpe = rng.standard_normal((5, 1, 16)).astype(np.float32)
    slots = np.array([3, 9, -1, 31, 16], np.int64)
    cache.write(ckv, kpe, slots)
    want = before.reshape(-1, 48).copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want[s] = np.concatenate([ckv[t], kpe[t, 0]])
    np.testing.assert_array_equal(cache.k_array().reshape(-1, 48), want)
    np.testing.assert_array_equal(cache.v_array().reshape(-1, 32), want[:, :32])
    # A wrong width raises and writes nothing.
    with pytest.raises(kvattn.ShapeMismatchError):
        cache.write(rng.standard_normal((5, 31)).astype(np.float32), kpe, slots)
    np.testing.assert_array_equal(cache.k_array().reshape(-1, 48), want)


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_flashinfer_mla_wrapper(dt):
    """FlashInfer's plan()/run() signature on the kernel-level call (LSE in
    base 2, or natural with return_lse_base_on_e), and run_layer()."""
    rng = np.random.default_rng(11)
    c = CASES[0]
    lay = Layer(rng, dt=dt, **c)
    w = fi.BatchMLAPagedAttentionWrapper(np.empty(16, np.uint8))
    w.plan(lay.qsl, lay.indptr, lay.indices, np.array(lay.seq_lens, np.int32), lay.h, lay.dc,
           lay.dr, lay.bs, True, lay.scale, dt, dt, qk_nope_head_dim=lay.dn,
           v_head_dim=lay.dv)
    ckv, kpe = lay.kv[..., : lay.dc], lay.kv[..., lay.dc:]
    qa = lay.absorbed_q().astype(NP_DT[dt])
    out, lse2 = w.run(qa[..., : lay.dc], qa[..., lay.dc:], ckv, kpe, return_lse=True)
    want, want_lse = lay.naive_latent(qa)
    close(out, want, dt)
    np.testing.assert_allclose(lse2, want_lse * LOG2E, atol=1e-4, rtol=1e-5)
    _, lse_e = w.run(qa[..., : lay.dc], qa[..., lay.dc:], ckv, kpe, return_lse=True,
                     return_lse_base_on_e=True)
    np.testing.assert_allclose(lse_e, want_lse, atol=5e-5, rtol=1e-5)
    out = w.run_layer(lay.q, lay.w_uk, lay.w_uv, ckv, kpe)
    close(out, lay.naive()[0], dt)


def test_wrapper_strided_out():
    """A strided out / lse (slices of wider buffers), as FlashInfer writes
    them: the bytes of the contiguous call, nothing beside the slices."""
    rng = np.random.default_rng(12)
    lay = Layer(rng, dt="f32", **CASES[0])
    w = fi.BatchMLAPagedAttentionWrapper(np.empty(16, np.uint8))
    w.plan(lay.qsl, lay.indptr, lay.indices, np.array(lay.seq_lens, np.int32), lay.h, lay.dc,
           lay.dr, lay.bs, True, lay.scale, "f32", "f32", qk_nope_head_dim=lay.dn,
           v_head_dim=lay.dv)
    ckv, kpe = lay.kv[..., : lay.dc], lay.kv[..., lay.dc:]
    qa = lay.absorbed_q().astype(np.float32)
    t = qa.shape[0]
    want, want_lse = w.run(qa[..., : lay.dc], qa[..., lay.dc:], ckv, kpe, return_lse=True)
    buf = poison.poisoned((t, 2 * lay.h * lay.dc))
    out = buf[:, lay.h * lay.dc:].reshape(t, lay.h, lay.dc)
    lbuf = poison.poisoned((t, 2 * lay.h))
    lse = lbuf[:, : lay.h]
    o, l = w.run(qa[..., : lay.dc], qa[..., lay.dc:], ckv, kpe, out=out, lse=lse,
                 return_lse=True)
    assert o is out and l is lse
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    assert poison.untouched(buf[:, : lay.h * lay.dc]) and poison.untouched(lbuf[:, lay.h:])
    want = w.run_layer(lay.q, lay.w_uk, lay.w_uv, ckv, kpe)
    buf = poison.poisoned((t, 2 * lay.h * lay.dv))
    out = buf[:, : lay.h * lay.dv].reshape(t, lay.h, lay.dv)
    assert w.run_layer(lay.q, lay.w_uk, lay.w_uv, ckv, kpe, out=out) is out
    np.testing.assert_array_equal(out, want)
    assert poison.untouched(buf[:, lay.h * lay.dv:])


def test_bad_inputs_leave_outputs():
    rng = np.random.default_rng(3)
    lay = Layer(rng, dt="f32", **CASES[0])
    ctx = kvattn.Context("cpu")
    cache = kvattn.Cache.from_latent(ctx, lay.kv, kv_lora_rank=lay.dc)
    plan = lay.plan(ctx, "f32")
    t = sum(lay.q_lens)
    out = rng.standard_normal((t, lay.h, lay.dv)).astype(np.float32)
    keep = out.copy()
    with pytest.raises(kvattn.ShapeMismatchError):  # W_UK of the wrong Dn
        plan.run_mla(lay.q, lay.w_uk[:, 1:], lay.w_uv, cache, out=out)
    with pytest.raises(kvattn.ShapeMismatchError):  # W_UV transposed
        plan.run_mla(lay.q, lay.w_uk, lay.w_uv.transpose(0, 2, 1).copy(), cache, out=out)
    with pytest.raises(kvattn.DtypeMismatchError):
        plan.run_mla(lay.q.astype(np.float16), lay.w_uk, lay.w_uv, cache, out=out)
    mha = kvattn.Cache(ctx, lay.kv.shape[0], lay.bs, 1, lay.dc + lay.dr, lay.dc, dtype="f32")
    with pytest.raises(kvattn.ShapeMismatchError):  # an MHA cache of the same shape
        plan.run_mla(lay.q, lay.w_uk, lay.w_uv, mha, out=out)
    kernel_only = kvattn.Plan(ctx, lay.qsl, lay.seq_lens, lay.block_table, block_size=lay.bs,
                              num_heads=lay.h, num_kv_heads=1, head_dim=lay.dc + lay.dr,
                              head_dim_v=lay.dc, q_dtype="f32", scale=lay.scale, kind="mla")
    with pytest.raises(kvattn.InvalidArgumentError):
        kernel_only.run_mla(lay.q, lay.w_uk, lay.w_uv, cache, out=out)
    np.testing.assert_array_equal(out, keep)
    with pytest.raises(kvattn.InvalidArgumentError):  # the library refuses a scale of 0
        kvattn.Plan(ctx, lay.qsl, lay.seq_lens, lay.block_table, block_size=lay.bs,
                    num_heads=lay.h, num_kv_heads=1, head_dim=lay.dc + lay.dr,
                    head_dim_v=lay.dc, q_dtype="f32", kind="mla")
    # The wrapper: separate c_kv / k_pe tensors, and run() before plan().
    w = fi.BatchMLAPagedAttentionWrapper(None)
    with pytest.raises(kvattn.InvalidArgumentError):
        w.run(lay.q, lay.q, lay.kv[..., : lay.dc], lay.kv[..., lay.dc:])
    w.plan(lay.qsl, lay.indptr, lay.indices, np.array(lay.seq_lens, np.int32), lay.h, lay.dc,
           lay.dr, lay.bs, True, lay.scale, "f32", "f32")
    qa = lay.absorbed_q().astype(np.float32)
    with pytest.raises(kvattn.UnsupportedError):
        w.run(qa[..., : lay.dc], qa[..., lay.dc:], lay.kv[..., : lay.dc].copy(),
              lay.kv[..., lay.dc:].copy())
    with pytest.raises(kvattn.InvalidArgumentError):  # no Dn / Dv in plan()
        w.run_layer(lay.q, lay.w_uk, lay.w_uv, lay.kv[..., : lay.dc], lay.kv[..., lay.dc:])
    with pytest.raises(kvattn.InvalidArgumentError):  # more keys than pages hold
        w.plan(lay.qsl, lay.indptr, lay.indices, np.array(lay.seq_lens, np.int32) + 16, lay.h,
               lay.dc, lay.dr, lay.bs, True, lay.scale, "f32", "f32")
