"""Diagnostic (round 11): N saves of benchmarks/dcp_items_bench.py's many-items state (4,816 tensors, 238 MB, zstd)
in one process, each one's seconds printed, for py-spy to sample. From the repository root:

    py-spy record -r 200 -f raw -t -o dcp.txt -- python benchmarks/results/round11/items_cpu/saves.py dcp 12
    (single: our single-file save; nothing: DCP's own cost, a writer that writes no item)
"""

import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

import dcp_items_bench as bench  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp.dcp import NvcompFileSystemWriter  # noqa: E402

state = bench.many_items_state(128, 100, 10, "cpu")
mode, count = sys.argv[1], int(sys.argv[2])
seconds = []
for _ in range(count):
    directory = bench.fresh_dir("/tmp/items-cpu/dcp")
    begin = time.perf_counter()
    if mode == "dcp":
        dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
    elif mode == "single":
        lightning_nvcomp.save(state, "/tmp/items-cpu/single.ckpt", codec="zstd")
    else:
        dcp.save(state, storage_writer=bench.StoresNothing(directory))
    seconds.append(time.perf_counter() - begin)
print(mode, " ".join(f"{s:.3f}" for s in seconds))
