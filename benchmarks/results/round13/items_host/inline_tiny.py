"""Diagnostic (round 13): on a many-core host, tiny items' batches coded on the calling thread before any coded
batch starts (``item_batches.INLINE_TINY``, what switch.py's timeline asked for) against coded beside the first
coded batches, as before. ``benchmarks/dcp_items_bench.py``'s states (``issue``, ``gpt``), zstd on the CPU; per
state, alternating in one process: our single-file save, ``dcp.save`` both ways; medians of saves 3-N; then one
save's timeline each way (seconds from ``dcp.save``'s call: write_data, each coded batch, the fsyncs, finish). From
the repository root:

    python benchmarks/results/round13/items_host/inline_tiny.py issue gpt

It ran at commit 35ecebd (inline_tiny.txt), the only one with ``INLINE_TINY``: no faster on the H200 host's 16 cores,
so the change was reverted (see ../README.md).
"""

import os
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
from lightning_nvcomp.format import item_batches  # noqa: E402
from lightning_nvcomp.integrations.dcp import data_files  # noqa: E402

SAVES = 8
DIR = "/tmp/items-host"
os.makedirs(DIR, exist_ok=True)


def timed_save(state: dict, how: str) -> float:
    if how == "single":
        path = f"{DIR}/single.ckpt"
        if os.path.exists(path):
            os.remove(path)
    else:
        directory = bench.fresh_dir(f"{DIR}/dcp")
        item_batches.INLINE_TINY = how == "dcp tiny first"
    os.sync()
    begin = time.perf_counter()
    if how == "single":
        lightning_nvcomp.save(state, path, codec="zstd")
    else:
        dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
    seconds = time.perf_counter() - begin
    item_batches.INLINE_TINY = True
    return seconds


def timeline(state: dict) -> str:
    events: list[tuple[float, str]] = []
    start = time.perf_counter()

    def mark(name: str) -> None:
        events.append((time.perf_counter() - start, name))

    def wrapped(original):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            mark(original.__name__ + "+")
            try:
                return original(*args, **kwargs)
            finally:
                mark(original.__name__ + "-")

        return call

    def coded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        for batch in item_batches.code_tensors(*args, **kwargs):
            mark(f"batch of {len(batch)}")
            yield batch

    originals = (NvcompFileSystemWriter.write_data, NvcompFileSystemWriter.finish, data_files.os.fsync)
    NvcompFileSystemWriter.write_data, NvcompFileSystemWriter.finish = (wrapped(f) for f in originals[:2])
    data_files.os.fsync, data_files.code_tensors = wrapped(originals[2]), coded
    try:
        directory = bench.fresh_dir(f"{DIR}/dcp")
        os.sync()
        start = time.perf_counter()
        dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
        mark("end")
    finally:
        NvcompFileSystemWriter.write_data, NvcompFileSystemWriter.finish, data_files.os.fsync = originals
        data_files.code_tensors = item_batches.code_tensors
    return ", ".join(f"{t:.3f} {n}" for t, n in events)


for name in sys.argv[1:]:
    state = (bench.issue_state if name == "issue" else bench.many_items_state)(128, 100, 10, "cpu")
    hows = ["single", "dcp tiny beside", "dcp tiny first"]
    seconds: dict[str, list[float]] = {how: [] for how in hows}
    for i in range(SAVES):
        for how in hows if i % 2 else hows[::-1]:
            seconds[how].append(timed_save(state, how))
    single = statistics.median(seconds["single"][2:])
    for how in hows:
        median = statistics.median(seconds[how][2:])
        print(
            f"{name} {how:11} median {median:.3f} s ({median / single:.2f}x the single file):",
            " ".join(f"{s:.3f}" for s in seconds[how]),
        )
    item_batches.INLINE_TINY = False
    print(f"{name} timeline, tiny beside:", timeline(state))
    item_batches.INLINE_TINY = True
    print(f"{name} timeline, tiny first:", timeline(state))
