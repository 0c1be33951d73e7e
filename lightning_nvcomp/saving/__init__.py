"""Saving checkpoints: the public :func:`~.save.save`, and the run's :class:`~.writer.CheckpointWriter` that the
integrations share (sync or async saves, durability, pruning, savings)."""

from lightning_nvcomp.saving.single_file import save
from lightning_nvcomp.saving.writer import CheckpointWriter

__all__ = ["CheckpointWriter", "save"]
