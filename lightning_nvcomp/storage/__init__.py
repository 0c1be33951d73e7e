"""Where checkpoints are written and read: the :class:`~.backend.StorageBackend` protocol (:mod:`.backend`), local
files written durably (:mod:`.local`: a temporary name, fsync, rename; :mod:`.temp_names`; :mod:`.discards`: old
files freed in the background; :mod:`.throttled`), URLs through fsspec (:mod:`.remote`), and :func:`storage_for`,
which gives the backend of a path.
"""

from __future__ import annotations

import os
import pathlib

from lightning_nvcomp.errors import MissingExtraError
from lightning_nvcomp.storage.backend import (
    COLLAPSED_URL,
    URL,
    StorageBackend,
    absolute_path,
    is_url,
    parent_directory,
)
from lightning_nvcomp.storage.local import Storage
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.storage.throttled import ThrottledStorage

__all__ = [
    "RemoteOptions",
    "Storage",
    "StorageBackend",
    "ThrottledStorage",
    "absolute_path",
    "is_url",
    "parent_directory",
    "storage_for",
]


def storage_for(
    path: str | os.PathLike, remote: RemoteOptions | None = None, local: StorageBackend | None = None
) -> StorageBackend:
    """The storage of ``path``: ``local`` (default: the durable local :class:`~lightning_nvcomp.storage.local.Storage`)
    for a local path, an :class:`~lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage` made with ``remote``
    (default :class:`~lightning_nvcomp.storage.remote.RemoteOptions`) for a URL.

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
        return local if local is not None else Storage()
    try:
        from lightning_nvcomp.storage.remote.fsspec_storage import FsspecStorage
    except ImportError as err:
        raise MissingExtraError("remote", f"remote storage ({text})", err) from err
    return FsspecStorage.for_url(text, remote or RemoteOptions())
