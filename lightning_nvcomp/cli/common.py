"""What the commands share: the program's name, its exit statuses and how errors map to them (:func:`explain`),
the error line, torch's threads (:func:`serial_torch`), argument types and options."""

from __future__ import annotations

import argparse
import errno
import math
import sys
from collections.abc import Callable, Iterable, Iterator

import torch

from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, RefusedObjectsError

PROG = "lightning-nvcomp"
#: Exit statuses: success; the file is missing or damaged; it cannot be processed on this machine, or the command
#: line is wrong (argparse exits 2 too).
EXIT_OK = 0
EXIT_BAD_FILE = 1
EXIT_UNAVAILABLE = 2


def fail(message: str, status: int) -> int:
    """Print ``lightning-nvcomp: error: message`` on stderr; return ``status``."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def worst(statuses: Iterable[int]) -> int:
    """The exit status of several checks: 1 if any found a file missing or damaged, else 2 if any could not be made
    here, else 0."""
    found = set(statuses)
    return EXIT_BAD_FILE if EXIT_BAD_FILE in found else max(found, default=EXIT_OK)


# ------------------------------------------------------------------------------------------------ errors -> status

_THREADS = (
    "this process cannot start another thread (the limit on processes, ulimit -u, or on memory, ulimit -v, is reached)"
)
_MEMORY = "this machine is out of memory (or the address-space limit, ulimit -v, is reached)"
#: What torch, numpy and Python say when memory or threads run out, in the messages of the errors they raise.
_MACHINE_MESSAGES = (
    ("can't start new thread", _THREADS),
    ("can't allocate memory", _MEMORY),  # torch's CPU allocator
    ("cannot allocate memory", _MEMORY),  # mmap and other system calls (ENOMEM)
    ("out of memory", "this machine is out of memory (GPU or host memory)"),  # CUDA, nvCOMP
)
_MACHINE_ERRNOS = {
    errno.ENOMEM: _MEMORY,
    errno.EAGAIN: "a resource of this machine is used up for now (threads: ulimit -u, or memory)",
    errno.EMFILE: "this process has too many files open (ulimit -n)",
    errno.ENFILE: "this machine has too many files open",
}


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the errors it was raised from or while handling, suppressed ones included."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        yield found
        found = found.__cause__ or found.__context__


def machine_cause(err: BaseException) -> tuple[str, BaseException] | None:
    """What about this machine made ``err`` happen, in words (memory, threads, open files, the GPU's memory), and the
    error that says so; None if nothing points to the machine. The errors ``err`` was raised from count: a verdict of
    damage reached while memory or threads ran out says nothing about the file."""
    for found in _chain(err):
        if isinstance(found, MemoryError):
            return _MEMORY, found
        if isinstance(found, OSError) and found.errno in _MACHINE_ERRNOS:
            return _MACHINE_ERRNOS[found.errno], found
        if isinstance(found, (RuntimeError, OSError)):
            text = str(found).lower()
            for mark, cause in _MACHINE_MESSAGES:
                if mark in text:
                    return cause, found
    return None


def refused(err: RefusedObjectsError) -> str:
    """What the commands say of a file whose pickle holds objects a ``weights_only`` load refuses: what it holds and
    that they read only tensors and plain values (the library's advice, ``weights_only=False``, is no option here)."""
    if err.refused == ("_codecs.encode",):  # torch 2.4 refuses bytes values
        return (
            f"{err.path} holds bytes values, which weights_only loads on torch {torch.__version__} refuse (torch 2.5 "
            "and newer read them): upgrade torch to read it here"
        )
    holds = ", ".join(err.refused) or "objects other than tensors and plain Python values"
    return (
        f"{err.path} is not a checkpoint {PROG} reads: its pickle (intact, not damaged) holds {holds}. {PROG} loads "
        "only tensors and plain Python values (what torch.load(weights_only=True) loads), never a file's own classes "
        "or code. A whole object saved with torch.save(obj), such as a model? Save obj.state_dict() instead."
    )


def explain(err: BaseException, path: str | None = None) -> tuple[int, str] | None:
    """The exit status of an error a command raised about ``path``, and what to print: 1 for a missing or damaged
    file, 2 for anything that keeps it from being processed here, the machine first (:func:`machine_cause`). None for
    an error that is neither (a bug: its traceback should show)."""
    machine = machine_cause(err)
    if machine is not None:
        cause, found = machine
        detail = f"{type(found).__name__}: {found}" if str(found) else type(found).__name__
        return EXIT_UNAVAILABLE, (
            f"{path + ': ' if path else ''}{cause}, so it could not be read to the end ({detail}). This is a limit "
            "of the machine, not damage to the file: free the resource or raise the limit, and run again"
        )
    if isinstance(err, (CorruptCheckpointError, FileNotFoundError, IsADirectoryError)):
        return EXIT_BAD_FILE, str(err)
    if isinstance(err, RefusedObjectsError):
        return EXIT_UNAVAILABLE, refused(err)
    if isinstance(err, CheckpointError):  # not damage: a codec missing here, weights_only, the decode limit
        return EXIT_UNAVAILABLE, str(err)
    if isinstance(err, (OSError, RuntimeError, ValueError)):  # the machine, not the file
        return EXIT_UNAVAILABLE, f"{type(err).__name__}: {err}"
    return None


# ------------------------------------------------------------------------------------------------ threads


def serial_torch() -> None:
    """Have torch run its CPU operations on the calling thread (one intra-op thread), in every thread, from now on.

    Why: torch splits a large CPU operation over OpenMP threads, and OpenMP (libgomp) that cannot start one ends the
    process with status 1, the status of a damaged file, from whichever thread ran the operation (the decoders run
    them on their pools' threads too). With one torch thread OpenMP starts none: a thread that cannot start is then
    one of the package's, whose ``RuntimeError("can't start new thread")`` exits 2. The package's thread pools still
    code and check in parallel (their threads no longer each start a team of OpenMP threads besides). Not undone
    when a command returns: after an error, its pools' threads may still be finishing their work, and OpenMP back
    on would start threads for them.
    """
    torch.set_num_threads(1)


def _positive(text: str, number: type[float] | type[int], expected: str) -> float:
    try:
        value = number(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected {expected} > 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite float > 0."""
    return _positive(text, float, "a number")


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer > 0."""
    return int(_positive(text, int, "a whole number"))


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
    *,
    progress: bool = False,
    subject: str | None = None,
    measures: bool = False,
) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` (``summary`` in the top-level help, ``description`` in its own), parsed
    arguments going to ``run``; with ``progress``, its ``-q/--quiet`` option turns the progress bar off; ``subject``:
    the argument that names the path the command reads (what its errors are about); ``measures``: the command times
    saves, which keep torch's threads as a training process has them (others run with :func:`serial_torch`)."""
    parser = subparsers.add_parser(name, help=summary, description=description)
    if progress:
        parser.add_argument(
            "-q", "--quiet", action="store_true", help="no progress bar (it is also off when stderr is not a terminal)"
        )
    parser.set_defaults(run=run, subject=subject, measures=measures)
    return parser
