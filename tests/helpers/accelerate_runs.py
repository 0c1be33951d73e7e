"""A tiny, deterministic Accelerate training run for the Accelerate integration tests.

Importable by child processes (resume in a fresh interpreter, ``torch.distributed.run`` scripts) as
``tests.helpers.accelerate_runs``: put the repository root on ``PYTHONPATH``. Imports neither pytest nor conftest.

Everything random in a training step (the batch, dropout) comes from the global torch RNG, so a resumed run
only matches an uninterrupted one if ``load_state`` restored the RNG states along with the weights, the AdamW
moments, the scheduler and the registered object.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

IN_DIM, HIDDEN = 64, 512  # ~66k parameters: large enough for compression to show, fast on a CPU


class Progress:
    """A custom object for ``accelerator.register_for_checkpointing``: a Python int and a tensor."""

    def __init__(self) -> None:
        self.batches = 0
        self.loss_ema = torch.zeros(4, dtype=torch.float64)

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "loss_ema": self.loss_ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = int(state["batches"])
        self.loss_ema.copy_(state["loss_ema"])


@dataclass
class Run:
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    progress: Progress


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build(seed: int = 0, **accelerator_kwargs: Any) -> Run:
    """A prepared model (weights like a trained network's), AdamW, a StepLR scheduler and a registered
    :class:`Progress`, on an ``Accelerator(cpu=True, **accelerator_kwargs)``."""
    accelerator = Accelerator(cpu=True, **accelerator_kwargs)
    seed_all(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, HIDDEN), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(HIDDEN, IN_DIM)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    return Run(accelerator, model, optimizer, scheduler, progress)


def train(run: Run, steps: int) -> None:
    """``steps`` AdamW steps on batches drawn from the global torch RNG (dropout draws from it too)."""
    run.model.train()
    for _ in range(steps):
        x = torch.randn(16, IN_DIM)
        loss = torch.nn.functional.mse_loss(run.model(x), x.roll(1, dims=1))
        run.accelerator.backward(loss)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.progress.batches += 1
        run.progress.loss_ema.mul_(0.5).add_(loss.detach().double())


def states(run: Run) -> dict[str, Any]:
    """Everything ``save_state`` should capture, as live objects (copy with :func:`copy.deepcopy`)."""
    return {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "progress": run.progress.state_dict(),
    }


def tensor_digest(t: torch.Tensor) -> list:
    """dtype, shape, strides and the SHA-256 of the tensor's bits (no float arithmetic: NaN payloads survive)."""
    t = t.detach()
    r = torch.view_as_real(t) if t.is_complex() else t
    ints = r.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[r.dtype.itemsize])
    data = torch.empty(ints.numel(), dtype=ints.dtype).copy_(ints.reshape(-1)).view(torch.uint8)
    return [str(t.dtype), list(t.shape), list(t.stride()), hashlib.sha256(data.numpy()).hexdigest()]


def tree_digest(obj: Any) -> Any:
    """A JSON-able picture of a state tree: tensors as :func:`tensor_digest`, the rest by ``repr``."""
    if isinstance(obj, torch.Tensor):
        return ["tensor", *tensor_digest(obj)]
    if isinstance(obj, dict):
        return [["key", repr(k), tree_digest(v)] for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [type(obj).__name__, *[tree_digest(v) for v in obj]]
    return repr(obj)


def draws() -> tuple:
    """The next values of Python's, NumPy's and torch's global RNGs (consumes them)."""
    return random.random(), float(np.random.rand()), tensor_digest(torch.rand(8))


def flat_digests(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a/b/c": digest}`` for every leaf of a nested state dict: tensors as :func:`tensor_digest` (key order
    does not matter, unlike :func:`tree_digest`), the rest by ``repr``."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flat_digests(value, f"{prefix}{key}/"))
        return out
    leaf = tensor_digest(tree) if isinstance(tree, torch.Tensor) else repr(tree)
    return {prefix.rstrip("/"): leaf}
