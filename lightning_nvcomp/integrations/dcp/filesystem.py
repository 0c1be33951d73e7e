"""DCP's ``FileSystemBase`` over a remote :class:`~lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage`
(:class:`StorageFileSystem`), and :class:`OnStorage`, which gives the writer and the reader the file system of their
checkpoint path: torch's own local ``FileSystem`` for a local path (unchanged), ours for a URL.

At a URL, every data file is one upload (an S3 multipart upload in parallel parts, streamed while the next items
are coded), so a data file appears whole or not at all, and ``.metadata`` is written last, in one put: a checkpoint
whose save failed on any rank has no new ``.metadata`` and the previous one stays loadable. Reads are parallel
ranged reads (:class:`~lightning_nvcomp.storage.remote.ranges.RangeReader`), so the reader's 64 MiB windows arrive in
parallel parts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, cast

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemBase

from lightning_nvcomp.storage import StorageBackend, is_url, storage_for
from lightning_nvcomp.storage.remote.options import RemoteOptions


class StorageFileSystem(FileSystemBase):
    """DCP's file system interface over remote storage (paths are URL strings).

    Args:
        storage: the remote storage (an :class:`~lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage`).
    """

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        """``"wb"``: an upload, committed when the block ends and aborted when it raises; ``"rb"``: a ranged reader."""
        if "w" in mode:
            with self.storage.upload(os.fspath(path)) as upload:
                yield upload
        else:
            with self.storage.open_read(os.fspath(path)) as stream:
                yield stream

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return cast(str, self.storage.join(os.fspath(path), suffix))

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        self.storage.rename(os.fspath(path), os.fspath(new_path))

    def init_path(self, path: str | os.PathLike) -> str:
        return os.fspath(path)

    def mkdir(self, path: str | os.PathLike) -> None:
        self.storage.makedirs(os.fspath(path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return is_url(checkpoint_id)

    def exists(self, path: str | os.PathLike) -> bool:
        return bool(self.storage.exists(os.fspath(path)))

    def rm_file(self, path: str | os.PathLike) -> None:
        self.storage.remove(os.fspath(path))


class OnStorage:
    """What the writer and the reader share: the storage of their checkpoint path (:attr:`storage`) and DCP's file
    system over it (``fs``), chosen again whenever the path changes (``reset(checkpoint_id)``)."""

    fs: Any
    path: Any
    #: The checkpoint's storage: the durable local one, or the remote one of a URL.
    storage: StorageBackend
    #: Whether the checkpoint is at a URL.
    remote_path: bool

    def _use_storage(self, path: str | os.PathLike, remote: RemoteOptions | None) -> None:
        """Point ``fs``, ``path`` and ``storage`` at ``path``'s storage (a URL: ours; a local path: torch's)."""
        self.storage = storage_for(path, remote)
        self.remote_path = is_url(path)
        self.fs = StorageFileSystem(self.storage) if self.remote_path else FileSystem()
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """A URL (remote storage) or what torch's ``FileSystem`` takes (a local path)."""
        return is_url(checkpoint_id) or FileSystem.validate_checkpoint_id(checkpoint_id)
