"""``lightning-nvcomp inspect FILE``: the tensors of a checkpoint with their codecs and ratios, totals by dtype."""

from __future__ import annotations

import argparse
from collections import Counter

from lightning_nvcomp.cli.checkpoint import Survey, survey
from lightning_nvcomp.cli.common import add_command
from lightning_nvcomp.cli.table import size, table
from lightning_nvcomp.locations import storage_for
from lightning_nvcomp.stats import ratio

#: Rows shown without ``--all``.
DEFAULT_ROWS = 40


#: The command's line in the top-level help, and its own help's description.
SUMMARY = "list tensors, codecs and compression ratios (decodes nothing)"
DESCRIPTION = (
    "List a checkpoint's tensors (largest first) with dtype, shape, size, codec and the compression ratio of the "
    "record holding them, then totals by dtype. Reads only the file's structure."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``inspect`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "inspect", run, SUMMARY, DESCRIPTION, subject="file")
    parser.add_argument(
        "file", help="checkpoint written by lightning_nvcomp or plain torch.save: a path or a URL (s3://...)"
    )
    parser.add_argument("--all", action="store_true", help=f"list every tensor, not only the {DEFAULT_ROWS} largest")


def _dtype_totals(surveyed: Survey) -> list[list[str]]:
    """Rows of (dtype, tensors, raw, stored, ratio), each record or storage counted once, then the total."""
    count = Counter(e.dtype for e in surveyed.entries)
    raw: Counter[str] = Counter()
    stored: Counter[str] = Counter()
    for entry in surveyed.holders().values():
        raw[entry.dtype] += entry.raw_nbytes
        stored[entry.dtype] += entry.stored_nbytes
    totals = [(dtype, count[dtype], raw[dtype], stored[dtype]) for dtype in sorted(count)]
    totals.append(("total", len(surveyed.entries), surveyed.raw_nbytes(), surveyed.stored_nbytes()))
    return [[d, str(n), size(r), size(s), f"{ratio(r, s):.2f}"] for d, n, r, s in totals]


def run(args: argparse.Namespace) -> int:
    """Print the tensors of a checkpoint with their codecs and ratios, and totals by dtype."""
    surveyed = survey(args.file)
    entries = sorted(surveyed.entries, key=lambda e: e.nbytes, reverse=True)
    shown = entries if args.all else entries[:DEFAULT_ROWS]
    rows = [[e.name, e.dtype, str(list(e.shape)), size(e.nbytes), e.codec, f"{e.ratio:.2f}"] for e in shown]
    print(table(["tensor", "dtype", "shape", "size", "codec", "ratio"], rows, right={3, 5}))
    if len(shown) < len(entries):
        print(f"... {len(entries) - len(shown)} smaller tensors not shown (--all lists every tensor)")
    print()
    print(table(["dtype", "tensors", "raw", "stored", "ratio"], _dtype_totals(surveyed), right={1, 2, 3, 4}))
    print()
    file_nbytes = storage_for(args.file).size(args.file)
    print(
        f"file: {args.file}, {size(file_nbytes)}; raw tensor bytes / file size: "
        f"{surveyed.raw_nbytes() / file_nbytes:.2f}"
    )
    if surveyed.gans_writers:
        print(f"gANS records written by nvCOMP {', '.join(surveyed.gans_writers)} (decoding them needs a CUDA GPU)")
    return 0
