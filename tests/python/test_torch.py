"""torch tensors (CPU; CUDA where a GPU and a CUDA build are there) through
the core API and the FlashInfer wrappers; skipped without torch. The package
itself imports without torch (checked in a subprocess)."""

import subprocess
import sys

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from reference import attention

torch = pytest.importorskip("torch")
LOG2E = 1.4426950408889634


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import kvattn, kvattn.flashinfer; "
            "print(kvattn.__version__)")
    subprocess.run([sys.executable, "-c", code], check=True)


def devices():
    yield "cpu"
    if torch.cuda.is_available() and kvattn.backend_available("cuda"):
        yield "cuda"


@pytest.mark.parametrize("device", list(devices()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_wrapper_torch(device, dtype):
    g = torch.Generator().manual_seed(3)
    b, hkv, h, d, nb = 16, 2, 8, 64, 12
    kv_lens = [37, 5, 64]
    npages = [-(-s // b) for s in kv_lens]
    indptr = torch.tensor([0] + list(np.cumsum(npages)), dtype=torch.int32)
    indices = torch.randperm(nb, generator=g)[: int(indptr[-1])].int()
    last = torch.tensor([s - (n - 1) * b for s, n in zip(kv_lens, npages)], dtype=torch.int32)
    cache = torch.randn(nb, 2, b, hkv, d, generator=g).to(dtype).to(device)
    q = torch.randn(3, h, d, generator=g).to(dtype).to(device)
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr.to(device), indices.to(device), last.to(device), h, hkv, d, b,
           q_data_type=dtype, logits_soft_cap=20.0)
    out, lse = w.run(q, cache, return_lse=True)
    assert out.device.type == device and out.dtype == dtype and lse.dtype == torch.float32
    kc, vc = cache[:, 0].float().cpu().numpy(), cache[:, 1].float().cpu().numpy()
    keys = [kc[indices[indptr[r]:indptr[r + 1]]].reshape(-1, hkv, d)[:s]
            for r, s in enumerate(kv_lens)]
    values = [vc[indices[indptr[r]:indptr[r + 1]]].reshape(-1, hkv, d)[:s]
              for r, s in enumerate(kv_lens)]
    ro, rl = attention(q.float().cpu().numpy(), keys, values, [1, 1, 1], causal=True,
                       softcap=20.0)
    tol = 1e-3 if dtype == torch.float16 else 1e-2
    np.testing.assert_allclose(out.float().cpu().numpy(), ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), rl * LOG2E, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", list(devices()))
def test_core_cache_write_run_torch(device):
    ctx = kvattn.Context("cuda" if device == "cuda" else "cpu")
    g = torch.Generator().manual_seed(4)
    cache = kvattn.Cache(ctx, 4, 8, 2, 32, dtype=torch.float32)
    k = torch.randn(13, 2, 32, generator=g).to(device)
    v = torch.randn(13, 2, 32, generator=g).to(device)
    cache.write(k, v, torch.arange(13, dtype=torch.int64, device=device))
    # A strided token dimension: k/v as slices of a fused [T, 3, Hkv, D] tensor.
    fused = torch.randn(2, 3, 2, 32, generator=g).to(device)
    cache.write(fused[:, 1], fused[:, 2], torch.tensor([13, 14], device=device))
    plan = kvattn.Plan(ctx, [0, 2], [15], [[0, 1]], block_size=8, num_heads=4,
                       num_kv_heads=2, head_dim=32, q_dtype="f32")
    q = torch.randn(2, 4, 32, generator=g).to(device)
    out, lse = plan.run(q, cache, return_lse=True)
    keys = torch.cat([k, fused[:, 1]]).cpu().numpy()
    values = torch.cat([v, fused[:, 2]]).cpu().numpy()
    ro, rl = attention(q.cpu().numpy(), [keys], [values], [2], causal=True)
    np.testing.assert_allclose(out.cpu().numpy(), ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.cpu().numpy(), rl, rtol=1e-5, atol=1e-5)
    wrong = q.cpu() if device == "cuda" else q.to(torch.float16)
    with pytest.raises((kvattn.InvalidArgumentError, kvattn.DtypeMismatchError)):
        plan.run(wrong, cache)


# The FlashInfer wrappers' torch paths: strided q / out / lse (staged through
# contiguous temporaries), the ALiBi LSE shift (a tensor cached per device),
# merge_state(s), the MLA wrapper and the multi-level cascade, each against
# the numpy path of the same wrapper (byte-equal on the CPU) or the reference.

from test_flashinfer import flashinfer_alibi_attention, random_paged  # noqa: E402


def _t(x, device, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    return t if dtype is None else t.to(dtype)


def _np(x):
    return x.float().cpu().numpy() if x.dtype in (torch.float16, torch.bfloat16) \
        else x.cpu().numpy()


def _paged_torch(rng, device, dtype, kv_lens=(30, 50), five_d=False):
    paged, indptr, indices, last, keys, values = random_paged(
        rng, list(kv_lens), 8, 2, 64, "NHD", np.float32, five_d)
    tp = _t(paged, device, dtype) if five_d else tuple(_t(x, device, dtype) for x in paged)
    keys = [_np(_t(k, "cpu", dtype)) for k in keys]
    values = [_np(_t(v, "cpu", dtype)) for v in values]
    return tp, indptr, indices, last, keys, values


def _strided_poisoned(n, h, d, dtype, device, lo=1, width=3):
    """A poisoned (tests/python/poison.py) [n, h, d] view with token stride
    width*h*d (column block lo of a wider buffer), and the buffer."""
    buf = poison.torch_poisoned((n, width * h * d), dtype, device)
    return buf[:, lo * h * d:(lo + 1) * h * d].view(n, h, d), buf


@pytest.mark.parametrize("device", list(devices()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wrappers_strided_q_out_lse_torch(device, dtype):
    """api39's strided q and api40's strided out / lse with torch tensors:
    the bytes of the contiguous call, nothing written beside the slices, q
    unchanged, a strided last dimension and an out over q refused."""
    g = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    tp, indptr, indices, last, keys, values = _paged_torch(rng, device, dtype)
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(_t(indptr, device), _t(indices, device), _t(last, device), 4, 2, 64, 8,
           q_data_type=dtype, logits_soft_cap=20.0)
    fused = torch.randn(2, 4 * 4 * 64, generator=g).to(dtype).to(device)
    q = fused[:, 256:512].view(2, 4, 64)
    assert not q.is_contiguous()
    fused_before = fused.clone()
    ref_out, ref_lse = w.run(q.contiguous(), tp, return_lse=True)
    out, buf = _strided_poisoned(2, 4, 64, dtype, device)
    lbuf = poison.torch_poisoned((2, 12), torch.float32, device)
    o, l = w.run(q, tp, out=out, lse=lbuf[:, 4:8], v_scale=0.5, return_lse=True)
    assert o is out and l.data_ptr() == lbuf[:, 4:8].data_ptr()
    assert torch.equal(out, ref_out * 0.5) and torch.equal(lbuf[:, 4:8], ref_lse)
    assert poison.torch_untouched(buf[:, :256]) and poison.torch_untouched(buf[:, 512:])
    assert poison.torch_untouched(lbuf[:, :4]) and poison.torch_untouched(lbuf[:, 8:])
    assert torch.equal(fused, fused_before)
    ro, rl = attention(_np(q), keys, values, [1, 1], causal=True, softcap=20.0)
    tol = 1e-3 if dtype == torch.float16 else 1e-2
    np.testing.assert_allclose(_np(ref_out), ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(ref_lse), rl * LOG2E, rtol=1e-3, atol=1e-3)
    bad = poison.torch_poisoned((2, 4, 128), dtype, device)
    with pytest.raises(kvattn.InvalidArgumentError, match="contiguous"):
        w.run(q, tp, out=bad[..., ::2])
    assert poison.torch_untouched(bad)
    with pytest.raises(kvattn.InvalidArgumentError, match="overlaps"):
        w.run(fused[:, :256].view(2, 4, 64), tp, out=fused[:, 64:320].view(2, 4, 64))
    assert torch.equal(fused, fused_before)

    p = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    qo = torch.tensor([0, 3, 7], dtype=torch.int64, device=device)  # int64, as torch makes them
    p.plan(qo, _t(indptr, device).long(), _t(indices, device).long(), _t(last, device).long(),
           4, 2, 64, 8, causal=True, q_data_type=dtype)
    qf = torch.randn(7, 3 * 4 * 64, generator=g).to(dtype).to(device)
    q = qf[:, 512:].view(7, 4, 64)
    out, buf = _strided_poisoned(7, 4, 64, dtype, device, lo=0, width=2)
    assert p.run(q, tp, out=out) is out
    assert torch.equal(out, p.run(q.contiguous(), tp))
    assert poison.torch_untouched(buf[:, 256:])

    r = fi.BatchPrefillWithRaggedKVCacheWrapper(ws)
    r.plan(qo, torch.tensor([0, 6, 11], dtype=torch.int32), 4, 2, 64, causal=True,
           q_data_type=dtype)
    kf = torch.randn(11, 3 * 2 * 64, generator=g).to(dtype).to(device)
    k, v = kf[:, :128].view(11, 2, 64), kf[:, 128:256].view(11, 2, 64)
    out, buf = _strided_poisoned(7, 4, 64, dtype, device)
    o, l = r.run(q, k, v, out=out, return_lse=True)
    co, cl = r.run(q.contiguous(), k.contiguous(), v.contiguous(), return_lse=True)
    assert o is out and torch.equal(out, co) and torch.equal(l, cl)
    assert poison.torch_untouched(buf[:, :256]) and poison.torch_untouched(buf[:, 512:])


@pytest.mark.parametrize("device", list(devices()))
def test_wrappers_alibi_lse_torch(device):
    """api40's ALiBi LSE shift with torch outputs (the shift as a tensor on
    the LSE's device): FlashInfer's LSE for decode, paged prefill and ragged,
    and the same on a second run."""
    rng = np.random.default_rng(6)
    slopes = fi.get_alibi_slopes(4).astype(np.float64)
    kv_lens = [30, 50, 7]
    tp, indptr, indices, last, keys, values = _paged_torch(rng, device, torch.float32, kv_lens,
                                                           five_d=True)
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 8, pos_encoding_mode="ALIBI",
           q_data_type=torch.float32)
    q = _t(rng.standard_normal((3, 4, 64)), device, torch.float32)
    fo, fl = flashinfer_alibi_attention(_np(q), keys, values, [1, 1, 1], slopes)
    for _ in range(2):
        out, lse = w.run(q, tp, return_lse=True)
        assert lse.device == q.device
        np.testing.assert_allclose(_np(out), fo, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_np(lse), fl, rtol=1e-5, atol=1e-4)
    q_lens = [3, 4, 7]
    qo = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    q = _t(rng.standard_normal((14, 4, 64)), device, torch.float32)
    fo, fl = flashinfer_alibi_attention(_np(q), keys, values, q_lens, slopes)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    p.plan(qo, indptr, indices, last, 4, 2, 64, 8, causal=True, pos_encoding_mode="ALIBI",
           q_data_type=torch.float32)
    lse = torch.full((14, 4), float("nan"), device=device)
    out = p.run(q, tp, lse=lse)  # FlashInfer: lse written, out returned
    assert not isinstance(out, tuple)
    np.testing.assert_allclose(_np(out), fo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(lse), fl, rtol=1e-5, atol=1e-4)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(ws)
    r.plan(qo, torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32), 4, 2,
           64, causal=True, pos_encoding_mode="ALIBI", q_data_type=torch.float32)
    k = _t(np.concatenate(keys), device, torch.float32)
    v = _t(np.concatenate(values), device, torch.float32)
    out, lse = r.run(q, k, v, return_lse=True)
    np.testing.assert_allclose(_np(out), fo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(lse), fl, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", list(devices()))
def test_merge_state_torch(device):
    """merge_state, merge_state_in_place (with and without a mask) and
    merge_states on torch tensors: the numpy path's bytes."""
    g = torch.Generator().manual_seed(7)
    va, vb = (torch.randn(6, 4, 32, generator=g).half().to(device) for _ in range(2))
    sa, sb = ((torch.randn(6, 4, generator=g) * 3).to(device) for _ in range(2))
    v, s = fi.merge_state(va, sa, vb, sb)
    nv, ns = fi.merge_state(*(x.cpu().numpy() for x in (va, sa, vb, sb)))
    assert v.device == va.device and s.dtype == torch.float32
    np.testing.assert_array_equal(v.cpu().numpy(), nv)
    np.testing.assert_allclose(s.cpu().numpy(), ns, rtol=1e-6, atol=1e-6)
    v2, s2 = fi.merge_state(va, sa.half(), vb, sb.half())  # FlashInfer converts s to f32
    nv2, ns2 = fi.merge_state(va.cpu().numpy(), sa.half().float().cpu().numpy(),
                              vb.cpu().numpy(), sb.half().float().cpu().numpy())
    np.testing.assert_array_equal(v2.cpu().numpy(), nv2)
    v3, s3 = va.clone(), sa.clone()
    fi.merge_state_in_place(v3, s3, vb, sb)
    assert torch.equal(v3, v)
    np.testing.assert_allclose(s3.cpu().numpy(), ns, rtol=1e-6, atol=1e-6)
    mask = torch.tensor([True, False, True, True, False, True], device=device)
    v4, s4 = va.clone(), sa.clone()
    fi.merge_state_in_place(v4, s4, vb, sb, mask=mask)
    assert torch.equal(v4[mask], v[mask]) and torch.equal(v4[~mask], va[~mask])
    assert torch.equal(s4[~mask], sa[~mask])
    V = torch.stack([va, vb, va], 1)
    S = torch.stack([sa, sb, sb], 1)
    vm, sm = fi.merge_states(V, S)
    nvm, nsm = fi.merge_states(V.cpu().numpy(), S.cpu().numpy())
    np.testing.assert_array_equal(vm.cpu().numpy(), nvm)
    np.testing.assert_allclose(sm.cpu().numpy(), nsm, rtol=1e-6, atol=1e-6)


# CPU only: these small f32 head sizes are the CPU backend's; the CUDA MLA
# kernels take D 576 / Dv 512 with f16 / bf16 q (kva_plan_create refuses the
# rest with UNSUPPORTED; tests/cuda/test_cuda_mla*.c test them).
@pytest.mark.parametrize("device", ["cpu"])
def test_mla_wrapper_torch(device):
    """The MLA wrapper on torch tensors: run() (q_nope / q_pe concatenated,
    strided out and lse) equals the numpy path; run_layer() too."""
    rng = np.random.default_rng(8)
    h, dc, dr, dn, dv, b = 4, 64, 16, 32, 24, 8
    kv_lens = [5, 19]
    kv = rng.standard_normal((4, b, dc + dr)).astype(np.float32)
    args = (np.array([0, 1, 3]), np.array([0, 1, 4]), np.array([2, 0, 1, 3]),
            np.array(kv_lens), h, dc, dr, b, True, 0.2)
    q = rng.standard_normal((3, h, dc + dr)).astype(np.float32)
    ql = rng.standard_normal((3, h, dn + dr)).astype(np.float32)
    w_uk = rng.standard_normal((h, dn, dc)).astype(np.float32)
    w_uv = rng.standard_normal((h, dc, dv)).astype(np.float32)
    wn = fi.BatchMLAPagedAttentionWrapper(None)
    wn.plan(*args, "float32", "float32", qk_nope_head_dim=dn, v_head_dim=dv)
    want, want_lse = wn.run(q[..., :dc], q[..., dc:], kv[..., :dc], kv[..., dc:],
                            return_lse=True)
    want_layer = wn.run_layer(ql, w_uk, w_uv, kv[..., :dc], kv[..., dc:])
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    wt = fi.BatchMLAPagedAttentionWrapper(ws)
    wt.plan(*(torch.from_numpy(a).int() for a in args[:4]), *args[4:], torch.float32,
            torch.float32, qk_nope_head_dim=dn, v_head_dim=dv)
    tkv, tq = _t(kv, device), _t(q, device)
    out, buf = _strided_poisoned(3, h, dc, torch.float32, device, lo=1, width=2)
    lbuf = poison.torch_poisoned((3, 2 * h), torch.float32, device)
    o, l = wt.run(tq[..., :dc], tq[..., dc:], tkv[..., :dc], tkv[..., dc:], out=out,
                  lse=lbuf[:, h:], return_lse=True)
    assert o is out
    np.testing.assert_array_equal(_np(out), want)
    np.testing.assert_array_equal(_np(lbuf[:, h:]), want_lse)
    assert poison.torch_untouched(buf[:, :h * dc]) and poison.torch_untouched(lbuf[:, :h])
    got = wt.run_layer(_t(ql, device), _t(w_uk, device), _t(w_uv, device), tkv[..., :dc],
                       tkv[..., dc:])
    np.testing.assert_array_equal(_np(got), want_layer)


@pytest.mark.parametrize("device", list(devices()))
def test_multi_level_cascade_torch(device):
    """MultiLevelCascadeAttentionWrapper with torch tensors (FlashInfer's
    docstring example, scaled down): the numpy path's result."""
    from test_fi_api import _cascade_case

    rng = np.random.default_rng(9)
    paged, lv, keys, values = _cascade_case(rng, "NHD", True)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    wn = fi.MultiLevelCascadeAttentionWrapper(2, None, "NHD")
    wn.plan(lv["qo"], lv["indptr"], lv["indices"], lv["last"], 4, 2, 32, 4, causal=True,
            q_data_type="float32")
    want = wn.run(q, paged)
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    wt = fi.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    tl = {k: [_t(a, device) for a in v] for k, v in lv.items()}
    wt.plan(tl["qo"], tl["indptr"], tl["indices"], tl["last"], 4, 2, 32, 4, causal=True,
            q_data_type=torch.float32)
    got = wt.run(_t(q, device), _t(paged, device))
    if device == "cpu":  # the same backend as the numpy path: the same bits
        np.testing.assert_array_equal(_np(got), want)
    else:  # the CUDA kernels sum in another order than the CPU backend
        np.testing.assert_allclose(_np(got), want, rtol=1e-5, atol=1e-5)


def test_negative_bit_refused():
    """A torch tensor with the negative bit set (a lazily negated view, e.g.
    z.conj().imag) holds -x in memory: read or written through its pointer
    it would give silently negated results, so every tensor argument refuses
    it (as torch's DLPack export does), nothing written."""
    g = torch.Generator().manual_seed(10)
    ctx = kvattn.Context("cpu")
    cache = kvattn.Cache(ctx, 4, 4, 2, 16, dtype=torch.float32)
    k, v = torch.randn(7, 2, 16, generator=g), torch.randn(7, 2, 16, generator=g)
    cache.write(k, v, torch.arange(7))
    before = cache.k_array().copy()
    with pytest.raises(kvattn.InvalidArgumentError, match="negative bit"):
        cache.write(torch._neg_view(k), v, torch.arange(7))
    np.testing.assert_array_equal(cache.k_array(), before)
    plan = kvattn.Plan(ctx, [0, 2], [7], [[0, 1]], block_size=4, num_heads=4, num_kv_heads=2,
                       head_dim=16, q_dtype="f32")
    q = torch.randn(2, 4, 16, generator=g)
    want = plan.run(q, cache)
    with pytest.raises(kvattn.InvalidArgumentError, match="q: .*negative bit"):
        plan.run(torch._neg_view(-q), cache)  # logically q, stored as -q
    out = torch._neg_view(torch.zeros(2, 4, 16))
    with pytest.raises(kvattn.InvalidArgumentError, match="out: .*negative bit"):
        plan.run(q, cache, out=out)
    assert not out.resolve_neg().any()
    assert torch.equal(plan.run(torch._neg_view(-q).resolve_neg(), cache), want)
    ws = torch.empty(16, dtype=torch.uint8)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan([0, 1], [0], [4], 4, 2, 16, 4, q_data_type=torch.float32)
    kv = torch.randn(1, 2, 4, 2, 16, generator=g)
    with pytest.raises(kvattn.InvalidArgumentError, match="negative bit"):
        w.run(torch._neg_view(q[:1]), kv)
    with pytest.raises(kvattn.InvalidArgumentError, match="negative bit"):
        w.run(q[:1], torch._neg_view(kv))


@pytest.mark.parametrize("device", list(devices()))
def test_mla_wrapper_torch_576(device):
    """DeepSeek's MLA shapes (Dc 512, Dr 64, Dn 128, Dv 128) in bf16 through
    the MLA wrapper on torch tensors: the kernel-level run() (the shape the
    CUDA kernels serve) and run_layer() against the naive float64 MLA of
    tests/python/test_mla.py on the same bf16-rounded inputs."""
    from test_mla import Layer

    rng = np.random.default_rng(13)
    lay = Layer(rng, h=16, dc=512, dr=64, dn=128, dv=128, bs=64, q_lens=[1, 2, 1, 5],
                seq_lens=[1, 130, 513, 64], dt="f32")

    def bf(x):  # bf16 on the device, and its exact values back in float32
        t = _t(x, device, torch.bfloat16)
        return t, t.float().cpu().numpy()

    tkv, lay.kv = bf(lay.kv)
    tq, lay.q = bf(lay.q)
    tuk, lay.w_uk = bf(lay.w_uk)
    tuv, lay.w_uv = bf(lay.w_uv)
    tqa, qa = bf(lay.absorbed_q())
    ws = torch.empty(16, dtype=torch.uint8, device=device)

    def wrapper(**mla):  # mla: the layer's head sizes, for run_layer()
        w = fi.BatchMLAPagedAttentionWrapper(ws)
        w.plan(_t(lay.qsl, device), _t(lay.indptr, device), _t(lay.indices, device),
               _t(np.array(lay.seq_lens, np.int32), device), lay.h, lay.dc, lay.dr, lay.bs,
               True, lay.scale, torch.bfloat16, torch.bfloat16, **mla)
        return w

    # FlashInfer's plan (no layer head sizes): every request absorbed, the
    # 5-token one too; with the head sizes, requests above decode_threshold 1
    # take the compute-friendly path in run_layer() (which the CUDA backend
    # runs only there: kva_attention_run refuses such a plan, as documented).
    w = wrapper()
    ckv, kpe = tkv[..., : lay.dc], tkv[..., lay.dc:]
    t = qa.shape[0]
    out = torch.full((t, lay.h, lay.dc), float("nan"), dtype=torch.bfloat16, device=device)
    o, lse = w.run(tqa[..., : lay.dc], tqa[..., lay.dc:], ckv, kpe, out=out, return_lse=True,
                   return_lse_base_on_e=True)
    assert o is out and o.device.type == device and lse.dtype == torch.float32

    def rel(got, want):  # relative Frobenius error (a bf16 out: ~2^-9 per value)
        return np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)

    want, want_lse = lay.naive_latent(qa)
    assert rel(_np(o), want) < 5e-3  # the CPU backend: 7e-4
    np.testing.assert_allclose(_np(o), want, atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(_np(lse), want_lse, atol=2e-3, rtol=1e-4)
    got = wrapper(qk_nope_head_dim=lay.dn, v_head_dim=lay.dv).run_layer(tq, tuk, tuv, ckv, kpe)
    assert got.shape == (t, lay.h, lay.dv) and got.dtype == torch.bfloat16
    want_layer = lay.naive()[0]
    assert rel(_np(got), want_layer) < 1e-2  # the CPU backend: 1.7e-3 (ql rounded to bf16)
    np.testing.assert_allclose(_np(got), want_layer, atol=2e-2, rtol=2e-2)
