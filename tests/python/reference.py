"""Numpy reference of kvattn's attention semantics (float64), independent of
the library: per request, scores over the visible keys, softmax, weighted V.
Semantics as include/kvattn.h states them (bottom-right causal, window,
soft-cap, ALiBi, sinks)."""

import numpy as np


def attention(q, keys, values, q_lens, *, causal, window_left=-1, softcap=0.0, scale=None,
              alibi=None, sinks=None):
    """q [T, H, D]; keys[r] [s_r, Hkv, D], values[r] [s_r, Hkv, Dv] per request;
    q_lens [R]. Returns out [T, H, Dv] and natural-log lse [T, H] (float64)."""
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
            for hh in range(h):
                kh = hh // group
                sc = (k[:, kh, :] @ q[t0 + i, hh]) * scale if s else np.zeros(0)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                if alibi is not None:
                    sc = sc + alibi[hh] * (j - pos)
                sc = sc[vis]
                extra = [] if sinks is None else [float(sinks[hh])]
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
