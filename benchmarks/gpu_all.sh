#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md on one GPU host, within 8 minutes: codec, Lightning steady state (the savings over a
# run: docs/savings.png), DCP, many items, and Accelerate FSDP (on 2 GPUs where there are 2, else on 1). Each writes
# its result to $OUT/results/<benchmark>/latest-gpu.json; their output goes to $OUT/logs.tgz (logs/<benchmark>.log),
# packed again after each part: at most 6 files under $OUT. Each part has a time limit of its own within the whole
# run's, and a part that fails or runs out of time is reported and skipped, the others still run (the script exits 0). Without a CUDA GPU and nvCOMP it runs the CPU variants at small sizes instead
# (latest-cpu.json; remote storage against a local S3 server in place of Accelerate FSDP, which needs a GPU).
# From the repository's root, the package importable (an installed wheel, or PYTHONPATH=$PWD):
#   bash benchmarks/gpu_all.sh
#   cp -r "$OUT"/results/. benchmarks/results/ && python benchmarks/report.py     # then commit the results
# OUT (default ./bench-out), PYTHON (default python3), DEADLINE_S (the whole run's limit: 465 s on a GPU, 660 s on
# a CPU).
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
work=$(mktemp -d /tmp/lnv-bench.XXXXXX)  # the benchmarks' checkpoints and logs, removed at the end
logs=$work/logs
mkdir -p "$OUT" "$logs"
pack() { tar czf "$OUT/logs.tgz" -C "$work" logs; }
trap 'pack; rm -rf "$work"' EXIT
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
  timeout -k 5 "$limit" "$@" --json "$json" > "$logs/$name.log" 2>&1
  rc=$?
  pack
  if [ "$rc" -eq 0 ] && [ -f "$json" ]; then
    done_parts+=("$name")
    echo "   done in $((SECONDS - began)) s: $json"
  else
    failed+=("$name (exit $rc$( [ "$rc" -eq 124 ] && echo ", out of time"))")
    echo "   FAILED after $((SECONDS - began)) s (exit $rc); the end of logs/$name.log:"
    tail -n 8 "$logs/$name.log" | sed 's/^/     /'
  fi
}

if "$py" -c "from lightning_nvcomp.codec.gpu import gpu_available; raise SystemExit(not gpu_available())"; then
  variant=gpu deadline=${DEADLINE_S:-465}
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$logs/env.txt"
  gpus=$("$py" -c "import torch; print(min(2, torch.cuda.device_count()))")
  part codec 65 "$py" benchmarks/codec_bench.py --steps 100 --cpu-sample-mb 64
  # A 252M GPT (3.0 GB of fp32 weights and AdamW moments), bf16-mixed, a checkpoint every 10 of 40 steps: 6 fits of
  # about 25 s each, each in a fresh process; no fit starts after 90 s, none runs over 50 s (the limit covers both).
  part steady 165 "$py" benchmarks/steady_bench.py --dim 1024 --layers 20 --batch 192 --steps 40 --every 10 \
    --ios "TorchCheckpointIO,AsyncCheckpointIO,ours ans async,ours auto async,ours ans sync" \
    --budget-s 90 --fit-timeout-s 50 --dir "$work/steady"
  part dcp 85 "$py" benchmarks/dcp_bench.py --dim 768 --layers 12 --steps 20 --repeat 2 --dir "$work/dcp" \
    --methods "FileSystemWriter,Nvcomp ans,Nvcomp zstd,Nvcomp auto,single file: lightning_nvcomp.save / load,DCP's own cost (a writer that writes no item)"
  part dcp_items 70 "$py" benchmarks/dcp_items_bench.py --device cuda --codec ans --repeat 2 --pairs 6 \
    --dir "$work/items"
  part accelerate_fsdp 70 "$py" -m torch.distributed.run --nproc_per_node "$gpus" benchmarks/accelerate_fsdp_bench.py \
    --dim 768 --layers 12 --steps 5 --repeat 3 --dir "$work/accelerate"
else
  variant=cpu deadline=${DEADLINE_S:-660}
  echo "No CUDA GPU with nvCOMP here: the CPU variants, at small sizes (latest-cpu.json)"
  # torch's own threads spin-wait for each other: on a few cores shared with other work, training runs several times
  # slower with two than with one (the coders' threads are the package's own, not these)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  part codec 90 "$py" benchmarks/codec_bench.py --device cpu --dim 256 --layers 4 --steps 30 --batch 4 --cpu-sample-mb 16
  part steady 200 "$py" benchmarks/steady_bench.py --dim 256 --layers 4 --batch 2 --steps 40 --every 10 \
    --precision 32-true --ios "TorchCheckpointIO,ours zstd async,AsyncCheckpointIO,ours auto async,ours zstd sync" \
    --budget-s 120 --fit-timeout-s 55 --dir "$work/steady"
  part dcp 90 "$py" benchmarks/dcp_bench.py --dim 256 --layers 4 --steps 20 --batch 4 --repeat 3 --dir "$work/dcp"
  part dcp_items 120 "$py" benchmarks/dcp_items_bench.py --layers 40 --repeat 3 --pairs 6 --dir "$work/items"
  part remote 120 "$py" benchmarks/remote_bench.py --steps 10 --dim 256 --layers 4 --repeats 3
fi
echo "== $SECONDS s in all; done: ${done_parts[*]:-none}; failed: ${failed[*]:-none}"
echo "results: $OUT/results (copy them into benchmarks/results/, then run python benchmarks/report.py)"
