"""What every benchmark script here needs: a device-wide sync, a trained GPT, a walk over a state's tensors, a
bit-exact comparison, the report, and the garbage collections a block ran. Its importers put ``examples/`` on
``sys.path`` first (for ``gpt``)."""

from __future__ import annotations

import gc
import os
import pathlib
import time

import torch
from torch.distributed.tensor import DTensor

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
