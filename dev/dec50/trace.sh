#!/usr/bin/env bash
# dev/dec50/trace.sh BASE - the per-CTA timeline of main's 16-bit decode at one request (issue 20's
# shard and the unsharded call), one GPU: dev/dcp28/trace.py instruments a copy of BASE (stamps per CTA:
# entry, griddepcontrol.wait released, first step landed, loop ends, written, counted, end; the task
# mergers' count -> copy landed -> merged), bench_cuda is built and run at 1 x 32k, 64k, 128k (bf16 H 32 /
# Hkv 8 / D 128 / B 16): one call on an idle GPU twice, then the 4th of 4 back to back; the same-bytes
# copies beside. OUT: log folder.
set -uo pipefail
out=${OUT:-tr_out}; mkdir -p "$out"; t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=$(cd "$1" && pwd); W=/tmp/dec50_tr; rm -rf $W; cp -r "$B" $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | sed 's/^/# gpu: /' | tee -a $out/trace.txt
python3 $W/dev/dcp28/trace.py $W | tee -a $out/trace.txt
cmake -S $W -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >$out/build.log 2>&1 &&
  ninja -C $W/build -j16 bench_cuda >>$out/build.log 2>&1 || { grep -a -m20 -A3 error $out/build.log; exit 1; }
el "built" | tee -a $out/trace.txt
for m in 64 128 256; do
  echo "copy ${m}MiB (KV $((2 * m)) MiB): $($W/build/bench_cuda --mode copy --copy-bytes $((m << 20)) --iters 30 2>&1 | grep -a '^bench_cuda' | grep -oE 'median [0-9.]+ ms|back to back [0-9.]+ ms' | tr '\n' ' ')" | tee -a $out/trace.txt
done
for s in 32767 65535 131071; do
  timeout 60 $W/build/bench_cuda --mode decode --heads 32 --kv-heads 8 --head-dim 128 --batch 1 --context $s --iters 20 >$out/o.txt 2>$out/e.txt
  grep -a "^bench_cuda" $out/e.txt | sed "s/^/1x$((s + 1)) /" | tee -a $out/trace.txt
  grep -a "dm_" $out/o.txt | sed "s/^/1x$((s + 1)) /" | tee -a $out/trace.txt >/dev/null
done
grep -a "dm_trace" $out/trace.txt | grep -v "merge cta" | cut -c1-160
grep -a "merge cta" $out/trace.txt | awk 'NR % 4 == 1' | cut -c1-200
el "end" | tee -a $out/trace.txt
rm -f $out/o.txt $out/e.txt
