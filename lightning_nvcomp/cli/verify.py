"""``lightning-nvcomp verify FILE``: decode every record of a checkpoint and check every checksum."""

from __future__ import annotations

import argparse

from lightning_nvcomp.cli.checkpoint import load, survey
from lightning_nvcomp.cli.common import add_command
from lightning_nvcomp.cli.table import size

#: The command's line in the top-level help, and its own help's description.
SUMMARY = "decode every tensor and check every checksum"
DESCRIPTION = (
    "Fully decode a checkpoint on the CPU (gANS records on the GPU) and check every checksum (the zip's CRC-32s for a "
    "plain torch.save file). Exits 0 if intact, 1 if missing or damaged, 2 if it cannot be checked here (gANS records "
    "and no CUDA GPU, refused by weights_only, too large to decode, out of memory...)."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "verify", run, SUMMARY, DESCRIPTION, progress=True, subject="file")
    parser.add_argument("file", help="checkpoint to verify: a path or a URL (s3://...)")


def run(args: argparse.Namespace) -> int:
    """Decode every record of a checkpoint and check every checksum: 0 intact, 1 damaged, 2 cannot be checked here."""
    surveyed = survey(args.file)
    load(surveyed, "cpu", args.quiet)
    compressed = surveyed.raw_nbytes(compressed_only=True)
    checked = "checksums and decode verified" if compressed else "plain torch.save file, zip checksums verified"
    print(f"OK: {len(surveyed.entries)} tensors, {size(surveyed.raw_nbytes())} raw, {checked}")
    return 0
