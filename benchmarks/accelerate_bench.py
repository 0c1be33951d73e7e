"""Accelerate benchmark: ``accelerator.save_state`` time and size, plain vs with lightning_nvcomp attached (sync and
async), and ``load_state`` time, on a GPT trained on real text, in one run.

    python benchmarks/accelerate_bench.py --steps 100 --out /tmp/accelerate.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shutil
import sys
import time

import torch
from accelerate import Accelerator

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.integrations.accelerate.attach import attach

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import publish, sync  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402


def dir_gb(path: str) -> float:
    return sum(f.stat().st_size for f in pathlib.Path(path).iterdir()) / 1e9


def timed_save(accelerator: Accelerator, path: str, wait) -> tuple[float, float]:
    """(seconds save_state blocked, seconds until written) for the second of two saves to ``path``."""
    for _ in range(2):
        shutil.rmtree(path, ignore_errors=True)
        sync()
        begin = time.perf_counter()
        accelerator.save_state(path)
        sync()
        blocked = time.perf_counter() - begin
        wait()
        durable = time.perf_counter() - begin
    return blocked, durable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--codec", default="ans" if torch.cuda.is_available() else "zstd")
    parser.add_argument("--dir", default="/tmp/accelerate-bench")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 64)).to(accelerator.device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = train(model, stdlib_corpus(), args.steps, 16, accelerator.device.type, log_every=args.steps)
    model, opt = accelerator.prepare(model, opt)

    rows = []
    plain = os.path.join(args.dir, "plain")
    blocked, durable = timed_save(accelerator, plain, lambda: None)
    rows.append(("save_state (plain)", blocked, durable, dir_gb(plain), plain, None))
    for async_save in (False, True):
        handle = attach(accelerator, codec=args.codec, async_save=async_save, probe_mb=256)
        path = os.path.join(args.dir, f"nvcomp-{'async' if async_save else 'sync'}")
        blocked, durable = timed_save(accelerator, path, handle.wait)
        rows.append(
            (
                f"save_state + attach({args.codec}, async_save={async_save})",
                blocked,
                durable,
                dir_gb(path),
                path,
                handle,
            )
        )
        handle.detach()

    lines = [
        "# Accelerate save_state benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}; torch {torch.__version__}; "
        f"nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {n_params / 1e6:.0f}M params, {args.steps} AdamW steps on the Python standard library's "
        "sources; save_state writes model + optimizer + RNG states to the local disk (second of two saves shown)",
        "",
        "| method | save_state blocked s | written s | size GB | load_state s |",
        "|---|---|---|---|---|",
    ]
    plain_gb = rows[0][3]
    for name, blocked, durable, gb, path, _ in rows:
        handle = attach(accelerator, codec=args.codec) if "attach" in name else None
        sync()
        begin = time.perf_counter()
        accelerator.load_state(path)
        sync()
        load_s = time.perf_counter() - begin
        if handle is not None:
            handle.detach()
        lines.append(f"| {name} | {blocked:.2f} | {durable:.2f} | {gb:.3f} ({plain_gb / gb:.3f}x) | {load_s:.2f} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
