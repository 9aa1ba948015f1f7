"""Attention through kvattn: one paged cache per layer, one block pool, one plan per step.

The pool (prefix caching on) hands out block ids shared by every layer's cache: a request's
block-table row and slot mapping are the same in all layers, so a step makes one plan (one per
distinct layer window when the model has sliding-window layers) and writes each layer's K/V
with the same slots. Blocks that fall out of a window are not released (drop_window), since
the global layers of the same request still read them. Cache formats (--kv-dtype):

    f32, f16, bf16      unquantized (q is converted to the cache dtype, out back to f32)
    int8_channel        int8 K/V with static per-(kv head, channel) scales and offsets
    int8_token_k        int8 K with per-token scales, int8 V with static per-channel scales
    int8_token_k_v16    int8 K with per-token scales, f16 V
    fp8                 fp8 e4m3 K/V with static per-kv-head scales

Static scales come from a calibration pass (calibrate(): per layer, the min/max of K and V
over a few prompts run with numpy attention).
"""

import numpy as np

FORMATS = {  # name -> (cache dtype, kvattn quant, q dtype)
    "f32": ("f32", "none", "f32"),
    "f16": ("f16", "none", "f16"),
    "bf16": ("bf16", "none", "bf16"),
    "int8_channel": ("i8", "int8_channel", "f32"),
    "int8": ("i8", "int8_channel", "f32"),
    "int8_token_k": ("i8", "int8_token_k", "f32"),
    "int8_token_k_v16": ("f16", "int8_token_k_v16", "f32"),
    "fp8": ("fp8_e4m3", "fp8_e4m3", "f32"),
}


def needs_calibration(kv_format):
    return FORMATS[kv_format][1] in ("int8_channel", "int8_token_k", "fp8_e4m3")


def _np_dtype(name):
    if name == "f32":
        return np.float32
    if name == "f16":
        return np.float16
    import ml_dtypes  # numpy has no bfloat16; kvattn accepts ml_dtypes' bfloat16 arrays

    return ml_dtypes.bfloat16


class _Recorder:
    """Wraps an attention object and keeps per-layer min/max of K and V [Hkv, D]."""

    def __init__(self, inner):
        self.inner, self.lo, self.hi = inner, {}, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def attend(self, layer, q, k, v):
        for key, x in (("k", k), ("v", v)):
            lo, hi = x.min(axis=0), x.max(axis=0)
            old = self.lo.get((key, layer))
            self.lo[(key, layer)] = lo if old is None else np.minimum(old, lo)
            old = self.hi.get((key, layer))
            self.hi[(key, layer)] = hi if old is None else np.maximum(old, hi)
        return self.inner.attend(layer, q, k, v)


def calibrate(model, prompts):
    """Per layer: {'k': (lo, hi), 'v': (lo, hi)} of [Hkv, D] over the prompts' tokens."""
    from engine import generate
    from numpy_attn import NumpyAttention

    rec = _Recorder(NumpyAttention(model.cfg))
    generate(model, rec, prompts, 1, max_num_seqs=len(prompts), max_batched_tokens=1024)
    return [
        {kv: (rec.lo[(kv, i)], rec.hi[(kv, i)]) for kv in ("k", "v")} for i in range(model.cfg.num_layers)
    ]


def _scales(fmt, calib):
    """Static scale arguments of kvattn.Cache for one layer's calibration."""
    if fmt in ("int8", "int8_channel", "int8_token_k"):
        out = {}
        for kv in ("k", "v") if fmt != "int8_token_k" else ("v",):
            lo, hi = calib[kv]
            scale = np.maximum((hi - lo) / 254.0, 1e-6).astype(np.float32)
            # x = (q - o) * s with q in [-127, 127]: the range [lo, hi] maps onto it.
            offset = (-127.0 - lo / scale).astype(np.float32)
            out[kv + "_scale"], out[kv + "_offset"] = scale.reshape(-1), offset.reshape(-1)
        return out
    if fmt == "fp8":
        out = {}
        for kv in ("k", "v"):
            lo, hi = calib[kv]
            amax = np.maximum(np.abs(lo), np.abs(hi)).max(axis=1)  # per kv head
            out[kv + "_scale"] = np.maximum(amax / 448.0, 1e-6).astype(np.float32)
        return out
    return {}


class KvattnAttention:
    def __init__(self, cfg, backend="cpu", kv_format="f32", block_size=16, num_blocks=512, num_threads=2,
                 calib=None, prefix_caching=True):
        import kvattn

        if kv_format not in FORMATS:
            raise ValueError(f"kv format {kv_format!r}: one of {sorted(FORMATS)}")
        dtype, quant, qdt = FORMATS[kv_format]
        if needs_calibration(kv_format) and calib is None:
            raise ValueError(f"kv format {kv_format!r} needs calibration scales (calib=)")
        self.cfg, self.kvattn = cfg, kvattn
        self.name = f"kvattn-{backend}-{kv_format}"
        self.q_dtype, self.q_np = qdt, _np_dtype(qdt)
        self.block_size = block_size
        self.ctx = kvattn.Context(backend, num_threads=num_threads)
        self.pool = kvattn.Pool(num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.caches = [
            kvattn.Cache(self.ctx, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype,
                         layout="NHD", quant=quant, **_scales(kv_format, calib[i] if calib else None))
            for i in range(cfg.num_layers)
        ]
        self.windows = list(cfg.layer_window or [-1] * cfg.num_layers)
        self.plans = {}
        self.slots = None

    # Request lifecycle: the pool.
    def add_request(self, prompt_tokens):
        return self.pool.add_request(prompt_tokens)

    def allocate(self, rid, num_new_tokens):
        try:
            self.pool.allocate(rid, num_new_tokens)
        except self.kvattn.PoolExhaustedError:
            return False
        return True

    def commit(self, rid, tokens):
        self.pool.append_tokens(rid, tokens)

    def free(self, rid):
        self.pool.free(rid)

    def stats(self):
        s = self.pool.stats()
        return dict(prefix_hit_rate=s["hit_rate"], prefix_hit_tokens=s["hit_tokens"])

    # One model step: a plan over the batch and its slot mapping, shared by all layers.
    def begin_step(self, items):
        c = self.cfg
        qsl, seq_lens, slots, rows = [0], [], [], []
        for rid, start, n in items:
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            slots.append(self.pool.slots(rid, start, n))
            rows.append(self.pool.block_table(rid))
        width = max(len(r) for r in rows)
        table = np.zeros((len(items), width), np.int32)
        for i, r in enumerate(rows):
            table[i, : len(r)] = r
        for plan in self.plans.values():
            plan.close()
        # One plan per distinct layer window (sliding-window and global layers differ).
        self.plans = {
            w: self.kvattn.Plan(self.ctx, np.array(qsl, np.int32), np.array(seq_lens, np.int32), table,
                                block_size=self.block_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                                head_dim=c.head_dim, q_dtype=self.q_dtype, scale=c.attn_scale, causal=True,
                                window_left=w)
            for w in set(self.windows)
        }
        self.slots = np.concatenate(slots).astype(np.int64)

    def attend(self, layer, q, k, v):
        cache = self.caches[layer]
        cache.write(k, v, self.slots)
        plan = self.plans[self.windows[layer]]
        out = plan.run(np.ascontiguousarray(q.astype(self.q_np, copy=False)), cache)
        return np.asarray(out, dtype=np.float32)
