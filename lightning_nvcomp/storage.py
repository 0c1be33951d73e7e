"""Durable file writes: a checkpoint appears under its final name complete, or not at all."""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable


class Storage:
    """Writes checkpoint files durably through the operating system (local disks, network file systems).

    Subclasses change how bytes reach the file by overriding :meth:`wrap`.
    """

    def write(self, path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> int:
        """Atomically write ``path`` through ``write(f)`` (see :func:`atomic_write`); returns the size in bytes."""
        return atomic_write(path, lambda f: write(self.wrap(f)))

    def wrap(self, f: BinaryIO) -> BinaryIO:
        """The file object ``write`` gets; the default is the file itself."""
        return f


class ThrottledStorage(Storage):
    """Storage whose writes are held to ``mb_per_s`` (10^6 bytes/s): a stand-in for slow or shared storage, to
    test and benchmark how the codec choice reacts to bandwidth. Real files, really slowed down.

    Args:
        mb_per_s: the write rate to hold to.
    """

    def __init__(self, mb_per_s: float) -> None:
        if mb_per_s <= 0:
            raise ValueError(f"mb_per_s must be positive, not {mb_per_s}")
        self.bytes_per_s = mb_per_s * 1e6

    def wrap(self, f: BinaryIO) -> BinaryIO:
        return _ThrottledFile(f, self.bytes_per_s)


class _ThrottledFile:
    def __init__(self, f: BinaryIO, bytes_per_s: float) -> None:
        self._f, self._rate = f, bytes_per_s
        self._begin, self._written = time.perf_counter(), 0

    def write(self, data) -> int:
        written = self._f.write(data)
        self._written += memoryview(data).nbytes
        ahead = self._written / self._rate - (time.perf_counter() - self._begin)
        if ahead > 0:
            time.sleep(ahead)
        return written

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def target_directory(path: str | os.PathLike) -> str:
    """The directory a file at ``path`` goes in; FileNotFoundError naming both if it does not exist."""
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {os.fspath(path)}: directory {directory} does not exist")
    return directory


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
    directory = target_directory(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        # Mode 0o666 filtered by the umask, like any file open() creates (mkstemp would make it owner-only).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as err:
        raise OSError(err.errno, f"cannot save {path}: {err.strerror} (directory {directory})") from None
    old = None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        old = _keep_for_discard(path)
        os.replace(tmp, path)
    except BaseException as err:
        for leftover in filter(None, (tmp, old)):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        cause = _os_error(err)  # torch.save wraps a failed write (disk full, quota) in a RuntimeError
        if cause is not None:
            raise OSError(cause.errno, f"cannot save {path}: {cause.strerror}; any previous file there is intact") from err
        raise
    fsync_path(directory)
    if old is not None:
        _discard_later(old)
    return size


def discard(path: str | os.PathLike) -> None:
    """Remove the file ``path``: its name is gone when this returns, its data is freed on a background thread."""
    path = os.fspath(path)
    trash = _trash_name(path)
    os.rename(path, trash)
    _discard_later(trash)


def wait_for_discards() -> None:
    """Wait until the files :func:`discard` and :func:`atomic_write` handed to the background are removed."""
    _deleter().submit(lambda: None).result()


# Freeing a multi-GB file (its blocks, its pages in the page cache) takes the kernel ~0.3 s per GB on a local disk.
# A save that replaces a checkpoint, or a pruned checkpoint, need not wait for it: the old file gets a second, hidden
# name and is unlinked on a background thread. Names left behind by a process that died first are removed by the
# next save into the same directory.
_TRASH = ".lnv-old"


def _trash_name(path: str) -> str:
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(4)}{_TRASH}")


def _keep_for_discard(path: str) -> str | None:
    """Give the file at ``path`` (if any) a second name to free it by after ``path`` is replaced."""
    for stale in glob.glob(os.path.join(glob.escape(os.path.dirname(path)), f".*{_TRASH}")):
        _discard_later(stale)
    if not os.path.isfile(path):
        return None
    trash = _trash_name(path)
    try:
        os.link(path, trash)
    except OSError:  # no hard links on this file system: the replace frees the old file itself
        return None
    return trash


def _discard_later(path: str) -> None:
    _deleter().submit(_unlink, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # a stale name another save removed first
        pass


@functools.cache
def _deleter() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-discard")


def _os_error(err: BaseException | None) -> OSError | None:
    """The first OSError with an errno in ``err``'s chain of causes, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name (a rename is durable only once its directory entry is on disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
