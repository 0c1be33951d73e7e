#!/usr/bin/env bash
# The time a Lightning fit loses to checkpointing on the lent H200 (issue 15; benchmarks/results/round6): the
# 252.5M GPT, bf16-mixed on the local disk, then bf16-true with writes held to 200 MB/s by a cgroup
# (benchmarks/throttle.sh), every checkpoint IO each in a fresh process. Carry .whl; results under $OUT.
#   bash benchmarks/steady_gpu.sh                 (DISK_IOS / THROTTLED_IOS: comma-separated steady_bench.IOS names;
#   PARTS: "disk", "throttled" or both; DISK_PRECISION / THROTTLED_PRECISION: the fits' precision; STEPS: each fit's
#   steps; EVERY: a checkpoint every EVERY steps (10); REPEAT: rounds of fits, alternating order)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
DISK_IOS=${DISK_IOS:-"TorchCheckpointIO,AsyncCheckpointIO,ours ans sync,ours ans async,ours auto sync,ours auto async"}
THROTTLED_IOS=${THROTTLED_IOS:-"AsyncCheckpointIO,ours ans async durable=os,ours auto async durable=os,ours ans sync durable=os,ours auto sync durable=os"}
PARTS=${PARTS:-"disk throttled"}
common=(--batch 192 --steps ${STEPS:-30} --every ${EVERY:-10} --repeat ${REPEAT:-1})
cd benchmarks
if [[ " $PARTS " == *" disk "* ]]; then
  timeout ${DISK_S:-265} python3 steady_bench.py "${common[@]}" --precision ${DISK_PRECISION:-bf16-mixed} \
    --budget-s $((${DISK_S:-265} - 70)) --ios "$DISK_IOS" \
    --log "$OUT/steady_disk.log" --out "$OUT/steady_disk.md" > "$OUT/steady_disk.out" 2>&1
  tail -n 12 "$OUT/steady_disk.md"
fi
if [[ " $PARTS " == *" throttled "* ]]; then
  cg=$(bash throttle.sh /tmp/lnv-steady 200) || exit 1
  timeout ${THROTTLED_S:-290} python3 steady_bench.py "${common[@]}" --precision ${THROTTLED_PRECISION:-bf16-true} \
    --cgroup "$cg" --budget-s $((${THROTTLED_S:-290} - 75)) --label "local disk, writes held to 200 MB/s" \
    --ios "$THROTTLED_IOS" --log "$OUT/steady_throttled.log" --out "$OUT/steady_throttled.md" \
    > "$OUT/steady_throttled.out" 2>&1
  tail -n 12 "$OUT/steady_throttled.md"
fi
