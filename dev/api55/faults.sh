#!/bin/bash
# Planted faults of round 15: each patch applied to the tree, the library and
# test_api_blackbox_r15 rebuilt, the test run (quick and full), the patch
# reverted. Usage: bash dev/api55/faults.sh [build dir] (from the worktree root).
set -u
B=${1:-build-cpu}
for p in dev/api55/fault_*.patch; do
    git apply "$p" || { echo "$p: does not apply"; continue; }
    nice -n 10 ninja -C "$B" -j2 test_api_blackbox_r15 > /dev/null 2>&1 || echo "$p: build failed"
    for q in 1 0; do
        if [ $q = 1 ]; then out=$(KVA_TEST_QUICK=1 "$B"/test_api_blackbox_r15 2>&1); rc=$?
        else out=$("$B"/test_api_blackbox_r15 2>&1); rc=$?; fi
        failed=$(echo "$out" | grep '^FAILED' | tr '\n' ' ')
        echo "$(basename "$p") quick=$q rc=$rc ${failed:-(no case failed)} $(echo "$out" | tail -1)"
    done
    git apply -R "$p"
done
nice -n 10 ninja -C "$B" -j2 test_api_blackbox_r15 > /dev/null 2>&1
