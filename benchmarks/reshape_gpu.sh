#!/usr/bin/env bash
# Issue "One concern per module" on the lent H200: the GPU tests, then the codec and Lightning benchmarks before
# the reshape (commit 327f5fe: its package, benchmarks and examples, extracted into .baseline13/) and after it, in one
# session on one machine, alternating. Each version runs its own benchmark scripts with the same arguments.
#   mkdir -p .baseline13 && git archive 327f5fe lightning_nvcomp benchmarks examples tests | tar -x -C .baseline13
#   PART=1 bash benchmarks/reshape_gpu.sh   # GPU tests, the format-2 gANS fixture, codec benchmark before/after
#   PART=2 bash benchmarks/reshape_gpu.sh   # Lightning benchmark before/after, twice
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
BEFORE=$PWD/.baseline13
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  PYTHONPATH=/tmp/site python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
root() { [ "$1" = before ] && echo "$BEFORE" || echo "$PWD"; }
if [ "${PART:-1}" = 1 ]; then
  # The gANS fixture of format 2 as written before the reshape (the none and zstd ones are written on the CPU).
  (cd "$BEFORE" && PYTHONPATH=/tmp/site:$BEFORE python3 tests/fixtures/make_v0_1.py ans "$OUT/ans.pt") && ls -la "$OUT/ans.pt"
  PYTHONPATH=/tmp/site:$PWD timeout 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -3
  for version in before after; do
    r=$(root $version)
    (cd "$r/benchmarks" && PYTHONPATH=/tmp/site:$r timeout 200 python3 codec_bench.py --steps ${STEPS:-100} \
      --out "$OUT/codec_$version.md") 2>&1 | tail -30 > "$OUT/codec_$version.log"
    tail -14 "$OUT/codec_$version.log"
  done
else
  for round in 1 2; do
    for version in before after; do
      r=$(root $version)
      (cd "$r/benchmarks" && PYTHONPATH=/tmp/site:$r timeout 120 python3 lightning_bench.py --steps 10 \
        --dir /tmp/lightning-bench-$version --out "$OUT/lightning_${version}_$round.md") 2>&1 | tail -12 \
        | tee "$OUT/lightning_${version}_$round.log"
    done
  done
fi
