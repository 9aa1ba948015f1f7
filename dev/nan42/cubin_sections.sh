#!/bin/bash
# cubin_sections.sh BASE NEW FILE...: as dev/review40/cubin_cmp.sh (src/attn/cuda/FILE.cu of the two
# trees compiled to sm_90a cubins, nvcc -O3 with the build's defines; no device needed), but
# compares each kernel's .text section on its own and names the kernels whose code differs, so a
# change confined to a merge kernel can be shown to leave every other kernel of the file
# byte-identical. nan42 used it for mla_run.cu and mla_sparse.cu.
set -euo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd); shift 2
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cubin() { # tree file tag
  (cd "$1" && nice -n 10 "$nvcc" -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" \
    -Iinclude -Isrc/core -Isrc/plan -O3 -DNDEBUG -std=c++17 -arch=sm_90a -cubin \
    -o "$tmp/$3.cubin" -x cu "src/attn/cuda/$2.cu")
  readelf -W -S "$tmp/$3.cubin" 2>/dev/null | grep -o ' \.text\.[^ ]*' | sed 's/^ //' | sort -u > "$tmp/$3.list"
}
rc=0
for f in "$@"; do
  cubin "$base" "$f" base; cubin "$new" "$f" new
  same=0; diff_list=()
  if ! cmp -s "$tmp/base.list" "$tmp/new.list"; then echo "$f: the kernel lists differ"; rc=1; fi
  while read -r s; do
    readelf -x "$s" "$tmp/base.cubin" 2>/dev/null | tail -n +3 > "$tmp/b.hex"
    readelf -x "$s" "$tmp/new.cubin" 2>/dev/null | tail -n +3 > "$tmp/n.hex"
    if [ ! -s "$tmp/n.hex" ]; then echo "$f: $s: empty dump"; rc=1; fi
    if cmp -s "$tmp/b.hex" "$tmp/n.hex"; then same=$((same + 1)); else diff_list+=("$s"); fi
  done < "$tmp/new.list"
  echo "$f: $same kernel text sections identical, ${#diff_list[@]} differ"
  for s in "${diff_list[@]}"; do echo "  differs: $(echo "${s#.text.}" | c++filt)"; done
done
exit $rc
