"""``lightning-nvcomp verify PATH``: decode every record of a checkpoint and check every checksum; every item of a DCP
checkpoint (or of one of its data files); every checkpoint in a directory (what Accelerate's ``save_state`` writes)."""

from __future__ import annotations

import argparse

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.cli.checkpoint import load, survey
from lightning_nvcomp.cli.common import EXIT_BAD_FILE, EXIT_OK, EXIT_UNAVAILABLE, add_command, explain, fail, worst
from lightning_nvcomp.cli.directory import (
    DCP,
    DCP_DATA_FILE,
    FILE,
    checkpoint_of,
    kind_of,
    members,
    name_of,
    no_checkpoint,
)
from lightning_nvcomp.cli.table import size
from lightning_nvcomp.errors import RefusedObjectsError
from lightning_nvcomp.storage import storage_for

#: The command's line in the top-level help, and its own help's description.
SUMMARY = "decode every tensor and check every checksum (a file, a DCP checkpoint, a directory of checkpoints)"
DESCRIPTION = (
    "Fully decode a checkpoint on the CPU (gANS records on the GPU) and check every checksum (the zip's CRC-32s for a "
    "plain torch.save file). PATH may be a checkpoint file, a DCP checkpoint directory (every item of every rank, "
    "through its .metadata) or one of its data files, or a directory of checkpoints such as Accelerate's save_state "
    "writes (every checkpoint file and DCP directory in it; other files are listed, not checked). Exits 0 if intact, "
    "1 if missing or damaged, 2 if it cannot be checked here (gANS records and no CUDA GPU, refused by weights_only, "
    "too large to decode, out of memory or threads...)."
)
#: How a check's exit status is shown in a directory's listing.
_LABELS = {EXIT_OK: "OK", EXIT_BAD_FILE: "DAMAGED", EXIT_UNAVAILABLE: "UNCHECKED"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "verify", run, SUMMARY, DESCRIPTION, progress=True, subject="file")
    parser.add_argument(
        "file",
        metavar="PATH",
        help="a checkpoint file, a DCP checkpoint directory or one of its data files, or a directory of checkpoints: "
        "a path or a URL (s3://...)",
    )


def verify_file(path: str, quiet: bool) -> str:
    """Decode every record of the checkpoint file ``path`` and check every checksum; what was checked, in words."""
    surveyed = survey(path)
    load(surveyed, "cpu", quiet)
    compressed = surveyed.raw_nbytes(compressed_only=True)
    checked = "checksums and decode verified" if compressed else "plain torch.save file, zip checksums verified"
    needs = surveyed.chain()
    chained = f"; a delta: its bases {', '.join(needs)} decoded and checked with it" if needs else ""
    return f"{len(surveyed.entries)} tensors, {size(surveyed.raw_nbytes())} raw, {checked}{chained}"


def verify_dcp(path: str, quiet: bool, only: str | None = None) -> tuple[int, str]:
    """Decode and check every item of the DCP checkpoint ``path`` (of its data file ``only``): the exit status and
    what was checked, in words. Each data file that fails is reported on stderr, naming it and the item."""
    from lightning_nvcomp.cli import dcp  # here, not at the top: DCP takes a second to import

    surveyed = dcp.survey(path)
    checks = dcp.verify(surveyed, quiet, only)
    for check in checks:
        if check.status:
            fail(check.message, check.status)
    items = [item for check in checks for item in check.items]
    ranks = sorted({str(item.rank) for item in items if item.rank is not None})
    checkpoint = f"data file of the DCP checkpoint {path}" if only else "DCP checkpoint"
    what = f"{checkpoint}, {len(items)} items in {len(checks)} data file{'s' if len(checks) != 1 else ''}"
    what += f" (rank{'s' if len(ranks) != 1 else ''} {', '.join(ranks)})" if ranks else ""
    failed = [check.file for check in checks if check.status]
    if failed:
        return worst(c.status for c in checks), f"{what}: {', '.join(failed)} failed (see above)"
    not_loaded = [name for check in checks for name in check.not_loaded]
    note = (
        f"; {len(not_loaded)} pickled values not loaded ({', '.join(not_loaded)}): intact (zip CRC-32s checked), "
        "but they hold objects weights_only loads refuse"
        if not_loaded
        else ""
    )
    raw = size(sum(item.raw_nbytes for item in items))
    return EXIT_OK, f"{what}, {raw} raw, every item decoded and checked{note}"


def _member_file(path: str, quiet: bool) -> str:
    """:func:`verify_file` for a file in a directory, where one that holds objects ``weights_only`` loads refuse (the
    RNG states Accelerate saves hold numpy arrays) has its zip's CRC-32s checked instead: intact, not loaded."""
    try:
        return verify_file(path, quiet)
    except RefusedObjectsError as err:
        with storage_for(path).open_read(path) as f:
            fileformat.check_zip(f, path)
        holds = ", ".join(err.refused) or "objects other than tensors and plain values"
        return (
            f"plain torch.save file, zip checksums verified; not loaded: it holds {holds}, which weights_only refuses"
        )


def _directory(path: str, kind: str, quiet: bool) -> int:
    """Verify every checkpoint in the directory ``path`` (its own DCP checkpoint first, if ``kind`` says it is one);
    list each with its result, and the entries that are not checkpoints."""
    results = []
    if kind == DCP:
        results.append(("(this directory)", *verify_dcp(path, quiet)))
    found, others = members(path)
    for member in found:
        try:
            if member.kind == FILE:
                results.append((member.name, EXIT_OK, _member_file(member.path, quiet)))
            else:
                results.append((f"{member.name}/", *verify_dcp(member.path, quiet)))
        except Exception as err:
            explained = explain(err, member.path)
            if explained is None:
                raise
            results.append((member.name, *explained))
    if not results:
        raise no_checkpoint(path, others)
    if len(results) == 1 and not others:
        _, status, what = results[0]
        if status:
            return fail(f"{path}: {what}", status)
        print(f"OK: {path}: {what}")
        return EXIT_OK
    for name, status, what in results:
        print(f"{_LABELS[status]:<9} {name}: {what}")
    for name, why in others:
        print(f"{'skipped':<9} {name}: {why}")
    status = worst(status for _, status, _ in results)
    if status:
        failed = ", ".join(name for name, code, _ in results if code)
        return fail(f"{path}: not every checkpoint in it is intact: {failed}", status)
    print(f"OK: {path}: {len(results)} checkpoint{'s' if len(results) > 1 else ''} verified")
    return EXIT_OK


def _data_file(path: str, quiet: bool) -> int:
    """Verify the items of one data file of a DCP checkpoint, through the ``.metadata`` of its directory."""
    directory = checkpoint_of(path)
    status, what = verify_dcp(directory, quiet, only=name_of(path))
    if status:
        return fail(f"{path}: {what}", status)
    print(f"OK: {path}: {what}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Check the checkpoint(s) at ``args.file``: 0 intact, 1 missing or damaged, 2 cannot be checked here."""
    kind = kind_of(args.file)
    if kind == FILE:
        print(f"OK: {verify_file(args.file, args.quiet)}")
        return EXIT_OK
    if kind == DCP_DATA_FILE:
        return _data_file(args.file, args.quiet)
    return _directory(args.file, kind, args.quiet)
