"""torch.distributed.checkpoint benchmark: one rank saves a trained GPT's model + AdamW state through DCP with
DCP's plain ``FileSystemWriter``, DCP's own ``stream.zstd`` extension, and ``NvcompFileSystemWriter`` (zstd, ans
on a GPU, auto), in the same run, on the same state. Measures the ``dcp.save`` time (files fsynced), the time
``dcp.async_save`` blocks the caller (staging) and until its future is done, the size of the ``.distcp`` files, and the
``dcp.load`` time back onto the model's device, and DCP's own cost of a save (a writer that writes no item). Methods
run in turn, in reverse order every other repetition (no method always follows the same one); a summary gives each
method's median. Runs on a GPU (state on the GPU, nvCOMP) or on the CPU.

    python benchmarks/dcp_bench.py --steps 300 --json benchmarks/results/dcp/latest-gpu.json
    python benchmarks/dcp_bench.py --dim 64 --layers 2 --steps 20 --out /tmp/dcp.md   # CPU smoke test
    python benchmarks/dcp_bench.py --methods "FileSystemWriter,Nvcomp ans,Nvcomp auto" --repeat 3   # a subset
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import pathlib
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import gpu_available, nvcomp_version
from lightning_nvcomp.codec.pinned import pool
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from dcp_items_bench import StoresNothing  # noqa: E402

from common import Collections, local_tensors, publish, sync, write_result  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")


def distcp_nbytes(path: str) -> int:
    return sum(p.stat().st_size for p in pathlib.Path(path).glob("*.distcp"))


def writers(device: str) -> dict[str, callable]:
    """Method name -> factory of a storage writer for a checkpoint directory."""
    out = {"FileSystemWriter": lambda p: dcp.FileSystemWriter(p)}
    from torch.distributed.checkpoint._extension import ZStandard

    if ZStandard.is_available():
        out["FileSystemWriter + ZStandard ext"] = lambda p: dcp.FileSystemWriter(p, _extensions=[ZStandard()])
    out["Nvcomp zstd"] = lambda p: NvcompFileSystemWriter(p, codec="zstd")
    if device == "cuda" and gpu_available():
        out["Nvcomp ans"] = lambda p: NvcompFileSystemWriter(p, codec="ans")
    out["Nvcomp auto"] = lambda p: NvcompFileSystemWriter(p, codec="auto")
    return out


def peak_extra_gb(device: str, begin: bool) -> float:
    """GPU memory allocated above what was allocated at the last ``begin`` call, at its peak since then (GB)."""
    if device != "cuda":
        return 0.0
    if begin:
        torch.cuda.reset_peak_memory_stats()
        peak_extra_gb.base = torch.cuda.memory_allocated()  # type: ignore[attr-defined]
        return 0.0
    return (torch.cuda.max_memory_allocated() - peak_extra_gb.base) / 1e9  # type: ignore[attr-defined]


def measure_single(state: dict, root: str, device: str, rep: int, codec: str) -> dict:
    """Our single-file path on the same state: ``lightning_nvcomp.save`` (fsynced) and ``load`` onto the device."""
    path = os.path.join(root, "single.ckpt")
    if rep == 0:
        lightning_nvcomp.save(state, path, codec=codec)
    sync()
    peak_extra_gb(device, True)
    begin = time.perf_counter()
    stats = lightning_nvcomp.save(state, path, codec=codec)
    sync()
    save_s = time.perf_counter() - begin
    save_gb = peak_extra_gb(device, False)
    peak_extra_gb(device, True)
    begin = time.perf_counter()
    loaded = lightning_nvcomp.load(path, map_location=device)
    sync()
    load_s = time.perf_counter() - begin
    load_gb = peak_extra_gb(device, False)
    exact = all(  # map_location moves the CPU tensors (AdamW's steps) to the device too
        torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().to(a.device).reshape(-1).view(torch.uint8))
        for a, b in zip(local_tensors(state), local_tensors(loaded))
    )
    return {
        "method": "single file: lightning_nvcomp.save / load",
        "rep": rep + 1,
        "codec": stats.codec,
        "save_s": save_s,
        "blocked_s": float("nan"),
        "stage_s": float("nan"),
        "gc": "-",
        "pool_state": "-",
        "async_s": float("nan"),
        "bytes": os.path.getsize(path),
        "load_s": load_s,
        "extra_gb": save_gb,
        "load_gb": load_gb,
        "pinned_gb": pinned_pool_gb(device),
        "pool_gb": pool().nbytes / 1e9,
        "exact": exact,
    }


def measure(name: str, make, state: dict, root: str, fresh: callable, device: str, rep: int) -> dict:
    path = os.path.join(root, name.replace(" ", "_").replace("+", "p"))
    shutil.rmtree(path, ignore_errors=True)
    if rep == 0:  # warm-up save (codec setup, pinned memory, the auto policy's storage probe), then the measured ones
        dcp.save(state, storage_writer=make(path))
    sync()
    peak_extra_gb(device, True)
    begin = time.perf_counter()
    writer = make(path)
    dcp.save(state, storage_writer=writer)
    sync()
    save_s = time.perf_counter() - begin
    save_gb = peak_extra_gb(device, False)
    size = distcp_nbytes(path)
    codec = writer.stats.codec if isinstance(writer, NvcompFileSystemWriter) else "-"

    apath = path + "_async"
    shutil.rmtree(apath, ignore_errors=True)
    sync()
    peak_extra_gb(device, True)
    begin = time.perf_counter()
    async_writer = make(apath)
    in_use, overflow = pool().in_use_nbytes, pool().overflow_nbytes  # held from earlier saves; pageable so far
    with Collections() as collected:
        future = dcp.async_save(state, storage_writer=async_writer)
        sync()
    blocked = time.perf_counter() - begin
    future.result()
    async_done = time.perf_counter() - begin
    stage_s = async_writer.stats.stage_s if isinstance(async_writer, NvcompFileSystemWriter) else float("nan")
    if isinstance(async_writer, NvcompFileSystemWriter) and async_writer.stats.codec != codec:
        codec = f"{codec} / {async_writer.stats.codec}"  # auto decides per mode: the async save's may differ
    async_gb = peak_extra_gb(device, False)
    pinned_gb = pinned_pool_gb(device)
    pool_gb = pool().nbytes / 1e9

    target = fresh()
    reader = NvcompFileSystemReader(path) if isinstance(writer, NvcompFileSystemWriter) else dcp.FileSystemReader(path)
    sync()
    peak_extra_gb(device, True)
    begin = time.perf_counter()
    dcp.load(target, storage_reader=reader)
    sync()
    load_s = time.perf_counter() - begin
    load_gb = peak_extra_gb(device, False)
    exact = all(
        torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))
        for a, b in zip(local_tensors(state), local_tensors(target))
    )
    del target
    return {
        "method": name,
        "rep": rep + 1,
        "codec": codec,
        "save_s": save_s,
        "blocked_s": blocked,
        "stage_s": stage_s,
        "gc": f"{collected.full} / {collected.seconds:.3f}",
        "pool_state": f"{in_use / 1e9:.2f} / {(pool().overflow_nbytes - overflow) / 1e9:.2f}",
        "async_s": async_done,
        "bytes": size,
        "load_s": load_s,
        "extra_gb": max(save_gb, async_gb),
        "load_gb": load_gb,
        "pinned_gb": pinned_gb,
        "pool_gb": pool_gb,
        "exact": exact,
    }


def measure_floor(state: dict, root: str, rep: int) -> dict:
    """DCP's own cost of a ``dcp.save`` of this state (planning, resolving every item, ``.metadata``): a writer that
    writes no item."""
    path = os.path.join(root, "stores_nothing")
    shutil.rmtree(path, ignore_errors=True)
    sync()
    begin = time.perf_counter()
    dcp.save(state, storage_writer=StoresNothing(path))
    save_s = time.perf_counter() - begin
    nan = float("nan")
    return {
        "method": FLOOR,
        "rep": rep + 1,
        "codec": "-",
        "save_s": save_s,
        **dict.fromkeys(("blocked_s", "stage_s", "async_s", "load_s", "extra_gb", "load_gb", "pinned_gb"), nan),
        "pool_gb": nan,
        "gc": "-",
        "pool_state": "-",
        "bytes": 0,
        "exact": True,
    }


#: The row of DCP's own cost.
FLOOR = "DCP's own cost (a writer that writes no item)"
SINGLE = "single file: lightning_nvcomp.save / load"


def summary(rows: list[dict]) -> list[str]:
    """Each method's median over the repetitions, and its save against the single file and ``FileSystemWriter``."""
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)

    def median(method: str, key: str) -> float:
        return statistics.median(r[key] for r in by_method[method]) if method in by_method else float("nan")

    single, plain = median(SINGLE, "save_s"), median("FileSystemWriter", "save_s")
    lines = [
        "",
        f"Medians over the {max(r['rep'] for r in rows)} repetitions:",
        "",
        "| method | codec | dcp.save s | vs single file | vs FileSystemWriter | async blocked s | of it staging s | "
        "dcp.load s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, found in by_method.items():
        save = median(method, "save_s")
        lines.append(
            f"| {method} | {found[-1]['codec']} | {save:.3f} | {save / single:.2f}x | {save / plain:.2f}x | "
            f"{median(method, 'blocked_s'):.3f} | {median(method, 'stage_s'):.3f} | {median(method, 'load_s'):.3f} |"
        )
    return lines


def pinned_pool_gb(device: str) -> float:
    """Pinned host memory torch's caching host allocator holds (in use + cached for reuse), GB."""
    if device != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return float("nan")
    return torch.cuda.host_memory_stats().get("allocated_bytes.current", float("nan")) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=0, help="default: dim // 64 (at least 1)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dir", default="/tmp/dcp-bench")
    parser.add_argument("--repeat", type=int, default=2, help="measured repetitions per method")
    parser.add_argument("--methods", help="comma-separated method names to run (default: all)")
    parser.add_argument("--out", help="write the Markdown table here")
    parser.add_argument("--json", help="write the result here as JSON (benchmarks/report.py)")
    args = parser.parse_args()

    torch.manual_seed(0)
    heads = args.heads or max(1, args.dim // 64)
    model = GPT(dim=args.dim, layers=args.layers, heads=heads, context=args.context).to(args.device)
    corpus = stdlib_corpus(16 << 20)
    opt = train(model, corpus, args.steps, args.batch, args.device, log_every=max(1, args.steps // 4))
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    raw = sum(t.numel() * t.element_size() for t in local_tensors(state))

    def fresh() -> dict:
        clone = lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t
        return {
            "model": {k: clone(v) for k, v in model_sd.items()},
            "optim": {
                "state": {k: {n: clone(v) for n, v in s.items()} for k, s in optim_sd["state"].items()},
                "param_groups": optim_sd["param_groups"],
            },
        }

    os.makedirs(args.dir, exist_ok=True)
    single_codec = "ans" if args.device == "cuda" and gpu_available() else "zstd"
    methods = {
        **{name: functools.partial(measure, name, make) for name, make in writers(args.device).items()},
        SINGLE: lambda state, root, fresh, device, rep: measure_single(state, root, device, rep, single_codec),
        FLOOR: lambda state, root, fresh, device, rep: measure_floor(state, root, rep),
    }
    if args.methods:
        wanted = [m.strip() for m in args.methods.split(",")]
        unknown = [m for m in wanted if m not in methods]
        if unknown:
            parser.error(f"unknown methods {unknown}; known: {list(methods)}")
        methods = {m: methods[m] for m in wanted}
    rows = []
    for rep in range(args.repeat):
        order = list(methods.items()) if rep % 2 == 0 else list(reversed(methods.items()))
        rows.extend(run(state, args.dir, fresh, args.device, rep) for _, run in order)
    shutil.rmtree(args.dir, ignore_errors=True)
    rows.sort(key=lambda r: (r["rep"], list(methods).index(r["method"])))

    params = sum(p.numel() for p in model.parameters())
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    base = next((r["bytes"] for r in rows if r["method"] == "FileSystemWriter"), rows[0]["bytes"]) or 1
    lines = [
        "# DCP (torch.distributed.checkpoint) benchmark, one rank",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {device}; torch "
        f"{torch.__version__}; nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {params / 1e6:.1f}M params, {args.steps} AdamW steps on the Python standard library's "
        f"sources; state = model + AdamW (get_state_dict), {raw / 1e6:.1f} MB on {args.device}",
        "- each method: one warm-up save, then per repetition (methods in turn, in reverse order every other repetition): "
        "dcp.save (files fsynced), "
        "dcp.async_save (blocked = until it returns, of it staging = our writer's stage(), the full garbage "
        "collections and the seconds of all collections while it blocked, the pinned pool's bytes still held by "
        "earlier saves as it began and the bytes it had to give as pageable memory meanwhile, done = until its future "
        "is), dcp.load onto the same device; "
        "extra GPU GB = peak GPU memory allocated above the state's during the save and the async save (load: "
        "during the load, above the state and its empty target); pinned GB = pinned host memory torch's caching "
        "host allocator holds after the method's async save (in use + cached: reused by the next save), of which "
        "our pool = the slabs of lightning_nvcomp's pinned pool (bounded, reused by every save of ours)",
        "",
        "| method | rep | codec (sync / async where they differ) | dcp.save s | async blocked s | of it staging s | full GCs / GC s in it | "
        "pool GB in use before / pageable in it | async done s | .distcp MB | "
        "vs FileSystemWriter | dcp.load s | extra GPU GB save / load | pinned GB | of which our pool | bit-exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['rep']} | {r['codec']} | {r['save_s']:.3f} | {r['blocked_s']:.3f} | "
            f"{r['stage_s']:.3f} | {r['gc']} | {r['pool_state']} | {r['async_s']:.3f} | {r['bytes'] / 1e6:.2f} | {r['bytes'] / base:.3f} | {r['load_s']:.3f} | "
            f"{r['extra_gb']:.2f} / {r['load_gb']:.2f} | {r['pinned_gb']:.2f} | {r['pool_gb']:.2f} | {'yes' if r['exact'] else 'NO'} |"
        )
    publish(lines + summary(rows), args.out)
    write_result(
        args.json,
        "dcp",
        setup=f"one rank; byte-level GPT, {params / 1e6:.1f}M params, {args.steps} AdamW steps on the Python standard "
        f"library's sources; state = model + AdamW (get_state_dict), {raw / 1e6:.1f} MB on {args.device}; files fsynced",
        repetitions=args.repeat,
        statistic=f"median of {args.repeat} after a warm-up save, the methods in turn (in reverse order every other "
        "repetition)",
        rows=medians(rows),
        raw_mb=raw / 1e6,
    )


def medians(rows: list[dict]) -> list[dict]:
    """Each method's figures, the median over its repetitions (its sizes and extra memory: the largest; our pinned
    pool: as the last repetition's async save left it)."""
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    keys = ("save_s", "blocked_s", "stage_s", "async_s", "load_s")
    return [
        {
            "method": method,
            "codec": found[-1]["codec"],
            **{k: statistics.median(r[k] for r in found) for k in keys},
            "mb": max(r["bytes"] for r in found) / 1e6,
            "extra_gpu_gb": max(r["extra_gb"] for r in found),
            "load_extra_gpu_gb": max(r["load_gb"] for r in found),
            "pool_gb": found[-1]["pool_gb"],  # after the last repetition's async save
            "exact": all(r["exact"] for r in found),
        }
        for method, found in by_method.items()
    ]


if __name__ == "__main__":
    main()
