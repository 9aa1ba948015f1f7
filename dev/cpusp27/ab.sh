#!/bin/bash
# dev/cpusp27/ab.sh ROUNDS label:kvattn-binary ... : the CPU sparse MLA decode A/B of cpusp27 (VM log
# bench/results/vm_2026-11-27_cpusp27.txt). Build each tree Release with -DKVA_CUDA=OFF (ninja kvattn),
# then e.g. bash dev/cpusp27/ab.sh 3 base:build-base/kvattn new:build-rel/kvattn > log;
# python3 dev/cpusp27/summ.py log. Issue 17's CPU shape: H 16, R 32 x 8192, top-2048, --paired,
# both cache formats (ds_mla, bf16), 1 and 2 threads; binaries alternate within each round.
R=${1:-3}; shift
export OMP_WAIT_POLICY=passive
for r in $(seq 1 $R); do
  echo "## round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  for t in 1 2; do
    for cache in ds_mla bf16; do
      for lb in "$@"; do
        l=${lb%%:*}; bin=${lb#*:}
        out=$($bin bench --mla-sparse --heads 16 --batch 32 --context 8192 --topk 2048 --cache $cache \
              --threads $t --iters ${KVA_AB_ITERS:-10} --paired 2>&1)
        echo "ROW $cache t$t $l $(echo "$out" | grep -E 'kernel|time median|gathered|paired read|ceilings|check' \
              | tr -s ' ' | tr '\n' '|')"
      done
    done
  done
done
