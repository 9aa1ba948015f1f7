#!/usr/bin/env python3
"""plant_py_fault.py SRC DST - tidy48's planted fault for the Python tests' "left untouched"
checks: copies the installed package SRC (e.g. VENV/lib/python3.X/site-packages/kvattn) to
DST/kvattn and patches the copy so that every run call given an out / lse first fills the whole
buffer that out / lse view with NaN (core.Plan._outputs and _fi_common._staged), the way a
call writing outside its view, or writing before it refuses, would. Run the tests with
PYTHONPATH=DST. The old checks (np.isnan / torch.isnan of the neighbours .all()) pass it; the
poison checks (tests/python/poison.py) fail it. Results: dev/tidy48/README.md."""
import shutil
import sys

src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst + "/kvattn")
FAULT = '''

def _tidy48_fault(a):
    """TIDY48 PLANTED FAULT: NaN (not the tests' poison) over the whole buffer a views."""
    import numpy as np
    if isinstance(a, np.ndarray):
        while isinstance(a.base, np.ndarray):
            a = a.base
        a[...] = np.nan
    else:
        b = a._base if a._base is not None else a
        b.fill_(float("nan"))
'''
p = dst + "/kvattn/core.py"
s = open(p).read()
a = '        ov = _tensor(out, "out", ctx, out_shape, self.q_dtype, writable=True)\n'
assert s.count(a) == 1
s = s.replace(a, a + "        _tidy48_fault(out)\n        if lse is not None:\n"
              "            _tidy48_fault(lse)\n") + FAULT
open(p, "w").write(s)
p = dst + "/kvattn/_fi_common.py"
s = open(p).read()
a = "    if x is None or not _dense_last(x):\n        return x, None\n"
assert s.count(a) == 1
s = s.replace(a, "    if x is not None:\n        from .core import _tidy48_fault\n"
              "        _tidy48_fault(x)\n" + a)
open(p, "w").write(s)
