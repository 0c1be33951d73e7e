"""A plain DCP checkpoint (DCP's own ``FileSystemWriter``, as Lightning's and Accelerate's sharded saves write it) read
back through ``NvcompFileSystemReader`` and through DCP's ``FileSystemReader``, alternately, in one process: the
median of ``--repeat`` loads each after two warm-ups (the file in the page cache). What a resume from an uncompressed
sharded checkpoint costs with our reader, which checks every storage's CRC-32 where DCP's reader checks none.

    python benchmarks/plain_read_bench.py --out /tmp/plain_read_cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

import lightning_nvcomp
from lightning_nvcomp.dcp import NvcompFileSystemReader

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=120, help="tensors of 2 MiB (float32 512 x 1024)")
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--dir", default="/tmp/plain-read-bench")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(512, 1024) for i in range(args.items)}
    shutil.rmtree(args.dir, ignore_errors=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(args.dir))
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    times: dict[str, list[float]] = {"NvcompFileSystemReader": [], "FileSystemReader": []}
    readers = {"NvcompFileSystemReader": NvcompFileSystemReader, "FileSystemReader": dcp.FileSystemReader}
    for _ in range(args.repeat + 2):
        for name, reader in readers.items():
            begin = time.perf_counter()
            dcp.load(target, storage_reader=reader(args.dir))
            times[name].append(time.perf_counter() - begin)
    assert all(torch.equal(target[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items())
    shutil.rmtree(args.dir, ignore_errors=True)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    lines = [
        f"<!-- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; torch "
        f"{torch.__version__}; lightning_nvcomp from {os.path.dirname(lightning_nvcomp.__file__)} -->",
        f"{args.items} float32 tensors, {nbytes / 1e6:.0f} MB, saved by FileSystemWriter; median of {args.repeat} "
        "loads after two warm-ups (min-max):",
        "",
        "| reader | load s |",
        "|---|---|",
    ]
    for name, ts in times.items():
        measured = ts[2:]
        lines.append(f"| {name} | {statistics.median(measured):.3f} ({min(measured):.3f}-{max(measured):.3f}) |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
