"""FlashInfer's MLA wrapper (flashinfer.mla.BatchMLAPagedAttentionWrapper)
over kvattn's latent caches; kvattn.flashinfer exports it with the other
FlashInfer-compatible wrappers (see that module's docstring).
"""

import numpy as np

from . import _lib as L
from . import _tensor as T
from .core import Cache, Plan
from ._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError
from ._fi_common import _dtype, _context_for, _paged_metadata, _causal_for, _staged, _unstage, \
    _esize, _scale_lse


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
