#!/usr/bin/env bash
# stage.sh - stages cpu63's Xeon call (dev/cpu63/xeon.sh) as common.md says:
# /work/main/.dev/cpu63/new = branch cpu63 (the build measured as new, and
# the scripts), base = main. Run on the dev VM after committing; then
#   run(command="bash .dev/cpu63/new/dev/cpu63/xeon.sh", carry=[".dev/cpu63"], kind="nvidia-h200", timeout_s=150)
set -euo pipefail
D=/work/main/.dev/cpu63
rm -rf "$D" && mkdir -p "$D"
git -C /work/wt/cpu63 archive --prefix=new/ cpu63 | tar -x -C "$D"
git -C /work/main archive --prefix=base/ main | tar -x -C "$D"
git -C /work/main rev-parse --short main > "$D/base/.commit"
git -C /work/wt/cpu63 rev-parse --short cpu63 > "$D/new/.commit"
du -sh "$D"
