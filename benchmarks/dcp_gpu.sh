#!/usr/bin/env bash
# The sharded path on the lent H200 (issue 14, one rank): the GPU tests, the DCP benchmark on a ~250M GPT trained on
# real text (our writer/reader against DCP's, sync and async, loads), and the many-small-items benchmark with gANS.
#   bash benchmarks/dcp_gpu.sh     (carry .whl)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -q -m gpu tests -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -4
(cd benchmarks && timeout 200 python3 dcp_bench.py --dim 1024 --layers 20 --steps 20 --out "$OUT/dcp.md") 2>&1 | tail -14
[ "${SKIP_ITEMS:-0}" = 1 ] || (cd benchmarks && timeout 100 python3 dcp_items_bench.py --device cuda --codec ans --out "$OUT/dcp_items_gpu.md") 2>&1 | tail -6
