"""kvattn: attention backends for LLM serving (a thin layer over the C library).

Core API (mirrors include/kvattn.h): Context, Cache, Plan (run / run_ragged /
run_mla), run, merge_states, Pool; decode context parallelism's
dcp_local_lens, dcp_slots and merge_states_n; kvattn.flashinfer holds
FlashInfer-compatible wrappers (decode, prefill, ragged prefill, MLA). Failures raise KvaError subclasses carrying kva_last_error().
"""

from ._errors import (  # noqa: F401
    BackendUnavailableError,
    DeviceError,
    DtypeMismatchError,
    InternalError,
    InvalidArgumentError,
    IOError_,
    KvaError,
    NullPointerError,
    OutOfMemoryError,
    OutOfRangeError,
    PoolExhaustedError,
    ShapeMismatchError,
    UnsupportedError,
)
from ._lib import LIBRARY_PATH  # noqa: F401
from .core import (  # noqa: F401
    Cache,
    Context,
    Plan,
    PlanInfo,
    backend_available,
    default_context,
    dtype_code,
    load_c8_scales,
    merge_states,
    reorder_decode_first,
    run,
    version,
)
from .dcp import dcp_local_lens, dcp_slots, merge_states_n  # noqa: F401
from .pool import Pool  # noqa: F401

__version__ = version()
