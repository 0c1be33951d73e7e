"""Sharded checkpoints on several GPUs: a GPT (>= 1B parameters at the defaults) trained with FSDP2 and AdamW, its
state saved through torch.distributed.checkpoint by every rank with DCP's plain ``FileSystemWriter`` and with
``NvcompFileSystemWriter`` (gANS, Zstd, auto; sync and async), in one run. Per rank and in total: bytes, ratio, time
the save blocked training, write time, peak extra GPU memory; the storage probe's per-writer figure next to what
the saves achieved; the codec ``auto`` chose and the predictions it chose on. Then the gANS checkpoint is loaded
back bit-exactly on the same ranks, and on one process (a different number of GPUs).

    torchrun --nproc_per_node 2 benchmarks/multigpu_bench.py --out /tmp/multigpu.md
    torchrun --nproc_per_node 2 benchmarks/multigpu_bench.py --dim 64 --layers 2 --steps 3 --dir /tmp/mg   # CPU
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shutil
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.fsdp import fully_shard

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import gpu_available, nvcomp_version
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter, default_policy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, same_bytes, sync  # noqa: E402
from gpt import GPT, stdlib_corpus  # noqa: E402

warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")


def save(state: dict, path: str, codec: str | None, asynchronous: bool) -> dict:
    """One save by every rank; this rank's figures."""
    shutil.rmtree(path, ignore_errors=True) if dist.get_rank() == 0 else None
    dist.barrier()
    writer = dcp.FileSystemWriter(path) if codec is None else NvcompFileSystemWriter(path, codec=codec)
    sync()
    base = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    begin = time.perf_counter()
    if asynchronous:
        future = dcp.async_save(state, storage_writer=writer)
        blocked = time.perf_counter() - begin
        future.result()
    else:
        dcp.save(state, storage_writer=writer)
        blocked = time.perf_counter() - begin
    done = time.perf_counter() - begin
    extra = (torch.cuda.max_memory_allocated() - base) / 1e9 if torch.cuda.is_available() else 0.0
    mine = f"__{dist.get_rank()}_"
    stored = sum(p.stat().st_size for p in pathlib.Path(path).glob("*.distcp") if p.name.startswith(mine))
    raw = sum(t.numel() * t.element_size() for t in local_tensors(state))
    out = {
        "blocked": blocked,
        "done": done,
        "raw": raw,
        "stored": stored,
        "extra_gb": extra,
        "codec": "-",
        "write_s": done,
    }
    if isinstance(writer, NvcompFileSystemWriter):
        out.update(
            codec=writer.stats.codec, write_s=writer.stats.encode_s + writer.stats.write_s, gbps=writer.write_gbps()
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dir", default="/tmp/multigpu-bench")
    parser.add_argument("--codecs", default="ans,zstd,auto", help="our codecs to save with, sync and async")
    parser.add_argument("--no-plain-async", action="store_true", help="skip dcp.async_save with FileSystemWriter")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")

    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 128)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    corpus, gen = stdlib_corpus(), torch.Generator().manual_seed(rank)
    begin = time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, corpus.numel() - model.context - 1, (args.batch,), generator=gen).tolist()
        rows = torch.stack([corpus[s : s + model.context + 1] for s in starts]).long().to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=gpu):
            loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if rank == 0:
        print(
            f"GPT {n_params / 1e9:.2f}B params, {args.steps} steps, loss {loss.item():.3f}, "
            f"{time.perf_counter() - begin:.0f} s",
            flush=True,
        )
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    reference = [t.detach().cpu().clone() for t in local_tensors(state)]
    full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    codecs = [c for c in (["ans", "zstd", "auto"] if gpu_available() else ["zstd", "auto"]) if c in args.codecs]
    methods = [("FileSystemWriter", None, False)] + [(f"Nvcomp {c}", c, False) for c in codecs]
    methods += [("FileSystemWriter, async", None, True)] if not args.no_plain_async else []
    methods += [(f"Nvcomp {c}, async", c, True) for c in codecs]
    rows = []
    for name, codec, asynchronous in methods:
        path = os.path.join(args.dir, name.replace(" ", "_").replace(",", ""))
        mine = save(state, path, codec, asynchronous)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        rows.append((name, path, gathered))
        if rank == 0:
            print(
                name,
                [{k: round(v, 3) if isinstance(v, float) else v for k, v in g.items()} for g in gathered],
                flush=True,
            )

    # auto: what it predicted for each codec (rank 0 decides; calibration and probe are cached by now)
    predictions = (
        {mode: default_policy(mode).decide(local_tensors(state), args.dir)[1] for mode in ("sync", "async")}
        if rank == 0
        else {}
    )

    # Load the plain and the gANS (or zstd) checkpoint back on the same ranks, into zeroed state ...
    plain, checked = rows[0][1], rows[1][1]
    loads = {}
    for path in (plain, checked):
        for t in local_tensors(state):
            t.zero_()
        sync()
        begin = time.perf_counter()
        dcp.load(state, storage_reader=NvcompFileSystemReader(path))
        sync()
        seconds = time.perf_counter() - begin
        same: list = [None] * world
        dist.all_gather_object(same, same_bytes(local_tensors(state), reference))
        loads[path] = [seconds, all(same), None, None]
    dist.barrier()

    if rank == 0:
        # ... and on one process: the whole checkpoint, resharded from `world` ranks to 1.
        want = local_tensors(full[0]) + local_tensors(full[1]["state"])
        for path in (plain, checked):
            begin = time.perf_counter()
            whole: dict = {}
            _load_state_dict(
                whole, storage_reader=NvcompFileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True
            )
            loads[path][2] = time.perf_counter() - begin
            loads[path][3] = same_bytes(local_tensors(whole["model"]) + local_tensors(whole["optim"]["state"]), want)
        publish(report(args, n_params, world, rows, predictions, loads), args.out)
    dist.barrier()
    dist.destroy_process_group()


def report(args, n_params, world, rows, predictions, loads) -> list[str]:
    gpu = torch.cuda.is_available()
    lines = [
        "# Sharded checkpoints on several GPUs (FSDP2 + DCP)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {world} x "
        f"{torch.cuda.get_device_name() if gpu else 'CPU process'}; torch {torch.__version__}; nvCOMP "
        f"{nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {n_params / 1e9:.2f}B params, FSDP2 (fully_shard per block), {args.steps} AdamW steps "
        f"(bf16 autocast) on the Python standard library's sources; state = model + AdamW from get_state_dict",
        "- every method: one save by all ranks to the local disk, files fsynced; blocked = until dcp.save or "
        "dcp.async_save returned; done = until written",
        "",
        "| method | codec | rank | raw GB | stored GB | ratio | blocked s | done s | write s | extra GPU GB | "
        "probe GB/s per writer | achieved GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _, gathered in rows:
        raw_total = sum(g["raw"] for g in gathered)
        for r, g in enumerate(gathered):
            raw = g["raw"]
            ratio = f"{raw / g['stored']:.3f}"
            probe = f"{g['gbps']:.2f}" if "gbps" in g else "-"
            lines.append(
                f"| {name} | {g['codec']} | {r} | {raw / 1e9:.2f} | {g['stored'] / 1e9:.2f} | "
                f"{ratio} | {g['blocked']:.2f} | {g['done']:.2f} | {g['write_s']:.2f} | {g['extra_gb']:.2f} | "
                f"{probe} | {g['stored'] / g['write_s'] / 1e9:.2f} |"
            )
        stored = sum(g["stored"] for g in gathered)
        lines.append(
            f"| {name} | | all | {raw_total / 1e9:.2f} | {stored / 1e9:.2f} | {raw_total / stored:.3f} | "
            f"{max(g['blocked'] for g in gathered):.2f} | {max(g['done'] for g in gathered):.2f} | | "
            f"{max(g['extra_gb'] for g in gathered):.2f} | | |"
        )
    for mode, predicted in predictions.items():
        lines += [
            "",
            f"auto's predictions for {'dcp.save' if mode == 'sync' else 'dcp.async_save'} on rank 0 (per rank; "
            "it picks the least predicted lost time; a tie, within 5% or 0.1 s where that is at most 1% of the "
            "interval, goes to the smaller file, then the sooner durable):",
            "",
            "| codec | ratio | encode s | write s | blocked s |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.codec} | {p.ratio:.3f} | {p.encode_s:.2f} | {p.write_s:.2f} | {p.blocked_s:.2f} |" for p in predicted
        ]
    lines += [
        "",
        "Loads: into the zeroed state on the same ranks, then the whole checkpoint on one process (resharded "
        f"{world} -> 1: all of model and AdamW state, checked against the full state dict).",
        "",
        f"| checkpoint | load on {world} ranks s | bit-exact | load on 1 process s | bit-exact |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {pathlib.Path(path).name} | {a:.2f} | {'yes' if a_ok else 'NO'} | {b:.2f} | {'yes' if b_ok else 'NO'} |"
        for path, (a, a_ok, b, b_ok) in loads.items()
    ]
    return lines


if __name__ == "__main__":
    main()
