"""The save path: the same steps for every checkpoint file. The object's contents are found once
(:func:`~lightning_nvcomp.format.contents.find_contents`), the codec is decided on their tensors (``auto`` asks the
policy: :func:`~lightning_nvcomp.auto.policy.resolve_codec`), the tensors are coded into segments, the storage
writes the file, and a durability strategy finishes it (:func:`write_file`).

Sync and async saves differ in where the coded segments land: written into the file while the next are coded
(:class:`Streamed`), or kept in host memory, so that the file can be written later on another thread
(:class:`Held`). The durability strategies (:class:`~lightning_nvcomp.options.Durability`): :data:`IN_WRITE`, the
file is as durable as its storage makes it when the write returns: flushed to the disk (``sync``), left to the page
cache by a storage that does not flush (``os``), a completed upload (remote storage); :data:`BEHIND`
(``background``), the file is under its name when the write returns and its flush is left to a writer thread.

:func:`save`, the public save, is a sync save of one file.
"""

from __future__ import annotations

import os
import time
from typing import BinaryIO, Callable, NamedTuple

from lightning_nvcomp._process import collector_paused
from lightning_nvcomp.auto.policy import CodecPolicy, default_policy, resolve_codec
from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.format.bases import BaseFile, offered
from lightning_nvcomp.format.contents import Contents, find_contents
from lightning_nvcomp.format.sink import ArchiveSink
from lightning_nvcomp.format.writer import Snapshot, snapshot
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.options import Codec, Durability, SaveOptions, mb_of_nbytes
from lightning_nvcomp.storage import StorageBackend, storage_for
from lightning_nvcomp.storage.local import Storage
from lightning_nvcomp.telemetry.stats import SaveStats

#: The :class:`~lightning_nvcomp.options.SaveOptions` fields :func:`save` acts on.
SAVE_OPTIONS = ("codec", "staging_mb")


class Written(NamedTuple):
    """A file as its write left it: its size in bytes, what is left to make it durable (None: nothing), and the
    write's wall time in seconds (set by the save path)."""

    size: int
    flush: Callable[[], None] | None = None
    seconds: float = 0.0


class InWrite:
    """Durable as the storage makes a file when its write returns (``sync``, ``os``, remote storage)."""

    def write(self, storage: StorageBackend, path: str, fill: Callable[[BinaryIO], None]) -> Written:
        """Write ``path`` through ``fill(f)`` (atomically: see :meth:`StorageBackend.write`)."""
        return Written(storage.write(path, fill))


class Behind(InWrite):
    """``background``: a local file is put under its name at once (a file it replaces is flushed first, so that a
    power loss leaves one or the other), and its :attr:`Written.flush` is left to a writer thread. Remote storage
    has no flush to leave: its file is durable when its upload completes."""

    def write(self, storage: StorageBackend, path: str, fill: Callable[[BinaryIO], None]) -> Written:
        if not isinstance(storage, Storage):
            return super().write(storage, path, fill)
        staged = storage.write_staged(path, fill)
        staged.publish()
        return Written(staged.size, staged.flush)


IN_WRITE = InWrite()
BEHIND = Behind()


def finish_for(durable: Durability, writes_behind: bool) -> InWrite:
    """The strategy that finishes a file saved with ``durable``: ``background`` leaves the flush to the writer thread,
    unless the write runs there already (``writes_behind``: an async save), which then finishes it at once."""
    return BEHIND if durable is Durability.BACKGROUND and not writes_behind else IN_WRITE


def flushes(storage: StorageBackend) -> bool:
    """Whether a completed write to ``storage`` is on stable storage (remote storage: when the upload completes)."""
    return not isinstance(storage, Storage) or storage.fsync


def flush_stream(stream: BinaryIO) -> None:
    """Flush a file written in place, not renamed (a DCP data file, whose ``.metadata`` is what commits it), to the
    disk: what :data:`IN_WRITE` does for a file its storage writes."""
    stream.flush()
    os.fsync(stream.fileno())


class Streamed:
    """The tensors of ``obj`` coded with ``codec`` while the file is written (:meth:`fill`): each segment written on
    a disk thread while the next one is coded, so that coding overlaps the write and the compressed checkpoint is
    never whole in memory (sync saves). ``staging_nbytes`` bounds what is coded at once (see
    :func:`~lightning_nvcomp.format.writer.snapshot`)."""

    #: Host memory held between the save and the write: none, they are one.
    held_nbytes = 0
    #: The tensors are coded while the file is written.
    while_written = True

    def __init__(
        self, obj: object, contents: Contents, codec: Codec, staging_nbytes: int | None, base: BaseFile | None = None
    ) -> None:
        self._obj, self._contents, self._codec, self._staging_nbytes = obj, contents, codec, staging_nbytes
        self._base = base

    def fill(self, f: BinaryIO) -> Snapshot:
        """Code the tensors into the archive ``f``, then write the rest of it; the snapshot it took."""
        writer = ArchiveWriter(f)
        with ArchiveSink(writer) as sink:
            snap = snapshot(
                self._obj,
                self._codec.value,
                self._contents,
                staging_nbytes=self._staging_nbytes,
                sink=sink,
                base=self._base,
            )
        snap.write_to(writer)
        return snap


class Held:
    """The tensors of ``obj`` coded with ``codec`` now, into host memory, and the rest of ``obj`` copied as it is now
    (an isolated snapshot: training may change the state before the file is written), then written by :meth:`fill`
    (async saves). With a ``base``, they are coded alone now all the same, so that training waits no longer than for
    a standalone save, and the delta is made from the held segments as the file is written (on the writer thread;
    GPU state on a CUDA stream of its own)."""

    while_written = False

    def __init__(
        self, obj: object, contents: Contents, codec: Codec, staging_nbytes: int | None, base: BaseFile | None = None
    ) -> None:
        self.snapshot = snapshot(obj, codec.value, contents, isolate=True, staging_nbytes=staging_nbytes)
        self._base = base

    @property
    def held_nbytes(self) -> int:
        """The host memory the coded segments hold until they are written."""
        return self.snapshot.held_nbytes

    def fill(self, f: BinaryIO) -> Snapshot:
        """Write the snapshot into the archive ``f`` (coded against the base first, where there is one); the snapshot
        written."""
        writer = ArchiveWriter(f)
        snap = self.snapshot
        if self._base is not None:
            with ArchiveSink(writer) as sink:
                snap = snap.coded_against(self._base, sink)
        snap.write_to(writer)
        return snap


#: The coded tensors of a save, as a sync or an async save holds them.
Coded = Streamed | Held


def write_file(
    coded: Coded, path: str, storage: StorageBackend, finish: InWrite = IN_WRITE, prediction: Prediction | None = None
) -> tuple[SaveStats, Written]:
    """Write the file ``path`` from ``coded`` through ``storage``, finished by the durability strategy ``finish``:
    what the save did, and what its write left (its size, a flush still to run, its wall time: the coding's too
    where it ran meanwhile). ``prediction``: why auto chose the codec, if it did."""
    begin = time.perf_counter()
    snaps: list[Snapshot] = []
    written = finish.write(storage, path, lambda f: snaps.append(coded.fill(f)))
    written = written._replace(seconds=time.perf_counter() - begin)
    snap = snaps[-1]  # (the one written, should the storage have retried)
    write_s = written.seconds - (snap.encode_s if coded.while_written else snap.recode_s)
    stats = SaveStats(path, Codec(snap.codec), snap.raw_nbytes, written.size, snap.encode_s, write_s, prediction)
    return stats, written


@collector_paused()
def save_file(
    obj: object,
    path: str,
    codec: Codec,
    policy: CodecPolicy,
    storage: StorageBackend,
    directory: str,
    staging_nbytes: int | None = None,
    base: BaseFile | None = None,
) -> SaveStats:
    """:func:`save` but for what the policy learns: ``obj``'s contents found, its codec decided for ``directory``,
    the file streamed (coded against ``base``). The garbage collector is paused meanwhile (see
    :func:`~lightning_nvcomp._process.collector_paused`)."""
    contents = find_contents(obj)
    codec, prediction = resolve_codec(codec, contents.tensors, directory, policy)
    coded = Streamed(obj, contents, codec, staging_nbytes, base)
    stats, _ = write_file(coded, path, storage, IN_WRITE, prediction)
    return stats


def save(
    obj: object,
    path: str | os.PathLike,
    codec: Codec | str | None = None,
    *,
    options: SaveOptions | None = None,
    staging_mb: float | None = None,
    policy: CodecPolicy | None = None,
    storage: StorageBackend | None = None,
    staging_nbytes: int | None = None,
    base: str | os.PathLike | None = None,
) -> SaveStats:
    """Save ``obj`` like ``torch.save``, its tensors compressed losslessly and checksummed, atomically and durably.

    Args:
        obj: anything ``torch.save`` accepts; plain dense tensors and parameters are compressed, every other
            storage is stored checksummed too.
        path: the file to write: a local path (a symlink is written through; a previous file keeps its
            permissions) or a URL (``s3://bucket/run/step-1000.ckpt``, ``gs://...``, ``memory://...``: see
            :mod:`lightning_nvcomp.storage.remote`). It appears complete or not at all; a previous file there survives
            failures.
        codec: ``"ans"`` (nvCOMP gANS on the GPU: fastest, needs a GPU to load), ``"zstd"`` (GPU or CPU, loads
            anywhere), ``"none"`` (stored as is, with checksums), or ``"auto"`` (default): the codec with the shortest
            predicted save, from this directory's measured write bandwidth and the codecs measured on this state
            (see :mod:`lightning_nvcomp.auto.policy`; the first save to a file system probes it). A
            :class:`~lightning_nvcomp.options.Codec` or its name.
        options: the :class:`~lightning_nvcomp.options.SaveOptions` every entry point takes, of which ``save``
            uses ``codec`` and ``staging_mb`` (another field set is refused); a keyword argument given beside it
            overrides its field.
        staging_mb: MiB coded at once (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU); GPU scratch is
            about three times this.
        policy: the :class:`~lightning_nvcomp.auto.policy.CodecPolicy` behind ``"auto"`` (default: one per process); it
            probes a URL's storage with its own ``remote`` options (``CodecPolicy(remote=RemoteOptions(...))``).
        storage: how the file is written (default: :func:`~lightning_nvcomp.storage.backend.storage_for` the path:
            durably through the OS for a local path, through fsspec for a URL; pass
            ``storage_for(url, RemoteOptions(...))`` for other storage options).
        staging_nbytes: deprecated: ``staging_mb`` in bytes.
        base: an earlier checkpoint of the same run, in the same directory or a directory beside it: each record is
            stored as its difference from the same record there where that codes smaller (a *delta checkpoint*:
            loading it reads ``base`` too, which must then stay; see docs/guides/delta.md). A file that offers no
            base (not ours, elsewhere, written before 0.3) is ignored: the save is stored alone.

    Raises:
        ValueError, CodecUnavailableError: as :class:`~lightning_nvcomp.options.SaveOptions` (an unknown codec, a
            size that is not a positive number of MiB, a codec this machine cannot run), before anything is written.

    Compressed segments are written while the next ones are coded, so coding overlaps the write (at an ``s3://``
    URL: uploaded in parallel parts).
    """
    staging_mb = mb_of_nbytes("save", "staging_nbytes", staging_nbytes, staging_mb)
    options = SaveOptions.merged("save", options, uses=SAVE_OPTIONS, codec=codec, staging_mb=staging_mb)
    storage = storage or storage_for(path)
    directory = storage.target_directory(os.fspath(path))
    policy = policy or default_policy()
    against = offered(os.fspath(base), os.fspath(path), storage) if base is not None else None
    stats = save_file(obj, os.fspath(path), options.codec, policy, storage, directory, options.staging_nbytes, against)
    policy.observe_write(directory, stats.file_nbytes, stats.seconds)
    if stats.prediction is not None:  # auto chose: its model learns from what the save really did
        policy.observe_save(stats.codec, stats.raw_nbytes, stats.file_nbytes, stats.encode_s)
    return stats
