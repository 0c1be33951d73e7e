"""An option error of ours in a config-file command line (LightningCLI, through jsonargparse): one line, not
jsonargparse's report.

What jsonargparse does (read in jsonargparse 4.53 with Lightning 2.6): it makes each object of a config
(``trainer.plugins``, ``trainer.strategy``) inside its handling of the setting's union type, where any ``Exception``
counts as "not this type". An option error (``codec: ans`` on a machine without a GPU) came out as ~100 lines of
tracebacks listing each type the setting allows, with the one line that matters in the middle; a value rejected by
its parser instead (a type hint such as ``Literal``) is printed after the command's whole usage, ~100 lines too. No
exception a class raises reaches the user as one line.

What jsonargparse offers for this is its instantiators (``jsonargparse.add_instantiator``): the function that makes the
objects of a class from a config. :func:`one_line_errors` gives our classes one, which makes the object as
jsonargparse's default does and, on an option error, ends the command with ``PROG: error: CLASS: message`` on stderr
and exit status 2, as argparse ends a command line it rejects. It is called only by jsonargparse making an object from
a config: the call itself is the fact, nothing is looked up on the stack, and made any other way the classes raise
their errors as they are.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from lightning_nvcomp.errors import CodecUnavailableError

#: The status a config error exits with (argparse's and jsonargparse's for a wrong command line or config).
EXIT_CONFIG = 2


def _made_from_config(cls: type, *args: Any, **kwargs: Any) -> Any:
    """jsonargparse's instantiator for ``cls`` and its subclasses: ``cls(*args, **kwargs)``, an option error (the
    ValueError of an unknown codec or a size that is not positive,
    :class:`~lightning_nvcomp.errors.CodecUnavailableError`) ending the command in one line."""
    try:
        return cls(*args, **kwargs)
    except (CodecUnavailableError, ValueError) as err:
        print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {cls.__name__}: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None


def one_line_errors(cls: type) -> None:
    """Have jsonargparse make ``cls`` and its subclasses through :func:`_made_from_config` (its global registry of
    instantiators, for the process; nothing where jsonargparse, or its ``add_instantiator``, is missing)."""
    try:
        jsonargparse = importlib.import_module("jsonargparse")
    except ImportError:  # no config-file command line here (LightningCLI needs it)
        return
    register = getattr(jsonargparse, "add_instantiator", None)
    if register is not None:
        register(_made_from_config, cls, subclasses=True)
