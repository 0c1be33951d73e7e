"""What an async save's write costs on its writer thread: the write of a standalone snapshot, and of a delta (coded
against a base on the writer thread: the base decoded, each tensor's transform chosen, the delta coded), beside
nothing, beside the main thread training the model, or beside a thread running pure Python (as a framework's loop holds
the GIL between its CUDA launches). Each C call that lets the GIL go costs the writer thread up to a switch interval
(``sys.getswitchinterval()``) to take it back while another thread runs Python.

    python benchmarks/recode_bench.py --json benchmarks/results/recode/latest-cpu.json
    python benchmarks/recode_bench.py --device cuda --dim 1024 --layers 20 --batch 64 --switch-interval 0.0005 \\
        --json benchmarks/results/recode/latest-gpu.json

On a GPU a delta's write beside pure Python can take minutes with the default 5 ms switch interval: a shorter
``--switch-interval`` shortens each wait (the count of waits is what it compares); the JSON records it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time

import torch
import torch.nn.functional as F

import lightning_nvcomp
from lightning_nvcomp.format.bases import offered
from lightning_nvcomp.format.contents import find_contents
from lightning_nvcomp.options import Codec
from lightning_nvcomp.saving.single_file import Held
from lightning_nvcomp.storage import storage_for

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common import local_tensors, same_bytes, sync, write_result  # noqa: E402
from gpt import GPT, stdlib_corpus  # noqa: E402

BESIDE = ("nothing", "training", "python")


class Training:
    """A GPT and its AdamW optimizer, trained a step at a time on the standard library's sources (seed 0)."""

    def __init__(self, dim: int, layers: int, batch: int, device: str) -> None:
        torch.manual_seed(0)
        self.model = GPT(dim=dim, layers=layers, heads=max(1, dim // 64)).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.corpus, self.batch, self.device = stdlib_corpus(), batch, device
        self.gen = torch.Generator().manual_seed(0)

    def step(self) -> None:
        context = self.model.context
        starts = torch.randint(0, self.corpus.numel() - context - 1, (self.batch,), generator=self.gen)
        rows = torch.stack([self.corpus[s : s + context + 1] for s in starts.tolist()]).long().to(self.device)
        with torch.autocast(device_type=self.device, dtype=torch.bfloat16, enabled=self.device == "cuda"):
            loss = F.cross_entropy(self.model(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss.item()  # as a loop that logs its loss: the GPU's queue does not run ahead

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}


def python_work(stop: threading.Event) -> None:
    """Pure Python until ``stop``: the GIL held as a Python-heavy loop holds it."""
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i * i


def timed_write(training: Training, base: object, path: pathlib.Path, beside: str, codec: Codec) -> tuple[float, bool]:
    """Seconds the writer thread takes to write the async snapshot of the current state (a delta against ``base``
    where it is not None) beside ``beside``: nothing, the main thread training, or a thread running pure Python; and
    whether the file loads bit-exact to the state snapshotted."""
    state = training.state()
    snapshot = [t.detach().cpu().clone() for t in local_tensors(state)]
    held = Held(state, find_contents(state), codec, None, base)  # the part training waits for: not timed here
    sync()
    took: list[float] = []

    def write() -> None:
        begin = time.perf_counter()
        with open(path, "wb") as f:
            held.fill(f)
        took.append(time.perf_counter() - begin)

    writer = threading.Thread(target=write)
    stop = threading.Event()
    helper = threading.Thread(target=python_work, args=(stop,)) if beside == "python" else None
    if helper is not None:
        helper.start()
    writer.start()
    while beside == "training" and writer.is_alive():
        training.step()
    writer.join()
    stop.set()
    if helper is not None:
        helper.join()
    sync()
    return took[0], same_bytes(local_tensors(lightning_nvcomp.load(path, map_location="cpu")), snapshot)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="steps trained before the base")
    parser.add_argument("--apart", type=int, default=20, help="steps between the base and the saves")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="the GIL's switch interval in seconds (default: Python's)"
    )
    parser.add_argument("--json", default=None, help="write the result here as JSON (benchmarks/report.py)")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    codec = Codec.ANS if args.device == "cuda" else Codec.ZSTD
    training = Training(args.dim, args.layers, args.batch, args.device)
    for _ in range(args.steps):
        training.step()
    folder = pathlib.Path(tempfile.mkdtemp(prefix="lnv-recode-"))
    try:
        lightning_nvcomp.save(training.state(), folder / "base.ckpt", codec=codec.value)
        base = offered(str(folder / "base.ckpt"), str(folder / "delta.ckpt"), storage_for(str(folder)))
        for _ in range(args.apart):
            training.step()
        state_mb = sum(t.nbytes for t in find_contents(training.state()).tensors) / 1e6
        seconds: dict[tuple[str, str], list[float]] = {}
        sizes: dict[str, int] = {}
        exact: dict[str, bool] = {}
        for rep in range(args.repeat):
            for save, against in (("standalone", None), ("delta", base)):
                for beside in BESIDE if rep % 2 else BESIDE[::-1]:
                    path = folder / f"{save}.ckpt"
                    took, same = timed_write(training, against, path, beside, codec)
                    seconds.setdefault((save, beside), []).append(took)
                    sizes[save] = os.path.getsize(path)
                    exact[save] = exact.get(save, True) and same
                    print(f"rep {rep} {save} beside {beside}: {took:.3f} s, bit-exact {same}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [
        {
            "save": save,
            "beside": beside,
            "write_s": seconds[(save, beside)],
            "file_mb": sizes[save] / 1e6,
            "bit_exact": exact[save],
        }
        for save in ("standalone", "delta")
        for beside in BESIDE
    ]
    for row in rows:
        print(f"{row['save']:10s} beside {row['beside']:8s}: {statistics.median(row['write_s']):.3f} s", flush=True)
    write_result(
        args.json,
        "recode",
        setup=f"byte-level GPT {args.dim}x{args.layers} on {args.device}, AdamW ({state_mb:.0f} MB of state), trained "
        f"{args.steps} steps on the standard library's sources, then its base saved ({codec.value}) and {args.apart} "
        f"steps more; each write of the state's async snapshot timed on its writer thread",
        repetitions=args.repeat,
        statistic=f"median of {args.repeat}, each case in turns (reversed every other round)",
        rows=rows,
        switch_interval_s=sys.getswitchinterval(),
        state_mb=state_mb,
    )
    return 0 if all(exact.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
