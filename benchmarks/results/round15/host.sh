#!/usr/bin/env bash
# Round 15 on the lent GPU host (16 cores): the gpu-marked tests, then issue 14's many-items CPU save as a paired
# ratio (items_ratio.py) with this tree's package and the previous one's (.base/lightning_nvcomp, carried: c741567),
# alternating, three rounds of the issue's shape and one of the GPT's own state. Results under $OUT.
#   bash benchmarks/results/round15/host.sh      (carry .whl and .base; SKIP_TESTS=1 leaves the tests out)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  PYTHONPATH=/tmp/site python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  PYTHONPATH=/tmp/site:$PWD timeout ${TESTS_S:-260} python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 \
    | tee "$OUT/pytest-gpu.txt" | grep -E "passed|failed|FAILED|Error" | tail -12
fi
ratio=benchmarks/results/round15/items_ratio.py
for round in 1 2 3; do
  for tree in .base "$PWD"; do
    PYTHONPATH=/tmp/site:$tree timeout 90 python3 $ratio issue 15 /tmp/items 2>&1 | grep -v '^step' | tee -a "$OUT/items_host.txt"
  done
done
for tree in .base "$PWD"; do
  PYTHONPATH=/tmp/site:$tree timeout 90 python3 $ratio gpt 11 /tmp/items 2>&1 | grep -v '^step' | tee -a "$OUT/items_host.txt"
done
