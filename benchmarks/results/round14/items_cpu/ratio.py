"""Diagnostic (round 14): issue 14's many-items CPU case as a ratio measured within one process, so that this VM's
drifting speed cancels out: ``dcp.save`` with our writer (zstd) and our single-file save of the same state
(``benchmarks/dcp_items_bench.py``'s states), alternating N times, files fsynced; the medians of each and of the
pairs' ratios (after the first pair). Run against another tree's package with PYTHONPATH=<tree>. From the
repository root:

    python benchmarks/results/round14/items_cpu/ratio.py issue 15
"""

import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

import dcp_items_bench as bench  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp.dcp import NvcompFileSystemWriter  # noqa: E402

build = bench.issue_state if sys.argv[1] == "issue" else bench.many_items_state
state = build(128, 100, 10, "cpu")
single_s, dcp_s = [], []
for _ in range(int(sys.argv[2])):
    begin = time.perf_counter()
    lightning_nvcomp.save(state, "/tmp/items-ratio/single.ckpt", codec="zstd")
    single_s.append(time.perf_counter() - begin)
    directory = bench.fresh_dir("/tmp/items-ratio/dcp")
    begin = time.perf_counter()
    dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
    dcp_s.append(time.perf_counter() - begin)
ratios = [d / s for s, d in zip(single_s[1:], dcp_s[1:])]
print(
    f"{pathlib.Path(lightning_nvcomp.__file__).parents[1]} {sys.argv[1]}: single {statistics.median(single_s[1:]):.3f} s, "
    f"dcp.save {statistics.median(dcp_s[1:]):.3f} s, ratio median {statistics.median(ratios):.2f}x "
    f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.2f}-{statistics.quantiles(ratios, n=4)[2]:.2f})"
)
