#!/usr/bin/env bash
# dev/x4/multi.sh - several single-GPU A/B experiments in one call on a machine with several GPUs,
# each on its own GPU, all at once (each compares its own trees on its own GPU, alternated; the
# host's cores are shared). Trees are staged under .dev/x4m/<name>/ by the lead; each experiment's
# logs go to $OUT/<name>.tgz and its last lines to $OUT/<name>.txt. Run from the repository root.
#   X4M="pf qd sp"   which experiments (default: those whose folder exists)
#   pf  dev/pf38/ab.sh base new          (wgmma prefill: pf38-c against pf38)
#   qd  dev/qd38/ab.sh base konly vonly btonly nobt, build + bench (quantized decode attribution)
#   sp  $SP_CMD, run in .dev/x4m/sp     (sparse MLA: the staged trees' own script)
#   qn  dev/qd38/ab.sh's ncu step on the trees of .dev/x4m/qn (QD_NCU_ARGS passed through)
#   ct  .dev/x4m/ct/main: CUDA build, ctest -L cuda (quick) and tests/python against its libkvattn.so
#   QD_TREES    the qd experiment's trees (default: base konly vonly btonly nobt)
set -uo pipefail
root=$(pwd); o=${OUT:-/tmp/x4m_out}; mkdir -p "$o"
ng=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv,noheader | tee "$o/gpus.txt"
echo "cores: $(nproc)" | tee -a "$o/gpus.txt"
names=${X4M:-$(for n in pf qd sp qn ct; do [ -d .dev/x4m/$n ] && echo -n "$n "; done)}
g=0; pids=()
for n in $names; do
  d=.dev/x4m/$n; l=/tmp/x4m_$n; mkdir -p "$l"
  case $n in
    pf) cmd="OUT=$l bash new/dev/pf38/ab.sh base new" ;;
    qd) cmd="OUT=$l QD_STEPS='build bench' QD_TARGETS=bench_cuda bash $root/dev/qd38/ab.sh ${QD_TREES:-base konly vonly btonly nobt}" ;;
    qn) cmd="OUT=$l QD_TMP=/tmp/qn QD_STEPS='build ncu' QD_TARGETS=bench_cuda bash $root/dev/qd38/ab.sh base" ;;
    ct) cmd="OUT=$l bash $root/dev/x4/ct.sh main" ;;
    sp) cmd="OUT=$l ${SP_CMD:?SP_CMD is not set}" ;;
    *) echo "unknown experiment $n"; continue ;;
  esac
  echo "[$n] GPU $g: $cmd" | tee -a "$o/gpus.txt"
  ( cd "$d" && CUDA_VISIBLE_DEVICES=$g timeout "${X4M_LIMIT:-380}" bash -c "$cmd" >"$l/console.txt" 2>&1
    echo "rc=$?" >>"$l/console.txt" ) &
  pids+=($!); g=$(( (g + 1) % ng ))
done
for p in "${pids[@]}"; do wait "$p"; done
for n in $names; do
  l=/tmp/x4m_$n; tar -czf "$o/$n.tgz" -C "$l" . 2>/dev/null
  tail -45 "$l/console.txt" >"$o/$n.txt"
  echo "=== $n"; tail -25 "$l/console.txt"
done
