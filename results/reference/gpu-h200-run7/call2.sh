#!/usr/bin/env bash
# Call 2 of session 25, as it ran (given inline to the device tool; written here one command a line).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_DISABLE_PLUGIN_AUTOLOAD=1
L=$OUT/log2.txt; s=$(date +%s)
timeout 175 python3 -m harness bench --variants baseline --preset gpu --dtype bf16 --device cuda --no-memory --results-dir $OUT/runs --group-sizes 2 --compile --nondeterministic --steps 10 --warmup-steps 2 --run-id bench-gpu-group2-compiled 2>&1 | grep -v -e UserWarning -e _execution_engine | tee -a $L
echo "--- rc=${PIPESTATUS[0]} wall=$(( $(date +%s)-s ))" | tee -a $L
left=$(( 250 - ($(date +%s)-s) )); echo left=$left | tee -a $L
[ $left -gt 30 ] && timeout $left python3 -m pytest -q -m cuda -p no:cacheprovider --durations=5 -rs tests/test_group.py::test_a_compiled_step_captured_steps_as_the_eager_group tests/test_group_eval.py 2>&1 | tee -a $L
echo "--- rc=${PIPESTATUS[0]}" | tee -a $L
cd $OUT && tar czf runs2.tgz runs; rm -rf runs
