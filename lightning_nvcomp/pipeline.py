"""Checkpoint saves as the integrations need them: synchronous (compressed segments written while the next are
coded) or asynchronous (training waits for the compressed snapshot in host memory; a background thread writes),
with the codec policy and the savings telemetry. One writer per run; Lightning and Accelerate share it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from lightning_nvcomp import format as fileformat
from lightning_nvcomp import saving, telemetry
from lightning_nvcomp.locations import StorageBackend, is_url, storage_for
from lightning_nvcomp.options import SaveOptions
from lightning_nvcomp.policy import CodecPolicy, Prediction
from lightning_nvcomp.stats import SaveStats, ratio
from lightning_nvcomp.storage import Storage, wait_for_discards

log = logging.getLogger(__name__)


def _combined(stats: list[SaveStats], label: str) -> SaveStats:
    """One save's figures for several files written together (e.g. Accelerate's model, optimizer, scheduler)."""
    if len(stats) == 1:
        return stats[0]
    codec = max(stats, key=lambda s: s.raw_nbytes).codec
    predictions = [s.prediction for s in stats if s.prediction is not None]
    prediction = None
    if len(predictions) == len(stats):  # auto: one forecast per file, summed like the files' times
        raw, stored = sum(s.raw_nbytes for s in stats), sum(s.raw_nbytes / p.ratio for s, p in zip(stats, predictions))
        prediction = Prediction(
            codec,
            ratio(raw, stored),
            sum(p.encode_s for p in predictions),
            sum(p.write_s for p in predictions),
            sum(p.blocked_s for p in predictions),
        )
    return SaveStats(
        label,
        codec,
        sum(s.raw_nbytes for s in stats),
        sum(s.file_nbytes for s in stats),
        sum(s.encode_s for s in stats),
        sum(s.write_s for s in stats),
        prediction,
    )


def _same_path(path: str) -> str:
    """``path`` in a form that compares equal for every spelling of one file: absolute, or the URL as given."""
    return path if is_url(path) else os.path.abspath(path)


class CheckpointWriter:
    """Writes checkpoint files compressed, atomically, synchronously or in the background, to local paths or URLs
    (``s3://...``, through :attr:`SaveOptions.remote`).

        Saves are grouped: :meth:`save` each file of a checkpoint, then :meth:`commit` it, which records one set of
        savings metrics for the group (in async mode, once its background writes are done).

        Args:
            options: the codec, sync or async, the staging and probe sizes, the interval and the price
                (:class:`~lightning_nvcomp.options.SaveOptions`).
            report: called with each console summary line (default: the ``lightning_nvcomp.pipeline`` logger).
    """

    def __init__(self, options: SaveOptions | None = None, report: Callable[[str], None] | None = None) -> None:
        self.options = options = options or SaveOptions()
        self.policy = CodecPolicy(
            "async" if options.async_save else "sync", options.interval_s, options.probe_nbytes, remote=options.remote
        )
        #: The storage of local paths; URLs get theirs from :meth:`storage_for`.
        self.storage: StorageBackend = Storage()
        self.savings = telemetry.Savings(options.gpu_hour_usd)
        self.report = report or log.info
        self._lock = threading.Lock()
        self._metrics: list[tuple[int, dict[str, float]]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: list[tuple[str, Future]] = []
        self._group: list[Any] = []  # SaveStats, or futures of them
        self._blocked = 0.0

    def storage_for(self, path: str | os.PathLike) -> StorageBackend:
        """The storage ``path`` is written to and read from: :attr:`storage` for a local path, the remote storage of
        a URL (made with the options' :class:`~lightning_nvcomp.remote.RemoteOptions`)."""
        return storage_for(path, self.options.remote, self.storage)

    def save(self, obj: object, path: str | os.PathLike) -> None:
        """Save ``obj`` to ``path`` (a local path or a URL) as part of the current group (waits for an earlier write
        of the same path); its directory is created where needed.

        The first save to a file system (or bucket) probes its bandwidth (the savings baseline), with a probe no
        larger than this checkpoint and never failing the save (see
        :func:`lightning_nvcomp.probe.measure_bandwidth`)."""
        storage = self.storage_for(path)
        path = os.fspath(path)
        self.wait(path)
        directory = storage.parent(path)
        storage.makedirs(directory)
        if not self.policy.knows_bandwidth(directory):  # the one-off probe of this file system, before the timing
            self.policy.write_gbps(directory, fileformat.find_contents(obj).nbytes)
        begin = time.perf_counter()
        if not self.options.async_save:
            self._group.append(
                saving.save(
                    obj,
                    path,
                    self.options.codec.value,
                    policy=self.policy,
                    storage=storage,
                    staging_nbytes=self.options.staging_nbytes,
                )
            )
            self._blocked += time.perf_counter() - begin
            return
        contents = fileformat.find_contents(obj)
        codec, prediction = saving.resolve_codec(self.options.codec.value, contents.tensors, directory, self.policy)
        snap = fileformat.snapshot(obj, codec, contents, isolate=True, staging_nbytes=self.options.staging_nbytes)
        future = self._background(self._write, snap, path, storage, prediction)
        self._inflight.append((path, future))
        self._group.append(future)
        self._blocked += time.perf_counter() - begin

    def commit(self, step: int, label: str) -> None:
        """Close the current group of saves (checkpoint ``label`` at training ``step``) and record its savings."""
        group, blocked = self._group, self._blocked
        self._group, self._blocked = [], 0.0
        if not group:
            return
        if self.options.async_save:  # the single writer thread runs this after the group's writes
            self._inflight.append((label, self._background(self._record, group, blocked, step, label)))
        else:
            self._record(group, blocked, step, label)

    def _background(self, fn: Callable, *args: Any) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write")
        return self._executor.submit(fn, *args)

    def _write(self, snap: fileformat.Snapshot, path: str, storage: StorageBackend, prediction: Any) -> SaveStats:
        stats = saving.write_snapshot(snap, path, storage, prediction)
        self.policy.observe_write(storage.parent(path), stats.file_nbytes, stats.write_s)
        return stats

    def _record(self, group: list[Any], blocked: float, step: int, label: str) -> None:
        if any(isinstance(s, Future) and s.exception() is not None for s in group):
            return  # a failed write is reported (once) by wait(); a failed checkpoint has no savings
        stats = _combined([s.result() if isinstance(s, Future) else s for s in group], label)
        storage = self.storage_for(label)
        directory = label if storage.isdir(label) else storage.parent(label)
        metrics = self.savings.add(stats, blocked, self.policy.write_gbps(directory))
        with self._lock:
            self._metrics.append((step, metrics))
        self.report(telemetry.summary(label, stats, metrics))

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) of the groups recorded since the last call."""
        with self._lock:
            drained, self._metrics = self._metrics, []
        return drained

    def wait(self, path: str | None = None) -> None:
        """Wait for background writes (only those of ``path``, when given); raise a failed one's error here."""
        target = None if path is None else _same_path(path)
        keep: list[tuple[str, Future]] = []
        waiting: list[tuple[str, Future]] = []
        for item in self._inflight:
            (waiting if target is None or _same_path(item[0]) == target else keep).append(item)
        self._inflight = keep
        for i, (written, future) in enumerate(waiting):
            try:
                future.result()
            except BaseException as err:
                self._inflight += waiting[i + 1 :]  # still to be awaited (and their errors raised) next time
                raise RuntimeError(f"lightning_nvcomp: the background save of {written} failed: {err}") from err

    def close(self) -> None:
        """Wait for every background write, then stop the writer thread."""
        try:
            self.wait()
        finally:
            wait_for_discards()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
