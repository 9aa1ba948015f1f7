"""Numpy reference of kvattn's attention semantics (float64), independent of
the library: per request, scores over the visible keys, softmax, weighted V.
Semantics as include/kvattn.h states them (bottom-right causal, window,
soft-cap, ALiBi, sinks, local chunks, draft trees, and one rank's partial of
a sharded (DCP) cache)."""

import numpy as np


def ancestors(parents, i):
    """Tree token i and its ancestors (parents[k] is k's parent, -1 a root)."""
    seen = set()
    while i >= 0:
        seen.add(i)
        i = parents[i]
    return seen


def attention(q, keys, values, q_lens, *, causal, window_left=-1, softcap=0.0, scale=None,
              alibi=None, sinks=None, chunk=0, trees=None, dcp=None):
    """q [T, H, D]; keys[r] [s_r, Hkv, D], values[r] [s_r, Hkv, Dv] per request;
    q_lens [R]. chunk C > 0: key j visible only if j // C == pos // C.
    trees[r]: request r's parents (q_r ints, -1 a root): query i sees keys
    before s - q and tree key s - q + k only if k is i or an ancestor of i.
    dcp (N, rank, I): the partial result of rank `rank` of N, which holds the
    keys at global positions j with (j // I) % N == rank (masks stay global;
    sinks count on rank 0 only). Returns out [T, H, Dv] and natural-log lse
    [T, H] (float64); a row without keys (or a rank without any of the row's)
    is 0 with lse -inf (the sink's logit with a sink)."""
    q = np.asarray(q, np.float64)
    t_all, h, d = q.shape
    dv = values[0].shape[2] if len(values) else d
    out = np.zeros((t_all, h, dv))
    lse = np.full((t_all, h), -np.inf)
    scale = 1.0 / np.sqrt(d) if not scale else scale
    t0 = 0
    for r, ql in enumerate(q_lens):
        k = np.asarray(keys[r], np.float64)
        v = np.asarray(values[r], np.float64)
        s = k.shape[0]
        hkv = k.shape[1] if s else 1
        group = h // hkv if s else 1
        for i in range(ql):
            pos = s - ql + i
            j = np.arange(s)
            vis = np.ones(s, bool)
            if causal:
                vis &= j <= pos
            if window_left is not None and window_left >= 0:
                vis &= pos - j <= window_left
            if chunk:
                vis &= j // chunk == pos // chunk
            if trees is not None:
                seen = ancestors(trees[r], i)
                vis &= (j < s - ql) | np.isin(j - (s - ql), list(seen))
            if dcp is not None:
                vis &= (j // dcp[2]) % dcp[0] == dcp[1]
            for hh in range(h):
                kh = hh // group
                sc = (k[:, kh, :] @ q[t0 + i, hh]) * scale if s else np.zeros(0)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                if alibi is not None:
                    sc = sc + alibi[hh] * (j - pos)
                sc = sc[vis]
                extra = [] if sinks is None or (dcp and dcp[1]) else [float(sinks[hh])]
                allsc = np.concatenate([sc, extra])
                if allsc.size == 0:
                    continue
                m = allsc.max()
                e = np.exp(allsc - m)
                denom = e.sum()
                w = e[: sc.size] / denom
                out[t0 + i, hh] = w @ v[vis, kh, :] if sc.size else 0.0
                lse[t0 + i, hh] = m + np.log(denom)
        t0 += ql
    return out, lse
