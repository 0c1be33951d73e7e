#!/usr/bin/env bash
# What a GPU session runs on the lent H200 (see README "Benchmarks"): install the carried wheels, run the
# gpu-marked tests, then the given benchmarks; everything is logged under $OUT (or ./gpu-out).
#   bash benchmarks/gpu_run.sh "codec_bench.py --steps 300"
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -30
fi
for bench in "$@"; do
  name=$(echo "$bench" | cut -d' ' -f1 | sed 's/\.py$//')
  (cd benchmarks && python3 $bench --out "$OUT/$name.md") 2>&1 | tee "$OUT/$name.log" | tail -40
done
