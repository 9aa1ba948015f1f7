#!/bin/bash
# dev/cpumla2/ab.sh ROUNDS label:kvattn-binary ... : the CPU MLA decode A/B of cpumla2 (VM log
# bench/results/vm_2026-11-27_cpumla2.txt). Build each tree Release with -DKVA_CUDA=OFF (ninja kvattn), copy the
# binaries, run e.g. bash dev/cpumla2/ab.sh 3 base:/tmp/kvattn_main new:/tmp/kvattn_branch > log; then
# python3 dev/cpumla2/summ.py log. Needs perf (task-clock). --paired rows only for binaries that have it.
# per shape and binary: wall median/min of the bench's timed calls, and CPU time per call =
# (task-clock of a run with N+2 timed calls - task-clock of a run with 2) / N  (perf stat, user+sys of all threads).
R=${1:-3}; shift
BINS="$*"
export OMP_WAIT_POLICY=passive
shapes=("16 16 1 20" "16 16 2 40" "16 64 2 10" "128 4 1 10" "128 4 2 20")
tc() { perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | grep task-clock | cut -d, -f1; }
first=${1#*:}
for r in $(seq 1 $R); do
  echo "## round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  for t in 1 2; do
    echo "CEIL t$t $($first bench --mla --batch 1 --context 64 --threads $t --iters 2 --no-check | grep ceilings)"
  done
  for s in "${shapes[@]}"; do
    set -- $s; H=$1; B=$2; T=$3; N=$4
    for lb in $BINS; do
      l=${lb%%:*}; bin=${lb#*:}
      args="bench --mla --heads $H --batch $B --context 4096 --threads $T --warmup 1 --no-check --no-ceiling"
      out=$($bin $args --iters $N)
      a=$(tc $bin $args --iters $((N+2))); b=$(tc $bin $args --iters 2)
      med=$(echo "$out" | grep "time median" | awk '{print $3}'); mn=$(echo "$out" | grep "time median" | awk '{print $6}')
      gbs=$(echo "$out" | grep "latent bytes" | awk '{print $6, $11}')
      cpu=$(awk -v a=$a -v b=$b -v n=$N 'BEGIN{printf "%.2f", (a-b)/n}')
      echo "ROW H$H R$B t$T $l median_ms $med min_ms $mn cpu_ms_per_call $cpu GB/s,GFLOP/s(median) $gbs"
    done
  done
  for s in "16 16 2 20" "16 64 2 6" "16 16 1 10"; do
    set -- $s; H=$1; B=$2; T=$3; N=$4
    for lb in $BINS; do
      l=${lb%%:*}; bin=${lb#*:}
      $bin bench --mla --heads $H --batch $B --context 4096 --threads $T --iters $N --no-check --no-ceiling --paired >/dev/null 2>&1 || { echo "PAIRED H$H R$B t$T $l (no --paired)"; continue; }
      echo "PAIRED H$H R$B t$T $l $($bin bench --mla --heads $H --batch $B --context 4096 --threads $T --iters $N --no-check --no-ceiling --paired | grep -E 'median|paired' | tr -s ' ' | tr '\n' ' ')"
    done
  done
done
