"""Saving checkpoints: the save path every file goes through and the public :func:`~.single_file.save`
(:mod:`.single_file`), and the run's :class:`~.writer.CheckpointWriter` that the integrations share (sync or async
saves, durability, pruning, savings)."""

from lightning_nvcomp.saving.single_file import save
from lightning_nvcomp.saving.writer import CheckpointWriter

__all__ = ["CheckpointWriter", "save"]
