#!/usr/bin/env python3
"""table.py - the short table of dev/fi53/peer.sh's log (peer.txt): per shape,
kvattn next to its peers from the same call, per call and back to back (b2b).
  MLA:     peer_mla.py's last table as printed (ours, FlashInfer, FI ms / ours ms).
  decode:  bench_cuda's median and b2b ms against decode_fi_peer.py's CUDA-core
           and tensor-core rows; "FI/ours" = the faster FlashInfer path's time
           (of those whose check passed) over ours (> 1: ours faster).
  prefill: bench_cuda's TFLOP/s against SDPA cuDNN and FlashInfer (paged) from
           prefill_sdpa_peer.py short; "ours/X" = ours over X in TFLOP/s.
Only bench_cuda's H 32 / Hkv 8 / D 128 rows are read. A row that is missing on
a side prints "-".
Usage: table.py peer.txt"""
import re
import sys

OURS = re.compile(r"^ours bench_cuda: (decode|prefill) R=(\d+) S=(\d+) Q=(\d+) H=32 Hkv=8 D=128 .*?kv (\S+): median ([\d.]+) ms, "
                  r"[\d.]+ TB/s KV, ([\d.]+) TFLOP/s.*?check (\w+).*?back to back ([\d.]+) ms = ([\d.]+) TFLOP/s")
FIDEC = re.compile(r"^fi-decode R=(\d+) S=(\d+) .*? kv (\S+) (cuda-cores|tensor-cores): ([\d.]+) ms .*?b2b ([\d.]+) ms"
                   r".*?check (\w+)")
FIDEC_FAIL = re.compile(r"^fi-decode R=(\d+) S=(\d+) .*? kv (\S+) (cuda-cores|tensor-cores): failed: (.*)")
PEER = re.compile(r"^(\S+) H32/8 D128\s+(sdpa-flash|sdpa-cudnn|flashinfer)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s\s+b2b\s+"
                  r"([\d.]+) ms\s+([\d.]+) TFLOP/s")
KV = {"none": "bf16", "fp8_e4m3": "fp8"}


def f(x, fmt="{:.4f}"):
    return "-" if x is None else fmt.format(x)


def main(path):
    lines = open(path, errors="replace").read().splitlines()
    print("\n".join(l for l in lines if l.startswith("# gpu") or l.startswith("# fi53")))
    # MLA: the last peer_mla table (from its last "copy ceiling" line to the line before the next "## ")
    start = max((i for i, l in enumerate(lines) if "copy ceiling" in l), default=None)
    print("== MLA absorbed decode, bf16, page 64 (bench/peer_mla.py)")
    if start is None:
        print("  (no table)")
    else:
        for l in lines[start:]:
            if l.startswith("## "):
                break
            print(l)
    ours, fi, peer = {}, {}, {}
    for l in lines:
        m = OURS.match(l)
        if m:
            mode, R, S, Q, kv = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
            ours[(mode, R, S, Q, KV.get(kv, kv))] = (float(m.group(6)), float(m.group(9)), float(m.group(7)),
                                                     float(m.group(10)), m.group(8))
            continue
        m = FIDEC.match(l)
        if m:
            fi[(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4))] = (float(m.group(5)), float(m.group(6)),
                                                                             m.group(7))
            continue
        m = FIDEC_FAIL.match(l)
        if m:
            fi[(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4))] = (None, None, "failed")
            continue
        m = PEER.match(l)
        if m:
            peer[(m.group(1), m.group(2))] = (float(m.group(4)), float(m.group(6)))
    print("== decode, H 32 / Hkv 8, D 128, page 16: ms per call (b2b); FI/ours = best FlashInfer path / ours")
    print(f"{'R x S':>10} {'kv':>4} | {'ours':>16} | {'FI cuda-cores':>16} | {'FI tensor-cores':>16} | "
          f"{'FI/ours':>7} {'b2b':>5} | checks")
    for (mode, R, S, Q, kv), o in sorted(ours.items(), key=lambda x: (x[0][4], x[0][1], x[0][2])):
        if mode != "decode":
            continue
        cc, tc = fi.get((R, S, kv, "cuda-cores")), fi.get((R, S, kv, "tensor-cores"))
        col = lambda x: f"{f(x[0]):>7} ({f(x[1])})" if x and x[0] is not None else f"{'-':>16}"
        best = [x for x in (cc, tc) if x and x[0] is not None and x[2] == "ok"]  # a failed check is no peer
        r1 = f"{min(x[0] for x in best) / o[0]:.2f}x" if best else "-"
        r2 = f"{min(x[1] for x in best) / o[1]:.2f}x" if best else "-"
        chk = f"ours {o[4]}, FI {'/'.join(x[2] if x else '-' for x in (cc, tc))}"
        print(f"{f'{R} x {S}':>10} {kv:>4} | {f(o[0]):>7} ({f(o[1])}) | {col(cc):>16} | {col(tc):>16} | "
              f"{r1:>7} {r2:>5} | {chk}")
    print("== prefill, causal bf16, H 32 / Hkv 8, D 128: TFLOP/s per call (b2b); ours / peer")
    print(f"{'shape':>12} | {'ours':>13} | {'sdpa-cudnn':>13} | {'flashinfer':>13} | "
          f"{'/cudnn':>6} {'b2b':>5} | {'/FI':>5} {'b2b':>5} | check")
    for (mode, R, S, Q, kv), o in sorted(ours.items(), key=lambda x: (x[0][3], x[0][1])):
        if mode != "prefill":
            continue
        name = f"{R}x{Q}" + (f"+{S}" if S else "")
        cu, fl = peer.get((name, "sdpa-cudnn")), peer.get((name, "flashinfer"))
        col = lambda x: f"{x[0]:6.1f} ({x[1]:5.1f})" if x else f"{'-':>13}"
        rat = lambda x, i: f"{o[2 + i] / x[i]:.2f}" if x else "-"
        print(f"{name:>12} | {o[2]:6.1f} ({o[3]:5.1f}) | {col(cu):>13} | {col(fl):>13} | "
              f"{rat(cu, 0):>6} {rat(cu, 1):>5} | {rat(fl, 0):>5} {rat(fl, 1):>5} | {o[4]}")


if __name__ == "__main__":
    main(sys.argv[1])
