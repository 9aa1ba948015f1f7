#!/bin/sh
# dev/nan41/faults.sh BUILD_DIR: runs the tests whose NaN checks nan41 fixed,
# each under the planted fault of dev/nan41/faults.patch it is meant to catch
# (apply the patch to src/ first; never commit it), and once without a fault;
# prints fault, test, case and PASS / FAIL. nan41's note lists the result with
# main's tests/ + bench/data.h (the faults pass) and with the branch's (they fail).
B=${1:-build-cpu}
run() { # fault test [case]
    if NAN41_FAULT=$1 KVA_TEST_ONLY=$3 KVA_TEST_QUICK=1 "$B/$2" >"/tmp/nan41_$2_$1.log" 2>&1; then
        r=PASS
    else
        r=FAIL
    fi
    printf '%-10s %-24s %-28s %s\n' "$1" "$2" "${3:-all}" "$r"
}
while read -r f t c; do
    run none "$t" "$c"
    run "$f" "$t" "$c"
done <<'LIST'
nanskip test_cpu_nonfinite
nanskip test_cpu_variants
nanskip test_dcp test_merge_n
nanout test_dcp test_merge_n_dtypes
nanskip test_api_blackbox test_merge_edges
nanskip test_quant_attn test_fp8_nan_propagates
dqskip test_quant_attn test_converter
errnan test_api_contract
errnan test_cascade
errnan test_ds_mla_cache
errnan test_indexer
errsparse test_api_blackbox_kinds
errsparse test_mla_sparse_errors
lastrow test_api_blackbox_degenerate test_dcp_one_rank
lastrow test_api_blackbox_edges test_plan_two_threads
lastrow test_api_blackbox_kinds test_update_across_kinds
lastrow test_api_blackbox_kinds test_cascade_updated_context
lastrow test_plan_update test_update_backends
lastrow test_plan_update test_update_bad_input
lastrow test_api_aliasing test_paged
LIST
