"""The DCP storage classes by the names framework code looks up as it runs.

Accelerate's FSDP checkpoint functions (``accelerate.utils.fsdp_utils``, 0.2x-1.15) and Lightning's
``FSDPStrategy.load_checkpoint`` (2.1-2.6, FSDP1's optimizer state) make DCP's ``FileSystemWriter`` /
``FileSystemReader`` themselves, with no way to pass one in: they look the names up on
``torch.distributed.checkpoint`` at each call. The names are torch's public ones; that those frameworks resolve them
there and then is their internal detail. :func:`filesystem_classes_as` points them at the compressed writer's and
reader's factories while such a call runs (torch's own code imports the classes from
``torch.distributed.checkpoint.filesystem`` and does not see the swap).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed.checkpoint as dist_cp

_SWAP = threading.Lock()  # one swap at a time: two must not restore each other's names


@contextlib.contextmanager
def filesystem_classes_as(
    writer: Callable[..., Any] | None = None, reader: Callable[..., Any] | None = None
) -> Iterator[None]:
    """Within the block, ``torch.distributed.checkpoint.FileSystemWriter`` is ``writer`` and ``FileSystemReader``
    is ``reader`` (each where given); DCP's own classes are put back after, also when the block fails."""
    wanted = [(name, given) for name, given in (("FileSystemWriter", writer), ("FileSystemReader", reader)) if given]
    with _SWAP:
        originals = [(name, getattr(dist_cp, name)) for name, _ in wanted]
        for name, given in wanted:
            setattr(dist_cp, name, given)
        try:
            yield
        finally:
            for name, original in originals:
                setattr(dist_cp, name, original)
