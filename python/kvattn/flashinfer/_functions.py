"""FlashInfer's decode functions that serving engines import by name:
fast_decode_plan (SGLang / vLLM replan a decode wrapper under CUDA graphs
with it), get_seq_lens (flashinfer.page) and trtllm_batch_decode_with_kv_cache
(vLLM's FlashInfer backend decode call), each on kvattn's decode wrapper."""

import operator
import threading

import numpy as np

from .. import _lib as L
from .. import _tensor as T
from .._errors import InvalidArgumentError, UnsupportedError
from .._fi_common import _check_name, _context_for, _dense_strides, _dtype, _refuse_run_options, \
    _sm_scale
from . import BatchDecodeWithPagedKVCacheWrapper, BatchMLAPagedAttentionWrapper


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """flashinfer.page.get_seq_lens: per request
    max(pages - 1, 0) * page_size + last_page_len (so a request with no pages
    gets its last_page_len, as FlashInfer's). numpy arrays or torch tensors,
    the result of the same kind."""
    if T.is_torch(kv_indptr):
        import torch

        return torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + \
            kv_last_page_len
    ip = np.asarray(kv_indptr)
    return np.maximum(ip[1:] - ip[:-1] - 1, 0) * page_size + np.asarray(kv_last_page_len)


class NotAnIntegerError(InvalidArgumentError, TypeError):
    """A non-integer argument FlashInfer declares int (max_seq_len,
    kv_lora_rank, qk_rope_head_dim): its kernel call raises TypeError for a
    float (2048.0 too); this is both that TypeError and kvattn's
    InvalidArgumentError (a ValueError)."""


def _int_arg(x, name, what):
    """An int argument, never truncated: the types FlashInfer's int argument
    takes (int, bool, numpy integers: what operator.index takes)."""
    try:
        return operator.index(x)
    except TypeError:
        raise NotAnIntegerError("%s%s = %r is not an integer (FlashInfer declares int)"
                                % (what, name, x)) from None


def _on_host(x):
    return (type(x) is np.ndarray or isinstance(x, (list, tuple)) or
            (T.is_torch(x) and x.device.type == "cpu"))


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
                     disable_split_kv=False, q_len_per_req=1, global_override_indptr_cpu=None):
    """flashinfer.decode.fast_decode_plan: BatchDecodeWithPagedKVCacheWrapper
    .plan() for the wrapper `self` (engines call it as
    fast_decode_plan(wrapper, ...) or install functools.partial(
    fast_decode_plan, wrapper) as wrapper.plan). FlashInfer's version skips
    the copies into the CUDA-graph buffers; the plan it makes is plan()'s,
    and so is kvattn's, whose plan() copies the page table to its own
    metadata either way. As in FlashInfer: q_data_type None means data_type,
    else float16; kv_data_type None means data_type, else q's; the output
    dtype is q's (kvattn's only one); global_override_indptr_cpu, a host
    copy of indptr, is read instead of indptr (no device-to-host copy; when
    indptr is itself on the host the two must agree). FlashInfer's refusal
    of q_len_per_req > 1 without use_tensor_cores does not apply: kvattn's
    decode plans take any q_len_per_req."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise InvalidArgumentError("fast_decode_plan: self must be a kvattn.flashinfer."
                                   "BatchDecodeWithPagedKVCacheWrapper, got %s"
                                   % type(self).__name__)
    if q_data_type is None:
        q_data_type = data_type if data_type is not None else "float16"
    if kv_data_type is None:
        kv_data_type = data_type if data_type is not None else q_data_type
    if global_override_indptr_cpu is not None:
        if _on_host(indptr) and not np.array_equal(
                T.host_array(indptr, np.int64, "indptr"),
                T.host_array(global_override_indptr_cpu, np.int64, "global_override_indptr_cpu")):
            raise InvalidArgumentError("fast_decode_plan: global_override_indptr_cpu differs "
                                       "from indptr (it must be its host copy)")
        indptr = global_override_indptr_cpu
    # The class's plan, not self.plan: engines replace self.plan with this function.
    BatchDecodeWithPagedKVCacheWrapper.plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
        logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
        sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
        non_blocking=non_blocking, fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)


_WRAPPERS = {}  # one decode wrapper per (context, device, kv_layout) for the function below


def _decode_wrapper(workspace_buffer, kv_layout, context):
    if context is not None:
        key = (id(context), kv_layout)
    elif workspace_buffer is None:
        key = ("cpu", 0, kv_layout)
    else:
        v = T.view(workspace_buffer, "workspace_buffer")
        key = (v.device, v.device_id, kv_layout)
    w = _WRAPPERS.get(key)
    # A wrapper kept over a context that was closed since (the default
    # context, which a caller may close and default_context() then makes
    # again) is made anew, not reused with its dead handle.
    if w is None or not w._ctx._h or (context is not None and w._ctx is not context):
        if len(_WRAPPERS) > 16:
            _WRAPPERS.clear()
        w = BatchDecodeWithPagedKVCacheWrapper(
            None, kv_layout, context=_context_for(workspace_buffer, context))
        # Held from plan to run: the kept wrapper is every thread's.
        w._call_lock = threading.Lock()
        _WRAPPERS[key] = w
    return w


def _capturing(query):
    """Whether query is a CUDA tensor and its stream is capturing a graph."""
    if not (T.is_torch(query) and query.device.type == "cuda"):
        return False
    import torch

    return torch.cuda.is_current_stream_capturing()


def _other_layout(v):
    """Whether the 4-D page view v [P, a, b, D] is dense [P, b, a, D] pages
    transposed, and not dense [P, a, b, D] pages (dimensions of size 1
    address nothing and are not compared)."""
    if len(v.shape) != 4:
        return False
    _, a, b, d = v.shape
    st = v.strides[1:]
    return _dense_strides(st, v.shape[1:], (d, a * d, 1)) and \
        not _dense_strides(st, v.shape[1:], (b * d, d, 1))


def _swap_mid(x):
    """x [P, a, b, D] as [P, b, a, D] (a view)."""
    if T.is_torch(x):
        return x.transpose(1, 2)
    return np.swapaxes(x, 1, 2)


def _unsupported_if(cond, what):
    if cond:
        raise UnsupportedError("trtllm_batch_decode_with_kv_cache: " + what)


def trtllm_batch_decode_with_kv_cache(
        query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
        bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None, o_sf_scale=None,
        o_sf_vec_size=None, sinks=None, kv_layout="HND", enable_pdl=None, backend="auto",
        q_len_per_req=1, o_scale=1.0, mask=None, max_q_len=None, cum_seq_lens_q=None,
        skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
        uses_shared_paged_kv_idx=True, lse=None, return_lse=False, bmm1_scale_log2=None,
        multi_ctas_kv_counter_buffer=None, enable_block_sparse_attention=False, cp_world=1,
        cp_rank=0, causal_seqlens_kv_global=None, bf16q_fp8kv_transform_mode=None,
        request_order=None, request_order_plan=None, *, context=None):
    """flashinfer.decode.trtllm_batch_decode_with_kv_cache, one query token
    per request: query [B, H, D]; kv_cache a (k, v) pair of [P, Hkv, page, D]
    (kv_layout "HND", FlashInfer's default here) or [P, page, Hkv, D] ("NHD")
    tensors, or one [P, 2, ...] tensor of both (pages of the other layout
    seen through a transpose, as vLLM passes its NHD cache permuted to HND
    shape, are read in place as that layout); block_tables [B, max_pages]
    (entries past a request's pages are not read), seq_lens [B] (any
    integer dtype; at most max_seq_len (an integer) and 2**31 - 1);
    bmm1_scale the whole softmax scale (FlashInfer's q_scale * k_scale *
    sm_scale: no 1/sqrt(D) is added),
    bmm2_scale a factor on the output;
    window_left as the wrappers'; sinks the [H] (or xqa's [Hkv, H/Hkv])
    float32 sink logits. Returns out [B, H, Dv] in query's dtype (out= is
    written and returned). workspace_buffer picks the device as the
    wrappers' float_workspace_buffer (context= passes a kvattn Context).
    Kernel choices (backend auto / xqa / trtllm-gen, enable_pdl,
    multi_ctas_kv_counter_buffer, bf16q_fp8kv_transform_mode) are ignored.
    UnsupportedError for what FlashInfer's backends do differently or kvattn
    cannot do: q_len_per_req != 1, cum_seq_lens_q / max_q_len and mask
    (speculative decoding: xqa, FlashInfer's choice on Hopper, needs an
    explicit draft mask where trtllm-gen is causal), lse / return_lse (xqa
    raises NotImplementedError for them), an out / out_dtype other than the
    query's dtype, o_scale != 1 and NVFP4 output (o_sf_scale, o_sf_vec_size),
    kv_cache_sf, skip-softmax, separate K/V page tables
    (uses_shared_paged_kv_idx False), block-sparse attention, decode
    context parallelism (cp_world, cp_rank, causal_seqlens_kv_global),
    bmm1_scale_log2, request_order(_plan), a bmm1_scale of 0, and a
    [P, 1, ...] kv_cache (K and V the same rows, which kvattn's caches
    cannot alias). Each call plans on the host, so it cannot run inside CUDA
    graph capture (UnsupportedError there), unlike FlashInfer's."""
    _check_name("backend", backend, ("auto", "xqa", "trtllm-gen"))
    _check_name("kv_layout", kv_layout, ("NHD", "HND"))
    max_seq_len = _int_arg(max_seq_len, "max_seq_len", "trtllm_batch_decode_with_kv_cache: ")
    _refuse_run_options(kv_cache_sf, skip_softmax_threshold_scale_factor)
    _unsupported_if(q_len_per_req != 1 or max_q_len is not None or cum_seq_lens_q is not None
                    or mask is not None,
                    "q_len_per_req %r / cum_seq_lens_q / max_q_len / mask: the speculative "
                    "decoding mask differs between FlashInfer's backends (xqa needs an explicit "
                    "draft mask, trtllm-gen is causal); use BatchDecodeWithPagedKVCacheWrapper "
                    "(q_len_per_req) or the prefill wrapper" % (q_len_per_req,))
    _unsupported_if(lse is not None or return_lse,
                    "lse / return_lse: FlashInfer's xqa backend (its choice on Hopper) has no "
                    "LSE output; use BatchDecodeWithPagedKVCacheWrapper.run(return_lse=True)")
    _unsupported_if(o_sf_scale is not None or o_sf_vec_size is not None or
                    (o_scale is not None and float(o_scale) != 1.0),
                    "o_scale / o_sf_scale / o_sf_vec_size: kvattn writes no fp8 / NVFP4 output")
    _unsupported_if(not uses_shared_paged_kv_idx,
                    "uses_shared_paged_kv_idx=False: K and V share one page table in kvattn")
    _unsupported_if(enable_block_sparse_attention, "enable_block_sparse_attention: kvattn has "
                    "no per-kv-head page selection")
    _unsupported_if(cp_world != 1 or cp_rank != 0 or causal_seqlens_kv_global is not None,
                    "decode context parallelism (cp_world / cp_rank / causal_seqlens_kv_global)")
    _unsupported_if(bmm1_scale_log2 is not None, "bmm1_scale_log2: pass bmm1_scale")
    _unsupported_if(request_order is not None or request_order_plan is not None,
                    "request_order / request_order_plan (a Cake FMHA launch order)")
    _unsupported_if(_capturing(query),
                    "called during CUDA graph capture: kvattn plans each call on the host (its "
                    "metadata upload would be replayed stale); capture the decode wrapper's "
                    "run() and plan outside the graph, as FlashInfer's wrappers do")
    qv = T.view(query, "query")
    if len(qv.shape) != 3:
        raise InvalidArgumentError("query must be [B, H, D], got %s" % (qv.shape,))
    try:  # a dtype kvattn has no code for ("nvfp4", torch.float8_e5m2) differs too
        odt = _dtype(out_dtype)
    except InvalidArgumentError:
        odt = out_dtype
    for name, dt in (("out_dtype", odt),
                     ("out", None if out is None else T.view(out, "out").dtype)):
        if dt is not None and dt != qv.dtype:
            raise UnsupportedError("trtllm_batch_decode_with_kv_cache: %s dtype %s differs from "
                                   "query's: kvattn writes the query dtype"
                                   % (name, L.DTYPE_NAMES.get(dt, dt)))
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise InvalidArgumentError("kv_cache: a (k, v) pair or one [P, 1 or 2, ...] tensor")
        kc, vc = kv_cache
    else:
        kvv = T.view(kv_cache, "kv_cache")
        if len(kvv.shape) != 5 or kvv.shape[1] not in (1, 2):
            raise InvalidArgumentError("kv_cache: expected [P, 1 or 2, ...] (5-D), got %s"
                                       % (kvv.shape,))
        _unsupported_if(kvv.shape[1] == 1, "kv_cache [P, 1, ...] (K and V the same rows): "
                        "a kvattn cache keeps K and V in separate memory")
        kc, vc = kv_cache[:, 0], kv_cache[:, 1]
    kview, vview = T.view(kc, "k_cache"), T.view(vc, "v_cache")
    kshape, vshape = kview.shape, vview.shape
    if len(kshape) != 4 or len(vshape) != 4:
        raise InvalidArgumentError("kv_cache: k %s / v %s must be 4-D pages" % (kshape, vshape))
    if all(_other_layout(x) for x in (kview, vview)):
        # The other layout's pages seen through a transpose (vLLM permutes its
        # NHD cache to HND shape for this call): the same memory, read in its own layout.
        kc, vc = _swap_mid(kc), _swap_mid(vc)
        kshape, vshape = T.view(kc, "k_cache").shape, T.view(vc, "v_cache").shape
        kv_layout = "NHD" if kv_layout == "HND" else "HND"
    hkv, page = (kshape[1], kshape[2]) if kv_layout == "HND" else (kshape[2], kshape[1])
    b, h, d = qv.shape
    sl = T.host_array(seq_lens, np.int64, "seq_lens")
    bt = T.host_array(block_tables, np.int32, "block_tables")
    if sl.shape != (b,) or bt.ndim != 2 or bt.shape[0] != b:
        raise InvalidArgumentError("block_tables %s must be [B, max_pages] and seq_lens %s [B], "
                                   "B = query's %d rows" % (bt.shape, sl.shape, b))
    if b and (sl.min() < 0 or sl.max() > max_seq_len):
        raise InvalidArgumentError("seq_lens must lie in [0, max_seq_len = %d]" % max_seq_len)
    # kvattn's lengths are int32: a longer one is refused, not wrapped.
    sl = T.host_array(sl, np.int32, "seq_lens")
    if sinks is not None:
        if not hasattr(sinks, "reshape"):
            raise InvalidArgumentError("sinks: a float32 tensor of H (or [Hkv, H/Hkv]) sink "
                                       "logits, got %s" % type(sinks).__name__)
        sinks = sinks.reshape(-1)
    w = _decode_wrapper(workspace_buffer, kv_layout, context)
    with w._call_lock:
        w._set_plan(np.arange(b + 1, dtype=np.int32), sl, bt, h, hkv, d,
                    vshape[-1], page, bool(b == 0 or sl.min() >= 1), "NONE", window_left, None,
                    float(bmm1_scale), qv.dtype, None, None)
        return w._run(query, (kc, vc), v_scale=float(bmm2_scale), out=out, sinks=sinks)


_MLA_WRAPPERS = {}  # one MLA wrapper per (context, device) for the function below


def _mla_wrapper(workspace_buffer, context):
    if context is not None:
        key = (id(context),)
    elif workspace_buffer is None:
        key = ("cpu", 0)
    else:
        v = T.view(workspace_buffer, "workspace_buffer")
        key = (v.device, v.device_id)
    w = _MLA_WRAPPERS.get(key)
    if w is None or not w._ctx._h or (context is not None and w._ctx is not context):
        if len(_MLA_WRAPPERS) > 16:
            _MLA_WRAPPERS.clear()
        w = BatchMLAPagedAttentionWrapper(None, context=_context_for(workspace_buffer, context))
        w._call_lock = threading.Lock()  # held from plan to run, as the decode one's
        _MLA_WRAPPERS[key] = w
    return w


def trtllm_batch_decode_with_kv_cache_mla(
        query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
        block_tables, seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0,
        bmm2_scale=1.0, sinks=None, skip_softmax_threshold_scale_factor=None, enable_pdl=None,
        backend="auto", is_var_seq=True, uses_shared_paged_kv_idx=True, lse=None,
        return_lse=False, cute_dsl_impl="auto", kv_scale_format="auto", cum_seq_lens_q=None,
        max_q_len=None, multi_ctas_kv_counter_buffer=None, sparse_mla_top_k_lens=None,
        enable_dcp=False, cp_world=1, cp_rank=0, causal_seqlens_kv_global=None,
        use_fp16_softmax=None, return_lse_base=None, *, context=None):
    """flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla (also in
    flashinfer.decode), dense MLA decode with one query token per request:
    query [B, 1, H, kv_lora_rank + qk_rope_head_dim] (q_nope already
    multiplied by W_UK, then q_pe), kv_cache [P, page, Dc + Dr] or
    [P, 1, page, Dc + Dr] latent rows [c_kv | k_pe] (used in place),
    block_tables [B, max_pages] (entries past a request's pages are not
    read), seq_lens [B] (at most max_seq_len (an integer) and 2**31 - 1);
    bmm1_scale the whole softmax scale (FlashInfer's fused BMM1 scale),
    bmm2_scale a factor on the output.
    Returns out [B, 1, H, Dc] in query's dtype (out= is written and
    returned), or (out, lse [B, H] float32) with return_lse (a given lse is
    written either way), in the base return_lse_base names ("base2" or
    "basee"). qk_nope_head_dim is not used (FlashInfer's absorbed kernels
    ignore it too); is_var_seq, backend ("auto", "trtllm-gen", "cute-dsl",
    "xqa"), cute_dsl_impl, kv_scale_format, enable_pdl and
    multi_ctas_kv_counter_buffer choose kernels and are ignored.
    UnsupportedError: q_len_per_request > 1, cum_seq_lens_q / max_q_len (the
    speculative-decoding mask is the backends' own), lse / return_lse
    without return_lse_base (FlashInfer's backends differ in the base),
    sparse MLA (sparse_mla_top_k, sparse_mla_top_k_lens, backend "sparse";
    kvattn's is Plan.run_mla_sparse), backend "cake", sinks,
    skip-softmax, use_fp16_softmax, separate K/V page tables, decode context
    parallelism (enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global), an
    out dtype other than the query's, a bmm1_scale of 0, and CUDA graph
    capture (each call plans on the host). FlashInfer 0.7.2 runs this
    function on Blackwell GPUs only (its Hopper choice, xqa, needs SM120)."""
    what = "trtllm_batch_decode_with_kv_cache_mla: "
    _check_name("backend", backend, ("auto", "trtllm-gen", "cute-dsl", "xqa", "sparse", "cake"))
    max_seq_len = _int_arg(max_seq_len, "max_seq_len", what)
    _refuse_run_options(None, skip_softmax_threshold_scale_factor)
    _unsupported_if(_capturing(query), "called during CUDA graph capture: kvattn plans each "
                    "call on the host; capture BatchMLAPagedAttentionWrapper.run() instead")
    _unsupported_if(sparse_mla_top_k != 0 or sparse_mla_top_k_lens is not None or
                    backend in ("sparse", "cake"),
                    "sparse MLA / backend %r: use kvattn's Plan.run_mla_sparse" % (backend,))
    _unsupported_if(cum_seq_lens_q is not None or max_q_len is not None,
                    "cum_seq_lens_q / max_q_len (variable query lengths)")
    _unsupported_if((lse is not None or return_lse) and return_lse_base is None,
                    "lse / return_lse without return_lse_base: FlashInfer's MLA backends "
                    "differ in the LSE's base (trtllm-gen base 2, cute-dsl natural)")
    if return_lse_base is not None:
        _check_name("return_lse_base", return_lse_base, ("basee", "base2"))
    _unsupported_if(sinks is not None, "sinks: kvattn's MLA wrapper takes no sinks")
    _unsupported_if(bool(use_fp16_softmax), "use_fp16_softmax: kvattn's softmax is float32")
    _unsupported_if(not uses_shared_paged_kv_idx, "uses_shared_paged_kv_idx=False")
    _unsupported_if(enable_dcp or cp_world != 1 or cp_rank != 0 or
                    causal_seqlens_kv_global is not None, "decode context parallelism")
    qv = T.view(query, "query")
    if len(qv.shape) != 4:
        raise InvalidArgumentError(what + "query must be [B, q_len, H, Dc + Dr], got %s"
                                   % (qv.shape,))
    b, n, h, dqk = qv.shape
    _unsupported_if(n != 1, "q_len_per_request %d: the speculative-decoding mask is the "
                    "backends' own; use BatchMLAPagedAttentionWrapper (causal)" % n)
    dc = _int_arg(kv_lora_rank, "kv_lora_rank", what)
    dr = _int_arg(qk_rope_head_dim, "qk_rope_head_dim", what)
    if dqk != dc + dr:
        raise InvalidArgumentError(what + "query's last dimension %d is not kv_lora_rank + "
                                   "qk_rope_head_dim = %d" % (dqk, dc + dr))
    kvv = T.view(kv_cache, "kv_cache")
    if len(kvv.shape) == 4 and kvv.shape[1] == 1:
        kv_cache = kv_cache[:, 0]
        kvv = T.view(kv_cache, "kv_cache")
    if len(kvv.shape) != 3 or kvv.shape[2] != dc + dr:
        raise InvalidArgumentError(what + "kv_cache must be [P, page, %d] or [P, 1, page, %d], "
                                   "got %s" % (dc + dr, dc + dr, kvv.shape))
    if out is not None and T.view(out, "out").dtype != qv.dtype:
        raise UnsupportedError(what + "out dtype differs from query's: kvattn writes the query "
                               "dtype")
    sl = T.host_array(seq_lens, np.int64, "seq_lens")
    if sl.shape != (b,):
        raise InvalidArgumentError(what + "seq_lens %s must be [B = %d]" % (sl.shape, b))
    if b and (sl.min() < 0 or sl.max() > max_seq_len):
        raise InvalidArgumentError(what + "seq_lens must lie in [0, max_seq_len = %d]"
                                   % max_seq_len)
    sl = T.host_array(sl, np.int32, "seq_lens")  # refused past int32, not wrapped
    w = _mla_wrapper(workspace_buffer, context)
    with w._call_lock:
        w.plan(num_heads=h, head_dim_ckv=dc, head_dim_kpe=dr, page_size=kvv.shape[1],
               causal=False, sm_scale=_sm_scale(float(bmm1_scale), dqk), q_data_type=qv.dtype,
               cum_seq_lens_q=np.arange(b + 1, dtype=np.int32), block_tables=block_tables,
               seq_lens=sl)
        o = w.run(query=query[:, 0], kv_cache=kv_cache, out=None if out is None else out[:, 0],
                  lse=lse, return_lse=return_lse,
                  return_lse_base_on_e=return_lse_base == "basee")
    o, l = o if return_lse else (o, None)
    if float(bmm2_scale) != 1.0:
        o *= float(bmm2_scale)
    res = o.reshape(b, 1, h, dc) if out is None else out
    return (res, l) if return_lse else res
