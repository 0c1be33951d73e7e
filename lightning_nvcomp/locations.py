"""Where a checkpoint goes: the :class:`StorageBackend` protocol every save, load, probe and integration writes and
reads through, and :func:`storage_for`, which gives the backend of a path.

Two implementations: :class:`lightning_nvcomp.storage.Storage` for local paths (durable: a temporary name, fsync,
rename, directory fsync; see :mod:`lightning_nvcomp.storage`), and
:class:`lightning_nvcomp.remote.fsspec_storage.FsspecStorage` for URLs (``s3://``, ``gs://``, ``abfs://``,
``hdfs://``, ``memory://``...; see :mod:`lightning_nvcomp.remote` for each backend's durability), which needs the
``remote`` extra. The core imports without fsspec: it is imported when a URL is first used.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, BinaryIO, Protocol

from lightning_nvcomp.integrations._require import MissingExtraError

if TYPE_CHECKING:
    from lightning_nvcomp.remote.options import RemoteOptions

#: A path that starts with a URL scheme (``s3://``, ``gs://``, ``memory://``, ``file://``...): not a local path.
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: The same after pathlib collapsed the double slash (``Path("s3://b/k")`` is ``s3:/b/k``); a scheme of at least
#: two letters, so that Windows drive letters do not match.
COLLAPSED_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/(?!/)")


class StorageBackend(Protocol):
    """What a checkpoint is written to and read from. Paths are strings (or path-likes, for local storage): local
    paths for :class:`~lightning_nvcomp.storage.Storage`, URLs for
    :class:`~lightning_nvcomp.remote.fsspec_storage.FsspecStorage`."""

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


def storage_for(
    path: str | os.PathLike, remote: RemoteOptions | None = None, local: StorageBackend | None = None
) -> StorageBackend:
    """The storage of ``path``: ``local`` (default: the durable local :class:`~lightning_nvcomp.storage.Storage`)
    for a local path, an :class:`~lightning_nvcomp.remote.fsspec_storage.FsspecStorage` made with ``remote``
    (default :class:`~lightning_nvcomp.remote.RemoteOptions`) for a URL.

    Args:
        path: a local path or a URL (``s3://bucket/run/last.ckpt``).
        remote: how URLs are reached (fsspec storage options, part size, parallelism).
        local: the storage of local paths (e.g. a :class:`~lightning_nvcomp.storage.ThrottledStorage`).

    Raises:
        ValueError: ``path`` is a ``pathlib`` path made from a URL (pathlib collapses ``s3://b/k`` to ``s3:/b/k``:
            pass the URL as a string), or a URL of a protocol fsspec does not know.
        MissingExtraError: a URL, and fsspec (or the protocol's implementation) is not installed; it names the
            extra to install.
    """
    text = os.fsdecode(os.fspath(path))
    if not URL.match(text):
        if isinstance(path, pathlib.PurePath) and COLLAPSED_URL.match(text):
            raise ValueError(
                f"lightning_nvcomp cannot use {text}: a pathlib path made from a URL (pathlib turns s3://b/k into "
                "s3:/b/k); pass the URL as a string. Nothing was written."
            )
        if local is not None:
            return local
        from lightning_nvcomp.storage import Storage

        return Storage()
    from lightning_nvcomp.remote.options import RemoteOptions

    try:
        from lightning_nvcomp.remote.fsspec_storage import FsspecStorage
    except ImportError as err:
        raise MissingExtraError("remote", f"remote storage ({text})", err) from err
    return FsspecStorage.for_url(text, remote or RemoteOptions())
