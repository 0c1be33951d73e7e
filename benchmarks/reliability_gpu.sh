#!/usr/bin/env bash
# Issue "Nothing silently wrong" on the lent H200: the Lightning benchmark before (v0.1, commit c5af640, extracted
# into .baseline/) and after the change, in one run on one machine, alternating; plus the v0.1 gANS fixture.
#   git archive c5af640 lightning_nvcomp | tar -x -C .baseline     (then carry .whl and .baseline)
#   bash benchmarks/reliability_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  PYTHONPATH=/tmp/site python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
# The v0.1 gANS fixture: the fixture state, saved by the v0.1 package.
PYTHONPATH=/tmp/site:$PWD/.baseline python3 tests/fixtures/make_v0_1.py ans "$OUT/ans.pt" && ls -la "$OUT/ans.pt"
PYTHONPATH=/tmp/site:$PWD timeout 380 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -3
for round in 1 2; do
  for version in before after; do
    root=$([ $version = before ] && echo "$PWD/.baseline" || echo "$PWD")
    (cd benchmarks && PYTHONPATH=/tmp/site:$root:$PWD/.. python3 lightning_bench.py --steps ${STEPS:-10} \
      --dir /tmp/lightning-bench-$version --out "$OUT/lightning_${version}_$round.md") 2>&1 | tail -12 \
      | tee "$OUT/lightning_${version}_$round.log"
  done
done
