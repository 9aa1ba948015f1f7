"""kva_status -> Python exceptions carrying kva_last_error()."""

from . import _lib


class KvaError(Exception):
    """A kvattn call failed. status: the kva_status value; name: e.g.
    "KVA_STATUS_SHAPE_MISMATCH"; message: kva_last_error() (or the Python-side
    check's message)."""

    status = -1

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.message = message
        self.name = _lib.kva_status_name(self.status).decode() if self.status >= 0 else "?"
        super().__init__("%s: %s" % (self.name, message))

    def __reduce__(self):
        # pickle (multiprocessing, concurrent.futures) rebuilds the exception
        # from (message, status), not from the formatted text in args.
        return (type(self), (self.message, self.status), self.__dict__)


class InvalidArgumentError(KvaError, ValueError):
    status = 1


class NullPointerError(KvaError, ValueError):
    status = 2


class UnsupportedError(KvaError, NotImplementedError):
    status = 3


class OutOfRangeError(KvaError, IndexError):
    status = 4


class DtypeMismatchError(KvaError, TypeError, ValueError):
    """Also a ValueError: FlashInfer's wrappers raise ValueError for a dtype
    that does not match the plan, and code written for them catches that."""

    status = 5


class ShapeMismatchError(KvaError, ValueError):
    status = 6


class OutOfMemoryError(KvaError, MemoryError):
    status = 7


class BackendUnavailableError(KvaError, RuntimeError):
    status = 8


class DeviceError(KvaError, RuntimeError):
    status = 9


class IOError_(KvaError, OSError):
    status = 10


class PoolExhaustedError(KvaError, RuntimeError):
    status = 11


class InternalError(KvaError, RuntimeError):
    status = 12


_BY_STATUS = {
    c.status: c
    for c in (
        InvalidArgumentError,
        NullPointerError,
        UnsupportedError,
        OutOfRangeError,
        DtypeMismatchError,
        ShapeMismatchError,
        OutOfMemoryError,
        BackendUnavailableError,
        DeviceError,
        IOError_,
        PoolExhaustedError,
        InternalError,
    )
}


def raise_status(status):
    """Raises the exception of a non-zero kva_status with kva_last_error()."""
    msg = _lib.kva_last_error().decode(errors="replace")
    cls = _BY_STATUS.get(status)
    if cls is None:
        raise KvaError(msg, status)
    raise cls(msg)


def check(status):
    if status:
        raise_status(status)
