#!/usr/bin/env bash
# GPU check of issue 27 (session 25; rebuilt from results/reference/gpu-h200-run6/run.sh and docs/benchmarks.md "For the next GPU session"):
# one prepared script; each step bounded by `timeout`, logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_DISABLE_PLUGIN_AUTOLOAD=1
L=$OUT/log.txt
END=$(( $(date +%s) + ${BUDGET:-545} ))
step() { local t=$1; shift; local left=$(( END - $(date +%s) )); [ $left -lt $t ] && t=$left; [ $t -lt 15 ] && { echo "=== skipped (budget): $*" | tee -a $L; return; }; echo "=== [$(date +%T)] $* (timeout $t)" | tee -a $L; local s=$(date +%s.%N);
  timeout $t "$@" 2>&1 | grep -v -e "UserWarning" -e "return Variable._execution_engine" | tail -n ${TAILN:-40} | tee -a $L; echo "--- rc=${PIPESTATUS[0]} wall=$(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a $L; }
runlog() { for f in "$@"; do echo "### $f"; grep -E -i "run |check|pool|wall|stored|\[[0-9]+/[0-9]+" $f | head -30; grep -h -o "\"run_wall_s\": [0-9.]*" $(dirname $f)/*.json; done | tee -a $L; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a $L
nproc | tee -a $L
git log --oneline -1 | tee -a $L
R=$OUT/runs
step 30 python3 -c "import torch; torch.zeros(1, device='cuda'); print(torch.__version__, torch.cuda.get_device_name())"
STEPS="${STEPS:-bench_c1 tests check_cuda g2p16 main_new main_new-2}"
B="python3 -m harness bench --variants baseline --preset gpu --dtype bf16 --device cuda --no-memory --results-dir $R"
for s0 in $STEPS; do s=${s0%-*}; N=${s0#"$s"}; case $s in
 main_new) step 60 python3 -m harness run --variants all -q --results-dir $R --run-id main-job-cuda-default$N; runlog $R/main-job-cuda-default$N/log.txt ;;
 check_cuda) step 90 python3 -m harness check --variants all 'group:modern' --device cuda ;;
 bench_nondet) step 240 $B --compile default,reduce-overhead --nondeterministic --steps 10 --warmup-steps 5 --run-id bench-gpu-nondet ;;
 bench_det) step 240 $B --compile default,reduce-overhead --steps 10 --warmup-steps 5 --run-id bench-gpu-det ;;
 bench_gpu1) step 90 $B --group-sizes 1 --steps 10 --warmup-steps 5 --run-id bench-gpu-group1 ;;
 kernels_compiled) TAILN=90 step 150 $B --kernels 15 --compile default --nondeterministic --steps 3 --warmup-steps 3 --run-id bench-gpu-kernels-compiled ;;
 bench_autotune) step 420 $B --compile max-autotune-no-cudagraphs,max-autotune --nondeterministic --steps 10 --warmup-steps 5 --run-id bench-gpu-autotune ;;
 bench_wide) step 200 $B --compile default --nondeterministic --set model.d_model=1024 --set model.d_ff=4096 --set model.h=16 --steps 10 --warmup-steps 5 --run-id bench-gpu-wide ;;
 bench_c1) TAILN=60 step 300 $B --group-sizes 1 --compile --nondeterministic --steps 10 --warmup-steps 2 --run-id bench-gpu-group1-compiled ;;
 tests) TAILN=40 step 200 python3 -m pytest -q -m cuda -p no:cacheprovider --durations=8 -rs tests/ ;;
 g2p16) step 150 python3 -m harness run --variants baseline --preset g2p --seeds 16 --vectorize-seeds on --device cuda --dtype bf16 --results-dir $R --run-id g2p-seeds16-bf16; runlog $R/g2p-seeds16-bf16/log.txt ;;
 bench_autotune1) TAILN=60 step 560 $B --group-sizes 1 --compile max-autotune-no-cudagraphs --nondeterministic --steps 10 --warmup-steps 2 --run-id bench-gpu-group1-autotune ;;
esac; done
grep -E '^=== |^--- rc=|^report: |passed|failed|MFU|captured|run_wall|pool' $L > $OUT/summary.txt 2>/dev/null
cd $OUT && tar czf runs.tgz runs 2>/dev/null; rm -rf $OUT/runs; ls -la $OUT
