"""The package's structure (issue 33), read from its source with ``ast``: layers that import only from their own
layer or lower ones, no import cycle between modules, few modules loose at the package root, and modules and
functions a reader holds in their head (at most 400 lines a module, 60 a function).

Each check is a function of a package's folder that lists what breaks its rule (nothing where it holds), so that the
tests at the end show each one finding a break in a scratch package. The names callers imported from the modules
that were split for size stay importable there.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import lightning_nvcomp

PACKAGE = Path(lightning_nvcomp.__file__).parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_ROOT_MODULES = 12

#: The layers, lowest first: errors/_process/_compat/_moved/_version -> codec -> storage -> format, options -> auto -> telemetry ->
#: saving -> integrations -> cli -> the root faces. A module may import from its own layer and lower ones only. A
#: layer is named by the first part of its modules' names under the package: a folder or a root module.
LAYERS = [
    ("errors", "_process", "_compat", "_moved", "_version"),
    ("codec",),
    ("storage",),
    ("format", "options"),
    ("auto",),
    ("telemetry",),
    ("saving",),
    ("integrations",),
    ("cli",),
    # the faces (the package itself, python -m, the DCP and Accelerate faces): they may import anything, and nothing
    # below them imports them
    ("__init__", "__main__", "dcp", "accelerate"),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` (its folder), by dotted name; a folder's ``__init__.py`` is the folder's module."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(package: Path) -> dict[str, set[str]]:
    """The modules of ``package`` that each of its modules imports, wherever the import stands (in functions and
    ``TYPE_CHECKING`` blocks too); ``from a import b`` imports the module ``a.b`` where there is one, else ``a``."""
    known = modules(package)
    graph = {}
    for name, path in known.items():
        here = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")  # where `from .` starts
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        graph[name] = {target for target in targets if target in known and target != name}
    return graph


def _layer(module: str) -> str:
    """The layer name of a dotted ``module`` name: its second part (``__init__`` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def outside_the_layers(package: Path) -> list[str]:
    """The modules of ``package`` in no layer of :data:`LAYERS` (a new folder or root module: give it one)."""
    return [name for name in modules(package) if _layer(name) not in RANK]


def upward_imports(package: Path) -> list[str]:
    """Each import in ``package`` of a module of a higher layer than the importing module's."""
    graph = imports(package)
    return [
        f"{name} ({_layer(name)}) imports {target} ({_layer(target)})"
        for name in sorted(graph)
        for target in sorted(graph[name])
        if RANK.get(_layer(target), -1) > RANK.get(_layer(name), len(LAYERS))
    ]


def _shortest_loop(graph: dict[str, set[str]], start: str) -> list[str]:
    """The modules on the shortest way of imports from ``start`` back to it, ``start`` first; [] if there is none."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        last = next((module for module in frontier if start in graph[module]), None)
        if last is not None:
            loop = [last]
            while loop[-1] != start:
                loop.append(came_from[loop[-1]])
            return loop[::-1]
        reached = [(t, m) for m in frontier for t in sorted(graph[m]) if t not in came_from and t != start]
        came_from.update(reversed(reached))  # reversed: the first way found to each module is the one kept
        frontier = list(dict.fromkeys(t for t, _ in reached))
    return []


def import_cycles(package: Path) -> list[str]:
    """Each loop of imports between modules of ``package``, as ``a -> b -> a``: the shortest one through each
    module, once for the modules it goes through."""
    graph = imports(package)
    found: dict[frozenset[str], str] = {}
    for start in sorted(graph):
        loop = _shortest_loop(graph, start)
        if loop:
            found.setdefault(frozenset(loop), " -> ".join([*loop, start]))
    return sorted(found.values())


def crowded_root(package: Path) -> list[str]:
    """The modules loose at the root of ``package`` (its files, and its folders of one module: the shims) when
    there are more than :data:`MAX_ROOT_MODULES`."""
    files = sorted(path.name for path in package.glob("*.py"))
    shims = sorted(
        f"{path.name}/"
        for path in package.iterdir()
        if path.is_dir() and [module.name for module in path.rglob("*.py")] == ["__init__.py"]
    )
    return files + shims if len(files) + len(shims) > MAX_ROOT_MODULES else []


def long_modules(package: Path) -> list[str]:
    """The modules of ``package`` over :data:`MAX_MODULE_LINES` lines."""
    lines = {name: len(path.read_text().splitlines()) for name, path in modules(package).items()}
    return [f"{name}: {n} lines" for name, n in lines.items() if n > MAX_MODULE_LINES]


def long_functions(package: Path) -> list[str]:
    """The functions of ``package`` (methods and nested ones too) over :data:`MAX_FUNCTION_LINES` lines, from
    ``def`` to their last line."""
    found = []
    for name, path in modules(package).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name} (line {node.lineno}): {n} lines")
    return found


CHECKS = [outside_the_layers, upward_imports, import_cycles, crowded_root, long_modules, long_functions]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_package_keeps_the_rule(check: Callable[[Path], list[str]]) -> None:
    broken = check(PACKAGE)
    assert broken == [], f"{check.__name__}:\n" + "\n".join(broken)


def test_the_names_callers_import_from_the_split_modules_are_the_moved_ones():
    from lightning_nvcomp.storage import backend, discards, local
    from lightning_nvcomp.storage.remote import errors, file_uploads, multipart, upload
    from lightning_nvcomp.telemetry import components, estimate

    assert (local.discard, local.wait_for_discards, local.check_local) == (
        discards.discard,
        discards.wait_for_discards,
        backend.check_local,
    )
    assert {"discard", "wait_for_discards", "atomic_write", "StagedWrite", "fsync_path"} <= set(local.__all__)
    assert (upload.MultipartUpload, upload.RenameUpload, upload.SpooledPut) == (
        multipart.MultipartUpload,
        file_uploads.RenameUpload,
        file_uploads.SpooledPut,
    )
    assert multipart.outcome_unknown is errors.outcome_unknown
    assert estimate.checkpoint_components is components.checkpoint_components
    assert (estimate.CODECS, estimate.CODEC_NAMES) == (components.CODECS, components.CODEC_NAMES)


def test_a_url_refused_by_the_local_write_is_sent_to_a_function_that_exists(tmp_path, monkeypatch):
    """The refusal names where URLs go; that name was left pointing at a module without it by the move."""
    from lightning_nvcomp.storage.local import atomic_write

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"s3://bucket/run/last\.ckpt") as refused:
        atomic_write("s3://bucket/run/last.ckpt", lambda f: f.write(b"x"))
    (named,) = re.findall(r"\((lightning_nvcomp(?:\.\w+)+)\)", str(refused.value))
    module, _, function = named.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function, None)), named
    assert os.listdir(tmp_path) == []


# each check finds what breaks its rule ----------------------------------------------------------------------------


def scratch(root: Path, files: dict[str, str]) -> Path:
    """A package ``lightning_nvcomp`` in ``root`` of ``files`` (path in the package -> source), with an empty
    ``__init__.py`` in each folder that has none; its folder."""
    package = root / "lightning_nvcomp"
    for name, source in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    for folder in [package, *(path for path in package.rglob("*") if path.is_dir())]:
        (folder / "__init__.py").touch()
    return package


def function_of(lines: int) -> str:
    """The source of a function ``f`` of ``lines`` lines."""
    return "def f():\n" + "    x = 1\n" * (lines - 1)


#: A package at the bounds of every rule: imports down the layers (relative, and in a function too), a module of
#: 400 lines, a function of 60, 12 modules loose at the root (10 files, 2 folders of one module).
WITHIN = {
    "codec/record.py": "from lightning_nvcomp.errors import CheckpointError\n",
    "saving/writer.py": "from ..codec import record\n\ndef save():\n    from lightning_nvcomp.storage import local\n",
    "storage/local.py": "x = 1\n" * MAX_MODULE_LINES,
    "auto/policy.py": function_of(MAX_FUNCTION_LINES),
    "integrations/__init__.py": "from lightning_nvcomp.storage import local\n",
    "_compat/__init__.py": "",
    **{f"{name}.py": "" for name in ("__main__", "errors", "_process", "_moved", "_version", "options", "cli")},
    **{f"{name}.py": "import lightning_nvcomp.auto.policy\n" for name in ("dcp", "accelerate")},
}

BREAKS = [
    pytest.param(
        upward_imports,
        {"codec/record.py": "from lightning_nvcomp.saving import writer\n", "saving/writer.py": ""},
        ["lightning_nvcomp.codec.record (codec) imports lightning_nvcomp.saving.writer (saving)"],
        id="upward",
    ),
    pytest.param(
        upward_imports,
        {"codec/record.py": "def f():\n    from ..saving import writer\n", "saving/writer.py": ""},
        ["lightning_nvcomp.codec.record (codec) imports lightning_nvcomp.saving.writer (saving)"],
        id="upward-relative-in-a-function",
    ),
    pytest.param(
        upward_imports,
        {"format/reader.py": "from lightning_nvcomp import save\n"},
        ["lightning_nvcomp.format.reader (format) imports lightning_nvcomp (__init__)"],
        id="upward-to-the-face",
    ),
    pytest.param(
        outside_the_layers,
        {"helpers/misc.py": ""},
        ["lightning_nvcomp.helpers", "lightning_nvcomp.helpers.misc"],
        id="outside-the-layers",
    ),
    pytest.param(
        import_cycles,
        {
            "storage/a.py": "from lightning_nvcomp.storage import b\n",
            "storage/b.py": "import lightning_nvcomp.storage.a\n",
        },
        ["lightning_nvcomp.storage.a -> lightning_nvcomp.storage.b -> lightning_nvcomp.storage.a"],
        id="cycle",
    ),
    pytest.param(
        import_cycles,
        {
            "codec/__init__.py": "from .record import encode\n",
            "codec/record.py": "from . import planes\n",
            "codec/planes.py": "from lightning_nvcomp.codec import checksum\n",
        },
        [
            "lightning_nvcomp.codec -> lightning_nvcomp.codec.record -> lightning_nvcomp.codec.planes -> lightning_nvcomp.codec"
        ],
        id="cycle-through-a-package",
    ),
    pytest.param(
        crowded_root,
        {f"m{i}.py": "" for i in range(MAX_ROOT_MODULES)},
        ["__init__.py", *sorted(f"m{i}.py" for i in range(MAX_ROOT_MODULES))],
        id="13-modules-at-the-root",
    ),
    pytest.param(
        long_modules,
        {"codec/record.py": "x = 1\n" * (MAX_MODULE_LINES + 1)},
        ["lightning_nvcomp.codec.record: 401 lines"],
        id="401-line-module",
    ),
    pytest.param(
        long_functions,
        {"codec/record.py": "\n" + function_of(MAX_FUNCTION_LINES + 1)},
        ["lightning_nvcomp.codec.record.f (line 2): 61 lines"],
        id="61-line-function",
    ),
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_a_package_at_the_bounds_passes_each_check(tmp_path: Path, check: Callable[[Path], list[str]]) -> None:
    assert check(scratch(tmp_path, WITHIN)) == []


@pytest.mark.parametrize(("check", "files", "broken"), BREAKS)
def test_each_check_finds_what_breaks_its_rule(
    tmp_path: Path, check: Callable[[Path], list[str]], files: dict[str, str], broken: list[str]
) -> None:
    assert check(scratch(tmp_path, files)) == broken
