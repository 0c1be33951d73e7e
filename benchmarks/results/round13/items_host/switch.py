"""Diagnostic (round 13): where a many-items ``dcp.save`` spends its time on a many-core host, and whether the GIL's
switch interval matters there (a Python-heavy writer thread beside many coding threads: each coding thread waits for
the GIL to hand back its results). ``benchmarks/dcp_items_bench.py``'s states (``issue``, ``gpt``), zstd on the CPU;
per state, alternating in one process: our single-file save, ``dcp.save`` with Python's switch interval at its
5 ms default and at 0.5 ms; medians of saves 3-N; then one save's timeline (seconds from ``dcp.save``'s call to
write_data, each coded batch, the fsyncs, finish). From the repository root:

    python benchmarks/results/round13/items_host/switch.py issue gpt
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
        sys.setswitchinterval(0.005 if how == "dcp 5 ms" else 0.0005)
    os.sync()
    begin = time.perf_counter()
    if how == "single":
        lightning_nvcomp.save(state, path, codec="zstd")
    else:
        dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
    seconds = time.perf_counter() - begin
    sys.setswitchinterval(0.005)
    return seconds


def timeline(state: dict) -> str:
    events: list[tuple[float, str]] = []
    start = [0.0]

    def mark(name: str) -> None:
        events.append((time.perf_counter() - start[0], name))

    def wrapped(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            mark(name + "+")
            try:
                return original(*args, **kwargs)
            finally:
                mark(name + "-")

        setattr(owner, name, call)

    code_tensors = data_files.code_tensors

    def coded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        for batch in code_tensors(*args, **kwargs):
            mark(f"batch of {len(batch)}")
            yield batch

    data_files.code_tensors = coded
    wrapped(NvcompFileSystemWriter, "write_data")
    wrapped(NvcompFileSystemWriter, "finish")
    wrapped(data_files.os, "fsync")
    directory = bench.fresh_dir(f"{DIR}/dcp")
    os.sync()
    start[0] = time.perf_counter()
    dcp.save(state, storage_writer=NvcompFileSystemWriter(directory, codec="zstd"))
    mark("end")
    return ", ".join(f"{t:.3f} {n}" for t, n in events)


for name in sys.argv[1:]:
    state = (bench.issue_state if name == "issue" else bench.many_items_state)(128, 100, 10, "cpu")
    hows = ["single", "dcp 5 ms", "dcp 0.5 ms"]
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
    print(f"{name} timeline:", timeline(state))
