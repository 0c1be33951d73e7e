"""The private Lightning name lightning_nvcomp relies on: why, and for which versions.

``lightning.pytorch.strategies.fsdp._distributed_checkpoint_save`` and its ``model_parallel`` twin (Lightning 2.4-2.6):
the one module-level helper through which ``FSDPStrategy(state_dict_type="sharded")`` and ``ModelParallelStrategy``
write a sharded checkpoint (``dcp.save(state, checkpoint_id=path)``, no storage writer to pass). The compressed
strategies point it at their writer while their own ``save_checkpoint`` runs (see ``lightning_sharded``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

DISTRIBUTED_SAVE = "_distributed_checkpoint_save"


@contextlib.contextmanager
def distributed_checkpoint_save_as(module: ModuleType, save: Callable[..., Any]) -> Iterator[None]:
    """Within the block, ``module``'s sharded-checkpoint helper is ``save``; the original is put back after."""
    original = getattr(module, DISTRIBUTED_SAVE, None)
    if original is None:
        raise RuntimeError(
            f"{module.__name__} has no {DISTRIBUTED_SAVE} (a Lightning newer than 2.6?): the compressed sharded "
            "strategies cannot route its sharded saves; please report it"
        )
    setattr(module, DISTRIBUTED_SAVE, save)
    try:
        yield
    finally:
        setattr(module, DISTRIBUTED_SAVE, original)
