#!/bin/sh
# dev/nan41/pyfaults.sh LIB VENV_PYTHON: the Python untouched-output checks
# nan41 fixed, under the planted fault pyerrnan of dev/nan41/pyfaults.patch
# (apply it to python/ first; never commit it): a refused Plan.run /
# run_ragged writes NaN into out, a refused Cache.write NaN into the cache.
LIB=${1:-build-cpu/libkvattn.so}
PY=${2:-python3}
R=$(cd "$(dirname "$0")/../.." && pwd)
for f in none pyerrnan; do
    for t in test_core.py::test_run_bad_inputs_raise_and_leave_outputs \
        test_core_api.py::test_ragged_plan_ignores_later_changes_to_callers_seq_lens \
        test_core_api.py::test_closed_objects_raise_and_close_twice_is_harmless \
        test_blackbox.py::test_outputs_read_only_or_wrong_are_refused \
        test_blackbox.py::test_tensor_on_another_device_raises \
        test_blackbox.py::test_lists_are_checked_not_truncated; do
        if NAN41_FAULT=$f KVATTN_LIBRARY=$LIB PYTHONPATH=$R/python "$PY" -m pytest -q \
            -p no:cacheprovider "$R/tests/python/$t" >/tmp/nan41_py.log 2>&1; then r=PASS; else
            r="FAIL ($(grep -cE '^FAILED' /tmp/nan41_py.log) failed)"
        fi
        printf '%-9s %-76s %s\n' "$f" "$t" "$r"
    done
done
