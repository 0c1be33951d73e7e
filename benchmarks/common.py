"""What every benchmark script here needs: a device-wide sync, a trained GPT, a walk over a state's tensors, a
bit-exact comparison, the report, the result's JSON (with the machine and the versions it ran on) and the garbage
collections a block ran. Its importers put ``examples/`` on ``sys.path`` first (for ``gpt``)."""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shlex
import sys
import time

import torch
from torch.distributed.tensor import DTensor

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.format.contents import leaves

from gpt import GPT, stdlib_corpus, train


def sync() -> None:
    """Wait for all GPU work (timings must include it)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def trained_gpt(
    dim: int, layers: int, steps: int, batch: int, device: str, cache: str | None = None
) -> tuple[GPT, torch.optim.Optimizer]:
    """A byte-level GPT on ``device`` trained ``steps`` AdamW steps of ``batch`` rows on the standard library's
    sources (seed 0), and its optimizer.

    Args:
        cache: a folder that keeps the trained state: a later call with the same arguments loads it (bit-exact)
            instead of training again, so that runs compared with each other start from one state, at once.
            None: always train.
    """
    torch.manual_seed(0)
    model = GPT(dim=dim, layers=layers, heads=max(1, dim // 64)).to(device)
    kept = os.path.join(cache, f"gpt-{dim}x{layers}-{steps}x{batch}-{torch.device(device).type}.pt") if cache else None
    if kept and os.path.exists(kept):
        state = torch.load(kept, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt = torch.optim.AdamW(model.parameters())
        opt.load_state_dict(state["optimizer"])  # the trained run's hyperparameters and moments
        return model, opt
    opt = train(model, stdlib_corpus(), steps, batch, device)
    if kept:
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, kept + ".part")
        os.replace(kept + ".part", kept)
    return model, opt


def local_tensors(tree: object) -> list[torch.Tensor]:
    """The tensors of a state (a DTensor's local shard), in a fixed order: sorted keys, every path."""
    found = leaves(tree, lambda item: isinstance(item, torch.Tensor), sort_keys=True, once=False)
    return [t.to_local() if isinstance(t, DTensor) else t for _, t in found]


def same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Whether two lists of tensors are equal bit for bit (shapes, dtypes and bytes)."""
    return len(a) == len(b) and all(
        x.shape == y.shape
        and x.dtype == y.dtype
        and torch.equal(x.detach().cpu().reshape(-1).view(torch.uint8), y.detach().cpu().reshape(-1).view(torch.uint8))
        for x, y in zip(a, b)
    )


def publish(lines: list[str], out: str | None) -> None:
    """Print the report, and write it to ``out`` when given."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        pathlib.Path(out).write_text(report)


#: The version of the result JSON's layout (``write_result``), which ``benchmarks/report.py`` reads.
SCHEMA = 1
#: The distributions whose versions a result records (None where one is not installed).
DISTRIBUTIONS = ("lightning", "accelerate", "zstandard", "fsspec", "s3fs", "moto")
REPO = pathlib.Path(__file__).resolve().parent.parent


def environment(distributions: tuple[str, ...] = DISTRIBUTIONS) -> dict:
    """The machine and the software a benchmark runs on: the ``hardware`` and ``versions`` of its result (those of
    ``distributions`` among them)."""
    gpu = torch.cuda.is_available()
    info = {}
    for name in ("cpuinfo", "meminfo"):
        try:
            info[name] = pathlib.Path("/proc", name).read_text()
        except OSError:
            info[name] = ""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in info["cpuinfo"].splitlines() if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    mem_kb = next((int(line.split()[1]) for line in info["meminfo"].splitlines() if line.startswith("MemTotal:")), 0)
    hardware = {
        "accelerator": "GPU" if gpu else "CPU",
        "device": torch.cuda.get_device_name() if gpu else cpu,
        "gpus": torch.cuda.device_count() if gpu else 0,
        "gpu_memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1) if gpu else None,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gb": round(mem_kb / 1e6, 1),
        "load_1min": round(os.getloadavg()[0], 2),  # other work on the machine as the run began
    }
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvcomp": nvcomp_version(),
        "lightning_nvcomp": lightning_nvcomp.__version__,
    }
    for name in distributions:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"hardware": hardware, "versions": versions}


#: Options naming where a benchmark writes (its result, its report, its scratch folders): left out of its command.
WHERE_OPTIONS = ("--json", "--out", "--dir", "--log", "--state-cache")


def command_line() -> str:
    """The command that ran this benchmark, as run from the repository's root, without the options of ``WHERE_OPTIONS``;
    under torchrun, torchrun's."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg in WHERE_OPTIONS:
            skip = not skip
            continue
        if not arg.startswith(tuple(f"{option}=" for option in WHERE_OPTIONS)):
            args.append(arg)
    script = pathlib.Path(sys.argv[0]).resolve()
    shown = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else str(script)
    workers = os.environ.get("LOCAL_WORLD_SIZE")
    launcher = ["torchrun", f"--nproc_per_node={workers}"] if workers else ["python"]
    return shlex.join([*launcher, shown, *args])


def _finite(value: object) -> object:
    """``value`` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_result(
    path: str | None,
    benchmark: str,
    *,
    setup: str,
    repetitions: int,
    statistic: str,
    rows: list[dict],
    distributions: tuple[str, ...] = DISTRIBUTIONS,
    **extra: object,
) -> None:
    """Write a benchmark's result as JSON to ``path`` (nothing when None), the layout ``benchmarks/report.py`` reads.

    Args:
        benchmark: its folder under ``benchmarks/results/``.
        setup: the workload in a sentence (the model, the state, the storage).
        repetitions: how many times each figure was measured.
        statistic: how the figures shown come from those repetitions (e.g. "median of 3 after a warm-up").
        rows: the table's rows, raw figures (seconds, MB, ratios), one dict each.
        distributions: the distributions whose versions it records (``DISTRIBUTIONS`` and those it measures).
        extra: the benchmark's other figures.
    """
    if not path:
        return
    result = {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "command": command_line(),
        "repetitions": repetitions,
        "statistic": statistic,
        **environment(distributions),
        "setup": setup,
        "rows": rows,
        **extra,
    }
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    part.write_text(json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")
    part.replace(target)  # a run killed meanwhile leaves the previous result whole


class Collections:
    """Python's garbage collections while the block runs: how many were full (generation 2), and the seconds all of
    them took (``with Collections() as gc_seen: ...; gc_seen.full, gc_seen.seconds``)."""

    def __enter__(self) -> Collections:
        self.full, self.seconds, self._began = 0, 0.0, 0.0
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)

    def _seen(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            self.full += info["generation"] == 2
        else:
            self.seconds += time.perf_counter() - self._began
