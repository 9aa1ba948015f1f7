#!/usr/bin/env bash
# dev/dcp29/trace2.sh - per-CTA traces (dev/dcp28/trace.py) of two trees in one short GPU call, with their timings
# alternated (both instrumented alike): from a folder holding base/ and mid/: OUT=DIR bash mid/dev/dcp29/trace2.sh
# Builds bench_cuda of each instrumented copy (90a), then 1 x 32k and 1 x 128k bf16 decode, base, mid, base, mid.
set -u
OUT=${OUT:-out}; mkdir -p $OUT/l; t0=$(date +%s)
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
TP=$(pwd)/mid/dev/dcp28/trace.py
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/trace.txt
for t in base mid; do
  ( rm -rf /tmp/d29_$t && cp -r $t /tmp/d29_$t && python3 $TP /tmp/d29_$t > /dev/null && cmake -S /tmp/d29_$t -B /tmp/d29b_$t $F > /dev/null 2>&1 && timeout 150 ninja -C /tmp/d29b_$t -j8 bench_cuda > $OUT/l/b_$t.log 2>&1; echo "build $t rc=$? at $(( $(date +%s) - t0 )) s" ) &
done; wait
for rd in 1 2; do for t in base mid; do for s in 32767 131071; do
  timeout 30 /tmp/d29b_$t/bench_cuda --mode decode --batch 1 --context $s --iters 20 > $OUT/l/o.txt 2>&1
  echo "r$rd-$t 1x$((s+1)): $(grep -ao 'median [0-9.]* ms\|back to back [0-9.]* ms\|check [a-z]*' $OUT/l/o.txt | tr '\n' ' ')" | tee -a $OUT/sum.txt
  grep -a "dm_" $OUT/l/o.txt | sed "s/^/r$rd-$t 1x$((s+1)) /" >> $OUT/trace.txt
done; done; done
tar -czf $OUT/logs.tgz -C $OUT l && rm -rf $OUT/l
grep -a "^r1-.* 1x32768 dm_trace per call 1: \(landed\|cta loop end\|counted\|end \)" $OUT/trace.txt | cut -c1-140
for t in base mid; do grep -a "^r1-$t 1x32768 dm_trace per call 1: merge cta" $OUT/trace.txt | head -8 | cut -c30-220; done
echo "== at $(( $(date +%s) - t0 )) s"; cat $OUT/sum.txt
