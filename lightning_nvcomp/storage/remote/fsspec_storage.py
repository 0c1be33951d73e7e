"""The remote :class:`~lightning_nvcomp.storage.backend.StorageBackend`: checkpoints at URLs, through fsspec
(:class:`FsspecStorage`). Importing this module imports fsspec (the ``remote`` extra)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any, BinaryIO, cast

import fsspec
from fsspec.core import url_to_fs

from lightning_nvcomp.errors import MissingExtraError
from lightning_nvcomp.storage.remote.errors import naming
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.storage.remote.ranges import RangeReader
from lightning_nvcomp.storage.remote.upload import Upload, open_upload

#: The extra that installs the fsspec implementation of each protocol (pyproject.toml); others need ``remote``.
EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
    "hdfs": "hdfs",
    "viewfs": "hdfs",
}


def protocol_of(url: str) -> str:
    """The protocol of ``url`` (``s3`` for ``s3://bucket/key``), lower case."""
    return url.split("://", 1)[0].lower()


class FsspecStorage:
    """Checkpoint files at URLs (``s3://bucket/run/last.ckpt``), written so that a file appears under its name only
    once complete and read with parallel ranged reads (see :mod:`lightning_nvcomp.storage.remote` for each backend's
    durability).

    Paths are URLs throughout (``s3://bucket/run``). Every error of the storage is a
    :class:`~lightning_nvcomp.storage.remote.errors.RemoteStorageError` (an ``OSError``: never damage) that names the URL
    and says what to do (credentials, the address of the storage), never a bare fsspec or botocore error.

    Args:
        fs: the fsspec file system.
        protocol: the URLs' protocol (``s3``, ``gs``, ``memory``...).
        options: part sizes, parallelism and the upload kind (:class:`RemoteOptions`).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, protocol: str, options: RemoteOptions) -> None:
        self.fs, self.protocol, self.options = fs, protocol, options

    @classmethod
    def for_url(cls, url: str, options: RemoteOptions) -> FsspecStorage:
        """The storage of ``url``'s file system, made with ``options.storage_options``.

        Raises:
            MissingExtraError: the protocol's fsspec implementation is not installed (it names the extra).
            ValueError: fsspec knows no such protocol.
        """
        protocol = protocol_of(url)
        try:
            fs, _ = url_to_fs(url, **dict(options.storage_options))
        except ImportError as err:
            raise MissingExtraError(EXTRAS.get(protocol, "remote"), f"{protocol}:// storage ({url})", err) from err
        except ValueError as err:
            raise ValueError(f"lightning_nvcomp cannot use {url}: {err}") from err
        return cls(fs, protocol, options)

    def _key(self, url: str | Any) -> str:
        return cast(str, self.fs._strip_protocol(str(url)))

    # -- writing ------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def upload(self, url: str) -> Iterator[Upload]:
        """A stream to write ``url`` through: committed (the file appears whole) when the block ends, aborted (no new
        file, the previous one kept) when it raises."""
        upload = open_upload(self.fs, self._key(url), self.protocol, self.options, str(url))
        try:
            yield upload
        except BaseException:
            upload.abort()
            raise
        try:
            upload.commit()
        except BaseException:
            upload.abort()
            raise

    def write(self, path: str, write: Callable[[BinaryIO], None]) -> int:
        """Write ``path`` through ``write(f)``; it appears complete or not at all. Returns its size in bytes."""
        with self.upload(path) as upload:
            write(cast(BinaryIO, upload))
            size = upload.tell()
        return size

    def rename(self, path: str, new_path: str) -> None:
        """Move ``path`` to ``new_path`` (a copy, then a delete, on object stores)."""
        with naming(path, "move"):
            self.fs.mv(self._key(path), self._key(new_path))
        self.fs.invalidate_cache(self._key(new_path))

    def remove(self, path: str) -> None:
        """Delete the file ``path``."""
        with naming(path, "remove"):
            self.fs.rm_file(self._key(path))
        self.fs.invalidate_cache(self._key(path))

    def discard(self, path: str) -> None:
        """Delete the file ``path`` (the store frees its data)."""
        self.remove(path)

    def makedirs(self, directory: str) -> None:
        """Create ``directory`` where the backend has directories (for S3: the bucket, if missing)."""
        with naming(directory, "create"):
            self.fs.makedirs(self._key(directory), exist_ok=True)

    # -- reading ------------------------------------------------------------------------------------------------

    def open_read(self, path: str) -> BinaryIO:
        """``path`` as a seekable file read by parallel ranged requests (:class:`RangeReader`)."""
        key = self._key(path)
        nbytes = self.size(path)

        def fetch(start: int, end: int) -> bytes:
            with naming(path, "read"):
                return cast(bytes, self.fs.cat_file(key, start=start, end=end))

        reader = RangeReader(fetch, nbytes, str(path), self.options.part_nbytes, self.options.max_parallel)
        return cast(BinaryIO, reader)

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(self._key(path))
        with naming(path, "look up"):
            return bool(self.fs.exists(self._key(path)))

    def isdir(self, path: str) -> bool:
        with naming(path, "look up"):
            return bool(self.fs.isdir(self._key(path)))

    def size(self, path: str) -> int:
        with naming(path, "look up"):
            return int(self.fs.size(self._key(path)))

    def listdir(self, directory: str) -> list[str]:
        """The names in ``directory`` (files and subdirectories), as the store lists them now."""
        key = self._key(directory).rstrip("/")
        self.fs.invalidate_cache(key)
        with naming(directory, "list"):
            listed = self.fs.ls(key, detail=False)
        return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in listed if p.rstrip("/") != key})

    # -- names and measurements ---------------------------------------------------------------------------------

    def parent(self, path: str) -> str:
        """The URL of the directory holding ``path``."""
        return str(path).rstrip("/").rsplit("/", 1)[0]

    def join(self, directory: str, name: str) -> str:
        return f"{str(directory).rstrip('/')}/{name}"

    def target_directory(self, path: str) -> str:
        """The directory a file at ``path`` goes in (object stores need none to exist)."""
        return self.parent(path)

    def free_nbytes(self, directory: str) -> int | None:
        """Unknown for remote storage: None (a probe is bounded by the checkpoint's size only)."""
        return None

    def bandwidth_key(self, directory: str) -> Hashable:
        """What shares one write bandwidth: the protocol and the bucket (or host) of ``directory``."""
        return (self.protocol, self._key(directory).lstrip("/").split("/", 1)[0])
