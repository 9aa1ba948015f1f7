"""FlashInfer's MLA wrapper (flashinfer.mla.BatchMLAPagedAttentionWrapper)
over kvattn's latent caches; kvattn.flashinfer exports it with the other
FlashInfer-compatible wrappers (see that module's docstring).
"""

import numpy as np

from . import _lib as L
from . import _tensor as T
from . import _fi_graph as G
from .core import Cache, Plan
from ._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError
from ._fi_common import _dtype, _same_dtype, _context_for, _on_default, _plan_context, \
    _check_plan_context, _paged_metadata, _causal_for, _staged_outputs, \
    _unstage, _esize, _scale_lse, _check_name, _packed


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
        self._default = _on_default(self._ctx, context)
        self._plan = None
        self._caches = {}
        self._graph = G.GraphMode.mla(qo_indptr, kv_indices) if use_cuda_graph else None

    def _drop_views(self):
        self._caches = {}  # latent caches wrapped over a closed context

    def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
             num_heads=None, head_dim_ckv=None, head_dim_kpe=None, page_size=None, causal=None,
             sm_scale=None, q_data_type=None, kv_data_type=None, use_profiler=False, *,
             metadata=None, cum_seq_lens_q=None, block_tables=None, seq_lens=None,
             max_q_len=None, query_layout=None, kv_cache_layout=None, lse_mode="none",
             output_dtype=None, output_scale="none", scale_mode="default", skip_softmax=False,
             enable_pdl=None, use_sinks=False, qk_nope_head_dim=0, v_head_dim=0,
             decode_threshold=1):
        """FlashInfer 0.7's MLA plan. The batch comes as CSR pages
        (qo_indptr [R+1], kv_indptr [R+1] / kv_indices: each request's pages,
        kv_len_arr [R]: its keys), as dense pages (cum_seq_lens_q [R+1],
        block_tables [R, max_pages], seq_lens [R]), or as metadata, an object
        with those attributes (FlashInfer's MLAPlanMetadata; a dual one is
        read as CSR). query_layout / kv_cache_layout, lse_mode, max_q_len and
        enable_pdl only declare what run() gets and are not needed; an
        output_dtype other than q's, output_scale, a scale_mode other than
        "default", skip_softmax and use_sinks raise UnsupportedError.
        qk_nope_head_dim (Dn), v_head_dim (Dv) and decode_threshold are
        kvattn's, for run_layer()."""
        if use_profiler:
            raise UnsupportedError("use_profiler: kvattn has no intra-kernel profiler")
        for name, x, ok in (("output_scale", output_scale, "none"),
                            ("scale_mode", scale_mode, "default"),
                            ("skip_softmax", skip_softmax, False), ("use_sinks", use_sinks, False)):
            if x != ok:
                raise UnsupportedError("%s %r: kvattn's MLA wrapper reads 16-bit latent pages with "
                                       "the exact softmax and no sinks" % (name, x))
        _check_name("lse_mode", lse_mode, ("none", "base2", "basee"))
        for name, x in (("query_layout", query_layout), ("kv_cache_layout", kv_cache_layout)):
            if x is not None:
                _check_name(name, x, ("packed", "split"))
        for name, x in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv),
                        ("head_dim_kpe", head_dim_kpe), ("page_size", page_size),
                        ("q_data_type", q_data_type)):
            if x is None:
                raise InvalidArgumentError("plan(): %s is required" % name)
        qdt = _dtype(q_data_type)
        for name, x in (("kv_data_type", kv_data_type), ("output_dtype", output_dtype)):
            _same_dtype(name, x, qdt,
                        "kvattn's wrapped latent caches and outputs use the query dtype")
        csr = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        dense = (cum_seq_lens_q, block_tables, seq_lens)
        if metadata is not None:
            if any(x is not None for x in csr + dense):
                raise InvalidArgumentError("plan(): metadata and the flat metadata arguments "
                                           "together")
            csr = tuple(getattr(metadata, n, None) for n in
                        ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"))
            dense = tuple(getattr(metadata, n, None) for n in
                          ("cum_seq_lens_q", "block_tables", "seq_lens"))
        if all(x is not None for x in csr):
            qo, kl, bt = self._csr(*csr, page_size)
        elif all(x is not None for x in dense):
            qo, kl, bt = self._dense(*dense, page_size)
        else:
            raise InvalidArgumentError("plan(): needs qo_indptr, kv_indptr, kv_indices and "
                                       "kv_len_arr, or cum_seq_lens_q, block_tables and seq_lens")
        rows = int(qo[-1] - qo[0]) if len(qo) else 0
        if self._graph is not None:
            self._graph.check_plan(len(kl), len(csr[2]) if csr[2] is not None else 0, rows)
        _plan_context(self)
        G.on_current_stream(self._ctx)
        causal = _causal_for(bool(causal), qo, kl)
        gkey = None
        if self._graph is not None:
            gkey = self._graph.reserve(
                self._ctx, dict(block_table=bt, query_start_loc=qo, num_heads=num_heads,
                                num_kv_heads=1, head_dim_v=head_dim_ckv,
                                head_dim=head_dim_ckv + head_dim_kpe, causal=causal,
                                block_size=page_size, q_dtype=qdt,
                                mla_layer=bool(qk_nope_head_dim)),
                mla_rows=G.mla_rows(num_heads, qo))
        plan = Plan(self._ctx, qo, kl, bt, block_size=page_size, num_heads=num_heads,
                    num_kv_heads=1, head_dim=head_dim_ckv + head_dim_kpe,
                    head_dim_v=head_dim_ckv, q_dtype=qdt, scale=sm_scale,
                    causal=causal, decode_threshold=decode_threshold, kind="mla",
                    mla_qk_nope_head_dim=qk_nope_head_dim, mla_v_head_dim=v_head_dim)
        # Only a plan that was made changes the wrapper (a refused one leaves it as it was).
        self._plan = plan
        if self._graph is not None:
            self._graph.made(gkey)
        self._dims = (num_heads, head_dim_ckv, head_dim_kpe, qk_nope_head_dim, v_head_dim)
        self._page_size = page_size
        if self._graph is not None:
            self._graph.planned(rows)

    begin_forward = plan

    @staticmethod
    def _dense(cum_seq_lens_q, block_tables, seq_lens, page_size):
        """(qo_indptr, kv_lens, block_table) of FlashInfer's dense metadata."""
        qo = T.host_array(cum_seq_lens_q, np.int32, "cum_seq_lens_q")
        kl = T.host_array(seq_lens, np.int32, "seq_lens")
        bt = T.host_array(block_tables, np.int32, "block_tables")
        if kl.ndim != 1 or qo.shape != (kl.shape[0] + 1,) or bt.ndim != 2 or \
                bt.shape[0] != kl.shape[0]:
            raise ShapeMismatchError("cum_seq_lens_q %s, block_tables %s, seq_lens %s: expected "
                                     "[R+1], [R, max_pages], [R]" % (qo.shape, bt.shape, kl.shape))
        if kl.size and (kl.min() < 0 or kl.max() > bt.shape[1] * page_size):
            raise InvalidArgumentError("seq_lens must lie in [0, block_tables' width * page_size "
                                       "= %d]" % (bt.shape[1] * page_size))
        return qo, kl, np.ascontiguousarray(bt)

    @staticmethod
    def _csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr, page_size):
        """(qo_indptr, kv_lens, block_table) of FlashInfer's CSR metadata."""
        ip = T.host_array(kv_indptr, np.int32, "kv_indptr")
        kl = T.host_array(kv_len_arr, np.int32, "kv_len_arr")
        if ip.ndim != 1 or ip.shape[0] < 1 or kl.shape != (ip.shape[0] - 1,):
            raise ShapeMismatchError("kv_indptr %s must be [R+1] and kv_len_arr %s [R]"
                                     % (ip.shape, kl.shape))
        npages = np.diff(ip)
        npages = npages.astype(np.int64)  # pages * page_size may pass int32
        if kl.size and (kl.min() < 0 or (kl > np.maximum(npages, 0) * page_size).any()):
            raise InvalidArgumentError("kv_len_arr[r] must lie in [0, pages of request r * "
                                       "page_size = %d * pages]" % page_size)
        # The page table only needs each request's page count; its keys are kv_len_arr.
        last = np.where(npages > 0, kl - (npages - 1) * page_size, 0).clip(0, page_size)
        _, bt = _paged_metadata(ip, kv_indices, last.astype(np.int32), page_size, lens=False)
        qo = T.host_array(qo_indptr, np.int32, "qo_indptr")
        if qo.shape != (kl.shape[0] + 1,):
            raise ShapeMismatchError("qo_indptr: shape %s, expected (%d,)"
                                     % (qo.shape, kl.shape[0] + 1))
        return qo, kl, bt

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
        # With the row's split: pages of other dims at the same address (a
        # freed buffer reused) are not the cache made for the earlier ones.
        key = (c.ptr, nb, b, dc, dr, c.dtype, c.device_id)
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
        _check_plan_context(p.ctx, what)
        if G.capturing(self._ctx, q):
            if self._dims[3]:
                # kva_mla_run's plan: its rounds, token maps and workspace
                # (beyond what Context.reserve holds) are the plan's own.
                raise UnsupportedError(
                    "run() / run_layer() under CUDA graph capture over a layer-level plan "
                    "(qk_nope_head_dim %d): kva_mla_run's rounds and workspace are per plan, so "
                    "a later plan() could change or grow what the graph reads" % self._dims[3])
            G.refuse_uncaptured(self._graph, True)
        if T.is_torch(q):
            G.on_current_stream(self._ctx)
        return p, self._cache(ckv_cache, kpe_cache)

    def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None,
            return_lse=False, profiler_buffer=None, kv_len=None, page_table=None,
            return_lse_base_on_e=False, o_scale=None, *, query=None, kv_cache=None,
            ckv_scale=None, ckv_scale_arr=None, kpe_scale=None, sinks=None,
            skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None):
        """The absorbed call: q_nope [T, H, Dc], q_pe [T, H, Dr] -> out
        [T, H, Dc], or (out, lse [T, H] float32, base 2 unless
        return_lse_base_on_e). FlashInfer 0.7's query= (a packed
        [T, H, Dc + Dr] tensor or a (q_nope, q_pe) pair) and kv_cache= (a
        packed [NP, B, Dc + Dr] tensor or a (ckv_cache, kpe_cache) pair) may
        replace them; a split query is concatenated into one [T, H, Dc + Dr]
        query (a copy). profiler_buffer, kv_len and page_table (FlashInfer's
        cutlass backend) are ignored; o_scale (an fp8 out), ckv_scale,
        ckv_scale_arr and kpe_scale (fp8 latent pages, which the wrapper does
        not wrap), sinks, skip_softmax_threshold_scale_factor, bmm1_scale and
        bmm2_scale raise UnsupportedError."""
        for name, x in (("o_scale", o_scale), ("ckv_scale", ckv_scale),
                        ("ckv_scale_arr", ckv_scale_arr), ("kpe_scale", kpe_scale),
                        ("sinks", sinks), ("bmm1_scale", bmm1_scale), ("bmm2_scale", bmm2_scale),
                        ("skip_softmax_threshold_scale_factor",
                         skip_softmax_threshold_scale_factor)):
            if x is not None:
                raise UnsupportedError("%s: kvattn's MLA wrapper reads 16-bit latent pages and "
                                       "writes a 16-bit out with the exact softmax, no sinks "
                                       "(fp8 latent caches are kvattn-owned "
                                       "Cache.mla(..., dtype='fp8_e4m3') objects)" % name)
        q, q_pe, ins = self._query(q_nope, q_pe, query)
        ckv_cache, kpe_cache = self._kv(ckv_cache, kpe_cache, kv_cache)
        p, cache = self._start("run()", q, ckv_cache, kpe_cache)
        want = return_lse or lse is not None
        ins = tuple(ins) + (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache))
        out, out_dst, lse, lse_dst = _staged_outputs(out, lse, ins)
        res = p.run(_packed(q) if q_pe is None else _cat_last(q, q_pe), cache, out=out, lse=lse,
                    return_lse=want)
        return self._finish(res, want, return_lse, return_lse_base_on_e, out_dst, lse_dst)

    @staticmethod
    def _query(q_nope, q_pe, query):
        """(q_nope or the packed query, q_pe or None, the inputs to check
        outputs against) of run()'s query arguments."""
        if query is not None:
            if q_nope is not None or q_pe is not None:
                raise InvalidArgumentError("run(): query= together with q_nope / q_pe")
            if isinstance(query, (tuple, list)):
                if len(query) != 2:
                    raise InvalidArgumentError("query: a packed tensor or a (q_nope, q_pe) pair")
                q_nope, q_pe = query
            else:
                return query, None, (("query", query),)
        if q_nope is None or q_pe is None:
            raise InvalidArgumentError("run(): needs q_nope and q_pe, or query=")
        return q_nope, q_pe, (("q_nope", q_nope), ("q_pe", q_pe))

    def _kv(self, ckv_cache, kpe_cache, kv_cache):
        """(ckv_cache, kpe_cache) of run()'s cache arguments; a packed
        [NP, B, Dc + Dr] kv_cache is split into its two column slices."""
        if kv_cache is None:
            if ckv_cache is None or kpe_cache is None:
                raise InvalidArgumentError("run(): needs ckv_cache and kpe_cache, or kv_cache=")
            return ckv_cache, kpe_cache
        if ckv_cache is not None or kpe_cache is not None:
            raise InvalidArgumentError("run(): kv_cache= together with ckv_cache / kpe_cache")
        if isinstance(kv_cache, (tuple, list)):
            if len(kv_cache) != 2:
                raise InvalidArgumentError("kv_cache: a packed tensor or a (ckv, kpe) pair")
            return kv_cache[0], kv_cache[1]
        if self._plan is None:
            raise InvalidArgumentError("run() before plan()")
        dc = self._dims[1]
        return kv_cache[..., :dc], kv_cache[..., dc:]

    def run_layer(self, q, w_uk, w_uv, ckv_cache, kpe_cache, out=None, lse=None,
                  return_lse=False, return_lse_base_on_e=False):
        """kvattn's layer-level call (kva_mla_run): q [T, H, Dn + Dr] (q_nope,
        q_pe), w_uk [H, Dn, Dc], w_uv [H, Dc, Dv] -> out [T, H, Dv], or (out,
        lse) as run()."""
        p, cache = self._start("run_layer()", q, ckv_cache, kpe_cache)
        want = return_lse or lse is not None
        ins = (("q", q), ("w_uk", w_uk), ("w_uv", w_uv), ("ckv_cache", ckv_cache),
               ("kpe_cache", kpe_cache))
        out, out_dst, lse, lse_dst = _staged_outputs(out, lse, ins)
        res = p.run_mla(q, w_uk, w_uv, cache, out=out, lse=lse, return_lse=want)
        return self._finish(res, want, return_lse, return_lse_base_on_e, out_dst, lse_dst)
