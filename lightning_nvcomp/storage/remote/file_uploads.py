"""The uploads written through a file first: :class:`RenameUpload` streams the file to a hidden temporary name beside
its target and renames it over the target once complete (file systems with an atomic rename: ``hdfs://``,
``file://``); :class:`SpooledPut` spools it to a local temporary file, then uploads it with one ``put_file`` that
the store makes visible only once complete (``gs://``, ``abfs://``, ``memory://``...). A failure before that last
request leaves no new file; a last request without an answer raises
:class:`~lightning_nvcomp.storage.remote.errors.OutcomeUnknownError` (neither store can be asked what it did).
"""

from __future__ import annotations

import contextlib
import tempfile
from typing import Any

from lightning_nvcomp.storage.remote.errors import INTACT, last_request_failed, naming
from lightning_nvcomp.storage.temp_names import own_name


class _ThroughFile:
    """An upload whose bytes are written to a file first (``_file``): a temporary object, or a local spool."""

    _file: Any

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()


class RenameUpload(_ThroughFile):
    """A file streamed to a hidden temporary name beside ``key`` (``.NAME.lnv-<host>-<pid>-<token>.tmp``, as local
    saves name theirs), renamed over ``key`` once complete (atomic on HDFS and local file systems).

    Args:
        fs: an fsspec file system with an atomic ``mv``.
        key: the file's path in ``fs``.
        name: the file's URL, for messages.
    """

    def __init__(self, fs: Any, key: str, name: str) -> None:
        self._fs, self._key, self._name = fs, key, name
        parent, _, base = key.rpartition("/")
        self._tmp = f"{parent}/{own_name(base, '.tmp')}"
        with naming(name, "save", INTACT):
            self._file = fs.open(self._tmp, "wb")

    def write(self, data: Any) -> int:
        with naming(self._name, "save", INTACT):
            return super().write(data)

    def flush(self) -> None:
        with naming(self._name, "save", INTACT):
            super().flush()

    def commit(self) -> None:
        with naming(self._name, "save", INTACT):
            self._file.close()
        try:
            self._fs.mv(self._tmp, self._key)
        except Exception as err:
            raise last_request_failed(err, self._name, "the rename") from err
        self._fs.invalidate_cache(self._key)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(Exception):
            self._fs.rm_file(self._tmp)


class SpooledPut(_ThroughFile):
    """A file spooled to a local temporary file (in ``TMPDIR``) while it is written, then uploaded with one
    ``put_file``: the store makes it visible once the upload is complete.

    Args:
        fs: an fsspec file system.
        key: the file's path in ``fs``.
        name: the file's URL, for messages.
    """

    def __init__(self, fs: Any, key: str, name: str) -> None:
        self._fs, self._key, self._name = fs, key, name
        self._file = tempfile.NamedTemporaryFile(prefix="lightning-nvcomp-", suffix=".upload")

    def commit(self) -> None:
        try:
            self._file.flush()
            try:
                self._fs.put_file(self._file.name, self._key)
            except Exception as err:
                raise last_request_failed(err, self._name, "the upload") from err
        finally:
            self._file.close()
        self._fs.invalidate_cache(self._key)

    def abort(self) -> None:
        self._file.close()
