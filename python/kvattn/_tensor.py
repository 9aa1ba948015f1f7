"""Tensor views: the address, kvattn dtype, shape, element strides and device
of a numpy array, a torch tensor (CPU or CUDA; torch is optional) or any
object that speaks DLPack (``__dlpack__``), without copying.

Numpy arrays and torch tensors take a direct path (their own attributes);
every other producer (CuPy, JAX, ...) is read through its DLPack capsule.
"""

import ctypes
import sys

import numpy as np

from . import _errors
from ._lib import DTYPES

F32, F16, BF16, I8, FP8, U8 = (DTYPES[k] for k in ("f32", "f16", "bf16", "i8", "fp8_e4m3", "u8"))
I32, I64 = 100, 101  # index dtypes, not kva_dtype values: metadata only

CPU, CUDA = "cpu", "cuda"

_NP_DTYPES = {
    np.dtype(np.float32): F32,
    np.dtype(np.float16): F16,
    np.dtype(np.int8): I8,
    np.dtype(np.uint8): U8,
    np.dtype(np.int32): I32,
    np.dtype(np.int64): I64,
}
# The same keyed by dtype.num (an int: cheaper to hash than a dtype object).
_NP_NUMS = {k.num: v for k, v in _NP_DTYPES.items()}
# ml_dtypes (JAX's numpy extension types) names bf16 and fp8 e4m3fn.
_NP_NAMES = {"bfloat16": BF16, "float8_e4m3fn": FP8}
_TORCH_DTYPES = {}  # filled on first torch tensor: torch.float16 -> F16, ...


def _dense(shape):
    """Row-major element strides of shape."""
    st, s = [], 1
    for n in reversed(shape):
        st.insert(0, s)
        s *= int(n)
    return tuple(st)


class View:
    """What kvattn needs of a tensor: address, kva dtype, shape, device.
    strides (in elements) and contiguous() are computed on demand."""

    __slots__ = ("ptr", "dtype", "shape", "device", "device_id", "_x", "_strides")

    def __init__(self, ptr, dtype, shape, device, device_id, x, strides=None):
        self.ptr, self.dtype, self.shape = ptr, dtype, shape
        self.device, self.device_id, self._x, self._strides = device, device_id, x, strides

    @property
    def strides(self):
        if self._strides is None:
            x = self._x
            if isinstance(x, np.ndarray) and x.size == 0:
                # An empty array addresses nothing, and numpy gives it strides
                # of 0 (checks of row layout would refuse it): dense strides,
                # as torch gives an empty tensor.
                self._strides = _dense(x.shape)
            elif isinstance(x, np.ndarray):
                isz = x.itemsize
                self._strides = tuple(st // isz for st in x.strides)
            else:
                self._strides = tuple(x.stride())
        return self._strides

    def contiguous(self):
        x = self._x
        if isinstance(x, np.ndarray):
            return x.flags.c_contiguous
        if self._strides is None and x is not None:
            return x.is_contiguous()
        s = 1
        for n, st in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and st != s:
                return False
            s *= n
        return True


_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def address(x):
    """Address of a numpy array's first element (cheaper than
    __array_interface__ for the usual writable, non-empty array)."""
    try:
        return _addressof(_char_from_buffer(x))
    except (TypeError, ValueError, BufferError):
        return x.__array_interface__["data"][0]


def _np_view(x):
    dt = _NP_DTYPES.get(x.dtype)
    if dt is None:
        # ml_dtypes' bfloat16 keeps its name in the other byte order, which
        # kvattn would read swapped: only the native one is bf16 / fp8.
        dt = _NP_NAMES.get(x.dtype.name, -1) if x.dtype.isnative else -1
    return View(address(x) if x.flags.c_contiguous else x.__array_interface__["data"][0], dt,
                x.shape, CPU, 0, x)


def _torch_dtypes(torch):
    m = {
        torch.float32: F32,
        torch.float16: F16,
        torch.bfloat16: BF16,
        torch.int8: I8,
        torch.uint8: U8,
        torch.int32: I32,
        torch.int64: I64,
    }
    if hasattr(torch, "float8_e4m3fn"):
        m[torch.float8_e4m3fn] = FP8
    _TORCH_DTYPES.update(m)


def _torch_view(x, torch):
    if not _TORCH_DTYPES:
        _torch_dtypes(torch)
    d = x.device
    return View(x.data_ptr(), _TORCH_DTYPES.get(x.dtype, -1), tuple(x.shape),
                CUDA if d.type == "cuda" else d.type, d.index or 0, x)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]

# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat; 10 float8_e4m3fn.
_DL_DTYPES = {(2, 32): F32, (2, 16): F16, (4, 16): BF16, (0, 8): I8, (1, 8): U8,
              (0, 32): I32, (0, 64): I64, (10, 8): FP8}
# DLPack device types: 1 CPU, 2 CUDA, 3 CUDA pinned host, 13 CUDA managed.
_DL_DEVICES = {1: CPU, 2: CUDA, 3: CPU, 13: CUDA}


def _dlpack_view(x):
    cap = x.__dlpack__()
    t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    nd = t.ndim
    shape = tuple(t.shape[i] for i in range(nd))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(nd))
    else:
        strides, s = [], 1
        for n in reversed(shape):
            strides.insert(0, s)
            s *= n
        strides = tuple(strides)
    dt = _DL_DTYPES.get((t.dtype.code, t.dtype.bits), -1) if t.dtype.lanes == 1 else -1
    dev = _DL_DEVICES.get(t.device.device_type, "dl%d" % t.device.device_type)
    # The capsule (and its deleter) goes away with `cap`; the producer `x`,
    # which the caller keeps alive for the call, owns the memory.
    return View((t.data or 0) + t.byte_offset, dt, shape, dev, t.device.device_id, None, strides)


def view(x, name):
    """The View of tensor x (argument `name` in error messages)."""
    if type(x) is np.ndarray:
        dt = _NP_NUMS.get(x.dtype.num)
        if dt is not None and x.dtype.isnative:
            try:  # writable, contiguous, non-empty: the usual case
                return View(_addressof(_char_from_buffer(x)), dt, x.shape, CPU, 0, x)
            except (TypeError, ValueError, BufferError):
                pass
        return _np_view(x)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        is_neg = getattr(x, "is_neg", None)  # torch >= 1.10; older ones have no neg bit
        if is_neg is not None and is_neg():
            # A lazily negated view (torch's neg bit, e.g. from z.conj().imag):
            # its memory holds -x, which kvattn would read or write as x.
            # torch's own DLPack export refuses such tensors too.
            raise _errors.InvalidArgumentError(
                "%s: a tensor with torch's negative bit set (its memory holds the negated "
                "values): pass %s.resolve_neg()" % (name, name))
        return _torch_view(x, torch)
    if isinstance(x, np.ndarray):
        return _np_view(x)
    if hasattr(x, "__dlpack__"):
        return _dlpack_view(x)
    raise _errors.InvalidArgumentError(
        "%s: expected a numpy array, a torch tensor or a DLPack tensor, got %s"
        % (name, type(x).__name__)
    )


def is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def host_array(x, dtype, name):
    """x (list, numpy array, torch tensor on any device) as a contiguous host
    numpy array of dtype; a copy only where needed."""
    if type(x) is np.ndarray and x.dtype == dtype and x.flags.c_contiguous:
        return x
    if is_torch(x):
        x = x.detach().cpu()
        if getattr(x, "is_neg", None) and x.is_neg():
            x = x.resolve_neg()  # numpy() refuses a tensor whose memory holds -x
        if x.dtype == sys.modules["torch"].bfloat16 or (x.is_floating_point() and
                                                        x.element_size() == 1):
            x = x.float()  # bf16 / fp8, which numpy lacks: exact in float32
        x = x.numpy()
    elif not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        x = np.from_dlpack(x)
    try:
        a = np.ascontiguousarray(x, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise _errors.InvalidArgumentError("%s: not convertible to %s: %s" % (name, dtype, e))
    # The cast wraps out-of-range values and truncates fractions silently
    # (2**32 + 3 -> 3, 2.7 -> 2): the values must survive it unchanged.
    if a.dtype.kind in "iu" and a is not x and a.size and not _same_values(x, a):
        raise _errors.InvalidArgumentError(
            "%s: values that are not %s integers (out of range or fractional)"
            % (name, np.dtype(dtype).name))
    return a


def _same_values(x, a):
    """True if integer array a, cast from x, holds x's values."""
    if isinstance(x, np.ndarray):
        k = x.dtype.kind
        if k == "b" or (k in "iu" and np.can_cast(x.dtype, a.dtype)):
            return True
        if a.size <= 256 and a.tolist() == x.tolist():  # cheaper than numpy for few values
            return True
    elif isinstance(x, list) and a.size <= 256 and a.tolist() == x:
        return True
    try:
        src = np.asarray(x).reshape(-1)
    except (TypeError, ValueError):
        return False
    return src.size == a.size and bool(np.array_equal(src, a.reshape(-1)))


def empty_like_device(ref, shape, dtype, device, device_id):
    """An uninitialized output tensor of the same kind as ref (torch if ref is
    torch, else numpy on the host); dtype is a kva dtype or I32/I64."""
    if is_torch(ref):
        torch = sys.modules["torch"]
        if not _TORCH_DTYPES:
            _torch_dtypes(torch)
        tdt = next(k for k, v in _TORCH_DTYPES.items() if v == dtype)
        return torch.empty(shape, dtype=tdt, device=ref.device)
    if device != CPU:
        raise _errors.InvalidArgumentError(
            "output on device %s: pass out= (only numpy and torch outputs are allocated)" % device
        )
    return np.empty(shape, dtype=numpy_dtype(dtype))


def numpy_dtype(dtype):
    if dtype == BF16 or dtype == FP8:
        try:
            import ml_dtypes

            return ml_dtypes.bfloat16 if dtype == BF16 else ml_dtypes.float8_e4m3fn
        except ImportError:
            raise _errors.UnsupportedError(
                "numpy has no %s dtype: install ml_dtypes or use torch tensors"
                % ("bfloat16" if dtype == BF16 else "float8_e4m3fn")
            )
    return {F32: np.float32, F16: np.float16, I8: np.int8, U8: np.uint8, I32: np.int32,
            I64: np.int64}[dtype]
