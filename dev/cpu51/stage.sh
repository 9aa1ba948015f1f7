#!/usr/bin/env bash
# stage.sh - stages cpu51's Xeon call (dev/cpu51/xeon.sh) as common.md says:
# /work/main/.dev/cpu51/new = branch cpu51 (the scripts), base = main (the
# build measured). Run on the dev VM after committing; then
#   run(command="bash .dev/cpu51/new/dev/cpu51/xeon.sh", carry=[".dev/cpu51"], kind="nvidia-h200", timeout_s=150)
set -euo pipefail
D=/work/main/.dev/cpu51
rm -rf "$D" && mkdir -p "$D"
git -C /work/wt/cpu51 archive --prefix=new/ cpu51 | tar -x -C "$D"
git -C /work/main archive --prefix=base/ main | tar -x -C "$D"
git -C /work/main rev-parse --short main > "$D/base/.commit"
du -sh "$D"
