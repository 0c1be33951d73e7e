"""The Accelerate internals lightning_nvcomp relies on: why, and for which versions.

``accelerate.checkpointing.save`` and ``accelerate.checkpointing.load`` (Accelerate 1.0-1.15): the two module-level
functions through which ``Accelerator.save_state`` writes, and ``load_state`` reads, every ``torch.save`` file of a
checkpoint (model, optimizer, scheduler, sampler, registered objects). They are not public API, and the optimizer -
the largest part of a checkpoint - passes through no public hook, so the attached Accelerator points them at the
compressed writer (and at an ``mmap=True`` load) while its own ``save_state`` / ``load_state`` runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import accelerate.checkpointing as checkpointing

_SWAP = threading.Lock()  # one swap at a time: two attached Accelerators must not restore each other's functions


@contextlib.contextmanager
def checkpoint_io_as(
    save: Callable[..., Any] | None = None, load: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
) -> Iterator[None]:
    """Within the block, ``accelerate.checkpointing.save`` is ``save`` and ``accelerate.checkpointing.load`` is
    ``load(original load)`` (each where given); the originals are put back after."""
    names = [name for name, given in (("save", save), ("load", load)) if given is not None]
    with _SWAP:
        originals: dict[str, Any] = {name: getattr(checkpointing, name, None) for name in names}
        missing = [name for name, original in originals.items() if original is None]
        if missing:
            raise RuntimeError(
                f"accelerate.checkpointing has no {', '.join(missing)} (an Accelerate newer than 1.15?): "
                "lightning_nvcomp cannot route save_state/load_state through its writer; please report it"
            )
        if save is not None:
            checkpointing.save = save
        if load is not None:
            checkpointing.load = load(originals["load"])
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(checkpointing, name, original)
