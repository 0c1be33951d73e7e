"""The names of a save's temporary files, and which of them a process that died left behind.

A write goes to ``.NAME.lnv-<host>-<pid>-<token>.tmp`` beside the file's final place, and a file being replaced or
discarded keeps a second name ``.NAME.lnv-<host>-<pid>-<token>.lnv-old`` until a background thread has freed it.
``<host>`` is :data:`HOST_ID` (8 hex digits of the SHA-1 of the host name), ``<pid>`` the writing process and
``<token>`` 8 random hex digits. :func:`stale_files` finds such names left by a process that died (``kill -9``, out
of memory) before it could rename or free them: only names of exactly this pattern, made on this host, by a process
that no longer exists, and whose lock can be taken at once. Anything else is left alone: another program's files
(``.x.lnv-old``, ``.model.ckpt.1234.tmp``), another host's (its process ids mean nothing here) and a live save's.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import stat

from lightning_nvcomp.storage.backend import parent_directory

try:
    import fcntl
except ImportError:  # Windows: no flock, and os.kill(pid, 0) is no liveness test there: nothing is stale
    fcntl = None  # type: ignore[assignment]

TRASH_SUFFIX = ".lnv-old"
TMP_SUFFIX = ".tmp"
#: Who wrote a temporary or trash name: 8 hex digits of the SHA-1 of this host's name (short, file-name safe).
HOST_ID = hashlib.sha1(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]
#: ``.NAME.lnv-<host>-<pid>-<token>.tmp`` / ``.lnv-old``: the only names a save's sweep ever removes.
_OWN = re.compile(
    r"^\..*\.lnv-(?P<host>[0-9a-f]{8})-(?P<pid>[1-9][0-9]{0,9})-[0-9a-f]{8}(?:\.tmp|\.lnv-old)$", re.DOTALL
)
_NAME_MAX = 255


def own_name(name: str, suffix: str) -> str:
    """A hidden name for ``name``'s temporary (``suffix`` ``.tmp``) or trash (``.lnv-old``) file, in our pattern.
    A long ``name`` is shortened so that the whole stays within the 255 bytes a file name may have."""
    tail = f".lnv-{HOST_ID}-{os.getpid()}-{secrets.token_hex(4)}{suffix}"
    room = _NAME_MAX - 1 - len(tail)
    encoded = os.fsencode(name)
    if len(encoded) > room:
        name = os.fsdecode(encoded[:room].decode("utf-8", "ignore").encode("utf-8"))
    return f".{name}{tail}"


def trash_name(path: str) -> str:
    """The absolute trash name of the file ``path`` (beside it)."""
    return os.path.join(parent_directory(path), own_name(os.path.basename(path), TRASH_SUFFIX))


def is_own(name: str) -> bool:
    """Whether the file name ``name`` is of our temporary or trash pattern (made by :func:`own_name`, on any host)."""
    return _OWN.match(name) is not None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user; anything else: assume it does
        return True
    return True


def _stale(path: str) -> bool:
    """Whether ``path`` (a name of our pattern, made on this host by a dead process) is unlocked: its writer is gone.
    A pid reused by a new process reads as alive; a lock still held (a writer in another pid namespace) too."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def stale_files(directory: str) -> list[str]:
    """The temporary and trash files in ``directory`` that crashed saves of this host left (see the module
    docstring): the ones the next save there removes."""
    if fcntl is None:
        return []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if not (name.endswith(TMP_SUFFIX) or name.endswith(TRASH_SUFFIX)):
            continue
        match = _OWN.match(name)
        if match is None or match["host"] != HOST_ID:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(directory, name)
        if _stale(path):
            found.append(path)
    return found
