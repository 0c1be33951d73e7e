"""The ``lightning-nvcomp`` command line (also ``python -m lightning_nvcomp``).

Commands, one module each in this package:

* ``inspect PATH``: what a checkpoint holds (tensors, codecs, compression ratios), without decoding anything; of a
  DCP checkpoint directory, its items with their rank and data file, and totals by rank; of a directory of
  checkpoints (Accelerate's ``save_state``), one line per checkpoint in it.
* ``verify PATH``: decode every record and check every checksum: of a file, of every item of a DCP checkpoint (or of
  one of its data files, through the checkpoint's ``.metadata``), of every checkpoint in a directory.
* ``convert IN OUT --codec {zstd,ans,none,torch}``: rewrite a checkpoint with another codec (``torch``: a plain
  torch.save file).
* ``estimate``: what synchronous checkpoints cost in idle GPU time and dollars, uncompressed and with each codec.
* ``bench --dir DIR``: measure a checkpoint directory and the codecs; predict and time a save with each.
* ``env``: torch and its CUDA build, the GPU, nvCOMP and the frameworks here, and the install line that fits.

Exit status: 0 success; 1 the file is missing or damaged; 2 it cannot be processed on this machine (gANS records
without a CUDA GPU and nvCOMP, refused by ``weights_only``, over the decode limit, out of memory or threads, a device
error: also where such a limit interrupted a check that would otherwise report damage), or the command line is wrong.

Each command module has ``add_parser(subparsers)``, which adds its subcommand and sets ``run`` to its
``run(args) -> int`` (the exit status); :func:`main` maps the errors a command raises to the statuses above
(:func:`~lightning_nvcomp.cli.common.explain`). Shared pieces: ``common`` (names, statuses, errors, argument types),
``checkpoint`` (a file's survey and a load with a progress bar), ``directory`` (what a path is: a file, a DCP
checkpoint or one of its data files, a directory of checkpoints), ``dcp`` (a DCP checkpoint's survey and check, through
:class:`~lightning_nvcomp.dcp.NvcompFileSystemReader`), ``table`` (the table renderer and byte sizes).
"""

from __future__ import annotations

import argparse

from lightning_nvcomp._version import __version__
from lightning_nvcomp.cli import bench, convert, env, estimate, inspect, verify
from lightning_nvcomp.cli.common import PROG, explain, fail, serial_torch

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (inspect, verify, convert, estimate, bench, env)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: ``--version`` and one subcommand per module of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify and convert lossless compressed PyTorch checkpoints (nvCOMP gANS / zstd).",
        epilog="Exit status: 0 success, 1 file missing or damaged, 2 cannot be processed on this machine "
        "(gANS without a CUDA GPU and nvCOMP, out of memory or threads...) or bad arguments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); return the exit status: 1 for a missing or
    damaged file, 2 for anything that keeps it from being processed here (see the module docstring and
    :func:`~lightning_nvcomp.cli.common.explain`). A wrong command line exits 2 through argparse's ``SystemExit``.
    Every command but ``bench`` leaves torch on one intra-op thread in this process
    (:func:`~lightning_nvcomp.cli.common.serial_torch`)."""
    args = build_parser().parse_args(argv)
    if not args.measures:
        serial_torch()
    try:
        return args.run(args)
    except Exception as err:
        explained = explain(err, getattr(args, args.subject) if args.subject else None)
        if explained is None:
            raise
        return fail(explained[1], explained[0])
