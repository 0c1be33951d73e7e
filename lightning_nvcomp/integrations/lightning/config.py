"""The integrations' option errors when a config-file command line makes the object (LightningCLI, through
jsonargparse): one line, not jsonargparse's report.

jsonargparse makes each object of a config (``trainer.plugins``, ``trainer.strategy``) inside its handling of the
setting's union type, where any exception counts as "not this type": an unavailable codec (``codec: ans`` on a machine
without a GPU) came out as ~90 lines of tracebacks listing each type the setting allows, with the one line that
matters in the middle. Made there, our classes end the program with that line instead, as jsonargparse itself does for
an error in a config; everywhere else the error is raised as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from lightning_nvcomp.errors import CodecUnavailableError

#: The status a config error exits with (argparse's and jsonargparse's for a wrong command line or config).
EXIT_CONFIG = 2


def _made_by_jsonargparse() -> bool:
    """Whether jsonargparse is on the stack (it is making the object whose options are being checked)."""
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).partition(".")[0] == "jsonargparse":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@contextlib.contextmanager
def option_errors(owner: str) -> Iterator[None]:
    """Within the block, an option error (:class:`~lightning_nvcomp.errors.CodecUnavailableError`, or the
    ValueError of an unknown codec or a size that is not positive) propagates unchanged, unless jsonargparse is making
    ``owner`` (a LightningCLI config): then the program ends with ``PROG: error: OWNER: message`` on stderr and exit
    status 2 (:class:`SystemExit`)."""
    try:
        yield
    except (CodecUnavailableError, ValueError) as err:
        if not _made_by_jsonargparse():
            raise
        print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {owner}: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
