"""What the commands share: the program's name, its exit statuses, the error line, argument types and options."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

PROG = "lightning-nvcomp"
#: Exit statuses: success; the file is missing or damaged; it cannot be processed on this machine, or the command
#: line is wrong (argparse exits 2 too).
EXIT_BAD_FILE = 1
EXIT_UNAVAILABLE = 2


def fail(message: str, status: int) -> int:
    """Print ``lightning-nvcomp: error: message`` on stderr; return ``status``."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


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
) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` (``summary`` in the top-level help, ``description`` in its own), parsed
    arguments going to ``run``; with ``progress``, its ``-q/--quiet`` option turns the progress bar off."""
    parser = subparsers.add_parser(name, help=summary, description=description)
    if progress:
        parser.add_argument(
            "-q", "--quiet", action="store_true", help="no progress bar (it is also off when stderr is not a terminal)"
        )
    parser.set_defaults(run=run)
    return parser
