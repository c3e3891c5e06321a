#!/usr/bin/env bash
# GPU check of issue 27 (prepared in sessions 15-17 for the next GPU session; the copy that ran is results/reference/gpu-h200-run3/run.sh): one prepared script; each step bounded by `timeout`, logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_DISABLE_PLUGIN_AUTOLOAD=1
L=$OUT/log.txt
END=$(( $(date +%s) + ${BUDGET:-545} ))
step() { local t=$1; shift; local left=$(( END - $(date +%s) )); [ $left -lt $t ] && t=$left; [ $t -lt 15 ] && { echo "=== skipped (budget): $*" | tee -a $L; return; }; echo "=== [$(date +%T)] $* (timeout $t)" | tee -a $L; local s=$(date +%s.%N);
  timeout $t "$@" 2>&1 | grep -v -e "UserWarning" -e "return Variable._execution_engine" | tail -n ${TAILN:-40} | tee -a $L; echo "--- rc=${PIPESTATUS[0]} wall=$(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a $L; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a $L
nproc | tee -a $L
R=$OUT/runs
step 30 python3 -c "import torch; torch.zeros(1, device='cuda'); print(torch.__version__, torch.cuda.get_device_name())"
STEPS="${STEPS:-tests main_auto main_batched g2p16 bench_seeds bench_compile}"  # then a 2nd call: STEPS="profile_loop profile_batched alibi bench_compile"; session 16 ran: kernels_gpu suite_g2p, then suite_g2p_resume
for s0 in $STEPS; do s=${s0%-*}; N=${s0#"$s"}; case $s in
  main_batched) HARNESS_PREFIX_PASS=batched step 60 python3 -m harness run --variants all -q --results-dir $R --run-id main-job-cuda-auto-prefix-batched ;;
 bench_seeds) step 90 python3 -m harness bench --variants baseline --preset quick --group-sizes 1,4,16,64 --device cuda --no-memory --steps 20 --warmup-steps 3 --results-dir $R --run-id bench-seeds-quick ;;
 profile_loop) step 40 python3 -m harness profile --variants baseline --device cuda -q --results-dir $R --run-id profile-cuda-loop ;;
 profile_batched) HARNESS_PREFIX_PASS=batched step 40 python3 -m harness profile --variants baseline --device cuda -q --results-dir $R --run-id profile-cuda-batched ;;
 alibi) step 60 bash -c "python3 -m harness run --variants alibi_positions --seeds 4 --device cuda -q --results-dir $R --run-id alibi-captured && grep -h -o '\"captured\": [0-9]*' $R/alibi-captured/trials/*.json; cat $R/alibi-captured/log.txt" ;;
  main_loop) HARNESS_PREFIX_PASS=loop step 60 python3 -m harness run --variants all -q --results-dir $R --run-id main-job-cuda-loop$N ;;
 main_new) step 60 python3 -m harness run --variants all -q --results-dir $R --run-id main-job-cuda-default$N ;;
 main_j6) step 60 python3 -m harness run --variants all --device cuda --jobs 6 -q --results-dir $R --run-id main-job-cuda-jobs6$N ;;
 main_auto) step 60 python3 -m harness run --variants all -q --results-dir $R --run-id main-job-cuda-auto ;;
 main_j1) step 55 python3 -m harness run --variants all --device cuda --jobs 1 -q --results-dir $R --run-id main-job-cuda-jobs1 ;;
 main_j8) step 55 python3 -m harness run --variants all --device cuda --jobs 8 -q --results-dir $R --run-id main-job-cuda-jobs8 ;;
 main_j4off) step 50 python3 -m harness run --variants all --device cuda --jobs 4 --vectorize-seeds off -q --results-dir $R --run-id main-job-cuda-jobs4-off ;;
 bench_gpu) step 70 python3 -m harness bench --variants baseline --preset gpu --dtype bf16 --group-sizes 1,4 --device cuda --no-memory --steps 10 --warmup-steps 3 --results-dir $R --run-id bench-gpu-bf16 ;;
  g2p16_batched) HARNESS_PREFIX_PASS=batched step 170 python3 -m harness run --variants baseline --preset g2p --seeds 16 --vectorize-seeds on --device cuda --dtype bf16 -q --results-dir $R --run-id g2p16-cuda-prefix-batched ;;
 g2p_sqrt16) step 300 python3 -m harness run --variants baseline unscaled_embeddings --preset g2p --seeds 16 --device cuda --dtype bf16 -q --results-dir $R --run-id g2p-sqrt16-cuda ;;
 g2p16) step 170 python3 -m harness run --variants baseline --preset g2p --seeds 16 --vectorize-seeds on --device cuda --dtype bf16 -q --results-dir $R --run-id g2p16-cuda ;;
 bench_eval) step 50 python3 -m harness bench --variants baseline --task g2p --preset g2p --group-sizes 4,16 --eval --device cuda --set train.eval_sequences=2000 --steps 2 --warmup-steps 1 --results-dir $R --run-id bench-eval-g2p ;;
 bench_compile) step 240 python3 -m harness bench --variants baseline --preset gpu --dtype bf16 --compile --device cuda --no-memory --steps 10 --warmup-steps 5 --results-dir $R --run-id bench-compile-gpu ;;
 kernels_gpu) TAILN=80 step 90 python3 -m harness bench --variants baseline --preset gpu --dtype bf16 --kernels 15 --device cuda --steps 3 --warmup-steps 2 --results-dir $R --run-id bench-kernels-gpu ;;
 suite_g2p) step ${SUITE_T:-400} python3 -m harness run --suite modern_g2p --dtype bf16 -q --results-dir $R --run-id suite-modern-g2p ;;
 suite_g2p_resume) mkdir -p $R && cp -r .gpu/prev/runs/suite-modern-g2p $R/ && step ${SUITE_T:-400} python3 -m harness run --suite modern_g2p --resume $R/suite-modern-g2p --dtype bf16 -q ;;
 tests) TAILN=25 step 150 python3 -m pytest -q -m cuda -p no:cacheprovider --durations=5 tests/test_determinism.py tests/test_group.py tests/test_group_eval.py tests/test_checks.py ;;
esac; done
# one-screen summary for the reader: each step's command, rc and wall, every run's report line
grep -E '^=== |^--- rc=|^report: |passed|failed|MFU|captured' $L > $OUT/summary.txt 2>/dev/null
cd $OUT && tar czf runs.tgz runs 2>/dev/null; rm -rf $OUT/runs; ls -la $OUT
