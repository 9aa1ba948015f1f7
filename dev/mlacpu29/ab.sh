#!/bin/bash
# dev/mlacpu29/ab.sh ROUNDS label:kvattn-binary ... : CPU MLA absorbed decode A/B of mlacpu29
# (VM log bench/results/vm_2026-11-27_mlacpu29.txt). Build each tree Release with -DKVA_CUDA=OFF
# (ninja kvattn), copy the binaries, then e.g.
#   bash dev/mlacpu29/ab.sh 3 base:/tmp/kvattn_main new:/tmp/kvattn_branch > log; python3 dev/mlacpu29/summ.py log
# Per round: the vdpbf16ps / FMA issue rates of one core (dp_peak.c), then per binary in turn
# H 16 R 16 x 4096 on 1 and 2 threads with --paired (a read pass after every timed run; the bench's
# own read and FMA ceilings), CPU time per call on 1 thread (perf task-clock of 22 minus 2 calls,
# / N: less disturbed by other load than wall time), and H 128 R 4 x 4096 on 1 thread (wall and CPU time).
R=${1:-3}; shift
here=$(cd "$(dirname "$0")" && pwd)
export OMP_WAIT_POLICY=passive
gcc -O3 -mavx512f -mavx512bf16 "$here/dp_peak.c" -o /tmp/dp_peak_ab.$$ || exit 1
tc() { perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | grep task-clock | cut -d, -f1; }
for r in $(seq 1 "$R"); do
  echo "## round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "PEAK $(/tmp/dp_peak_ab.$$ | tr '\n' ' ')"
  for lb in "$@"; do
    l=${lb%%:*}; bin=${lb#*:}
    for t in 1 2; do
      n=$((t == 1 ? 10 : 20))
      out=$($bin bench --mla --heads 16 --batch 16 --context 4096 --threads $t --iters $n --no-check --paired)
      echo "ROW H16 R16 t$t $l $(echo "$out" | grep -E 'time median|latent bytes|paired read|ceilings' | tr -s ' ' | tr '\n' ' ')"
    done
    args="bench --mla --heads 16 --batch 16 --context 4096 --threads 1 --warmup 1 --no-check --no-ceiling"
    a=$(tc $bin $args --iters 22); b=$(tc $bin $args --iters 2)
    echo "CPU H16 R16 t1 $l cpu_ms_per_call $(awk -v a=$a -v b=$b 'BEGIN{printf "%.3f", (a-b)/20}')"
    out=$($bin bench --mla --heads 128 --batch 4 --context 4096 --threads 1 --iters 5 --no-check)
    echo "ROW H128 R4 t1 $l $(echo "$out" | grep -E 'time median|latent bytes|ceilings' | tr -s ' ' | tr '\n' ' ')"
    args="bench --mla --heads 128 --batch 4 --context 4096 --threads 1 --warmup 1 --no-check --no-ceiling"
    a=$(tc $bin $args --iters 7); b=$(tc $bin $args --iters 2)
    echo "CPU H128 R4 t1 $l cpu_ms_per_call $(awk -v a=$a -v b=$b 'BEGIN{printf "%.3f", (a-b)/5}')"
  done
done
rm -f /tmp/dp_peak_ab.$$
