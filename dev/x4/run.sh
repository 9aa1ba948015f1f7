#!/usr/bin/env bash
# Lead's multi-GPU call for issue 20: scripts/dcp_nccl.sh for N 2 and 4 at R 8 and 1 (128k context),
# plus the one-request split table (KVA_DCP_SPLITS=1), on whatever 4-GPU machine came; the results
# page is named after the GPU (h100x4-dcp-nccl or h200x4-dcp-nccl). Run from the repository root.
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H200*) m=h200x4-dcp-nccl ;; *H100*) m=h100x4-dcp-nccl ;; *) m=gpux4-dcp-nccl ;; esac
n=$(nvidia-smi -L | wc -l)
echo "# $n x $gpu -> $m"
ns="2 4"; [ "$n" -lt 4 ] && ns=2
logs=/tmp/x4out; mkdir -p "$logs"
s=$(date +%s)
OUT=$logs KVA_DCP_NS="$ns" KVA_DCP_RS="8 1" KVA_DCP_SPLITS=1 KVA_MACHINE=$m bash scripts/dcp_nccl.sh
rc=$?
echo "dcp_nccl.sh rc=$rc in $(( $(date +%s) - s )) s"
cp "docs/results/$m.md" bench/results/*_"$m".json "$OUT/" 2>/dev/null
tar -czf "$OUT/x4logs.tgz" -C "$logs" .
grep -hE "ratio|slowest|graph" "$logs"/bench_N*_R*.log | head -40
exit $rc
