"""kvattn.cache: the paged KV cache object (kva_cache) and its block
operations; kvattn.Cache. Split from core.py (the Context, Plan and the
module-level calls stay there)."""

import ctypes

import numpy as np

from . import _lib as L
from . import _tensor as T
from ._errors import DtypeMismatchError, InvalidArgumentError, ShapeMismatchError
from .core import (_array_ptr, _byref, _check, _dtype_name, _enum, _kva_dtype, _tensor,
                   dtype_code)


class Cache:
    """kva_cache: a paged KV cache of num_blocks blocks of block_size tokens.
    NHD: K [NB, B, Hkv, D], V [NB, B, Hkv, Dv]; HND: K [NB, Hkv, B, D], ...

    Cache(ctx, ...) allocates it (quantized formats take their static scales
    here: host float32 arrays of length 1, Hkv or Hkv*D); Cache.from_tensors
    wraps caller-owned K/V tensors without copying.

    kind="mla": a latent cache (docs/mla.md), one row [c_kv (Dc) | k_pe (Dr)]
    per token: num_kv_heads=1, head_dim=Dc + Dr, head_dim_v=Dc;
    Cache.mla(ctx, num_blocks, block_size, kv_lora_rank, qk_rope_head_dim,
    ...) says the same with DeepSeek's names; quant="fp8_ds_mla" is
    FlashMLA's 656-byte FP8 row (docs/mla_sparse.md), read by sparse plans.

    kind="index": the lightning indexer's key cache (docs/indexer.md), one
    key row of D values per token; Cache.index(ctx, num_blocks, block_size,
    head_dim, fp8=True) makes the FP8_TOKEN one (codes and a per-token
    scale), write(keys, None, slot_mapping) fills it."""

    def __init__(self, ctx, num_blocks, block_size, num_kv_heads, head_dim, head_dim_v=0,
                 dtype="f16", layout="NHD", quant="none", k_scale=None, k_offset=None,
                 v_scale=None, v_offset=None, kind="mha"):
        self.ctx = ctx
        d = L.CacheDesc(num_blocks, block_size, num_kv_heads, head_dim, head_dim_v,
                        dtype_code(dtype), _enum(L.LAYOUTS, layout, "layout"),
                        _enum(L.QUANTS, quant, "quant"), _enum(L.KINDS, kind, "kind"))
        arrays = [None if a is None else T.host_array(a, np.float32, n).reshape(-1)
                  for a, n in ((k_scale, "k_scale"), (k_offset, "k_offset"),
                               (v_scale, "v_scale"), (v_offset, "v_offset"))]
        params = None
        if any(a is not None for a in arrays):
            fields = []
            for a in arrays:
                fields += [_array_ptr(a), 0 if a is None else a.size]
            params = _byref(L.QuantParams(*fields))
        h = ctypes.c_void_p()
        with ctx._lock:
            _check(L.kva_cache_create_quant(ctx._h, _byref(d), params, _byref(h)))
        self._h, self._mem = h.value, _CacheMemory(h.value, ())
        self._load_desc()

    @classmethod
    def mla(cls, ctx, num_blocks, block_size, kv_lora_rank=512, qk_rope_head_dim=64,
            dtype="bf16", quant="none", k_scale=None):
        """A latent (MLA) cache of rows [c_kv | k_pe]: [NB, B, Dc + Dr] with
        Dc = kv_lora_rank, Dr = qk_rope_head_dim; quant "none", "fp8_e4m3"
        (one per-tensor k_scale) or, with dtype="fp8_e4m3", "fp8_ds_mla"
        (FlashMLA's packed rows, which sparse MLA plans read)."""
        return cls(ctx, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim,
                   kv_lora_rank, dtype=dtype, quant=quant, k_scale=k_scale, kind="mla")

    @classmethod
    def index(cls, ctx, num_blocks, block_size, head_dim=128, fp8=True, dtype="bf16"):
        """An index-key cache (kind "index") of [NB, B] rows of head_dim:
        FP8_TOKEN (e4m3 codes, one float32 scale per token, vLLM's indexer
        k cache) when fp8, else unquantized in dtype (f32/f16/bf16)."""
        fp8 = L._flag(fp8, "fp8")
        return cls(ctx, num_blocks, block_size, 1, head_dim, head_dim,
                   dtype="fp8_e4m3" if fp8 else dtype, quant="fp8_token" if fp8 else "none",
                   kind="index")

    @classmethod
    def from_latent(cls, ctx, kv, kv_lora_rank=512):
        """Wraps a caller-owned latent cache kv [NB, B, Dc + Dr] (rows
        [c_kv | k_pe], contiguous, f32/f16/bf16; Dc = kv_lora_rank) as an MLA
        cache, without copying (kva_cache_create_from); the cache keeps kv
        alive. A read-only array is refused (the cache writes into it)."""
        v = _kva_dtype(_tensor(kv, "kv", ctx, writable=True), kv, "kv")
        if len(v.shape) != 3:
            raise ShapeMismatchError("kv: expected [NB, B, Dc + Dr] (3-D), got %s" % (v.shape,))
        nb, bs, d = v.shape
        return cls._wrap(ctx, v.ptr, None, nb, bs, 1, d, kv_lora_rank, v.dtype, 0, (kv,),
                         kind=L.KINDS["mla"])

    @classmethod
    def from_tensors(cls, ctx, k, v, layout="NHD"):
        """Wraps caller-owned storage (kva_cache_create_from): k [NB, B, Hkv, D]
        and v [NB, B, Hkv, Dv] for NHD ([NB, Hkv, B, D] for HND), contiguous,
        f32/f16/bf16, on the context's device. The tensors are kept alive by
        the cache; writes through the cache are visible in them (a read-only
        array is refused)."""
        kv = _kva_dtype(_tensor(k, "k", ctx, writable=True), k, "k")
        vv = _kva_dtype(_tensor(v, "v", ctx, writable=True), v, "v")
        if len(kv.shape) != 4 or len(vv.shape) != 4:
            raise ShapeMismatchError("k, v: expected 4-D tensors, got %s and %s"
                                     % (kv.shape, vv.shape))
        if kv.dtype != vv.dtype:
            raise DtypeMismatchError("k, v: dtypes %s and %s differ"
                                     % (_dtype_name(kv.dtype), _dtype_name(vv.dtype)))
        lay = _enum(L.LAYOUTS, layout, "layout")
        nb, a, b, d = kv.shape
        bs, hkv = (a, b) if lay == 0 else (b, a)
        if tuple(vv.shape[:3]) != tuple(kv.shape[:3]):
            raise ShapeMismatchError("v: shape %s does not match k %s in the first three dims"
                                     % (vv.shape, kv.shape))
        return cls._wrap(ctx, kv.ptr, vv.ptr, nb, bs, hkv, d, vv.shape[3], kv.dtype, lay, (k, v))

    @classmethod
    def from_interleaved(cls, ctx, kv, layout="NHD"):
        """Wraps FlashInfer's 5-D paged cache (kva_cache_create_from_interleaved):
        kv [NP, 2, B, Hkv, D] (NHD) or [NP, 2, Hkv, B, D] (HND), contiguous. The
        cache has 2*NP - 1 blocks; page p is block 2p (block tables and slots
        name 2p). A read-only array is refused (the cache writes into it)."""
        v = _kva_dtype(_tensor(kv, "kv", ctx, writable=True), kv, "kv")
        if len(v.shape) != 5 or v.shape[1] != 2:
            raise ShapeMismatchError("kv: expected [NP, 2, ...] (5-D), got %s" % (v.shape,))
        lay = _enum(L.LAYOUTS, layout, "layout")
        np_, _, a, b, d = v.shape
        bs, hkv = (a, b) if lay == 0 else (b, a)
        return cls._wrap(ctx, v.ptr, None, np_, bs, hkv, d, d, v.dtype, lay, (kv,))

    @classmethod
    def _wrap(cls, ctx, kptr, vptr, nb, bs, hkv, d, dv, dtype, layout, owners, kind=0):
        """vptr None: kptr is interleaved storage of nb pages (kind 0) or
        latent rows (kind MLA)."""
        self = cls.__new__(cls)
        self.ctx = ctx
        desc = L.CacheDesc(nb, bs, hkv, d, dv, dtype, layout, 0, kind)
        h = ctypes.c_void_p()
        if kind:
            with ctx._lock:
                _check(L.kva_cache_create_from(ctx._h, _byref(desc), kptr, None, _byref(h)))
        elif vptr is None:
            with ctx._lock:
                _check(L.kva_cache_create_from_interleaved(ctx._h, _byref(desc), kptr, _byref(h)))
        else:
            with ctx._lock:
                _check(L.kva_cache_create_from(ctx._h, _byref(desc), kptr, vptr, _byref(h)))
        self._h, self._mem = h.value, _CacheMemory(h.value, owners)
        self._load_desc()
        return self

    def _load_desc(self):
        d = L.CacheDesc()
        _check(L.kva_cache_get_desc(self._h, _byref(d)))
        self.num_blocks, self.block_size = d.num_blocks, d.block_size
        self.num_kv_heads, self.head_dim, self.head_dim_v = d.num_kv_heads, d.head_dim, d.head_dim_v
        self.dtype_code = d.dtype
        self.dtype = L.DTYPE_NAMES[d.dtype]
        self.layout = {v: k for k, v in L.LAYOUTS.items()}[d.layout]
        self.quant = {v: k for k, v in L.QUANTS.items()}[d.quant]
        self.kind = {v: k for k, v in L.KINDS.items()}[d.kind]
        self._sig = (d.block_size, d.num_kv_heads, d.head_dim, d.head_dim_v, d.kind)

    def write(self, k, v, slot_mapping):
        """reshape_and_cache: k [T, Hkv, D], v [T, Hkv, Dv] (f32/f16/bf16; the
        token dimension may be strided, e.g. slices of a fused QKV output),
        slot_mapping [T] int64 (slot = block * B + offset, < 0 skips), all on
        the context's device. MLA caches (concat_and_cache_mla): k = c_kv
        [T, Dc], v = k_pe [T, Dr] (or [T, 1, Dc], [T, 1, Dr]). Index-key
        caches: k = keys [T, D] (or [T, 1, D]), v = None."""
        ctx = self.ctx
        kv = _kva_dtype(_tensor(k, "k", ctx, contiguous=False), k, "k")
        if self.kind == "index":
            return self._write_index(kv, v, slot_mapping)
        vv = _kva_dtype(_tensor(v, "v", ctx, contiguous=False), v, "v")
        if self.kind == "mla":
            return self._write_latent(kv, vv, slot_mapping)
        if len(kv.shape) != 3 or len(vv.shape) != 3:
            raise ShapeMismatchError("k, v: expected [T, Hkv, D] tensors, got %s and %s"
                                     % (kv.shape, vv.shape))
        n = kv.shape[0]
        if tuple(kv.shape) != (n, self.num_kv_heads, self.head_dim):
            raise ShapeMismatchError("k: shape %s, expected (%d, %d, %d)"
                                     % (kv.shape, n, self.num_kv_heads, self.head_dim))
        if tuple(vv.shape) != (n, self.num_kv_heads, self.head_dim_v):
            raise ShapeMismatchError("v: shape %s, expected (%d, %d, %d)"
                                     % (vv.shape, n, self.num_kv_heads, self.head_dim_v))
        if kv.dtype != vv.dtype:
            raise DtypeMismatchError("k, v: dtypes %s and %s differ"
                                     % (_dtype_name(kv.dtype), _dtype_name(vv.dtype)))
        # Every token's row, a single token's too: kva_cache_write reads the
        # Hkv * D elements of a row contiguously whatever the token count.
        for t, name in ((kv, "k"), (vv, "v")):
            if t.shape[1] * t.shape[2] > 1 and (
                    t.strides[2] != 1 or t.strides[1] != t.shape[2] and t.shape[1] > 1):
                raise InvalidArgumentError(
                    "%s: heads and channels of a token must be contiguous (strides %s)"
                    % (name, t.strides))
        self._write(kv, vv, n, slot_mapping)

    def _write(self, kv, vv, n, slot_mapping):
        """kva_cache_write of n tokens from the checked views kv, vv (None:
        an index-key cache's write)."""
        ctx = self.ctx
        for t, name in ((kv, "k"), (vv, "v")):
            if t is not None and n > 1 and t.strides[0] == 0:
                raise InvalidArgumentError(
                    "%s: token stride 0 (a broadcast view), which kva_cache_write reads as "
                    "contiguous: pass a copy" % name)
        if ctx.device == T.CPU and not isinstance(slot_mapping, np.ndarray) and \
                not T.is_torch(slot_mapping):  # a list: checked, not truncated ([2.7] -> 2)
            slot_mapping = T.host_array(slot_mapping, np.int64, "slot_mapping")
        sv = _tensor(slot_mapping, "slot_mapping", ctx, (n,), T.I64)
        with ctx._lock:
            _check(L.kva_cache_write(ctx._h, self._h, n, kv.ptr, kv.strides[0] if n > 1 else 0,
                                     vv.ptr if vv else None, vv.strides[0] if vv and n > 1 else 0,
                                     kv.dtype, sv.ptr))

    def _write_index(self, kv, v, slot_mapping):
        if v is not None:
            raise InvalidArgumentError("v: an index-key cache has no values; pass v=None")
        n, d = kv.shape[0] if kv.shape else 0, self.head_dim
        if tuple(kv.shape) not in ((n, d), (n, 1, d)):
            raise ShapeMismatchError("k (keys): shape %s, expected (%d, %d)"
                                     % (tuple(kv.shape), n, d))
        if kv.strides[-1] != 1 and d > 1:
            raise InvalidArgumentError("k (keys): channels of a token must be contiguous "
                                       "(strides %s)" % (kv.strides,))
        self._write(kv, None, n, slot_mapping)

    def _write_latent(self, kv, vv, slot_mapping):
        dc, dr = self.head_dim_v, self.head_dim - self.head_dim_v
        n = kv.shape[0] if kv.shape else 0
        for t, name, width in ((kv, "k (c_kv)", dc), (vv, "v (k_pe)", dr)):
            if tuple(t.shape) not in ((n, width), (n, 1, width)):
                raise ShapeMismatchError("%s: shape %s, expected (%d, %d)"
                                         % (name, tuple(t.shape), n, width))
            if t.strides[-1] != 1 and width > 1:
                raise InvalidArgumentError("%s: channels of a token must be contiguous "
                                           "(strides %s)" % (name, t.strides))
        if kv.dtype != vv.dtype:
            raise DtypeMismatchError("k, v: dtypes %s and %s differ"
                                     % (_dtype_name(kv.dtype), _dtype_name(vv.dtype)))
        self._write(kv, vv, n, slot_mapping)

    def copy_blocks(self, pairs):
        """Copies whole blocks inside this cache: pairs [n, 2] of (src, dst) ids
        (host array or list on every backend)."""
        p = _pairs(pairs)
        with self.ctx._lock:
            _check(L.kva_cache_copy_blocks(self.ctx._h, self._h, _array_ptr(p), p.shape[0]))

    def swap_blocks(self, dst, pairs, ctx=None):
        """Copies blocks of this cache into cache dst (same shape except NB),
        pairs [n, 2] of (src block, dst block); ctx performs the copy (default:
        the CUDA one of the two, else this cache's)."""
        if ctx is None:
            ctx = dst.ctx if dst.ctx.backend == "cuda" else self.ctx
        p = _pairs(pairs)
        with ctx._lock:
            _check(L.kva_cache_swap_blocks(ctx._h, self._h, dst._h, _array_ptr(p), p.shape[0]))

    def _host_view(self, which):
        if self.ctx.device != T.CPU:
            raise InvalidArgumentError("k_array/v_array: the cache is in device memory")
        kp, vp = ctypes.c_void_p(), ctypes.c_void_p()
        _check(L.kva_cache_data(self._h, _byref(kp), _byref(vp)))
        d = self.head_dim if which == "k" else self.head_dim_v
        dt = self.dtype_code
        if self.quant in ("int8_token_k", "int8_token_k_v16") and which == "k":
            dt = L.DTYPES["i8"]
        nb, b, h = self.num_blocks, self.block_size, self.num_kv_heads
        # The packed formats (kvattn.h): an fp8_ds_mla row is Dc codes, Dc / 128
        # float32 tile scales and Dr bf16 k_pe, token after token, so the view
        # is [NB, B, 1, row bytes]; an FP8_TOKEN block is its B rows of D codes
        # then B float32 scales, so the view is the codes at a block stride of
        # B * (D + 4) bytes. kva_cache_block_bytes_k is the whole block.
        packed = self.quant if which == "k" else None
        block = L.kva_cache_block_bytes_k(self._h)
        if packed == "fp8_ds_mla":
            d = block // b
        nbytes = nb * b * h * d * L.DTYPE_SIZES[dt]
        if packed == "fp8_token":
            nbytes = nb * block
        buf = (ctypes.c_uint8 * nbytes).from_address(kp.value if which == "k" else vp.value)
        raw_dt = {0: np.float32, 1: np.float16, 2: np.uint16, 3: np.int8, 4: np.uint8,
                  5: np.uint8}[dt]
        buf._kva_cache = self._mem  # the view's base keeps the storage alive, even past close()
        a = np.frombuffer(buf, dtype=raw_dt)
        if packed == "fp8_token":  # Hkv = 1: NHD and HND differ in the axis order only
            shape = (nb, b, h, d) if self.layout == "NHD" else (nb, h, b, d)
            return np.lib.stride_tricks.as_strided(a, shape, (block, d, d, 1))
        return a.reshape((nb, b, h, d) if self.layout == "NHD" else (nb, h, b, d))

    def k_array(self):
        """Host caches: a numpy view of the K storage ([NB, B, Hkv, D] for NHD,
        [NB, Hkv, B, D] for HND; bf16 as uint16, fp8 as uint8 codes;
        fp8_ds_mla: the packed rows [NB, B, 1, row bytes]; FP8_TOKEN: the
        codes [NB, B, 1, D], each block's scales outside the view). The
        view keeps the storage alive (close() frees it when the last view goes)."""
        return np.asarray(self._host_view("k"))

    def v_array(self):
        """Host caches: a numpy view of the V storage (as k_array). MLA: the
        first Dc columns of the latent rows (a strided view of k_array)."""
        if self.kind == "mla":
            return self.k_array()[..., : self.head_dim_v]
        if self.kind == "index":
            raise InvalidArgumentError("v_array: an index-key cache has no values")
        return self._host_view("v")

    def close(self):
        """Frees the cache now, or, while k_array() / v_array() views of its
        storage live, when the last of them goes; the Cache is unusable after."""
        if getattr(self, "_h", None):
            self._h = None
            self._mem = None  # the last reference unless a view holds it

    __del__ = close

    def __repr__(self):
        return ("kvattn.Cache(num_blocks=%d, block_size=%d, num_kv_heads=%d, head_dim=%d, "
                "head_dim_v=%d, dtype=%r, layout=%r, quant=%r, kind=%r)"
                % (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim,
                   self.head_dim_v, self.dtype, self.layout, self.quant, self.kind))


class _CacheMemory:
    """A kva_cache handle and the tensors it wraps, destroyed with the last
    reference to it: its Cache's (dropped by close()) or a k_array() /
    v_array() view's, which reads the storage."""

    __slots__ = ("h", "owners")

    def __init__(self, h, owners):
        self.h, self.owners = h, owners

    def __del__(self):
        if self.h:
            L.kva_cache_destroy(self.h)
            self.h = None


def _pairs(pairs):
    """(src, dst) block pairs as a host int32 array [n, 2]."""
    p = T.host_array(pairs, np.int32, "pairs")
    # [n, 2], or one flat list of pairs; any other shape ([2, 3] reshaped to
    # three pairs) would copy blocks the caller did not name.
    if (p.ndim == 2 and p.shape[1] != 2) or p.ndim > 2 or p.size % 2:
        raise ShapeMismatchError("pairs: shape %s, expected [n, 2] (src, dst) pairs"
                                 % (p.shape,))
    return p.reshape(-1, 2)
