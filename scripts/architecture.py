"""The package's layers and the imports between them, read from the code: the figure of docs/ARCHITECTURE.md.

    python scripts/architecture.py                                # print the figure
    python scripts/architecture.py --check docs/ARCHITECTURE.md   # exit 1 if the doc's figure is not the code's
    python scripts/architecture.py --update docs/ARCHITECTURE.md  # put the code's figure in the doc

The figure is the fenced block that follows the line ``<!-- figure: scripts/architecture.py -->`` in the doc. An
import is counted once per importing module and module imported, wherever it is written in the module (in a
function, or under ``TYPE_CHECKING``): each is a dependency all the same. An import of a package the module is in
(``from lightning_nvcomp import __version__``) is not: Python imports a module's packages before the module.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path

PACKAGE = "lightning_nvcomp"
ROOT = Path(__file__).resolve().parent.parent
#: The layers, lowest first, each with the top-level modules and folders of the package it holds. A module may
#: import its own layer and lower ones. Whatever else is at the package's root is a public face: the top layer.
LAYERS = [
    ("base", ["errors", "_process", "_compat", "_moved", "_version"]),
    ("codec", ["codec"]),
    ("storage", ["storage"]),
    ("format", ["format", "options"]),
    ("auto", ["auto"]),
    ("telemetry", ["telemetry"]),
    ("saving", ["saving"]),
    ("integrations", ["integrations"]),
    ("cli", ["cli"]),
    ("faces", []),
]
MARKER = "<!-- figure: scripts/architecture.py -->"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            for alias in node.names:  # ``from package import module`` imports that module
                targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return {t for t in targets if t in known and not f"{name}.".startswith(f"{t}.")}


def layer_of(name: str) -> int:
    """The index in LAYERS of module ``name``'s layer."""
    top = name.split(".")[1] if "." in name else "__init__"
    return next((i for i, (_, tops) in enumerate(LAYERS) if top in tops), len(LAYERS) - 1)


def figure(root: Path = ROOT) -> str:
    """The layer table and the counts of imports between layers, as text."""
    known = modules(root)
    edges = [(a, b) for a, path in known.items() for b in sorted(imported(a, path, known))]
    members: dict[int, list[str]] = {i: [] for i in range(len(LAYERS))}
    counts: dict[int, int] = {i: 0 for i in range(len(LAYERS))}
    for name, path in known.items():
        counts[layer_of(name)] += 1
        if name.count(".") == 1:  # a top-level module or folder
            members[layer_of(name)].append(name.split(".")[1] + ("/" if path.name == "__init__.py" else ""))
    members[len(LAYERS) - 1].insert(0, "__init__")
    order = range(len(LAYERS) - 1, -1, -1)
    width = max(len(label) for label, _ in LAYERS)
    lines = [f"{'layer':<{width + 3}} modules  top-level modules and folders (a module imports its layer or lower)"]
    for i in order:
        lines.append(f"{i:>2} {LAYERS[i][0]:<{width}} {counts[i]:>7}  {' '.join(members[i])}")
    lines += ["", "imports between modules, from a row's layer to a column's (left of the diagonal: upward)"]
    lines.append(" " * (width + 3) + "".join(f"{i:>5}" for i in order))
    for row in order:
        cells = [sum(1 for a, b in edges if (layer_of(a), layer_of(b)) == (row, col)) for col in order]
        lines.append(f"{row:>2} {LAYERS[row][0]:<{width}}" + "".join(f"{c or '.':>5}" for c in cells))
    upward = [f"  {a} -> {b}" for a, b in edges if layer_of(b) > layer_of(a)]
    lines += ["", f"{len(edges)} imports, {len(upward)} upward", *upward]
    return "\n".join(lines) + "\n"


def _block(text: str, doc: Path) -> tuple[int, int]:
    """The first and the end line index of the figure in ``text`` (the fenced block after MARKER)."""
    lines = text.splitlines()
    if MARKER not in lines:
        sys.exit(f"{doc}: no line {MARKER!r} before the figure")
    start = lines.index(MARKER) + 2  # past the marker and the opening fence
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("```")), None)
    if lines[start - 1 : start] != ["```text"] or end is None:
        sys.exit(f"{doc}: the line after {MARKER!r} must open a ```text block, closed by a ``` line")
    return start, end


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", type=Path, metavar="DOC", help="exit 1 if DOC's figure is not the code's")
    action.add_argument("--update", type=Path, metavar="DOC", help="put the code's figure in DOC")
    args = parser.parse_args()
    drawn = figure()
    doc = args.check or args.update
    if doc is None:
        print(drawn, end="")
        return 0
    text = doc.read_text()
    start, end = _block(text, doc)
    lines = text.splitlines(keepends=True)
    written = "".join(lines[start:end])
    if args.update:
        doc.write_text("".join(lines[:start]) + drawn + "".join(lines[end:]))
        return 0
    if written != drawn:
        diff = difflib.unified_diff(written.splitlines(True), drawn.splitlines(True), f"{doc}", "the code")
        print(f"{doc}: the figure is not the code's (python scripts/architecture.py --update {doc}):", file=sys.stderr)
        sys.stderr.writelines(diff)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
