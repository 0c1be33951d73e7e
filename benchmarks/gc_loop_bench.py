"""Saves and loads between training steps, as a run makes them, counting Python's full garbage collections: the
state of ``dcp_items_bench.py`` (a deep, narrow GPT trained on the standard library's sources: thousands of small
items) saved through DCP after each of ``--rounds`` training-like steps, each making short-lived containers (some
cyclic, a few kept) as a training step's Python does, then loaded back as many times the same way. ``--io`` picks
our writer and reader or DCP's ``FileSystemWriter``/``Reader``. Prints, for the saves and for the loads, the loop's
time, the steps' share and the full collections. One IO per process (a collection one IO sets off may fall in the
next one's time); an A/B of our writer is this script at two commits.

    python benchmarks/gc_loop_bench.py                      # CPU: zstd, ours
    python benchmarks/gc_loop_bench.py --io dcp             # DCP's own writer and reader
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from dcp_items_bench import many_items_state  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def training_step(kept: list) -> None:
    """A training step's Python garbage: 180k short-lived containers, 60k of them in cycles, 60 kept."""
    for i in range(60_000):
        node = {"x": [i]}
        node["self"] = [node]
        if i % 1000 == 0:
            kept.append(node)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--codec", default="zstd")
    parser.add_argument("--io", choices=("ours", "dcp"), default="ours")
    parser.add_argument("--dir", default="/tmp/gc-loop-bench")
    args = parser.parse_args()
    state = many_items_state(args.dim, args.layers, 10, "cpu")
    target = {k: {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in v.items()} for k, v in state.items()}
    if args.io == "ours":
        save = lambda: dcp.save(state, storage_writer=NvcompFileSystemWriter(args.dir, codec=args.codec))  # noqa: E731
        load = lambda: dcp.load(target, storage_reader=NvcompFileSystemReader(args.dir))  # noqa: E731
    else:
        save = lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(args.dir))  # noqa: E731
        load = lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(args.dir))  # noqa: E731
    full = [0]

    def count_full(phase: str, info: dict) -> None:
        full[0] += phase == "start" and info["generation"] == 2

    gc.callbacks.append(count_full)
    kept: list = []
    shutil.rmtree(args.dir, ignore_errors=True)
    for name, run in (("saves", save), ("loads", load)):
        full[0] = 0
        times, steps = [], []
        begin = time.perf_counter()
        for _ in range(args.rounds):
            start = time.perf_counter()
            training_step(kept)
            steps.append(time.perf_counter() - start)
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        total = time.perf_counter() - begin
        print(
            f"{args.io} {name}, {args.rounds} rounds: {total:.2f} s; {name} {sum(times):.2f} s (median "
            f"{statistics.median(times):.3f} s), training steps {sum(steps):.2f} s; full collections {full[0]}"
        )
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
