"""The savings baseline: what the save a run would make without lightning_nvcomp costs, measured on its own state.

That save is ``torch.save`` of the same checkpoint (what Lightning's ``TorchCheckpointIO`` and Accelerate's
``save_state`` do) with the same durability: followed by an fsync of the file and its directory, unless
durability is ``os`` (see :class:`~lightning_nvcomp.options.Durability`). :class:`Baseline` times one such save of
the first checkpoint into the directory it goes to, when it is no larger than the probe size (a real save's fixed
costs, pickling, file creation, fsync latency, are most of a small save's time, which raw bytes over bandwidth
would miss), and scales it by the bytes of each later checkpoint. A larger first checkpoint is not saved twice:
its baseline is its raw bytes over the file system's measured write bandwidth, where fixed costs do not matter.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from lightning_nvcomp.storage.local import atomic_write
from lightning_nvcomp.storage.temp_names import own_name

log = logging.getLogger(__name__)


class Baseline:
    """The seconds an uncompressed ``torch.save`` of a checkpoint takes here, with the same durability.

    Args:
        fsync: whether that save flushes the file to the disk (durability ``sync`` and ``background``), or leaves it
            to the page cache (``os``).
        max_nbytes: the largest checkpoint timed (the probe size): larger ones use the write bandwidth.
    """

    def __init__(self, fsync: bool, max_nbytes: int) -> None:
        self.fsync, self.max_nbytes = fsync, max_nbytes
        self._per_byte: float | None = None  # seconds per raw byte of the timed save, fixed costs included

    @property
    def measured(self) -> bool:
        """Whether a save was timed (else :meth:`seconds` is raw bytes over bandwidth)."""
        return self._per_byte is not None

    def measure(self, obj: object, raw_nbytes: int, directory: str, free_nbytes: int | None) -> None:
        """Time ``torch.save(obj)`` into a temporary file in the local ``directory`` (removed after), once, if
        ``raw_nbytes`` is at most :attr:`max_nbytes` and a quarter of ``free_nbytes`` (as the probe is bounded).
        Never fails the save: a failed write (a full disk, say) leaves the baseline to the bandwidth, with a
        warning. The file, a copy of the checkpoint, is readable by its owner only, from its creation on, and has a
        name that the next save there removes if this process dies before it does (see
        :mod:`lightning_nvcomp.storage.local`)."""
        fits = free_nbytes is None or raw_nbytes <= free_nbytes // 4
        if self.measured or not 0 < raw_nbytes <= self.max_nbytes or not fits:
            return
        path = os.path.join(directory, own_name("lightning-nvcomp-baseline-torch-save", ".tmp"))
        begin = time.perf_counter()
        try:
            atomic_write(path, lambda f: torch.save(obj, f), fsync=self.fsync)
        except OSError as err:
            log.warning(
                "lightning_nvcomp: the savings baseline was not timed in %s (%s): raw bytes / bandwidth", directory, err
            )
            return
        self._per_byte = (time.perf_counter() - begin) / raw_nbytes
        os.unlink(path)

    def seconds(self, raw_nbytes: int, write_gbps: float) -> float:
        """The baseline save's seconds for a checkpoint of ``raw_nbytes``: the timed save scaled by bytes, else
        ``raw_nbytes`` over ``write_gbps``."""
        if self._per_byte is not None:
            return self._per_byte * raw_nbytes
        return raw_nbytes / (write_gbps * 1e9)
