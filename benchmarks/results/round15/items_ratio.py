"""Diagnostic (round 15): issue 14's many-items CPU save as a ratio measured within one process, with one save's
timeline. ``dcp.save`` with our writer (zstd) against our single-file save of the same state
(``benchmarks/dcp_items_bench.py``'s states, built once and cached under DIR), alternating PAIRS times, files
fsynced, the page cache flushed before each save; medians of each and of the pairs' ratios (after the first pair);
then the seconds, from ``dcp.save``'s call, at which DCP planned, each thread of the writer worked (a batch coded, a
file's items written, the tiny items' archives built and appended), the fsyncs and ``finish``. Run against another
tree's package with PYTHONPATH=<tree>. From the repository root:

    python benchmarks/results/round15/items_ratio.py issue 15 [DIR]
"""

import functools
import os
import pathlib
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

import dcp_items_bench as bench  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import default_planner  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp.dcp import NvcompFileSystemWriter  # noqa: E402
from lightning_nvcomp.format import item_batches  # noqa: E402
from lightning_nvcomp.integrations.dcp import data_files  # noqa: E402

name, pairs = sys.argv[1], int(sys.argv[2])
directory = pathlib.Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/items-ratio")
directory.mkdir(parents=True, exist_ok=True)
cached = directory / f"state-{name}.pt"
if not cached.exists():
    torch.save((bench.issue_state if name == "issue" else bench.many_items_state)(128, 100, 10, "cpu"), cached)
state = torch.load(cached)

events: list[tuple[str, str, float, float]] = []
start = [0.0]


def timed(fn, label: str):  # noqa: ANN001, ANN201
    @functools.wraps(fn)
    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        begin = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((threading.current_thread().name, label, begin - start[0], time.perf_counter() - start[0]))

    return call


class _Timed(data_files.ThreadPoolExecutor):
    def submit(self, fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        return super().submit(timed(fn, fn.__name__), *args, **kwargs)


item_batches._code_batch = timed(item_batches._code_batch, "code batch")
data_files.ThreadPoolExecutor = _Timed
data_files.os.fsync = timed(os.fsync, "fsync")
NvcompFileSystemWriter.finish = timed(NvcompFileSystemWriter.finish, "finish")
for method in ("create_local_plan", "create_global_plan"):
    setattr(
        default_planner.DefaultSavePlanner, method, timed(getattr(default_planner.DefaultSavePlanner, method), method)
    )


def save(how: str) -> float:
    if how == "single":
        path = directory / "single.ckpt"
        path.unlink(missing_ok=True)
    else:
        target = bench.fresh_dir(str(directory / "dcp"))
    os.sync()
    events.clear()
    start[0] = time.perf_counter()
    if how == "single":
        lightning_nvcomp.save(state, path, codec="zstd")
    else:
        dcp.save(state, storage_writer=NvcompFileSystemWriter(target, codec="zstd"))
    return time.perf_counter() - start[0]


single_s, dcp_s = [], []
for i in range(pairs):
    for how in ("single", "dcp") if i % 2 else ("dcp", "single"):
        (single_s if how == "single" else dcp_s).append(save(how))
ratios = [d / s for s, d in zip(single_s[1:], dcp_s[1:])]
quartiles = statistics.quantiles(ratios, n=4)
print(
    f"{pathlib.Path(lightning_nvcomp.__file__).parents[1].name} {name} ({os.cpu_count()} cores): single "
    f"{statistics.median(single_s[1:]):.3f} s, dcp.save {statistics.median(dcp_s[1:]):.3f} s, ratio median "
    f"{statistics.median(ratios):.2f}x (quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f})"
)
save("dcp")
print("  timeline of one dcp.save (s):")
for thread, label, begin, end in sorted(events, key=lambda e: e[2]):
    print(f"    {begin:6.3f}-{end:6.3f} {thread:22} {label}")
