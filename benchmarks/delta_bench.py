"""Delta checkpoints on a real training run: a byte-level GPT trained with AdamW on the standard library's sources, its
state saved at the run's last step alone and as a delta against the states 10, 50 and 200 steps earlier.

Per interval and state (fp32 weights + AdamW moments; the weights in bf16; in FP8 scaled per tensor) and per tensor
class: the ratio (raw bytes / file bytes) stored alone and as a delta, the order-0 byte-plane bound of the class alone
and of its XOR with the base (the ideal a stateless coder of the transformed bits approaches), save and load seconds,
and a bit-exact check of every load; times are the median of five rounds of the two saves in turns (nine of the loads;
the DCP saves and the saves to the slow disk: the best of two). CPU zstd by default (``--device cuda --codec ans``: the
state on a GPU, gANS), through the public API (``lightning_nvcomp.save(..., base=...)``); the fp32 state 50 steps apart
also through DCP (a reused ``NvcompFileSystemWriter(delta=...)``, one process), and its peak memory in saves and loads
alone and as a delta, each in a process of its own.

    python benchmarks/delta_bench.py --dim 384 --layers 6 --json benchmarks/results/delta/latest-cpu.json
    python benchmarks/delta_bench.py --dim 768 --layers 12 --device cuda --codec ans --json .../latest-gpu.json
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

import lightning_nvcomp
from lightning_nvcomp.storage import ThrottledStorage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from peers_bench import plane_bound  # noqa: E402

from common import same_bytes, sync, write_result  # noqa: E402
from gpt import GPT, stdlib_corpus  # noqa: E402

INTERVALS = (10, 50, 200)
#: Rounds of the loads timed in turns (a load takes a tenth of a save, and a 2-core machine's timings of one move by
#: 20-40% from round to round: more rounds for the same noise).
LOAD_ROUNDS = 25


def train_states(dim: int, layers: int, steps: int, cache: pathlib.Path, device: str) -> dict[int, dict]:
    """The run's fp32 weights and AdamW moments at ``steps`` and at each interval before it, on ``device`` (cached)."""
    keep = {steps - i for i in INTERVALS} | {steps}
    path = cache / f"delta-gpt-{dim}x{layers}-{steps}-{torch.device(device).type}.pt"
    if path.exists():
        return torch.load(path, weights_only=True, map_location=device)
    torch.manual_seed(0)
    model = GPT(dim=dim, layers=layers, heads=max(1, dim // 64), context=128).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    corpus, gen, states = stdlib_corpus(), torch.Generator().manual_seed(0), {}
    for step in range(1, steps + 1):
        starts = torch.randint(0, corpus.numel() - model.context - 1, (8,), generator=gen)
        rows = torch.stack([corpus[s : s + model.context + 1] for s in starts.tolist()]).long().to(device)
        for group in opt.param_groups:
            group["lr"] = 6e-4 * min(1.0, step / 50)
        F.cross_entropy(model(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in keep:
            opt_state = opt.state_dict()["state"]
            states[step] = {
                "weights": {k: v.clone() for k, v in model.state_dict().items()},
                "exp_avg": {str(k): s["exp_avg"].clone() for k, s in opt_state.items()},
                "exp_avg_sq": {str(k): s["exp_avg_sq"].clone() for k, s in opt_state.items()},
            }
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(states, path)
    return states


def kinds(state: dict) -> dict[str, dict[str, dict]]:
    """The states measured, each by tensor class: fp32 weights and moments, bf16 weights, FP8 weights per tensor."""
    fp8 = {}
    for k, w in state["weights"].items():
        scale = w.abs().amax().clamp(min=1e-12) / 448
        fp8[k] = (w / scale).to(torch.float8_e4m3fn)
    return {
        "fp32 AdamW": state,
        "bf16 weights": {"weights": {k: w.to(torch.bfloat16) for k, w in state["weights"].items()}},
        "FP8 weights": {"weights": fp8},
    }


def xor(a: dict, b: dict) -> list[torch.Tensor]:
    return [
        (a[k].contiguous().view(-1).view(torch.uint8) ^ b[k].contiguous().view(-1).view(torch.uint8)).view(a[k].dtype)
        for k in a
    ]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Seconds ``fn`` took (the GPU's work included) and what it returned; the best of two runs, the first one's
    result freed before the second (else a load's second run finds its memory taken: it would time the allocator)."""
    best, out = math.inf, None
    for _ in range(2):
        out = None
        sync()
        begin = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - begin)
    return best, out


def in_turns(
    alone: Callable[[], object],
    delta: Callable[[], object],
    exact: Callable[[object], bool] = lambda _: True,
    rounds: int = 5,
) -> tuple[float, float, bool]:
    """The median seconds of each of two runs (a save or a load alone and as a delta) over ``rounds`` rounds, timed
    in turns, each first in every other round (a shared machine's drift falls on both), each result checked with
    ``exact`` and freed before the next run (else a load would time the allocator's fresh pages and the other its
    reused ones); and whether every result was exact."""
    times: dict[str, list[float]] = {"alone": [], "delta": []}
    every = True
    for r in range(rounds):
        # each first in every other round: the first of a round finds the memory the round before freed
        for kind, run in (("alone", alone), ("delta", delta))[:: 1 if r % 2 == 0 else -1]:
            sync()
            begin = time.perf_counter()
            out = run()
            sync()
            times[kind].append(time.perf_counter() - begin)
            every = every and exact(out)
            out = None
    return statistics.median(times["alone"]), statistics.median(times["delta"]), every


def measure(
    target: dict, base: dict, folder: pathlib.Path, codec: str, device: str, slow: ThrottledStorage | None = None
) -> dict:
    """One state against one base: sizes, ideal bounds, times, bit-exactness; with ``slow``, the time to durable of
    each save written through it too (sync saves: written and fsynced when they return)."""
    alone, delta, base_path = folder / "alone.ckpt", folder / "delta.ckpt", folder / "base.ckpt"
    lightning_nvcomp.save(base, base_path, codec=codec)
    alone_save, delta_save, _ = in_turns(
        lambda: lightning_nvcomp.save(target, alone, codec=codec),
        lambda: lightning_nvcomp.save(target, delta, codec=codec, base=base_path),
    )
    durable = None
    if slow is not None:
        durable = {
            "alone": timed(lambda: lightning_nvcomp.save(target, alone, codec=codec, storage=slow))[0],
            "delta": timed(lambda: lightning_nvcomp.save(target, delta, codec=codec, base=base_path, storage=slow))[0],
        }
    tensors = lambda tree: [t for cls in tree.values() for t in cls.values()]  # noqa: E731
    alone_load, delta_load, exact = in_turns(
        lambda: lightning_nvcomp.load(alone, map_location=device),
        lambda: lightning_nvcomp.load(delta, map_location=device),
        lambda back: same_bytes(tensors(back), tensors(target)),
        rounds=LOAD_ROUNDS,
    )
    raw = sum(t.nbytes for t in tensors(target))
    return {
        "raw_nbytes": raw,
        "alone": raw / alone.stat().st_size,
        "delta": raw / delta.stat().st_size,
        "ideal_alone": plane_bound([list(c.values()) for c in target.values()], rotated=True),
        "ideal_xor": plane_bound([xor(target[c], base[c]) for c in target]),
        "save_s": {"alone": alone_save, "delta": delta_save},
        "load_s": {"alone": alone_load, "delta": delta_load},
        "durable_s": durable,
        "bit_exact": exact,
    }


def measure_dcp(target: dict, base: dict, folder: pathlib.Path, codec: str, device: str) -> dict:
    """The same state through DCP in one process, as :func:`measure`: a writer with deltas saves the base, then the
    state against it (the chain a writer reused for a run's saves keeps); one without saves it alone; the compressed
    reader loads both. Sizes are the checkpoint directories' (data files and ``.metadata``)."""
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp import DeltaOptions
    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

    root = folder / "dcp"
    shutil.rmtree(root, ignore_errors=True)
    save_s = {"alone": math.inf, "delta": math.inf}
    for rnd in range(2):  # the best of two, each delta against a base its writer saved just before
        writer = NvcompFileSystemWriter(root / f"base{rnd}", codec, delta=DeltaOptions())
        dcp.save(base, storage_writer=writer, checkpoint_id=root / f"base{rnd}")
        for kind, save_writer in (("alone", NvcompFileSystemWriter(root / "alone", codec)), ("delta", writer)):
            sync()
            begin = time.perf_counter()
            dcp.save(target, storage_writer=save_writer, checkpoint_id=root / f"{kind}{rnd}")
            sync()
            save_s[kind] = min(save_s[kind], time.perf_counter() - begin)

    def load(kind: str) -> dict:
        tree = {c: {k: torch.zeros_like(t) for k, t in part.items()} for c, part in target.items()}
        dcp.load(tree, storage_reader=NvcompFileSystemReader(root / f"{kind}1"))
        return tree

    tensors = lambda tree: [t for cls in tree.values() for t in cls.values()]  # noqa: E731
    load_alone, load_delta, exact = in_turns(
        lambda: load("alone"), lambda: load("delta"), lambda back: same_bytes(tensors(back), tensors(target))
    )
    stored = {kind: sum(p.stat().st_size for p in (root / f"{kind}1").iterdir()) for kind in save_s}
    raw = sum(t.nbytes for t in tensors(target))
    return {
        "raw_nbytes": raw,
        "alone": raw / stored["alone"],
        "delta": raw / stored["delta"],
        "ideal_alone": plane_bound([list(c.values()) for c in target.values()], rotated=True),
        "ideal_xor": plane_bound([xor(target[c], base[c]) for c in target]),
        "save_s": save_s,
        "load_s": {"alone": load_alone, "delta": load_delta},
        "durable_s": None,
        "bit_exact": exact,
    }


#: A child process that saves or loads once and prints the peak memory it took above where it started: host RSS
#: sampled every millisecond (Linux), and on a GPU torch's peak allocation.
_MEMORY_CHILD = r"""
import sys, threading, time, torch, lightning_nvcomp
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
action, path, base, codec, device, source = sys.argv[1:7]
state = torch.load(source, map_location=device, weights_only=True) if action == "save" else None
cuda = device == "cuda"
if cuda:
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
gpu_before, before, peak, done = torch.cuda.memory_allocated() if cuda else 0, rss(), [0], [False]
def watch():
    while not done[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.001)
watcher = threading.Thread(target=watch); watcher.start()
if action == "save":
    lightning_nvcomp.save(state, path, codec=codec, base=base or None)
else:
    back = lightning_nvcomp.load(path, map_location=device)
if cuda:
    torch.cuda.synchronize()
done[0] = True; watcher.join()
print(max(peak[0], rss()) - before, torch.cuda.max_memory_allocated() - gpu_before if cuda else 0)
"""


#: The C allocator settings memory is measured under: glibc's default (freed buffers of up to 32 MiB may stay in the
#: process, so the peak counts some twice), and with buffers of 1 MiB and more always mapped and unmapped on their
#: own (the peak is then what the process held at once).
ALLOCATORS = {"glibc default": {}, "mmap threshold 1 MiB": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}}


def memory(target: dict, base: dict, folder: pathlib.Path, codec: str, device: str) -> dict:
    """The peak memory (MiB above where each started: host, and GPU where the state is there) of a save and a load,
    alone and as a delta, each in a process of its own, under each of :data:`ALLOCATORS`; and the base's compressed
    size, the bound the issue sets on what a delta may take beyond a standalone save."""
    source, base_path = folder / "target.pt", folder / "base.ckpt"
    torch.save(target, source)
    lightning_nvcomp.save(base, base_path, codec=codec)

    def child(action: str, path: pathlib.Path, with_base: bool, env: dict) -> tuple[float, float]:
        argv = [action, str(path), str(base_path) if with_base else "", codec, device, str(source)]
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, *argv],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **env},
        )
        host, gpu = out.stdout.split()
        return int(host) / 2**20, int(gpu) / 2**20

    found: dict = {"base_stored_mib": base_path.stat().st_size / 2**20}
    for allocator, env in ALLOCATORS.items():
        peaks = found[allocator] = {}
        for kind in ("alone", "delta"):
            path = folder / f"memory-{kind}.ckpt"
            peaks[f"save_{kind}_mib"], peaks[f"save_{kind}_gpu_mib"] = child("save", path, kind == "delta", env)
            peaks[f"load_{kind}_mib"], peaks[f"load_{kind}_gpu_mib"] = child("load", path, False, env)
    return found


def report(row: dict) -> None:
    print(
        f"{row['interval']:4d} {row['state']:18s} {row['class']:11s} alone {row['alone']:.4f} delta {row['delta']:.4f} "
        f"ideal {row['ideal_alone']:.4f}/{row['ideal_xor']:.4f} save {row['save_s']['delta']:.2f}/"
        f"{row['save_s']['alone']:.2f} s load {row['load_s']['delta']:.2f}/{row['load_s']['alone']:.2f} s "
        f"exact {row['bit_exact']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/lightning_nvcomp_bench"))
    parser.add_argument("--device", default="cpu", help="where the run trains and its state lies (cuda: a GPU)")
    parser.add_argument("--codec", default="zstd", help="the codec of every save (ans: gANS, on a GPU)")
    parser.add_argument(
        "--write-mbps", type=float, default=200, help="the storage-bound disk the whole fp32 state is also saved to"
    )
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    states = train_states(args.dim, args.layers, args.steps, pathlib.Path(args.cache_dir), args.device)
    rows = []
    slow_disk = ThrottledStorage(args.write_mbps * 1e6)
    with tempfile.TemporaryDirectory() as scratch:
        for interval in INTERVALS:
            targets, bases = kinds(states[args.steps]), kinds(states[args.steps - interval])
            for kind, target in targets.items():
                for cls in ("whole", *target):
                    part = target if cls == "whole" else {cls: target[cls]}
                    part_base = bases[kind] if cls == "whole" else {cls: bases[kind][cls]}
                    if cls != "whole" and len(target) == 1:
                        continue
                    row = {"interval": interval, "state": kind, "class": cls}
                    slow = slow_disk if (kind, cls) == ("fp32 AdamW", "whole") else None
                    row.update(measure(part, part_base, pathlib.Path(scratch), args.codec, args.device, slow))
                    if (interval, kind, cls) == (50, "fp32 AdamW", "whole"):
                        row["memory"] = memory(part, part_base, pathlib.Path(scratch), args.codec, args.device)
                        print(f"     memory (MiB above the start): {row['memory']}", flush=True)
                    rows.append(row)
                    report(row)
        with warnings.catch_warnings():  # DCP warns that it saves in one process
            warnings.simplefilter("ignore", UserWarning)
            dcp_row = {"interval": 50, "state": "fp32 AdamW, DCP", "class": "whole"}
            base = states[args.steps - 50]
            dcp_row.update(measure_dcp(states[args.steps], base, pathlib.Path(scratch), args.codec, args.device))
        rows.append(dcp_row)
        report(dcp_row)
    write_result(
        args.json,
        "delta",
        setup=f"GPT {args.dim}x{args.layers} (context 128, batch 8) trained {args.steps} AdamW steps on the stdlib "
        f"({args.device}), codec {args.codec}; the last step's state alone and against the states 10, 50 and 200 "
        f"steps earlier; time to durable of the whole fp32 state written to a disk held to {args.write_mbps:g} MB/s; "
        "the fp32 state 50 steps apart also through DCP (NvcompFileSystemWriter with deltas, one process)",
        repetitions=5,
        statistic=f"saves: the median of 5 rounds, loads: of {LOAD_ROUNDS}, the delta's and the standalone one's in "
        "turns, each first in every other round; saves to the slow disk and through DCP: the best of 2",
        rows=rows,
    )
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
