"""FlashInfer's CUDA-graph mode of kvattn.flashinfer's paged wrappers
(use_cuda_graph=True, python/kvattn/_fi_graph.py): the buffers fix the batch
size and page count as in FlashInfer, a graph-mode wrapper keeps the device
buffers a captured graph reads (and refuses, after a capture, a plan that
would grow them), and run() under capture is refused outside graph mode. On
a GPU: SGLang's decode pattern (capture run() once on a side stream, then
fast_decode_plan on the main stream and replay, step after step, with
growing contexts and new pages), every replay checked against the numpy
reference. Without a GPU the capture query is stubbed."""

import functools
import math

import numpy as np
import pytest

import kvattn
from kvattn import _fi_graph
from kvattn import flashinfer as fi
from poison import poisoned, untouched
from reference import attention
from test_flashinfer import random_paged

H, HKV, D, PAGE = 4, 2, 64, 8


def _bufs(bs, n):
    return dict(paged_kv_indptr_buffer=np.zeros(bs + 1, np.int32),
                paged_kv_indices_buffer=np.zeros(n, np.int32),
                paged_kv_last_page_len_buffer=np.zeros(bs, np.int32))


def _case(seed, kv_lens, spare=2):
    rng = np.random.default_rng(seed)
    paged, indptr, indices, last, keys, values = random_paged(
        rng, list(kv_lens), PAGE, HKV, D, "NHD", np.float32, False, spare)
    q = rng.standard_normal((len(kv_lens), H, D)).astype(np.float32)
    return paged, indptr, indices, last, keys, values, q


def _plan(w, indptr, indices, last, **kw):
    w.plan(indptr, indices, last, H, HKV, D, PAGE, q_data_type="float32", **kw)


def test_graph_mode_needs_its_buffers():
    """use_cuda_graph=True without the buffers, or with an indptr buffer not
    batch_size + 1 long, is refused (ValueError, as FlashInfer's)."""
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True)
    b = _bufs(3, 10)
    b["paged_kv_indptr_buffer"] = np.zeros(3, np.int32)
    with pytest.raises(kvattn.InvalidArgumentError, match="batch_size"):
        fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True, **b)
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True)
    with pytest.raises(kvattn.InvalidArgumentError, match="paged_kv_last_page_len_buf"):
        fi.BatchPrefillWithPagedKVCacheWrapper(
            None, "NHD", use_cuda_graph=True, qo_indptr_buf=np.zeros(4, np.int32),
            paged_kv_indptr_buf=np.zeros(4, np.int32), paged_kv_indices_buf=np.zeros(9, np.int32),
            paged_kv_last_page_len_buf=np.zeros(2, np.int32))


def test_graph_mode_plan_rules():
    """A graph-mode decode plan with another batch size, more page indices
    than the buffer or another q_len_per_req is refused and the previous plan
    stands; the prefill wrapper refuses more query rows than its first plan."""
    paged, indptr, indices, last, keys, values, q = _case(1, (30, 50, 9))
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True,
                                              **_bufs(3, len(indices)))
    _plan(w, indptr, indices, last)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(w.run(q, paged), ref, rtol=1e-5, atol=1e-5)
    p2, ip2, ix2, l2, *_ = _case(2, (30, 50))
    with pytest.raises(kvattn.InvalidArgumentError, match="batch size 2"):
        _plan(w, ip2, ix2, l2)
    ix3 = np.concatenate([indices, indices[:1]])
    with pytest.raises(kvattn.InvalidArgumentError, match="page indices"):
        _plan(w, indptr, ix3, last)
    with pytest.raises(kvattn.InvalidArgumentError, match="q_len_per_req"):
        _plan(w, indptr, indices, last, q_len_per_req=2)
    np.testing.assert_allclose(w.run(q, paged), ref, rtol=1e-5, atol=1e-5)

    qo = np.array([0, 4, 6, 7], np.int32)
    pw = fi.BatchPrefillWithPagedKVCacheWrapper(
        None, "NHD", use_cuda_graph=True, qo_indptr_buf=np.zeros(4, np.int32),
        paged_kv_indptr_buf=np.zeros(4, np.int32), paged_kv_indices_buf=indices.copy(),
        paged_kv_last_page_len_buf=np.zeros(3, np.int32))
    pw.plan(qo, indptr, indices, last, H, HKV, D, PAGE, causal=True, q_data_type="float32")
    with pytest.raises(kvattn.InvalidArgumentError, match="query rows"):
        pw.plan(np.array([0, 4, 7, 8], np.int32), indptr, indices, last, H, HKV, D, PAGE,
                causal=True, q_data_type="float32")


def test_capture_outside_graph_mode_is_refused(monkeypatch):
    """run() under capture (stubbed: the VM has no GPU) is refused outside
    graph mode and writes nothing; in graph mode it runs."""
    torch = pytest.importorskip("torch")
    paged, indptr, indices, last, keys, values, q = _case(3, (30, 50, 9))
    tq, tkv = torch.from_numpy(q), tuple(torch.from_numpy(x) for x in paged)
    assert not _fi_graph.capturing(kvattn.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(8, dtype=torch.uint8), "NHD")._ctx, tq)  # CPU tensors never capture
    monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8, dtype=torch.uint8), "NHD")
    _plan(w, indptr, indices, last)
    out = torch.from_numpy(poisoned((3, H, D)))
    with pytest.raises(kvattn.UnsupportedError, match="use_cuda_graph"):
        w.run(tq, tkv, out=out)
    assert untouched(out.numpy())
    g = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8, dtype=torch.uint8), "NHD",
                                              use_cuda_graph=True, **_bufs(3, len(indices)))
    _plan(g, indptr, indices, last)
    with pytest.raises(kvattn.UnsupportedError, match="did not prepare"):
        g.run(tq, tkv, out=out, window_left=3)  # a window plan() did not make
    assert untouched(out.numpy())
    g.run(tq, tkv, out=out)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_growth_after_capture_is_refused(monkeypatch):
    """After a (stubbed) capture, a plan whose dense page table exceeds what
    graph mode reserved is refused and the previous plan stands; before a
    capture the same plan is accepted (the reservation grows)."""
    torch = pytest.importorskip("torch")
    lens0 = (9, 9, 9)  # 2 pages each: the reservation is max(indices buffer 39, 2 x 3 x 2)
    paged, indptr, indices, last, keys, values, q = _case(4, lens0, spare=40)
    big = (9, 9, 200)  # 25 pages in one request: a table of 3 x 25 = 75 > 39
    _, bip, bix, bl, *_ = _case(5, big)
    # The promise's edge: up to 39 // 3 = 13 pages per request after a capture
    edge = _case(6, (9, 9, 13 * PAGE), spare=40)  # 3 x 13 = 39 entries: accepted
    over = _case(7, (9, 9, 13 * PAGE + 1))  # 3 x 14 = 42 > 39: refused
    tkv = tuple(torch.from_numpy(x) for x in paged)
    nidx = 39
    for captured in (False, True):
        w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8, dtype=torch.uint8), "NHD",
                                                  use_cuda_graph=True, **_bufs(3, nidx))
        _plan(w, indptr, indices, last)
        if captured:
            monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
            w.run(torch.from_numpy(q), tkv)
            monkeypatch.undo()
            for ip, ix, lp in ((bip, bix, bl), over[1:4]):
                with pytest.raises(kvattn.InvalidArgumentError,
                                   match="at most 13 pages.*freed memory"):
                    _plan(w, ip, ix % paged[0].shape[0], lp)
            ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
            np.testing.assert_allclose(w.run(torch.from_numpy(q), tkv).numpy(), ref,
                                       rtol=1e-5, atol=1e-5)
            ekv, eip, eix, elp, ek, ev, eq = edge
            _plan(w, eip, eix, elp)
            ref, _ = attention(eq, ek, ev, [1, 1, 1], causal=True)
            np.testing.assert_allclose(w.run(eq, ekv), ref, rtol=1e-5, atol=1e-5)
        else:
            _plan(w, bip, bix[:nidx], bl)  # no capture yet: the reservation grows


def _torch_case(torch, rng, kv_lens, pool, dev):
    """New pages (a random subset of the pool) for kv_lens, q, and the
    reference over the pool's contents."""
    npages = [-(-s // PAGE) for s in kv_lens]
    ix = rng.permutation(pool[0].shape[0])[: sum(npages)].astype(np.int32)
    ip = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    last = np.array([s - (n - 1) * PAGE for s, n in zip(kv_lens, npages)], np.int32)
    keys = [pool[0][ix[ip[r]:ip[r + 1]]].reshape(-1, HKV, D)[:s] for r, s in enumerate(kv_lens)]
    vals = [pool[1][ix[ip[r]:ip[r + 1]]].reshape(-1, HKV, D)[:s] for r, s in enumerate(kv_lens)]
    q = rng.standard_normal((len(kv_lens), H, D)).astype(np.float32)
    ref, _ = attention(q, keys, vals, [1] * len(kv_lens), causal=True)
    return (torch.from_numpy(ip).to(dev), torch.from_numpy(ix).to(dev),
            torch.from_numpy(last).to(dev), q, ref)


def test_cuda_sglang_graph_decode_pattern():
    """SGLang's decode under CUDA graphs on the GPU: plan, warm up and capture
    run() on a side stream, then per step fast_decode_plan (installed as
    w.plan) on the main stream with new context lengths and pages, q copied
    into the captured input, replay; every replay equals the reference. A
    plan beyond the reservation after the capture is refused and the last
    plan still replays right."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda")
    rng = np.random.default_rng(6)
    bs, nidx, nblocks = 4, 4 * 64, 400
    dt = torch.bfloat16
    kc = rng.standard_normal((nblocks, PAGE, HKV, D)).astype(np.float32)
    vc = rng.standard_normal((nblocks, PAGE, HKV, D)).astype(np.float32)
    # the reference reads the values the bf16 cache holds
    kc = torch.from_numpy(kc).to(dt).float().numpy()
    vc = torch.from_numpy(vc).to(dt).float().numpy()
    kv = (torch.from_numpy(kc).to(dev, dt), torch.from_numpy(vc).to(dev, dt))
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(nidx, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.zeros(bs, dtype=torch.int32, device=dev))
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)
    w.plan = functools.partial(fi.decode.fast_decode_plan, w)
    pool = (kc, vc)

    def plan(ip, ix, last):
        w.plan(ip, ix, last, H, HKV, D, PAGE, data_type=dt)

    ip, ix, last, q, ref = _torch_case(torch, rng, [5, 17, 33, 2], pool, dev)
    plan(ip, ix, last)
    q_static = torch.from_numpy(q).to(dev, dt)
    for _ in range(2):  # warm-up on the main stream: the capture then moves the context
        w.run(q_static, kv)  # onto the side stream while it captures (a deferred drain)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out = w.run(q_static, kv)
    g.replay()
    torch.cuda.synchronize()
    tol = dict(rtol=2e-2, atol=2e-2)
    q_ref = q_static.float().cpu().numpy()
    ref0, _ = attention(q_ref, *_kv_of(ip, ix, last, pool), [1] * bs, causal=True)
    np.testing.assert_allclose(out.float().cpu().numpy(), ref0, **tol)
    for step, lens in enumerate([[9, 40, 100, 3], [200, 1, 64, 130], [500, 300, 8, 2],
                                 [512, 511, 510, 509], [1, 1, 1, 1]]):
        ip, ix, last, q, ref = _torch_case(torch, rng, lens, pool, dev)
        plan(ip, ix, last)
        q_static.copy_(torch.from_numpy(q).to(dev, dt))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        q_ref = q_static.float().cpu().numpy()
        ref, _ = attention(q_ref, *_kv_of(ip, ix, last, pool), [1] * bs, causal=True)
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, err_msg="step %d" % step,
                                   **tol)
    # 4 requests x 100 pages = 400 table entries > the reservation (max(256, 2 x 4 x 5))
    ip2, ix2, last2, *_ = _torch_case(torch, rng, [800, 8, 8, 8], pool, dev)
    with pytest.raises(kvattn.InvalidArgumentError, match="freed memory"):
        plan(ip2, ix2, last2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.float().cpu().numpy(), ref, **tol)


def _kv_of(ip, ix, last, pool):
    ip, ix, last = ip.cpu().numpy(), ix.cpu().numpy(), last.cpu().numpy()
    keys, vals = [], []
    for r in range(len(last)):
        s = (ip[r + 1] - ip[r] - 1) * PAGE + last[r]
        keys.append(pool[0][ix[ip[r]:ip[r + 1]]].reshape(-1, HKV, D)[:s])
        vals.append(pool[1][ix[ip[r]:ip[r + 1]]].reshape(-1, HKV, D)[:s])
    return keys, vals


def test_mla_graph_mode(monkeypatch):
    """The MLA wrapper: a graph-mode plan with another batch size is refused
    and the previous plan stands; run() under (stubbed) capture is refused
    outside graph mode, writing nothing; in graph mode it runs, and a later
    plan whose page table exceeds the reservation is refused."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    kv = rng.standard_normal((40, 8, 80)).astype(np.float16)
    qn = torch.from_numpy(rng.standard_normal((2, 4, 64)).astype(np.float16))
    qp = torch.from_numpy(rng.standard_normal((2, 4, 16)).astype(np.float16))
    ckv, kpe = torch.from_numpy(kv[..., :64]), torch.from_numpy(kv[..., 64:])
    ws = torch.empty(8, dtype=torch.uint8)
    args = (4, 64, 16, 8, False, 0.1, "float16", "float16")

    def plan(m, lens, pages):
        ip = np.concatenate([[0], np.cumsum([-(-s // 8) for s in lens])]).astype(np.int32)
        m.plan(np.arange(len(lens) + 1, dtype=np.int32), ip, pages[: ip[-1]],
               np.array(lens, np.int32), *args)

    pages = rng.permutation(40).astype(np.int32)
    g = fi.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True,
                                         qo_indptr=np.zeros(3, np.int32),
                                         kv_indptr=np.zeros(3, np.int32),
                                         kv_indices=np.zeros(8, np.int32),
                                         kv_len_arr=np.zeros(2, np.int32))
    plan(g, [5, 12], pages)
    ref = g.run(qn, qp, ckv, kpe).numpy()
    with pytest.raises(kvattn.InvalidArgumentError, match="batch size 3"):
        plan(g, [5, 12, 3], pages)
    np.testing.assert_array_equal(g.run(qn, qp, ckv, kpe).numpy(), ref)
    m = fi.BatchMLAPagedAttentionWrapper(ws)
    plan(m, [5, 12], pages)
    monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
    out = torch.from_numpy(poisoned((2, 4, 64), np.float16))
    with pytest.raises(kvattn.UnsupportedError, match="use_cuda_graph"):
        m.run(qn, qp, ckv, kpe, out=out)
    assert untouched(out.numpy())
    g.run(qn, qp, ckv, kpe, out=out)
    np.testing.assert_array_equal(out.numpy(), ref)
    # 8 pages, but a table of 2 requests x 7 pages = 14 > the reservation max(8, 2 x 2 x 2)
    with pytest.raises(kvattn.InvalidArgumentError, match="freed memory"):
        plan(g, [56, 1], pages)
    monkeypatch.undo()
    np.testing.assert_array_equal(g.run(qn, qp, ckv, kpe).numpy(), ref)


def test_cuda_mla_graph_decode_pattern():
    """The MLA wrapper under CUDA graphs on the GPU (SGLang's FlashInfer-MLA
    decode): plan, warm up, capture run() on a side stream, then per step a
    new plan on the main stream and replay; every replay equals the
    reference (MQA over the latent rows, D 576, values the first 512)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev, dt = torch.device("cuda"), torch.bfloat16
    rng = np.random.default_rng(8)
    bs, h, dc, dr, page, nblocks = 3, 16, 512, 64, 16, 200
    lat = torch.from_numpy(rng.standard_normal((nblocks, page, dc + dr)).astype(np.float32))
    lat = lat.to(dt)
    lat_ref = lat.float().numpy()
    kv = lat.to(dev)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    g = fi.BatchMLAPagedAttentionWrapper(
        ws, use_cuda_graph=True, qo_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
        kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
        kv_indices=torch.zeros(nblocks, dtype=torch.int32, device=dev),
        kv_len_arr=torch.zeros(bs, dtype=torch.int32, device=dev))
    scale = 1 / math.sqrt(192)
    qn = torch.zeros((bs, h, dc), dtype=dt, device=dev)
    qp = torch.zeros((bs, h, dr), dtype=dt, device=dev)

    def step(lens):
        npg = [-(-s // page) for s in lens]
        ix = rng.permutation(nblocks)[: sum(npg)].astype(np.int32)
        ip = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
        g.plan(torch.arange(bs + 1, dtype=torch.int32, device=dev),
               torch.from_numpy(ip).to(dev), torch.from_numpy(ix).to(dev),
               torch.tensor(lens, dtype=torch.int32, device=dev), h, dc, dr, page, False,
               scale, dt, dt)
        qn.copy_(torch.from_numpy(rng.standard_normal((bs, h, dc)).astype(np.float32)))
        qp.copy_(torch.from_numpy(rng.standard_normal((bs, h, dr)).astype(np.float32)))
        rows = [lat_ref[ix[ip[r]:ip[r + 1]]].reshape(-1, 1, dc + dr)[:s]
                for r, s in enumerate(lens)]
        q = torch.cat([qn, qp], -1).float().cpu().numpy()
        ref, _ = attention(q, rows, [x[..., :dc] for x in rows], [1] * bs, causal=True,
                           scale=scale)
        return ref

    ref = step([7, 100, 33])
    for _ in range(2):
        g.run(qn, qp, kv[..., :dc], kv[..., dc:])
    torch.cuda.synchronize()
    side, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = g.run(qn, qp, kv[..., :dc], kv[..., dc:])
    for lens in ([7, 100, 33], [300, 1, 900], [1000, 999, 16]):
        ref = step(lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, rtol=2e-2, atol=2e-2,
                                   err_msg=str(lens))


def _prefill_graph(n_indices, bs=3):
    return fi.BatchPrefillWithPagedKVCacheWrapper(
        None, "NHD", use_cuda_graph=True, qo_indptr_buf=np.zeros(bs + 1, np.int32),
        paged_kv_indptr_buf=np.zeros(bs + 1, np.int32),
        paged_kv_indices_buf=np.zeros(n_indices, np.int32),
        paged_kv_last_page_len_buf=np.zeros(bs, np.int32))


def test_prefill_graph_reserves_prefill_tiles(monkeypatch):
    """The prefill wrapper's reservation asks for more query rows than
    requests even when its first plan has one row per request:
    kva_cuda_context_reserve reserves the prefill kernel's tiles only for
    T > R, and without them a later plan of the same rows with a request of
    several rows (the others empty) grows the buffers under the graph, whose
    capture left the prefill kernel out. (Context.reserve is recorded here:
    on the CPU it has nothing to do.)"""
    paged, indptr, indices, last, keys, values, q = _case(9, (30, 50, 9))
    w = _prefill_graph(len(indices))
    got = []
    monkeypatch.setattr(w._ctx, "reserve", lambda *cap: got.append(cap))
    w.plan(np.arange(4, dtype=np.int32), indptr, indices, last, H, HKV, D, PAGE, causal=True,
           q_data_type="float32")
    assert len(got) == 1
    r, t = got[0][:2]
    assert r == 3 and t > r, got


def test_graph_plan_semantics_fixed_after_capture(monkeypatch):
    """After a (stubbed) capture, a plan the captured kernels would run with
    other masks is refused and the previous plan stands: the prefill
    wrapper's first plan (one row per request, one of them empty) is made
    without the causal mask (_causal_for), so a later causal plan with a
    request of two rows is refused; one of single rows is not (causal masks
    nothing there). Before a capture both are accepted. A decode plan with
    another window after a capture is refused too."""
    torch = pytest.importorskip("torch")
    paged, indptr, indices, last, keys, values, q = _case(10, (0, 50, 9), spare=8)
    tkv = tuple(torch.from_numpy(x) for x in paged)
    _, ip2, ix2, l2, k2, v2, _ = _case(11, (30, 50, 9))
    ix2 = ix2 % paged[0].shape[0]
    two = np.array([0, 2, 3, 3], np.int32)  # rows 3: request 0 has two, request 2 none
    for captured in (False, True):
        w = _prefill_graph(len(indices) + 8)
        w.plan(np.arange(4, dtype=np.int32), indptr, indices, last, H, HKV, D, PAGE,
               causal=True, q_data_type="float32")
        if captured:
            monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
            w.run(torch.from_numpy(q), tkv)
            monkeypatch.undo()
            with pytest.raises(kvattn.InvalidArgumentError, match="causal"):
                w.plan(two, ip2, ix2, l2, H, HKV, D, PAGE, causal=True, q_data_type="float32")
            ref, _ = attention(q, keys, values, [1, 1, 1], causal=False)
            np.testing.assert_allclose(w.run(torch.from_numpy(q), tkv).numpy(), ref,
                                       rtol=1e-5, atol=1e-5)
        else:
            w.plan(two, ip2, ix2, l2, H, HKV, D, PAGE, causal=True, q_data_type="float32")
        # single rows, every request with keys: planned causal, masks nothing
        w.plan(np.arange(4, dtype=np.int32), ip2, ix2, l2, H, HKV, D, PAGE, causal=True,
               q_data_type="float32")

    paged, indptr, indices, last, keys, values, q = _case(12, (30, 50, 9))
    tkv = tuple(torch.from_numpy(x) for x in paged)
    d = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True,
                                              **_bufs(3, len(indices)))
    _plan(d, indptr, indices, last)
    monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
    d.run(torch.from_numpy(q), tkv)
    monkeypatch.undo()
    with pytest.raises(kvattn.InvalidArgumentError, match="window_left"):
        _plan(d, indptr, indices, last, window_left=7)
    ref, _ = attention(q, keys, values, [1, 1, 1], causal=True)
    np.testing.assert_allclose(d.run(torch.from_numpy(q), tkv).numpy(), ref, rtol=1e-5,
                               atol=1e-5)
    _plan(d, indptr, indices, last, sm_scale=0.5)  # the scale is a kernel argument only


def test_alibi_lse_under_capture_is_refused(monkeypatch):
    """ALiBi with an LSE under (stubbed) capture is refused and writes
    nothing (FlashInfer's LSE shift is per plan: a graph would keep the
    captured plan's); without an LSE it runs."""
    torch = pytest.importorskip("torch")
    paged, indptr, indices, last, keys, values, q = _case(13, (30, 50, 9))
    tkv = tuple(torch.from_numpy(x) for x in paged)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_cuda_graph=True,
                                              **_bufs(3, len(indices)))
    _plan(w, indptr, indices, last, pos_encoding_mode="ALIBI")
    want = w.run(torch.from_numpy(q), tkv).numpy()
    monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
    out = torch.from_numpy(poisoned((3, H, D)))
    lse = torch.from_numpy(poisoned((3, H)))
    with pytest.raises(kvattn.UnsupportedError, match="ALiBi"):
        w.run(torch.from_numpy(q), tkv, out=out, lse=lse)
    assert untouched(out.numpy()) and untouched(lse.numpy())
    w.run(torch.from_numpy(q), tkv, out=out)
    np.testing.assert_array_equal(out.numpy(), want)


def _mla_graph(bs, n_indices):
    return fi.BatchMLAPagedAttentionWrapper(
        None, use_cuda_graph=True, qo_indptr=np.zeros(bs + 1, np.int32),
        kv_indptr=np.zeros(bs + 1, np.int32), kv_indices=np.zeros(n_indices, np.int32),
        kv_len_arr=np.zeros(bs, np.int32))


def test_mla_graph_kernel_rows_fixed_after_capture(monkeypatch):
    """The MLA wrapper: the CUDA kernel's rows per item follow H x the
    plan's longest q_len (16 / 32 / 64) and a captured run keeps them, so
    after a (stubbed) capture over q_len-1 plans at H 16 a plan with a
    request of two rows (32 rows per item) is refused and the previous plan
    stands; before a capture it is accepted. A layer-level plan
    (qk_nope_head_dim) is refused under capture, its rounds and workspace
    being the plan's own."""
    torch = pytest.importorskip("torch")
    h, dc, dr, page = 16, 32, 16, 8
    rng = np.random.default_rng(14)
    kv = rng.standard_normal((12, page, dc + dr)).astype(np.float16)
    ckv, kpe = torch.from_numpy(kv[..., :dc]), torch.from_numpy(kv[..., dc:])
    pages = rng.permutation(12).astype(np.int32)
    q1 = torch.from_numpy(rng.standard_normal((2, h, dc + dr)).astype(np.float16))

    def plan(m, qo, lens, **kw):
        ip = np.concatenate([[0], np.cumsum([-(-s // page) for s in lens])]).astype(np.int32)
        m.plan(np.array(qo, np.int32), ip, pages[: ip[-1]], np.array(lens, np.int32), h, dc,
               dr, page, False, 0.1, "float16", "float16", **kw)

    for captured in (False, True):
        g = _mla_graph(2, 12)
        plan(g, [0, 1, 2], [20, 9])
        want = g.run(query=q1, kv_cache=torch.from_numpy(kv)).numpy()
        if captured:
            monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
            g.run(query=q1, kv_cache=torch.from_numpy(kv))
            monkeypatch.undo()
            with pytest.raises(kvattn.InvalidArgumentError, match="mla_rows"):
                plan(g, [0, 2, 2], [20, 9])
            np.testing.assert_array_equal(
                g.run(query=q1, kv_cache=torch.from_numpy(kv)).numpy(), want)
        else:
            plan(g, [0, 2, 2], [20, 9])
        plan(g, [0, 1, 2], [30, 2])  # q_len 1 again: 16 rows per item

    g = _mla_graph(2, 12)
    plan(g, [0, 1, 2], [20, 9], qk_nope_head_dim=16, v_head_dim=16)
    w_uk = torch.from_numpy(rng.standard_normal((h, 16, dc)).astype(np.float16))
    w_uv = torch.from_numpy(rng.standard_normal((h, dc, 16)).astype(np.float16))
    ql = torch.from_numpy(rng.standard_normal((2, h, 16 + dr)).astype(np.float16))
    g.run_layer(ql, w_uk, w_uv, ckv, kpe)  # eager: runs
    monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
    out = torch.from_numpy(poisoned((2, h, 16), np.float16))
    with pytest.raises(kvattn.UnsupportedError, match="layer-level"):
        g.run_layer(ql, w_uk, w_uv, ckv, kpe, out=out)
    assert untouched(out.numpy())


def test_merges_run_on_the_current_stream(monkeypatch):
    """FlashInfer's merge functions (the cascade wrapper's merge among them)
    put their context on torch's current stream, as the wrappers' runs do,
    so that a merge issued on a side stream, or captured into a graph, runs
    there (recorded here: on the CPU there is no stream)."""
    torch = pytest.importorskip("torch")
    seen = []
    real = _fi_graph.on_current_stream
    monkeypatch.setattr(_fi_graph, "on_current_stream", lambda ctx: (seen.append(ctx), real(ctx)))
    rng = np.random.default_rng(15)
    va, vb = (torch.from_numpy(rng.standard_normal((3, H, D)).astype(np.float32))
              for _ in range(2))
    sa, sb = (torch.from_numpy(rng.standard_normal((3, H)).astype(np.float32))
              for _ in range(2))
    fi.merge_state(va, sa, vb, sb)
    fi.merge_state_in_place(va.clone(), sa.clone(), vb, sb)
    fi.merge_states(torch.stack([va, vb], 1), torch.stack([sa, sb], 1))
    assert len(seen) == 3 and all(c is kvattn.default_context("cpu") for c in seen), seen


def _cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def test_cuda_prefill_graph_replays_prefill_rows():
    """The prefill wrapper on the GPU: the first plan (captured) has one row
    per request (T = R = 16), a later plan the same 16 rows in one request
    of 16 rows (G 4: 64 rows, a prefill tile) and 15 empty ones. The
    reservation's T > R gave the context prefill-tile capacity before the
    capture, so the captured run launches the prefill kernel and the replay
    computes the new plan (main reserved T = R: no tiles, the plan grew the
    buffers under the graph, and the replay left the prefill rows
    unwritten). The indices buffer holds bs x 20 pages, as SGLang and vLLM
    size theirs (max batch x a request's most pages), so that the 19-page
    request of the second plan fits the dense page table graph mode reserves
    (docs/python.md: up to indices buffer / batch size pages per request)."""
    torch = _cuda_or_skip()
    dev, dt = torch.device("cuda"), torch.bfloat16
    bs, h, hkv, d, page, nblocks = 16, 16, 4, 128, 16, 64
    rng = np.random.default_rng(16)
    kc = torch.from_numpy(rng.standard_normal((nblocks, page, hkv, d)).astype(np.float32)).to(dt)
    vc = torch.from_numpy(rng.standard_normal((nblocks, page, hkv, d)).astype(np.float32)).to(dt)
    pool = (kc.float().numpy(), vc.float().numpy())
    kv = (kc.to(dev), vc.to(dev))
    i32 = dict(dtype=torch.int32, device=dev)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(bs + 1, **i32), paged_kv_indptr_buf=torch.zeros(bs + 1, **i32),
        paged_kv_indices_buf=torch.zeros(bs * 20, **i32),
        paged_kv_last_page_len_buf=torch.zeros(bs, **i32))
    q_static = torch.zeros((bs, h, d), dtype=dt, device=dev)

    def step(q_lens, kv_lens):
        npg = [max(1, -(-s // page)) for s in kv_lens]
        ix = rng.permutation(nblocks)[: sum(npg)].astype(np.int32)
        ip = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
        last = np.array([s - (n - 1) * page for s, n in zip(kv_lens, npg)], np.int32)
        qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        w.plan(torch.from_numpy(qo).to(dev), torch.from_numpy(ip).to(dev),
               torch.from_numpy(ix).to(dev), torch.from_numpy(last).to(dev), h, hkv, d, page,
               causal=True, q_data_type=dt)
        q_static.copy_(torch.from_numpy(rng.standard_normal((bs, h, d)).astype(np.float32)))
        keys = [pool[0][ix[ip[r]:ip[r + 1]]].reshape(-1, hkv, d)[:s] for r, s in enumerate(kv_lens)]
        vals = [pool[1][ix[ip[r]:ip[r + 1]]].reshape(-1, hkv, d)[:s] for r, s in enumerate(kv_lens)]
        ref, _ = attention(q_static.float().cpu().numpy(), keys, vals, q_lens, causal=True)
        return ref

    ref = step([1] * bs, [20 + 3 * r for r in range(bs)])
    for _ in range(2):
        w.run(q_static, kv)
    torch.cuda.synchronize()
    side, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = w.run(q_static, kv)
    for q_lens, kv_lens in (([1] * bs, [40] * bs), ([bs] + [0] * (bs - 1), [300] + [5] * (bs - 1)),
                            ([1] * bs, [7 + r for r in range(bs)])):
        ref = step(q_lens, kv_lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, rtol=2e-2, atol=2e-2,
                                   err_msg=str(q_lens))


def test_cuda_cascade_graph_merges_in_the_graph():
    """The cascade wrapper in graph mode on the GPU (per-level buffers): run()
    captured on a side stream, then a new plan and a replay; the levels'
    merge (merge_state_in_place) must be part of the graph, i.e. run on the
    capturing stream (main's ran it on the default context's legacy stream:
    outside the graph, the replay returned the last level alone)."""
    torch = _cuda_or_skip()
    from test_fi_api import _cascade_case

    dev, dt = torch.device("cuda"), torch.float16
    rng = np.random.default_rng(17)
    paged, lv, keys, values = _cascade_case(rng, "NHD", False, np.float16, 64)
    kv = tuple(torch.from_numpy(x).to(dev) for x in paged)
    i32 = dict(dtype=torch.int32, device=dev)
    w = fi.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(1 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        qo_indptr_buf_arr=[torch.zeros(2, **i32), torch.zeros(4, **i32)],
        paged_kv_indptr_buf_arr=[torch.zeros(2, **i32), torch.zeros(4, **i32)],
        paged_kv_indices_buf_arr=[torch.zeros(8, **i32), torch.zeros(16, **i32)],
        paged_kv_last_page_len_buf_arr=[torch.zeros(1, **i32), torch.zeros(3, **i32)])

    def plan():
        w.plan([torch.from_numpy(x).to(dev) for x in lv["qo"]],
               [torch.from_numpy(x).to(dev) for x in lv["indptr"]],
               [torch.from_numpy(x).to(dev) for x in lv["indices"]],
               [torch.from_numpy(x).to(dev) for x in lv["last"]], 4, 2, 64, 4, causal=True,
               q_data_type=dt)

    plan()
    q_static = torch.from_numpy(rng.standard_normal((3, 4, 64)).astype(np.float16)).to(dev)
    for _ in range(2):
        w.run(q_static, kv)
    torch.cuda.synchronize()
    side, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = w.run(q_static, kv)
    for _ in range(2):
        plan()
        q_static.copy_(torch.from_numpy(rng.standard_normal((3, 4, 64)).astype(np.float16)))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = attention(q_static.float().cpu().numpy(), keys, values, [1, 1, 1], causal=True)
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, rtol=1e-2, atol=1e-2)


def test_ragged_run_under_capture_is_refused(monkeypatch):
    """The ragged wrapper has no graph mode: its run() under capture (stubbed)
    raises UnsupportedError and writes nothing, with or without
    use_cuda_graph (a later plan() could grow the buffers a graph reads);
    outside capture it runs as before."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(46)
    qo = np.array([0, 4, 9], np.int32)
    kv = np.array([0, 6, 11], np.int32)
    q = torch.from_numpy(rng.standard_normal((9, H, D)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((11, HKV, D)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((11, HKV, D)).astype(np.float32))
    ws = torch.empty(8, dtype=torch.uint8)
    for kw in ({}, dict(use_cuda_graph=True, qo_indptr_buf=torch.zeros(3, dtype=torch.int32),
                        kv_indptr_buf=torch.zeros(3, dtype=torch.int32))):
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", **kw)
        w.plan(qo, kv, H, HKV, D, causal=True, q_data_type="float32")
        out = torch.from_numpy(poisoned((9, H, D)))
        lse = torch.from_numpy(poisoned((9, H)))
        monkeypatch.setattr(_fi_graph, "capturing", lambda ctx, q: True)
        with pytest.raises(kvattn.UnsupportedError, match="no CUDA-graph mode"):
            w.run(q, k, v, out=out, lse=lse)
        assert untouched(out.numpy()) and untouched(lse.numpy())
        monkeypatch.undo()
        w.run(q, k, v, out=out)
        ref, _ = attention(q.numpy(), [k.numpy()[:6], k.numpy()[6:]],
                           [v.numpy()[:6], v.numpy()[6:]], [4, 5], causal=True)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
