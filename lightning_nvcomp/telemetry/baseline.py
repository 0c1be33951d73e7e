"""The savings baseline: what the save a run would make without lightning_nvcomp costs.

That save is ``torch.save`` of the same checkpoint (what Lightning's ``TorchCheckpointIO`` and Accelerate's
``save_state`` do) with the same durability: followed by an fsync of the file and its directory, unless durability is
``os`` (see :class:`~lightning_nvcomp.options.Durability`). It costs a save's fixed costs (creating the file, its zip
structure, the fsyncs: most of a small save's time) plus its bytes over the file system's write bandwidth.
:class:`Baseline` times the fixed costs once, with a small ``torch.save`` through the storage the checkpoints are
written with, and takes the bandwidth from the probe ``auto`` uses too: the state itself is never saved twice. What
pickling a state's many objects costs beyond that is left out, so the baseline, and the savings, err low.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from lightning_nvcomp.storage.backend import StorageBackend
from lightning_nvcomp.storage.local import Storage
from lightning_nvcomp.storage.temp_names import own_name

log = logging.getLogger(__name__)

#: The bytes of the tensor the fixed costs are timed with, and how many times (the least counts: first-write noise).
SAMPLE_NBYTES, TIMINGS = 4096, 3


class Baseline:
    """The seconds an uncompressed ``torch.save`` of a checkpoint takes here, with the same durability."""

    def __init__(self) -> None:
        self._fixed_s: float | None = None  # a save's fixed costs, timed (None: not yet, or not local storage)

    @property
    def measured(self) -> bool:
        """Whether the fixed costs were timed (else :meth:`seconds` is raw bytes over bandwidth alone)."""
        return self._fixed_s is not None

    def measure(self, directory: str, storage: StorageBackend) -> float:
        """Time a ``torch.save`` of :data:`SAMPLE_NBYTES` into a temporary file in ``directory``, written by
        ``storage`` as a checkpoint is (its durability, its file object) and removed after, once, where ``storage``
        is local (a remote baseline is raw bytes over bandwidth). Returns the seconds this took (0 when nothing was
        timed).

        Never fails the save: a failed write (a full disk, say) leaves the baseline to the bandwidth, with a
        warning. The file has a name that the next save there removes if this process dies before it does (see
        :mod:`lightning_nvcomp.storage.local`)."""
        if self.measured or not isinstance(storage, Storage):
            return 0.0
        sample = torch.zeros(SAMPLE_NBYTES, dtype=torch.uint8)
        begin, fixed_s = time.perf_counter(), float("inf")
        try:
            for _ in range(TIMINGS):
                path = os.path.join(directory, own_name("lightning-nvcomp-baseline-torch-save", ".tmp"))
                start = time.perf_counter()
                storage.write(path, lambda f: torch.save(sample, f))
                fixed_s = min(fixed_s, time.perf_counter() - start)
                storage.remove(path)
        except OSError as err:
            log.warning(
                "lightning_nvcomp: the savings baseline's fixed costs were not timed in %s (%s): raw bytes / bandwidth",
                directory,
                err,
            )
        else:
            self._fixed_s = fixed_s
        return time.perf_counter() - begin

    def seconds(self, raw_nbytes: int, write_gbps: float) -> float:
        """The baseline save's seconds for a checkpoint of ``raw_nbytes``: the fixed costs timed (0 where they were
        not) plus ``raw_nbytes`` over ``write_gbps``."""
        return (self._fixed_s or 0.0) + raw_nbytes / (write_gbps * 1e9)
