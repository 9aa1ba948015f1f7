"""Helpers of the FlashInfer-compatible wrappers (kvattn.flashinfer): dtype
names, ALiBi slopes, FlashInfer's paged-cache metadata and cache views, the
softmax scale, staging of strided tensors, and the base-2 / ALiBi LSE shift.
Internal: the wrappers' module re-exports the public get_alibi_slopes.
"""

import math

import numpy as np

from . import _tensor as T
from .core import Cache, default_context, dtype_code
from ._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)
INT32_MAX = 2 ** 31 - 1

# FlashInfer's dtype strings are torch attribute names ("float16",
# "torch.float8_e4m3fn"); those of kvattn's dtypes that numpy does not know
# (float8_e4m3fn: only once ml_dtypes is loaded) are named here.
_DTYPE_ALIASES = {"float16": "f16", "half": "f16", "bfloat16": "bf16", "float32": "f32",
                  "float": "f32", "float8_e4m3fn": "fp8_e4m3"}


def _dtype(x):
    if x is None:
        return None
    if isinstance(x, str):
        x = _DTYPE_ALIASES.get(x.replace("torch.", ""), x)
    return dtype_code(x)


def _same_dtype(name, x, qdt, why):
    """FlashInfer's kv / output dtype argument x (None: q's), which kvattn's
    wrappers take only equal to the query dtype qdt: any other raises
    UnsupportedError, also one kvattn has no code for (torch.float8_e5m2,
    "float8_e5m2"), which FlashInfer accepts; why ends the message."""
    if x is None:
        return
    try:
        code = _dtype(x)
    except InvalidArgumentError:
        code = None
    if code != qdt:
        raise UnsupportedError("%s %s differs from q_data_type: %s" % (name, x, why))


def get_alibi_slopes(n_heads, device=None):
    """ALiBi slopes of n_heads heads (the geometric series of the ALiBi
    paper, with the interleaved extension for a count that is not a power of
    2), as flashinfer.utils.get_alibi_slopes: a float32 numpy array, or a
    float32 torch tensor on device when device is given (FlashInfer's
    argument; it always returns a tensor)."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise InvalidArgumentError("get_alibi_slopes: n_heads = %r (num_heads) is not a positive "
                                   "integer" % (n_heads,))
    n_heads = int(n_heads)
    n = 2 ** math.floor(math.log2(n_heads))
    m0 = 2.0 ** (-8.0 / n)
    slopes = [m0 ** (i + 1) for i in range(n)]
    if n < n_heads:
        m1 = 2.0 ** (-4.0 / n)
        slopes += [m1 ** (2 * i + 1) for i in range(n_heads - n)]
    out = np.asarray(slopes, dtype=np.float32)
    if device is None:
        return out
    import torch

    return torch.as_tensor(out, device=device)


def _context_for(workspace, context):
    """The wrapper's context: context if given; for a CUDA workspace a context
    of its own (a CUDA context's newest plan owns its device metadata, and
    FlashInfer code plans its decode and prefill wrappers before running
    either); the shared CPU context otherwise."""
    if context is not None:
        return context
    if workspace is None:
        return default_context("cpu")
    v = T.view(workspace, "float_workspace_buffer")
    if v.device == T.CUDA:
        from .core import Context

        return Context("cuda", 0, v.device_id)
    return default_context(v.device, v.device_id)


def _on_default(ctx, context):
    """Whether a wrapper made with context= context holds ctx as the default
    context of its device (no context= and no CUDA workspace): a caller may
    close that one, and default_context() then makes it again."""
    return context is None and ctx is default_context(ctx.device, ctx.device_id)


def _plan_context(w):
    """The context wrapper w plans on (at each plan(), and at a forward()
    that replans): w._ctx; where a caller closed it and it was the default
    context (w._default), the one default_context() makes again, which
    becomes w's, with w's cache views over the old one dropped
    (w._drop_views()). A closed context the caller gave is refused. A plan
    made before stays on its closed context: run() refuses it
    (_check_plan_context) rather than running it on the new one."""
    ctx = w._ctx
    if ctx._h:
        return ctx
    if not w._default:
        raise InvalidArgumentError("the wrapper's context was closed: make the wrapper again "
                                   "with an open context")
    w._ctx = default_context(ctx.device, ctx.device_id)
    w._drop_views()
    return w._ctx


def _check_plan_context(ctx, what="run()"):
    """Refuses a run whose plan was made on a context closed since."""
    if not ctx._h:
        raise InvalidArgumentError("%s: the context the wrapper planned on was closed since; "
                                   "plan() again (a wrapper over the default context then plans "
                                   "on the new one)" % what)


def _paged_metadata(indptr, indices, last_page_len, page_size, lens=True):
    """FlashInfer's CSR page table -> (seq_lens [R], block_table [R, max_pages]);
    lens False: the block table alone (seq_lens None, not computed)."""
    ip = T.host_array(indptr, np.int32, "paged_kv_indptr")
    lp = T.host_array(last_page_len, np.int32, "paged_kv_last_page_len")
    if ip.ndim != 1 or ip.shape[0] < 1 or lp.shape != (ip.shape[0] - 1,):
        raise ShapeMismatchError("paged_kv_indptr %s must be [R+1] and paged_kv_last_page_len %s "
                                 "[R]" % (ip.shape, lp.shape))
    r = lp.shape[0]
    npages = np.diff(ip)
    n_ix = int(indices.shape[0]) if hasattr(indices, "shape") else len(indices)
    if r and (npages.min() < 0 or ip[-1] > n_ix or ip[0] < 0):
        raise InvalidArgumentError("paged_kv_indptr must be non-decreasing within "
                                   "[0, len(paged_kv_indices) = %d]" % n_ix)
    # Only the pages indptr covers come to the host: a CUDA-graph engine passes
    # its whole (batch x context) indices buffer.
    ix = T.host_array(indices[: int(ip[-1])] if r else indices[:0], np.int32,
                      "paged_kv_indices")
    if r and (lp.min() < 0 or lp.max() > page_size):
        raise InvalidArgumentError("paged_kv_last_page_len must lie in [0, page_size = %d]"
                                   % page_size)
    seq_lens = None
    if lens:
        # In int64: (pages - 1) * page_size + last_page_len wraps in int32
        # past 2**31 - 1 keys, which C would read as a shorter request.
        n = np.where(npages > 0, (npages.astype(np.int64) - 1) * page_size + lp, 0)
        if r and n.max() > INT32_MAX:
            raise InvalidArgumentError("a request of %d keys ((pages - 1) * page_size + "
                                       "last_page_len): kvattn's lengths are at most 2**31 - 1"
                                       % n.max())
        seq_lens = n.astype(np.int32)
    width = max(int(npages.max()) if r else 0, 1)
    bt = np.zeros((r, width), np.int32)
    if r and ip[-1] > ip[0]:
        rows = np.repeat(np.arange(r), npages)
        cols = np.arange(ip[-1] - ip[0]) - np.repeat(ip[:-1] - ip[0], npages)
        bt[rows, cols] = ix[ip[0]:ip[-1]]
    return seq_lens, bt


def _dense_strides(strides, sizes, want):
    """Whether strides are want on every dimension of size > 1 (the stride of
    a size-1 dimension addresses nothing: a [NB, 1, B, D] view of NHD pages
    with one kv head, transposed to HND shape, is dense HND)."""
    return all(s == w or n == 1 for s, w, n in zip(strides, want, sizes))


class _KVCacheViews:
    """kva caches wrapping the caller's paged K/V tensors, one per (address,
    shape, form); a cache only describes memory, so one made for an earlier
    tensor at the same address with the same shape is still right."""

    def __init__(self):
        self._caches = {}

    def get(self, ctx, paged_kv_cache, layout, page_size, hkv, d, dv, dtype):
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise InvalidArgumentError("paged_kv_cache: a (k, v) pair or one 5-D tensor")
            kv = T.view(paged_kv_cache[0], "paged_kv_cache[0]")
            vv = T.view(paged_kv_cache[1], "paged_kv_cache[1]")
            kshape, vshape, kst, vst = kv.shape, vv.shape, kv.strides, vv.strides
            kptr, vptr, dt, dev, devid = kv.ptr, vv.ptr, kv.dtype, kv.device, kv.device_id
            if vv.dtype != dt or vv.device != dev:
                raise InvalidArgumentError("paged_kv_cache: k and v differ in dtype or device")
        else:
            c = T.view(paged_kv_cache, "paged_kv_cache")
            if len(c.shape) != 5 or c.shape[1] != 2:
                raise ShapeMismatchError("paged_kv_cache: expected [NB, 2, ...] (5-D), got %s"
                                         % (c.shape,))
            kshape = vshape = c.shape[:1] + c.shape[2:]
            kst = vst = c.strides[:1] + c.strides[2:]
            kptr = c.ptr
            vptr = c.ptr + c.strides[1] * _esize(c.dtype)
            dt, dev, devid = c.dtype, c.device, c.device_id
        if dev != ctx.device or (dev == T.CUDA and devid != ctx.device_id):
            raise InvalidArgumentError("paged_kv_cache on %s:%d, but the wrapper computes on %s:%d"
                                       % (dev, devid, ctx.device, ctx.device_id))
        if dt != dtype:
            raise UnsupportedError("paged_kv_cache dtype %s differs from q's; kvattn reads "
                                   "unquantized caches in the query dtype" % dt)
        inner = (page_size, hkv) if layout == 0 else (hkv, page_size)
        if tuple(kshape[1:]) != inner + (d,) or tuple(vshape[1:]) != inner + (dv,) or \
                kshape[0] != vshape[0]:
            raise ShapeMismatchError(
                "paged_kv_cache: k %s / v %s do not match the plan ([NB, %d, %d, %d / %d], %s)"
                % (tuple(kshape), tuple(vshape), inner[0], inner[1], d, dv,
                   "NHD" if layout == 0 else "HND"))
        nb = kshape[0]
        page_k, page_v = page_size * hkv * d, page_size * hkv * dv
        if not (_dense_strides(kst[1:], kshape[1:], (inner[1] * d, d, 1)) and
                _dense_strides(vst[1:], vshape[1:], (inner[1] * dv, dv, 1))):
            raise InvalidArgumentError("paged_kv_cache: pages must be contiguous (strides %s, %s)"
                                       % (kst, vst))
        if kst[0] == page_k and vst[0] == page_v:
            mult = 1
        elif d == dv and kst[0] == 2 * page_k and vst[0] == 2 * page_k and \
                vptr - kptr == page_k * _esize(dt):
            mult = 2  # interleaved K/V pages: kva_cache_create_from_interleaved, block 2p
        else:
            raise InvalidArgumentError("paged_kv_cache: page stride %d / %d elements is neither "
                                       "one page nor a K/V page pair" % (kst[0], vst[0]))
        key = (kptr, vptr, nb, page_size, hkv, d, dv, dt, layout, ctx.device_id)
        cache = self._caches.get(key)
        if cache is None:
            if len(self._caches) > 64:
                self._caches.clear()
            cache = Cache._wrap(ctx, kptr, None if mult == 2 else vptr, nb, page_size, hkv, d,
                                dv, dt, layout, ())
            self._caches[key] = cache
        return cache, mult


def _sm_scale(sm_scale, head_dim, mul=1.0):
    """The softmax scale FlashInfer means: sm_scale (1/sqrt(head_dim) when
    None) times mul (run()'s q_scale * k_scale). A scale of 0 (every logit
    0) is refused: kvattn reads scale 0 as 1/sqrt(head_dim) and would
    silently attend with that instead."""
    s = (1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)) * float(mul)
    if s == 0.0:
        raise UnsupportedError("sm_scale %r (times q_scale * k_scale = %r) is 0: kvattn's scale 0 "
                               "means 1/sqrt(head_dim), so a zero softmax scale cannot be "
                               "expressed" % (sm_scale, mul))
    return s


def _alibi_slopes(pos_encoding_mode, logits_soft_cap, num_qo_heads):
    """The ALiBi slopes of pos_encoding_mode "ALIBI" (None otherwise).
    FlashInfer adds the bias to the scaled logit before the soft-cap's tanh
    (cap * tanh((s + bias) / cap)); kvattn adds it after (cap * tanh(s / cap)
    + bias) and cannot express FlashInfer's order, so the pair is refused
    rather than computed differently."""
    if pos_encoding_mode != "ALIBI":
        return None
    if logits_soft_cap:
        raise UnsupportedError("pos_encoding_mode 'ALIBI' with logits_soft_cap %r: FlashInfer "
                               "adds the ALiBi bias before the soft-cap's tanh, kvattn after it, "
                               "so the combination cannot be expressed" % (logits_soft_cap,))
    return get_alibi_slopes(num_qo_heads)


class UnknownNameError(InvalidArgumentError, KeyError):
    """An unknown kv_layout or pos_encoding_mode name: FlashInfer raises
    KeyError for those (_check_kv_layout, _check_pos_encoding_mode); this is
    both that KeyError and kvattn's InvalidArgumentError (a ValueError)."""

    __str__ = Exception.__str__  # KeyError's would quote the message


def _check_name(what, value, known):
    """Raises UnknownNameError unless value is one of FlashInfer's names."""
    if value not in known:
        raise UnknownNameError("%s %r is not one of %s" % (what, value, ", ".join(known)))


def _causal_for(causal, qo_indptr, kv_lens):
    """The causal flag to plan with. FlashInfer's causal mask lets query i of
    a request with q queries and s keys see keys j <= s - q + i, so a row
    with none (s = 0) writes 0 and LSE -inf; kvattn's causal plans need
    q_len <= kv_len. When every request has at most one query, the causal
    mask excludes no key (j < s anyway), so a batch with kv_len-0 requests
    (padding) is planned without it, giving FlashInfer's zeros and -inf."""
    if not causal:
        return False
    qo = T.host_array(qo_indptr, np.int64, "qo_indptr")
    kl = np.asarray(kv_lens, np.int64)
    q_lens = np.diff(qo)
    if q_lens.size and q_lens.max() <= 1 and kl.size == q_lens.size and \
            (kl < q_lens).any():
        return False
    return True


def _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                       max_item_len_ptr):
    """FlashInfer's multi-item scoring (prefill plan()'s prefix_len_ptr,
    token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr) masks
    keys between the items of a prompt; kvattn has no such mask, so giving
    any of them raises instead of attending over every item."""
    given = [n for n, x in (("prefix_len_ptr", prefix_len_ptr),
                            ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                            ("max_item_len_ptr", max_item_len_ptr)) if x is not None]
    if token_pos_in_items_len:
        given.append("token_pos_in_items_len")
    if given:
        raise UnsupportedError("%s: FlashInfer's multi-item scoring mask is not supported by "
                               "kvattn" % ", ".join(given))


def _refuse_run_options(kv_cache_sf, skip_softmax_threshold_scale_factor):
    """run() options of FlashInfer's that kvattn cannot honour: NVFP4 cache
    scale factors, and skip-softmax sparsity (an approximation that drops
    keys); None is accepted."""
    if kv_cache_sf is not None:
        raise UnsupportedError("kv_cache_sf: kvattn's wrapped caches are 16-bit, not NVFP4")
    if skip_softmax_threshold_scale_factor is not None:
        raise UnsupportedError("skip_softmax_threshold_scale_factor %r: kvattn computes the "
                               "exact softmax over every visible key"
                               % (skip_softmax_threshold_scale_factor,))


def _refuse_custom_variant(jit_args, variant_owns_mask=False):
    """The wrappers' constructor arguments that build a custom FlashInfer
    attention variant (jit_args: a JIT module of the caller's own logits /
    mask code; variant_owns_mask, which needs one): kvattn cannot run that
    code, so they raise rather than being ignored (the result would be the
    default variant's). jit_kwargs only matters with jit_args."""
    given = ["jit_args"] if jit_args is not None else []
    if variant_owns_mask:
        given.append("variant_owns_mask")
    if given:
        raise UnsupportedError("%s: FlashInfer's custom JIT attention variants are not supported "
                               "by kvattn" % ", ".join(given))


LSE_BASES = ("log2", "ln")
LSE_LAYOUTS = ("NH", "HN")


def _lse_form(lse, lse_base, lse_layout, return_lse, q):
    """Checks the prefill run()'s lse_base / lse_layout (FlashInfer 0.7's) and
    returns (the lse to run with, the caller's [H, T] lse or None). Only a
    returned LSE takes them, as in FlashInfer: with return_lse False a given
    lse is written [T, H] in base 2. For "HN" the run writes a [T, H]
    temporary, and _finish_lse transposes it into the caller's lse, which
    must be a contiguous float32 [H, T] tensor (checked here, before the run)."""
    _check_name("lse_base", lse_base, LSE_BASES)
    _check_name("lse_layout", lse_layout, LSE_LAYOUTS)
    if not return_lse or lse_layout != "HN":
        return lse, None
    if lse is not None:
        qv, lv = T.view(q, "q"), T.view(lse, "lse")
        want = (qv.shape[1], qv.shape[0]) if len(qv.shape) == 3 else None
        if want is None or tuple(lv.shape) != want or lv.dtype != T.F32:
            raise ShapeMismatchError("lse for lse_layout 'HN': %s %s, expected float32 %s"
                                     % (tuple(lv.shape), lv.dtype, want))
        if not _is_contiguous(lse):
            raise InvalidArgumentError("lse for lse_layout 'HN' must be contiguous")
    return None, lse


def _finish_lse(lse, lse_base, lse_layout, dst):
    """The run's [T, H] base-2 LSE in FlashInfer's requested base and layout:
    "ln" multiplies by ln 2 (in place for "NH"); "HN" writes the transpose
    into dst (or a new contiguous [H, T] tensor)."""
    mul = LN2 if lse_base == "ln" else 1.0
    if lse_layout == "NH":
        if mul != 1.0:
            lse *= mul
        return lse
    if T.is_torch(lse):
        import torch

        if dst is None:
            dst = torch.empty((lse.shape[1], lse.shape[0]), dtype=lse.dtype, device=lse.device)
        torch.mul(lse.t(), mul, out=dst)
        return dst
    if dst is None:
        dst = np.empty((lse.shape[1], lse.shape[0]), np.float32)
    np.multiply(np.asarray(lse).T, np.float32(mul), out=dst)
    return dst


def _is_contiguous(x):
    if T.is_torch(x):
        return x.is_contiguous()
    return not isinstance(x, np.ndarray) or x.flags.c_contiguous


def _packed(x):
    """x, or a contiguous copy of a numpy array / torch tensor whose token and
    head strides are free but whose last dimension is dense (a q sliced from a
    fused qkv projection): FlashInfer's kernels read such tensors through
    their token and head strides, kvattn's runs read packed rows. A strided
    last dimension, which FlashInfer does not read either, is passed on and
    refused."""
    if T.is_torch(x):
        if x.is_contiguous() or x.dim() == 0 or x.stride(-1) != 1:
            return x
        return x.contiguous()
    if isinstance(x, np.ndarray) and not x.flags.c_contiguous and x.ndim > 0 and \
            x.strides[-1] == x.itemsize:
        return np.ascontiguousarray(x)
    return x


def _dense_last(x):
    """Whether x is a numpy array / torch tensor with token or head strides
    but a dense last dimension (FlashInfer's kernels read and write such
    tensors through their strides)."""
    if T.is_torch(x):
        return not x.is_contiguous() and x.dim() > 0 and x.stride(-1) == 1
    return isinstance(x, np.ndarray) and not x.flags.c_contiguous and x.ndim > 0 and \
        x.strides[-1] == x.itemsize


def _bytes_covered(x, name):
    """(first, last + 1) byte addresses of tensor x, or None if it is empty."""
    v = T.view(x, name)
    if any(n == 0 for n in v.shape):
        return None
    es = _esize(v.dtype)
    lo = sum(min(0, (n - 1) * st) for n, st in zip(v.shape, v.strides))
    hi = sum(max(0, (n - 1) * st) for n, st in zip(v.shape, v.strides))
    return v.ptr + lo * es, v.ptr + (hi + 1) * es


def _staged(x, name, inputs):
    """(the output to pass to kvattn, the caller's tensor to copy it into).
    An out / lse with token or head strides and a dense last dimension, which
    FlashInfer writes through its strides, is replaced by a contiguous
    temporary of its shape and dtype (kvattn writes packed rows) and copied
    into after the run; anything else is passed on (and checked there). As
    kvattn's own check, the staged tensor must not overlap an input (by the
    bytes they cover). inputs: (name, tensor) pairs; a tensor may be a tuple
    or list of tensors (a paged cache's (k, v)) or None."""
    if x is None or not _dense_last(x):
        return x, None
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return x, None  # refused by the run: read-only
    v = T.view(x, name)
    if any(st == 0 and n > 1 for n, st in zip(v.shape, v.strides)):
        # An expanded (broadcast) view: the copy back would write several
        # rows to one address (torch refuses it after the run, numpy keeps
        # the last row).
        raise InvalidArgumentError("%s: stride 0 over a dimension of size > 1 (strides %s, "
                                   "shape %s): its elements overlap each other (kvattn.h, "
                                   "Aliasing)" % (name, tuple(v.strides), tuple(v.shape)))
    span = _bytes_covered(x, name)
    for nm, t in _flat_inputs(inputs):
        other = _bytes_covered(t, nm)
        if span and other and span[0] < other[1] and other[0] < span[1]:
            raise InvalidArgumentError("%s overlaps the input %s: outputs must not overlap the "
                                       "inputs (kvattn.h, Aliasing)" % (name, nm))
    if T.is_torch(x):
        import torch

        return torch.empty_like(x, memory_format=torch.contiguous_format), x
    return np.empty(x.shape, x.dtype), x


def _flat_inputs(inputs):
    """inputs' (name, tensor) pairs with tuples / lists spread (name[i]) and
    None left out."""
    for nm, t in inputs:
        if isinstance(t, (tuple, list)):
            for i, e in enumerate(t):
                if e is not None:
                    yield "%s[%d]" % (nm, i), e
        elif t is not None:
            yield nm, t


def _staged_outputs(out, lse, inputs):
    """_staged of out and lse: (out, out_dst, lse, lse_dst). Where either is
    staged, kvattn sees a temporary in its place and cannot compare the
    caller's two tensors, which the copies back would then write over each
    other: they must not overlap (kvattn.h, Aliasing)."""
    if out is None and lse is None:  # the run allocates both: nothing to check (hot path)
        return None, None, None, None
    o, o_dst = _staged(out, "out", inputs)
    l, l_dst = _staged(lse, "lse", inputs)
    # An input that _packed copies (strided, dense rows) is one kvattn never
    # sees either: a contiguous output over it is checked here too.
    packed = []
    for nm, t in inputs:
        for i, e in enumerate(t if isinstance(t, (tuple, list)) else (t,)):
            if e is None or (type(e) is np.ndarray and e.flags.c_contiguous):
                continue  # the usual case, cheaply
            if _dense_last(e):
                packed.append(("%s[%d]" % (nm, i) if e is not t else nm, e))
    for x, dst, nm in ((out, o_dst, "out"), (lse, l_dst, "lse")):
        if packed and x is not None and dst is None:
            span = _bytes_covered(x, nm)
            for pn, t in packed:
                other = _bytes_covered(t, pn)
                if span and other and span[0] < other[1] and other[0] < span[1]:
                    raise InvalidArgumentError("%s overlaps the input %s: outputs must not "
                                               "overlap the inputs (kvattn.h, Aliasing)"
                                               % (nm, pn))
    if (o_dst is not None or l_dst is not None) and out is not None and lse is not None:
        a, b = _bytes_covered(out, "out"), _bytes_covered(lse, "lse")
        if a and b and a[0] < b[1] and b[0] < a[1]:
            raise InvalidArgumentError("out overlaps lse: outputs must not overlap each other "
                                       "(kvattn.h, Aliasing)")
    return o, o_dst, l, l_dst


def _unstage(res, dst):
    """res, or the caller's strided dst holding a copy of res."""
    if dst is None:
        return res
    if T.is_torch(dst):
        dst.copy_(res)
    else:
        np.copyto(dst, res)
    return dst


def _esize(dt):
    return {T.F32: 4, T.F16: 2, T.BF16: 2}.get(dt, 1)


def _scale_lse(lse, shift=None):
    """Natural log -> base 2, in place (numpy or torch), plus shift [T, H]
    (base 2: _LseShift) when given."""
    lse *= LOG2E
    if shift is not None:
        lse += shift.like(lse)


class _LseShift:
    """A plan's _alibi_lse_shift, as numpy and, once per torch device, as a
    tensor there (copied at the first run, not on every run: a run inside a
    CUDA graph capture does no host-to-device copy after the first)."""

    def __init__(self, host):
        self.host, self.dev = host, {}

    def like(self, lse):
        if not T.is_torch(lse):
            return self.host
        t = self.dev.get(lse.device)
        if t is None:
            import torch

            t = self.dev[lse.device] = torch.as_tensor(self.host, device=lse.device)
        return t


def _alibi_lse_shift(qo_indptr, kv_lens, slopes):
    """What FlashInfer's LSE adds to kvattn's under ALiBi: [T, H] float32 in
    base 2 (an _LseShift), or None without ALiBi. FlashInfer's bias is slope * (kv_idx -
    qo_idx), both counted from the request's first key and first query
    (DefaultAttention's LogitsTransform; its decode kernels pass qo_idx 0);
    kvattn's is slope * (j - pos) with pos = kv_len - q_len + i, the query's
    position (kvattn.h). The softmax and the output are the same; every
    logit of a row, and so its LSE, is larger by slope * (kv_len - q_len) in
    FlashInfer's."""
    if slopes is None:
        return None
    qo = T.host_array(qo_indptr, np.int64, "qo_indptr")
    q_lens = np.diff(qo)
    gap = np.asarray(kv_lens, np.int64) - q_lens
    rows = np.zeros(int(qo[-1]) if qo.size else 0, np.float64)
    rows[int(qo[0]) if qo.size else 0:] = np.repeat(gap, q_lens).astype(np.float64)
    sl = np.asarray(slopes, np.float64)
    return _LseShift((rows[:, None] * sl[None, :] * LOG2E).astype(np.float32))
