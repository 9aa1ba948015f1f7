"""FlashInfer-compatible wrappers over kvattn.

A FlashInfer user switches by changing the import:

    from kvattn import flashinfer            # instead of `import flashinfer`
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(indptr, indices, last_page_len, H, Hkv, D, page_size, ...)
    out = w.run(q, (k_cache, v_cache))

The names, constructor, plan() and run() arguments follow FlashInfer's
(flashinfer.decode / flashinfer.prefill / flashinfer.cascade), and so do the
submodules kvattn.flashinfer.decode, .prefill, .cascade, .mla, .page and
.utils, which hold the names FlashInfer 0.7.2 puts there (the same objects;
fast_decode_plan, get_seq_lens, trtllm_batch_decode_with_kv_cache and
trtllm_batch_decode_with_kv_cache_mla are in _functions.py); the returned
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
skip-softmax, the ragged wrapper's fp8 calibration scales, custom JIT
attention variants: jit_args, variant_owns_mask); an unknown keyword raises
TypeError, as in FlashInfer. The deprecated forward() / forward_return_lse()
take FlashInfer's positional arguments, which (defaults included) replace
the plan's mask and scale, as FlashInfer's forward() does. Signatures follow
FlashInfer 0.7.2 (tests/python/test_fi_signatures.py).
A q (and the ragged wrapper's k / v) with token or head strides, such as a
slice of a fused qkv projection, is accepted as FlashInfer accepts it: the
wrapper copies it to a contiguous tensor first (kvattn's kernels read packed
rows); a strided last dimension is refused, as FlashInfer's kernels need it
dense. Likewise an out (or lse) with token or head strides: the run writes a
contiguous temporary, which is copied into it (a second copy of the output).
Arguments that only tune FlashInfer's own kernels (workspace buffers,
use_tensor_cores, backend, non_blocking, split options, uniform_q_len,
enable_pdl) are accepted and ignored: kvattn keeps its own workspace in the
context. use_cuda_graph is FlashInfer's CUDA-graph mode in the paged, cascade
and MLA wrappers (_fi_graph.py); the ragged wrapper has none and refuses
run() under capture.
"""

import functools

import numpy as np

from .. import _lib as L
from .. import _tensor as T
from ..core import Cache, Context, Plan, default_context, merge_states as _merge
from .._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError
from .._fi_mla import BatchMLAPagedAttentionWrapper  # noqa: F401 (public here)
from .. import _fi_graph as G
from .._fi_mask import tree_from_mask
from .._fi_common import (  # noqa: F401 (get_alibi_slopes is public here)
    LN2,
    _dtype,
    _same_dtype,
    get_alibi_slopes,
    _context_for,
    _on_default,
    _plan_context,
    _check_plan_context,
    _paged_metadata,
    _KVCacheViews,
    _sm_scale,
    _alibi_slopes,
    _packed,
    _refuse_custom_variant,
    _refuse_multi_item,
    _refuse_run_options,
    _lse_form,
    _finish_lse,
    _causal_for,
    _check_name,
    _staged_outputs,
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
    "fast_decode_plan",
    "get_seq_lens",
]

class _PagedWrapper:
    """What the paged decode and prefill wrappers share: the kva plans of one
    FlashInfer plan() (one per cache form and run-time window/scale), the
    cache views and run()."""

    def __init__(self, float_workspace_buffer, kv_layout, context, graph=None):
        _check_name("kv_layout", kv_layout, ("NHD", "HND"))
        self._graph = graph  # _fi_graph.GraphMode in FlashInfer's CUDA-graph mode
        self._layout = 0 if kv_layout == "NHD" else 1
        self._ctx = _context_for(float_workspace_buffer, context)
        self._default = _on_default(self._ctx, context)
        self._plan_ctx = None  # the context of the current plan
        self._views = _KVCacheViews()
        self._plans = {}
        self._args = None
        self._last_mult = 1  # block-id multiplier of the cache form run() saw last
        self._alibi_lse = None  # _alibi_lse_shift of the plan

    def _drop_views(self):
        self._views = _KVCacheViews()

    def _set_plan(self, qo_indptr, seq_lens, block_table, num_qo_heads, num_kv_heads, head_dim,
                  head_dim_vo, page_size, causal, pos_encoding_mode, window_left,
                  logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type,
                  rope_scale=None, rope_theta=None, tree=None):
        # What plan() was given, for forward() to replan with its overrides;
        # tree: the flat parents of a custom mask (_fi_mask.py), or None.
        given = dict(locals())
        del given["self"]
        _check_name("pos_encoding_mode", pos_encoding_mode, ("NONE", "ROPE_LLAMA", "ALIBI"))
        if pos_encoding_mode not in ("NONE", "ALIBI"):
            raise UnsupportedError("pos_encoding_mode %r: kvattn applies no RoPE inside attention"
                                   " (apply it to q and k before the call)" % (pos_encoding_mode,))
        qdt = _dtype(q_data_type)
        _plan_context(self)
        old = (self._args, self._alibi_lse, self._plans)
        for name, x in (("kv_data_type", kv_data_type), ("o_data_type", o_data_type)):
            _same_dtype(name, x, qdt, "kvattn's wrapped caches and outputs use the query dtype")
        self._args = dict(
            query_start_loc=qo_indptr, seq_lens=seq_lens, block_table=block_table,
            block_size=page_size, num_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, head_dim_v=head_dim_vo or head_dim, q_dtype=qdt,
            scale=_sm_scale(sm_scale, head_dim),
            causal=tree is not None or _causal_for(causal, qo_indptr, seq_lens),
            window_left=-1 if window_left is None else window_left,
            softcap=logits_soft_cap or 0.0,
            alibi_slopes=_alibi_slopes(pos_encoding_mode, logits_soft_cap, num_qo_heads))
        if tree is not None:
            self._args["tree"] = tree
        self._alibi_lse = _alibi_lse_shift(qo_indptr, seq_lens, self._args["alibi_slopes"])
        self._plans = {}
        # Validates the metadata now, as FlashInfer's plan() does, for the cache
        # form of the last run; a refused plan leaves the wrapper as it was.
        try:
            self._plan_for(self._last_mult, None, 1.0)
        except BaseException:
            self._args, self._alibi_lse, self._plans = old
            raise
        self._given = given
        self._plan_ctx = self._ctx

    def _forward(self, q, paged_kv_cache, return_lse, q_scale, k_scale, v_scale, **mask):
        """FlashInfer's deprecated forward() / forward_return_lse(): their
        mask and scale arguments (defaults included) replace plan()'s, for
        later run() calls too, as FlashInfer's forward() sets the wrapper's
        state before calling run()."""
        if self._args is None:
            raise InvalidArgumentError("forward() before plan()")
        if any(self._given[k] != x for k, x in mask.items()):  # else the plan stands
            self._set_plan(**dict(self._given, **mask))
        return self._run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                         return_lse=return_lse)

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
            G.on_current_stream(self._ctx)
            gkey = self._graph.reserve(self._ctx, kw) if self._graph is not None else None
            p = Plan(self._ctx, **kw)
            if self._graph is not None:
                self._graph.made(gkey)
            if self._ctx.device == T.CUDA:
                self._plans.clear()  # a CUDA context's newer plan makes older ones stale
            self._plans[key] = p
        return p

    def _run(self, q, paged_kv_cache, args=(), q_scale=None, k_scale=None, v_scale=None,
             out=None, lse=None, return_lse=False, window_left=None, sinks=None,
             q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
             lse_base="log2", lse_layout="NH"):
        """The run() of both paged wrappers (see theirs)."""
        if args:
            raise InvalidArgumentError("run(): unexpected positional arguments %r" % (args,))
        lse, lse_hn = _lse_form(lse, lse_base, lse_layout, return_lse, q)
        a = self._args
        if a is None:
            raise InvalidArgumentError("run() before plan()")
        _check_plan_context(self._plan_ctx)
        _refuse_run_options(kv_cache_sf, skip_softmax_threshold_scale_factor)
        if q_len_per_req is not None:
            n = _q_len_per_req(q_len_per_req)
            r = len(a["seq_lens"])
            if T.view(q, "q").shape[0] != r * n:
                raise InvalidArgumentError(
                    "q has %d rows, but q_len_per_req %d x %d requests = %d"
                    % (T.view(q, "q").shape[0], n, r, r * n))
        ctx = self._ctx
        if T.is_torch(q):
            G.on_current_stream(ctx)
        cache, mult = self._views.get(ctx, paged_kv_cache, self._layout, a["block_size"],
                                      a["num_kv_heads"], a["head_dim"], a["head_dim_v"],
                                      a["q_dtype"])
        sm = float(q_scale if q_scale is not None else 1.0) * \
            float(k_scale if k_scale is not None else 1.0)
        wl = None if window_left is None or window_left == a["window_left"] else window_left
        want_lse = return_lse or lse is not None
        if G.capturing(ctx, q):
            if want_lse and self._alibi_lse is not None:
                # The LSE shift is the plan's (_LseShift): a graph would keep
                # the captured plan's after the next plan().
                raise UnsupportedError("run() under CUDA graph capture with ALiBi and an LSE: "
                                       "FlashInfer's ALiBi LSE shift is per plan")
            G.refuse_uncaptured(self._graph, (mult, wl, sm) in self._plans)
        self._last_mult = mult
        plan = self._plan_for(mult, wl, sm)
        ins = (("q", q), ("sinks", sinks), ("paged_kv_cache", paged_kv_cache))
        out, out_dst, lse, lse_dst = _staged_outputs(out, lse, ins)
        res = plan.run(_packed(q), cache, out=out, lse=lse, return_lse=want_lse, sinks=sinks)
        o, l = res if want_lse else (res, None)
        if v_scale is not None and float(v_scale) != 1.0:
            o *= float(v_scale)
        o = _unstage(o, out_dst)
        if l is not None:  # a given lse is written even without return_lse, as FlashInfer's
            _scale_lse(l, self._alibi_lse)
            l = _unstage(l, lse_dst)
        if not return_lse:
            return o
        return o, _finish_lse(l, lse_base, lse_layout, lse_hn)

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
        _refuse_custom_variant(jit_args)
        graph = G.GraphMode.decode(paged_kv_indptr_buffer, paged_kv_indices_buffer,
                                   paged_kv_last_page_len_buffer) if use_cuda_graph else None
        super().__init__(float_workspace_buffer, kv_layout, context, graph)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             q_len_per_req=1, *, window_right=0, is_causal=None):
        """FlashInfer's decode plan (its current argument order, o_data_type
        before data_type). q_len_per_req > 1: each request has that many query
        rows (speculative decoding), causal among themselves, and needs as
        many keys; window_right must be 0 (FlashInfer's default: no key right
        of the query); is_causal, as FlashInfer's, may only restate that
        (None or q_len_per_req > 1)."""
        if data_type is not None:  # FlashInfer's older name for q/kv dtype
            q_data_type = kv_data_type = data_type
        if window_right != 0:
            raise UnsupportedError("window_right %r: kvattn's masks keep no key right of the "
                                   "query (FlashInfer's default 0)" % (window_right,))
        n = _q_len_per_req(q_len_per_req)
        if is_causal is not None and bool(is_causal) != (n > 1):
            raise UnsupportedError("is_causal %r with q_len_per_req %d: the decode mask is causal "
                                   "exactly when q_len_per_req > 1 (FlashInfer's rule too)"
                                   % (is_causal, n))
        sl, bt = _paged_metadata(indptr, indices, last_page_len, page_size)
        r = sl.shape[0]
        if self._graph is not None:
            self._graph.check_plan(r, T.view(indices, "indices").shape[0], r * n, n)
        if n > 1 and r and sl.min() < n:
            raise InvalidArgumentError("q_len_per_req = %d needs kv_len >= %d for every request "
                                       "(the verified tokens are in the cache), but a request "
                                       "has kv_len %d" % (n, n, sl.min()))
        self._set_plan(np.arange(r + 1, dtype=np.int32) * int(n), sl, bt, num_qo_heads,
                       num_kv_heads, head_dim, None, page_size,
                       bool(r == 0 or sl.min() >= 1), pos_encoding_mode, window_left,
                       logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type)
        if self._graph is not None:
            self._graph.planned(r * n, n)

    begin_forward = plan

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
        return self._run(q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse,
                         return_lse, window_left, sinks, q_len_per_req,
                         skip_softmax_threshold_scale_factor, kv_cache_sf)

    run_return_lse = functools.partialmethod(run, return_lse=True)  # as FlashInfer's

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated forward(): these arguments, defaults
        included, replace plan()'s (for later run() calls too), then run()."""
        return self._forward(q, paged_kv_cache, False, q_scale, k_scale, v_scale,
                             pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None,
                           k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                           sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (out, lse), as FlashInfer's."""
        return self._forward(q, paged_kv_cache, True, q_scale, k_scale, v_scale,
                             pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """FlashInfer's prefill / append wrapper: qo_indptr [R+1] query rows per
    request over a paged cache; causal is bottom-right aligned (query i of a
    request with q tokens and s keys sees keys j <= s - q + i)."""

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, jit_kwargs=None, variant_owns_mask=False, *,
                 context=None):
        _refuse_custom_variant(jit_args, variant_owns_mask)
        graph = G.GraphMode.prefill(qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf,
                                    paged_kv_last_page_len_buf) if use_cuda_graph else None
        super().__init__(float_workspace_buffer, kv_layout, context, graph)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None,
             max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False,
             uniform_q_len=None):
        """FlashInfer's prefill plan; uniform_q_len (a CUDA-graph scheduling
        hint of FlashInfer's, dropped there too when the batch is not
        uniform) is ignored. A custom_mask / packed_custom_mask must be a
        draft-tree verification mask (_fi_mask.py), planned as kvattn's tree
        (causal is then ignored, as FlashInfer ignores it under a custom
        mask); any other raises UnsupportedError."""
        masked = custom_mask is not None or packed_custom_mask is not None
        if masked and self._graph is not None:
            raise UnsupportedError("custom_mask in CUDA-graph mode: kvattn's graph mode is not "
                                   "yet checked with draft-tree plans (plan without "
                                   "use_cuda_graph)")
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                           max_item_len_ptr)
        sl, bt = _paged_metadata(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                 page_size)
        qo = T.host_array(qo_indptr, np.int32, "qo_indptr")
        if qo.shape != (sl.shape[0] + 1,):
            raise ShapeMismatchError("qo_indptr: shape %s, expected (%d,)"
                                     % (qo.shape, sl.shape[0] + 1))
        rows = int(qo[-1] - qo[0])
        tree = tree_from_mask(custom_mask, packed_custom_mask, qo, sl) if masked else None
        if self._graph is not None:
            self._graph.check_plan(sl.shape[0], T.view(paged_kv_indices, "paged_kv_indices")
                                   .shape[0], rows)
        self._set_plan(qo, sl, bt, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                       page_size, causal, pos_encoding_mode, window_left, logits_soft_cap,
                       sm_scale, q_data_type, kv_data_type, o_data_type, tree=tree)
        if self._graph is not None:
            self._graph.planned(rows)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None,
            window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None,
            uses_spcompress=None):
        """As the decode wrapper's run(); the returned lse (return_lse) is in
        lse_base "log2" (default) or "ln", and lse_layout "NH" ([T, H],
        default) or "HN" (a contiguous [H, T]; a given lse must be that),
        as FlashInfer's."""
        return self._run(q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse,
                         return_lse, window_left, sinks, None,
                         skip_softmax_threshold_scale_factor, kv_cache_sf, lse_base, lse_layout)

    run_return_lse = functools.partialmethod(run, return_lse=True)  # as FlashInfer's

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated forward(): these arguments, defaults
        included, replace plan()'s (for later run() calls too), then run()."""
        return self._forward(q, paged_kv_cache, False, None, k_scale, v_scale, causal=causal,
                             pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)

    def forward_return_lse(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, k_scale=None, v_scale=None,
                           window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                           rope_theta=None):
        """forward() returning (out, lse), as FlashInfer's."""
        return self._forward(q, paged_kv_cache, True, None, k_scale, v_scale, causal=causal,
                             pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                             rope_scale=rope_scale, rope_theta=rope_theta)


class BatchPrefillWithRaggedKVCacheWrapper:
    """FlashInfer's ragged prefill wrapper: new K/V packed per request
    (kv_indptr [R+1]) instead of a paged cache (kva_attention_run_ragged).
    It has no CUDA-graph mode: use_cuda_graph and its buffers are accepted,
    and run() under graph capture raises UnsupportedError."""

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                 variant_owns_mask=False, *, context=None):
        _refuse_custom_variant(jit_args, variant_owns_mask)
        _check_name("kv_layout", kv_layout, ("NHD", "HND"))
        if kv_layout != "NHD":
            raise UnsupportedError("kv_layout %r: ragged K/V are [tokens, Hkv, D] (NHD)"
                                   % (kv_layout,))
        self._ctx = _context_for(float_workspace_buffer, context)
        self._default = _on_default(self._ctx, context)
        self._plan = None
        self._alibi_lse = None
        self._given = None

    def _drop_views(self):
        pass  # ragged runs wrap no cache

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False,
             seq_lens=None, seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None,
             v_indptr=None, o_indptr=None, uniform_q_len=None):
        """FlashInfer's ragged plan; uniform_q_len (a CUDA-graph scheduling
        hint) is ignored."""
        if custom_mask is not None or packed_custom_mask is not None:
            raise UnsupportedError("custom_mask is not supported by kvattn")
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                           max_item_len_ptr)
        qdt = _dtype(q_data_type)
        for name, x in (("kv_data_type", kv_data_type), ("o_data_type", o_data_type)):
            _same_dtype(name, x, qdt, "kvattn's ragged k / v and outputs use the query dtype")
        kv = T.host_array(kv_indptr, np.int64, "kv_indptr")
        if kv.ndim != 1 or kv.shape[0] < 1 or (np.diff(kv) < 0).any():
            raise InvalidArgumentError("kv_indptr must be a non-decreasing [R+1] array")
        self._set_plan(qo_indptr, kv, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, qdt,
                       causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale)

    begin_forward = plan

    def _set_plan(self, qo_indptr, kv, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, qdt,
                  causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale):
        """The plan for the mask and scale arguments (plan()'s or forward()'s)."""
        given = dict(locals())
        del given["self"]
        _check_name("pos_encoding_mode", pos_encoding_mode, ("NONE", "ROPE_LLAMA", "ALIBI"))
        if pos_encoding_mode not in ("NONE", "ALIBI"):
            raise UnsupportedError("pos_encoding_mode %r is not supported" % (pos_encoding_mode,))
        slopes = _alibi_slopes(pos_encoding_mode, logits_soft_cap, num_qo_heads)
        _plan_context(self)
        self._plan = Plan(
            self._ctx, qo_indptr, np.diff(kv).astype(np.int32), None,
            block_size=1, num_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim_qk, head_dim_v=head_dim_vo or head_dim_qk, q_dtype=qdt,
            scale=_sm_scale(sm_scale, head_dim_qk),
            causal=_causal_for(causal, qo_indptr, np.diff(kv)), window_left=window_left,
            softcap=logits_soft_cap or 0.0,
            alibi_slopes=slopes)
        self._alibi_lse = _alibi_lse_shift(qo_indptr, np.diff(kv), slopes)
        self._kv_first = int(kv[0])
        self._given = given

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None,
            out=None, lse=None, return_lse=False, lse_base="log2", lse_layout="NH",
            enable_pdl=None, kv_cache_sf=None, sinks=None):
        """q [T, H, D], k [kv_indptr[-1], Hkv, D], v [.., Hkv, Dv] -> out (, lse).
        q_scale / k_scale / v_scale / o_scale (FlashInfer: calibration scales
        of fp8 inputs, which its fa2 kernels ignore for 16-bit ones and its
        cutlass kernels apply) must be None or 1; kv_cache_sf (NVFP4) raises
        UnsupportedError; lse_base and lse_layout as the paged prefill
        wrapper's run()."""
        if args:
            raise InvalidArgumentError("run(): unexpected positional arguments %r" % (args,))
        lse, lse_hn = _lse_form(lse, lse_base, lse_layout, return_lse, q)
        p = self._plan
        if p is None:
            raise InvalidArgumentError("run() before plan()")
        _check_plan_context(p.ctx)
        _refuse_run_options(kv_cache_sf, None)
        for name, x in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale),
                        ("o_scale", o_scale)):
            if x is not None and float(x) != 1.0:
                raise UnsupportedError("%s %r: the ragged wrapper's inputs are 16-bit, for which "
                                       "FlashInfer's backends disagree on calibration scales "
                                       "(fa2 ignores them, cutlass applies them); fold it into "
                                       "sm_scale / the output instead" % (name, x))
        T.view(k, "k"), T.view(v, "v")  # tensors, or a clear error
        if G.capturing(self._ctx, q):
            raise UnsupportedError(
                "BatchPrefillWithRaggedKVCacheWrapper.run() under CUDA graph capture: kvattn's "
                "ragged wrapper has no CUDA-graph mode yet (a later plan() may grow the context's "
                "device buffers, which the captured graph would go on reading); run it eagerly")
        if self._kv_first:
            k, v = k[self._kv_first:], v[self._kv_first:]
        n = p.kv_len_total
        if k.shape[0] != n or v.shape[0] != n:
            k, v = k[:n], v[:n]
        want_lse = return_lse or lse is not None
        ins = (("q", q), ("k", k), ("v", v), ("sinks", sinks))
        out, out_dst, lse, lse_dst = _staged_outputs(out, lse, ins)
        res = p.run_ragged(_packed(q), _packed(k), _packed(v), out=out, lse=lse,
                           return_lse=want_lse, sinks=sinks)
        if not want_lse:
            return _unstage(res, out_dst)
        _scale_lse(res[1], self._alibi_lse)
        o, l = _unstage(res[0], out_dst), _unstage(res[1], lse_dst)
        if not return_lse:
            return o  # a given lse is written either way
        return o, _finish_lse(l, lse_base, lse_layout, lse_hn)

    run_return_lse = functools.partialmethod(run, return_lse=True)  # as FlashInfer's

    def _forward(self, q, k, v, return_lse, **mask):
        """FlashInfer's deprecated forward(): its mask and scale arguments,
        defaults included, replace plan()'s (for later run() calls too)."""
        if self._given is None:
            raise InvalidArgumentError("forward() before plan()")
        if any(self._given[k] != x for k, x in mask.items()):  # else the plan stands
            self._set_plan(**dict(self._given, **mask))
        return self.run(q, k, v, return_lse=return_lse)

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated forward(): these arguments, defaults
        included, replace plan()'s, then run()."""
        return self._forward(q, k, v, False, causal=causal, pos_encoding_mode=pos_encoding_mode,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale)

    def forward_return_lse(self, q, k, v, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None,
                           sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (out, lse), as FlashInfer's."""
        return self._forward(q, k, v, True, causal=causal, pos_encoding_mode=pos_encoding_mode,
                             window_left=window_left, logits_soft_cap=logits_soft_cap,
                             sm_scale=sm_scale)


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

        def buf(arr, i):  # level i's CUDA-graph buffer, FlashInfer's per-level lists
            return arr[i] if use_cuda_graph and arr is not None else None

        self._levels = [
            BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer, kv_layout, use_cuda_graph,
                buf(qo_indptr_buf_arr, i), buf(paged_kv_indptr_buf_arr, i),
                buf(paged_kv_indices_buf_arr, i), buf(paged_kv_last_page_len_buf_arr, i),
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


def _f32(s):
    """s as float32, as FlashInfer's merge functions convert their LSEs
    (a numpy array or torch tensor of another float dtype is copied)."""
    if T.is_torch(s):
        import torch

        return s.to(torch.float32)
    return np.asarray(s, np.float32)


def _merge_ctx(v):
    """The default context of v's device, on torch's current stream there
    for a CUDA tensor (as the wrappers' runs: a merge under CUDA graph
    capture, the cascade wrapper's, is then captured with them)."""
    x = T.view(v, "v")
    ctx = default_context(x.device, x.device_id)
    G.on_current_stream(ctx)
    return ctx


def merge_state(v_a, s_a, v_b, s_b):
    """FlashInfer's merge_state: v_* [T, H, D], s_* [T, H] base-2 LSE
    (converted to float32, as FlashInfer does) -> (v, s) of the union of the
    two key sets (s float32, base 2)."""
    v, s = _merge(v_a, _f32(s_a) * LN2, v_b, _f32(s_b) * LN2, ctx=_merge_ctx(v_a))
    _scale_lse(s)
    return v, s


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """Merges (v_other, s_other) into (v, s) in place; with a boolean mask [T],
    only the rows where it is true."""
    if mask is None:
        sn = s * LN2
        _merge(v, sn, v_other, s_other * LN2, out=v, lse=sn, ctx=_merge_ctx(v))
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
    ctx = _merge_ctx(acc_v)
    for i in range(1, v.shape[1]):
        _merge(acc_v, acc_s, _contiguous(v[:, i]), _contiguous(s[:, i]) * LN2,
               out=acc_v, lse=acc_s, ctx=ctx)
    _scale_lse(acc_s)
    return acc_v, acc_s


# FlashInfer's submodules (flashinfer.decode, .prefill, .cascade, .mla, .page,
# .utils) with the names engines import from them; imported here, as
# FlashInfer's __init__ does, so that attribute access works after
# `from kvattn import flashinfer`.
from ._functions import fast_decode_plan, get_seq_lens  # noqa: E402
from . import cascade, decode, mla, page, prefill, utils  # noqa: E402,F401
