"""What a checkpoint is written to and read from: the :class:`StorageBackend` protocol every save, load, probe and
integration writes and reads through, and how a path is told apart from a URL and turned into its directory.

Two implementations: :class:`lightning_nvcomp.storage.local.Storage` for local paths (durable: a temporary name, fsync,
rename, directory fsync; see :mod:`lightning_nvcomp.storage.local`), and
:class:`lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage` for URLs (``s3://``, ``gs://``, ``abfs://``,
``hdfs://``, ``memory://``...; see :mod:`lightning_nvcomp.storage.remote` for each backend's durability), which needs the
``remote`` extra. The core imports without fsspec: it is imported when a URL is first used.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Callable, Hashable
from typing import BinaryIO, Protocol

#: A path that starts with a URL scheme (``s3://``, ``gs://``, ``memory://``, ``file://``...): not a local path.
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: The same after pathlib collapsed the double slash (``Path("s3://b/k")`` is ``s3:/b/k``); a scheme of at least
#: two letters, so that Windows drive letters do not match.
COLLAPSED_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/(?!/)")


class StorageBackend(Protocol):
    """What a checkpoint is written to and read from. Paths are strings (or path-likes, for local storage): local
    paths for :class:`~lightning_nvcomp.storage.local.Storage`, URLs for
    :class:`~lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage`."""

    def write(self, path: str, write: Callable[[BinaryIO], None]) -> int:
        """Write the file ``path`` through ``write(f)``: it appears under its name complete or not at all, and a
        previous file there is intact if anything fails. Returns the size in bytes."""
        ...

    def open_read(self, path: str) -> BinaryIO:
        """``path`` opened for reading: a seekable binary file (a context manager)."""
        ...

    def exists(self, path: str) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """The size of the file ``path`` in bytes (FileNotFoundError if there is none)."""
        ...

    def remove(self, path: str) -> None:
        """Delete the file ``path`` now."""
        ...

    def discard(self, path: str) -> None:
        """Delete the file ``path``: its name is gone when this returns (its data may be freed later)."""
        ...

    def listdir(self, directory: str) -> list[str]:
        """The names of the entries of ``directory``."""
        ...

    def makedirs(self, directory: str) -> None:
        """Create ``directory`` and its parents where they are missing."""
        ...

    def parent(self, path: str) -> str:
        """The directory holding ``path``."""
        ...

    def join(self, directory: str, name: str) -> str:
        """The path of ``name`` in ``directory``."""
        ...

    def target_directory(self, path: str) -> str:
        """The directory a file at ``path`` goes in; FileNotFoundError where it must exist and does not."""
        ...

    def free_nbytes(self, directory: str) -> int | None:
        """Free bytes where ``directory`` is (None where unknown)."""
        ...

    def bandwidth_key(self, directory: str) -> Hashable:
        """What identifies the storage whose write bandwidth ``directory`` shares (a file system, a bucket)."""
        ...


def absolute_path(path: str | os.PathLike) -> str:
    """The local ``path`` (a bare file name, a relative path, a ``pathlib`` path) as an absolute path string, made
    against the working directory now, as ``pathlib.Path.absolute`` makes it: a ``..`` is left for the operating
    system to resolve (after a symbolic link it leads elsewhere than the text says). Work finished later, on another
    thread (a rename, a flush), goes where the save was asked to go even if the working directory changes."""
    return os.path.join(os.getcwd(), os.fsdecode(os.fspath(path)))


def parent_directory(path: str | os.PathLike) -> str:
    """The directory holding the local file ``path``, absolute (see :func:`absolute_path`); a bare file name's is the
    working directory. Every local write, probe and flush finds a file's directory here
    (:meth:`StorageBackend.parent` of the local storage)."""
    return os.path.dirname(absolute_path(path))


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, (str, os.PathLike)) and bool(URL.match(os.fsdecode(os.fspath(path))))


def check_local(path: str | os.PathLike) -> str:
    """``path`` as a string, if it is a local path (or one of a mounted file system); else ValueError naming it.

    The local storage (:mod:`lightning_nvcomp.storage.local`, :mod:`lightning_nvcomp.storage.discards`) writes
    through the operating system, so a URL (``s3://bucket/run``, ``gs://...``, ``memory://...``, even ``file://...``)
    is refused at once: written through the OS it would silently create a local directory named ``s3:`` in the
    working directory (lost with an ephemeral node). URLs go through :func:`lightning_nvcomp.storage.storage_for`
    instead, which every save and load uses. A ``pathlib`` path made from a URL (which reads ``s3:/bucket/run``) is
    refused too.
    """
    text = os.fsdecode(os.fspath(path))
    if URL.match(text) or (isinstance(path, pathlib.PurePath) and COLLAPSED_URL.match(text)):
        raise ValueError(
            f"lightning_nvcomp cannot write {text} as a local file: it is a remote URL, so nothing was written (not "
            "even locally); URLs are written through their fsspec storage (lightning_nvcomp.storage.storage_for)"
        )
    return text
