"""What every benchmark script here needs: a device-wide sync, a walk over a state's tensors, a bit-exact
comparison, and the report."""

from __future__ import annotations

import pathlib

import torch
from torch.distributed.tensor import DTensor

from lightning_nvcomp.tree import leaves


def sync() -> None:
    """Wait for all GPU work (timings must include it)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


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
