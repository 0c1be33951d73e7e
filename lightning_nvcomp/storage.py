"""Durable file writes: a checkpoint appears under its final name complete, or not at all."""

from __future__ import annotations

import os
import secrets
from typing import BinaryIO, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> int:
    """Write a file through ``write(f)`` into a temporary name beside ``path``, fsync it, rename it over
    ``path`` and fsync the directory. Returns the file's size in bytes.

    If anything fails (or the process dies) before the rename, no file exists under ``path`` that was not
    there before and a previous file at ``path`` is untouched; the temporary file is removed on errors.

    Raises:
        FileNotFoundError: the directory does not exist.
        OSError: the write failed (permissions, disk full, ...); the message names ``path``.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {path}: directory {directory} does not exist")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        # Mode 0o666 filtered by the umask, like any file open() creates (mkstemp would make it owner-only).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as err:
        raise OSError(err.errno, f"cannot save {path}: {err.strerror} (directory {directory})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        cause = _os_error(err)  # torch.save wraps a failed write (disk full, quota) in a RuntimeError
        if cause is not None:
            raise OSError(cause.errno, f"cannot save {path}: {cause.strerror}; any previous file there is intact") from err
        raise
    _fsync_directory(directory)
    return size


def _os_error(err: BaseException | None) -> OSError | None:
    """The first OSError with an errno in ``err``'s chain of causes, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _fsync_directory(directory: str) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
