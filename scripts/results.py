#!/usr/bin/env python3
"""results.py - writes a machine's results page (docs/results/<machine>.md) from
measurements taken in one run, and keeps the raw numbers as a dated log in
bench/results/.

  results.py cpu  [--kvattn build/kvattn] [--rounds 3] [--machine NAME]
      Runs the reference CPU shapes with `kvattn bench --json` (decode with
      --paired: each run against a read pass under the same load), round-robin
      over the shapes for --rounds rounds, and the serve-sim default; medians.
  results.py cuda --logs DIR [--machine h100]
      Reads the logs scripts/cuda.sh wrote to DIR (bench_*.log lines of
      bench_cuda, serve_*.json, peer_results.json) on the GPU machine.
  results.py cuda --raw bench/results/FILE.txt [--tag TAG] [--machine h100]
      Reads the bench_cuda lines (and `kvattn bench --dcp` blocks) of one dated raw log of a GPU run (with
      --tag, only the lines that start with TAG, e.g. the "after" build of a
      before/after run); its "# gpu: ..." line names the GPU. No new raw log
      is written: the page names that file. The rows of dev/final/run.sh
      (MLA, sparse MLA, graph-replayed one-request decodes, serve-sim host
      share, SDPA peer, FlashInfer's paged decode from bench/decode_fi_peer.py
      beside the same shapes' bench_cuda rows) are tabulated for every tree of
      the log, whatever --tag says (final_rows).
  results.py cascade --logs DIR [--machine h100-cascade]
      Reads the logs bench/cascade_gpu.sh wrote to DIR on a GPU machine (issue
      18's targets in one run: kvattn's cascade and FlashInfer's, the chunked
      local decode, tree verification against the chain).
  results.py dcp --logs DIR --machine NAME
      Reads the logs scripts/dcp_nccl.sh wrote to DIR on a machine with
      several GPUs (tests, dcp_nccl_bench per N and R, bench_cuda's split
      sweep): decode context parallelism over NCCL.

Only the standard library; the page is plain Markdown tables.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (table, label, kvattn bench arguments). Decode: 4 x 16k, D 128, Hkv 8, the
# reference shapes of the kernel-architecture issue; prefill: one 4k prompt.
CPU_SHAPES = [
    ("decode", "f16 GQA 1 NHD", "--heads 8 --dtype f16"),
    ("decode", "f16 GQA 1 HND", "--heads 8 --dtype f16 --layout hnd"),
    ("decode", "f16 GQA 4 NHD", "--heads 32 --dtype f16"),
    ("decode", "f16 GQA 4 HND", "--heads 32 --dtype f16 --layout hnd"),
    ("decode", "f16 GQA 8 NHD", "--heads 64 --dtype f16"),
    ("decode", "f16 GQA 8 HND", "--heads 64 --dtype f16 --layout hnd"),
    ("quant", "int8 C8 GQA 1", "--heads 8 --dtype f16 --kv-quant int8"),
    ("quant", "int8 C8 GQA 4", "--heads 32 --dtype f16 --kv-quant int8"),
    ("quant", "fp8 GQA 1", "--heads 8 --dtype f16 --kv-quant fp8"),
    ("quant", "fp8 GQA 4", "--heads 32 --dtype f16 --kv-quant fp8"),
    ("prefill", "4k causal bf16 GQA 4", "--mode prefill --batch 1 --q-len 4096 --heads 32"),
    ("prefill", "4k causal f16 GQA 4", "--mode prefill --batch 1 --q-len 4096 --heads 32 --dtype f16"),
]
DECODE_COMMON = "--batch 4 --context 16384 --kv-heads 8 --iters 12 --paired"
PREFILL_COMMON = "--kv-heads 8 --iters 3"


def cpu_name():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def run_bench(kvattn, args, tmp):
    path = os.path.join(tmp, "r.json")
    cmd = [kvattn, "bench", "--json", path] + args.split()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def cpu(a):
    runs = {label: [] for _, label, _ in CPU_SHAPES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for table, label, extra in CPU_SHAPES:
                common = PREFILL_COMMON if table == "prefill" else DECODE_COMMON
                if r > 0 or table == "prefill":
                    common += " --no-check"
                j = run_bench(a.kvattn, f"{common} {extra}", tmp)
                if j.get("check", {}).get("done") and not j["check"]["ok"]:
                    sys.exit(f"results.py: {label}: the reference check failed")
                runs[label].append(j)
                print(f"round {r + 1} {label}: {j['median_ms']:.3f} ms", file=sys.stderr)
        serve_json = os.path.join(tmp, "serve.json")
        subprocess.run([a.kvattn, "serve-sim", "--no-progress", "--json", serve_json],
                       check=True, stdout=subprocess.DEVNULL)
        with open(serve_json) as f:
            serve = json.load(f)
    date = datetime.datetime.now(datetime.timezone.utc)
    machine = a.machine or "cpu-" + os.uname().nodename
    lines = [f"# Results: {machine}", "",
             f"Generated by `python3 scripts/results.py cpu --rounds {a.rounds} --machine "
             f"{shlex.quote(machine)}` on {date:%Y-%m-%d %H:%M} UTC "
             f"({cpu_name()}); kvattn {runs[CPU_SHAPES[0][1]][0]['version']}, "
             f"{a.rounds} rounds round-robin over the shapes, medians. "
             f"Raw numbers: bench/results/{date:%Y-%m-%d}_{machine}.json.", "",
             "## Decode (4 × 16k, D 128, Hkv 8, B 16, all threads)", "",
             "Paired: the run's GB/s over a read pass of the same threads right after it "
             "(docs/cli.md `--paired`).", "",
             "| shape | median ms | GB/s | % of paired read |", "|---|---|---|---|"]
    def decode_rows(table):
        for t, label, _ in CPU_SHAPES:
            if t != table:
                continue
            js = runs[label]
            frac = med([j.get("paired_read_frac") for j in js])
            lines.append(f"| {label} | {fmt(med([j['median_ms'] for j in js]), 3)} | "
                         f"{fmt(med([j['gbps'] for j in js]), 1)} | "
                         f"{fmt(None if frac is None else 100 * frac, 1)} |")
    decode_rows("decode")
    lines += ["", "## Quantized decode (same shape, f16 q)", "",
              "| format | median ms | GB/s of stored bytes | % of paired read |",
              "|---|---|---|---|"]
    decode_rows("quant")
    lines += ["", "## Prefill", "", "| shape | median ms | GFLOP/s | % of FMA peak |",
              "|---|---|---|---|"]
    for t, label, _ in CPU_SHAPES:
        if t != "prefill":
            continue
        js = runs[label]
        peak = med([j.get("fma_peak_gflops") for j in js])
        gf = med([j["gflops"] for j in js])
        lines.append(f"| {label} | {fmt(med([j['median_ms'] for j in js]), 1)} | {fmt(gf, 1)} | "
                     f"{fmt(100 * gf / peak if peak else None, 1)} |")
    lines += ["", "## serve-sim default (`bash scripts/main.sh`)", "",
              "| output tok/s | total tok/s | median TTFT ms | median TPOT ms |", "|---|---|---|---|",
              f"| {fmt(serve.get('output_throughput'), 1)} | "
              f"{fmt(serve.get('total_token_throughput'), 1)} | "
              f"{fmt(serve.get('median_ttft_ms'), 2)} | {fmt(serve.get('median_tpot_ms'), 2)} |", ""]
    write(a, machine, lines, {"runs": runs, "serve": serve, "machine": cpu_name()}, date)


BENCH_RE = re.compile(r"bench_cuda: (\w+) (.*?): median ([0-9.]+) ms, ([0-9.]+) (TB/s KV|TB/s)"
                      r"(?:, ([0-9.]+) TFLOP/s)?(.*)")
# `kvattn bench --dcp N --backend cuda` (tools/bench_dcp.c): N ranks emulated on one GPU. Its block:
# a "dcp: N .., I .., R .. x L .., ..." line, "unsharded X ms", "rank K X ms" per rank, "slowest rank /
# unsharded RATIO"; a GPU script may put a tag before every line (the text before "dcp:" / the
# indent is the tag).
# dev/final/run.sh's extra rows: a graph-replayed one-request decode per context (DCPG), the
# serve-sim host plan share per run, the SDPA and FlashInfer peer rows (bench/prefill_sdpa_peer.py short),
# FlashInfer's paged decode rows (bench/decode_fi_peer.py; joined to the bench_cuda decode rows of the same
# shape and cache type in the same log).
DCPG_RE = re.compile(r'^(\S+) dcpg ctx (\d+) "ms": ([0-9.]+) "items": (\d+) "graph_ms_per_layer": ([0-9.]+)')
SERVE_RE = re.compile(r"^(\S+) serve r(\d+) rc=0 Host plan share of step time \(%\): ([0-9.]+);"
                      r"Mean step time \(ms\): ([0-9.]+)")
SDPA_RE = re.compile(r"^(\d+x\d+(?:\+\d+)?) (\S+ D\d+)\s+(sdpa-\w+|flashinfer)\s+([0-9.]+) ms\s+([0-9.]+) TFLOP/s"
                     r"\s+b2b\s+([0-9.]+) ms")
FI_DECODE_RE = re.compile(r"^fi-decode R=(\d+) S=(\d+) H=(\d+) Hkv=(\d+) D=(\d+) B=(\d+) kv (\S+) (\S+): "
                          r"([0-9.]+) ms ([0-9.]+) TB/s KV\s+b2b ([0-9.]+) ms ([0-9.]+) TB/s KV\s+check (\w+)")
FI_DECODE_FAIL_RE = re.compile(r"^fi-decode R=(\d+) S=(\d+) H=(\d+) Hkv=(\d+) D=(\d+) B=(\d+) kv (\S+) (\S+): "
                               r"(failed: .*)")
# bench_cuda's --quant names as they appear after "kv" in its decode line, by decode_fi_peer.py's kv name
FI_KV = {"bf16": "none", "fp8": "fp8_e4m3"}
MLA_RE = re.compile(r"^(\S+) mla (\S+) bench_cuda_mla: (.*?): median ([0-9.]+) ms, ([0-9.]+) TB/s latent, "
                    r"([0-9.]+) TFLOP/s.*?kernel (\S+), check (\w+)")
SPARSE1_RE = re.compile(r"^(\S+) sparse1 one (.*?) ([0-9.]+) ms ([0-9.]+) TFLOP/s .*check (\w+)")
# dev/fi53/peer.sh's sparse rows: "sparse LABEL: one SHAPE ms TFLOP/s ... check ok" (the tree: "peer")
SPARSE_PEER_RE = re.compile(r"^sparse ([^:]+): one (.*?) ([0-9.]+) ms ([0-9.]+) TFLOP/s .*check (\w+)")
# bench/peer_mla.py's table: R S Q H | ours ms TB/s %copy TFLOP/s | FI ms TB/s TFLOP/s | FI / ours (FI path, check)
MLA_PEER_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+) \|\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%\s+([0-9.]+) \|"
                         r"\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+) \| ([0-9.]+)x \((.*)\)")
MLA_PEER_CEIL_RE = re.compile(r"^(.*): copy ceiling ([0-9.]+) TB/s")
# A line of one of those kinds (whatever follows) that its pattern above does not take: a failed run
# (serve-sim rc != 0, an empty sparse1 / dcpg / mla line), said on stderr so that no row goes missing
# from the page unnoticed.
FINAL_KIND_RE = re.compile(r"^\S+ (dcpg ctx|serve r\d|mla \S+ |sparse1 )|\bsdpa-\w+|^\S+ \S+ D\d+\s+flashinfer"
                           r"|^fi-decode R=")
DCP_EMU_HEAD = re.compile(r"^(.*?)dcp: N (\d+), I (\d+), R (\d+) x L (\d+), .*?, (cuda|cpu)")
DCP_EMU_FULL = re.compile(r"^(.*?)\s+unsharded\s+([0-9.]+) ms")
DCP_EMU_RANK = re.compile(r"^(.*?)\s+rank (\d+)\s+([0-9.]+) ms")
DCP_EMU_RATIO = re.compile(r"^(.*?)\s+slowest rank / unsharded\s+([0-9.]+)")


def final_rows(paths):
    """Tables of dev/final/run.sh's MLA, sparse, DCPG, serve-sim and SDPA peer lines in the raw logs (all
    trees: they are few and the page says which tree each row is)."""
    dcpg, serve, sdpa, mla, sp1, fid, mlap = [], [], [], [], [], [], []
    mlap_ceil = None
    ours = {}  # (tree, R, S, H, Hkv, D, B, kv) -> bench_cuda decode per call ms, in log order
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("> "):  # a quoted log inside the raw log (dev/fi53's): not a row
                    continue
                b = BENCH_RE.search(line)
                sh = re.match(r"R=(\d+) S=(\d+) Q=1 H=(\d+) Hkv=(\d+) D=(\d+) Dv=\d+ B=(\d+) bf16 kv (\S+)",
                              b.group(2)) if b and b.group(1) == "decode" else None
                if sh:
                    tree = line.split()[0].split("-")[0] if not line.startswith("bench_cuda") else ""
                    bb = re.search(r"back to back ([0-9.]+) ms", b.group(7))
                    ours.setdefault((tree,) + sh.groups(), []).append(
                        (float(b.group(3)), float(bb.group(1)) if bb else None))
                taken = False
                for rx, dst in ((DCPG_RE, dcpg), (SERVE_RE, serve), (SDPA_RE, sdpa), (MLA_RE, mla),
                                (SPARSE1_RE, sp1), (FI_DECODE_RE, fid)):
                    m = rx.search(line)
                    if m:
                        dst.append(m.groups())
                        taken = True
                m = SPARSE_PEER_RE.search(line)
                if m:
                    sp1.append(("peer", f"{m.group(1)}: {m.group(2)}") + m.groups()[2:])
                m = MLA_PEER_RE.search(line)
                if m:
                    mlap.append(m.groups())
                m = MLA_PEER_CEIL_RE.search(line)
                if m:
                    mlap_ceil = m.group(2)
                m = FI_DECODE_FAIL_RE.search(line)
                if m:  # a FlashInfer row that did not run: its row says why
                    fid.append(m.groups()[:8] + ("–", "–", "–", "–", m.group(9).replace("|", "/")[:100]))
                    taken = True
                if not taken and FINAL_KIND_RE.search(line):
                    print(f"results.py: not tabulated ({os.path.basename(path)}): {line.strip()[:160]}",
                          file=sys.stderr)
    out = []
    if mla or sp1:
        out += ["## MLA absorbed decode (`bench_cuda_mla`, block 64) and sparse MLA decode "
                "(`kvattn bench --mla-sparse`)", "",
                "Every tree and round of the log; latent: the 576-wide rows read once per call.", "",
                "| run | shape | median ms | TB/s latent | TFLOP/s | kernel | check |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {t} | {q} {sh} | {ms} | {tb} | {tf} | {k} | {c} |" for t, q, sh, ms, tb, tf, k, c in mla]
        out += [f"| {t} | sparse {sh} | {ms} | – | {tf} | – | {c} |" for t, sh, ms, tf, c in sp1]
        out.append("")
    if mlap:
        out += ["## MLA absorbed decode against FlashInfer's BatchMLAPagedAttentionWrapper (bench/peer_mla.py)", "",
                "bf16 latent cache [c_kv 512, k_pe 64], page 64, the same batches in one run; %copy: latent bytes "
                "per second over the device copy ceiling of the same run"
                + (f" ({mlap_ceil} TB/s)" if mlap_ceil else "") + "; ratio: FlashInfer ms / kvattn ms "
                "(issue 16: >= 1 on the memory-bound H 16 rows, >= 1.1 on the compute-bound H 128 rows).", "",
                "| R | S | q_len | H | kvattn ms | TB/s | % copy | TFLOP/s | FlashInfer ms | TB/s | TFLOP/s "
                "| ratio | FlashInfer path, check |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(g) + " |" for g in mlap]
        out.append("")
    if dcpg:
        full = {(t, "call"): float(ms) for t, c, ms, _, g in dcpg if c == "131072"}
        full.update({(t, "graph"): float(g) for t, c, ms, _, g in dcpg if c == "131072"})
        out += ["## One long request and its shares, per call and replayed from a CUDA graph", "",
                "One request, bf16, H 32 / Hkv 8, D 128, B 16, at 128k keys and at a 2- and a 4-way "
                "share of them (the keys one DCP rank holds at I = 1); per call: the median of "
                "single calls; graph: ten layers captured in one CUDA graph, median replay time per "
                "layer (`bench_cuda --graph-layers 10`). Ratio: to the 128k time of the same tree and "
                "timing (issue 19: <= 0.55 at N = 2, <= 0.3 at N = 4).", "",
                "| tree | keys | items | per call ms | ratio | graph ms per layer | ratio |",
                "|---|---|---|---|---|---|---|"]
        for t, c, ms, it, g in dcpg:
            rc, rg = full.get((t, "call")), full.get((t, "graph"))
            out.append(f"| {t} | {c} | {it} | {float(ms):.4f} | {fmt(float(ms) / rc, 3) if rc else '–'} | "
                       f"{float(g):.4f} | {fmt(float(g) / rg, 3) if rg else '–'} |")
        out.append("")
    if serve:
        out += ["## serve-sim --backend cuda: host plan share", "",
                "`kvattn serve-sim --backend cuda` on its default, the trees alternated (issue 23: "
                "plan creation <= 5% of the step).", "",
                "| tree | run | host plan share % | mean step ms |", "|---|---|---|---|"]
        out += [f"| {t} | {r} | {sh} | {st} |" for t, r, sh, st in serve]
        out.append("")
    if sdpa:
        out += ["## PyTorch SDPA and FlashInfer in the same run (bench/prefill_sdpa_peer.py short)", "",
                "SDPA: contiguous q / k / v; FlashInfer (when the run had its prebuilt module): "
                "BatchPrefillWithPagedKVCacheWrapper over a paged NHD cache, page 16. bf16, causal; "
                "per call and back to back.", "",
                "| shape | implementation | ms | TFLOP/s | back to back ms |", "|---|---|---|---|---|"]
        out += [f"| {sh} {hd} | {impl} | {ms} | {tf} | {b2b} |" for sh, hd, impl, ms, tf, b2b in sdpa]
        out.append("")
    if fid:
        trees = [t for t in ("new", "base", "") if any(k[0] == t for k in ours)][:1] or \
            [k[0] for k in ours][:1]  # another tag (dev/fi53/peer.sh's "ours")
        tree = trees[0] if trees else None
        out += ["## FlashInfer's paged decode in the same run (bench/decode_fi_peer.py)", "",
                "BatchDecodeWithPagedKVCacheWrapper, paged NHD cache of page 16, bf16 q / o, one query "
                "token after S cached ones, random data; cuda-cores: its default decode kernel, "
                "tensor-cores: use_tensor_cores=True (fa2). Per call: median of CUDA-event-timed calls; "
                "b2b: calls back to back. kvattn: bench_cuda's per call median and back to back time of "
                "the same shape and cache type in the same log (tree " + (repr(tree) if tree else "–") +
                ", the median over its rounds); ratio: FlashInfer ms / kvattn ms, per call and back to back "
                "(issue 23: >= 1 at every shape).", "",
                "| R x S | kv | FlashInfer path | ms | TB/s KV | b2b ms | check | kvattn ms | kvattn b2b ms "
                "| ratio | b2b ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for R, S, h, hk, d, bs, kv, path, ms, tb, b2b, _, chk in fid:
            mine = ours.get((tree, R, S, h, hk, d, bs, FI_KV.get(kv, kv)), []) if tree is not None else []
            k = statistics.median([x for x, _ in mine]) if mine else None
            kb = [y for _, y in mine if y is not None]
            kb = statistics.median(kb) if kb else None
            f, fb = (float(ms), float(b2b)) if ms != "–" else (None, None)
            out.append(f"| {R} x {S} | {kv} | {path} | {ms} | {tb} | {b2b} | {chk} | {fmt(k, 4)} | {fmt(kb, 4)} | "
                       f"{fmt(f / k, 2) if f and k else '–'} | {fmt(fb / kb, 2) if fb and kb else '–'} |")
        out.append("")
    return out


def dcp_emulated(lines):
    """The emulated DCP blocks of a log's lines: dicts tag, N, I, R, L, unsharded_ms, rank_ms
    [per rank], ratio (slowest rank over unsharded), in log order."""
    out, cur = [], {}
    for line in lines:
        m = DCP_EMU_HEAD.search(line)
        if m:
            cur[m.group(1).strip()] = {"tag": m.group(1).strip(), "N": int(m.group(2)),
                                       "I": int(m.group(3)), "R": int(m.group(4)),
                                       "L": int(m.group(5)), "backend": m.group(6),
                                       "unsharded_ms": None, "rank_ms": []}
            continue
        for rx in (DCP_EMU_FULL, DCP_EMU_RANK, DCP_EMU_RATIO):
            m = rx.search(line)
            if not m or m.group(1).strip() not in cur:
                continue
            b = cur[m.group(1).strip()]
            if rx is DCP_EMU_FULL:
                b["unsharded_ms"] = float(m.group(2))
            elif rx is DCP_EMU_RANK:
                b["rank_ms"].append(float(m.group(3)))
            else:
                b["ratio"] = float(m.group(2))
                out.append(cur.pop(b["tag"]))
            break
    return out


def cuda(a):
    rows, copy, small = [], None, {}
    if a.raw:
        paths = [a.raw]
    else:
        paths = sorted(glob.glob(os.path.join(a.logs, "bench_*.log")))
    gpu = ""
    dcps = []
    for path in paths:
        with open(path) as f:
            text = f.read().splitlines()
        dcps += dcp_emulated([l for l in text if not a.tag or l.startswith(a.tag)])
        with open(path) as f:
            for line in f:
                if line.startswith("# gpu: "):
                    gpu = line[len("# gpu: "):].strip()
                if a.tag and not line.startswith(a.tag):
                    continue
                m = BENCH_RE.search(line)
                if not m:
                    continue
                mode, shape, ms, tbs, _, tf, rest = m.groups()
                if mode == "copy":
                    # the 1 GiB copy is the ceiling; smaller ones (--copy-bytes) are per-shape
                    if shape.startswith("1024.0 MiB") or shape.startswith("1 GiB"):
                        copy = float(tbs)
                    else:  # read + write bytes of that copy -> its per-call TB/s
                        mib = float(shape.split()[0])
                        small[2 * mib * 2**20] = float(tbs)
                    continue
                b2b = re.search(r"back to back ([0-9.]+) ms = ([0-9.]+) TFLOP/s", rest)
                chk = "ok" if "check ok" in rest else "FAILED" if "check" in rest else "–"
                rows.append((os.path.basename(path), mode, shape, float(ms), float(tbs),
                             float(tf) if tf else None, b2b.group(2) if b2b else None, chk))
    date = datetime.datetime.now(datetime.timezone.utc)
    machine = a.machine
    gp = os.path.join(a.logs, "gpu.txt") if a.logs else ""
    if gp and os.path.exists(gp):
        with open(gp) as f:
            gpu = f.read().strip().splitlines()[-1]
    if a.raw:
        rel = os.path.relpath(os.path.abspath(a.raw), ROOT)
        tag = f" (lines tagged `{a.tag}`)" if a.tag else ""
        lines = [f"# Results: {machine}", "",
                 f"Generated by `python3 scripts/results.py cuda --raw {rel}"
                 f"{' --tag ' + shlex.quote(a.tag) if a.tag else ''} --machine {shlex.quote(machine)}` on {date:%Y-%m-%d %H:%M} UTC from the "
                 f"bench_cuda lines{tag} of that raw log of one GPU run ({gpu}); the log says how "
                 f"it was run.", ""]
    else:
        lines = [f"# Results: {machine}", "",
                 f"Generated by `python3 scripts/results.py cuda --logs OUT --machine "
                 f"{shlex.quote(machine)}` on {date:%Y-%m-%d %H:%M} UTC from the logs (OUT) of one "
                 f"`KVA_MACHINE={shlex.quote(machine)} bash scripts/cuda.sh` run ({gpu}). Raw logs: "
                 f"bench/results/{date:%Y-%m-%d}_{machine}.json.", ""]
    if copy:
        lines += [f"Device copy ceiling (read + write) in the same run: {copy:.3f} TB/s.", ""]
    def same_traffic(r):
        """% of the per-call copy moving the row's KV bytes (within 10 %), or '–'; decode rows
        only (a prefill is not bound by its KV bytes)."""
        if r[1] != "decode":
            return "–"
        kv = r[4] * 1e12 * r[3] * 1e-3
        near = [b for b in small if abs(b - kv) <= 0.1 * kv]
        return f"{100 * r[4] / small[near[0]]:.1f}" if near else "–"
    if small:
        lines += ["Per-shape ceiling: a device copy of the same bytes (read + write = the row's KV "
                  "bytes), per call as the rows are timed, in the same run (`bench_cuda --mode copy "
                  "--copy-bytes N`): a small call carries the same launch and ramp-up as a copy of "
                  "its bytes, so this is the most any one-kernel call of that size reached here. "
                  "Sizes: " + ", ".join(f"{b / 2**20:.0f} MiB {t:.3f} TB/s ({100 * t / copy:.0f}% of "
                                        f"the 1 GiB copy)" for b, t in sorted(small.items()))
                  + ".", ""]
    for title, want in (("Decode", lambda r: r[1] == "decode" and "kv none" in r[2]),
                        ("Quantized decode", lambda r: r[1] == "decode" and "kv none" not in r[2]),
                        ("Prefill", lambda r: r[1] in ("prefill", "mixed"))):
        sel = [r for r in rows if want(r)]
        if not sel:
            continue
        lines += [f"## {title}", "",
                  "| shape | median ms | TB/s KV | % of copy | % of same-bytes copy | TFLOP/s | "
                  "back to back TFLOP/s | check |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sel:
            pct = f"{100 * r[4] / copy:.1f}" if copy else "–"
            lines.append(f"| {r[1]} {r[2]} | {r[3]:.4f} | {r[4]:.3f} | {pct} | {same_traffic(r)} | "
                         f"{fmt(r[5], 1)} | {r[6] or '–'} | {r[7]} |")
        lines.append("")
    if dcps:
        lines += ["## Decode context parallelism, emulated on one GPU (`kvattn bench --dcp N --backend "
                  "cuda`)", "",
                  "Each rank's decode over its own shard of the cache and the unsharded decode, per "
                  "call, medians; the ratio is the slowest rank over the unsharded time (issue 19's "
                  "targets: <= 0.3 at N = 4, <= 0.55 at N = 2).", "",
                  "| run | N | R x tokens | unsharded ms | ranks ms | slowest rank / unsharded |",
                  "|---|---|---|---|---|---|"]
        for b in dcps:
            lines.append(f"| {b['tag'] or '–'} | {b['N']} | {b['R']} x {b['L']} | "
                         f"{fmt(b['unsharded_ms'], 3)} | "
                         f"{', '.join(f'{x:.3f}' for x in b['rank_ms'])} | {b['ratio']:.3f} |")
        lines.append("")
    extra = final_rows(paths)
    lines += extra
    serves = {}
    for path in sorted(glob.glob(os.path.join(a.logs, "serve_*.json"))) if a.logs else []:
        with open(path) as f:
            serves[os.path.basename(path)[6:-5]] = json.load(f)
    if serves:
        lines += ["## serve-sim --backend cuda", "",
                  "| run | output tok/s | median TTFT ms | median TPOT ms |", "|---|---|---|---|"]
        for name, s in serves.items():
            lines.append(f"| {name} | {fmt(s.get('output_throughput'), 1)} | "
                         f"{fmt(s.get('median_ttft_ms'), 3)} | {fmt(s.get('median_tpot_ms'), 3)} |")
        lines.append("")
    pj = os.path.join(a.logs, "peer_results.json") if a.logs else ""
    peers = None
    if pj and os.path.exists(pj):
        with open(pj) as f:
            peers = json.load(f)
        lines += ["## Peers in the same run (bench/peer_cuda.py)", "",
                  "| case | implementation | ms | TB/s | TFLOP/s | back to back TFLOP/s |",
                  "|---|---|---|---|---|---|"]
        for r in peers.get("rows", []):
            if "error" in r:
                lines.append(f"| {r['case']} | {r['name']} | error | | | |")
                continue
            s = r["ms"] * 1e-3
            tbs = r.get("kv_bytes", 0) / s / 1e12 if r.get("kv_bytes") else None
            tf = r.get("flops", 0) / s / 1e12 if r.get("flops") else None
            b2b = (r["flops"] / (r["b2b_ms"] * 1e-3) / 1e12
                   if r.get("b2b_ms") and r.get("flops") else None)
            lines.append(f"| {r['case']} | {r['name']} | {r['ms']:.4f} | {fmt(tbs)} | {fmt(tf, 1)} | "
                         f"{fmt(b2b, 1)} |")
        lines.append("")
    write(a, machine, lines, {"bench": rows, "serve": serves, "gpu": gpu, "copy_tbs": copy, "peers": peers,
                              "dcp_emulated": dcps}, date,
          raw_log=not a.raw)


DCP_DECODE_RE = re.compile(
    r"rank (\d+): decode R=(\d+) S=(\d+) .*stream: unsharded ([0-9.]+) ms, rank's shard "
    r"\(N=(\d+) I=(\d+)\) ([0-9.]+) ms: ratio [0-9.]+; graph: ([0-9.]+) ms, ([0-9.]+) ms")
DCP_COMBINE_RE = re.compile(
    r"rank (\d+): combine (\S+)\s+T=(\d+)\s+H=(\d+) Dv=(\d+) \S+ \(([0-9.]+) MB\) (stream|graph)\s*: "
    r"([0-9.]+) ms, bare collective ([0-9.]+) ms: ratio [0-9.]+(?: \(bare a2a with self ([0-9.]+) ms)?"
    r"(?:.*; floor \(bare \+ empty kernels\) ([0-9.]+) ms)?")


def dcp(a):
    date = datetime.datetime.now(datetime.timezone.utc)
    logs = a.logs
    gpu = ""
    gp = os.path.join(logs, "gpu.txt")
    if os.path.exists(gp):
        with open(gp) as f:
            names = f.read().strip().splitlines()[1:]
        gpu = f"{len(names)} x {names[0]}" if names else ""
    tests = {}
    for path in sorted(glob.glob(os.path.join(logs, "test_*.log"))):
        with open(path) as f:
            last = (f.read().strip().splitlines() or [""])[-1]
        tests[os.path.basename(path)[:-4]] = last
    decode, combine = [], []
    nccl = {}  # log name -> "NCCL: library ..., headers ..." as the binary printed it
    for path in sorted(glob.glob(os.path.join(logs, "test_*.log")) +
                       glob.glob(os.path.join(logs, "bench_*.log"))):
        with open(path) as f:
            m = re.search(r"^NCCL: library (\d+), headers (\d+)$", f.read(), re.M)
        if m:
            nccl[os.path.basename(path)[:-4]] = (int(m.group(1)), int(m.group(2)))
    for path in sorted(glob.glob(os.path.join(logs, "bench_N*_R*.log"))):
        with open(path) as f:
            for line in f:
                m = DCP_DECODE_RE.search(line)
                if m:
                    rk, R, S, tf, N, I, ts, gf, gs = m.groups()
                    decode.append(dict(rank=int(rk), R=int(R), S=int(S), N=int(N), I=int(I),
                                       full=float(tf), shard=float(ts), gfull=float(gf),
                                       gshard=float(gs)))
                m = DCP_COMBINE_RE.search(line)
                if m:
                    rk, mode, T, H, Dv, mb, timing, tc, tb, ta, tn = m.groups()
                    N = int(re.search(r"bench_N(\d+)_", path).group(1))
                    combine.append(dict(rank=int(rk), N=N, mode=mode, T=int(T), H=int(H),
                                        Dv=int(Dv), mb=float(mb), timing=timing, ms=float(tc),
                                        bare=float(tb), bare_self=float(ta) if ta else None,
                                        floor=float(tn) if tn else None))
    splits = []
    sj = os.path.join(logs, "splits.json")
    if os.path.exists(sj):
        with open(sj) as f:
            for line in f:
                if line.startswith("{"):
                    splits.append(json.loads(line))
    lines = [f"# Results: {a.machine}", "",
             f"Generated by `python3 scripts/results.py dcp --logs OUT --machine "
             f"{shlex.quote(a.machine)}` on {date:%Y-%m-%d %H:%M} UTC from the logs (OUT) of one "
             f"`scripts/dcp_nccl.sh` run ({gpu}; NCCL_NVLS_ENABLE=0). Raw numbers: "
             f"bench/results/{date:%Y-%m-%d}_{a.machine}.json. Design: docs/dcp.md.", ""]
    ns = sorted({d["N"] for d in decode} | {c["N"] for c in combine})
    rs = sorted({d["R"] for d in decode}, reverse=True)
    if ns:
        lines += [f"Rerun (a machine with {ns[-1]} GPUs): `KVA_DCP_NS=\"{' '.join(map(str, ns))}\" "
                  f"KVA_DCP_RS=\"{' '.join(map(str, rs))}\" {'KVA_DCP_SPLITS=1 ' if splits else ''}"
                  f"KVA_MACHINE={a.machine} scripts/dcp_nccl.sh`.", ""]
    if nccl:
        lines += ["NCCL versions the binaries printed (library = the libnccl.so.2 loaded, headers "
                  "= the nccl.h / nccl_device.h compiled in; the LSA combine needs them equal): "
                  + "; ".join(f"{k}: library {v[0]}, headers {v[1]}" for k, v in nccl.items()) + ".", ""]
    if tests:
        lines += ["## Tests", "", "| test | result |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in tests.items()]
        lines.append("")
    if decode:
        lines += ["## Per-rank decode attention", "",
                  "bf16 cache, H 32, Hkv 8, D 128, every request S tokens; the unsharded decode and "
                  "each rank's sharded decode on that rank's GPU (median of the bench's iters, "
                  "each between events: stream; a CUDA graph of 10 runs, per run: graph). Ratio: "
                  "the slowest rank's shard over the unsharded time (target <= 0.55 at N = 2, "
                  "<= 0.3 at N = 4).", "",
                  "| N | R | S | I | unsharded ms | slowest shard ms | ratio | graph: unsharded ms "
                  "| graph: slowest shard ms | graph ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
        keys = sorted({(d["N"], d["R"], d["S"], d["I"]) for d in decode}, key=lambda k: (k[0], -k[1]))
        for k in keys:
            ds = [d for d in decode if (d["N"], d["R"], d["S"], d["I"]) == k]
            w = max(ds, key=lambda d: d["shard"] / d["full"])
            g = max(ds, key=lambda d: d["gshard"] / d["gfull"])
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {w['full']:.4f} | {w['shard']:.4f} | "
                         f"{w['shard'] / w['full']:.3f} | {g['gfull']:.4f} | {g['gshard']:.4f} | "
                         f"{g['gshard'] / g['gfull']:.3f} |")
        lines.append("")
    if combine:
        lines += ["## Combine vs the bare collective", "",
                  "Random bf16 partials, H 32, Dv 128; the mean per call of the bench's iters calls "
                  "enqueued back to back (stream) or captured in one CUDA graph (graph). Bare: the "
                  "NCCL calls alone on the same bytes (A2A: grouped send/recv of the blocks to the "
                  "N - 1 peers, as the combine sends; with self: plus the block to itself, as an "
                  "all-to-all call moves; AG_RS: all-gather of the LSEs + reduce-scatter of the "
                  "float32 rows; LSA and LSA_win: A2A's). LSA: the one-kernel combine over "
                  "NCCL's device API on partials in the caller's buffer (each rank pushes the "
                  "peers' rows into their windows, one device barrier, local merge); LSA_win: "
                  "on partials already in the window (as the attention writes them): pushed "
                  "the same way up to 8 MiB, above it pulled by the peers between two "
                  "barriers. The slowest rank's ratio (target "
                  "<= 1.2). Floor: the bare "
                  "calls with an empty kernel in each place where the combine runs one (A2A: "
                  "before and after; AG_RS: after each collective), over the bare time: what "
                  "any combine made of kernels around the collectives costs at least.", "",
                  "| N | T | mode | timing | MB | combine ms | bare ms | ratio | bare with self ms "
                  "| ratio to it | floor ms | floor / bare |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        keys = []
        for c in combine:
            k = (c["N"], c["T"], c["mode"], c["timing"])
            if k not in keys:
                keys.append(k)
        keys.sort(key=lambda k: (k[0], k[1], k[2], k[3] == "graph"))
        for k in keys:
            cs = [c for c in combine if (c["N"], c["T"], c["mode"], c["timing"]) == k]
            w = max(cs, key=lambda c: c["ms"] / c["bare"])
            ws = w["bare_self"]
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {w['mb']:.2f} | {w['ms']:.4f} | "
                         f"{w['bare']:.4f} | {w['ms'] / w['bare']:.2f} | {fmt(ws, 4)} | "
                         f"{fmt(w['ms'] / ws if ws else None)} | {fmt(w.get('floor'), 4)} | "
                         f"{fmt(w['floor'] / w['bare'] if w.get('floor') else None)} |")
        lines.append("")
    if splits:
        lines += ["## One long request: split choice (bench_cuda)", "",
                  "R 1, bf16, H 32, Hkv 8, D 128, S = 128k, 64k, 32k (a 128k request's share on "
                  "1, 2, 4 ranks); forced: bench_cuda --splits (0: the plan's choice).", "",
                  "| S | forced splits | items | median ms | graph ms per layer |", "|---|---|---|---|---|"]
        for j in splits:
            lines.append(f"| {j['S']} | {j.get('forced_splits', '?')} | {j['items']} | {j['ms']:.4f} | "
                         f"{j['graph_ms_per_layer']:.4f} |")
        lines.append("")
    write(a, a.machine, lines, {"gpu": gpu, "tests": tests, "nccl": nccl, "decode": decode,
                                "combine": combine, "splits": splits}, date)


CAS_HEAD_RE = re.compile(r"cascade bench: \w+, R (\d+), shared prefix (\d+) in \d+ group\(s\), "
                         r"suffix (\d+)")
CAS_TIME_RE = re.compile(r"^\s+(plain|cascade)\s+([0-9.]+) us.*?([0-9.]+) TFLOP/s")
CAS_AUTO_RE = re.compile(r"speedup\s+([0-9.]+)x\s+auto plan: (\w+)")
CAS_PEER_RE = re.compile(r"peer R (\d+) P (\d+) S (\d+): flashinfer plain (.*?) us, cascade ([0-9.]+)")
MEDIAN_RE = re.compile(r"attention median\s+([0-9.]+) (us|ms|s)\b")


def medians_by_label(path, tag):
    """[(label, microseconds)] of a log of '== tag: label' headers, each followed
    by one `kvattn bench` report."""
    out, label = [], None
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.startswith(f"== {tag}: "):
                label = line.split(": ", 1)[1].strip()
            m = MEDIAN_RE.search(line)
            if m and label is not None:
                v = float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
                out.append((label, v))
                label = None
    return out


def cascade(a):
    logs = a.logs
    date = datetime.datetime.now(datetime.timezone.utc)
    gpu = ""
    gp = os.path.join(logs, "gpu.txt")
    if os.path.exists(gp):
        with open(gp) as f:
            gpu = f.read().strip()
    shapes, cur = [], None
    bp = os.path.join(logs, "bench_cascade.txt")
    if os.path.exists(bp):
        with open(bp) as f:
            for line in f:
                m = CAS_HEAD_RE.search(line)
                if m:
                    cur = dict(R=int(m.group(1)), P=int(m.group(2)), S=int(m.group(3)))
                    shapes.append(cur)
                    continue
                m = CAS_TIME_RE.search(line)
                if m and cur is not None:
                    cur[m.group(1)] = float(m.group(2))
                    cur[m.group(1) + "_tflops"] = float(m.group(3))
                m = CAS_AUTO_RE.search(line)
                if m and cur is not None:
                    cur["auto"] = m.group(2)
    pp = os.path.join(logs, "peer.txt")
    peer_head = ""
    if os.path.exists(pp):
        with open(pp) as f:
            for line in f:
                if line.startswith("FlashInfer"):
                    peer_head = line.strip()
                m = CAS_PEER_RE.search(line)
                if not m:
                    continue
                for c in shapes:
                    if (c["R"], c["P"], c["S"]) == tuple(int(x) for x in m.groups()[:3]):
                        try:
                            c["fi_plain"] = float(m.group(4))
                        except ValueError:
                            pass
                        c["fi_cascade"] = float(m.group(5))
    test = ""
    tp = os.path.join(logs, "test_cuda_cascade.log")
    if os.path.exists(tp):
        with open(tp) as f:
            test = (f.read().strip().splitlines() or [""])[-1]
    chunk = medians_by_label(os.path.join(logs, "bench_chunk.txt"), "chunk")
    tree = medians_by_label(os.path.join(logs, "bench_tree.txt"), "tree")
    lines = [f"# Results: {a.machine}", "",
             f"Generated by `python3 scripts/results.py cascade --logs OUT --machine "
             f"{shlex.quote(a.machine)}` on {date:%Y-%m-%d %H:%M} UTC from the logs (OUT) of one "
             f"`bench/cascade_gpu.sh` run ({gpu}; {peer_head or 'no FlashInfer'}). "
             f"Issue 18's GPU targets: docs/cascade.md, docs/masks.md. Raw numbers: "
             f"bench/results/{date:%Y-%m-%d}_{a.machine}.json.", ""]
    if test:
        lines += [f"test_cuda_cascade in the same run: {test}", ""]
    if shapes:
        lines += ["## Cascade (shared-prefix) decode", "",
                  "R decodes sharing a prefix of P keys, S own keys each; H/Hkv 32/8, D 128, page 16, "
                  "bf16; medians of 30 CUDA-event-timed runs. kvattn: `kvattn bench --cascade "
                  "--backend cuda`; FlashInfer: its tensor-core paged decode (plain) and "
                  "MultiLevelCascadeAttentionWrapper with two levels (bench/peer_cascade.py). Goals "
                  "at R 128 / P 32k: kvattn's cascade >= 2x faster than FlashInfer's and >= 5x than "
                  "kvattn's plain decode; the automatic plan declines where the cascade loses.", "",
                  "| R | P | S | kvattn plain us | kvattn cascade us | cascade TFLOP/s | auto plan "
                  "| FlashInfer plain us | FlashInfer cascade us | cascade vs kvattn plain | "
                  "cascade vs FlashInfer cascade |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in shapes:
            pl, ca, fc = c.get("plain"), c.get("cascade"), c.get("fi_cascade")
            lines.append(f"| {c['R']} | {c['P']} | {c['S']} | {fmt(pl, 1)} | {fmt(ca, 1)} | "
                         f"{fmt(c.get('cascade_tflops'), 1)} | {c.get('auto', '–')} | "
                         f"{fmt(c.get('fi_plain'), 1)} | {fmt(fc, 1)} | "
                         f"{fmt(pl / ca if pl and ca else None)}x | "
                         f"{fmt(fc / ca if fc and ca else None)}x |")
        lines.append("")
    if chunk:
        base = [v for k, v in chunk if "attention-chunk" not in k]
        lines += ["## Chunked local attention", "",
                  "16 decodes, H/Hkv 32/8, D 128, page 16, bf16, 100 runs; a 128k-context decode "
                  "with `--attention-chunk 8192` between two 8k-context decodes (goal: within "
                  "1.1x of the 8k decode).", "", "| context | median us | ratio to the 8k mean |",
                  "|---|---|---|"]
        for k, v in chunk:
            lines.append(f"| {k} | {v:.2f} | {fmt(v / statistics.mean(base) if base else None, 3)} |")
        lines.append("")
    if tree:
        chain = [v for k, v in tree if k == "chain"]
        lines += ["## Tree verification", "",
                  "16 requests, 16 draft tokens each after 4096 cached keys, H/Hkv 32/8, D 128, "
                  "page 16, bf16, 100 runs; `--tree` none (causal speculative decoding), chain, star, "
                  "random (goal: a 16-token tree within 1.2x of the 16-token chain).", "",
                  "| tree | median us | ratio to the chain mean |", "|---|---|---|"]
        for k, v in tree:
            lines.append(f"| {k} | {v:.2f} | {fmt(v / statistics.mean(chain) if chain else None, 3)} |")
        lines.append("")
    write(a, a.machine, lines, {"gpu": gpu, "test": test, "cascade": shapes, "peer": peer_head,
                                "chunk": chunk, "tree": tree}, date)


def write(a, machine, lines, raw, date, raw_log=True):
    page = os.path.join(ROOT, "docs", "results", f"{machine}.md")
    os.makedirs(os.path.dirname(page), exist_ok=True)
    with open(page, "w") as f:
        f.write("\n".join(lines))
    if not raw_log:
        print(f"results.py: wrote {page}")
        return
    log = os.path.join(ROOT, "bench", "results", f"{date:%Y-%m-%d}_{machine}.json")
    with open(log, "w") as f:
        json.dump(raw, f, indent=1)
    print(f"results.py: wrote {page} and {log}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--kvattn", default=os.path.join(ROOT, "build", "kvattn"))
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--machine", default=None)
    g = sub.add_parser("cuda")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--logs")
    src.add_argument("--raw")
    g.add_argument("--tag", default="")
    g.add_argument("--machine", default="h100")
    k = sub.add_parser("cascade")
    k.add_argument("--logs", required=True)
    k.add_argument("--machine", default="h100-cascade")
    d = sub.add_parser("dcp")
    d.add_argument("--logs", required=True)
    d.add_argument("--machine", required=True)
    a = p.parse_args()
    {"cpu": cpu, "cuda": cuda, "cascade": cascade, "dcp": dcp}[a.cmd](a)


if __name__ == "__main__":
    main()
