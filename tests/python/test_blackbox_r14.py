"""Black-box round fourteen (session 43, api54) of the Python package and,
through it, the C library's CPU backends. Each case is written from a
promise (kvattn.h, kvattn_cache.h, the FlashInfer wrappers' docstrings and
FlashInfer 0.7.2's documented behaviour), checked against the float64 oracle
of reference.py or the reference backend, with outputs poisoned.

Defects (each test fails on the code before its fix):
- BatchMLAPagedAttentionWrapper kept its latent-cache views keyed by (address,
  pages, page size, dtype), not by the row's split (Dc, Dr): pages of other
  dimensions at an address an earlier cache used (a freed buffer reused; the
  trtllm MLA function's kept wrapper sees every caller's) were refused with
  ShapeMismatchError "cache ... does not match the plan".
- An out / lse with a stride of 0 over a dimension of size > 1 (torch's
  expand(), numpy's writable as_strided) is staged like a strided output:
  torch then raised RuntimeError after the run, numpy silently kept one row
  for all. Now InvalidArgumentError before the run, nothing written.
- Host arrays (Plan's alibi_slopes, batch metadata) given as torch bf16 / fp8
  tensors or with torch's negative bit raised torch's TypeError /
  RuntimeError (its numpy() has no such dtype / refuses the bit); now read by
  value, as numpy arrays of any dtype are.
- One context from several threads: the FlashInfer wrappers made without a
  workspace all share the default CPU context (C: one thread at a time), and
  ran wrong from two threads, silently; plans of one shape shared their
  context's descriptor template, whose batch fields two threads overwrote.
  Now every call through a context holds its lock, and each plan copies the
  template. The trtllm functions' kept wrapper (one per device) was planned
  by one thread and run by another; it is now held from plan to run.
Regression cases (pass on main since api53): every wrapper kind left over a
closed default context (cascade, CPU graph mode, fast_decode_plan, the trtllm
functions) replans on the new one; the MLA wrapper's CSR page count is int64.
Coverage: odd head counts (3, 9, 63) and head sizes (8 .. 576), page sizes 1
and 256, NHD / HND, q_len 0 and kv_len 0 requests, window edges, chunks,
trees and FlashInfer tree masks, every cache format (CPU vs reference, at each
ISA level), run-time window / scales / LSE forms, refused outputs, plan reuse
after cache appends, and plans shared across contexts."""

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from kvattn.flashinfer import decode as fi_decode
from kvattn.flashinfer import mla as fi_mla
from poison import poisoned, untouched
from reference import ancestors, attention
from test_flashinfer import random_paged

LOG2E = 1.0 / np.log(2.0)
TOL = {np.float32: 3e-5, np.float16: 4e-3}


def _close(a, want, dt, lse=None, want_lse=None):
    t = TOL[dt]
    np.testing.assert_allclose(np.asarray(a, np.float64), want, rtol=t, atol=t)
    if lse is not None:
        w2 = want_lse * LOG2E
        fin = np.isfinite(w2)
        assert (np.isfinite(lse) == fin).all() and (np.isneginf(lse) == np.isneginf(w2)).all()
        np.testing.assert_allclose(lse[fin], w2[fin], rtol=1e-3, atol=2e-3)


# ------------------------------------------------ defect: MLA cache views by dims

def _mla_rows(kv, ix, ip, kl, dc):
    keys = [kv[ix[ip[r]:ip[r + 1]]].reshape(-1, kv.shape[-1])[:kl[r], None, :]
            for r in range(len(kl))]
    return keys, [k[..., :dc] for k in keys]


@pytest.mark.parametrize("order", [[(64, 16), (48, 32), (56, 16)], [(56, 16), (64, 16)]])
def test_mla_wrapper_pages_of_other_dims_at_one_address(order):
    """One buffer seen as [NP, B, Dc + Dr] pages of several (Dc, Dr) splits
    (as a freed cache's memory is reused for another model's): each plan()
    and run() over it gives that split's attention, whatever ran before."""
    rng = np.random.default_rng(140)
    np_, b, h = 3, 4, 4
    buf = rng.standard_normal(np_ * b * 80).astype(np.float32)
    ip, ix, kl = np.array([0, 1, 3]), np.array([2, 0, 1]), np.array([3, 6])
    w = fi.BatchMLAPagedAttentionWrapper(None)
    for dc, dr in order:
        kv = buf[: np_ * b * (dc + dr)].reshape(np_, b, dc + dr)
        q = rng.standard_normal((2, h, dc + dr)).astype(np.float32)
        w.plan(np.array([0, 1, 2]), ip, ix, kl, h, dc, dr, b, False, 0.1, "float32", "float32")
        out = poisoned((2, h, dc))
        w.run(query=q, kv_cache=kv, out=out)
        keys, vals = _mla_rows(kv, ix, ip, kl, dc)
        want, _ = attention(q, keys, vals, [1, 1], causal=False, scale=0.1)
        _close(out, want, np.float32)


def test_trtllm_mla_pages_of_other_dims_at_one_address():
    """The trtllm MLA function keeps one wrapper per device: a call over
    pages of another (kv_lora_rank, qk_rope_head_dim) at the address of an
    earlier call's runs with its own dims."""
    rng = np.random.default_rng(141)
    buf = rng.standard_normal(3 * 4 * 80).astype(np.float32)
    bt, sl = np.array([[2, 0]], np.int32), np.array([6])
    for dc, dr in ((64, 16), (48, 32)):
        kv = buf.reshape(3, 4, 80)
        qm = rng.standard_normal((1, 1, 4, dc + dr)).astype(np.float32)
        out = poisoned((1, 1, 4, dc))
        fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, dc, dr, bt, sl, 8,
                                                     out=out, bmm1_scale=0.1)
        rows = kv[[2, 0]].reshape(-1, 80)[:6, None, :]
        want, _ = attention(qm[:, 0], [rows], [rows[..., :dc]], [1], causal=False, scale=0.1)
        _close(out[:, 0], want, np.float32)


# ------------------------------------------------ defect: self-overlapping outputs

def _prefill(rng, dt=np.float32):
    paged, ip, ix, lp, keys, values = random_paged(rng, [5, 9], 4, 3, 24, "NHD", dt, False)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(np.array([0, 2, 5], np.int32), ip, ix, lp, 9, 3, 24, 4, causal=True, q_data_type=dt)
    q = rng.standard_normal((5, 9, 24)).astype(dt)
    return w, q, paged, keys, values


def test_expanded_out_refused_numpy():
    """A writable numpy out whose rows share one address (stride 0) is
    refused before the run; the memory keeps the poison (it used to hold
    the last row's result, every other row lost)."""
    w, q, paged, _, _ = _prefill(np.random.default_rng(142))
    base = poisoned((1, 9, 24))
    out = np.lib.stride_tricks.as_strided(base, (5, 9, 24), (0, 96, 4), writeable=True)
    with pytest.raises(kvattn.InvalidArgumentError, match="stride 0"):
        w.run(q, paged, out=out)
    assert untouched(base)
    lbase = poisoned((1, 9))
    lse = np.lib.stride_tricks.as_strided(lbase, (5, 9), (0, 4), writeable=True)
    with pytest.raises(kvattn.InvalidArgumentError, match="stride 0"):
        w.run(q, paged, lse=lse, return_lse=True)
    assert untouched(lbase)


def test_expanded_out_refused_torch():
    """torch's expand() of an out / lse is refused with kvattn's
    InvalidArgumentError before the run (it was torch's RuntimeError after
    it); the tensors keep the poison, and the trtllm function refuses it too."""
    torch = pytest.importorskip("torch")
    from poison import torch_poisoned, torch_untouched

    w, q, paged, _, _ = _prefill(np.random.default_rng(143))
    tq, tp = torch.from_numpy(q), tuple(torch.from_numpy(x) for x in paged)
    out = torch_poisoned((1, 9, 24), torch.float32).expand(5, 9, 24)
    with pytest.raises(kvattn.InvalidArgumentError, match="stride 0"):
        w.run(tq, tp, out=out)
    assert torch_untouched(out)
    lse = torch_poisoned((1, 9), torch.float32).expand(5, 9)
    with pytest.raises(kvattn.InvalidArgumentError, match="stride 0"):
        w.run(tq, tp, lse=lse)
    assert torch_untouched(lse)
    k = torch.randn(3, 1, 4, 8)
    qd = torch.randn(2, 2, 8)
    out = torch_poisoned((1, 2, 8), torch.float32).expand(2, 2, 8)
    with pytest.raises(kvattn.InvalidArgumentError, match="stride 0"):
        fi_decode.trtllm_batch_decode_with_kv_cache(qd, (k, k.clone()), None,
                                                    np.array([[0, 1], [2, 0]], np.int32),
                                                    np.array([5, 3]), 8, out=out)
    assert torch_untouched(out)


# ------------------------------------------------ defect: torch host arrays numpy lacks

def test_host_arrays_from_torch_bf16_fp8_and_neg_bit():
    """Host arrays (Plan's alibi_slopes and batch metadata) given as torch
    bf16 / fp8 tensors, or with torch's negative bit, are read by value as
    numpy arrays of any dtype are (torch's numpy() raised TypeError /
    RuntimeError for them): the plans equal the float32 / int32 ones, and
    fractional values for integer metadata are still refused."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8_e4m3fn")
    rng = np.random.default_rng(147)
    ctx = kvattn.Context("cpu", 1)
    cache = kvattn.Cache(ctx, 3, 4, 1, 8, dtype="f32")
    cache.write(rng.standard_normal((7, 1, 8)).astype(np.float32),
                rng.standard_normal((7, 1, 8)).astype(np.float32), np.arange(7) + 4)
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    kw = dict(block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32")
    bt = [[1, 2]]

    def run(qsl=(0, 2), slopes=None):
        return kvattn.Plan(ctx, qsl, [7], bt, alibi_slopes=slopes, **kw).run(q, cache)
    want = run(slopes=np.array([0.5, 0.25], np.float32))
    lazy = torch.tensor([-0.5j, -0.25j]).conj().imag  # holds -0.5, -0.25 with the neg bit
    assert lazy.is_neg()
    for slopes in (torch.tensor([0.5, 0.25], dtype=torch.bfloat16),
                   torch.tensor([0.5, 0.25]).to(torch.float8_e4m3fn), lazy):
        np.testing.assert_array_equal(run(slopes=slopes), want)
    plain = run()
    np.testing.assert_array_equal(run(qsl=torch.tensor([0, 2], dtype=torch.bfloat16)), plain)
    np.testing.assert_array_equal(run(qsl=torch.tensor([0, 2]).to(torch.float8_e4m3fn)), plain)
    with pytest.raises(kvattn.InvalidArgumentError, match="query_start_loc"):
        run(qsl=torch.tensor([0, 1.5], dtype=torch.bfloat16))


# ------------------------------------------------ defect: one context from several threads

def _two_threads(loop):
    """Runs loop(0) and loop(1) in two daemon threads; fails if either is
    still running after 120 s (the unlocked code could hang in a run over a
    plan made from the other thread's batch)."""
    import sys
    import threading

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # frequent thread switches between Python steps too
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(th.is_alive() for th in threads), "a thread hangs"

def test_wrappers_on_the_default_context_from_two_threads():
    """Two FlashInfer wrappers made without a workspace share the default
    CPU context, which C allows one thread at a time: run from two threads
    (a caller cannot know they share it), every result equals the wrapper's
    own single-threaded one (they raced on the context's workspace: about a
    third of the runs were wrong, silently)."""
    rng = np.random.default_rng(148)
    jobs = []
    for t in range(2):
        paged, ip, ix, lp, _, _ = random_paged(rng, [3000 + 500 * t, 2000, 4000], 16, 2, 64,
                                               "NHD", np.float32, False)
        w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
        w.plan(ip, ix, lp, 8, 2, 64, 16, q_data_type="float32")
        q = rng.standard_normal((3, 8, 64)).astype(np.float32)
        jobs.append((w, q, paged, w.run(q, paged)))
    assert jobs[0][0]._ctx is jobs[1][0]._ctx
    bad = [0, 0]

    def loop(i):
        w, q, paged, want = jobs[i]
        for _ in range(150):
            bad[i] += not np.array_equal(w.run(q, paged), want)
    _two_threads(loop)
    assert bad == [0, 0]


def test_plans_of_one_shape_on_one_context_from_two_threads():
    """Plans of one attention shape on one context share its checked
    descriptor template: made (and run) from two threads with different
    batches, each plan is its own batch's (the template's batch fields were
    shared: a plan could be made from the other thread's batch)."""
    rng = np.random.default_rng(149)
    ctx = kvattn.Context("cpu", 2)
    cache = kvattn.Cache(ctx, 80, 16, 2, 32, dtype="f32")
    cache.write(rng.standard_normal((1280, 2, 32)).astype(np.float32),
                rng.standard_normal((1280, 2, 32)).astype(np.float32), np.arange(1280))
    kw = dict(block_size=16, num_heads=4, num_kv_heads=2, head_dim=32, q_dtype="f32")
    batches = [([0, 1, 2], [300, 17], [np.arange(20), np.arange(20, 40)]),
               ([0, 3, 4, 5], [40, 600, 5], [np.arange(40, 43), np.arange(43, 80), [0]])]
    qs = [rng.standard_normal((2, 4, 32)).astype(np.float32),
          rng.standard_normal((5, 4, 32)).astype(np.float32)]

    def table(rows):
        bt = np.zeros((len(rows), 40), np.int32)
        for r, row in enumerate(rows):
            bt[r, :len(row)] = row
        return bt
    wants = [kvattn.Plan(ctx, b[0], b[1], table(b[2]), **kw).run(q, cache)
             for b, q in zip(batches, qs)]
    bad = [0, 0]

    def loop(i):
        qsl, sl, rows = batches[i]
        bt = table(rows)
        for _ in range(150):
            bad[i] += not np.array_equal(kvattn.Plan(ctx, qsl, sl, bt, **kw).run(qs[i], cache),
                                         wants[i])
    _two_threads(loop)
    assert bad == [0, 0]


def test_trtllm_functions_from_two_threads():
    """The trtllm decode and MLA functions keep one wrapper per device, which
    they plan and then run: called from two threads with batches of other
    sizes, each call gets its own batch's result (one thread's run took the
    other's plan: ShapeMismatchError, or a wrong result where shapes agree)."""
    rng = np.random.default_rng(150)
    calls = []
    for t in range(2):
        b = 2 + t
        k = rng.standard_normal((200, 2, 16, 64)).astype(np.float32)
        v = rng.standard_normal((200, 2, 16, 64)).astype(np.float32)
        q = rng.standard_normal((b, 8, 64)).astype(np.float32)
        bt = rng.permutation(200)[: b * 60].reshape(b, 60).astype(np.int32)
        sl = np.full(b, 900 + 50 * t)
        kv = rng.standard_normal((200, 16, 80)).astype(np.float32)
        qm = rng.standard_normal((b, 1, 4, 80)).astype(np.float32)

        def call(q=q, k=k, v=v, bt=bt, sl=sl, kv=kv, qm=qm):
            return (fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, sl, 1000,
                                                                bmm1_scale=0.1),
                    fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt,
                                                                 sl, 1000, bmm1_scale=0.1))
        calls.append((call, call()))
    bad, errors = [0, 0], []

    def loop(i):
        call, want = calls[i]
        try:
            for _ in range(300):
                got = call()
                bad[i] += not all(np.array_equal(a, b) for a, b in zip(got, want))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))
    _two_threads(loop)
    assert not errors and bad == [0, 0], (errors, bad)


# ------------------------------------------------ regression: closed default context

def _close_default():
    old = kvattn.default_context()
    with kvattn.default_context():
        pass
    new = kvattn.default_context()
    assert new is not old and new._h and not old._h
    return new


def test_cascade_and_graph_mode_wrappers_over_a_closed_default_context():
    """The cascade wrapper (its prefill levels), a CPU graph-mode decode
    wrapper and fast_decode_plan on a decode wrapper, all made without a
    workspace: after the default context was closed, run() of the old plan
    is refused (nothing written), a new plan runs bit-equal on the new one."""
    rng = np.random.default_rng(144)
    paged, ip, ix, lp, keys, values = random_paged(rng, [7, 12], 3, 3, 16, "NHD", np.float32,
                                                   False)
    q = rng.standard_normal((2, 9, 16)).astype(np.float32)
    one = np.array([0, 1, 2], np.int32)

    def cascade():
        w = fi.MultiLevelCascadeAttentionWrapper(1, None, "NHD")
        return w, lambda: w.plan([one], [ip], [ix], [lp], 9, 3, 16, 3, q_data_type="float32")

    def graph():
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            None, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=np.zeros(3, np.int32),
            paged_kv_indices_buffer=np.zeros(16, np.int32),
            paged_kv_last_page_len_buffer=np.zeros(2, np.int32))
        return w, lambda: w.plan(ip, ix, lp, 9, 3, 16, 3, q_data_type="float32")

    def fast():
        w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
        return w, lambda: fi_decode.fast_decode_plan(w, ip, ix, lp, 9, 3, 16, 3,
                                                     q_data_type="float32")

    want, _ = attention(q, keys, values, [1, 1], causal=False)
    for make in (cascade, graph, fast):
        w, plan = make()
        plan()
        before = w.run(q, paged)
        _close(before, want, np.float32)
        _close_default()
        if make is not cascade:  # the cascade run() has no out=: its merge allocates
            out = poisoned(q.shape)
            with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
                w.run(q, paged, out=out)
            assert untouched(out)
        else:
            with pytest.raises(kvattn.InvalidArgumentError, match="closed"):
                w.run(q, paged)
        plan()
        np.testing.assert_array_equal(w.run(q, paged), before)


def test_trtllm_functions_over_a_closed_default_context():
    """The trtllm decode and MLA functions (kept wrappers over the default
    context) run bit-equal after the default context was closed."""
    rng = np.random.default_rng(145)
    k = rng.standard_normal((3, 2, 4, 8)).astype(np.float32)
    v = rng.standard_normal((3, 2, 4, 8)).astype(np.float32)
    q = rng.standard_normal((1, 6, 8)).astype(np.float32)
    kv = rng.standard_normal((3, 4, 80)).astype(np.float32)
    qm = rng.standard_normal((1, 1, 3, 80)).astype(np.float32)
    bt, sl = np.array([[2, 0]], np.int32), np.array([7])

    def calls():
        return (fi_decode.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, sl, 8),
                fi_mla.trtllm_batch_decode_with_kv_cache_mla(qm, kv, None, 128, 64, 16, bt, sl,
                                                             8, bmm1_scale=0.1))
    before = calls()
    _close_default()
    for a, b in zip(before, calls()):
        np.testing.assert_array_equal(a, b)


def test_mla_csr_page_slots_past_int32():
    """The MLA wrapper's CSR check kv_len_arr <= pages * page_size is in
    int64: 65,536 pages of 65,536 slots (2**32, 0 in int32) hold a 5-key
    request, which plans and runs (int32 arithmetic refused it)."""
    rng = np.random.default_rng(146)
    b, dc, dr, h = 2 ** 16, 8, 8, 3
    kv = rng.standard_normal((1, b, dc + dr)).astype(np.float32)
    q = rng.standard_normal((1, h, dc + dr)).astype(np.float32)
    w = fi.BatchMLAPagedAttentionWrapper(None)
    w.plan(np.array([0, 1]), np.array([0, 2 ** 16]), np.zeros(2 ** 16, np.int32),
           np.array([5]), h, dc, dr, b, True, 0.2, "float32", "float32")
    out = poisoned((1, h, dc))
    w.run(query=q, kv_cache=kv, out=out)
    rows = kv[0, :5, None, :]
    want, _ = attention(q, [rows], [rows[..., :dc]], [1], causal=True, scale=0.2)
    _close(out, want, np.float32)


# ------------------------------------------------ paged wrappers at odd shapes

PAGED = [  # kind, H, Hkv, D, page, layout, dtype, q_lens, kv_lens, causal, window, cap, scale
    ("prefill", 63, 9, 24, 1, "HND", np.float32, [0, 5, 2], [9, 5, 40], True, -1, None, None),
    ("prefill", 9, 3, 136, 256, "NHD", np.float16, [3, 0, 7], [300, 0, 7], True, 0, None, 0.2),
    ("prefill", 3, 1, 264, 5, "HND", np.float32, [4, 1], [2, 0], False, 1, 5.0, None),
    ("prefill", 63, 63, 8, 2, "NHD", np.float16, [9, 1, 0, 2], [9, 1, 3, 70], True, 7, 5.0,
     None),
    ("prefill", 9, 9, 40, 64, "HND", np.float32, [6, 6], [6, 70], True, 5, None, 0.05),
    ("decode", 63, 21, 40, 256, "HND", np.float32, [1, 1, 1], [0, 257, 1], False, -1, 5.0, None),
    ("decode", 3, 3, 72, 1, "NHD", np.float16, [1, 1], [17, 3], False, 2, None, 0.3),
    ("decode", 9, 1, 520, 7, "NHD", np.float32, [1, 1], [8, 14], False, 0, None, None),
]


@pytest.mark.parametrize("case", range(len(PAGED)))
def test_paged_wrappers_at_odd_shapes(case):
    """Paged prefill / decode wrappers at head counts 3, 9, 63, head sizes 8
    to 520, page sizes 1 to 256 in both layouts, with q_len 0 requests,
    kv_len 0 rows (out 0, LSE -inf), window edges (0, 1, exactly the
    request), soft-cap and sm_scale: out and base-2 LSE vs the oracle."""
    kind, h, hkv, d, ps, layout, dt, ql, kl, causal, wl, cap, sm = PAGED[case]
    rng = np.random.default_rng(150 + case)
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, ps, hkv, d, layout, dt,
                                                   bool(case % 2))
    t = sum(ql)
    q = rng.standard_normal((t, h, d)).astype(dt)
    if kind == "prefill":
        w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
        w.plan(np.concatenate([[0], np.cumsum(ql)]).astype(np.int32), ip, ix, lp, h, hkv, d, ps,
               causal=causal, window_left=wl, logits_soft_cap=cap, sm_scale=sm, q_data_type=dt)
    else:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
        w.plan(ip, ix, lp, h, hkv, d, ps, window_left=wl, logits_soft_cap=cap, sm_scale=sm,
               q_data_type=dt)
    out, lse = poisoned((t, h, d), dt), poisoned((t, h))
    w.run(q, paged, out=out, lse=lse)
    want, wlse = attention(q, keys, values, ql, causal=causal, window_left=wl,
                           softcap=cap or 0.0, scale=sm)
    _close(out, want, dt, lse, wlse)
    again = poisoned((t, h, d), dt)
    w.run(q, paged, out=again)  # plan once, run twice: the same bits
    np.testing.assert_array_equal(again, out)


def test_run_time_window_and_scales():
    """run()'s window_left replaces the plan's for that run (the next run
    without it uses the plan's again); q_scale * k_scale multiply sm_scale
    (LSE included), v_scale the output only."""
    rng = np.random.default_rng(160)
    paged, ip, ix, lp, keys, values = random_paged(rng, [30, 11], 3, 3, 24, "HND", np.float32,
                                                   True)
    q = rng.standard_normal((2, 9, 24)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    w.plan(ip, ix, lp, 9, 3, 24, 3, window_left=-1, sm_scale=0.1, q_data_type="float32")
    o, l = w.run(q, paged, window_left=4, return_lse=True)
    want, wl = attention(q, keys, values, [1, 1], causal=False, window_left=4, scale=0.1)
    _close(o, want, np.float32, l, wl)
    o, l = w.run(q, paged, return_lse=True)
    want, wl = attention(q, keys, values, [1, 1], causal=False, scale=0.1)
    _close(o, want, np.float32, l, wl)
    o, l = w.run(q, paged, q_scale=2.0, k_scale=1.5, v_scale=0.5, return_lse=True)
    want, wl = attention(q, keys, values, [1, 1], causal=False, scale=0.3)
    _close(o, want * 0.5, np.float32, l, wl)


def test_lse_forms_and_given_lse():
    """return_lse's LSE in base 2 (default) or ln, [T, H] or "HN" [H, T];
    a given lse is written (base 2, [T, H]) without return_lse too, as
    FlashInfer's, and only out is returned."""
    w, q, paged, keys, values = _prefill(np.random.default_rng(161))
    want, wl = attention(q, keys, values, [2, 3], causal=True)
    o, l2 = w.run(q, paged, return_lse=True)
    _close(o, want, np.float32, l2, wl)
    _, ln = w.run(q, paged, return_lse=True, lse_base="ln")
    np.testing.assert_allclose(ln, wl, rtol=1e-4, atol=1e-4)
    hn = poisoned((9, 5))
    _, got = w.run(q, paged, return_lse=True, lse_layout="HN", lse=hn)
    assert got is hn
    np.testing.assert_array_equal(hn, l2.T)
    given = poisoned((5, 9))
    res = w.run(q, paged, lse=given, lse_base="ln")
    assert isinstance(res, np.ndarray)
    np.testing.assert_array_equal(given, l2)


# ------------------------------------------------ refused inputs change nothing

BAD_OUTS = [
    ("out", lambda: poisoned((5, 9, 24), np.float16), kvattn.DtypeMismatchError),
    ("out", lambda: poisoned((5, 9, 25)), kvattn.ShapeMismatchError),
    ("out", lambda: poisoned((4, 9, 24)), kvattn.ShapeMismatchError),
    ("out", lambda: poisoned((5, 9, 48))[..., ::2], kvattn.InvalidArgumentError),
    ("lse", lambda: poisoned((5, 9), np.float16), kvattn.DtypeMismatchError),
    ("lse", lambda: poisoned((9, 5)), kvattn.ShapeMismatchError),
    ("lse", lambda: poisoned((5, 18))[:, ::2], kvattn.InvalidArgumentError),
]


@pytest.mark.parametrize("case", range(len(BAD_OUTS)))
def test_bad_outputs_refused_nothing_written(case):
    """An out / lse of the wrong dtype, shape or a strided last dimension is
    refused; it and the caller's other output keep the poison, and the
    plan still runs bit-equal afterwards."""
    name, make, err = BAD_OUTS[case]
    w, q, paged, _, _ = _prefill(np.random.default_rng(162))
    ref = w.run(q, paged)
    bad = make()
    other = poisoned((5, 9)) if name == "out" else poisoned((5, 9, 24))
    kw = {"out": bad, "lse": other} if name == "out" else {"lse": bad, "out": other}
    with pytest.raises(err):
        w.run(q, paged, return_lse=True, **kw)
    assert untouched(bad) and untouched(other)
    np.testing.assert_array_equal(w.run(q, paged), ref)


def test_strided_outputs_are_written_through_their_strides():
    """An out with token / head strides (a transposed view, every other row)
    is written in place as FlashInfer writes it and returned; the untouched
    rows in between keep their poison."""
    w, q, paged, keys, values = _prefill(np.random.default_rng(163))
    want, _ = attention(q, keys, values, [2, 3], causal=True)
    base = poisoned((10, 9, 24))
    out = base[::2]
    assert w.run(q, paged, out=out) is out
    _close(out, want, np.float32)
    assert untouched(base[1::2])
    t = poisoned((9, 5, 24))
    out = t.transpose(1, 0, 2)
    assert w.run(q, paged, out=out) is out
    _close(out, want, np.float32)


@pytest.mark.parametrize("mode,err", [("ROPE_LLAMA", kvattn.UnsupportedError),
                                      ("rope", KeyError), ("ALIBI+cap", kvattn.UnsupportedError)])
def test_refused_plans_keep_the_wrapper(mode, err):
    """pos_encoding_mode ROPE_LLAMA (no in-kernel RoPE), an unknown name
    (KeyError, as FlashInfer's) and ALIBI with a soft-cap are refused at
    plan(); the wrapper keeps its plan, which runs bit-equal."""
    rng = np.random.default_rng(164)
    w, q, paged, _, _ = _prefill(rng)
    ref = w.run(q, paged)
    _, ip, ix, lp, _, _ = random_paged(rng, [5, 9], 4, 3, 24, "NHD", np.float32, False)
    with pytest.raises(err):
        w.plan(np.array([0, 2, 5], np.int32), ip, ix, lp, 9, 3, 24, 4, causal=True,
               pos_encoding_mode=mode.split("+")[0], logits_soft_cap=3.0 if "cap" in mode else None,
               q_data_type="float32")
    np.testing.assert_array_equal(w.run(q, paged), ref)


# ------------------------------------------------ ragged, tree masks, MLA

RAGGED = [  # H, Hkv, D, Dv, q_lens, kv_lens, causal, window, cap, alibi, kv offset, dtype
    (63, 9, 24, 8, [3, 0, 6], [9, 2, 6], True, -1, None, False, 0, np.float32),
    (9, 3, 136, 40, [1, 6], [0, 2], False, 2, 4.0, False, 5, np.float16),
    (3, 1, 72, 72, [6, 3], [33, 9], True, 0, None, True, 5, np.float32),
    (9, 9, 8, 40, [0, 3, 1], [9, 33, 1], True, 10, None, True, 0, np.float16),
]


@pytest.mark.parametrize("case", range(len(RAGGED)))
def test_ragged_wrapper_at_odd_shapes(case):
    """The ragged wrapper with Dv != D, kv_indptr starting past row 0,
    q_len 0 and kv_len 0 requests, windows, soft-cap and ALiBi (FlashInfer's
    LSE: kvattn's + slope * (kv_len - q_len), base 2) vs the oracle."""
    h, hkv, d, dv, ql, kl, causal, wl, cap, alibi, off, dt = RAGGED[case]
    rng = np.random.default_rng(170 + case)
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    kv = (np.concatenate([[0], np.cumsum(kl)]) + off).astype(np.int32)
    q = rng.standard_normal((qo[-1], h, d)).astype(dt)
    k = rng.standard_normal((kv[-1] + 2, hkv, d)).astype(dt)
    v = rng.standard_normal((kv[-1] + 2, hkv, dv)).astype(dt)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
    w.plan(qo, kv, h, hkv, d, head_dim_vo=dv, causal=causal, window_left=wl, logits_soft_cap=cap,
           pos_encoding_mode="ALIBI" if alibi else "NONE", q_data_type=dt)
    out, lse = poisoned((qo[-1], h, dv), dt), poisoned((qo[-1], h))
    w.run(q, k, v, out=out, lse=lse)
    sl = fi.get_alibi_slopes(h) if alibi else None
    want, wlse = attention(q, [k[kv[r]:kv[r + 1]] for r in range(len(ql))],
                           [v[kv[r]:kv[r + 1]] for r in range(len(ql))], ql, causal=causal,
                           window_left=wl, softcap=cap or 0.0, alibi=sl)
    if alibi:
        wlse = wlse + np.concatenate([np.outer(np.full(a, b - a), sl) for a, b in zip(ql, kl)])
    _close(out, want, dt, lse, wlse)


TREES = [  # H, Hkv, D, page, layout, q_lens, context lengths, packed
    (63, 9, 24, 1, "HND", [4, 0, 9], [0, 5, 20], True),
    (9, 3, 72, 256, "NHD", [9, 1], [300, 0], False),
    (3, 1, 8, 3, "NHD", [1, 0, 4], [20, 1, 1], True),
]


@pytest.mark.parametrize("case", range(len(TREES)))
def test_tree_masks_at_odd_shapes(case):
    """FlashInfer custom / packed masks of draft trees (every row sees the
    context, itself and its ancestors) at odd head counts and page sizes 1
    and 256, with q_len 0 requests: planned as kvattn trees, vs the oracle."""
    h, hkv, d, ps, layout, ql, ctx_len, packed = TREES[case]
    rng = np.random.default_rng(180 + case)
    kl = [q + c for q, c in zip(ql, ctx_len)]
    trees = [[-1 if k == 0 or rng.random() < 0.25 else int(rng.integers(0, k))
              for k in range(q)] for q in ql]
    masks = []
    for q, s, t in zip(ql, kl, trees):
        m = np.zeros((q, s), bool)
        for i in range(q):
            m[i, : s - q] = True
            m[i, [s - q + a for a in ancestors(t, i)]] = True
        masks.append(m.reshape(-1))
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, ps, hkv, d, layout, np.float32, True)
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((qo[-1], h, d)).astype(np.float32)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
    if packed:
        pm = np.concatenate([np.packbits(m, bitorder="little") for m in masks])
        w.plan(qo, ip, ix, lp, h, hkv, d, ps, packed_custom_mask=pm, q_data_type="float32")
    else:
        w.plan(qo, ip, ix, lp, h, hkv, d, ps, custom_mask=np.concatenate(masks),
               q_data_type="float32")
    out, lse = poisoned(q.shape), poisoned(q.shape[:2])
    w.run(q, paged, out=out, lse=lse)
    want, wlse = attention(q, keys, values, ql, causal=True, trees=trees)
    _close(out, want, np.float32, lse, wlse)


MLA = [  # H, Dc, Dr, page, q_lens, kv_lens, dtype
    (3, 512, 64, 1, [1, 2, 0], [3, 73, 5], np.float32),
    (9, 128, 64, 64, [5, 1], [75, 1], np.float16),
    (63, 64, 16, 2, [1, 0, 2], [72, 3, 2], np.float32),
]


@pytest.mark.parametrize("case", range(len(MLA)))
def test_mla_wrapper_at_odd_shapes(case):
    """The MLA wrapper (absorbed call, causal) at 3, 9 and 63 heads, page
    sizes 1 / 2 / 64 and q_len 0 requests vs the latent oracle."""
    h, dc, dr, ps, ql, kl, dt = MLA[case]
    rng = np.random.default_rng(190 + case)
    npg = [max(1, -(-s // ps)) for s in kl]
    nb = sum(npg) + 1
    ip = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
    ix = rng.permutation(nb).astype(np.int32)[: ip[-1]]
    kv = rng.standard_normal((nb, ps, dc + dr)).astype(dt)
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((qo[-1], h, dc + dr)).astype(dt)
    w = fi.BatchMLAPagedAttentionWrapper(None)
    w.plan(qo, ip, ix, np.array(kl, np.int32), h, dc, dr, ps, True, 0.07, dt, dt)
    out, lse = poisoned((qo[-1], h, dc), dt), poisoned((qo[-1], h))
    w.run(query=q, kv_cache=kv, out=out, lse=lse)
    keys, vals = _mla_rows(kv, ix, ip, kl, dc)
    want, wlse = attention(q, keys, vals, ql, causal=True, scale=0.07)
    _close(out, want, dt, lse, wlse)


# ------------------------------------------------ Plan level: CPU vs reference

FORMATS = [  # q dtype, quant, storage dtype, scales
    ("f32", "none", "f32", {}),
    ("bf16", "none", "bf16", {}),
    ("f16", "fp8_e4m3", "fp8_e4m3", dict(k_scale=[0.02], v_scale=[0.03])),
    ("f16", "int8_token_k", "i8", dict(v_scale=[0.03])),
    ("bf16", "int8_token_k_v16", "bf16", {}),
    ("f32", "int8_channel", "i8", "channel"),
]
PLANS = [  # H, Hkv, D, block, layout, q_lens, seq_lens, mask kwargs
    (63, 7, 40, 1, "HND", [0, 4, 1], [30, 4, 131], dict(window_left=3)),
    (9, 3, 264, 128, "NHD", [7, 0], [12, 130], dict(attention_chunk=3, softcap=5.0)),
    (3, 1, 576, 2, "HND", [2, 5], [1, 0], dict(causal=False, window_left=0)),
    (9, 1, 72, 7, "NHD", [4, 1, 0], [9, 6, 2], dict(tree=[[-1, 0, 0, 1], [-1], []])),
    (63, 21, 24, 512, "NHD", [1, 7], [300, 7], dict(alibi_slopes="rand", decode_threshold=4)),
    (3, 3, 520, 5, "HND", [3, 0, 2], [40, 7, 2], dict(attention_chunk=8, window_left=5)),
]


def _plan_run(ctx, case, fmt, rng_seed):
    h, hkv, d, b, layout, ql, sl, mask = PLANS[case]
    qdt, quant, store, scales = FORMATS[fmt]
    rng = np.random.default_rng(rng_seed)
    np_dt = {"f32": np.float32, "f16": np.float16}.get(qdt)
    if np_dt is None:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np_dt = ml_dtypes.bfloat16
    if scales == "channel":
        n = hkv * d
        scales = dict(k_scale=np.full(n, 0.03, np.float32), v_scale=np.full(n, 0.03, np.float32),
                      k_offset=np.full(n, 0.5, np.float32), v_offset=np.full(n, -0.5, np.float32))
    nblk = [-(-s // b) for s in sl]
    total = sum(nblk) + 2
    perm = rng.permutation(total).astype(np.int32)
    bt = np.full((len(sl), max(nblk) + 1), -1, np.int32)
    at = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[at: at + n]
        at += n
    cache = kvattn.Cache(ctx, total, b, hkv, d, dtype=store, layout=layout, quant=quant,
                         **scales)
    keys = [rng.standard_normal((s, hkv, d)).astype(np.float32) for s in sl]
    vals = [rng.standard_normal((s, hkv, d)).astype(np.float32) for s in sl]
    for r, s in enumerate(sl):
        pos = np.arange(s)
        cache.write(keys[r].astype(np_dt), vals[r].astype(np_dt),
                    bt[r, pos // b].astype(np.int64) * b + pos % b)
    kw = dict(mask)
    if isinstance(kw.get("alibi_slopes"), str):
        kw["alibi_slopes"] = (rng.random(h) * 0.3).astype(np.float32)
    sinks = rng.standard_normal(h).astype(np.float32)
    q = rng.standard_normal((sum(ql), h, d)).astype(np.float32)
    p = kvattn.Plan(ctx, np.concatenate([[0], np.cumsum(ql)]).astype(np.int32),
                    np.array(sl, np.int32), bt, block_size=b, num_heads=h, num_kv_heads=hkv,
                    head_dim=d, q_dtype=qdt, **kw)
    out, lse = poisoned((sum(ql), h, d), np_dt), poisoned((sum(ql), h))
    p.run(q.astype(np_dt), cache, out=out, lse=lse, sinks=sinks)
    return (np.asarray(out, np.float64), lse), (q, keys, vals, ql, kw, sinks)


@pytest.mark.parametrize("isa", [None, "portable", "avx2"])
@pytest.mark.parametrize("case", range(len(PLANS)))
def test_plans_cpu_vs_reference(case, isa, monkeypatch):
    """kvattn.Plan at odd head counts and head sizes up to 576, block sizes
    1 to 512, every mask kind, sinks and q_len 0 requests: the CPU backend
    (default ISA, portable, AVX2) agrees with the reference backend over the
    same cache in each format; over f32 both agree with the oracle."""
    if isa:
        monkeypatch.setenv("KVA_CPU_ISA", isa)
    else:
        monkeypatch.delenv("KVA_CPU_ISA", raising=False)
    for fmt in range(len(FORMATS)):
        (o_ref, l_ref), args = _plan_run(kvattn.Context("ref"), case, fmt, 200 + case)
        (o_cpu, l_cpu), _ = _plan_run(kvattn.Context("cpu", 2), case, fmt, 200 + case)
        tol = {"f32": 2e-4, "f16": 4e-3, "bf16": 3e-2}[FORMATS[fmt][0]]
        assert np.isfinite(o_cpu).all() and np.isfinite(l_cpu).all()
        np.testing.assert_allclose(o_cpu, o_ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(l_cpu, l_ref, rtol=tol, atol=tol)
        if fmt == 0:
            q, keys, vals, ql, kw, sinks = args
            trees = kw.get("tree")
            want, wlse = attention(q, keys, vals, ql, causal=kw.get("causal", True),
                                   window_left=kw.get("window_left", -1),
                                   softcap=kw.get("softcap", 0.0), alibi=kw.get("alibi_slopes"),
                                   sinks=sinks, chunk=kw.get("attention_chunk", 0), trees=trees)
            np.testing.assert_allclose(o_ref, want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(l_ref, wlse, rtol=1e-5, atol=1e-5)


# ------------------------------------------------ plan reuse and sharing

def test_plan_reuse_after_cache_appends():
    """A step's plan reads the cache as it is at run(): a token appended
    (written) after plan() within the planned lengths is seen (the wrapper
    over the caller's pages, and Plan over a kvattn Cache); Plan.update for
    the next step after more appends equals a fresh plan, bit for bit."""
    rng = np.random.default_rng(210)
    kl = [6, 10]
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, 4, 3, 16, "HND", np.float32, False)
    q = rng.standard_normal((2, 9, 16)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    w.plan(ip, ix, lp, 9, 3, 16, 4, q_data_type="float32")
    w.run(q, paged)
    # the last token of request 1 (page ix[ip[1] + 2], slot 1) written after plan()
    new_k, new_v = rng.standard_normal((2, 3, 16)).astype(np.float32)
    page = ix[ip[1] + 2]
    paged[0][page, :, 1], paged[1][page, :, 1] = new_k, new_v
    keys[1][9], values[1][9] = new_k, new_v
    out = poisoned(q.shape)
    w.run(q, paged, out=out)
    want, _ = attention(q, keys, values, [1, 1], causal=False)
    _close(out, want, np.float32)

    ctx = kvattn.Context("cpu", 2)
    cache = kvattn.Cache(ctx, 8, 3, 3, 16, dtype="f32", layout="HND")
    bt = np.array([[5, 1, 7], [0, 3, 6]], np.int32)
    seq = np.array([4, 2], np.int32)
    ks = rng.standard_normal((2, 9, 3, 16)).astype(np.float32)
    vs = rng.standard_normal((2, 9, 3, 16)).astype(np.float32)

    def append(r, lo, hi):
        pos = np.arange(lo, hi)
        cache.write(ks[r, lo:hi], vs[r, lo:hi], bt[r, pos // 3].astype(np.int64) * 3 + pos % 3)

    append(0, 0, 4)
    append(1, 0, 2)
    kw = dict(block_size=3, num_heads=9, num_kv_heads=3, head_dim=16, q_dtype="f32")
    p = kvattn.Plan(ctx, [0, 1, 2], seq, bt, **kw)
    q2 = rng.standard_normal((2, 9, 16)).astype(np.float32)
    p.run(q2, cache)
    append(0, 4, 7)
    append(1, 2, 3)
    p.update([0, 3, 4], [7, 3], bt)
    q3 = rng.standard_normal((4, 9, 16)).astype(np.float32)
    got = p.run(q3, cache)
    fresh = kvattn.Plan(ctx, [0, 3, 4], [7, 3], bt, **kw).run(q3, cache)
    np.testing.assert_array_equal(got, fresh)
    want, _ = attention(q3, [ks[0, :7], ks[1, :3]], [vs[0, :7], vs[1, :3]], [3, 1], causal=True)
    _close(got, want, np.float32)


def test_plan_shared_across_contexts():
    """kvattn.h, Threading: a plan runs on another context of its backend
    only when that context reserved its workspace (it made a plan of the same
    descriptor with the same thread count); else INVALID_ARGUMENT and out
    untouched, also on a context of fewer threads after its own plan."""
    rng = np.random.default_rng(211)
    a, b, c = kvattn.Context("cpu", 4), kvattn.Context("cpu", 1), kvattn.Context("cpu", 4)
    seq, ql = [40, 7, 300], [3, 1, 0]
    bt = np.full((3, 70), -1, np.int32)
    at = 0
    for r, s in enumerate(seq):
        n = -(-s // 5)
        bt[r, :n] = np.arange(at, at + n)
        at += n
    cache = kvattn.Cache(a, at + 1, 5, 3, 24, dtype="f32")
    for r, s in enumerate(seq):
        pos = np.arange(s)
        cache.write(rng.standard_normal((s, 3, 24)).astype(np.float32),
                    rng.standard_normal((s, 3, 24)).astype(np.float32),
                    bt[r, pos // 5].astype(np.int64) * 5 + pos % 5)
    kw = dict(block_size=5, num_heads=9, num_kv_heads=3, head_dim=24, q_dtype="f32",
              cascade="off")
    qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((4, 9, 24)).astype(np.float32)
    p = kvattn.Plan(a, qsl, seq, bt, **kw)
    want = p.run(q, cache)
    for ctx in (b, c):
        out = poisoned(want.shape)
        with pytest.raises(kvattn.InvalidArgumentError, match="workspace"):
            p.run(q, cache, ctx=ctx, out=out)
        assert untouched(out)
    kvattn.Plan(c, qsl, seq, bt, **kw)
    np.testing.assert_array_equal(p.run(q, cache, ctx=c), want)
    kvattn.Plan(b, qsl, seq, bt, **kw)
    out = poisoned(want.shape)
    with pytest.raises(kvattn.InvalidArgumentError, match="workspace"):
        p.run(q, cache, ctx=b, out=out)
    assert untouched(out)
