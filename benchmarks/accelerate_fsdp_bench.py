"""Accelerate with FSDP sharded state dicts: ``accelerator.save_state`` / ``load_state`` of a GPT trained on real text
(FSDP2, ``SHARDED_STATE_DICT``, AdamW, bf16 mixed precision), with Accelerate's own DCP path and with lightning_nvcomp
attached (gANS, auto), in one run on every rank. Per method and repetition: the seconds ``save_state`` blocked
training (files fsynced by both), the bytes it wrote, extra GPU memory; then each checkpoint loaded back into the
zeroed model and optimizer through ``load_state``, its time and whether every rank's shards came back bit for bit.
Accelerate runs FSDP only on an accelerator: this needs a GPU per process.

    torchrun --nproc_per_node 1 benchmarks/accelerate_fsdp_bench.py --dim 1024 --layers 20 --repeat 3 --out a.md
    torchrun --nproc_per_node 2 benchmarks/accelerate_fsdp_bench.py --json benchmarks/results/accelerate_fsdp/latest-gpu.json
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
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.integrations.accelerate.attach import attach

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, publish, same_bytes, sync, write_result  # noqa: E402
from gpt import GPT, Block, stdlib_corpus  # noqa: E402


def shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's parameter shards and optimizer state, in a fixed order."""
    params = list(model.parameters())
    states = [optimizer.state[p][k] for p in params if p in optimizer.state for k in sorted(optimizer.state[p])]
    return [p.detach() for p in local_tensors(params)] + local_tensors(states)


def train(accelerator: Accelerator, model: torch.nn.Module, optimizer, steps: int, batch: int, context: int) -> None:
    corpus = stdlib_corpus()
    gen = torch.Generator().manual_seed(accelerator.process_index)
    for step in range(steps):
        starts = torch.randint(0, corpus.numel() - context - 1, (batch,), generator=gen).tolist()
        rows = torch.stack([corpus[s : s + context + 1] for s in starts]).long().to(accelerator.device)
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if accelerator.is_main_process and (step % 10 == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)


def tree_nbytes(path: str) -> int:
    return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--codecs", default="ans,auto", help="our codecs (besides Accelerate's own save)")
    parser.add_argument("--repeat", type=int, default=3, help="saves and loads per method (the first: rep 0)")
    parser.add_argument("--dir", default="/tmp/accelerate-fsdp-bench")
    parser.add_argument("--label", default="the local disk", help="where --dir is, for the report")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()  # else a smoke test: Accelerate then ignores the FSDP plugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        state_dict_type="SHARDED_STATE_DICT",
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[Block.__name__],
    )
    accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision="bf16")
    torch.manual_seed(0)
    gpt = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 64), context=args.context)
    n_params = sum(p.numel() for p in gpt.parameters())
    model, optimizer = accelerator.prepare(gpt, torch.optim.AdamW(gpt.parameters(), lr=3e-4, weight_decay=0.1))
    train(accelerator, model, optimizer, args.steps, args.batch, args.context)
    reference = [t.cpu().clone() for t in shards(model, optimizer)]
    raw = sum(t.numel() * t.element_size() for t in reference)

    methods: list[tuple[str, str | None]] = [("Accelerate", None)] + [
        (f"ours {c}", c) for c in args.codecs.split(",") if c
    ]
    paths = {name: os.path.join(args.dir, name.replace(" ", "_")) for name, _ in methods}
    saves: dict[str, list[tuple[float, int, float, str]]] = {name: [] for name, _ in methods}
    for rep in range(args.repeat):  # reversed every other repetition: no method always follows the same one
        for name, codec in methods if rep % 2 == 0 else methods[::-1]:
            attachment = attach(accelerator, codec=codec) if codec else None
            if accelerator.is_main_process:
                shutil.rmtree(paths[name], ignore_errors=True)
            accelerator.wait_for_everyone()
            sync()
            base = torch.cuda.memory_allocated() if gpu else 0
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            begin = time.perf_counter()
            accelerator.save_state(paths[name])
            sync()
            accelerator.wait_for_everyone()
            blocked = time.perf_counter() - begin
            extra = (torch.cuda.max_memory_allocated() - base) / 1e9 if gpu else 0.0
            chose = "-"
            if attachment is not None:
                chose = ",".join(sorted({r.codec for p in attachment.last_sharded.values() for r in p.stats.ranks}))
                attachment.detach()
            saves[name].append((blocked, tree_nbytes(paths[name]), extra, chose))
            if accelerator.is_main_process:
                print(f"{name} rep {rep}: {blocked:.2f} s", flush=True)

    loads: dict[str, list[tuple[float, bool]]] = {name: [] for name, _ in methods}
    for rep in range(args.repeat):
        for name, codec in methods if rep % 2 == 0 else methods[::-1]:
            attachment = attach(accelerator, codec=codec) if codec else None
            for t in shards(model, optimizer):
                t.zero_()
            sync()
            accelerator.wait_for_everyone()
            begin = time.perf_counter()
            accelerator.load_state(paths[name])
            sync()
            accelerator.wait_for_everyone()
            seconds = time.perf_counter() - begin
            if attachment is not None:
                attachment.detach()
            same = [same_bytes(shards(model, optimizer), reference)] * accelerator.num_processes
            if dist.is_initialized():
                dist.all_gather_object(same, same[0])
            loads[name].append((seconds, all(same)))

    if not accelerator.is_main_process:
        return
    own_blocked = statistics.median(b for b, *_ in saves["Accelerate"][1:] or saves["Accelerate"])
    own_bytes = saves["Accelerate"][-1][1]
    lines = [
        f"# Accelerate save_state / load_state with FSDP2 (SHARDED_STATE_DICT) on {accelerator.num_processes} "
        f"GPU{'s' if accelerator.num_processes > 1 else ''}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
        f"{torch.cuda.get_device_name() if gpu else 'CPU'}; {accelerator.distributed_type}; torch {torch.__version__}; nvCOMP {nvcomp_version()}; "
        f"lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {n_params / 1e6:.1f}M params, {args.steps} AdamW steps (bf16 mixed) on the Python standard "
        f"library's sources; rank 0's model shards + optimizer state {raw / 1e9:.2f} GB; saved to {args.label}",
        "- blocked = save_state until every rank returned (Accelerate's FileSystemWriter and ours both fsync); rep 0 "
        "is each method's first save of the run; the methods run in turn, in reverse order every other repetition; "
        "each load is load_state into the zeroed model and optimizer",
        "",
        "| method | codec | save_state s (rep 0, 1, ...) | median of reps 1+ | vs Accelerate | bytes GB | ratio | "
        "extra GPU GB | load_state s (rep 0, 1, ...) | bit-exact |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for name, _ in methods:
        blocked = [b for b, *_ in saves[name]]
        median = statistics.median(blocked[1:] or blocked)
        nbytes, extra, chose = saves[name][-1][1], max(e for _, _, e, _ in saves[name]), saves[name][-1][3]
        rows.append(
            {
                "method": name,
                "codec": chose,
                "save_s": median,
                "save_s_reps": blocked,
                "vs_accelerate": median / own_blocked,
                "gb": nbytes / 1e9,
                "ratio": own_bytes / nbytes,
                "extra_gpu_gb": extra,
                "load_s": statistics.median(s for s, _ in loads[name]),
                "load_s_reps": [s for s, _ in loads[name]],
                "exact": all(ok for _, ok in loads[name]),
            }
        )
        lines.append(
            f"| {name} | {chose} | {' / '.join(f'{b:.2f}' for b in blocked)} | {median:.2f} | "
            f"{median / own_blocked:.2f}x | {nbytes / 1e9:.3f} | {own_bytes / nbytes:.3f} | {extra:.2f} | "
            f"{' / '.join(f'{s:.2f}' for s, _ in loads[name])} | "
            f"{'yes' if all(ok for _, ok in loads[name]) else 'NO'} |"
        )
    publish(lines, args.out)
    write_result(
        args.json,
        "accelerate_fsdp",
        setup=f"{accelerator.num_processes} process(es), {accelerator.distributed_type}; byte-level GPT, "
        f"{n_params / 1e6:.1f}M params, {args.steps} AdamW steps (bf16 mixed) on the Python standard library's sources; "
        f"rank 0's model shards + optimizer state {raw / 1e9:.2f} GB; saved to {args.label}, files fsynced",
        repetitions=args.repeat,
        statistic=f"save_state: median of reps 1 to {args.repeat - 1} (rep 0 is each method's first save); "
        f"load_state: median of {args.repeat}; methods in turn, in reverse order every other repetition",
        rows=rows,
        processes=accelerator.num_processes,
        distributed_type=str(accelerator.distributed_type),
    )
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
