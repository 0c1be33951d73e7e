"""``lightning-nvcomp inspect PATH``: the tensors of a checkpoint with their codecs and ratios, totals by dtype; the
items of a DCP checkpoint with their ranks and data files, totals by rank; the checkpoints in a directory."""

from __future__ import annotations

import argparse
from collections import Counter

from lightning_nvcomp.cli.checkpoint import Survey, survey
from lightning_nvcomp.cli.common import EXIT_OK, add_command, explain, worst
from lightning_nvcomp.cli.directory import (
    DCP,
    DCP_DATA_FILE,
    DCP_METADATA,
    FILE,
    checkpoint_of,
    kind_of,
    members,
    name_of,
    no_checkpoint,
)
from lightning_nvcomp.cli.table import size, table
from lightning_nvcomp.errors import RefusedObjectsError
from lightning_nvcomp.storage import storage_for
from lightning_nvcomp.telemetry.stats import ratio

#: Rows shown without ``--all``.
DEFAULT_ROWS = 40


#: The command's line in the top-level help, and its own help's description.
SUMMARY = "list tensors, codecs and compression ratios (decodes nothing)"
DESCRIPTION = (
    "List a checkpoint's tensors (largest first) with dtype, shape, size, codec and the compression ratio of the "
    "record holding them, then totals by dtype. PATH may also be a DCP checkpoint directory (its items with their "
    "rank and data file, then totals by rank) or one of its data files, or a directory of checkpoints such as "
    "Accelerate's save_state writes (one line per checkpoint in it). Reads only the files' structure."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``inspect`` command to the top-level parser's ``subparsers``."""
    parser = add_command(subparsers, "inspect", run, SUMMARY, DESCRIPTION, subject="file")
    parser.add_argument(
        "file",
        metavar="PATH",
        help="a checkpoint written by lightning_nvcomp or plain torch.save, a DCP checkpoint directory or one of its "
        "data files, or a directory of checkpoints: a path or a URL (s3://...)",
    )
    parser.add_argument("--all", action="store_true", help=f"list every tensor, not only the {DEFAULT_ROWS} largest")


def _more(shown: int, total: int, what: str) -> None:
    if shown < total:
        print(f"... {total - shown} smaller {what} not shown (--all lists every one)")


# ---------------------------------------------------------------------------------------------------- one file


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


def inspect_file(path: str, all_rows: bool) -> None:
    """Print the tensors of the checkpoint file ``path`` with their codecs and ratios, and totals by dtype."""
    surveyed = survey(path)
    entries = sorted(surveyed.entries, key=lambda e: e.nbytes, reverse=True)
    shown = entries if all_rows else entries[:DEFAULT_ROWS]
    rows = [[e.name, e.dtype, str(list(e.shape)), size(e.nbytes), e.codec, f"{e.ratio:.2f}"] for e in shown]
    print(table(["tensor", "dtype", "shape", "size", "codec", "ratio"], rows, right={3, 5}))
    _more(len(shown), len(entries), "tensors")
    print()
    print(table(["dtype", "tensors", "raw", "stored", "ratio"], _dtype_totals(surveyed), right={1, 2, 3, 4}))
    print()
    file_nbytes = storage_for(path).size(path)
    print(f"file: {path}, {size(file_nbytes)}; raw tensor bytes / file size: {surveyed.raw_nbytes() / file_nbytes:.2f}")
    needs = surveyed.chain()
    if needs:
        deltas = sum(" delta" in e.codec for e in surveyed.holders().values())
        print(
            f"a delta checkpoint: {deltas} of {len(surveyed.holders())} records coded against {needs[0]}; loading it "
            f"reads {' <- '.join(needs)} too (convert makes a file that stands alone)"
        )
    if surveyed.gans_writers:
        print(f"gANS records written by nvCOMP {', '.join(surveyed.gans_writers)} (decoding them needs a CUDA GPU)")


# ---------------------------------------------------------------------------------------------------- DCP


def inspect_dcp(path: str, all_rows: bool, only: str | None = None) -> None:
    """Print the items of the DCP checkpoint ``path`` (of its data file ``only``) with their rank, data file, codec
    and ratio, then totals by rank; from its ``.metadata``, decoding nothing."""
    from lightning_nvcomp.cli import dcp  # here, not at the top: DCP takes a second to import

    files = dcp.survey(path).files(only)
    items = sorted((item for found in files.values() for item in found), key=lambda i: i.raw_nbytes, reverse=True)
    shown = items if all_rows else items[:DEFAULT_ROWS]
    rows = [
        [
            i.name,
            str(i.dtype).removeprefix("torch.") if i.dtype is not None else "pickled",
            str(list(i.shape)) if i.dtype is not None else "-",
            "?" if i.rank is None else str(i.rank),
            i.file,
            i.codec,
            size(i.raw_nbytes),
            f"{i.ratio:.2f}",
        ]
        for i in shown
    ]
    print(table(["item", "dtype", "shape", "rank", "file", "codec", "size", "ratio"], rows, right={3, 6, 7}))
    _more(len(shown), len(items), "items")
    print()
    ranks: dict[str, list] = {}
    for item in items:
        ranks.setdefault("?" if item.rank is None else str(item.rank), []).append(item)
    totals = [*sorted(ranks.items(), key=lambda r: (len(r[0]), r[0])), ("total", items)]  # ranks in numeric order
    rows = []
    for rank, found in totals:
        raw, stored = sum(i.raw_nbytes for i in found), sum(i.stored_nbytes for i in found)
        codecs = ", ".join(sorted({i.codec for i in found}))
        data_files = len({i.file for i in found})
        rows.append(
            [rank, str(data_files), str(len(found)), codecs, size(raw), size(stored), f"{ratio(raw, stored):.2f}"]
        )
    print(table(["rank", "files", "items", "codecs", "raw", "stored", "ratio"], rows, right={1, 2, 4, 5, 6}))
    print()
    values = sum(i.dtype is None for i in items)
    where = f"data file {only} of the DCP checkpoint {path}" if only else f"DCP checkpoint: {path}"
    print(
        f"{where}: {len(items) - values} tensor items and {values} pickled values in "
        f"{len({i.file for i in items})} data files (from its {DCP_METADATA}, decoding nothing)"
    )


# ---------------------------------------------------------------------------------------------------- a directory


def _member_row(name: str, path: str, kind: str) -> list[str]:
    """The row of one checkpoint in a directory: format, tensors (items), codecs, raw and stored size, ratio."""
    if kind == FILE:
        surveyed = survey(path)
        codecs = surveyed.codecs()
        form = "torch.save" if codecs in ([], ["torch"]) else "lightning-nvcomp"
        count, raw, stored = len(surveyed.entries), surveyed.raw_nbytes(), surveyed.stored_nbytes()
    else:
        from lightning_nvcomp.cli import dcp  # here, not at the top: DCP takes a second to import

        items = dcp.survey(path).items
        ranks = {i.rank for i in items}
        form = f"DCP, {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
        codecs = sorted({i.codec for i in items})
        count, raw, stored = len(items), sum(i.raw_nbytes for i in items), sum(i.stored_nbytes for i in items)
        name += "/"
    return [name, form, str(count), ", ".join(codecs), size(raw), size(stored), f"{ratio(raw, stored):.2f}"]


def _directory(path: str, kind: str, all_rows: bool) -> int:
    """Print the DCP checkpoint ``path`` is (if ``kind`` says so), then one row per checkpoint in the directory, and
    the entries that are not checkpoints."""
    if kind == DCP:
        inspect_dcp(path, all_rows)
    found, others = members(path)
    if kind != DCP and not found:
        raise no_checkpoint(path, others)
    if not found and not others:
        return EXIT_OK
    rows, notes, statuses = [], [], []
    for member in found:
        try:
            rows.append(_member_row(member.name, member.path, member.kind))
        except RefusedObjectsError as err:
            holds = ", ".join(err.refused) or "objects other than tensors and plain values"
            rows.append([member.name, "torch.save", "-", "-", "-", "-", "-"])
            notes.append(f"{member.name}: not read: it holds {holds}, which weights_only loads refuse")
        except Exception as err:
            explained = explain(err, member.path)
            if explained is None:
                raise
            statuses.append(explained[0])
            rows.append([member.name, "error", "-", "-", "-", "-", "-"])
            notes.append(explained[1])
    if kind == DCP:
        print()
    header = ["checkpoint", "format", "tensors", "codecs", "raw", "stored", "ratio"]
    print(table(header, rows, right={2, 4, 5, 6}))
    for note in notes:
        print(note)
    for name, why in others:
        print(f"not a checkpoint: {name}: {why}")
    return worst(statuses)


def run(args: argparse.Namespace) -> int:
    """Print what the checkpoint(s) at ``args.file`` hold, decoding nothing."""
    kind = kind_of(args.file)
    if kind == FILE:
        inspect_file(args.file, args.all)
        return EXIT_OK
    if kind == DCP_DATA_FILE:
        inspect_dcp(checkpoint_of(args.file), args.all, only=name_of(args.file))
        return EXIT_OK
    return _directory(args.file, kind, args.all)
