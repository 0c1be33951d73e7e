"""Where our DCP path spends its time (a diagnostic, not a benchmark): a trained GPT's model + AdamW state saved
(``--phase save``), saved with ``dcp.async_save`` until it returns (``async``) or loaded back (``load``) through our
writer/reader under cProfile (main thread), the second of two runs, next to DCP's own of the same state.

    python benchmarks/profile_dcp.py --dim 1024 --layers 20 --codec ans --phase load
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pathlib
import pstats
import shutil
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, sync  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--codec", default="ans")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dir", default="/tmp/dcp-profile")
    parser.add_argument("--phase", choices=("save", "async", "load"), default="load")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=args.dim // 64, context=256).to(args.device)
    opt = train(model, stdlib_corpus(16 << 20), args.steps, 16, args.device, log_every=args.steps)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    plain, ours = os.path.join(args.dir, "plain"), os.path.join(args.dir, "ours")
    for p in (plain, ours):
        shutil.rmtree(p, ignore_errors=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(plain))  # also the warm-up of each path
    dcp.save(state, storage_writer=NvcompFileSystemWriter(ours, codec=args.codec))

    def fresh() -> dict:
        return {
            "model": {k: torch.zeros_like(v) for k, v in model_sd.items()},
            "optim": {
                "state": {k: {n: torch.zeros_like(v) for n, v in s.items()} for k, s in optim_sd["state"].items()},
                "param_groups": optim_sd["param_groups"],
            },
        }

    def run(name: str, profile: cProfile.Profile | None) -> float:
        ours = name == "ours"
        target = fresh() if args.phase == "load" else state
        path = os.path.join(args.dir, name if args.phase == "load" else f"{name}-{args.phase}")
        if args.phase != "load":
            shutil.rmtree(path, ignore_errors=True)
        writer = NvcompFileSystemWriter(path, codec=args.codec) if ours else dcp.FileSystemWriter(path)
        reader = NvcompFileSystemReader(path) if ours else dcp.FileSystemReader(path)
        sync()
        begin = time.perf_counter()
        if profile:
            profile.enable()
        if args.phase == "load":
            dcp.load(target, storage_reader=reader)
        elif args.phase == "save":
            dcp.save(target, storage_writer=writer)
        else:
            future = dcp.async_save(target, storage_writer=writer)
        sync()
        if profile:
            profile.disable()
        took = time.perf_counter() - begin
        if args.phase == "async":
            future.result()
        if args.phase == "load":
            exact = all(
                torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
                for a, b in zip(local_tensors(state), local_tensors(target))
            )
            assert exact, f"{name}: the load is not bit-exact"
        return took

    for rep in range(2):
        for name in ("plain", "ours"):
            profile = cProfile.Profile() if name == "ours" and rep == 1 else None
            print(f"rep {rep} {name} {args.phase}: {run(name, profile):.3f} s", flush=True)
            if profile:
                stats = pstats.Stats(profile)
                stats.sort_stats("tottime").print_stats(25)
                stats.sort_stats("cumulative").print_stats(40)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
