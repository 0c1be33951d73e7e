#!/usr/bin/env bash
# The sharded path on the lent H200 (issue 14, one rank; benchmarks/results/round7), each part a fresh process with
# its own time limit: the DCP benchmark (the ~250M GPT, 3.03 GB of state: FileSystemWriter, ours ans and auto, our
# single file, DCP's own cost; 4 repetitions, medians), the many-small-items case on the GPU, then Lightning's
# FSDPStrategy(state_dict_type="sharded") and Accelerate's FSDP2 save_state with writes held to 200 MB/s by a cgroup
# (benchmarks/throttle.sh), a cProfile of our dcp.save and dcp.async_save (main thread), the compressed staging's
# batch sizes against our single-file snapshot (staging_bench.py), and the gpu-marked tests of $GPU_TESTS (default: all).
# Carry .whl; results under $OUT.
#   bash benchmarks/sharded_gpu.sh   (PARTS: a space-separated subset of "tests dcp items reshard lightning accelerate
#   profile staging"; reshard: resharded dcp.load 1 -> 2 and 2 -> 1 ranks on the one GPU, reshard_bench.py)
# Everything is written under $OUT/sharded and packed into $OUT/sharded.tgz after each part (the device tool brings
# back at most 8 files of a call: the archive is one).
set -uo pipefail
DEST=${OUT:-$PWD/gpu-out}
OUT=$DEST/sharded
PARTS=${PARTS:-"tests dcp items reshard lightning accelerate profile staging"}
mkdir -p "$OUT"
pack() { tar czf "$DEST/sharded.tgz" -C "$OUT" .; }
trap pack EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  python3 -c "import torch, nvidia.nvcomp as n; print('torch', torch.__version__, 'nvcomp', n.__version__)"; } | tee "$OUT/env.txt"
has() { [[ " $PARTS " == *" $1 "* ]]; }
throttled() {  # run "$@" with its writes held to 200 MB/s
  local cg
  cg=$(bash benchmarks/throttle.sh /tmp/lnv-throttled 200) || return 1
  (echo $BASHPID > "$cg/cgroup.procs" && exec "$@")
}
if has tests; then
  timeout ${TESTS_S:-240} python3 -m pytest -q -m gpu ${GPU_TESTS:-tests} -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1
  tail -n 5 "$OUT/pytest-gpu.txt"
fi
if has staging; then
  (cd benchmarks && timeout ${STAGING_S:-150} python3 staging_bench.py --batch-mib ${STAGING_MIB:-64,128,256} --repeat 4 \
    --profile --out "$OUT/staging.md" > "$OUT/staging.log" 2>&1); tail -n 8 "$OUT/staging.md"
fi
if has dcp; then
  (cd benchmarks && timeout ${DCP_S:-200} python3 dcp_bench.py --dim 1024 --layers 20 --steps 20 --repeat 4 \
    --methods "FileSystemWriter,Nvcomp ans,Nvcomp auto,single file: lightning_nvcomp.save / load,DCP's own cost (a writer that writes no item)" \
    --out "$OUT/dcp.md" > "$OUT/dcp.log" 2>&1); tail -n 9 "$OUT/dcp.md"
fi
if has items; then
  (cd benchmarks && timeout ${ITEMS_S:-90} python3 dcp_items_bench.py --device cuda --codec ans --out "$OUT/dcp_items_gpu.md" \
    > "$OUT/dcp_items_gpu.log" 2>&1); tail -n 8 "$OUT/dcp_items_gpu.md"
fi
if has reshard; then
  (cd benchmarks && timeout ${RESHARD_S:-170} python3 reshard_bench.py --dim 1024 --layers 20 --steps 20 --repeat 4 --profile \
    --out "$OUT/reshard.md" > "$OUT/reshard.log" 2>&1); tail -n 8 "$OUT/reshard.md"
fi
if has lightning; then
  throttled timeout ${LIGHTNING_S:-110} torchrun --nproc_per_node 1 benchmarks/lightning_fsdp_bench.py --dim 768 --layers 12 \
    --steps 5 --codecs ans,auto --repeat 3 --dir /tmp/lnv-throttled/lightning --out "$OUT/lightning_fsdp_1gpu_throttled.md" \
    > "$OUT/lightning_fsdp.log" 2>&1; tail -n 22 "$OUT/lightning_fsdp_1gpu_throttled.md"
fi
if has accelerate; then
  throttled timeout ${ACCELERATE_S:-110} torchrun --nproc_per_node 1 benchmarks/accelerate_fsdp_bench.py --dim 768 --layers 12 \
    --steps 5 --repeat 3 --dir /tmp/lnv-throttled/accelerate --label "the local disk, writes held to 200 MB/s by a cgroup" \
    --out "$OUT/accelerate_fsdp_1gpu_throttled.md" > "$OUT/accelerate_fsdp.log" 2>&1; tail -n 6 "$OUT/accelerate_fsdp_1gpu_throttled.md"
fi
if has profile; then
  for phase in save async; do
    (cd benchmarks && timeout ${PROFILE_S:-50} python3 profile_dcp.py --dim 1024 --layers 20 --steps 3 --codec ans \
      --phase $phase > "$OUT/profile_$phase.txt" 2>&1); grep -E "^rep|function calls" "$OUT/profile_$phase.txt"
  done
fi
