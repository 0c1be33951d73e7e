#!/usr/bin/env bash
# The sharded path on the lent H200 (issue 14, one rank): the GPU tests, the DCP benchmark on a ~250M GPT trained on
# real text (our writer/reader against DCP's and our single-file path, sync and async, loads, extra GPU memory, two
# repetitions), then the many-small-items benchmark on this host's CPU (zstd) and on the GPU (gANS).
#   bash benchmarks/dcp_gpu.sh     (carry .whl; PART: the parts to run, space-separated, of tests, bench, items
#   (default all); STATES: the items benchmark's --state values (default "gpt issue"); PROFILE=0 leaves out the
#   load profile)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
PART=${PART:-all}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
if [[ " $PART " == *" all "* || " $PART " == *" tests "* ]]; then
  timeout ${TESTS_S:-280} python3 -m pytest -q -m gpu tests -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/pytest-gpu.txt" | grep -E "passed|failed|FAILED|Error" | tail -12
fi
if [[ " $PART " == *" all "* || " $PART " == *" bench "* ]]; then
  (cd benchmarks && timeout ${BENCH_S:-280} python3 dcp_bench.py --dim 1024 --layers 20 --steps 20 --out "$OUT/dcp.md") 2>&1 | tail -16
fi
if [[ " $PART " == *" all "* || " $PART " == *" items "* ]]; then
  for state in ${STATES:-gpt issue}; do  # dcp_items_bench.py --state: the GPT's own state, issue 14's shape of it
    (cd benchmarks && timeout 150 python3 dcp_items_bench.py --state $state --device cpu --codec zstd --out "$OUT/dcp_items_cpu_$state.md") 2>&1 | tail -6
    (cd benchmarks && timeout 100 python3 dcp_items_bench.py --state $state --device cuda --codec ans --out "$OUT/dcp_items_gpu_$state.md") 2>&1 | tail -6
  done
  if [ "${PROFILE:-1}" = 1 ]; then
    (cd benchmarks && timeout 120 python3 profile_dcp.py --dim 1024 --layers 20 --steps 3 --codec ans --phase load) 2>&1 | grep -v Warn | head -45 > "$OUT/profile_load.txt"
    head -8 "$OUT/profile_load.txt"
  fi
fi
