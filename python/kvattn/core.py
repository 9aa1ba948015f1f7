"""The Pythonic core API, one class per C object of include/kvattn.h:
Context, Cache, Plan (with run / run_ragged), merge_states, Pool.

Every method is a thin layer over one C call: arguments are checked for what
C cannot see (tensor shapes, dtypes and devices behind raw pointers), then
the call is made and a non-OK status raises the matching KvaError subclass
with kva_last_error()'s message.
"""

import ctypes
import os
import sys

import numpy as np

from . import _errors
from . import _lib as L
from . import _tensor as T
from ._errors import (
    DtypeMismatchError,
    InvalidArgumentError,
    ShapeMismatchError,
)

_check = _errors.check
_byref = ctypes.byref


def version():
    """The linked library's "MAJOR.MINOR.PATCH"."""
    return L.kva_version().decode()


def backend_available(backend):
    """True if backend ("ref", "cpu", "cuda") is compiled in and can run here."""
    return bool(L.kva_backend_available(_enum(L.BACKENDS, backend, "backend")))


def _enum(table, value, name):
    if isinstance(value, int) and value in table.values():
        return value
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError("%s: %r is not one of %s" % (name, value, sorted(table)))


def dtype_code(dtype):
    """kva_dtype of a name ("f16"), a numpy dtype or a torch dtype."""
    if isinstance(dtype, int) and dtype in L.DTYPE_NAMES:
        return dtype
    if isinstance(dtype, str) and dtype in L.DTYPES:
        return L.DTYPES[dtype]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        if not T._TORCH_DTYPES:
            T._torch_dtypes(torch)
        code = T._TORCH_DTYPES.get(dtype, -1)
    else:
        try:
            nd = np.dtype(dtype)
        except TypeError:
            nd = None
        code = -1  # a non-native byte order ('>f2', big-endian bfloat16) is none
        if nd is not None and nd.isnative:
            code = T._NP_DTYPES.get(nd, T._NP_NAMES.get(nd.name, -1))
    if code not in L.DTYPE_NAMES:
        raise InvalidArgumentError("dtype %r is not a kvattn dtype (%s)" % (dtype, list(L.DTYPES)))
    return code


def _tensor(x, name, ctx, shape=None, dtype=None, contiguous=True, writable=False):
    """View of tensor argument x, checked against the expected shape, dtype
    and the context's device; writable: an output (a read-only numpy array
    is refused rather than written through its pointer)."""
    v = T.view(x, name)
    if writable and isinstance(x, np.ndarray) and not x.flags.writeable:
        raise InvalidArgumentError("%s: the array is read-only" % name)
    if v.device != ctx.device or (v.device_id != ctx.device_id and ctx.device != T.CPU):
        raise InvalidArgumentError(
            "%s: tensor on %s:%d, but the context's backend %s computes on %s:%d"
            % (name, v.device, v.device_id, ctx.backend, ctx.device, ctx.device_id)
        )
    if dtype is not None and v.dtype != dtype:
        raise DtypeMismatchError(
            "%s: dtype %s, expected %s" % (name, _dtype_name(v.dtype), _dtype_name(dtype))
        )
    if shape is not None and tuple(v.shape) != shape:
        raise ShapeMismatchError("%s: shape %s, expected %s" % (name, tuple(v.shape), shape))
    if contiguous and not v.contiguous():
        raise InvalidArgumentError("%s: must be contiguous (strides %s)" % (name, v.strides))
    return v


def _kva_dtype(v, x, name):
    """Refuses a tensor whose dtype is no kva_dtype (float64, int32, a
    non-native byte order): DtypeMismatchError naming it, where C would see
    an invalid code (or Python fail on it)."""
    if v.dtype not in L.DTYPE_NAMES:
        raise DtypeMismatchError("%s: dtype %s is not a kvattn dtype (%s)"
                                 % (name, getattr(x, "dtype", "?"), ", ".join(L.DTYPES)))
    return v


def _dtype_name(code):
    return {T.I32: "int32", T.I64: "int64"}.get(code, L.DTYPE_NAMES.get(code, "unsupported"))


class Context:
    """kva_context: a backend ("ref", "cpu" or "cuda"), its threads or device,
    and its scratch workspace. Use from one thread at a time."""

    def __init__(self, backend="cpu", num_threads=0, device_id=0):
        d = L.ContextDesc(_enum(L.BACKENDS, backend, "backend"), num_threads, device_id)
        h = ctypes.c_void_p()
        _check(L.kva_context_create(_byref(d), _byref(h)))
        self._h = h.value
        self.backend = {v: k for k, v in L.BACKENDS.items()}[d.backend]
        self.device = T.CUDA if self.backend == "cuda" else T.CPU
        self.device_id = device_id if self.backend == "cuda" else 0
        self._stream = None
        self._plan_descs = {}  # kva_plan_desc templates by attention shape (Plan)

    @property
    def num_threads(self):
        return L.kva_context_num_threads(self._h)

    def set_stream(self, stream):
        """CUDA: run this context's calls on `stream` (a torch.cuda.Stream, or
        a cudaStream_t address as int; None = the legacy default stream)."""
        addr = getattr(stream, "cuda_stream", stream)
        if addr != self._stream:
            _check(L.kva_cuda_context_set_stream(self._h, addr))
            self._stream = addr

    def close(self):
        if getattr(self, "_h", None):
            L.kva_context_destroy(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "kvattn.Context(backend=%r, device_id=%d)" % (self.backend, self.device_id)


_default_contexts = {}


def default_context(device="cpu", device_id=0):
    """A process-wide context per device: the CPU backend for "cpu", the CUDA
    backend on device_id for "cuda" (created on first use, and again after a
    caller closed it)."""
    key = (device, device_id if device == "cuda" else 0)
    ctx = _default_contexts.get(key)
    if ctx is None or not ctx._h:  # closed by a caller (`with default_context() as c:`)
        ctx = Context("cuda" if device == "cuda" else "cpu", 0, key[1])
        _default_contexts[key] = ctx
    return ctx


def _array_ptr(a):
    return T.address(a) if a is not None else None


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
        _check(L.kva_cache_create_quant(ctx._h, _byref(d), params, _byref(h)))
        self._h, self._mem = h.value, _CacheMemory(h.value, ())
        self._load_desc()

    @classmethod
    def mla(cls, ctx, num_blocks, block_size, kv_lora_rank=512, qk_rope_head_dim=64,
            dtype="bf16", quant="none", k_scale=None):
        """A latent (MLA) cache of rows [c_kv | k_pe]: [NB, B, Dc + Dr] with
        Dc = kv_lora_rank, Dr = qk_rope_head_dim; quant "none" or "fp8_e4m3"
        (one per-tensor k_scale)."""
        return cls(ctx, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim,
                   kv_lora_rank, dtype=dtype, quant=quant, k_scale=k_scale, kind="mla")

    @classmethod
    def index(cls, ctx, num_blocks, block_size, head_dim=128, fp8=True, dtype="bf16"):
        """An index-key cache (kind "index") of [NB, B] rows of head_dim:
        FP8_TOKEN (e4m3 codes, one float32 scale per token, vLLM's indexer
        k cache) when fp8, else unquantized in dtype (f32/f16/bf16)."""
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
            _check(L.kva_cache_create_from(ctx._h, _byref(desc), kptr, None, _byref(h)))
        elif vptr is None:
            _check(L.kva_cache_create_from_interleaved(ctx._h, _byref(desc), kptr, _byref(h)))
        else:
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
        for t, name in ((kv, "k"), (vv, "v")):
            if n > 1 and t.shape[1] * t.shape[2] > 1 and (
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
        _check(L.kva_cache_copy_blocks(self.ctx._h, self._h, _array_ptr(p), p.shape[0]))

    def swap_blocks(self, dst, pairs, ctx=None):
        """Copies blocks of this cache into cache dst (same shape except NB),
        pairs [n, 2] of (src block, dst block); ctx performs the copy (default:
        the CUDA one of the two, else this cache's)."""
        if ctx is None:
            ctx = dst.ctx if dst.ctx.backend == "cuda" else self.ctx
        p = _pairs(pairs)
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
        shape = (nb, b, h, d) if self.layout == "NHD" else (nb, h, b, d)
        nbytes = nb * b * h * d * L.DTYPE_SIZES[dt]
        buf = (ctypes.c_uint8 * nbytes).from_address(kp.value if which == "k" else vp.value)
        raw_dt = {0: np.float32, 1: np.float16, 2: np.uint16, 3: np.int8, 4: np.uint8,
                  5: np.uint8}[dt]
        buf._kva_cache = self._mem  # the view's base keeps the storage alive, even past close()
        return np.frombuffer(buf, dtype=raw_dt).reshape(shape)

    def k_array(self):
        """Host caches: a numpy view of the K storage ([NB, B, Hkv, D] for NHD,
        [NB, Hkv, B, D] for HND; bf16 as uint16, fp8 as uint8 codes). The
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


class PlanInfo:
    """kva_plan_info as attributes (state is a name such as "decode_only")."""

    __slots__ = [f for f, _ in L.PlanInfo._fields_]

    def __init__(self, c):
        for f in self.__slots__:
            setattr(self, f, getattr(c, f))
        self.state = L.STATES.get(self.state, str(self.state))

    def __repr__(self):
        return "PlanInfo(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f in self.__slots__)


class Plan:
    """kva_plan: one step's batch metadata, validated and partitioned for the
    context's backend. query_start_loc [R+1], seq_lens [R] and block_table
    [R, max_blocks] are host int32 arrays (lists, numpy or torch; CUDA
    tensors are copied to the host); block_table may be None for plans used
    only with run_ragged.

    kind="mla" plans read latent caches (num_kv_heads=1, head_dim=Dc + Dr,
    head_dim_v=Dc, an explicit scale): run() is the absorbed kernel-level
    call; with mla_qk_nope_head_dim (Dn) and mla_v_head_dim (Dv) given,
    run_mla() is the layer-level kva_mla_run; with sparse_topk=K (and
    sparse_mode "mixed" or "separate"), run_mla_sparse() is DeepSeek V3.2's
    sparse MLA (kva_mla_sparse_run, docs/mla_sparse.md).

    kind="index" plans (num_heads = index heads Hi, num_kv_heads=1,
    head_dim=D, sparse_topk=K, causal) run the lightning indexer over an
    index-key cache: run_indexer() (kva_indexer_run, docs/indexer.md);
    index_q_quant="fp8_token" quantizes q per token and head to e4m3 first
    (s = max(amax / 448, FLT_MIN), as the FP8_TOKEN key rows) and scores
    with code * s, as DeepSeek's inference code does."""

    def __init__(self, ctx, query_start_loc, seq_lens, block_table=None, *, block_size,
                 num_heads, num_kv_heads, head_dim, head_dim_v=0, q_dtype="f16", scale=0.0,
                 causal=True, window_left=-1, softcap=0.0, alibi_slopes=None,
                 decode_threshold=0, kind="mha", mla_qk_nope_head_dim=0, mla_v_head_dim=0,
                 sparse_topk=0, sparse_mode="mixed", index_q_quant="none"):
        qsl, sl, bt, stride = self._batch(query_start_loc, seq_lens, block_table)
        al = None
        if alibi_slopes is not None:
            al = T.host_array(alibi_slopes, np.float32, "alibi_slopes")
            if al.shape != (num_heads,):
                raise ShapeMismatchError("alibi_slopes: shape %s, expected (%d,)"
                                         % (al.shape, num_heads))
        # A context's plans usually share their attention shape: the descriptor
        # is a per-context template whose batch fields are set here (contexts
        # are used from one thread at a time, so the template is too).
        key = (block_size, num_heads, num_kv_heads, head_dim, head_dim_v, q_dtype, scale,
               causal, window_left, softcap, decode_threshold, kind, mla_qk_nope_head_dim,
               mla_v_head_dim, sparse_topk, sparse_mode, index_q_quant)
        try:
            tmpl = ctx._plan_descs.get(key)
        except TypeError:  # an unhashable argument (q_dtype=["f16"]): no template,
            key, tmpl = None, None  # the checks below raise for it
        if tmpl is None:
            qdt = dtype_code(q_dtype)
            kc = _enum(L.KINDS, kind, "kind")
            d = L.PlanDesc(0, None, None, None, 0, block_size, decode_threshold, num_heads,
                           num_kv_heads, head_dim, head_dim_v, qdt, scale or 0.0,
                           1 if causal else 0, -1 if window_left is None else window_left,
                           softcap or 0.0, None, kc)
            i32 = L.c_int32
            d.mla_qk_nope_head_dim = L._fit(mla_qk_nope_head_dim, i32, "mla_qk_nope_head_dim")
            d.mla_v_head_dim = L._fit(mla_v_head_dim, i32, "mla_v_head_dim")
            d.sparse_topk = L._fit(sparse_topk, i32, "sparse_topk")
            d.sparse_mode = _enum(L.SPARSE_MODES, sparse_mode, "sparse_mode")
            d.index_q_quant = _enum(L.QUANTS, index_q_quant, "index_q_quant")
            if len(ctx._plan_descs) >= 64:
                ctx._plan_descs.clear()
            tmpl = (d, qdt, (block_size, num_kv_heads, head_dim, head_dim_v or head_dim, kc))
            if key is not None:
                ctx._plan_descs[key] = tmpl
        d, qdt, self._cache_sig = tmpl
        self._desc, self._alibi = d, al
        self.ctx, self.q_dtype = ctx, qdt
        self.block_size, self.num_heads, self.num_kv_heads = block_size, num_heads, num_kv_heads
        self.head_dim, self.head_dim_v = head_dim, head_dim_v or head_dim
        self._mla = (mla_qk_nope_head_dim, mla_v_head_dim) if mla_v_head_dim else None
        self.kind, self.sparse_topk = kind, sparse_topk
        self._h = None
        self._plan(qsl, sl, bt, stride, None)

    @staticmethod
    def _batch(query_start_loc, seq_lens, block_table):
        qsl = T.host_array(query_start_loc, np.int32, "query_start_loc")
        sl = T.host_array(seq_lens, np.int32, "seq_lens")
        r = sl.shape[0]
        if qsl.ndim != 1 or sl.ndim != 1 or qsl.shape[0] != r + 1:
            raise ShapeMismatchError("query_start_loc %s must be [R+1] for seq_lens %s [R]"
                                     % (qsl.shape, sl.shape))
        bt, stride = None, 0
        if block_table is not None:
            bt = T.host_array(block_table, np.int32, "block_table")
            if bt.ndim != 2 or bt.shape[0] != r:
                raise ShapeMismatchError("block_table: shape %s, expected (%d, max_blocks)"
                                         % (bt.shape, r))
            stride = bt.shape[1]
        return qsl, sl, bt, stride

    def _plan(self, qsl, sl, bt, stride, ctx):
        """kva_plan_create (ctx None) or kva_plan_update on ctx with the batch arrays."""
        d, r = self._desc, sl.shape[0]
        d.num_requests = r
        d.query_start_loc = T.address(qsl)
        d.seq_lens = T.address(sl)
        d.block_table = None if bt is None else T.address(bt)
        d.block_table_stride = stride
        d.alibi_slopes = None if self._alibi is None else T.address(self._alibi)
        if ctx is None:
            h = ctypes.c_void_p()
            _check(L.kva_plan_create(self.ctx._h, _byref(d), _byref(h)))
            self._h = h.value
        else:
            _check(L.kva_plan_update(ctx._h, self._h, _byref(d)))
            self.ctx = ctx
        self.num_requests = r
        t = self.num_tokens = int(qsl[r])
        self._q_shape = (t, self.num_heads, self.head_dim)
        self._out_shape = (t, self.num_heads, self.head_dim_v)
        self._lse_shape = (t, self.num_heads)
        # run_ragged checks k / v against these lengths: a copy, since sl may be
        # the caller's own array (host_array copies only where needed), which
        # the caller may change while the C plan keeps the planned lengths.
        self._seq_lens = sl.copy() if bt is None else None

    def update(self, query_start_loc, seq_lens, block_table=None, *, ctx=None):
        """kva_plan_update: re-plans this plan in place for a new step's batch
        (same attention shape and options), reusing its memory; afterwards it
        is what Plan(ctx, query_start_loc, seq_lens, block_table, ...) with
        this plan's options would be. On an error the plan is unchanged.
        ctx defaults to the plan's context."""
        qsl, sl, bt, stride = self._batch(query_start_loc, seq_lens, block_table)
        self._plan(qsl, sl, bt, stride, ctx or self.ctx)
        return self

    @property
    def kv_len_total(self):
        """Rows of k/v run_ragged expects (sum of seq_lens); None for paged plans."""
        sl = self._seq_lens
        return None if sl is None else int(sl.sum(dtype=np.int64))

    @property
    def info(self):
        c = L.PlanInfo()
        _check(L.kva_plan_get_info(self._h, _byref(c)))
        return PlanInfo(c)

    def _outputs(self, q, qv, out, lse, return_lse, ctx, out_shape=None):
        out_shape = out_shape or self._out_shape
        if out is None:
            out = T.empty_like_device(q, out_shape, self.q_dtype, qv.device, qv.device_id)
        ov = _tensor(out, "out", ctx, out_shape, self.q_dtype, writable=True)
        lv = None
        if lse is None and return_lse:
            lse = T.empty_like_device(q, self._lse_shape, T.F32, qv.device, qv.device_id)
        if lse is not None:
            lv = _tensor(lse, "lse", ctx, self._lse_shape, T.F32, writable=True)
        return out, ov, lse, lv

    def _check_cache(self, cache):
        if cache._sig != self._cache_sig:
            raise ShapeMismatchError(
                "cache (B %d, Hkv %d, D %d, Dv %d, %s) does not match the plan (B %d, Hkv %d, "
                "D %d, Dv %d, %s)" % (cache.block_size, cache.num_kv_heads, cache.head_dim,
                                      cache.head_dim_v, cache.kind, self.block_size,
                                      self.num_kv_heads, self.head_dim, self.head_dim_v,
                                      {v: k for k, v in L.KINDS.items()}[self._cache_sig[4]]))

    def run_mla(self, q, w_uk, w_uv, cache, *, out=None, lse=None, return_lse=False, ctx=None):
        """Multi-head latent attention for one layer (kva_mla_run): q
        [T, H, Dn + Dr] (q_nope then q_pe, RoPE applied), w_uk [H, Dn, Dc]
        and w_uv [H, Dc, Dv] in the plan's q_dtype, cache a latent cache.
        Returns out [T, H, Dv], or (out, lse) as run(). Requests with q_len <=
        decode_threshold take the absorbed path, the others the
        compute-friendly one (docs/mla.md)."""
        ctx = ctx or self.ctx
        if self._mla is None:
            raise InvalidArgumentError("run_mla: the plan has no mla_qk_nope_head_dim / "
                                       "mla_v_head_dim (create it with kind='mla' and both)")
        dn, dv = self._mla
        t, h = self._lse_shape
        dc, dr = self.head_dim_v, self.head_dim - self.head_dim_v
        qv = _tensor(q, "q", ctx, (t, h, dn + dr), self.q_dtype)
        uk = _tensor(w_uk, "w_uk", ctx, (h, dn, dc), self.q_dtype)
        uv = _tensor(w_uv, "w_uv", ctx, (h, dc, dv), self.q_dtype)
        self._check_cache(cache)
        out, ov, lse, lv = self._outputs(q, qv, out, lse, return_lse, ctx, (t, h, dv))
        _check(L.kva_mla_run(ctx._h, self._h, qv.ptr, uk.ptr, uv.ptr, cache._h, ov.ptr,
                             lv.ptr if lv else None))
        return (out, lse) if lv else out

    def _index_rows(self, a, name, ctx, writable=False):
        """View of an index-list tensor [T, >= K] int32 whose rows may be
        strided (row stride in elements, 0 for one row); its pointer and stride."""
        t, k = self.num_tokens, self.sparse_topk
        v = _tensor(a, name, ctx, dtype=T.I32, contiguous=False, writable=writable)
        if len(v.shape) != 2 or v.shape[0] != t or v.shape[1] < k or (k > 1 and v.strides[1] != 1):
            raise ShapeMismatchError("%s: shape %s (strides %s), expected (%d, >= %d) int32 with "
                                     "contiguous rows" % (name, tuple(v.shape), v.strides, t, k))
        if t > 1 and v.strides[0] == 0:
            raise InvalidArgumentError("%s: row stride 0 (a broadcast view), which kvattn reads "
                                       "as contiguous rows: pass a copy" % name)
        return v, v.strides[0] if t > 1 else k

    def run_mla_sparse(self, q, cache, indices, *, topk_length=None, sinks=None, out=None,
                       lse=None, return_lse=False, ctx=None):
        """Sparse absorbed MLA (kva_mla_sparse_run): token t attends only the
        request-local key positions of its row indices[t, :K] (int32, -1 =
        unused; rows may be strided), of which it reads the first
        topk_length[t] (int32 [T]) when given. q [T, H, Dc + Dr] absorbed in
        the plan's q_dtype, cache a latent cache (bf16/f16/f32, fp8_e4m3 or
        fp8_ds_mla), sinks [H] float32 or None. Returns out [T, H, Dc], or
        (out, lse) as run()."""
        ctx = ctx or self.ctx
        if self.kind != "mla" or not self.sparse_topk:
            raise InvalidArgumentError("run_mla_sparse: the plan is not a sparse MLA plan "
                                       "(create it with kind='mla' and sparse_topk=K)")
        qv = _tensor(q, "q", ctx, self._q_shape, self.q_dtype)
        self._check_cache(cache)
        iv, istride = self._index_rows(indices, "indices", ctx)
        tv = None
        if topk_length is not None:
            tv = _tensor(topk_length, "topk_length", ctx, (self.num_tokens,), T.I32)
        out, ov, lse, lv = self._outputs(q, qv, out, lse, return_lse, ctx)
        _check(L.kva_mla_sparse_run(ctx._h, self._h, qv.ptr, cache._h, iv.ptr, istride,
                                    tv.ptr if tv else None, self._sinks(sinks, ctx), ov.ptr,
                                    lv.ptr if lv else None))
        return (out, lse) if lv else out

    def run_indexer(self, q, weights, cache, *, indices=None, topk_length=None,
                    return_lengths=False, ctx=None):
        """DeepSeek V3.2's lightning indexer (kva_indexer_run): q [T, Hi, D]
        index queries in the plan's q_dtype, weights [T, Hi] float32, cache an
        index-key cache. Token t at position pos lists the min(K, pos + 1)
        causal keys of the largest logits sum_h w[t, h] relu(q[t, h] . k_j),
        by logit descending (ties: lower position first), then -1 up to K.
        Returns indices [T, K] int32 (allocated like q unless given: rows may
        be strided), or (indices, topk_length [T] int32) when topk_length is
        given or return_lengths is set."""
        ctx = ctx or self.ctx
        if self.kind != "index":
            raise InvalidArgumentError("run_indexer: the plan is not an indexer plan "
                                       "(create it with kind='index' and sparse_topk=K)")
        t, k = self.num_tokens, self.sparse_topk
        qv = _tensor(q, "q", ctx, self._q_shape, self.q_dtype)
        wv = _tensor(weights, "weights", ctx, (t, self.num_heads), T.F32)
        self._check_cache(cache)
        if indices is None:
            indices = T.empty_like_device(q, (t, k), T.I32, qv.device, qv.device_id)
        iv, istride = self._index_rows(indices, "indices", ctx, writable=True)
        if topk_length is None and return_lengths:
            topk_length = T.empty_like_device(q, (t,), T.I32, qv.device, qv.device_id)
        tv = None
        if topk_length is not None:
            tv = _tensor(topk_length, "topk_length", ctx, (t,), T.I32, writable=True)
        _check(L.kva_indexer_run(ctx._h, self._h, qv.ptr, wv.ptr, cache._h, iv.ptr, istride,
                                 tv.ptr if tv else None))
        return (indices, topk_length) if tv else indices

    def _sinks(self, sinks, ctx):
        if sinks is None:
            return None
        return _tensor(sinks, "sinks", ctx, (self.num_heads,), T.F32).ptr

    def run(self, q, cache, *, out=None, lse=None, return_lse=False, sinks=None, ctx=None):
        """Attention over the paged cache (kva_attention_run). q [T, H, D] in
        the plan's q_dtype; returns out [T, H, Dv] (allocated like q when not
        given), or (out, lse) with lse [T, H] float32 natural-log sum-exp when
        lse is given or return_lse is set."""
        ctx = ctx or self.ctx
        qv = _tensor(q, "q", ctx, self._q_shape, self.q_dtype)
        self._check_cache(cache)
        out, ov, lse, lv = self._outputs(q, qv, out, lse, return_lse, ctx)
        _check(L.kva_attention_run(ctx._h, self._h, qv.ptr, cache._h, self._sinks(sinks, ctx),
                                   ov.ptr, lv.ptr if lv else None))
        return (out, lse) if lv else out

    def run_ragged(self, q, k, v, *, out=None, lse=None, return_lse=False, sinks=None, ctx=None):
        """Attention without a cache (kva_attention_run_ragged): k [sum(seq_lens),
        Hkv, D], v [sum(seq_lens), Hkv, Dv] in q_dtype, request r's keys at rows
        kv_start[r] .. (exclusive prefix sum of seq_lens). Returns as run."""
        ctx = ctx or self.ctx
        if self.kv_len_total is None:
            raise InvalidArgumentError("run_ragged: plan was created with a block_table; "
                                       "create it with block_table=None")
        qv = _tensor(q, "q", ctx, self._q_shape, self.q_dtype)
        n = self.kv_len_total
        kv = _tensor(k, "k", ctx, (n, self.num_kv_heads, self.head_dim), self.q_dtype)
        vv = _tensor(v, "v", ctx, (n, self.num_kv_heads, self.head_dim_v), self.q_dtype)
        out, ov, lse, lv = self._outputs(q, qv, out, lse, return_lse, ctx)
        _check(L.kva_attention_run_ragged(ctx._h, self._h, qv.ptr, kv.ptr, vv.ptr,
                                          self._sinks(sinks, ctx), ov.ptr,
                                          lv.ptr if lv else None))
        return (out, lse) if lv else out

    def close(self):
        if getattr(self, "_h", None):
            L.kva_plan_destroy(self._h)
            self._h = None

    __del__ = close


def run(plan, q, cache, **kw):
    """kva_attention_run: the same as plan.run(q, cache, **kw)."""
    return plan.run(q, cache, **kw)


def merge_states(out_a, lse_a, out_b, lse_b, *, out=None, lse=None, ctx=None):
    """kva_merge_states: merges two partial results over disjoint key sets.
    out_a, out_b [T, H, Dv] (f32/f16/bf16), lse_a, lse_b [T, H] float32
    natural-log; out / lse may alias the inputs. Returns (out, lse)."""
    av = T.view(out_a, "out_a")
    if ctx is None:
        ctx = default_context(av.device, av.device_id)
    if len(av.shape) != 3:
        raise ShapeMismatchError("out_a: expected [T, H, Dv], got %s" % (av.shape,))
    _kva_dtype(av, out_a, "out_a")
    shape, dt = tuple(av.shape), av.dtype
    av = _tensor(out_a, "out_a", ctx, shape, dt)
    bv = _tensor(out_b, "out_b", ctx, shape, dt)
    la = _tensor(lse_a, "lse_a", ctx, shape[:2], T.F32)
    lb = _tensor(lse_b, "lse_b", ctx, shape[:2], T.F32)
    if out is None:
        out = T.empty_like_device(out_a, shape, dt, av.device, av.device_id)
    if lse is None:
        lse = T.empty_like_device(out_a, shape[:2], T.F32, av.device, av.device_id)
    ov = _tensor(out, "out", ctx, shape, dt, writable=True)
    lv = _tensor(lse, "lse", ctx, shape[:2], T.F32, writable=True)
    _check(L.kva_merge_states(ctx._h, shape[0], shape[1], shape[2], dt, av.ptr, la.ptr, bv.ptr,
                              lb.ptr, ov.ptr, lv.ptr))
    return out, lse


def reorder_decode_first(q_lens, decode_threshold=0):
    """kva_batch_reorder_decode_first: (perm [R] int32, num_decodes)."""
    ql = T.host_array(q_lens, np.int32, "q_lens")
    if ql.ndim != 1:
        raise ShapeMismatchError("q_lens: shape %s, expected [R]" % (ql.shape,))
    perm = np.empty(ql.shape[0], np.int32)
    nd = ctypes.c_int32()
    _check(L.kva_batch_reorder_decode_first(ql.shape[0], _array_ptr(ql), decode_threshold,
                                            _array_ptr(perm), _byref(nd)))
    return perm, nd.value


def load_c8_scales(checkpoint_dir, layer, num_kv_heads_total, head_dim, tp_rank=0, tp_size=1):
    """kva_c8_scales_load: the layer's C8 scales as a dict of float32 numpy
    arrays (k_scale, k_offset, v_scale, v_offset; offsets may be None), ready
    for Cache(..., quant="int8_channel", **scales)."""
    try:  # str (undecodable bytes as surrogates), bytes or os.PathLike, as open() takes
        path = os.fsencode(checkpoint_dir)
    except TypeError:
        raise InvalidArgumentError("checkpoint_dir: a path (str, bytes or os.PathLike), got %s"
                                   % type(checkpoint_dir).__name__)
    p = ctypes.POINTER(L.C8Scales)()
    _check(L.kva_c8_scales_load(path, layer, num_kv_heads_total,
                                head_dim, tp_rank, tp_size, _byref(p)))
    try:
        prm = p.contents.params
        res = {}
        for f in ("k_scale", "k_offset", "v_scale", "v_offset"):
            ptr, n = getattr(prm, f), getattr(prm, f + "_len")
            res[f] = (np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).copy()
                      if ptr and n else None)
        return res
    finally:
        L.kva_c8_scales_free(p)

