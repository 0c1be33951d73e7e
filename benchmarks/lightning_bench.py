"""Lightning checkpoint benchmark: a GPT of ~300M parameters with AdamW, trained on real text, saved through each
CheckpointIO the way the Trainer calls it. Measures the time training is blocked per save, the time until the file
is durable (written and fsynced), the peak extra GPU memory, the file size, and the time to resume from the file
onto the GPU (checked bit-exact against the saved state).

    python benchmarks/lightning_bench.py --steps 200 --out /tmp/lightning.md
    python benchmarks/lightning_bench.py --dim 256 --layers 4 --steps 20 --batch 4 --codec zstd --probe-mb 64  # CPU
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import functools
import json
import os
import pathlib
import pstats
import shutil
import statistics
import sys
import time

import torch
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

import lightning_nvcomp
from lightning_nvcomp.auto.probe import probe_bandwidth
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.storage.local import fsync_path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, same_bytes, sync, trained_gpt  # noqa: E402

GPU = torch.cuda.is_available()
#: The CheckpointIOs compared (--methods): Lightning's own, synchronous and asynchronous; ours with --codec,
#: synchronous and asynchronous; ours with every option at its default, as most users construct it.
METHODS = ("torch", "torch-async", "sync", "async", "defaults")


def measure_save(io, checkpoint: dict, path: str, wait) -> dict:
    """Blocked and durable seconds and peak extra GPU memory of one save through ``io``."""
    sync()
    base = torch.cuda.memory_allocated() if GPU else 0
    if GPU:
        torch.cuda.reset_peak_memory_stats()
    begin = time.perf_counter()
    io.save_checkpoint(checkpoint, path)
    sync()
    blocked = time.perf_counter() - begin
    wait(io)
    fsync_path(path)
    durable = time.perf_counter() - begin
    extra = (torch.cuda.max_memory_allocated() - base) / 1e9 if GPU else 0.0
    return {"blocked": blocked, "durable": durable, "extra_gb": extra, "size_gb": os.path.getsize(path) / 1e9}


def measure_resume(
    io, path: str, model: torch.nn.Module, opt: torch.optim.Optimizer, saved: list[torch.Tensor]
) -> float:
    """Seconds from the file to the model and optimizer state on the GPU, the way Lightning resumes; the state read
    must equal ``saved`` (the checkpoint's tensors) bit for bit."""
    sync()
    begin = time.perf_counter()
    ckpt = io.load_checkpoint(path)
    model.load_state_dict(ckpt["state_dict"])
    opt.load_state_dict(ckpt["optimizer_states"][0])
    sync()
    seconds = time.perf_counter() - begin
    if not same_bytes(local_tensors(ckpt), saved):
        raise AssertionError(f"{path}: the state {type(io).__name__} read back differs from the one it saved")
    return seconds


def profiled(enabled: bool, fn, *args):
    """``fn(*args)``, printing a cProfile of it when ``enabled``."""
    if not enabled:
        return fn(*args)
    profiler = cProfile.Profile()
    result = profiler.runcall(fn, *args)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="rows of 256 bytes per training step")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dir", default="/tmp/lightning-bench")
    parser.add_argument("--codec", default="ans")
    parser.add_argument("--staging-mb", type=int, default=128)
    parser.add_argument("--probe-mb", type=int, default=1024)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"some of {','.join(METHODS)}")
    parser.add_argument("--repeat", type=int, default=1, help="saves and resumes timed per method (medians shown)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--state-cache", default=None, help="folder keeping the trained state between runs")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of our second sync and async save")
    args = parser.parse_args()
    chosen = args.methods.split(",")
    if not set(chosen) <= set(METHODS):
        parser.error(f"--methods {args.methods}: each must be one of {', '.join(METHODS)}")
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)

    device = "cuda" if GPU else "cpu"
    model, opt = trained_gpt(args.dim, args.layers, args.steps, args.batch, device, args.state_cache)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT {n_params / 1e6:.0f}M params", flush=True)
    checkpoint = {
        "state_dict": model.state_dict(),
        "optimizer_states": [opt.state_dict()],
        "global_step": args.steps,
        "epoch": 0,
    }
    saved = [t.detach().cpu().clone() for t in local_tensors(checkpoint)]  # each resume must give these bytes back
    raw_gb = sum(t.numel() * t.element_size() for t in lightning_nvcomp.format.find_contents(checkpoint).tensors) / 1e9
    write_gbps = probe_bandwidth(args.dir, args.probe_mb << 20)
    print(f"state {raw_gb:.2f} GB, disk {write_gbps:.2f} GB/s ({args.probe_mb} MiB write + fsync)", flush=True)

    def async_wait(io):
        io.teardown()

    methods = {
        "torch": ("TorchCheckpointIO", TorchCheckpointIO, lambda io: None),
        "torch-async": ("AsyncCheckpointIO", lambda: AsyncCheckpointIO(TorchCheckpointIO()), async_wait),
        "sync": (
            f"NvcompCheckpointIO({args.codec}, sync)",
            lambda: lightning_nvcomp.NvcompCheckpointIO(args.codec, staging_mb=args.staging_mb, probe_mb=64),
            lambda io: None,
        ),
        "async": (
            f"NvcompCheckpointIO({args.codec}, async)",
            lambda: lightning_nvcomp.NvcompCheckpointIO(
                args.codec, async_save=True, staging_mb=args.staging_mb, probe_mb=64
            ),
            lambda io: io.wait(),
        ),
        "defaults": ("NvcompCheckpointIO() (defaults)", lightning_nvcomp.NvcompCheckpointIO, lambda io: io.wait()),
    }
    rows, paths, metrics, codecs = {}, {}, {}, {}
    for i, key in enumerate(chosen):
        name, make_io, wait = methods[key]
        paths[key] = path = os.path.join(args.dir, f"method{i}.ckpt")
        io = make_io()
        first = measure_save(io, checkpoint, path, wait)
        # Lightning's own IOs have no first-save costs; ours allocate pinned memory and probe the disk once.
        ours = "Nvcomp" in name
        run = functools.partial(profiled, args.profile and ours)
        saves = [] if ours else [first]
        saves += [run(measure_save, io, checkpoint, path, wait) for _ in range(args.repeat - len(saves))]
        again = {k: statistics.median(save[k] for save in saves) for k in first}
        if ours:
            metrics[name] = io.savings.history[-1]
            codecs[name] = [("none", "zstd", "ans")[int(save["nvcomp/codec_id"])] for save in io.savings.history]
            print("  metrics of that save:", {k: round(v, 3) for k, v in metrics[name].items()}, flush=True)
        resume = statistics.median(run(measure_resume, io, path, model, opt, saved) for _ in range(args.repeat))
        rows[key] = (name, first, again, resume)
        print(
            name,
            {k: round(v, 3) for k, v in again.items()},
            "first blocked",
            round(first["blocked"], 3),
            "resume",
            round(resume, 2),
            flush=True,
        )
    direct_key = next((key for key in ("sync", "defaults", "async") if key in rows), None)
    if direct_key:
        gpu_load_begin = time.perf_counter()
        direct = lightning_nvcomp.load(paths[direct_key], map_location=device)
        model.load_state_dict(direct["state_dict"])
        opt.load_state_dict(direct["optimizer_states"][0])
        sync()
        direct_s = time.perf_counter() - gpu_load_begin
        if not same_bytes(local_tensors(direct), saved):
            raise AssertionError(f"{paths[direct_key]}: lightning_nvcomp.load read back another state than was saved")

    lines = [
        "# Lightning checkpoint benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
        f"{torch.cuda.get_device_name() if GPU else 'CPU'}; "
        f"torch {torch.__version__}; nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {n_params / 1e6:.0f}M params, {args.steps} AdamW steps (bf16 autocast) on the Python "
        f"standard library's sources; checkpoint = fp32 weights + AdamW m, v: {raw_gb:.2f} GB on the GPU",
        f"- local disk: {write_gbps:.2f} GB/s ({args.probe_mb} MiB write + fsync); staging_mb={args.staging_mb}",
        "- each method saves the same checkpoint twice through one CheckpointIO, as a Trainer does; the table shows the "
        "second save (the first also allocates pinned memory and probes the disk once: its blocked time is in the last "
        f"column); with --repeat {args.repeat}, the medians of that many saves after the first (Lightning's own IOs: "
        "the first included) and resumes",
        "",
        "| method | training blocked s | durable after s | file GB | ratio | peak extra GPU GB | resume to GPU s | first save blocked s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, first, again, resume in rows.values():
        lines.append(
            f"| {name} | {again['blocked']:.3f} | {again['durable']:.2f} | {again['size_gb']:.2f} | "
            f"{raw_gb / again['size_gb']:.3f} | {again['extra_gb']:.2f} | {resume:.2f} | {first['blocked']:.3f} |"
        )
    lines.append("")
    if "sync" in rows:
        durable = rows["sync"][2]["durable"]
        target = 1.05 * rows["sync"][2]["size_gb"] / write_gbps + 0.2
        lines.append(
            f"Sync target: <= 1.05 x (compressed bytes / write bandwidth) + 0.2 s = {target:.2f} s; measured "
            f"{durable:.2f} s."
        )
    if direct_key:
        lines.append(
            f"Resume through `lightning_nvcomp.load(map_location='{device}')` (decode on the {device}): {direct_s:.2f} s."
        )
    publish(lines, args.out)
    if args.json:
        figures = {"lightning_nvcomp.load s": direct_s} if direct_key else {}
        for name, first, again, resume in rows.values():
            figures.update({f"{name} blocked s": again["blocked"], f"{name} durable s": again["durable"]})
            figures.update({f"{name} resume s": resume, f"{name} first save blocked s": first["blocked"]})
            figures[f"{name} file MB"] = again["size_gb"] * 1e3
        info = {"device": torch.cuda.get_device_name() if GPU else "CPU", "torch": torch.__version__}
        info |= {"params": n_params, "raw_gb": raw_gb, "disk_gbps": write_gbps, "metrics": metrics, "codecs": codecs}
        pathlib.Path(args.json).write_text(json.dumps({"figures": figures, "info": info}, indent=1))


if __name__ == "__main__":
    main()
