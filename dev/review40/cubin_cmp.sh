#!/bin/bash
# cubin_cmp.sh BASE NEW [FILE...]: compiles src/attn/cuda/FILE.cu of the two trees to sm_90a
# cubins (nvcc, -O3, the build's defines; no device needed) and compares each kernel's .text
# section byte for byte (readelf -x). FILE defaults to decode_mma decode_mma_quant_fp8.
# review40 used it to show that dm_copy_parts (decode_mma_kernel.cuh) changed no device code.
set -euo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd); shift 2
files=("$@"); [ ${#files[@]} -gt 0 ] || files=(decode_mma decode_mma_quant_fp8)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
dump() { # tree file tag
  (cd "$1" && nice -n 10 "$nvcc" -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" \
    -Iinclude -Isrc/core -Isrc/plan -O3 -DNDEBUG -std=c++17 -arch=sm_90a -cubin \
    -o "$tmp/$3.cubin" -x cu "src/attn/cuda/$2.cu")
  readelf -W -S "$tmp/$3.cubin" 2>/dev/null | grep -o '\.text\.[^ ]*' | sort | while read -r s; do
    echo "== $s"; readelf -x "$s" "$tmp/$3.cubin" 2>/dev/null | tail -n +3; done > "$tmp/$3.text"
}
rc=0
for f in "${files[@]}"; do
  dump "$base" "$f" base; dump "$new" "$f" new
  n=$(grep -c '^== ' "$tmp/new.text" || true)
  if cmp -s "$tmp/base.text" "$tmp/new.text"; then echo "$f: $n kernel text sections identical"
  else echo "$f: text differs ($(diff "$tmp/base.text" "$tmp/new.text" | grep -c '^[<>]') dump lines)"; rc=1; fi
done
rm -rf "$tmp"
exit $rc
