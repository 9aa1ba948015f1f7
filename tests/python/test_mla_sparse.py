"""Sparse MLA (Plan.run_mla_sparse, kva_mla_sparse_run) and the lightning
indexer (Plan.run_indexer, kva_indexer_run) through the Python package,
against numpy references written here from the definitions in
include/kvattn_mla.h, on random data:

- sparse MLA: per token, softmax over the listed positions of its request
  (duplicates counted twice, -1 unused, only the first topk_length entries),
  sink in the denominator, out = sum p * c_kv, lse in natural log; a token
  with nothing listed gives 0 and lse -inf (the sink with a sink). Caches of
  f32 rows and fp8_ds_mla rows (the test quantizes with its own e4m3 rounding
  from the format's description: per 128-value tile s = max(amax / 448,
  FLT_MIN), code = e4m3(x / s), k_pe as bf16), both modes.
- indexer: logits sum_h w_h relu(q_h . k_j) over the causal keys in float64;
  the listed keys are the top K by that logit (a swap allowed only between
  logits within float32 rounding of each other), exactly equal logits (repeated
  key rows) by position, then -1; f32 and FP8_TOKEN key caches.
Outputs are NaN-poisoned before each run; bad input raises and leaves them
unchanged."""

import math

import numpy as np
import pytest

import kvattn
import poison

FLT_MIN = np.float32(1.1754943508222875e-38)


def e4m3_values():
    """The 127 non-negative finite e4m3 (fn) values, ascending (code order)."""
    v = [m / 8.0 * 2.0 ** -6 for m in range(8)]  # subnormals, exponent field 0
    for e in range(1, 16):
        v += [(1 + m / 8.0) * 2.0 ** (e - 7) for m in range(8)]
    return np.array(v[:127])  # 0x7f is NaN; 448 is the largest


E4M3 = e4m3_values()


def e4m3_round(x):
    """x (float32 array) rounded to e4m3: nearest, ties to the even code,
    saturating at +-448."""
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    return np.sign(x) * E4M3[code]


def bf16_round(x):
    """float32 x rounded to bf16 (nearest even), as float64."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def ds_mla_values(ckv, kpe):
    """What fp8_ds_mla rows hold (float64): c_kv per 128-value tile as
    code * s, k_pe as bf16."""
    t, dc = ckv.shape
    tiles = ckv.astype(np.float32).reshape(t, dc // 128, 128)
    s = np.maximum(np.abs(tiles).max(axis=2, keepdims=True) / np.float32(448), FLT_MIN)
    codes = e4m3_round((tiles / s).astype(np.float32))
    return np.concatenate([(codes * s.astype(np.float64)).reshape(t, dc), bf16_round(kpe)], 1)


class Batch:
    """Requests with their q_len / seq_len over a shuffled paged cache."""

    def __init__(self, rng, bs, q_lens, seq_lens):
        self.bs, self.q_lens, self.seq_lens = bs, list(q_lens), list(seq_lens)
        npages = [-(-s // bs) for s in seq_lens]
        self.nb = sum(npages) + 2
        perm = rng.permutation(self.nb).astype(np.int32)
        self.block_table = np.full((len(seq_lens), max(npages)), -1, np.int32)
        used = 0
        for r, n in enumerate(npages):
            self.block_table[r, :n] = perm[used: used + n]
            used += n
        self.qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        self.T = int(self.qsl[-1])
        # Slots of every request's tokens (rows of the sources below).
        self.slots = np.concatenate([
            self.block_table[r, np.arange(s) // bs].astype(np.int64) * bs + np.arange(s) % bs
            for r, s in enumerate(seq_lens)])
        self.row0 = np.concatenate([[0], np.cumsum(seq_lens)])

    def request_of(self, t):
        return int(np.searchsorted(self.qsl, t, side="right") - 1)


# ---- sparse MLA -------------------------------------------------------------

DC, DR, H, K = 128, 64, 3, 16


def sparse_reference(q, lat, batch, idx, klen, scale, sinks):
    """out [T, H, Dc], lse [T, H] in float64 over the listed rows."""
    out = np.zeros((batch.T, H, DC))
    lse = np.full((batch.T, H), -np.inf)
    for t in range(batch.T):
        r = batch.request_of(t)
        pos = [p for p in idx[t, : klen[t]] if p >= 0]
        rows = lat[batch.row0[r] + np.array(pos, dtype=np.int64)] if pos else np.zeros((0, DC + DR))
        for h in range(H):
            s = scale * (rows @ q[t, h].astype(np.float64))
            parts = list(s) + ([sinks[h]] if sinks is not None else [])
            if not parts:
                continue
            m = max(parts)
            den = sum(math.exp(v - m) for v in parts)
            lse[t, h] = m + math.log(den)
            if pos:
                out[t, h] = (np.exp(s - m) / den) @ rows[:, :DC]
    return out, lse


def sparse_setup(rng, fp8, mode):
    batch = Batch(rng, 16, [1, 2, 5], [40, 23, 60])
    ctx = kvattn.Context("cpu", num_threads=2)
    n = int(batch.row0[-1])
    ckv = rng.uniform(-2, 2, (n, DC)).astype(np.float32)
    kpe = rng.uniform(-2, 2, (n, DR)).astype(np.float32)
    if fp8:
        cache = kvattn.Cache.mla(ctx, batch.nb, batch.bs, DC, DR, dtype="fp8_e4m3",
                                 quant="fp8_ds_mla")
        lat = ds_mla_values(ckv, kpe)
    else:
        cache = kvattn.Cache.mla(ctx, batch.nb, batch.bs, DC, DR, dtype="f32")
        lat = np.concatenate([ckv, kpe], 1).astype(np.float64)
    cache.write(ckv, kpe, batch.slots)
    scale = 1.0 / math.sqrt(192.0)
    plan = kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                       num_heads=H, num_kv_heads=1, head_dim=DC + DR, head_dim_v=DC,
                       q_dtype="f32", scale=scale, decode_threshold=2, kind="mla",
                       sparse_topk=K, sparse_mode=mode)
    return batch, ctx, cache, lat, plan, scale


def random_lists(rng, batch):
    """[T, K + 3] rows (the first K used): positions, -1 entries, duplicates;
    token 0 lists nothing."""
    idx = np.empty((batch.T, K + 3), np.int32)
    for t in range(batch.T):
        s = batch.seq_lens[batch.request_of(t)]
        for j in range(K + 3):
            u = rng.integers(0, 100)
            idx[t, j] = -1 if u < 10 else idx[t, rng.integers(0, j)] if u < 20 and j else \
                rng.integers(0, s)
    idx[0, :] = -1
    return idx


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("mode", ["mixed", "separate"])
def test_run_mla_sparse_matches_numpy(fp8, mode):
    rng = np.random.default_rng(11 + fp8)
    batch, ctx, cache, lat, plan, scale = sparse_setup(rng, fp8, mode)
    q = rng.uniform(-1, 1, (batch.T, H, DC + DR)).astype(np.float32)
    idx = random_lists(rng, batch)[:, :]  # strided rows: K + 3 per row
    klen = rng.integers(0, K + 1, batch.T).astype(np.int32)
    klen[1] = 0
    sinks = rng.uniform(-2, 2, H).astype(np.float32)
    for tl, sk in ((None, None), (klen, sinks)):
        out = np.full((batch.T, H, DC), np.nan, np.float32)
        lse = np.full((batch.T, H), np.nan, np.float32)
        res = plan.run_mla_sparse(q, cache, idx, topk_length=tl, sinks=sk, out=out, lse=lse)
        assert res[0] is out and res[1] is lse
        kl = np.full(batch.T, K) if tl is None else tl
        want, want_lse = sparse_reference(q, lat, batch, idx, kl, scale, sk)
        if mode == "separate":
            # The CPU's SEPARATE mode reads the prefill request's rows back
            # as bf16 (rounded to float32, then to bf16) and attends those.
            ws, wls = sparse_reference(q, bf16_round(lat), batch, idx, kl, scale, sk)
            pre = slice(int(batch.qsl[2]), int(batch.qsl[3]))  # q_len 5 > decode_threshold 2
            want[pre], want_lse[pre] = ws[pre], wls[pre]
        np.testing.assert_allclose(out, want, atol=2e-4, rtol=1e-3)
        finite = np.isfinite(want_lse)
        np.testing.assert_array_equal(np.isfinite(lse), finite)
        np.testing.assert_allclose(lse[finite], want_lse[finite], atol=1e-4, rtol=1e-5)
    # Allocated output, no lse.
    got = plan.run_mla_sparse(q, cache, idx)
    assert got.shape == (batch.T, H, DC) and got.dtype == np.float32
    assert np.all(got[0] == 0.0)  # token 0 lists nothing


def test_run_mla_sparse_bad_input():
    rng = np.random.default_rng(3)
    batch, ctx, cache, lat, plan, scale = sparse_setup(rng, False, "mixed")
    q = rng.uniform(-1, 1, (batch.T, H, DC + DR)).astype(np.float32)
    idx = random_lists(rng, batch)
    out = poison.poisoned((batch.T, H, DC))
    bad = idx.copy()
    bad[2, 5] = batch.seq_lens[batch.request_of(2)]  # past the request's seq_len
    with pytest.raises(kvattn.OutOfRangeError):
        plan.run_mla_sparse(q, cache, bad, out=out)
    assert poison.untouched(out)
    with pytest.raises(kvattn.ShapeMismatchError):
        plan.run_mla_sparse(q, cache, idx[:, : K - 1], out=out)
    with pytest.raises(kvattn.DtypeMismatchError):
        plan.run_mla_sparse(q, cache, idx.astype(np.int64), out=out)
    assert poison.untouched(out)
    dense = kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                        num_heads=H, num_kv_heads=1, head_dim=DC + DR, head_dim_v=DC,
                        q_dtype="f32", scale=scale, kind="mla")
    with pytest.raises(kvattn.InvalidArgumentError):
        dense.run_mla_sparse(q, cache, idx)


# ---- the lightning indexer --------------------------------------------------

HI, D, KI = 8, 32, 6


def indexer_setup(rng, fp8):
    batch = Batch(rng, 8, [1, 3, 7], [30, 5, 20])
    ctx = kvattn.Context("cpu", num_threads=2)
    n = int(batch.row0[-1])
    keys = rng.uniform(-1, 1, (n, D)).astype(np.float32)
    # An exact tie in request 1 (seq_len 5 <= K: every key listed).
    keys[batch.row0[1] + 3] = keys[batch.row0[1] + 1]
    cache = kvattn.Cache.index(ctx, batch.nb, batch.bs, D, fp8=fp8, dtype="f32")
    assert cache.kind == "index"
    cache.write(keys, None, batch.slots)
    if fp8:  # per token s = max(amax / 448, FLT_MIN), code = e4m3(x / s)
        s = np.maximum(np.abs(keys).max(axis=1, keepdims=True) / np.float32(448), FLT_MIN)
        kval = e4m3_round((keys / s).astype(np.float32)) * s.astype(np.float64)
    else:
        kval = keys.astype(np.float64)
    plan = kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                       num_heads=HI, num_kv_heads=1, head_dim=D, q_dtype="f32", kind="index",
                       sparse_topk=KI)
    return batch, ctx, cache, kval, plan


def check_topk(batch, q, w, kval, ind, lens):
    for t in range(batch.T):
        r = batch.request_of(t)
        pos = batch.seq_lens[r] - batch.q_lens[r] + (t - batch.qsl[r])
        n = min(KI, pos + 1)
        assert lens[t] == n
        assert np.all(ind[t, n:] == -1)
        got = ind[t, :n]
        assert len(set(got.tolist())) == n and np.all((got >= 0) & (got <= pos))
        k = kval[batch.row0[r]: batch.row0[r] + pos + 1]
        dots = np.maximum(q[t].astype(np.float64) @ k.T, 0.0)  # [Hi, keys]
        logit = w[t].astype(np.float64) @ dots
        # A swap is allowed only within float32 rounding of the sums.
        tol = 8 * (D + HI) * 2.0 ** -24 * (np.abs(w[t]) @ (np.abs(q[t]) @ np.abs(k.T))).max()
        assert np.all(np.diff(logit[got]) <= tol), (t, logit[got])
        rest = np.setdiff1d(np.arange(pos + 1), got)
        if rest.size:
            assert logit[got].min() >= logit[rest].max() - tol
        for a, b in zip(got[:-1], got[1:]):  # exactly equal logits: lower position first
            if logit[a] == logit[b]:
                assert a < b


@pytest.mark.parametrize("fp8", [False, True])
def test_run_indexer_matches_numpy(fp8):
    rng = np.random.default_rng(21 + fp8)
    batch, ctx, cache, kval, plan, = indexer_setup(rng, fp8)
    q = rng.uniform(-1, 1, (batch.T, HI, D)).astype(np.float32)
    w = rng.uniform(0, 1, (batch.T, HI)).astype(np.float32)
    ind = np.full((batch.T, KI + 2), 0x5A5A5A5A, np.int32)  # strided rows; past K untouched
    lens = np.full(batch.T, -7, np.int32)
    res = plan.run_indexer(q, w, cache, indices=ind[:, :KI], topk_length=lens)
    assert res[1] is lens
    check_topk(batch, q, w, kval, ind[:, :KI], lens)
    assert np.all(ind[:, KI:] == 0x5A5A5A5A)
    # The tie of request 1 (keys 1 and 3) lists 1 first, next to 3.
    for t in range(int(batch.qsl[1]) + 1, int(batch.qsl[2])):  # positions 3 and 4
        row = ind[t, :KI].tolist()
        assert row.index(3) == row.index(1) + 1
    # Allocated output.
    got, got_lens = plan.run_indexer(q, w, cache, return_lengths=True)
    np.testing.assert_array_equal(got, ind[:, :KI])
    np.testing.assert_array_equal(got_lens, lens)
    only = plan.run_indexer(q, w, cache)
    np.testing.assert_array_equal(only, got)


@pytest.mark.parametrize("fp8", [False, True])
def test_run_indexer_fp8_q(fp8):
    """index_q_quant="fp8_token": each q[t, h] row quantized as a key row is
    written (s = max(amax / 448, FLT_MIN), code = e4m3(q / s) in float32),
    logits over code * s; a row of zeros (s = FLT_MIN, codes 0) scores 0."""
    rng = np.random.default_rng(31 + fp8)
    batch, ctx, cache, kval, _ = indexer_setup(rng, fp8)
    plan = kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                       num_heads=HI, num_kv_heads=1, head_dim=D, q_dtype="f32", kind="index",
                       sparse_topk=KI, index_q_quant="fp8_token")
    q = rng.uniform(-1, 1, (batch.T, HI, D)).astype(np.float32)
    q[2, 1] = 0.0
    w = rng.uniform(-1, 1, (batch.T, HI)).astype(np.float32)
    s = np.maximum(np.abs(q).max(axis=2, keepdims=True) / np.float32(448), FLT_MIN)
    qval = e4m3_round((q / s).astype(np.float32)) * s.astype(np.float64)
    ind = np.full((batch.T, KI), 0x5A5A5A5A, np.int32)
    lens = np.full(batch.T, -7, np.int32)
    plan.run_indexer(q, w, cache, indices=ind, topk_length=lens)
    check_topk(batch, qval, w, kval, ind, lens)
    # Other kva_quant values are refused (by the library, or by name).
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                    num_heads=HI, num_kv_heads=1, head_dim=D, q_dtype="f32", kind="index",
                    sparse_topk=KI, index_q_quant="fp8_e4m3")
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.Plan(ctx, batch.qsl, batch.seq_lens, batch.block_table, block_size=batch.bs,
                    num_heads=HI, num_kv_heads=1, head_dim=D, q_dtype="f32", kind="index",
                    sparse_topk=KI, index_q_quant="e5m2")


def test_run_indexer_bad_input():
    rng = np.random.default_rng(5)
    batch, ctx, cache, kval, plan = indexer_setup(rng, False)
    q = rng.uniform(-1, 1, (batch.T, HI, D)).astype(np.float32)
    w = rng.uniform(0, 1, (batch.T, HI)).astype(np.float32)
    ind = np.full((batch.T, KI), 0x5A5A5A5A, np.int32)
    with pytest.raises(kvattn.ShapeMismatchError):
        plan.run_indexer(q[:, :4], w, cache, indices=ind)
    with pytest.raises(kvattn.DtypeMismatchError):
        plan.run_indexer(q, w.astype(np.float64), cache, indices=ind)
    with pytest.raises(kvattn.ShapeMismatchError):
        plan.run_indexer(q, w, cache, indices=ind[:, : KI - 1])
    assert np.all(ind == 0x5A5A5A5A)
    with pytest.raises(kvattn.InvalidArgumentError):
        cache.write(np.zeros((1, D), np.float32), np.zeros((1, D), np.float32), [0])
    mla = kvattn.Cache.mla(ctx, 4, 8, 128, 64, dtype="f32")
    with pytest.raises(kvattn.ShapeMismatchError):
        plan.run_indexer(q, w, mla, indices=ind)
    assert np.all(ind == 0x5A5A5A5A)


# ---- host views of the fp8_ds_mla and FP8_TOKEN storage ----------------------

def e4m3_decode(codes):
    """float64 values of e4m3 codes (uint8; no NaN among them here)."""
    return E4M3[codes & 0x7F] * np.where(codes & 0x80, -1.0, 1.0)


def test_k_array_views_of_packed_formats():
    """k_array() is a view of the storage (docs/python.md): an fp8_ds_mla row
    is Dc codes, Dc / 128 float32 tile scales and Dr bf16 k_pe (kvattn.h:
    656 bytes for DeepSeek), token after token: the view is [NB, B, 1, row
    bytes] and v_array() its first Dc columns (the codes of c_kv). An
    FP8_TOKEN block holds its B rows of D codes, then its B float32 scales:
    k_array() is the codes [NB, B, 1, D] at a block stride of B (D + 4)
    bytes. Both views showed D-byte rows at the wrong offsets."""
    rng = np.random.default_rng(45)
    ctx = kvattn.Context("cpu", num_threads=1)
    nb, bs, dc, dr = 3, 4, 256, 64
    cache = kvattn.Cache.mla(ctx, nb, bs, dc, dr, dtype="fp8_e4m3", quant="fp8_ds_mla")
    slots = np.array([0, 5, 11, 6], np.int64)
    ckv = rng.uniform(-3, 3, (4, dc)).astype(np.float32)
    kpe = rng.uniform(-3, 3, (4, dr)).astype(np.float32)
    cache.write(ckv, kpe, slots)
    nt = dc // 128
    row = dc + 4 * nt + 2 * dr
    ka = cache.k_array()
    assert ka.dtype == np.uint8 and ka.shape == (nb, bs, 1, row)
    for i, s in enumerate(slots):
        r = ka[s // bs, s % bs, 0]
        tiles = ckv[i].reshape(nt, 128)
        scale = np.maximum(np.abs(tiles).max(axis=1) / np.float32(448), FLT_MIN)
        assert np.array_equal(r[dc: dc + 4 * nt].copy().view(np.float32), scale), i
        want = e4m3_round((tiles / scale[:, None]).astype(np.float32)).reshape(-1)
        assert np.array_equal(e4m3_decode(r[:dc]), want), i
        pe = r[dc + 4 * nt:].copy().view(np.uint16).astype(np.uint32) << 16
        assert np.array_equal(pe.view(np.float32), bf16_round(kpe[i]).astype(np.float32)), i
    va = cache.v_array()
    assert va.shape == (nb, bs, 1, dc) and np.shares_memory(va, ka)
    assert np.array_equal(va, ka[..., :dc])

    d = 32
    icache = kvattn.Cache.index(ctx, nb, bs, head_dim=d, fp8=True)
    keys = rng.uniform(-2, 2, (4, d)).astype(np.float32)
    icache.write(keys, None, slots)
    ia = icache.k_array()
    assert ia.dtype == np.uint8 and ia.shape == (nb, bs, 1, d)
    assert ia.strides[0] == bs * (d + 4)
    for i, s in enumerate(slots):
        scale = np.maximum(np.abs(keys[i]).max() / np.float32(448), FLT_MIN)
        want = e4m3_round((keys[i] / scale).astype(np.float32))
        assert np.array_equal(e4m3_decode(ia[s // bs, s % bs, 0]), want), i
