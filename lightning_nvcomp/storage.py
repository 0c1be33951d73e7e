"""Durable file writes: a checkpoint appears under its final name complete, or not at all.

A write goes to a temporary name beside the file's final place, and a file being replaced or discarded keeps a
second name until a background thread has freed it (:mod:`lightning_nvcomp.temp_names`: the names, and which of
them a process that died left). The writer holds an exclusive ``flock`` on its temporary file while it writes.
Every save sweeps its directory of the names a dead process left (:func:`lightning_nvcomp.temp_names.stale_files`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable, NoReturn, cast

from lightning_nvcomp.locations import COLLAPSED_URL, URL
from lightning_nvcomp.resources import shared
from lightning_nvcomp.temp_names import TMP_SUFFIX, own_name, stale_files, trash_name

try:
    import fcntl
except ImportError:  # Windows: no flock, and os.kill(pid, 0) is no liveness test there: nothing is swept
    fcntl = None  # type: ignore[assignment]


def check_local(path: str | os.PathLike) -> str:
    """``path`` as a string, if it is a local path (or one of a mounted file system); else ValueError naming it.

    The functions of this module write through the operating system, so a URL (``s3://bucket/run``, ``gs://...``,
    ``memory://...``, even ``file://...``) is refused at once: written through the OS it would silently create a
    local directory named ``s3:`` in the working directory (lost with an ephemeral node). URLs go through
    :func:`lightning_nvcomp.locations.storage_for` instead, which every save and load uses. A ``pathlib`` path made
    from a URL (which reads ``s3:/bucket/run``) is refused too.
    """
    text = os.fsdecode(os.fspath(path))
    if URL.match(text) or (isinstance(path, pathlib.PurePath) and COLLAPSED_URL.match(text)):
        raise ValueError(
            f"lightning_nvcomp cannot write {text} as a local file: it is a remote URL, so nothing was written (not "
            "even locally); URLs are written through their fsspec storage (lightning_nvcomp.locations.storage_for)"
        )
    return text


class Storage:
    """The local :class:`~lightning_nvcomp.locations.StorageBackend`: checkpoint files written durably through the
    operating system (local disks, network file systems): see :func:`atomic_write`.

    Subclasses change how bytes reach the file by overriding :meth:`wrap`.

    Args:
        fsync: flush each file (and its directory) to the disk before it counts as written; False leaves that to
            the page cache, as ``torch.save`` does (:class:`~lightning_nvcomp.options.Durability` ``os``).
    """

    fsync: bool = True  # (a class default too: subclasses need not call __init__)

    def __init__(self, fsync: bool = True) -> None:
        self.fsync = fsync

    def write(self, path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> int:
        """Atomically write ``path`` through ``write(f)`` (see :func:`atomic_write`); returns the size in bytes."""
        return atomic_write(path, lambda f: write(self.wrap(f)), self.fsync)

    def write_staged(self, path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> StagedWrite:
        """Write ``path``'s bytes through ``write(f)`` under a temporary name, not yet fsynced nor under its name
        (see :func:`stage_write`): its :meth:`~StagedWrite.commit` finishes the write later."""
        return stage_write(path, lambda f: write(self.wrap(f)))

    def wrap(self, f: BinaryIO) -> BinaryIO:
        """The file object ``write`` gets; the default is the file itself."""
        return f

    def open_read(self, path: str | os.PathLike) -> BinaryIO:
        return open(check_local(path), "rb")

    def exists(self, path: str | os.PathLike) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str | os.PathLike) -> bool:
        return os.path.isdir(path)

    def size(self, path: str | os.PathLike) -> int:
        return os.path.getsize(path)

    def remove(self, path: str | os.PathLike) -> None:
        os.unlink(path)

    def discard(self, path: str | os.PathLike) -> None:
        """Remove ``path``, its data freed on a background thread (:func:`discard`)."""
        discard(path)

    def listdir(self, directory: str | os.PathLike) -> list[str]:
        return os.listdir(directory)

    def makedirs(self, directory: str | os.PathLike) -> None:
        os.makedirs(check_local(directory), exist_ok=True)

    def parent(self, path: str | os.PathLike) -> str:
        return os.path.dirname(os.path.abspath(path))

    def join(self, directory: str | os.PathLike, name: str) -> str:
        return os.path.join(directory, name)

    def target_directory(self, path: str | os.PathLike) -> str:
        return target_directory(path)

    def free_nbytes(self, directory: str | os.PathLike) -> int | None:
        """The bytes free for an unprivileged writer where ``directory`` is (None where statvfs is missing or
        fails)."""
        try:
            st = os.statvfs(directory)
        except (AttributeError, OSError):  # no statvfs (Windows), or it failed
            return None
        return st.f_bavail * st.f_frsize

    def bandwidth_key(self, directory: str | os.PathLike) -> Hashable:
        """The file system holding ``directory`` (its ``st_dev``)."""
        return os.stat(directory).st_dev


class ThrottledStorage(Storage):
    """Storage whose writes are held to ``bytes_per_s``: a stand-in for slow or shared storage, to test and
    benchmark how the codec choice reacts to bandwidth. Real files, really slowed down.

    Args:
        bytes_per_s: the write rate to hold to (bytes per second: every size in this package is in bytes).
        fsync: as for :class:`Storage`.
    """

    def __init__(self, bytes_per_s: float, fsync: bool = True) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be positive, not {bytes_per_s}")
        super().__init__(fsync)
        self.bytes_per_s = bytes_per_s

    def wrap(self, f: BinaryIO) -> BinaryIO:
        return cast(BinaryIO, _ThrottledFile(f, self.bytes_per_s))


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
    """The directory a file at ``path`` goes in; ValueError for a URL (:func:`check_local`), FileNotFoundError
    naming both if the directory does not exist."""
    path = check_local(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save {path}: directory {directory} does not exist")
    return directory


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], fsync: bool = True) -> int:
    """Write a file through ``write(f)`` into a temporary name beside ``path``, fsync it, rename it over
    ``path`` and fsync the directory (with ``fsync=False``: rename it only, as ``torch.save`` would leave it to
    the page cache). Returns the file's size in bytes. :func:`stage_write` then :meth:`StagedWrite.commit`.

    If anything fails (or the process dies) before the rename, no file exists under ``path`` that was not
    there before and a previous file at ``path`` is untouched; the temporary file is removed on errors (or, after
    a crash, by the next save into the directory: see the module docstring).

    As ``torch.save`` (which rewrites the file in place): a replaced file's permission bits (and, where allowed,
    its owner and group) are kept, a new file gets ``0o666`` less the umask; if ``path`` is a symbolic link (or a
    chain of them, or one whose target does not exist yet) the file it points to is written and the link stays.

    Raises:
        ValueError: ``path`` is a URL (see :func:`check_local`); nothing is written.
        FileNotFoundError: the directory does not exist.
        OSError: the write failed (permissions, disk full, ...); the message names ``path``.
    """
    staged = stage_write(path, write)
    staged.commit(fsync)
    return staged.size


def stage_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> StagedWrite:
    """The first half of :func:`atomic_write`: the file written through ``write(f)`` under its temporary name and
    flushed to the operating system (not to the disk), still open and locked; nothing is under ``path`` yet.
    :meth:`StagedWrite.commit` puts it there, :meth:`StagedWrite.abandon` removes it. Raises as atomic_write."""
    path = check_local(path)
    final = _link_target(path)
    directory = target_directory(final)
    _sweep(directory)
    tmp = os.path.join(directory, own_name(os.path.basename(final), TMP_SUFFIX))
    try:
        # Mode 0o666 filtered by the umask, like any file open() creates (mkstemp would make it owner-only).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as err:
        raise OSError(err.errno, f"cannot save {path}: {err.strerror} (directory {directory})") from None
    f = os.fdopen(fd, "wb")
    try:
        if fcntl is not None:  # ours while we write: a sweep of another process leaves it alone
            with contextlib.suppress(OSError):  # no locks here (ENOLCK): the sweep skips unlockable files
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        _keep_mode(f.fileno(), final)
        write(f)
        f.flush()
        return StagedWrite(path, final, tmp, f, f.tell())
    except BaseException as err:
        f.close()
        _failed(path, err, tmp)


class StagedWrite:
    """A file :func:`stage_write` wrote under a temporary name beside its final place, not yet under its name.

    Args:
        path: the name it is saved as; final: the file that name leads to (the end of its symbolic links);
        tmp: the temporary name; f: the open, locked temporary file; size: its size in bytes.
    """

    def __init__(self, path: str, final: str, tmp: str, f: BinaryIO, size: int) -> None:
        self.path, self.size = path, size
        self._final, self._tmp, self._f = final, tmp, f

    def commit(self, fsync: bool = True) -> None:
        """Put the file under its name: fsync it (with ``fsync``), rename it over a previous file there, fsync the
        directory (with ``fsync``). A failure removes it, names the path, and leaves a previous file intact."""
        old = None
        try:
            with self._f:
                if fsync:
                    os.fsync(self._f.fileno())
            old = _keep_for_discard(self._final)
            os.replace(self._tmp, self._final)
        except BaseException as err:
            _failed(self.path, err, self._tmp, old)
        if fsync:
            fsync_path(os.path.dirname(self._final))
        if old is not None:
            _discard_later(old)

    def abandon(self) -> None:
        """Remove the temporary file: nothing is saved."""
        self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)


def _failed(path: str, err: BaseException, *leftovers: str | None) -> NoReturn:
    """Remove a failed save's ``leftovers`` and raise: an OSError naming ``path`` for a failed write."""
    for leftover in filter(None, leftovers):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    cause = _os_error(err)  # torch.save wraps a failed write (disk full, quota) in a RuntimeError
    if cause is not None:
        raise OSError(cause.errno, f"cannot save {path}: {cause.strerror}; any previous file there is intact") from err
    raise err


def discard(path: str | os.PathLike) -> None:
    """Remove the file ``path``: its name is gone when this returns, its data is freed on a background thread.
    ValueError for a URL (:func:`check_local`)."""
    path = check_local(path)
    trash = trash_name(path)
    os.rename(path, trash)
    _discard_later(trash)


def wait_for_discards() -> None:
    """Wait until the files :func:`discard` and :func:`atomic_write` handed to the background are removed."""
    _deleter().submit(lambda: None).result()


def _link_target(path: str) -> str:
    """The file a write of ``path`` goes to: ``path`` itself, or the end of the chain of symbolic links it starts
    (the file need not exist: a dangling link's target is created, as ``open`` does)."""
    if not os.path.islink(path):
        return path
    target = os.path.realpath(path)
    if os.path.islink(target):  # realpath gives up on a loop
        raise OSError(errno.ELOOP, f"cannot save {path}: too many levels of symbolic links")
    return target


def _keep_mode(fd: int, path: str) -> None:
    """Give the new file ``fd`` the permission bits (and owner, where allowed) of the file at ``path``, if any."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        return
    if hasattr(os, "fchown") and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):  # only root may give a file away; a group we are in may be kept
            os.fchown(fd, st.st_uid, st.st_gid)
    os.fchmod(fd, stat.S_IMODE(st.st_mode))


# Freeing a multi-GB file (its blocks, its pages in the page cache) takes the kernel ~0.3 s per GB on a local disk.
# A save that replaces a checkpoint, or a pruned checkpoint, need not wait for it: the old file gets a second, hidden
# name and is unlinked on a background thread. Names left behind by a process that died first are removed by the
# next save into the same directory (:func:`_sweep`).
def _keep_for_discard(path: str) -> str | None:
    """Give the file at ``path`` (if any) a second name to free it by after ``path`` is replaced."""
    if not os.path.isfile(path):
        return None
    trash = trash_name(path)
    try:
        os.link(path, trash)
    except OSError:  # no hard links on this file system: the replace frees the old file itself
        return None
    return trash


def _sweep(directory: str) -> None:
    """Hand the stale files of ``directory`` (:func:`stale_files`) to the background deleter."""
    for stale in stale_files(directory):
        _discard_later(stale)


def _discard_later(path: str) -> None:
    _deleter().submit(_unlink, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # a stale name another save removed first
        pass


def _deleter() -> ThreadPoolExecutor:
    return shared("deleter", lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-discard"))


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
