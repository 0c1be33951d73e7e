"""The Accelerate internals lightning_nvcomp relies on: why, and for which versions.

``accelerate.checkpointing.save`` and ``accelerate.checkpointing.load`` (Accelerate 1.0-1.15): the two module-level
functions through which ``Accelerator.save_state`` writes, and ``load_state`` reads, every ``torch.save`` file of a
checkpoint (model, optimizer, scheduler, sampler, registered objects). They are not public API, and the optimizer -
the largest part of a checkpoint - passes through no public hook, so the attached Accelerator points them at the
compressed writer (and at an ``mmap=True`` load) while its own ``save_state`` / ``load_state`` runs.

``torch.distributed.checkpoint.FileSystemWriter`` / ``FileSystemReader`` as Accelerate's FSDP checkpoint functions
look them up (``accelerate.utils.fsdp_utils``: ``save_fsdp_model``, ``save_fsdp_optimizer``, ``load_fsdp_model``,
``load_fsdp_optimizer``; read in Accelerate 1.15, the same calls since the 0.2x releases). With
``state_dict_type="SHARDED_STATE_DICT"`` they do ``import torch.distributed.checkpoint as dist_cp`` in the function
body and call ``dist_cp.save(..., storage_writer=dist_cp.FileSystemWriter(ckpt_dir))`` /
``dist_cp.load(..., storage_reader=dist_cp.FileSystemReader(ckpt_dir))``, with no way to pass a writer or reader in:
while the attached ``save_state`` / ``load_state`` runs, those names are the compressed DCP writer's and reader's
factories (:func:`lightning_nvcomp._compat.dcp.filesystem_classes_as`).

``Accelerator._optimizers`` (read in Accelerate 1.16; a list since 0.x): the optimizers ``prepare`` returned, each an
``AcceleratedOptimizer`` around the user's (its ``optimizer``). No public attribute lists them, and the attachment
times their steps while a checkpoint is written behind training (:class:`~lightning_nvcomp.auto.steps.StepTimer`);
where the name is gone, no step is timed (the slowdown is not measured).

Which folders ``Accelerator.save_state`` deletes (read in Accelerate 1.15, the same since 0.2x): with automatic
checkpoint naming and a ``total_limit``, before it saves, the main process lists ``project_dir/checkpoints``, sorts the
folders by the last number in their names and deletes the oldest ``len(folders) + 1 - total_limit`` with
``shutil.rmtree``. Delta checkpoints must move what the kept folders need out of them first
(:func:`folders_save_state_deletes`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import accelerate.checkpointing as checkpointing
import torch

from lightning_nvcomp._compat.dcp import filesystem_classes_as
from lightning_nvcomp._process import swapped


@contextlib.contextmanager
def checkpoint_io_as(
    save: Callable[..., Any] | None = None,
    load: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    dcp_writer: Callable[..., Any] | None = None,
    dcp_reader: Callable[..., Any] | None = None,
) -> Iterator[None]:
    """Within the block, ``accelerate.checkpointing.save`` is ``save`` and ``accelerate.checkpointing.load`` is
    ``load(original load)``, and Accelerate's FSDP sharded checkpoints are written by ``dcp_writer(ckpt_dir)`` and
    read by ``dcp_reader(ckpt_dir)`` (each where given); the originals are put back after
    (:func:`~lightning_nvcomp._process.swapped`)."""
    names = [name for name, given in (("save", save), ("load", load)) if given is not None]
    missing = [f"accelerate.checkpointing.{name}" for name in names if not hasattr(checkpointing, name)]
    if missing:
        raise RuntimeError(
            f"no {', '.join(missing)} (an Accelerate newer than 1.15?): lightning_nvcomp cannot route "
            "save_state/load_state through its writer; please report it"
        )
    functions = {"save": save} if save is not None else {}
    wrapped = {"load": load} if load is not None else {}
    with swapped(checkpointing, functions, wrapped), filesystem_classes_as(dcp_writer, dcp_reader):
        yield


def optimizers_of(accelerator: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers ``accelerator.prepare`` wrapped (none where Accelerate has no ``_optimizers``)."""
    prepared = getattr(accelerator, "_optimizers", None) or []
    return [
        getattr(o, "optimizer", o) for o in prepared if isinstance(getattr(o, "optimizer", o), torch.optim.Optimizer)
    ]


def folders_save_state_deletes(accelerator: Any) -> tuple[list[str], list[str]]:
    """(the folders the next ``save_state`` will delete, the folders it keeps), as Accelerate decides them (see the
    module docstring); both empty where it deletes none."""
    config = accelerator.project_configuration
    root = os.path.join(accelerator.project_dir or "", "checkpoints")
    if not (config.automatic_checkpoint_naming and config.total_limit is not None and os.path.isdir(root)):
        return [], []
    folders = [os.path.join(root, name) for name in os.listdir(root)]
    numbered = [f for f in folders if re.findall(r"[\/]?([0-9]+)(?=[^\/]*$)", f)]
    numbered.sort(key=lambda f: int(re.findall(r"[\/]?([0-9]+)(?=[^\/]*$)", f)[0]))
    excess = len(folders) + 1 - config.total_limit
    if excess <= 0:
        return [], []
    return numbered[:excess], numbered[excess:]
