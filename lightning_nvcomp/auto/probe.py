"""The storage probe: the write bandwidth of a checkpoint directory, measured by writing a file there through the
directory's storage (locally: written and fsynced; at a URL: uploaded until it is a complete object) and deleting it.

A probe never makes a save fail: it writes no more than the checkpoint it is for nor a share of the free space, and
where that is too little, or its write fails, it is skipped with a warning and :data:`FALLBACK_GBPS` is assumed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import torch

from lightning_nvcomp.storage import StorageBackend, storage_for
from lightning_nvcomp.storage.temp_names import own_name

log = logging.getLogger(__name__)

#: Default size of the storage probe: large enough that fsync dominates caches, small enough to take seconds.
#: A probe never writes more than the checkpoint it is for (nor less than ``MIN_PROBE_NBYTES``), nor more than
#: ``PROBE_FREE_SHARE`` of the free space (see :func:`probe_nbytes_for`).
PROBE_NBYTES = 256 << 20
#: The smallest probe worth timing; where the free space does not allow it, the probe is skipped.
MIN_PROBE_NBYTES = 4 << 20
#: The most of a file system's free space a probe may take.
PROBE_FREE_SHARE = 0.25
#: An assumption, not a measurement: the write bandwidth (GB/s per writer, a local SSD's order of magnitude) used
#: for a file system whose probe was skipped (too little free space, or the probe write failed). The first real
#: checkpoint write timed there (:meth:`CodecPolicy.observe_write`, any size) replaces it.
FALLBACK_GBPS = 1.0


def probe_bandwidth(
    directory: str,
    nbytes: int = PROBE_NBYTES,
    storage: StorageBackend | None = None,
    collective: bool = False,
    raw_nbytes: int | None = None,
) -> float:
    """Write and fsync a probe file in ``directory``; return the GB/s achieved, or :data:`FALLBACK_GBPS` where the
    probe was skipped (see :func:`measure_bandwidth`, which tells the two apart)."""
    measured = measure_bandwidth(directory, nbytes, storage, collective, raw_nbytes)
    return FALLBACK_GBPS if measured is None else measured


def probe_nbytes_for(
    directory: str, nbytes: int, raw_nbytes: int | None = None, storage: StorageBackend | None = None
) -> tuple[int, int | None]:
    """How many bytes a probe of ``directory`` writes, and the free bytes there (None where unknown: no statvfs,
    or remote storage).

    ``nbytes`` bounded by the checkpoint (``max(raw_nbytes, MIN_PROBE_NBYTES)``, when its size is known) and by a
    quarter of the free space; 0 (skip the probe) when the free space leaves less than ``MIN_PROBE_NBYTES`` (or
    less than ``nbytes``, where that is smaller)."""
    wanted = nbytes if raw_nbytes is None else min(nbytes, max(raw_nbytes, MIN_PROBE_NBYTES))
    free = (storage or storage_for(directory)).free_nbytes(directory)  # unknown: the probe's own errors still count
    size = wanted if free is None else min(wanted, int(free * PROBE_FREE_SHARE))
    return (size if size >= min(wanted, MIN_PROBE_NBYTES) else 0), free


def measure_bandwidth(
    directory: str,
    nbytes: int = PROBE_NBYTES,
    storage: StorageBackend | None = None,
    collective: bool = False,
    raw_nbytes: int | None = None,
) -> float | None:
    """Write a probe file in ``directory`` through ``storage`` (default: the directory's own, see
    :func:`~lightning_nvcomp.storage.storage_for`), durably (fsynced locally, a complete object remotely), and
    delete it; return the GB/s achieved, or None when it was skipped.

    The probe writes ``nbytes`` bounded by the checkpoint's size ``raw_nbytes`` and by the free space (see
    :func:`probe_nbytes_for`). It never makes a save fail: where too little space is free, or the probe's write
    fails (OSError), it is skipped with one warning on the ``lightning_nvcomp.auto.probe`` logger naming the directory
    and the free space, and None is returned (the caller assumes :data:`FALLBACK_GBPS`). The probe file has a name
    of the storage module's sweepable pattern and is removed when done, also after a failed write (at a URL, a
    failed upload leaves no object: see :mod:`lightning_nvcomp.storage.remote`).

    With ``collective`` (under an initialised torch.distributed, when every rank writes its own checkpoint shard),
    every rank must call this together: all agree on the probe size first (the smallest any rank can write; all
    skip when one must), all write at once and each gets the bandwidth of the slowest writer, which is what each
    writer gets while all write; if one rank's write fails, all skip. Without it (one writer, e.g. rank 0 of DDP)
    no collective runs."""
    storage = storage or storage_for(directory)
    distributed = collective and torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    own, free = probe_nbytes_for(directory, nbytes, raw_nbytes, storage)
    size = own
    if distributed:  # also lines the ranks up, so that all write at once
        size = int(_all_reduce([float(own)], torch.distributed.ReduceOp.MIN)[0])
    if size <= 0:
        where = "" if own <= 0 else " on another rank"
        _warn_skipped(
            directory, free, f"too little free space{where} for a probe of {_mib(min(nbytes, MIN_PROBE_NBYTES))}"
        )
        return None
    path = storage.join(directory, own_name(f"lightning-nvcomp-probe-{rank}", ".tmp"))
    seconds, failure = _timed_write(storage, path, size)
    failed = failure is not None
    if distributed:
        seconds, worst_failed = _all_reduce([seconds, float(failed)], torch.distributed.ReduceOp.MAX)
        failed = worst_failed > 0
    if failed:
        reason = f"the probe failed: {failure}" if failure is not None else "the probe failed on another rank"
        _warn_skipped(directory, free, reason)
        return None
    return size / seconds / 1e9


def _timed_write(storage: StorageBackend, path: str, size: int) -> tuple[float, OSError | None]:
    """Write ``size`` random bytes to the file ``path`` through ``storage``, then remove it: the seconds that took,
    and the write's error (None where it succeeded)."""
    block = os.urandom(min(size, 16 << 20))  # incompressible, and no RNG of the training run is touched

    def write(f) -> None:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)

    failure: OSError | None = None
    begin = time.perf_counter()
    try:
        storage.write(path, write)
    except OSError as err:
        failure = err
    finally:
        with contextlib.suppress(OSError):  # FileNotFoundError: the write failed before the file existed
            storage.remove(path)
    return time.perf_counter() - begin, failure


def _all_reduce(values: list[float], op) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        tensor = tensor.cuda()
    torch.distributed.all_reduce(tensor, op=op)
    return [float(v) for v in tensor.tolist()]


def _mib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / (1 << 20):.1f} MiB"


def _warn_skipped(directory: str, free: int | None, reason: str) -> None:
    log.warning(
        "lightning_nvcomp: not probing the write bandwidth of %s (%s; free space there: %s): assuming %s GB/s "
        "until the first checkpoint write there is timed",
        directory,
        reason,
        _mib(free),
        FALLBACK_GBPS,
    )
