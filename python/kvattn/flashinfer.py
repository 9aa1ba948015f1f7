"""FlashInfer-compatible wrappers over kvattn.

A FlashInfer user switches by changing the import:

    from kvattn import flashinfer            # instead of `import flashinfer`
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(indptr, indices, last_page_len, H, Hkv, D, page_size, ...)
    out = w.run(q, (k_cache, v_cache))

The names, constructor, plan() and run() arguments follow FlashInfer's
(flashinfer.decode / flashinfer.prefill / flashinfer.cascade); the returned
LSE is base 2, as FlashInfer's. The caller's cache tensors are used in place:
the (k, v) tuple through kva_cache_create_from, the 5-D [NB, 2, B, Hkv, D]
(NHD) / [NB, 2, Hkv, B, D] (HND) tensor (or a tuple of its two halves)
through kva_cache_create_from_interleaved, whose page p is block 2p.

What kvattn does not do raises UnsupportedError: in-kernel RoPE
(pos_encoding_mode "ROPE_LLAMA"), custom masks, kv/o dtypes other than the
query's (quantized caches live in kvattn-owned Cache objects instead), MLA
latent pages not kept as [c_kv | k_pe] rows of one tensor, a softmax scale
of 0 (sm_scale = 0, or q_scale * k_scale = 0: kvattn's scale 0 means
1/sqrt(head_dim)), and pos_encoding_mode "ALIBI" together with
logits_soft_cap (FlashInfer adds the ALiBi bias before the soft-cap's tanh,
kvattn after it: kvattn.h's formula), and FlashInfer keywords that would
change the result (multi-item scoring, window_right, NVFP4 scale factors,
skip-softmax, the ragged wrapper's fp8 calibration scales); an unknown
keyword raises TypeError, as in FlashInfer.
A q (and the ragged wrapper's k / v) with token or head strides, such as a
slice of a fused qkv projection, is accepted as FlashInfer accepts it: the
wrapper copies it to a contiguous tensor first (kvattn's kernels read packed
rows); a strided last dimension is refused, as FlashInfer's kernels need it
dense. Likewise an out (or lse) with token or head strides: the run writes a
contiguous temporary, which is copied into it (a second copy of the output).
Arguments that only tune FlashInfer's own kernels (workspace buffers,
use_tensor_cores, backend, use_cuda_graph, non_blocking, split options) are
accepted and ignored: kvattn keeps its own workspace in the context.
"""

import numpy as np

from . import _lib as L
from . import _tensor as T
from .core import Cache, Context, Plan, merge_states as _merge
from ._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError
from ._fi_common import (  # noqa: F401 (get_alibi_slopes is public here)
    LN2,
    _dtype,
    get_alibi_slopes,
    _context_for,
    _paged_metadata,
    _KVCacheViews,
    _sm_scale,
    _alibi_slopes,
    _packed,
    _refuse_multi_item,
    _refuse_run_options,
    _causal_for,
    _check_name,
    _staged,
    _unstage,
    _esize,
    _scale_lse,
    _alibi_lse_shift)

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "get_alibi_slopes",
]

class _PagedWrapper:
    """What the paged decode and prefill wrappers share: the kva plans of one
    FlashInfer plan() (one per cache form and run-time window/scale), the
    cache views and run()."""

    def __init__(self, float_workspace_buffer, kv_layout, context):
        _check_name("kv_layout", kv_layout, ("NHD", "HND"))
        self._layout = 0 if kv_layout == "NHD" else 1
        self._ctx = _context_for(float_workspace_buffer, context)
        self._views = _KVCacheViews()
        self._plans = {}
        self._args = None
        self._last_mult = 1  # block-id multiplier of the cache form run() saw last
        self._alibi_lse = None  # _alibi_lse_shift of the plan

    def _set_plan(self, qo_indptr, seq_lens, block_table, num_qo_heads, num_kv_heads, head_dim,
                  head_dim_vo, page_size, causal, pos_encoding_mode, window_left,
                  logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type,
                  rope_scale=None, rope_theta=None):
        _check_name("pos_encoding_mode", pos_encoding_mode, ("NONE", "ROPE_LLAMA", "ALIBI"))
        if pos_encoding_mode not in ("NONE", "ALIBI"):
            raise UnsupportedError("pos_encoding_mode %r: kvattn applies no RoPE inside attention"
                                   " (apply it to q and k before the call)" % (pos_encoding_mode,))
        qdt = _dtype(q_data_type)
        for name, x in (("kv_data_type", kv_data_type), ("o_data_type", o_data_type)):
            if x is not None and _dtype(x) != qdt:
                raise UnsupportedError("%s %s differs from q_data_type: kvattn's wrapped caches "
                                       "and outputs use the query dtype" % (name, x))
        self._args = dict(
            query_start_loc=qo_indptr, seq_lens=seq_lens, block_table=block_table,
            block_size=page_size, num_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, head_dim_v=head_dim_vo or head_dim, q_dtype=qdt,
            scale=_sm_scale(sm_scale, head_dim),
            causal=_causal_for(causal, qo_indptr, seq_lens),
            window_left=-1 if window_left is None else window_left,
            softcap=logits_soft_cap or 0.0,
            alibi_slopes=_alibi_slopes(pos_encoding_mode, logits_soft_cap, num_qo_heads))
        self._alibi_lse = _alibi_lse_shift(qo_indptr, seq_lens, self._args["alibi_slopes"])
        self._plans = {}
        # Validates the metadata now, as FlashInfer's plan() does, for the cache
        # form of the last run.
        self._plan_for(self._last_mult, None, 1.0)

    def _plan_for(self, mult, window_left, scale_mul):
        a = self._args
        if a is None:
            raise InvalidArgumentError("run() before plan()")
        key = (mult, window_left, scale_mul)
        p = self._plans.get(key)
        if p is None:
            kw = dict(a)
            if mult != 1:
                kw["block_table"] = a["block_table"] * mult
            if window_left is not None:
                kw["window_left"] = window_left
            kw["scale"] = _sm_scale(a["scale"], a["head_dim"], scale_mul)
            p = Plan(self._ctx, **kw)
            if self._ctx.device == T.CUDA:
                self._plans.clear()  # a CUDA context's newer plan makes older ones stale
            self._plans[key] = p
        return p

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
            use_fp16_softmax=None, uses_spcompress=None):
        """Attention for the planned batch: q [T, H, D] -> out [T, H, Dv], or
        (out, lse) with lse [T, H] float32 in base 2 when return_lse is set
        (a given lse is written either way; only return_lse decides what is
        returned, as in FlashInfer).
        q_scale and k_scale (floats) multiply sm_scale, v_scale the output.
        q_len_per_req (FlashInfer's deprecated run-time copy of plan()'s)
        only checks q's rows; use_fp16_softmax and uses_spcompress pick
        FlashInfer's trtllm-gen kernels and are ignored; kv_cache_sf (NVFP4
        caches) and skip_softmax_threshold_scale_factor (an approximation)
        raise UnsupportedError."""
        if args:
            raise InvalidArgumentError("run(): unexpected positional arguments %r" % (args,))
        a = self._args
        if a is None:
            raise InvalidArgumentError("run() before plan()")
        _refuse_run_options(kv_cache_sf, skip_softmax_threshold_scale_factor)
        if q_len_per_req is not None:
            n = _q_len_per_req(q_len_per_req)
            r = len(a["seq_lens"])
            if T.view(q, "q").shape[0] != r * n:
                raise InvalidArgumentError(
                    "q has %d rows, but q_len_per_req %d x %d requests = %d"
                    % (T.view(q, "q").shape[0], n, r, r * n))
        ctx = self._ctx
        if ctx.device == T.CUDA and T.is_torch(q):
            import torch

            ctx.set_stream(torch.cuda.current_stream(q.device).cuda_stream)
        cache, mult = self._views.get(ctx, paged_kv_cache, self._layout, a["block_size"],
                                      a["num_kv_heads"], a["head_dim"], a["head_dim_v"],
                                      a["q_dtype"])
        sm = float(q_scale if q_scale is not None else 1.0) * \
            float(k_scale if k_scale is not None else 1.0)
        wl = None if window_left is None or window_left == a["window_left"] else window_left
        self._last_mult = mult
        plan = self._plan_for(mult, wl, sm)
        want_lse = return_lse or lse is not None
        ins = (("q", q), ("sinks", sinks))
        out, out_dst = _staged(out, "out", ins)
        lse, lse_dst = _staged(lse, "lse", ins)
        res = plan.run(_packed(q), cache, out=out, lse=lse, return_lse=want_lse, sinks=sinks)
        o, l = res if want_lse else (res, None)
        if v_scale is not None and float(v_scale) != 1.0:
            o *= float(v_scale)
        o = _unstage(o, out_dst)
        if l is not None:  # a given lse is written even without return_lse, as FlashInfer's
            _scale_lse(l, self._alibi_lse)
            l = _unstage(l, lse_dst)
        return (o, l) if return_lse else o

    def run_return_lse(self, q, paged_kv_cache, *args, **kw):
        kw["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kw)

    forward = run
    forward_return_lse = run_return_lse

    def end_forward(self):
        """Kept for old FlashInfer code; nothing to release."""


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """FlashInfer's decode wrapper: one query token per request over a paged
    cache. float_workspace_buffer picks the device (CPU tensors: the CPU
    backend; CUDA tensors: the CUDA backend on that device); context= passes
    an explicit kvattn Context instead."""

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, context=None):
        super().__init__(float_workspace_buffer, kv_layout, context)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             q_len_per_req=1, *, window_right=0):
        """FlashInfer's decode plan (its current argument order, o_data_type
        before data_type). q_len_per_req > 1: each request has that many query
        rows (speculative decoding), causal among themselves, and needs as
        many keys; window_right must be 0 (FlashInfer's default: no key right
        of the query)."""
        if data_type is not None:  # FlashInfer's older name for q/kv dtype
            q_data_type = kv_data_type = data_type
        if window_right != 0:
            raise UnsupportedError("window_right %r: kvattn's masks keep no key right of the "
                                   "query (FlashInfer's default 0)" % (window_right,))
        n = _q_len_per_req(q_len_per_req)
        sl, bt = _paged_metadata(indptr, indices, last_page_len, page_size)
        r = sl.shape[0]
        if n > 1 and r and sl.min() < n:
            raise InvalidArgumentError("q_len_per_req = %d needs kv_len >= %d for every request "
                                       "(the verified tokens are in the cache), but a request "
                                       "has kv_len %d" % (n, n, sl.min()))
        self._set_plan(np.arange(r + 1, dtype=np.int32) * int(n), sl, bt, num_qo_heads,
                       num_kv_heads, head_dim, None, page_size,
                       bool(r == 0 or sl.min() >= 1), pos_encoding_mode, window_left,
                       logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type)

    begin_forward = plan


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """FlashInfer's prefill / append wrapper: qo_indptr [R+1] query rows per
    request over a paged cache; causal is bottom-right aligned (query i of a
    request with q tokens and s keys sees keys j <= s - q + i)."""

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, *, context=None):
        super().__init__(float_workspace_buffer, kv_layout, context)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None,
             max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False):
        if custom_mask is not None or packed_custom_mask is not None:
            raise UnsupportedError("custom_mask: kvattn has causal, window, soft-cap and ALiBi "
                                   "masks, no custom masks")
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                           max_item_len_ptr)
        sl, bt = _paged_metadata(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                 page_size)
        qo = T.host_array(qo_indptr, np.int32, "qo_indptr")
        if qo.shape != (sl.shape[0] + 1,):
            raise ShapeMismatchError("qo_indptr: shape %s, expected (%d,)"
                                     % (qo.shape, sl.shape[0] + 1))
        self._set_plan(qo, sl, bt, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                       page_size, causal, pos_encoding_mode, window_left, logits_soft_cap,
                       sm_scale, q_data_type, kv_data_type, o_data_type)

    begin_forward = plan


class BatchPrefillWithRaggedKVCacheWrapper:
    """FlashInfer's ragged prefill wrapper: new K/V packed per request
    (kv_indptr [R+1]) instead of a paged cache (kva_attention_run_ragged)."""

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, *, context=None):
        _check_name("kv_layout", kv_layout, ("NHD", "HND"))
        if kv_layout != "NHD":
            raise UnsupportedError("kv_layout %r: ragged K/V are [tokens, Hkv, D] (NHD)"
                                   % (kv_layout,))
        self._ctx = _context_for(float_workspace_buffer, context)
        self._plan = None
        self._alibi_lse = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False,
             seq_lens=None, seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None,
             v_indptr=None, o_indptr=None):
        if custom_mask is not None or packed_custom_mask is not None:
            raise UnsupportedError("custom_mask is not supported by kvattn")
        _check_name("pos_encoding_mode", pos_encoding_mode, ("NONE", "ROPE_LLAMA", "ALIBI"))
        if pos_encoding_mode not in ("NONE", "ALIBI"):
            raise UnsupportedError("pos_encoding_mode %r is not supported" % (pos_encoding_mode,))
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                           max_item_len_ptr)
        qdt = _dtype(q_data_type)
        for name, x in (("kv_data_type", kv_data_type), ("o_data_type", o_data_type)):
            if x is not None and _dtype(x) != qdt:
                raise UnsupportedError("%s %s differs from q_data_type: kvattn's ragged k / v "
                                       "and outputs use the query dtype" % (name, x))
        kv = T.host_array(kv_indptr, np.int64, "kv_indptr")
        if kv.ndim != 1 or kv.shape[0] < 1 or (np.diff(kv) < 0).any():
            raise InvalidArgumentError("kv_indptr must be a non-decreasing [R+1] array")
        self._kv_first = int(kv[0])
        slopes = _alibi_slopes(pos_encoding_mode, logits_soft_cap, num_qo_heads)
        self._plan = Plan(
            self._ctx, qo_indptr, np.diff(kv).astype(np.int32), None,
            block_size=1, num_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim_qk, head_dim_v=head_dim_vo or head_dim_qk, q_dtype=qdt,
            scale=_sm_scale(sm_scale, head_dim_qk),
            causal=_causal_for(causal, qo_indptr, np.diff(kv)), window_left=window_left,
            softcap=logits_soft_cap or 0.0,
            alibi_slopes=slopes)
        self._alibi_lse = _alibi_lse_shift(qo_indptr, np.diff(kv), slopes)

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None,
            out=None, lse=None, return_lse=False, enable_pdl=None, kv_cache_sf=None,
            sinks=None):
        """q [T, H, D], k [kv_indptr[-1], Hkv, D], v [.., Hkv, Dv] -> out (, lse base 2).
        q_scale / k_scale / v_scale / o_scale (FlashInfer: calibration scales
        of fp8 inputs, which its fa2 kernels ignore for 16-bit ones and its
        cutlass kernels apply) must be None or 1; kv_cache_sf (NVFP4) raises
        UnsupportedError."""
        if args:
            raise InvalidArgumentError("run(): unexpected positional arguments %r" % (args,))
        p = self._plan
        if p is None:
            raise InvalidArgumentError("run() before plan()")
        _refuse_run_options(kv_cache_sf, None)
        for name, x in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale),
                        ("o_scale", o_scale)):
            if x is not None and float(x) != 1.0:
                raise UnsupportedError("%s %r: the ragged wrapper's inputs are 16-bit, for which "
                                       "FlashInfer's backends disagree on calibration scales "
                                       "(fa2 ignores them, cutlass applies them); fold it into "
                                       "sm_scale / the output instead" % (name, x))
        T.view(k, "k"), T.view(v, "v")  # tensors, or a clear error
        if self._kv_first:
            k, v = k[self._kv_first:], v[self._kv_first:]
        n = p.kv_len_total
        if k.shape[0] != n or v.shape[0] != n:
            k, v = k[:n], v[:n]
        want_lse = return_lse or lse is not None
        ins = (("q", q), ("k", k), ("v", v), ("sinks", sinks))
        out, out_dst = _staged(out, "out", ins)
        lse, lse_dst = _staged(lse, "lse", ins)
        res = p.run_ragged(_packed(q), _packed(k), _packed(v), out=out, lse=lse,
                           return_lse=want_lse, sinks=sinks)
        if not want_lse:
            return _unstage(res, out_dst)
        _scale_lse(res[1], self._alibi_lse)
        o, l = _unstage(res[0], out_dst), _unstage(res[1], lse_dst)
        return (o, l) if return_lse else o  # a given lse is written either way

    def run_return_lse(self, q, k, v, *args, **kw):
        kw["return_lse"] = True
        return self.run(q, k, v, *args, **kw)

    forward = run
    forward_return_lse = run_return_lse


class MultiLevelCascadeAttentionWrapper:
    """FlashInfer's multi-level cascade wrapper (flashinfer.cascade): level l
    attends the queries of qo_indptr_arr[l] to the pages of level l (e.g. one
    prompt prefix shared by every request, then each request's own pages),
    all in one paged cache; run() merges the levels' results by their LSE.
    Each level is a paged prefill wrapper; only the last level is causal.
    Masks, ALiBi and windows count positions within each level, as
    FlashInfer's. On CUDA each level has its own context (a CUDA context
    keeps only its newest plan's device metadata)."""

    def __init__(self, num_levels, float_workspace_buffer=None, kv_layout="NHD",
                 use_cuda_graph=False, qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
                 paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None, *,
                 context=None):
        if isinstance(num_levels, bool) or not isinstance(num_levels, (int, np.integer)) or \
                num_levels < 1:
            raise InvalidArgumentError("num_levels = %r is not a positive integer"
                                       % (num_levels,))
        cuda_ctx = context is not None and context.device == T.CUDA
        self._levels = [
            BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer, kv_layout,
                context=Context("cuda", 0, context.device_id) if cuda_ctx and i else context)
            for i in range(int(num_levels))]

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
             paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None):
        """One list entry per level (FlashInfer's arrays of indptr / indices /
        last_page_len tensors); every level's qo_indptr ends at the same T."""
        n = len(self._levels)
        arrs = (qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len)
        if any(len(a) != n for a in arrs):
            raise InvalidArgumentError("plan(): %d levels, but %s entries"
                                       % (n, "/".join(str(len(a)) for a in arrs)))
        for i, (w, qo, ip, ix, lp) in enumerate(zip(self._levels, *arrs)):
            w.plan(qo, ip, ix, lp, num_qo_heads, num_kv_heads, head_dim, page_size,
                   causal=bool(causal) and i == n - 1, pos_encoding_mode=pos_encoding_mode,
                   sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                   q_data_type=q_data_type, kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """q [T, H, D] -> out [T, H, D]: the last level's result merged with
        every other level's, as FlashInfer's run() (no LSE returned)."""
        out, lse = self._levels[-1].run(q, paged_kv_cache, return_lse=True)
        for w in self._levels[:-1]:
            o, s = w.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, o, s)
        return out

    forward = run


def _q_len_per_req(n):
    """The decode wrapper's q_len_per_req (plan() and run()): an integer >= 1,
    never truncated (1.5 or "3" raise rather than becoming 1 or 3)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidArgumentError("q_len_per_req = %r is not an integer >= 1" % (n,))
    return int(n)


def _cat_last(a, b):
    """[.., x] and [.., y] -> [.., x + y], numpy or torch as a."""
    if T.is_torch(a):
        import torch

        return torch.cat([a, b], dim=-1).contiguous()
    return np.ascontiguousarray(np.concatenate([np.asarray(a), np.asarray(b)], axis=-1))


class BatchMLAPagedAttentionWrapper:
    """FlashInfer's MLA wrapper (flashinfer.mla): attention over a paged
    latent cache. run() is the absorbed kernel-level call (FlashMLA's
    flash_mla_with_kvcache): q_nope [T, H, Dc] (already multiplied by W_UK)
    and q_pe [T, H, Dr] -> out [T, H, Dc] (the caller applies W_UV).
    run_layer() (a kvattn extension) is the layer-level kva_mla_run: the
    un-absorbed q [T, H, Dn + Dr] and the layer's W_UK / W_UV -> out
    [T, H, Dv], each request on the absorbed or the compute-friendly path
    (docs/mla.md); plan() then needs qk_nope_head_dim and v_head_dim.

    ckv_cache [NP, B, Dc] and kpe_cache [NP, B, Dr] must be the two column
    slices of one [NP, B, Dc + Dr] tensor (kv[..., :Dc], kv[..., Dc:], as
    vLLM and SGLang keep them): kvattn's latent cache stores each token's
    [c_kv | k_pe] as one row. Pages are used in place."""

    def __init__(self, float_workspace_buffer=None, use_cuda_graph=False, qo_indptr=None,
                 kv_indptr=None, kv_indices=None, kv_len_arr=None, backend="auto", *,
                 context=None):
        self._ctx = _context_for(float_workspace_buffer, context)
        self._plan = None
        self._caches = {}

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type,
             use_profiler=False, *, qk_nope_head_dim=0, v_head_dim=0, decode_threshold=1):
        """kv_indptr [R+1] / kv_indices: each request's pages (CSR); kv_len_arr
        [R]: its keys. qk_nope_head_dim (Dn), v_head_dim (Dv) and
        decode_threshold are kvattn's, for run_layer()."""
        if use_profiler:
            raise UnsupportedError("use_profiler: kvattn has no intra-kernel profiler")
        qdt = _dtype(q_data_type)
        if kv_data_type is not None and _dtype(kv_data_type) != qdt:
            raise UnsupportedError("kv_data_type %s differs from q_data_type: kvattn's wrapped "
                                   "latent caches use the query dtype" % (kv_data_type,))
        ip = T.host_array(kv_indptr, np.int32, "kv_indptr")
        kl = T.host_array(kv_len_arr, np.int32, "kv_len_arr")
        if ip.ndim != 1 or ip.shape[0] < 1 or kl.shape != (ip.shape[0] - 1,):
            raise ShapeMismatchError("kv_indptr %s must be [R+1] and kv_len_arr %s [R]"
                                     % (ip.shape, kl.shape))
        npages = np.diff(ip)
        if kl.size and (kl.min() < 0 or (kl > np.maximum(npages, 0) * page_size).any()):
            raise InvalidArgumentError("kv_len_arr[r] must lie in [0, pages of request r * "
                                       "page_size = %d * pages]" % page_size)
        # The page table only needs each request's page count; its keys are kv_len_arr.
        last = np.where(npages > 0, kl - (npages - 1) * page_size, 0).clip(0, page_size)
        _, bt = _paged_metadata(ip, kv_indices, last.astype(np.int32), page_size)
        qo = T.host_array(qo_indptr, np.int32, "qo_indptr")
        if qo.shape != (kl.shape[0] + 1,):
            raise ShapeMismatchError("qo_indptr: shape %s, expected (%d,)"
                                     % (qo.shape, kl.shape[0] + 1))
        self._dims = (num_heads, head_dim_ckv, head_dim_kpe, qk_nope_head_dim, v_head_dim)
        self._page_size = page_size
        self._plan = Plan(self._ctx, qo, kl, bt, block_size=page_size, num_heads=num_heads,
                          num_kv_heads=1, head_dim=head_dim_ckv + head_dim_kpe,
                          head_dim_v=head_dim_ckv, q_dtype=qdt, scale=sm_scale,
                          causal=_causal_for(causal, qo, kl), decode_threshold=decode_threshold,
                          kind="mla",
                          mla_qk_nope_head_dim=qk_nope_head_dim, mla_v_head_dim=v_head_dim)

    begin_forward = plan

    def _cache(self, ckv_cache, kpe_cache):
        """The latent cache over the caller's [c_kv | k_pe] pages."""
        ctx = self._ctx
        _, dc, dr, _, _ = self._dims
        c = T.view(ckv_cache, "ckv_cache")
        p = T.view(kpe_cache, "kpe_cache")
        if len(c.shape) != 3 or len(p.shape) != 3 or c.shape[2] != dc or p.shape[2] != dr or \
                tuple(p.shape[:2]) != tuple(c.shape[:2]) or c.shape[1] != self._page_size:
            raise ShapeMismatchError("ckv_cache %s, kpe_cache %s: expected [NP, %d, %d] and "
                                     "[NP, %d, %d]" % (c.shape, p.shape, self._page_size, dc,
                                                       self._page_size, dr))
        nb, b, row = c.shape[0], c.shape[1], dc + dr
        one = (c.dtype == p.dtype and p.ptr == c.ptr + dc * _esize(c.dtype) and
               tuple(c.strides) == (b * row, row, 1) and tuple(p.strides) == (b * row, row, 1))
        if not one:
            raise UnsupportedError(
                "ckv_cache / kpe_cache: kvattn's latent cache keeps each token's [c_kv | k_pe] "
                "in one row; pass kv[..., :%d] and kv[..., %d:] of one contiguous "
                "[NP, B, %d] tensor" % (dc, dc, row))
        key = (c.ptr, nb, b, c.dtype, c.device_id)
        cache = self._caches.get(key)
        if cache is None:
            if c.device != ctx.device:
                raise InvalidArgumentError("ckv_cache: on %s, the wrapper's backend computes on %s"
                                           % (c.device, ctx.device))
            if len(self._caches) > 64:
                self._caches.clear()
            cache = Cache._wrap(ctx, c.ptr, None, nb, b, 1, row, dc, c.dtype, 0, (),
                                kind=L.KINDS["mla"])
            self._caches[key] = cache
        return cache

    def _finish(self, res, want_lse, return_lse, base_e, out_dst, lse_dst):
        """out, or (out, lse) when return_lse: as FlashInfer's run(), a given
        lse is written without return_lse too, and only out returned."""
        if not want_lse:
            return _unstage(res, out_dst)
        if not base_e:
            _scale_lse(res[1])
        o, l = _unstage(res[0], out_dst), _unstage(res[1], lse_dst)
        return (o, l) if return_lse else o

    def _start(self, what, q, ckv_cache, kpe_cache):
        """The plan and the latent cache of a run (and, CUDA, torch's stream)."""
        p = self._plan
        if p is None:
            raise InvalidArgumentError("%s before plan()" % what)
        if self._ctx.device == T.CUDA and T.is_torch(q):
            import torch

            self._ctx.set_stream(torch.cuda.current_stream(q.device).cuda_stream)
        return p, self._cache(ckv_cache, kpe_cache)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False,
            o_scale=None, *, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None):
        """The absorbed call: q_nope [T, H, Dc], q_pe [T, H, Dr] -> out
        [T, H, Dc], or (out, lse [T, H] float32, base 2 unless
        return_lse_base_on_e). q_nope and q_pe are concatenated into one
        [T, H, Dc + Dr] query (a copy). profiler_buffer, kv_len and page_table
        (FlashInfer's cutlass backend) are ignored; o_scale (an fp8 out),
        ckv_scale, ckv_scale_arr and kpe_scale (fp8 latent pages, which the
        wrapper does not wrap) raise UnsupportedError."""
        for name, x in (("o_scale", o_scale), ("ckv_scale", ckv_scale),
                        ("ckv_scale_arr", ckv_scale_arr), ("kpe_scale", kpe_scale)):
            if x is not None:
                raise UnsupportedError("%s: kvattn's MLA wrapper reads 16-bit latent pages and "
                                       "writes a 16-bit out (fp8 latent caches are kvattn-owned "
                                       "Cache.mla(..., dtype='fp8_e4m3') objects)" % name)
        p, cache = self._start("run()", q_nope, ckv_cache, kpe_cache)
        want = return_lse or lse is not None
        ins = (("q_nope", q_nope), ("q_pe", q_pe))
        out, out_dst = _staged(out, "out", ins)
        lse, lse_dst = _staged(lse, "lse", ins)
        res = p.run(_cat_last(q_nope, q_pe), cache, out=out, lse=lse, return_lse=want)
        return self._finish(res, want, return_lse, return_lse_base_on_e, out_dst, lse_dst)

    def run_layer(self, q, w_uk, w_uv, ckv_cache, kpe_cache, out=None, lse=None,
                  return_lse=False, return_lse_base_on_e=False):
        """kvattn's layer-level call (kva_mla_run): q [T, H, Dn + Dr] (q_nope,
        q_pe), w_uk [H, Dn, Dc], w_uv [H, Dc, Dv] -> out [T, H, Dv], or (out,
        lse) as run()."""
        p, cache = self._start("run_layer()", q, ckv_cache, kpe_cache)
        want = return_lse or lse is not None
        ins = (("q", q), ("w_uk", w_uk), ("w_uv", w_uv))
        out, out_dst = _staged(out, "out", ins)
        lse, lse_dst = _staged(lse, "lse", ins)
        res = p.run_mla(q, w_uk, w_uv, cache, out=out, lse=lse, return_lse=want)
        return self._finish(res, want, return_lse, return_lse_base_on_e, out_dst, lse_dst)


def _f32(s):
    """s as float32, as FlashInfer's merge functions convert their LSEs
    (a numpy array or torch tensor of another float dtype is copied)."""
    if T.is_torch(s):
        import torch

        return s.to(torch.float32)
    return np.asarray(s, np.float32)


def merge_state(v_a, s_a, v_b, s_b):
    """FlashInfer's merge_state: v_* [T, H, D], s_* [T, H] base-2 LSE
    (converted to float32, as FlashInfer does) -> (v, s) of the union of the
    two key sets (s float32, base 2)."""
    v, s = _merge(v_a, _f32(s_a) * LN2, v_b, _f32(s_b) * LN2)
    _scale_lse(s)
    return v, s


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """Merges (v_other, s_other) into (v, s) in place; with a boolean mask [T],
    only the rows where it is true."""
    if mask is None:
        sn = s * LN2
        _merge(v, sn, v_other, s_other * LN2, out=v, lse=sn)
        _scale_lse(sn)
        s[...] = sn
        return
    nv, ns = merge_state(v, s, v_other, s_other)
    v[mask] = nv[mask]
    s[mask] = ns[mask]


def _contiguous(x):
    return x.contiguous() if T.is_torch(x) else np.ascontiguousarray(x)


def _copy(x):
    return x.clone() if T.is_torch(x) else np.array(x, copy=True)


def merge_states(v, s):
    """FlashInfer's merge_states: v [T, N, H, D], s [T, N, H] (base 2) ->
    (V [T, H, D], S [T, H]) merged over the N states."""
    if len(v.shape) != 4 or tuple(s.shape) != tuple(v.shape[:3]):
        raise ShapeMismatchError("merge_states: v %s must be [T, N, H, D] and s %s [T, N, H]"
                                 % (tuple(v.shape), tuple(s.shape)))
    if v.shape[1] == 0:
        raise InvalidArgumentError("merge_states: no states (N = 0)")
    s = _f32(s)
    acc_v = _copy(v[:, 0])  # merged into in place: never a view of v
    acc_s = _contiguous(s[:, 0]) * LN2
    for i in range(1, v.shape[1]):
        _merge(acc_v, acc_s, _contiguous(v[:, i]), _contiguous(s[:, i]) * LN2,
               out=acc_v, lse=acc_s)
    _scale_lse(acc_s)
    return acc_v, acc_s
