#!/usr/bin/env bash
# Round 15 on the lent GPU host: one thread's CPU time per tiny DCP item (round 14's tiny_cpu.py), the gpu-marked
# tests call 1 did not reach, then the time a Lightning fit loses to checkpointing with writes held to 200 MB/s
# (steady_gpu.sh), split into the training thread's seconds in the checkpoint hook, in remove_checkpoint and in
# teardown: AsyncCheckpointIO against ours (gANS async, background and os durability) at the fit (80 steps,
# a checkpoint every 20), then, with S30=1, AsyncCheckpointIO against ours with background durability at 30 steps, a
# checkpoint every 10. The kernel's dirty-page settings are logged beside.
#   bash benchmarks/results/round15/steady.sh      (carry .whl; PYTEST_S: the tests' limit in s (150); S80_S: the
#   80-step part's (280); S80_IOS: its checkpoint IOs, comma-separated steady_bench.IOS names)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/s80" "$OUT/s30"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
{ date -u; nvidia-smi --query-gpu=name --format=csv,noheader; nproc; sysctl vm.dirty_ratio vm.dirty_background_ratio \
  vm.dirty_bytes vm.dirty_background_bytes vm.dirty_expire_centisecs; grep -E "MemTotal|Dirty|Writeback:" /proc/meminfo;
  findmnt -no SOURCE,FSTYPE --target /tmp; } 2>&1 | tee "$OUT/env.txt"
PYTHONPATH=/tmp/site:$PWD timeout 30 python3 benchmarks/results/round14/items_cpu/tiny_cpu.py 2>&1 | tee "$OUT/tiny_host.txt"
PYTHONPATH=/tmp/site:$PWD timeout ${PYTEST_S:-150} python3 -m pytest -q -m gpu tests/test_lightning_sharded.py tests/test_pinned.py \
  -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu-rest.txt" | tail -3
OUT=$OUT/s80 PARTS=throttled STEPS=80 EVERY=20 THROTTLED_S=${S80_S:-280} \
  THROTTLED_IOS=${S80_IOS:-"AsyncCheckpointIO,ours ans async,ours ans async durable=os"} bash benchmarks/steady_gpu.sh
[[ ${S30:-0} == 1 ]] && OUT=$OUT/s30 PARTS=throttled STEPS=30 EVERY=10 THROTTLED_S=130 \
  THROTTLED_IOS="AsyncCheckpointIO,ours ans async" bash benchmarks/steady_gpu.sh
exit 0
