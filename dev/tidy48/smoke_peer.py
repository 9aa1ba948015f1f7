#!/usr/bin/env python3
"""smoke_peer.py - CPU smoke of bench/peer_timing.py and the two peer scripts that use it
(bench/prefill_sdpa_peer.py, bench/decode_fi_peer.py); no GPU, no FlashInfer kernels.
Checks: both scripts import (from the tree root with bench/ on sys.path) and share
peer_timing.timed; timed runs a CPU matmul under a stand-in for torch.cuda's events (wall-clock
records, the same call counts: 5 warm-ups, reps timed one by one, reps back to back) and
returns (median, mean); dev/final/run.sh's exec command line reaches the script's first CUDA
call (its imports resolve), while the command line before the fix stops at
"No module named 'peer_timing'". Run from the tree root with a torch (CPU) Python:
  /work/venv-api41/bin/python dev/tidy48/smoke_peer.py   (exit status 0 when all pass)"""
import os
import subprocess
import sys
import time

import torch

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "bench"))
import decode_fi_peer  # noqa: E402
import peer_timing  # noqa: E402
import prefill_sdpa_peer  # noqa: E402

fails = 0


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += not ok


check(decode_fi_peer.timed is peer_timing.timed and prefill_sdpa_peer.timed is peer_timing.timed,
      "both scripts use peer_timing.timed")


class Ev:
    """Stand-in torch.cuda.Event: record() takes the wall clock, elapsed_time() ms."""
    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class FakeCuda:
    Event = Ev

    @staticmethod
    def synchronize():
        pass


calls = [0]
x = torch.randn(256, 256)


def fn():
    calls[0] += 1
    return x @ x


real = peer_timing.torch.cuda
peer_timing.torch.cuda = FakeCuda
try:
    med, b2b = peer_timing.timed(fn, 7)
finally:
    peer_timing.torch.cuda = real
check(calls[0] == 5 + 7 + 7, f"timed(fn, 7) calls fn 5 + 7 + 7 times ({calls[0]})")
check(isinstance(med, float) and isinstance(b2b, float) and med > 0 and b2b > 0,
      f"timed returns two positive ms values ({med:.4f}, {b2b:.4f})")


def exec_path(fixed):
    cmd = ("import sys; " + ("sys.path.insert(0, 'bench'); " if fixed else "") +
           "sys.modules['flashinfer'] = None; sys.argv = ['p', 'short']; "
           "exec(open('bench/prefill_sdpa_peer.py').read())")
    r = subprocess.run([sys.executable, "-u", "-c", cmd], cwd=root, capture_output=True, text=True,
                       timeout=120)
    return r.stdout + r.stderr


new = exec_path(True)
check("peer_timing" not in new and ("CUDA" in new or "cuda" in new),
      "run.sh's exec path imports and stops at the first CUDA call: " + new.strip().splitlines()[-1][:100])
old = exec_path(False)
check("No module named 'peer_timing'" in old,
      "the exec path without bench/ on sys.path fails to import: " + old.strip().splitlines()[-1][:100])
sys.exit(1 if fails else 0)
