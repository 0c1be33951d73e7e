"""What every benchmark script here needs: a device-wide sync, a walk over a state's tensors, a bit-exact
comparison, the report, and the garbage collections a block ran."""

from __future__ import annotations

import gc
import pathlib
import time

import torch
from torch.distributed.tensor import DTensor

from lightning_nvcomp.format.contents import leaves


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
