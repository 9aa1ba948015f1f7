#!/usr/bin/env bash
# dev/final/stage.sh BASE [FI_DIR] - stage the lead's final call in .dev/final (git-ignored): base = BASE (the
# session's first commit), new = HEAD, debs from .debs, run.sh from dev/final, and, where FI_DIR (default
# /work/fi40) holds them, FlashInfer's prebuilt modules (FI_DIR/out/fi-slim.tgz, fi-jit.tgz from
# bench/flashinfer_prebuild.sh) and the apache-tvm-ffi wheels (FI_DIR/whl/*.whl) in .dev/final/fi.
# Then: run with carry [".dev/final"], command `cd .dev/final && <knobs> OUT=$OUT bash run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:?usage: dev/final/stage.sh BASE [FI_DIR]}; fi=${2:-/work/fi40}
rm -rf .dev/final && mkdir -p .dev/final
git archive --prefix=base/ "$base" | tar -x -C .dev/final
git archive --prefix=new/ HEAD | tar -x -C .dev/final
cp -r .debs .dev/final/debs
cp dev/final/run.sh .dev/final/run.sh
rm -rf .dev/final/{base,new}/bench/results .dev/final/{base,new}/docs/results
if [ -f "$fi/out/fi-jit.tgz" ] && [ -f "$fi/out/fi-slim.tgz" ] && ls "$fi"/whl/*.whl >/dev/null 2>&1; then
  mkdir -p .dev/final/fi/whl
  cp "$fi/out/fi-slim.tgz" "$fi/out/fi-jit.tgz" .dev/final/fi/
  cp "$fi"/whl/*.whl .dev/final/fi/whl/
fi
du -sh .dev/final
