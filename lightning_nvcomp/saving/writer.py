"""Checkpoint saves as the integrations need them: synchronous (compressed segments written while the next are
coded) or asynchronous (training waits for the compressed snapshot in host memory; a background thread writes),
with the codec policy and the savings telemetry. One writer per run; Lightning and Accelerate share it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, TypeVar

from lightning_nvcomp._process import collector_paused
from lightning_nvcomp.auto.policy import CodecPolicy, resolve_codec
from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.auto.steps import StepTimer
from lightning_nvcomp.format.contents import find_contents
from lightning_nvcomp.options import Codec, Durability, SaveOptions
from lightning_nvcomp.saving.chain import DeltaChain
from lightning_nvcomp.saving.single_file import Coded, Held, Streamed, finish_for, flushes, write_file
from lightning_nvcomp.storage import StorageBackend, absolute_path, is_url, storage_for
from lightning_nvcomp.storage.local import Storage, wait_for_discards
from lightning_nvcomp.telemetry import savings as telemetry
from lightning_nvcomp.telemetry.baseline import Baseline
from lightning_nvcomp.telemetry.stats import SaveStats, ratio

log = logging.getLogger(__name__)
T = TypeVar("T")


def _combined(stats: list[SaveStats], label: str) -> SaveStats:
    """One save's figures for several files written together (e.g. Accelerate's model, optimizer, scheduler)."""
    if len(stats) == 1:
        return stats[0]
    largest = max(stats, key=lambda s: s.raw_nbytes)
    codec = largest.codec
    predictions = [s.prediction for s in stats if s.prediction is not None]
    prediction = None
    if len(predictions) == len(stats):  # auto: one forecast per file, summed like the files' times
        raw = sum(s.raw_nbytes for s in stats)

        def summed(name: Codec, parts: list[Prediction]) -> Prediction:
            stored = sum(s.raw_nbytes / p.ratio for s, p in zip(stats, parts))
            return Prediction(
                name,
                ratio(raw, stored),
                sum(p.encode_s for p in parts),
                sum(p.write_s for p in parts),
                sum(p.blocked_s for p in parts),
            )

        # Each file's decision had its own candidates: a codec predicted for every file is summed over them.
        by_codec = [{q.codec: q for q in (p, *p.alternatives)} for p in predictions]
        common = [c for c in by_codec[0] if c != codec and all(c in found for found in by_codec)]
        prediction = replace(
            summed(codec, predictions),
            alternatives=tuple(summed(c, [found[c] for found in by_codec]) for c in common),
            reason=f"for {os.path.basename(largest.path)}, the largest file, {predictions[stats.index(largest)].reason}",
        )
    durable = [s.durable_s for s in stats]
    return SaveStats(
        label,
        codec,
        sum(s.raw_nbytes for s in stats),
        sum(s.file_nbytes for s in stats),
        sum(s.encode_s for s in stats),
        sum(s.write_s for s in stats),
        prediction,
        durable_s=None if None in durable else max(d for d in durable if d is not None),
    )


def _now(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in the save (the write of a sync save runs there)."""
    return fn(*args)


def _discard_after(earlier: list[Future], path: str, storage: StorageBackend, chain: DeltaChain | None = None) -> None:
    """Delete ``path`` if the writes queued before (``earlier``, done by now: one writer thread runs both) all
    succeeded; else keep it: it may be the newest durable checkpoint. With delta ``chain`` s, a file a checkpoint
    beside it still needs is kept until none does."""
    failed = [f for f in earlier if f.exception() is not None]
    if failed:
        log.warning("lightning_nvcomp: kept %s (not pruned): a newer save failed: %s", path, failed[0].exception())
        return
    for gone in chain.removable(path, storage) if chain is not None else [path]:
        if storage.exists(gone):
            storage.discard(gone)


def _resolved(path: str | os.PathLike) -> str:
    """``path`` as work done later (on the writer thread, after a ``chdir``) must see it: a URL as given, a local
    path absolute."""
    return os.fspath(path) if is_url(path) else absolute_path(path)


def _same_path(path: str) -> str:
    """``path`` in a form that compares equal for every spelling of one file: absolute, or the URL as given."""
    return path if is_url(path) else os.path.abspath(path)


class CheckpointWriter:
    """Writes checkpoint files compressed, atomically, synchronously or in the background, to local paths or URLs
    (``s3://...``, through :attr:`SaveOptions.remote`), as durably as :attr:`SaveOptions.durable` says.

    Saves are grouped: :meth:`save` each file of a checkpoint, then :meth:`commit` it, which records one set of
    savings metrics for the group (once its background writes are done). All background work (async writes,
    ``background`` durability's flushes, :meth:`discard` of old checkpoints) runs in order on one writer thread: an
    old checkpoint is deleted only after every save queued before its deletion is durable.

    Read after write: when a save that is not async returns, its file is under its name, complete, for any process
    to read (a logger that uploads it, a copy, ``torch.load``), whatever the durability. With ``background``
    durability a new file is flushed to the disk behind training; a file that replaces one of the same name
    (``last.ckpt``) is flushed before its rename, in the save, so that a power loss leaves the old file or the new
    one, never neither (see :meth:`~lightning_nvcomp.storage.local.StagedWrite.publish`): one durable checkpoint always
    exists. An async save's file appears when its background write is done (as with Lightning's
    ``AsyncCheckpointIO``); :meth:`wait` waits for it.

    Args:
        options: the codec, sync or async, durability, the staging, probe and host buffer sizes, the interval and
            the price (:class:`~lightning_nvcomp.options.SaveOptions`).
        report: called with each console summary line (default: the ``lightning_nvcomp.saving.writer`` logger).
    """

    def __init__(self, options: SaveOptions | None = None, report: Callable[[str], None] | None = None) -> None:
        self.options = options = options or SaveOptions()
        self.policy = CodecPolicy(
            "async" if options.async_save else "sync", options.interval_s, options.probe_nbytes, remote=options.remote
        )
        #: The storage of local paths (flushed to the disk unless durability is ``os``); URLs get theirs from
        #: :meth:`storage_for`.
        self.storage: StorageBackend = Storage(fsync=options.durable is not Durability.OS)
        self.savings = telemetry.Savings(options.gpu_hour_usd)
        #: What the savings are measured against: an uncompressed ``torch.save`` with the same durability.
        self.baseline = Baseline()
        self.report = report or log.info
        # The save path's strategies: where the coded segments land (into the file as it is written, or host memory
        # for an async save), where the write runs (in the save, or on the writer thread), how it is finished.
        self._code: type[Streamed] | type[Held] = Held if options.async_save else Streamed
        self._run: Callable[..., Any] = self._background if options.async_save else _now
        self._finish = finish_for(options.durable, writes_behind=options.async_save)
        self._lock = threading.Lock()
        self._metrics: list[tuple[int, dict[str, float]]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: list[tuple[str, Future]] = []
        # Background writes not known to be done: (future, host bytes it holds, its checkpoint's number).
        self._held: deque[tuple[Future, int, int]] = deque()
        self._checkpoints = 0  # checkpoints committed so far: the number of the current one
        self._last_held = self._group_held = 0  # host bytes the last committed / this checkpoint's snapshots hold
        self._group: list[Any] = []  # SaveStats, or futures of them
        self._blocked = self._waited = self._probe_s = 0.0
        #: The training's optimizer steps, timed from the first save that writes behind it (async, or ``background``
        #: durability) until :meth:`close`: how much slower they run while a write is in progress.
        self.steps = StepTimer(lambda: self.pending() > 0)
        #: Delta checkpoints' chains (None: every checkpoint stands alone).
        self.chain = DeltaChain(options.delta) if options.delta is not None else None

    def storage_for(self, path: str | os.PathLike) -> StorageBackend:
        """The storage ``path`` is written to and read from: :attr:`storage` for a local path, the remote storage of
        a URL (made with the options' :class:`~lightning_nvcomp.storage.remote.RemoteOptions`)."""
        return storage_for(path, self.options.remote, self.storage)

    def save(self, obj: object, path: str | os.PathLike) -> None:
        """Save ``obj`` to ``path`` (a local path or a URL) as part of the current group; its directory is created
        where needed. Earlier checkpoints' background writes are not waited for while the host buffer can hold
        this checkpoint's snapshots besides theirs (by default: while at most one earlier checkpoint is still being
        written; in sync mode, flushed); past that, this save waits for the oldest and says so (a warning and the
        ``waited_s`` metric): the storage is slower than the saves.

        The save path is :mod:`~lightning_nvcomp.saving.single_file`'s: the contents found once, the codec decided,
        the tensors coded (into the file as it is written, or for an async save into host memory, the file then
        written on the writer thread), the file finished by the durability strategy (``background``: its flush on
        the writer thread).

        The first save to a file system (or bucket) probes its bandwidth, with a probe no larger than this
        checkpoint and never failing the save (see :func:`lightning_nvcomp.auto.probe.measure_bandwidth`), the
        first on a local file system times the fixed costs of the savings baseline
        (:class:`~lightning_nvcomp.telemetry.baseline.Baseline`), and the first ``auto`` save calibrates the codecs
        on the contents the save found; their time is not the save's: it is reported once, as ``probe_s``."""
        storage = self.storage_for(path)
        path = _resolved(path)
        directory = storage.parent(path)
        storage.makedirs(directory)
        begin = time.perf_counter()
        with collector_paused():  # the whole save, as single_file.save_file's
            contents = find_contents(obj)
            measured_s = self.policy.measuring_s
            self.policy.write_gbps(directory, contents.nbytes)  # a first save to a file system probes it
            probe_s = self.baseline.measure(directory, storage)
            if not self._group:  # a checkpoint's first file: auto learns the interval between checkpoints
                self.policy.save_started()
            if self.options.async_save or self.options.durable is Durability.BACKGROUND:
                self.steps.start()
            self.steps.save_started()
            self.policy.observe_slowdown(self.steps.slowdown())
            self._make_room(path)
            codec, prediction = resolve_codec(self.options.codec, contents.tensors, directory, self.policy)
            probe_s += self.policy.measuring_s - measured_s  # the one-off measurements are not the save's time
            self._probe_s += probe_s
            begin += probe_s
            base = self.chain.prepare(path, storage, self.wait) if self.chain is not None else None
            coded = self._code(obj, contents, codec, self.options.staging_nbytes, base)
            saved = self._run(self._write, coded, path, storage, prediction, begin)
        if isinstance(saved, Future):
            self._queue(path, saved, coded.held_nbytes)
        else:
            self._group.append(saved)
        self._blocked += time.perf_counter() - begin

    def discard(self, path: str | os.PathLike) -> None:
        """Delete the checkpoint file ``path`` (pruning): at once when nothing is being written, else on the writer
        thread after the saves queued before it, and only if they all succeeded (so that an older checkpoint is
        never deleted before a newer one is durable)."""
        path = _resolved(path)
        storage = self.storage_for(path)
        earlier = [future for _, future in self._inflight]  # a failure stays here until wait() has raised it
        chain = self.chain
        if any(not future.done() for future in earlier):
            self._inflight.append((path, self._background(_discard_after, earlier, path, storage, chain)))
        else:
            _discard_after(earlier, path, storage, chain)

    def commit(self, step: int, label: str) -> None:
        """Close the current group of saves (checkpoint ``label``, a file or a directory, at training ``step``) and
        record its savings."""
        label = _resolved(label)
        if self.chain is not None:
            self.chain.committed(step)
        group, blocked, waited, probe_s = self._group, self._blocked, self._waited, self._probe_s
        self._group, self._blocked, self._waited, self._probe_s = [], 0.0, 0.0, 0.0
        if not group:
            return
        self._last_held, self._group_held = self._group_held, 0
        self._checkpoints += 1
        slowdown = self.steps.slowdown()
        if any(isinstance(s, Future) for s in group):  # the writer thread runs this after the group's writes
            self._inflight.append(
                (label, self._background(self._record, group, blocked, waited, probe_s, slowdown, step, label))
            )
        else:
            self._record(group, blocked, waited, probe_s, slowdown, step, label)

    def _make_room(self, path: str) -> None:
        """Wait for earlier writes, flushes and deletions of ``path`` (a file is replaced only once the one before it
        is durable, and never deleted after its new save), then for the oldest earlier checkpoint's background
        writes while the host buffer cannot hold this checkpoint's besides theirs (in sync mode: while two are still
        being flushed)."""
        self.wait(path)
        self._held = deque(item for item in self._held if not item[0].done())
        begin = time.perf_counter()
        while not self._room():
            self._held.popleft()[0].exception()  # its error, if any, is raised by wait(), with its path
        waited = time.perf_counter() - begin
        if waited > 0.01:
            self._waited += waited
            log.warning(
                "lightning_nvcomp: the save of %s waited %.2f s for earlier checkpoints still being written: the "
                "storage is slower than the saves (save less often, give a larger host_buffer_mb, or use faster storage)",
                path,
                waited,
            )

    def _room(self) -> bool:
        earlier = [(nbytes, n) for future, nbytes, n in self._held if n < self._checkpoints and not future.done()]
        if not earlier:
            return True
        if not self.options.async_save:
            return len({n for _, n in earlier}) < 2
        bound = self.options.host_buffer_nbytes or 2 * self._last_held
        return sum(nbytes for nbytes, _ in earlier) + self._last_held <= bound

    def _queue(self, path: str, future: Future, held_nbytes: int) -> None:
        self._inflight.append((path, future))
        self._held.append((future, held_nbytes, self._checkpoints))
        self._group_held += held_nbytes
        self._group.append(future)

    def _background(self, fn: Callable, *args: Any) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write")
        return self._executor.submit(fn, *args)

    def _write(
        self, coded: Coded, path: str, storage: StorageBackend, prediction: Prediction | None, begin: float
    ) -> SaveStats | Future[SaveStats]:
        """Write a coded file (on the writer thread for an async save) and learn from it: what the save did, once
        the file is as durable as the options make it, or a future of that while ``background`` durability's flush
        runs on the writer thread."""
        stats, written = write_file(coded, path, storage, self._finish, prediction)
        self._learn(stats)
        if written.flush is None:
            return self._durable(stats, storage, written.seconds, begin)
        return self._background(self._flush, written.flush, stats, storage, written.seconds, begin)

    def _flush(
        self, flush: Callable[[], None], stats: SaveStats, storage: StorageBackend, seconds: float, begin: float
    ) -> SaveStats:
        """``background`` durability: flush a file a sync save put in place (written in ``seconds``) to the disk."""
        flush_begin = time.perf_counter()
        flush()
        return self._durable(stats, storage, seconds + time.perf_counter() - flush_begin, begin)

    def _durable(self, stats: SaveStats, storage: StorageBackend, seconds: float, begin: float) -> SaveStats:
        """What the save did, its file as durable as it gets (written, and flushed, in ``seconds``): the policy learns
        the storage's bandwidth."""
        self.policy.observe_write(storage.parent(stats.path), stats.file_nbytes, seconds)
        return replace(stats, durable_s=time.perf_counter() - begin if flushes(storage) else None)

    def _learn(self, stats: SaveStats) -> None:
        """``auto``: the codec's profile learns the save's real ratio and coding time."""
        if stats.prediction is not None:
            self.policy.observe_save(stats.codec, stats.raw_nbytes, stats.file_nbytes, stats.encode_s)

    def _record(
        self,
        group: list[Any],
        blocked: float,
        waited: float,
        probe_s: float,
        slowdown: float | None,
        step: int,
        label: str,
    ) -> None:
        if any(isinstance(s, Future) and s.exception() is not None for s in group):
            return  # a failed write is reported (once) by wait(); a failed checkpoint has no savings
        stats = _combined([s.result() if isinstance(s, Future) else s for s in group], label)
        storage = self.storage_for(label)
        directory = label if storage.isdir(label) else storage.parent(label)
        baseline_s = self.baseline.seconds(stats.raw_nbytes, self.policy.write_gbps(directory))
        # How long this checkpoint's writes ran behind training: until durable, or (durability "os") written.
        if stats.durable_s is not None:
            behind_s = max(0.0, stats.durable_s - blocked)
        else:
            behind_s = stats.write_s if self.options.async_save else 0.0
        metrics = self.savings.add(stats, blocked, baseline_s, waited, probe_s, slowdown, behind_s)
        with self._lock:
            self._metrics.append((step, metrics))
        self.report(telemetry.summary(label, stats, metrics))

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) of the groups recorded since the last call."""
        with self._lock:
            drained, self._metrics = self._metrics, []
        return drained

    def pending(self) -> int:
        """How many background writes, flushes and deletions are not done yet (0: every checkpoint saved so far is
        as durable as :attr:`SaveOptions.durable` makes it)."""
        return sum(not future.done() for _, future in self._inflight)

    def raise_failures(self) -> None:
        """Raise the error of a background write that has failed (as :meth:`wait` would), without waiting for the
        writes still running."""
        failed = [path for path, future in self._inflight if future.done() and future.exception() is not None]
        if failed:
            self.wait(failed[0])

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
            self.steps.stop()
            wait_for_discards()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
