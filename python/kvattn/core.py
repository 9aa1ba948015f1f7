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
import threading

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
    if L._is_bool(value):  # True == 1: a bool is no enum value
        raise InvalidArgumentError("%s: %r is not one of %s" % (name, value, sorted(table)))
    if isinstance(value, int) and value in table.values():
        return value
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError("%s: %r is not one of %s" % (name, value, sorted(table)))


def dtype_code(dtype):
    """kva_dtype of a name ("f16"), a numpy dtype or a torch dtype."""
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in L.DTYPE_NAMES:
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
    and its scratch workspace. C allows one thread at a time on a context;
    the package's calls through one hold its lock (_lock), so that objects
    sharing a context without the caller's knowledge (the FlashInfer
    wrappers and merge functions over default_context()) may run from
    several threads: their calls take turns."""

    def __init__(self, backend="cpu", num_threads=0, device_id=0):
        self._lock = threading.Lock()  # held by every C call through the context
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
            with self._lock:
                _check(L.kva_cuda_context_set_stream(self._h, addr))
            self._stream = addr

    def reserve(self, max_requests, max_tokens, max_block_table, num_heads, num_kv_heads,
                head_dim_v):
        """CUDA: kva_cuda_context_reserve - grows the context's device metadata
        and workspace to hold any plan of at most max_requests requests,
        max_tokens query tokens and max_block_table page-table entries
        (requests x the plan's block_table width) of this attention shape, so
        that later plans within it keep the buffers (and a CUDA graph captured
        over run() stays valid). Synchronizes the stream; refused during
        capture. Other backends keep no device metadata: nothing to do."""
        if self.device != T.CUDA:
            return
        cap = L.CudaCapacity(max_requests, max_tokens, max_block_table, num_heads,
                             num_kv_heads, head_dim_v)
        with self._lock:
            _check(L.kva_cuda_context_reserve(self._h, _byref(cap)))

    def close(self):
        if getattr(self, "_h", None):
            with self._lock:
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
    with code * s, as DeepSeek's inference code does.

    attention_chunk=C > 0: chunked local attention (key j visible only if
    j // C == pos // C; causal plans). The step's draft trees (tree
    verification, causal plans): tree = each query token's parent within its
    request (-1 for a root), flat [T] or one list per request, or tree_mask =
    FlashInfer's packed per-request q x q bits (uint8). cascade = "auto" |
    "off" | "on" (True / False: "on" / "off") runs shared prefixes once per
    group; cascade_group [R] (-1 = none), cascade_prefix_len [G] and
    cascade_parent [G] give the grouping instead of the block table's.
    dcp_size / dcp_rank / dcp_interleave: the plan of one rank of a sharded
    cache (decode context parallelism, docs/dcp.md; kvattn.dcp_local_lens,
    dcp_slots, merge_states_n). The tree and the grouping are per step: pass
    them again to update()."""

    def __init__(self, ctx, query_start_loc, seq_lens, block_table=None, *, block_size,
                 num_heads, num_kv_heads, head_dim, head_dim_v=0, q_dtype="f16", scale=0.0,
                 causal=True, window_left=-1, softcap=0.0, alibi_slopes=None,
                 decode_threshold=0, kind="mha", mla_qk_nope_head_dim=0, mla_v_head_dim=0,
                 sparse_topk=0, sparse_mode="mixed", index_q_quant="none", attention_chunk=0,
                 tree=None, tree_mask=None, cascade="auto", cascade_group=None,
                 cascade_prefix_len=None, cascade_parent=None, dcp_size=0, dcp_rank=0,
                 dcp_interleave=0):
        qsl, sl, bt, stride = self._batch(query_start_loc, seq_lens, block_table)
        step = _step_arrays(qsl, tree, tree_mask, cascade_group, cascade_prefix_len,
                            cascade_parent)
        if L._is_bool(cascade):
            cascade = "on" if cascade else "off"
        causal = L._flag(causal, "causal")
        al = None
        if alibi_slopes is not None:
            al = T.host_array(alibi_slopes, np.float32, "alibi_slopes")
            if al.shape != (num_heads,):
                raise ShapeMismatchError("alibi_slopes: shape %s, expected (%d,)"
                                         % (al.shape, num_heads))
        # A context's plans usually share their attention shape: the checked
        # descriptor is a per-context template, which each plan copies and
        # sets its batch fields in (a shared one would let two threads' plans
        # on one context read each other's batches).
        # Each value with its type: True == 1 and 2.0 == 2 hash alike, and a
        # template made for 1 must not let True (or 2.0) skip the checks below.
        key = (block_size, num_heads, num_kv_heads, head_dim, head_dim_v, q_dtype, scale, causal,
               window_left, softcap, decode_threshold, kind, mla_qk_nope_head_dim, mla_v_head_dim,
               sparse_topk, sparse_mode, index_q_quant, attention_chunk, cascade, dcp_size,
               dcp_rank, dcp_interleave)
        key += tuple(map(type, key))
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
            d.attention_chunk = L._fit(attention_chunk, i32, "attention_chunk")
            d.cascade = _enum(L.CASCADE_MODES, cascade, "cascade")
            d.dcp_size = L._fit(dcp_size, i32, "dcp_size")
            d.dcp_rank = L._fit(dcp_rank, i32, "dcp_rank")
            d.dcp_interleave = L._fit(dcp_interleave, i32, "dcp_interleave")
            if len(ctx._plan_descs) >= 64:
                ctx._plan_descs.clear()
            tmpl = (d, qdt, (block_size, num_kv_heads, head_dim, head_dim_v or head_dim, kc))
            if key is not None:
                ctx._plan_descs[key] = tmpl
        d, qdt, self._cache_sig = tmpl
        self._desc, self._alibi = type(d).from_buffer_copy(d), al
        self.ctx, self.q_dtype = ctx, qdt
        self.block_size, self.num_heads, self.num_kv_heads = block_size, num_heads, num_kv_heads
        self.head_dim, self.head_dim_v = head_dim, head_dim_v or head_dim
        self._mla = (mla_qk_nope_head_dim, mla_v_head_dim) if mla_v_head_dim else None
        self.kind, self.sparse_topk = kind, sparse_topk
        self.attention_chunk = attention_chunk
        self.dcp_size, self.dcp_rank, self.dcp_interleave = dcp_size, dcp_rank, dcp_interleave
        self._h = None
        self._plan(qsl, sl, bt, stride, None, step)

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

    def _plan(self, qsl, sl, bt, stride, ctx, step):
        """kva_plan_create (ctx None) or kva_plan_update on ctx with the batch
        arrays and the step's tree and cascade grouping (_step_arrays)."""
        d, r = self._desc, sl.shape[0]
        d.num_requests = r
        d.query_start_loc = T.address(qsl)
        d.seq_lens = T.address(sl)
        d.block_table = None if bt is None else T.address(bt)
        d.block_table_stride = stride
        d.alibi_slopes = None if self._alibi is None else T.address(self._alibi)
        # Every pointer of the shared template is set on every call: a field
        # left from another plan's step would be read as this one's.
        tp, tm, cg, cpl, cpar = step
        d.tree_parents, d.tree_mask = _array_ptr(tp), _array_ptr(tm)
        d.cascade_group, d.cascade_prefix_len = _array_ptr(cg), _array_ptr(cpl)
        d.cascade_parent = _array_ptr(cpar)
        d.num_cascade_groups = 0 if cpl is None else cpl.shape[0]
        if ctx is None:
            h = ctypes.c_void_p()
            with self.ctx._lock:
                _check(L.kva_plan_create(self.ctx._h, _byref(d), _byref(h)))
            self._h = h.value
        else:
            with ctx._lock:
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
        # A sharded plan's ragged rows are the rank's own keys (kvattn_dcp.h).
        self._seq_lens = None
        if bt is None:
            self._seq_lens = sl.copy()
            if self.dcp_size > 1:
                _check(L.kva_dcp_local_lens(r, _array_ptr(sl), self.dcp_size, self.dcp_rank,
                                            self.dcp_interleave, _array_ptr(self._seq_lens)))

    def update(self, query_start_loc, seq_lens, block_table=None, *, tree=None, tree_mask=None,
               cascade_group=None, cascade_prefix_len=None, cascade_parent=None, ctx=None):
        """kva_plan_update: re-plans this plan in place for a new step's batch
        (same attention shape and options), reusing its memory; afterwards it
        is what Plan(ctx, query_start_loc, seq_lens, block_table, ...) with
        this plan's options and this step's tree / cascade grouping (none
        when not given) would be. On an error the plan is unchanged.
        ctx defaults to the plan's context."""
        qsl, sl, bt, stride = self._batch(query_start_loc, seq_lens, block_table)
        step = _step_arrays(qsl, tree, tree_mask, cascade_group, cascade_prefix_len,
                            cascade_parent)
        self._plan(qsl, sl, bt, stride, ctx or self.ctx, step)
        return self

    @property
    def kv_len_total(self):
        """Rows of k/v run_ragged expects (sum of seq_lens; of a sharded
        plan's local lengths); None for paged plans."""
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
        if lse is None and L._flag(return_lse, "return_lse"):
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
        with ctx._lock:
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
        with ctx._lock:
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
        if topk_length is None and L._flag(return_lengths, "return_lengths"):
            topk_length = T.empty_like_device(q, (t,), T.I32, qv.device, qv.device_id)
        tv = None
        if topk_length is not None:
            tv = _tensor(topk_length, "topk_length", ctx, (t,), T.I32, writable=True)
        with ctx._lock:
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
        with ctx._lock:
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
        with ctx._lock:
            _check(L.kva_attention_run_ragged(ctx._h, self._h, qv.ptr, kv.ptr, vv.ptr,
                                              self._sinks(sinks, ctx), ov.ptr,
                                              lv.ptr if lv else None))
        return (out, lse) if lv else out

    def close(self):
        if getattr(self, "_h", None):
            L.kva_plan_destroy(self._h)
            self._h = None

    __del__ = close


def _is_seq(x):
    return isinstance(x, (list, tuple)) or getattr(x, "ndim", 0) > 0


def _step_arrays(qsl, tree, tree_mask, cascade_group, cascade_prefix_len, cascade_parent):
    """The step's tree and cascade arrays as host int32 / uint8 arrays of the
    sizes kva_plan_create reads (it reads them through bare pointers: a
    short array would be read past its end); (tree_parents, tree_mask,
    cascade_group, cascade_prefix_len, cascade_parent), None where not given.
    Sizes that depend on query_start_loc are checked only when it is valid
    ([0] == 0, non-decreasing): C refuses it otherwise before reading them."""
    r = qsl.shape[0] - 1
    q = np.diff(qsl.astype(np.int64))
    valid = r >= 0 and qsl[0] == 0 and bool((q >= 0).all())
    tp = tm = None
    if tree is not None:
        if isinstance(tree, (list, tuple)) and any(_is_seq(x) for x in tree):
            if len(tree) != r:
                raise ShapeMismatchError("tree: %d per-request parent lists for %d requests"
                                         % (len(tree), r))
            parts = []
            for i, p in enumerate(tree):
                a = T.host_array(p, np.int32, "tree[%d]" % i)
                if a.ndim != 1 or (valid and a.shape[0] != q[i]):
                    raise ShapeMismatchError("tree[%d]: shape %s, expected (%d,) (request %d's "
                                             "q_len)" % (i, a.shape, q[i] if valid else -1, i))
                parts.append(a)
            tp = np.concatenate(parts) if parts else np.empty(0, np.int32)
        else:
            tp = T.host_array(tree, np.int32, "tree")
            if tp.ndim != 1 or (valid and tp.shape[0] != qsl[r]):
                raise ShapeMismatchError("tree: shape %s, expected (%d,): one parent per query "
                                         "token" % (tp.shape, qsl[r] if valid else -1))
    if tree_mask is not None:
        if "bool" in str(getattr(tree_mask, "dtype", "")):
            raise InvalidArgumentError(
                "tree_mask: packed bits (uint8) expected, got a boolean array: pack each "
                "request's q x q rows with np.packbits(m.reshape(-1), bitorder='little')")
        if isinstance(tree_mask, (bytes, bytearray, memoryview)):
            tm = np.frombuffer(bytes(tree_mask), np.uint8)
        else:
            tm = T.host_array(tree_mask, np.uint8, "tree_mask")
        n = int(((q * q + 7) // 8).sum()) if valid else -1
        if tm.ndim != 1 or (valid and tm.shape[0] != n):
            raise ShapeMismatchError("tree_mask: shape %s, expected (%d,): ceil(q_len^2 / 8) "
                                     "bytes per request" % (tm.shape, n))
    cg = cpl = cpar = None
    if cascade_group is None:
        if cascade_prefix_len is not None or cascade_parent is not None:
            raise InvalidArgumentError("cascade_prefix_len / cascade_parent need cascade_group")
    else:
        cg = T.host_array(cascade_group, np.int32, "cascade_group")
        if cg.shape != (r,):
            raise ShapeMismatchError("cascade_group: shape %s, expected (%d,)" % (cg.shape, r))
        if cascade_prefix_len is not None:
            cpl = T.host_array(cascade_prefix_len, np.int32, "cascade_prefix_len")
            if cpl.ndim != 1:
                raise ShapeMismatchError("cascade_prefix_len: shape %s, expected [G]"
                                         % (cpl.shape,))
        g = 0 if cpl is None else cpl.shape[0]
        if cascade_parent is not None:
            cpar = T.host_array(cascade_parent, np.int32, "cascade_parent")
            if cpar.shape != (g,):
                raise ShapeMismatchError("cascade_parent: shape %s, expected (%d,) as "
                                         "cascade_prefix_len" % (cpar.shape, g))
    return tp, tm, cg, cpl, cpar


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
    with ctx._lock:
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


# The cache object lives in cache.py (imported last: it uses this module's
# helpers); kvattn.core.Cache stays a name for it.
from .cache import Cache  # noqa: E402,F401
