"""Many small items through torch.distributed.checkpoint: a deep, narrow GPT (most tensors are LayerNorm- and
bias-sized) trained on the standard library's sources, model + AdamW state saved and loaded by one process through
DCP's ``FileSystemWriter``/``Reader`` and ours, next to our single-file save of the same state and to DCP's own cost
(a writer that writes no item: planning, resolving and the metadata file). Per-item costs show here: the bytes are
few, the items many. Median of ``--repeat`` runs after a warm-up; files fsynced; each ``dcp.save`` into a fresh
directory, emptied before its timing. Then the target's own figure, as a ratio that a machine's drifting speed does not skew: our ``dcp.save`` against our
single-file save in ``--pairs`` alternating pairs, the median of the pairs' ratios.

    python benchmarks/dcp_items_bench.py --json benchmarks/results/dcp_items/latest-cpu.json            # CPU: zstd
    python benchmarks/dcp_items_bench.py --device cuda --codec ans --json .../latest-gpu.json             # on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

import lightning_nvcomp
from lightning_nvcomp._compat.dcp import StorageInfo
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, same_bytes, sync, write_result  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")


def seconds(fn, setup=None) -> float:
    """Seconds of one ``fn()``, after an untimed ``setup()`` (a fresh checkpoint directory: a save into a new one, as
    a run's next checkpoint is, removes nothing)."""
    if setup is not None:
        setup()
    sync()
    begin = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - begin


def timed(fn, repeat: int, setup=None) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs, after one warm-up run (``setup()`` untimed before each)."""
    seconds(fn, setup)
    return statistics.median(seconds(fn, setup) for _ in range(repeat))


def paired_ratio(first, second, pairs: int, setup=None) -> list[float]:
    """``second()``'s seconds over ``first()``'s in ``pairs`` alternating pairs, after one warm-up pair
    (``setup()`` untimed before each ``second()``)."""
    ratios = []
    for n in range(pairs + 1):
        first_s = seconds(first)
        ratio = seconds(second, setup) / first_s
        if n:
            ratios.append(ratio)
    return ratios


def fresh_dir(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return path


class StoresNothing(dcp.FileSystemWriter):
    """DCP's own cost of a save: ``FileSystemWriter`` whose ``write_data`` resolves every item and writes none of
    it (planning, resolving, the metadata file stay)."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        results = []
        for item in plan.items:
            planner.resolve_data(item)
            results.append(WriteResult(item.index, 0, StorageInfo("none", 0, 0)))
        done: Future = Future()
        done.set_result(results)
        return done


def zeroed(tree: object) -> object:
    """A copy of a state tree with every tensor replaced by zeros of its shape (what a load is checked into)."""
    if isinstance(tree, torch.Tensor):
        return torch.zeros_like(tree)
    if isinstance(tree, dict):
        return {k: zeroed(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [zeroed(v) for v in tree]
    return tree


def many_items_state(dim: int, layers: int, steps: int, device: str) -> dict:
    """Model and AdamW state of a deep, narrow GPT trained ``steps`` steps on the standard library's sources."""
    torch.manual_seed(0)
    model = GPT(dim=dim, layers=layers, heads=max(1, dim // 64), context=64).to(device)
    opt = train(model, stdlib_corpus(4 << 20), steps, 4, device, log_every=steps)
    model_state, optim_state = get_state_dict(model, opt)
    return {"model": model_state, "optim": optim_state}


def issue_state(dim: int, layers: int, steps: int, device: str, small: int = 3000) -> dict:
    """Issue 14's CPU case, from the same trained model and AdamW state: ``small`` LayerNorm-sized tensors (the
    state's 1-D tensors under 4 KiB, LayerNorm and bias vectors with their AdamW moments, cloned in turn until there
    are ``small``) and three large ones (every other tensor's bytes joined by role: the parameters, ``exp_avg``,
    ``exp_avg_sq``)."""
    state = many_items_state(dim, layers, steps, device)

    def small_vector(t: torch.Tensor) -> bool:
        return t.dim() == 1 and t.numel() * t.element_size() < 4 << 10

    vectors = [t for t in local_tensors(state) if small_vector(t)]
    large = {
        "params": [t for t in state["model"].values() if not small_vector(t)],
        **{
            role: [s[role] for s in state["optim"]["state"].values() if not small_vector(s[role])]
            for role in ("exp_avg", "exp_avg_sq")
        },
    }
    return {
        "small": {f"v{i}": vectors[i % len(vectors)].clone() for i in range(small)},
        "large": {role: torch.cat([t.reshape(-1) for t in ts]) for role, ts in large.items()},
    }


def cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--state",
        choices=("gpt", "issue"),
        default="gpt",
        help="gpt: the model and AdamW state as they are; issue: issue 14's shape (3,000 small tensors, 3 large)",
    )
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--codec", default="zstd")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=12, help="alternating pairs for the ratio (0: none)")
    parser.add_argument("--dir", default="/tmp/dcp-items-bench")
    parser.add_argument("--out", help="write the Markdown table here too")
    parser.add_argument("--json", help="write the result here as JSON (benchmarks/report.py)")
    args = parser.parse_args()

    build = issue_state if args.state == "issue" else many_items_state
    state = build(args.dim, args.layers, args.steps, args.device)
    tensors = local_tensors(state)
    raw = sum(t.numel() * t.element_size() for t in tensors)
    small = sum(t.numel() * t.element_size() < 64 << 10 for t in tensors)
    os.makedirs(args.dir, exist_ok=True)
    single = os.path.join(args.dir, "single.ckpt")
    plain_dir, ours_dir = os.path.join(args.dir, "plain"), os.path.join(args.dir, "ours")

    rows = []
    save_s = timed(lambda: lightning_nvcomp.save(state, single, codec=args.codec), args.repeat)
    load_s = timed(lambda: lightning_nvcomp.load(single, map_location=args.device), args.repeat)
    rows.append(("lightning_nvcomp.save / load (one file)", save_s, load_s, os.path.getsize(single)))
    floor_s = timed(
        lambda: dcp.save(state, storage_writer=StoresNothing(plain_dir)), args.repeat, lambda: fresh_dir(plain_dir)
    )
    rows.append(("dcp.save, a writer that writes no item (DCP's own cost)", floor_s, None, None))

    for name, directory, writer, reader in (
        ("dcp FileSystemWriter / Reader", plain_dir, dcp.FileSystemWriter, dcp.FileSystemReader),
        (
            f"dcp NvcompFileSystemWriter({args.codec!r}) / Reader",
            ours_dir,
            lambda p: NvcompFileSystemWriter(p, codec=args.codec),
            NvcompFileSystemReader,
        ),
    ):
        save_s = timed(
            lambda w=writer, d=directory: dcp.save(state, storage_writer=w(d)),
            args.repeat,
            lambda d=directory: fresh_dir(d),
        )
        target = zeroed(state)
        load_s = timed(lambda r=reader, d=directory, t=target: dcp.load(t, storage_reader=r(d)), args.repeat)
        assert same_bytes(local_tensors(target), tensors), f"{name}: the load is not bit-exact"
        stored = sum(p.stat().st_size for p in pathlib.Path(directory).glob("*.distcp"))
        rows.append((name, save_s, load_s, stored))

    ratios = paired_ratio(
        lambda: lightning_nvcomp.save(state, single, codec=args.codec),
        lambda: dcp.save(state, storage_writer=NvcompFileSystemWriter(ours_dir, codec=args.codec)),
        args.pairs,
        lambda: fresh_dir(ours_dir),
    )
    lines = [
        f"<!-- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.node()}, "
        f"{os.cpu_count()} cores; torch {torch.__version__}; device {args.device} -->",
        "# Many small items through DCP",
        "",
        f"GPT dim {args.dim}, {args.layers} layers, trained {args.steps} AdamW steps on the standard library's sources"
        f"{'; its state in issue 14 shape (small vectors, the rest joined into 3 tensors)' if args.state == 'issue' else ''}: "
        f"{len(tensors)} tensors ({small} under 64 KiB), {raw / 1e6:.0f} MB; codec {args.codec}; "
        f"median of {args.repeat} after a warm-up; files fsynced.",
        "",
        "| path | save s | load s | stored MB |",
        "|---|---|---|---|",
        *(f"| {name} | {s:.2f} | {cell(ld, '.2f')} | {cell(n and n / 1e6, '.1f')} |" for name, s, ld, n in rows),
    ]
    if len(ratios) >= 2:
        low, _, high = statistics.quantiles(ratios, n=4)
        lines += [
            "",
            f"Our `dcp.save` over our single-file save, {len(ratios)} alternating pairs in this process: median "
            f"**{statistics.median(ratios):.2f}x** (quartiles {low:.2f}-{high:.2f}x).",
        ]
    publish(lines, args.out)
    write_result(
        args.json,
        "dcp_items",
        setup=f"one process; GPT dim {args.dim}, {args.layers} layers, trained {args.steps} AdamW steps on the standard "
        f"library's sources{' (issue 14 shape: small vectors, the rest joined into 3 tensors)' if args.state == 'issue' else ''}: "
        f"{len(tensors)} tensors ({small} under 64 KiB), {raw / 1e6:.0f} MB on {args.device}; codec {args.codec}; "
        "files fsynced, each dcp.save into a fresh directory",
        repetitions=args.repeat,
        statistic=f"median of {args.repeat} after a warm-up; the ratio: median of {len(ratios)} alternating pairs",
        rows=[{"path": name, "save_s": s, "load_s": ld, "mb": n and n / 1e6} for name, s, ld, n in rows],
        tensors=len(tensors),
        small_tensors=small,
        raw_mb=raw / 1e6,
        dcp_over_single=statistics.median(ratios) if ratios else None,
        dcp_over_single_pairs=ratios,
    )


if __name__ == "__main__":
    main()
