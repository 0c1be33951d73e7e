"""The private Lightning names lightning_nvcomp relies on: why, and for which versions.

``lightning.pytorch.strategies.fsdp._distributed_checkpoint_save`` and its ``model_parallel`` twin (Lightning 2.4-2.6):
the one module-level helper through which ``FSDPStrategy(state_dict_type="sharded")`` and ``ModelParallelStrategy``
write a sharded checkpoint (``dcp.save(state, checkpoint_id=path)``, no storage writer to pass). The compressed
strategies point it at their writer while their own ``save_checkpoint`` runs (see :mod:`lightning_nvcomp.integrations.lightning.sharded`).
``_distributed_checkpoint_load`` of ``lightning.pytorch.strategies.fsdp`` and ``lightning.fabric.strategies.
model_parallel`` (Lightning 2.4-2.6), its reading twin (``dcp.load(state, checkpoint_id=path)``): pointed at the
compressed reader while ``load_checkpoint`` runs, so loads decode in bulk (DCP's default reader decodes item by
item). FSDP1's optimizer state is read by a ``FileSystemReader(path=path)`` that ``FSDPStrategy.load_checkpoint``
(Lightning 2.1-2.6) makes itself, importing the name from ``torch.distributed.checkpoint`` as it runs: the compressed
strategy points that name at its reader while the load runs
(:func:`lightning_nvcomp._compat.dcp.filesystem_classes_as`).

``FSDPStrategy._state_dict_type`` (Lightning 2.1-2.6) and ``ModelParallelStrategy._save_distributed_checkpoint``
(Lightning 2.4-2.6): the constructor arguments ``state_dict_type`` and ``save_distributed_checkpoint`` as the
strategies keep them, which nothing public exposes. They decide whether a save is a sharded one (through DCP, so
through the compressed writer) or a "full" one; the compressed strategies collect the state on the GPU only for the
sharded ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from lightning_nvcomp._process import swapped

DISTRIBUTED_SAVE = "_distributed_checkpoint_save"
DISTRIBUTED_LOAD = "_distributed_checkpoint_load"


def distributed_checkpoint_helper_as(
    module: ModuleType, name: str, helper: Callable[..., Any]
) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``module``'s sharded-checkpoint helper ``name`` (:data:`DISTRIBUTED_SAVE` or
    :data:`DISTRIBUTED_LOAD`) is ``helper``; the original is put back after
    (:func:`~lightning_nvcomp._process.swapped`)."""
    if getattr(module, name, None) is None:
        raise RuntimeError(
            f"{module.__name__} has no {name} (a Lightning newer than 2.6?): the compressed sharded strategies "
            "cannot route its sharded checkpoints; please report it"
        )
    return swapped(module, {name: helper})


def _setting(strategy: Any, name: str) -> Any:
    try:
        return getattr(strategy, name)
    except AttributeError:
        raise RuntimeError(
            f"{type(strategy).__name__} has no {name} (a Lightning newer than 2.6?): the compressed sharded "
            "strategies cannot tell a sharded save from a full one; please report it"
        ) from None


def fsdp_saves_sharded(strategy: Any) -> bool:
    """Whether an ``FSDPStrategy`` saves sharded checkpoints (``state_dict_type="sharded"``)."""
    return _setting(strategy, "_state_dict_type") == "sharded"


def model_parallel_saves_distributed(strategy: Any) -> bool:
    """Whether a ``ModelParallelStrategy`` saves distributed checkpoints (``save_distributed_checkpoint=True``)."""
    return bool(_setting(strategy, "_save_distributed_checkpoint"))
