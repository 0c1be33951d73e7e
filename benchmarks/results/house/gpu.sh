python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
# Issue 33 "No slower" on a GPU host: the codec and Lightning benchmarks (this tree's scripts) before (the package at
# before/lightning_nvcomp) and after (this tree), alternating, in one run of benchmarks/before_after.py (at most about
# 4 minutes), then the gpu-marked tests (at most 5). Results: $OUT/house/ (gpu.md, gpu.json, env.txt, pytest-gpu.txt).
# From the after tree's root, with the wheels in .whl/ and the before tree's package copied to before/:
#   bash benchmarks/results/house/gpu.sh
# Without a CUDA GPU and nvCOMP it says so, skips the GPU codec rows and runs the CPU ones and the Lightning benchmark
# (zstd) on a small model.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/house"
export PYTHONUNBUFFERED=1
[ -f before/lightning_nvcomp/__init__.py ] || { echo "before/lightning_nvcomp/ is missing: copy the before tree's package there" >&2; exit 2; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; echo "cores: $(nproc)";
  python3 -c "import torch, lightning; from lightning_nvcomp.codec.gpu import nvcomp_version as v; print('torch', torch.__version__, 'lightning', lightning.__version__, 'nvCOMP', v())"; } 2>&1 | tee "$OUT/house/env.txt"
if python3 -c "from lightning_nvcomp.codec.gpu import gpu_available; raise SystemExit(not gpu_available())"; then
  model="--dim 512 --layers 8 --steps 30 --batch 16"; codec=ans
else
  model="--dim 128 --layers 2 --steps 3 --batch 2"; codec=zstd
  echo "NO CUDA GPU WITH nvCOMP HERE: skipped the GPU codec rows (gANS, GPU zstd) and gANS saves; ran the CPU zstd rows and the Lightning benchmark with --codec zstd on a small model" | tee -a "$OUT/house/env.txt"
fi
# No warm-up run (the first run, before's, trains the state that every run then loads): two or three rounds fit.
timeout 205 python3 benchmarks/before_after.py --before before --after . --rounds 5 --warmup 0 --budget-s 180 \
  --run-timeout-s 90 --name gpu --out "$OUT/house" --codec-args "$model --cpu-sample-mb 16" \
  --lightning-args "$model --codec $codec --methods torch,defaults --repeat 2 --probe-mb 256" 2>&1 | tail -n 60
timeout 300 python3 -m pytest -q -m gpu -x --timeout 300 tests 2>&1 | tail -n 80 > "$OUT/house/pytest-gpu.txt"
tail -n 3 "$OUT/house/pytest-gpu.txt"
