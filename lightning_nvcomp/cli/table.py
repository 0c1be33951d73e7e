"""The one table renderer and the byte-size format every command prints with."""

from __future__ import annotations

from collections.abc import Container, Sequence


def size(nbytes: float) -> str:
    """``812 B``, ``4.1 kB``, ``12.3 MB``, ``1.20 GB`` (decimal units)."""
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.2f} TB"


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Container[int] = (),
    *,
    sep: str = "  ",
    widths: Sequence[int] = (),
) -> str:
    """Columns padded to their widest cell (and to at least ``widths[i]``), joined by ``sep``; the columns whose
    index is in ``right`` right-aligned, the others left-aligned; no trailing spaces."""
    columns = range(len(header))
    width = [max(len(row[i]) for row in (header, *rows)) for i in columns]
    width = [max(w, widths[i] if i < len(widths) else 0) for i, w in enumerate(width)]
    lines = [
        sep.join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, width)))
        for row in (header, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)
