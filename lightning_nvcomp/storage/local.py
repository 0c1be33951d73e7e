"""Durable file writes: a checkpoint appears under its final name complete, or not at all.

A write goes to a temporary name beside the file's final place (:mod:`lightning_nvcomp.storage.temp_names`), is
fsynced, renamed over that place and its directory fsynced; :func:`stage_write` and :class:`StagedWrite` split that
into the write and its commit (or its publish, then its flush). The writer holds an exclusive ``flock`` on its
temporary file while it writes. A file being replaced keeps a second name until the background deleter has freed it,
and every save sweeps its directory of the names a dead process left (:mod:`lightning_nvcomp.storage.discards`).
A temporary file is created with permission bits never wider than those of the file it becomes, and a failed write
removes it (also when closing it fails too, as after a full disk), so that the next save there starts clean.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Hashable
from typing import BinaryIO, Callable, NoReturn

from lightning_nvcomp.storage.backend import absolute_path, check_local, parent_directory
from lightning_nvcomp.storage.discards import discard, discard_later, keep_for_discard, sweep, wait_for_discards
from lightning_nvcomp.storage.temp_names import TMP_SUFFIX, is_own, own_name

try:
    import fcntl
except ImportError:  # Windows: no flock, so the temporary file is not locked (nor is anything swept there)
    fcntl = None  # type: ignore[assignment]

#: The durable write, with the path check and the background deleter's functions that its callers use beside it.
__all__ = [
    "StagedWrite",
    "Storage",
    "atomic_write",
    "check_local",
    "discard",
    "fsync_path",
    "stage_write",
    "target_directory",
    "wait_for_discards",
]

log = logging.getLogger(__name__)


class Storage:
    """The local :class:`~lightning_nvcomp.storage.backend.StorageBackend`: checkpoint files written durably through the
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
        (see :func:`stage_write`): its :meth:`~StagedWrite.commit` (or :meth:`~StagedWrite.publish`, then
        :meth:`~StagedWrite.flush`) finishes the write later."""
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
        return parent_directory(path)

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


def target_directory(path: str | os.PathLike) -> str:
    """The directory a file at ``path`` goes in; ValueError for a URL (:func:`check_local`), FileNotFoundError
    naming both if the directory does not exist."""
    path = check_local(path)
    directory = parent_directory(path)
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
    The temporary file has those bits from its creation on (see :func:`stage_write`). ``path`` may be a bare file
    name or a relative path (of the working directory at the call).

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
    :meth:`StagedWrite.commit` (or :meth:`StagedWrite.publish`) puts it there, :meth:`StagedWrite.abandon` removes
    it. Raises as atomic_write.

    The temporary file is never readable by more users than the file it becomes, not even for a moment: it is
    created with a new file's bits (``0o666`` less the umask), or with the owner's bits of the file it replaces
    until it has that file's owner, group and bits; a scratch file of ours (a name of
    :func:`~lightning_nvcomp.storage.temp_names.own_name`'s pattern: the storage probe, the savings baseline's timed
    ``torch.save``) is owner-only (``0o600``)."""
    path = check_local(path)
    final = _link_target(absolute_path(path))
    directory = target_directory(final)
    sweep(directory)
    tmp = os.path.join(directory, own_name(os.path.basename(final), TMP_SUFFIX))
    previous = _regular_file(final)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        fd = os.open(tmp, flags, _creation_mode(final, previous))
    except OSError as err:
        raise OSError(err.errno, f"cannot save {path}: {err.strerror} (directory {directory})") from None
    f = os.fdopen(fd, "wb")
    try:
        if fcntl is not None:  # ours while we write: a sweep of another process leaves it alone
            with contextlib.suppress(OSError):  # no locks here (ENOLCK): the sweep skips unlockable files
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        if previous is not None:
            _keep_owner_and_mode(f.fileno(), previous)
        write(f)
        f.flush()
        return StagedWrite(path, final, tmp, f, f.tell())
    except BaseException as err:
        _close_after_failure(f)
        _failed(path, err, tmp)


class StagedWrite:
    """A file :func:`stage_write` wrote under a temporary name beside its final place, not yet under its name.

    :meth:`commit` puts it there, durably or not; :meth:`publish` puts it there at once and :meth:`flush` makes it
    durable later (on another thread: ``background`` durability).

    Args:
        path: the name it is saved as (as given, for messages); final: the absolute file that name leads to (the end
            of its symbolic links); tmp: the temporary name; f: the open, locked temporary file; size: its size in
            bytes.
    """

    def __init__(self, path: str, final: str, tmp: str, f: BinaryIO, size: int) -> None:
        self.path, self.size = path, size
        self._final, self._tmp, self._f = final, tmp, f
        self._old: str | None = None  # the replaced file's second name, freed once this one is in place

    @property
    def replaces(self) -> bool:
        """Whether something is under the file's name already (a previous checkpoint that it replaces)."""
        return os.path.lexists(self._final)

    def commit(self, fsync: bool = True) -> None:
        """Put the file under its name: fsync it (with ``fsync``), rename it over a previous file there, fsync the
        directory (with ``fsync``). A failure before the rename removes the file, names the path, and leaves a
        previous file intact; a failure of the directory's fsync is :meth:`flush`'s."""
        self._rename(fsync, keep_open=False)
        if fsync:
            self.flush()
        else:
            self._free_old()

    def publish(self) -> None:
        """Put the file under its name now, readable by every process, leaving :meth:`flush` to make it durable.

        A file that replaces another is fsynced before its rename (only its directory is left to :meth:`flush`):
        renamed over a durable file before its data is on the disk, a power loss could leave neither, while this
        way the name holds one durable file or the other at every moment. A new name needs no such wait: the
        files that were there before are untouched. Failures as :meth:`commit`'s."""
        replacing = self.replaces
        self._rename(replacing, keep_open=not replacing)

    def flush(self) -> None:
        """Make the renamed file durable: fsync it (unless that was done before the rename) and its directory.

        Raises:
            OSError: naming the path: the file is in place and readable, but a power loss or a crash may lose it.
        """
        try:
            if not self._f.closed:
                with self._f:
                    os.fsync(self._f.fileno())
            fsync_path(parent_directory(self._final))
        except OSError as err:
            raise OSError(
                err.errno,
                f"cannot make {self.path} durable: {err.strerror}; the file is in place, but a power loss or a "
                "crash may lose it",
            ) from err
        finally:
            self._free_old()

    def abandon(self) -> None:
        """Remove the temporary file: nothing is saved."""
        _close_after_failure(self._f)
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)

    def _rename(self, fsync: bool, keep_open: bool) -> None:
        """fsync the file (with ``fsync``), close it (unless ``keep_open``: :meth:`flush` fsyncs it through the same
        descriptor, which is told of any write-back error since it was opened) and rename it over its final name,
        a previous file there kept under a second name to free later. A failure removes it and names the path."""
        try:
            if fsync:
                os.fsync(self._f.fileno())
            if not keep_open:
                self._f.close()  # a write error reported only now (a network file system's) fails the save here
            self._old = keep_for_discard(self._final)
            os.replace(self._tmp, self._final)
        except BaseException as err:
            _close_after_failure(self._f)
            _failed(self.path, err, self._tmp, self._old)

    def _free_old(self) -> None:
        if self._old is not None:
            discard_later(self._old)
            self._old = None


def _close_after_failure(f: BinaryIO) -> None:
    """Close the file of a failed write. Closing writes what is still buffered, which fails again after a full disk;
    the descriptor is closed all the same, and the first error is the one reported."""
    with contextlib.suppress(OSError):
        f.close()


def _failed(path: str, err: BaseException, *leftovers: str | None) -> NoReturn:
    """Remove a failed save's ``leftovers`` (its temporary file, a second name of the previous file) and raise: for a
    failed write, an OSError naming ``path`` that says what is left and, for a full disk or quota, what to do."""
    stuck = []
    for leftover in filter(None, leftovers):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
        except OSError:
            stuck.append(leftover)
    left = f"{', '.join(stuck)} could not be removed: delete it" if stuck else "its temporary file was removed"
    cause = _os_error(err)  # torch.save wraps a failed write (disk full, quota) in a RuntimeError
    if cause is None:
        if stuck:
            log.warning("lightning_nvcomp: the failed save of %s left %s", path, left)
        raise err
    advice = ""
    if cause.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = f" Free space in {parent_directory(path)} (or save elsewhere), then save again."
    raise OSError(
        cause.errno,
        f"cannot save {path}: {cause.strerror}; nothing was saved ({left}) and any previous file there is "
        f"intact.{advice}",
    ) from err


def _link_target(path: str) -> str:
    """The file a write of ``path`` goes to: ``path`` itself, or the end of the chain of symbolic links it starts
    (the file need not exist: a dangling link's target is created, as ``open`` does)."""
    if not os.path.islink(path):
        return path
    target = os.path.realpath(path)
    if os.path.islink(target):  # realpath gives up on a loop
        raise OSError(errno.ELOOP, f"cannot save {path}: too many levels of symbolic links")
    return target


def _regular_file(path: str) -> os.stat_result | None:
    """The status of the regular file at ``path``, if there is one (the file a save replaces)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _creation_mode(final: str, previous: os.stat_result | None) -> int:
    """The permission bits to create the temporary file of ``final`` with (the umask then clears some, as for any
    file ``open`` creates): a scratch file of ours owner-only, a replacement the owner's bits of the file it replaces
    (the rest follow once it has that file's owner and group: :func:`_keep_owner_and_mode`), a new file ``0o666``."""
    if is_own(os.path.basename(final)):
        return 0o600
    if previous is not None:
        return stat.S_IMODE(previous.st_mode) & 0o700
    return 0o666


def _keep_owner_and_mode(fd: int, previous: os.stat_result) -> None:
    """Give the new file ``fd`` the owner and group (where allowed) and then the permission bits of ``previous``."""
    if hasattr(os, "fchown") and (previous.st_uid, previous.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):  # only root may give a file away; a group we are in may be kept
            os.fchown(fd, previous.st_uid, previous.st_gid)
    os.fchmod(fd, stat.S_IMODE(previous.st_mode))


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
