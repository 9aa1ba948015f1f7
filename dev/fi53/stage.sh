#!/usr/bin/env bash
# dev/fi53/stage.sh - stages dev/fi53/peer.sh's H200 call in /work/main/.dev/fi53 (git-ignored; DST overrides):
#   new/     git archive of BASE (default main) with branch fi53 merged in (git merge-tree: no worktree or branch
#            changes; when fi53 is already in BASE, BASE alone), so the call runs main's kernels with fi53's scripts
#   fi/      fi-jit.tgz + fi-slim.tgz (FI_OUT, default /work/fi40/out: bench/flashinfer_prebuild.sh's output, which
#            must hold the mla module) and the apache-tvm-ffi wheels for CPython 3.12 / 3.13 (FI_WHL, default
#            /work/fi40/whl; the H200 machine's torch venv is 3.12)
#   rev.txt  what new/ is
# Usage: dev/fi53/stage.sh [BASE [BRANCH]]; prints the size (at most 60 MiB) and the run(...) line.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
base=${1:-main}; br=${2:-fi53}
dst=${DST:-/work/main/.dev/fi53}; fo=${FI_OUT:-/work/fi40/out}; fw=${FI_WHL:-/work/fi40/whl}
[ "$(tar -tzf "$fo/fi-jit.tgz" | grep -c '^batch_mla_attention_.*_sm90/')" -gt 0 ] ||
  { echo "stage.sh: $fo/fi-jit.tgz has no MLA module (bench/flashinfer_prebuild.sh, module mla)" >&2; exit 1; }
if git -C "$repo" merge-base --is-ancestor "$br" "$base"; then
  tree=$base; what="$base $(git -C "$repo" rev-parse --short "$base") (holds $br)"
else
  tree=$(git -C "$repo" merge-tree --write-tree "$base" "$br") ||
    { echo "stage.sh: $br does not merge cleanly into $base:" >&2; echo "$tree" >&2; exit 1; }
  what="$base $(git -C "$repo" rev-parse --short "$base") + $br $(git -C "$repo" rev-parse --short "$br") (merged tree ${tree:0:10})"
fi
rm -rf "$dst"; mkdir -p "$dst/fi/whl"
git -C "$repo" archive --prefix=new/ "$tree" | tar -x -C "$dst"
echo "$what" >"$dst/rev.txt"
cp "$fo/fi-jit.tgz" "$fo/fi-slim.tgz" "$dst/fi/"
cp "$fw"/apache_tvm_ffi-*-cp312-cp312-*.whl "$fw"/apache_tvm_ffi-*-cp313-cp313-*.whl "$dst/fi/whl/"
mib=$(( $(du -sk "$dst" | cut -f1) / 1024 ))
echo "staged $dst: $what, $mib MiB"
[ "$mib" -le 60 ] || { echo "stage.sh: $mib MiB > 60" >&2; exit 1; }
echo 'run(command="bash .dev/fi53/new/dev/fi53/peer.sh", carry=[".dev/fi53"], kind="nvidia-h200", timeout_s=210)'
