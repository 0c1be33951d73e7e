"""Resharded ``dcp.load`` on one GPU: a trained GPT's model + AdamW state saved by one rank is loaded by two ranks
(each tensor split along its first dimension as a ``DTensor``), and the two ranks' checkpoint is loaded back by one
rank into whole tensors; each with DCP's ``FileSystemReader`` and with ours, in alternating order, next to the
same-rank load, onto the device and into CPU tensors (``--profile``: a cProfile of our CPU-tensor load). The two ranks are processes sharing the one GPU over gloo (NCCL refuses two ranks on one device);
their state stays on the GPU, so our reader decodes there. Loads are bit-exact: the one-rank loads against the
trained state, the two-rank loads of our files against those of DCP's.

    python benchmarks/reshard_bench.py --out /tmp/reshard.md                        # on a GPU
    python benchmarks/reshard_bench.py --dim 64 --layers 2 --steps 3 --device cpu            # CPU smoke test
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import pathlib
import pstats
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor, Shard, init_device_mesh

import lightning_nvcomp
from lightning_nvcomp.codec.gpu import nvcomp_version
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import publish, sync  # noqa: E402
from gpt import GPT, stdlib_corpus, train  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")

READERS = {"FileSystemReader": dcp.FileSystemReader, "ours": NvcompFileSystemReader}


def targets(path: str, device: str, mesh=None) -> dict[str, torch.Tensor]:
    """Empty tensors for every tensor of the checkpoint at ``path``, by its flattened name: whole, or with ``mesh``
    a DTensor split along dimension 0 (a tensor with fewer rows than ranks, or none, whole on every rank)."""
    out = {}
    for name, meta in dcp.FileSystemReader(path).read_metadata().state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            continue
        shape, dtype = tuple(meta.size), meta.properties.dtype
        if mesh is None or not shape or shape[0] < mesh.size():
            out[name] = torch.empty(shape, dtype=dtype, device=device)
            continue
        rows = -(-shape[0] // mesh.size())
        start = min(shape[0], rows * mesh.get_local_rank())
        local = torch.empty((min(rows, shape[0] - start), *shape[1:]), dtype=dtype, device=device)
        stride = torch.empty(shape, device="meta").stride()
        out[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(local(a[k]).reshape(-1).view(torch.uint8), local(b[k]).reshape(-1).view(torch.uint8)) for k in a
    )


def timed_loads(path_of, make_targets, repeat: int, barrier=lambda: None) -> tuple[dict, dict]:
    """Each reader's load times over ``repeat`` repetitions (in reverse order every other one) and its last loaded
    tensors."""
    times: dict[str, list[float]] = {name: [] for name in READERS}
    loaded = {}
    for rep in range(repeat):
        for name in READERS if rep % 2 == 0 else reversed(READERS):
            target = make_targets()
            barrier()
            sync()
            begin = time.perf_counter()
            dcp.load(target, storage_reader=READERS[name](path_of[name]))
            sync()
            barrier()
            times[name].append(time.perf_counter() - begin)
            loaded[name] = target
    return times, loaded


def two_ranks(rank: int, args: argparse.Namespace, results) -> None:
    """A rank of two: load the one-rank checkpoints resharded, then save the shards as the two-rank checkpoints."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh(args.device, (2,))
    one = {"FileSystemReader": f"{args.dir}/one/plain", "ours": f"{args.dir}/one/ours"}
    times, loaded = timed_loads(one, lambda: targets(one["ours"], args.device, mesh), args.repeat, dist.barrier)
    exact = same(loaded["ours"], loaded["FileSystemReader"])
    for name, writer in (
        ("plain", dcp.FileSystemWriter),
        ("ours", lambda p: NvcompFileSystemWriter(p, codec=args.codec)),
    ):
        dcp.save(loaded["FileSystemReader"], storage_writer=writer(f"{args.dir}/two/{name}"))
    results.put((rank, times, exact))
    dist.destroy_process_group()


def fmt(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} ({' / '.join(f'{t:.3f}' for t in times)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--codec", default="ans" if torch.cuda.is_available() else "zstd")
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--dir", default="/tmp/reshard-bench")
    parser.add_argument("--port", type=int, default=29517)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of our load into CPU tensors")
    parser.add_argument("--out")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT(dim=args.dim, layers=args.layers, heads=max(1, args.dim // 64), context=256).to(args.device)
    opt = train(model, stdlib_corpus(16 << 20), args.steps, 16, args.device, log_every=max(1, args.steps))
    model_sd, optim_sd = get_state_dict(model, opt)
    shutil.rmtree(args.dir, ignore_errors=True)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(f"{args.dir}/one/plain"))
    dcp.save(state, storage_writer=NvcompFileSystemWriter(f"{args.dir}/one/ours", codec=args.codec))
    trained = {k: v for k, v in targets(f"{args.dir}/one/plain", args.device).items()}
    dcp.load(trained, storage_reader=dcp.FileSystemReader(f"{args.dir}/one/plain"))  # the state by flattened name
    raw = sum(t.numel() * t.element_size() for t in trained.values())

    rows = []
    one = {"FileSystemReader": f"{args.dir}/one/plain", "ours": f"{args.dir}/one/ours"}
    times, loaded = timed_loads(one, lambda: targets(one["ours"], args.device), args.repeat)
    rows.append(("1 -> 1 (same ranks)", times, all(same(t, trained) for t in loaded.values())))
    del loaded
    if args.device != "cpu":
        times, loaded = timed_loads(one, lambda: targets(one["ours"], "cpu"), args.repeat)
        on_cpu = {k: v.cpu() for k, v in trained.items()}
        rows.append(("1 -> 1 into CPU tensors", times, all(same(t, on_cpu) for t in loaded.values())))
        del loaded
        if args.profile:
            target = targets(one["ours"], "cpu")
            profile = cProfile.Profile()
            profile.runcall(dcp.load, target, storage_reader=NvcompFileSystemReader(one["ours"]))
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)

    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(two_ranks, args=(args, results), nprocs=2, start_method="spawn")
    ranks = sorted(results.get() for _ in range(2))
    slowest = {name: [max(r[1][name][i] for r in ranks) for i in range(args.repeat)] for name in READERS}
    rows.append(("1 -> 2 (two processes on the one device; the slower rank)", slowest, all(r[2] for r in ranks)))

    two = {"FileSystemReader": f"{args.dir}/two/plain", "ours": f"{args.dir}/two/ours"}
    times, loaded = timed_loads(two, lambda: targets(two["ours"], args.device), args.repeat)
    rows.append(("2 -> 1", times, all(same(t, trained) for t in loaded.values())))
    sizes = {
        f"{n}/{k}": sum(p.stat().st_size for p in pathlib.Path(f"{args.dir}/{n}/{k}").glob("*.distcp"))
        for n in ("one", "two")
        for k in ("plain", "ours")
    }
    shutil.rmtree(args.dir, ignore_errors=True)

    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    lines = [
        "# Resharded dcp.load on one device",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {device}; torch "
        f"{torch.__version__}; nvCOMP {nvcomp_version()}; lightning_nvcomp {lightning_nvcomp.__version__}",
        f"- byte-level GPT, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {args.steps} AdamW steps "
        f"on the standard library's sources; model + AdamW state, {raw / 1e9:.2f} GB on {args.device}; ours with "
        f"{args.codec}; .distcp bytes: one rank {sizes['one/plain'] / 1e9:.2f} GB plain / {sizes['one/ours'] / 1e9:.2f} "
        f"GB ours, two ranks {sizes['two/plain'] / 1e9:.2f} / {sizes['two/ours'] / 1e9:.2f} GB",
        f"- {args.repeat} repetitions per load, readers in turn (reversed every other repetition): median (each)",
        "",
        "| load | FileSystemReader s | ours s | ours / FileSystemReader | bit-exact |",
        "|---|---|---|---|---|",
    ]
    for label, times, exact in rows:
        plain, ours = times["FileSystemReader"], times["ours"]
        lines.append(
            f"| {label} | {fmt(plain)} | {fmt(ours)} | {statistics.median(ours) / statistics.median(plain):.2f}x | "
            f"{'yes' if exact else 'NO'} |"
        )
    publish(lines, args.out)


if __name__ == "__main__":
    main()
