"""Decode context parallelism (include/kvattn_dcp.h, docs/dcp.md): the local
lengths and cache slots of one rank of a sharded cache, and the combine of
the ranks' partial results when they are in one process (kva_merge_states_n).

The communicator-backed combines (kvattn_mpi.h, kvattn_nccl.h) take the
caller's MPI or NCCL communicator and live in their own libraries; they have
no Python door.
"""

import numpy as np

from . import _errors
from . import _lib as L
from . import _tensor as T
from ._errors import InvalidArgumentError, ShapeMismatchError

_check = _errors.check


def _host_out(out, shape, dtype, name):
    """The caller's host output array (numpy, writable, contiguous, of shape
    and dtype), or a new one."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise InvalidArgumentError("%s: a numpy array expected, got %s"
                                   % (name, type(out).__name__))
    if not out.flags.writeable:
        raise InvalidArgumentError("%s: the array is read-only" % name)
    if out.dtype != dtype or out.shape != shape or not out.flags.c_contiguous:
        raise ShapeMismatchError("%s: %s %s (contiguous %s), expected %s %s"
                                 % (name, out.dtype, out.shape, out.flags.c_contiguous,
                                    np.dtype(dtype), shape))
    return out


def dcp_local_lens(seq_lens, dcp_size, dcp_rank, dcp_interleave=1, *, out=None):
    """kva_dcp_local_lens: the tokens rank dcp_rank of dcp_size holds of each
    request (token i on rank (i // I) % N, I = dcp_interleave; 0 means 1).
    seq_lens [R] global lengths (host int32: list, numpy or torch); returns
    int32 [R] (out, a numpy array, when given: out may be seq_lens itself)."""
    if out is not None and out is seq_lens:  # in place, as C allows
        sl = res = _host_out(out, np.shape(out), np.int32, "out")
    else:
        sl = T.host_array(seq_lens, np.int32, "seq_lens")
    if sl.ndim != 1:
        raise ShapeMismatchError("seq_lens: shape %s, expected [R]" % (sl.shape,))
    if out is None or out is not seq_lens:
        res = _host_out(out, sl.shape, np.int32, "out")
    _check(L.kva_dcp_local_lens(sl.shape[0], T.address(sl), dcp_size, dcp_rank, dcp_interleave,
                                T.address(res)))
    return res


def dcp_slots(block_table_row, first_pos, count, *, dcp_size, dcp_rank, block_size,
              dcp_interleave=1, out=None):
    """kva_dcp_slots: the slot mapping for Cache.write on rank dcp_rank of
    count new tokens of one request at global positions first_pos ..
    first_pos + count - 1: the local slot of each token the rank holds
    (through its block-table row, host int32 [row_len]) and -1 for the
    others, which Cache.write skips. Returns int64 [count] (out when given);
    a row too short for the rank's tokens raises OutOfRangeError, nothing
    written."""
    row = T.host_array(block_table_row, np.int32, "block_table_row")
    if row.ndim != 1:
        raise ShapeMismatchError("block_table_row: shape %s, expected [row_len]" % (row.shape,))
    count = L._fit(count, L.c_int32, "count")  # before np.empty(2.5), np.empty(2**40)
    res = _host_out(out, (max(count, 0),), np.int64, "out")  # count < 0: C refuses it
    _check(L.kva_dcp_slots(dcp_size, dcp_rank, dcp_interleave, block_size, T.address(row),
                           row.shape[0], first_pos, count, T.address(res)))
    return res


def _parts(x, name, ctx, ndim, dtype=None):
    """View of a [P, ...] stack of parts (each part contiguous, parts at any
    stride of at least a part's size); (view, part stride in elements)."""
    from .core import _tensor  # core imports this module

    v = _tensor(x, name, ctx, dtype=dtype, contiguous=False)
    if len(v.shape) != ndim:
        raise ShapeMismatchError("%s: shape %s, expected %d dimensions" % (name, tuple(v.shape),
                                                                           ndim))
    st, inner = v.strides, 1
    for n, s in zip(reversed(v.shape[1:]), reversed(st[1:])):
        if n != 1 and s != inner:
            raise InvalidArgumentError("%s: each part must be contiguous (strides %s)"
                                       % (name, st))
        inner *= n
    stride = st[0]
    if v.shape[0] == 1:
        stride = 0
    elif inner and stride < inner:
        # 0 would mean "dense" to C; a broadcast or overlapping stack is no stack of parts
        raise InvalidArgumentError("%s: part stride %d is less than a part's %d elements"
                                   % (name, stride, inner))
    return v, stride


def merge_states_n(outs, lses, *, out=None, lse=None, ctx=None):
    """kva_merge_states_n: merges P partial results over disjoint key sets
    (the DCP combine when every rank's partial is in this process).
    outs [P, T, H, Dv] (f32/f16/bf16) and lses [P, T, H] float32 natural-log
    on the context's device, each part contiguous, parts at any stride (a
    slice of packed [out | lse] blocks works); out [T, H, Dv], lse [T, H]
    allocated like outs unless given (they may not overlap the inputs).
    A part whose lse is -inf contributes nothing. Returns (out, lse)."""
    from .core import _kva_dtype, _tensor, default_context

    av = T.view(outs, "outs")
    if ctx is None:
        ctx = default_context(av.device, av.device_id)
    if len(av.shape) != 4:
        raise ShapeMismatchError("outs: expected [P, T, H, Dv], got %s" % (tuple(av.shape),))
    _kva_dtype(av, outs, "outs")
    p, t, h, dv = (int(n) for n in av.shape)
    if not 1 <= p <= L.MAX_DCP:
        raise ShapeMismatchError("outs: %d parts, expected 1 .. %d" % (p, L.MAX_DCP))
    ov, ostride = _parts(outs, "outs", ctx, 4, av.dtype)
    lv, lstride = _parts(lses, "lses", ctx, 3, T.F32)
    if tuple(lv.shape) != (p, t, h):
        raise ShapeMismatchError("lses: shape %s, expected %s" % (tuple(lv.shape), (p, t, h)))
    if out is None:
        out = T.empty_like_device(outs, (t, h, dv), av.dtype, av.device, av.device_id)
    if lse is None:
        lse = T.empty_like_device(outs, (t, h), T.F32, av.device, av.device_id)
    rv = _tensor(out, "out", ctx, (t, h, dv), av.dtype, writable=True)
    rl = _tensor(lse, "lse", ctx, (t, h), T.F32, writable=True)
    with ctx._lock:
        _check(L.kva_merge_states_n(ctx._h, p, t, h, dv, av.dtype, ov.ptr, ostride, lv.ptr, lstride,
                                    rv.ptr, rl.ptr))
    return out, lse


__all__ = ["dcp_local_lens", "dcp_slots", "merge_states_n"]
