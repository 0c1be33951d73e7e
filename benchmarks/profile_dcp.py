"""Where our DCP path spends its time (a diagnostic, not a benchmark): a trained GPT's model + AdamW state saved
(``--phase save``), saved with ``dcp.async_save`` until it returns (``async``) or loaded back (``load``) through our
writer/reader under cProfile (main thread), each of ``--codec``'s codecs (comma-separated) profiled in the last of ``--repeat`` runs,
next to DCP's own of the same state, the methods in turn.

    python benchmarks/profile_dcp.py --dim 1024 --layers 20 --codec ans --phase load
    python benchmarks/profile_dcp.py --codec ans,auto --phase async --repeat 4   # where two codecs' staging differs
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
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--lines", type=int, default=40, help="profile lines printed per codec")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=args.dim // 64, context=256).to(args.device)
    opt = train(model, stdlib_corpus(16 << 20), args.steps, 16, args.device, log_every=args.steps)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    codecs = args.codec.split(",")
    names = ["plain", *codecs]
    for name in names:  # also the warm-up of each path
        path = os.path.join(args.dir, name)
        shutil.rmtree(path, ignore_errors=True)
        writer = dcp.FileSystemWriter(path) if name == "plain" else NvcompFileSystemWriter(path, codec=name)
        dcp.save(state, storage_writer=writer)

    def fresh() -> dict:
        return {
            "model": {k: torch.zeros_like(v) for k, v in model_sd.items()},
            "optim": {
                "state": {k: {n: torch.zeros_like(v) for n, v in s.items()} for k, s in optim_sd["state"].items()},
                "param_groups": optim_sd["param_groups"],
            },
        }

    def run(name: str, profile: cProfile.Profile | None) -> float:
        ours = name != "plain"
        target = fresh() if args.phase == "load" else state
        path = os.path.join(args.dir, name if args.phase == "load" else f"{name}-{args.phase}")
        if args.phase != "load":
            shutil.rmtree(path, ignore_errors=True)
        writer = NvcompFileSystemWriter(path, codec=name) if ours else dcp.FileSystemWriter(path)
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

    profiles = {}
    for rep in range(args.repeat):
        for name in names if rep % 2 == 0 else names[::-1]:
            profile = profiles[name] = cProfile.Profile() if name != "plain" and rep == args.repeat - 1 else None
            print(f"rep {rep} {name} {args.phase}: {run(name, profile):.3f} s", flush=True)
    for name, profile in profiles.items():
        if profile is not None:
            print(f"\n### {name}, {args.phase}, rep {args.repeat - 1}")
            pstats.Stats(profile).sort_stats("cumulative").print_stats(args.lines)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
