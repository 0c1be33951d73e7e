"""Where ``dcp.async_save``'s compressed staging spends the time training waits (a diagnostic for issue 14's
``async_save`` target, not a benchmark of record): a trained GPT's model + AdamW state on the GPU, staged by
``NvcompFileSystemWriter(codec="ans")`` under several GPU batch sizes (``item_batches.BATCH_NBYTES["cuda"]``), next to our single-file
async snapshot of the same state (``format.snapshot``), each ``--repeat`` times in alternating order. Per staging:
the blocked time, how much of it is spent inside nvCOMP's encode calls (which wait for their GPU work), the batches
coded, and the GPU memory allocated above the state's at the peak.

    python benchmarks/staging_bench.py --batch-mib 64,128,256 --repeat 4 --out /tmp/staging.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shutil
import statistics
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec import gpu as gpu_engine
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.dcp import NvcompFileSystemWriter
from lightning_nvcomp.format import item_batches

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, sync  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402


class EncodeClock:
    """Time spent inside the GPU engine's encode calls (each waits for its batch's coding) and how many ran."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        original = gpu_engine.NvcompEngine.encode

        def timed(engine, *args, **kwargs):
            begin = time.perf_counter()
            try:
                return original(engine, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - begin
                self.calls += 1

        gpu_engine.NvcompEngine.encode = timed

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-mib", default="64,128,256")
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--dir", default="/tmp/lnv-staging")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true", help="torch.profiler of the last staging of the first method")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=args.dim // 64, context=256).to("cuda")
    opt = train(model, stdlib_corpus(16 << 20), args.steps, 16, "cuda", log_every=args.steps)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    state_gb = sum(t.numel() * t.element_size() for t in local_tensors(state)) / 1e9
    clock = EncodeClock()

    def dcp_staging(batch_mib: int) -> dict:
        item_batches.BATCH_NBYTES["cuda"] = batch_mib << 20
        path = os.path.join(args.dir, f"dcp-{batch_mib}")
        shutil.rmtree(path, ignore_errors=True)  # before the clock starts: deleting GBs of files takes a while
        writer = NvcompFileSystemWriter(path, codec="ans")
        begin = time.perf_counter()
        future = dcp.async_save(state, storage_writer=writer)
        sync()
        blocked = time.perf_counter() - begin
        future.result()
        return {"blocked": blocked, "stage": writer.stats.stage_s, "codec": writer.stats.codec}

    def single_snapshot(_: int) -> dict:
        begin = time.perf_counter()
        snap = fileformat.snapshot(state, "ans", isolate=True)
        sync()
        blocked = time.perf_counter() - begin
        del snap
        return {"blocked": blocked, "stage": blocked, "codec": "ans"}

    methods = [(f"dcp.async_save, {b} MiB batches", dcp_staging, b) for b in map(int, args.batch_mib.split(","))]
    methods.append(("single-file async snapshot (256 MiB records)", single_snapshot, 0))
    for _name, run, arg in methods:  # warm-up: layouts, pinned pool, nvCOMP codecs
        run(arg)
    rows = []
    for rep in range(args.repeat):
        for name, run, arg in methods if rep % 2 == 0 else methods[::-1]:
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            clock.reset()
            got = run(arg)
            rows.append(
                {
                    "name": name,
                    "rep": rep,
                    **got,
                    "encode_s": clock.seconds,
                    "calls": clock.calls,
                    "extra_gb": (torch.cuda.max_memory_allocated() - base) / 1e9,
                }
            )
            r = rows[-1]
            print(
                f"rep {rep} {name}: blocked {r['blocked']:.3f} s, in encode {r['encode_s']:.3f} s / {r['calls']} calls"
            )
    if args.profile:  # one more staging of the first method, profiled (not in the table)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            methods[0][1](methods[0][2])
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        print(profiler.key_averages().table(sort_by="self_device_time_total", row_limit=15))
    shutil.rmtree(args.dir, ignore_errors=True)
    lines = [
        "# Compressed staging of `dcp.async_save` (gANS) against our single-file async snapshot",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {torch.cuda.get_device_name()}; "
        f"torch {torch.__version__}; nvCOMP {nvcomp_version()}",
        f"- byte-level GPT, {args.dim} wide, {args.layers} layers, {args.steps} AdamW steps on the standard library's "
        f"sources; model + AdamW state {state_gb:.2f} GB on the GPU; {args.repeat} repetitions, alternating order",
        "- blocked: until `dcp.async_save` returns (the snapshot: until it is in host memory); in encode: inside "
        "nvCOMP's encode calls, which wait for their batch's coding; extra GPU GB: peak allocated above the state",
        "",
        "| method | rep | blocked s | of it staging s | in encode s | encode calls | extra GPU GB |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['name']} | {r['rep']} | {r['blocked']:.3f} | {r['stage']:.3f} | {r['encode_s']:.3f} | {r['calls']} | "
            f"{r['extra_gb']:.2f} |"
            for r in rows
        ),
        "",
        "Medians:",
        "",
        "| method | blocked s | in encode s | extra GPU GB |",
        "|---|---|---|---|",
    ]
    for name, _, _ in methods:
        mine = [r for r in rows if r["name"] == name]
        lines.append(
            f"| {name} | {statistics.median(r['blocked'] for r in mine):.3f} | "
            f"{statistics.median(r['encode_s'] for r in mine):.3f} | {max(r['extra_gb'] for r in mine):.2f} |"
        )
    publish(lines, args.out)


if __name__ == "__main__":
    main()
