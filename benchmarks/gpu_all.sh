#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md on one GPU host, within 8 minutes: codec, Lightning steady state (the savings over a
# run: docs/savings.png), DCP, many items, and Accelerate FSDP (on 2 GPUs where there are 2, else on 1). Each writes
# its result to $OUT/results/<benchmark>/latest-gpu.json and its output to $OUT/logs/<benchmark>.log; each part has a
# time limit of its own within the whole run's, and a part that fails or runs out of time is reported and skipped, the
# others still run (the script exits 0). Without a CUDA GPU and nvCOMP it runs the CPU variants at small sizes instead
# (latest-cpu.json; remote storage against a local S3 server in place of Accelerate FSDP, which needs a GPU).
# From the repository's root, the package importable (an installed wheel, or PYTHONPATH=$PWD):
#   bash benchmarks/gpu_all.sh
#   cp -r "$OUT"/results/. benchmarks/results/ && python benchmarks/report.py     # then commit the results
# OUT (default ./bench-out), PYTHON (default python3), DEADLINE_S (the whole run's limit, default 465 s).
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}
py=${PYTHON:-python3}
deadline=${DEADLINE_S:-465}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
failed=() done_parts=()

# part NAME SECONDS COMMAND...: run COMMAND --json $OUT/results/NAME/latest-$variant.json, for at most SECONDS and
# never past the deadline.
part() {
  local name=$1 limit=$2 began=$SECONDS rc
  shift 2
  local json="$OUT/results/$name/latest-$variant.json" left=$((deadline - SECONDS))
  ((limit > left)) && limit=$left
  if ((limit < 20)); then
    echo "== $name: skipped, ${left} s left of ${deadline}"
    failed+=("$name (not run: no time left)")
    return
  fi
  mkdir -p "$OUT/results/$name"
  rm -f "$json"
  echo "== $name (at most ${limit} s): $*"
  timeout -k 5 "$limit" "$@" --json "$json" > "$OUT/logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && [ -f "$json" ]; then
    done_parts+=("$name")
    echo "   done in $((SECONDS - began)) s: $json"
  else
    failed+=("$name (exit $rc$( [ "$rc" -eq 124 ] && echo ", out of time"))")
    echo "   FAILED after $((SECONDS - began)) s (exit $rc); the end of $OUT/logs/$name.log:"
    tail -n 8 "$OUT/logs/$name.log" | sed 's/^/     /'
  fi
}

if "$py" -c "from lightning_nvcomp.codec.gpu import gpu_available; raise SystemExit(not gpu_available())"; then
  variant=gpu
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/logs/env.txt"
  gpus=$("$py" -c "import torch; print(min(2, torch.cuda.device_count()))")
  part codec 70 "$py" benchmarks/codec_bench.py --steps 100 --cpu-sample-mb 64
  # A 252M GPT (3.0 GB of fp32 weights and AdamW moments), bf16-mixed, a checkpoint every 10 of 40 steps: 6 fits of
  # about 25 s each, each in a fresh process; no fit starts after 110 s.
  part steady 160 "$py" benchmarks/steady_bench.py --dim 1024 --layers 20 --batch 192 --steps 40 --every 10 \
    --ios "TorchCheckpointIO,AsyncCheckpointIO,ours ans async,ours auto async,ours ans sync" \
    --budget-s 110 --fit-timeout-s 60 --dir /tmp/lnv-bench/steady
  part dcp 85 "$py" benchmarks/dcp_bench.py --dim 768 --layers 12 --steps 20 --repeat 2 --dir /tmp/lnv-bench/dcp \
    --methods "FileSystemWriter,Nvcomp ans,Nvcomp zstd,Nvcomp auto,single file: lightning_nvcomp.save / load,DCP's own cost (a writer that writes no item)"
  part dcp_items 70 "$py" benchmarks/dcp_items_bench.py --device cuda --codec ans --repeat 3 --pairs 6 \
    --dir /tmp/lnv-bench/items
  part accelerate_fsdp 75 "$py" -m torch.distributed.run --nproc_per_node "$gpus" benchmarks/accelerate_fsdp_bench.py \
    --dim 768 --layers 12 --steps 5 --repeat 3 --dir /tmp/lnv-bench/accelerate
else
  variant=cpu
  echo "No CUDA GPU with nvCOMP here: the CPU variants, at small sizes (latest-cpu.json)"
  part codec 90 "$py" benchmarks/codec_bench.py --device cpu --dim 256 --layers 4 --steps 50 --batch 8 --cpu-sample-mb 16
  part steady 150 "$py" benchmarks/steady_bench.py --dim 256 --layers 4 --batch 8 --steps 40 --every 10 \
    --precision 32-true --ios "TorchCheckpointIO,AsyncCheckpointIO,ours zstd async,ours auto async,ours zstd sync" \
    --budget-s 100 --fit-timeout-s 45 --dir /tmp/lnv-bench/steady
  part dcp 90 "$py" benchmarks/dcp_bench.py --dim 256 --layers 4 --steps 20 --batch 8 --repeat 3 --dir /tmp/lnv-bench/dcp
  part dcp_items 90 "$py" benchmarks/dcp_items_bench.py --repeat 3 --pairs 8 --dir /tmp/lnv-bench/items
  part remote 90 "$py" benchmarks/remote_bench.py --steps 30 --dim 256 --layers 4 --repeats 3
fi
rm -rf /tmp/lnv-bench
echo "== $SECONDS s in all; done: ${done_parts[*]:-none}; failed: ${failed[*]:-none}"
echo "results: $OUT/results (copy them into benchmarks/results/, then run python benchmarks/report.py)"
