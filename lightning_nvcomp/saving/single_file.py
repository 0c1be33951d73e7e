"""The public save: the codec chosen (``auto`` asks the policy), the object coded into the archive while a disk
thread writes it, atomically and durably, to a local path or a URL (:func:`save`); :func:`write_snapshot` writes a
snapshot taken earlier."""

from __future__ import annotations

import os
import time
from typing import BinaryIO, Callable

import torch

from lightning_nvcomp._process import collector_paused, shared
from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.format.contents import Contents, find_contents
from lightning_nvcomp.format.sink import ArchiveSink
from lightning_nvcomp.format.writer import Snapshot, snapshot
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.options import Codec, SaveOptions, mb_of_nbytes
from lightning_nvcomp.storage import StorageBackend, storage_for
from lightning_nvcomp.telemetry.stats import SaveStats

#: The :class:`~lightning_nvcomp.options.SaveOptions` fields :func:`save` acts on.
SAVE_OPTIONS = ("codec", "staging_mb")


def resolve_codec(
    codec: Codec, tensors: list[torch.Tensor], directory: str, policy: CodecPolicy | None = None
) -> tuple[Codec, Prediction | None]:
    """The codec a save uses. ``auto`` asks ``policy`` (default: this process's :func:`default_policy`), which
    measures the storage and the codecs and predicts the fastest save."""
    if codec is not Codec.AUTO:
        return codec, None
    chosen, _ = (policy or default_policy()).decide(tensors, directory)
    return chosen.codec, chosen


def default_policy() -> CodecPolicy:
    """The policy ``codec="auto"`` uses when none is given: sync mode, measurements cached for the process."""
    return shared("policy", CodecPolicy)


def _stream(f: BinaryIO, obj: object, codec: str, contents: Contents, staging_nbytes: int | None) -> Snapshot:
    """Code ``obj`` into the archive ``f``, each segment written (on a disk thread) while the next is coded."""
    writer = ArchiveWriter(f)
    with ArchiveSink(writer) as sink:
        snap = snapshot(obj, codec, contents, staging_nbytes=staging_nbytes, sink=sink)
    snap.write_to(writer)
    return snap


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
    stats = save_file(obj, path, options.codec, policy, storage.write, directory, options.staging_nbytes)
    (policy or default_policy()).observe_write(directory, stats.file_nbytes, stats.seconds)
    if stats.prediction is not None:  # auto chose: its model learns from what the save really did
        (policy or default_policy()).observe_save(stats.codec, stats.raw_nbytes, stats.file_nbytes, stats.encode_s)
    return stats


@collector_paused()
def save_file(
    obj: object,
    path: str | os.PathLike,
    codec: Codec,
    policy: CodecPolicy | None,
    write: Callable[[str, Callable[[BinaryIO], None]], int],
    directory: str,
    staging_nbytes: int | None = None,
) -> SaveStats:
    """:func:`save` through ``write(path, fill)`` (a storage's ``write``, or ``write_staged`` and its size), into
    ``directory``, with no write bandwidth learnt: what the save did. The garbage collector is paused meanwhile
    (see :func:`~lightning_nvcomp._process.collector_paused`)."""
    contents = find_contents(obj)
    codec, prediction = resolve_codec(codec, contents.tensors, directory, policy)
    begin = time.perf_counter()
    snaps: list[Snapshot] = []
    size = write(os.fspath(path), lambda f: snaps.append(_stream(f, obj, codec.value, contents, staging_nbytes)))
    seconds = time.perf_counter() - begin
    encode_s = snaps[0].encode_s
    return SaveStats(os.fspath(path), codec, snaps[0].raw_nbytes, size, encode_s, seconds - encode_s, prediction)


def write_snapshot(
    snap: Snapshot,
    path: str | os.PathLike,
    storage: StorageBackend | None = None,
    prediction: Prediction | None = None,
) -> SaveStats:
    """Write a snapshot taken earlier (an async save's) to ``path`` (local or a URL), atomically and durably; what
    the save did."""
    begin = time.perf_counter()
    size = (storage or storage_for(path)).write(os.fspath(path), lambda f: snap.write_to(ArchiveWriter(f)))
    return SaveStats(
        os.fspath(path),
        Codec(snap.codec),
        snap.raw_nbytes,
        size,
        snap.encode_s,
        time.perf_counter() - begin,
        prediction,
    )
