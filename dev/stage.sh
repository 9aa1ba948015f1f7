#!/usr/bin/env bash
# dev/stage.sh - stages a GPU-machine call's trees in .dev/NAME (the device tool sends the
# checkout plus the ignored paths named in carry): NEW as .dev/NAME/new, BASE (optional) as
# .dev/NAME/base, each with its short commit in .commit; adds /.dev/ to .git/info/exclude on a
# fresh checkout. Then: run(command="bash .dev/NAME/new/dev/NAME/SCRIPT.sh", carry=[".dev/NAME"], ...)
# Usage: bash dev/stage.sh NAME NEW [BASE]    (revisions: commits, branches, main~1, ...)
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,6p "$0"; exit 2; }
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
d=.dev/$1
rm -rf "$d" && mkdir -p "$d"
for side in new base; do
  rev=$2; [ $side = base ] && { [ $# -ge 3 ] || break; rev=$3; }
  git archive --prefix=$side/ "$rev" | tar -x -C "$d"
  git rev-parse --short "$rev" >"$d/$side/.commit"
done
echo "staged $d: new $(cat "$d/new/.commit")${3:+, base $(cat "$d/base/.commit")}, $(du -sh "$d" | cut -f1)"
