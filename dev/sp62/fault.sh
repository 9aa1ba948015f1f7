#!/usr/bin/env bash
# sp62, optional (staged for the lead; not run): test_cuda_mla_sparse's case 14 (H 128 over 100
# decode requests, more items than the wgmma kernel's persistent CTAs) on main's kernels, and a
# planted fault that only such a case can see: every CTA of the wgmma MLA body steps over one
# item more than it should (both item loops, producer and consumers alike, so nothing hangs),
# leaving the skipped items' outputs poisoned. Tree: ./new (this branch) beside this script's tree
# (.dev/sp62/new). Expect: new passes whole; fault fails case 14 (and no case with fewer items).
# run(command="bash .dev/sp62/new/dev/sp62/fault.sh", carry=[".dev/sp62"], kind="nvidia-h200", timeout_s=180)
set -uo pipefail
D=$(cd "$(dirname "$0")/../../.." && pwd); cd "$D"
res=${OUT:-$D/out}; L=/tmp/sp62f_logs; mkdir -p "$L" "$res"; LOG=$res/sp62_fault.txt
t0=$(date +%s); T() { echo "== $1 $(( $(date +%s) - t0 )) s" >>"$LOG"; }
CMAKE=${CMAKE:-cmake}; NINJA=${NINJA:-ninja}
echo "# sp62 fault check $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)" >>"$LOG"
rm -rf fault && cp -r new fault
sed -i 's/it += gridDim.x)/it += gridDim.x + 1)/g' fault/src/attn/cuda/mla_wgmma_body.cuh
echo "fault planted: $(grep -c 'it += gridDim.x + 1)' fault/src/attn/cuda/mla_wgmma_body.cuh) item loops" >>"$LOG"
build() { # tree dir
  $CMAKE -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF \
    >$L/cmake_$1.log 2>&1 && timeout 150 $NINJA -C $2 -j8 test_cuda_mla_sparse >$L/build_$1.log 2>&1
  echo "build $1 rc=$?" >>"$LOG"
}
build new /tmp/sp62fn & build fault /tmp/sp62ff & wait
T built
for v in new fault; do
  timeout 60 /tmp/sp62f${v:0:1}/test_cuda_mla_sparse >$L/test_$v.log 2>&1
  echo "test_cuda_mla_sparse whole ($v) rc=$?: $(grep -aE 'passed|FAIL' $L/test_$v.log | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$LOG"
  grep -aE "out bad [1-9]|lse bad [1-9]" $L/test_$v.log | cut -c1-120 | head -6 >>"$LOG"
done
T tests
tar -czf "$res/sp62_fault_logs.tgz" -C "$L" . 2>/dev/null
cat "$LOG"
