"""How a save's file is finished once its bytes are written: durability strategies
(:class:`~lightning_nvcomp.options.Durability`), as the save path (:mod:`.single_file`) and the DCP data files use
them.

:data:`IN_WRITE`: the file is as durable as its storage makes it when the write returns: flushed to the disk
(``sync``), left to the page cache by a storage that does not flush (``os``), a completed upload (remote storage).
:data:`BEHIND`: ``background``: the file is under its name when the write returns, its flush is left to the writer
thread (see :meth:`~lightning_nvcomp.storage.local.StagedWrite.publish`).
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable, NamedTuple

from lightning_nvcomp.options import Durability
from lightning_nvcomp.storage import StorageBackend
from lightning_nvcomp.storage.local import Storage


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
