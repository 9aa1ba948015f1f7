"""peer_timing.py - the CUDA-event timing that the peer scripts share
(bench/prefill_sdpa_peer.py, bench/decode_fi_peer.py), so that their "per
call" and "b2b" columns mean the same thing.

timed(fn, reps) calls fn 5 times to warm up, then returns two times in ms:
  per call: the median of reps calls, each between its own pair of CUDA
            events and synchronized before the next;
  b2b:      the mean of reps calls enqueued back to back between one pair of
            events (launch gaps hidden behind the queue).
The scripts import it as a sibling module: run them from bench/ on sys.path
(python3 bench/X.py puts it there; dev/final/run.sh's exec path adds it)."""
import statistics

import torch


def timed(fn, reps=30, warmup=5):
    """(median ms per call, mean ms per call back to back) of fn on the current CUDA device."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return statistics.median(ms), a.elapsed_time(b) / reps
