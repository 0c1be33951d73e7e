"""Packaging: the core needs neither framework, the integrations name their extra, the metadata says so; the release
(``scripts/release_check.sh``: the sdist and wheel, what they hold, the wheel installed and run) and its notes."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import trove_classifiers
from packaging.metadata import Metadata
from packaging.specifiers import SpecifierSet

import lightning_nvcomp
from lightning_nvcomp import _moved

from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import child_json, python_child

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

#: The wheel's name: its C module built against the limited API, for every Python from 3.10 on this platform.
WHEEL = r"lightning_nvcomp-{version}-cp310-abi3-linux_\w+\.whl"
FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate")

#: Child-process prologue: every framework module is unimportable (as if not installed), and every attempt to
#: import one is recorded in ``ATTEMPTS``.
BLOCK_FRAMEWORKS = f"""
import sys

BLOCKED = {FRAMEWORKS!r}
ATTEMPTS = []


class BlockFrameworks:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            ATTEMPTS.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, BlockFrameworks())


def framework_modules():
    return sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)


assert not framework_modules(), framework_modules()
"""


def test_core_imports_no_framework(tmp_path: Path) -> None:
    code = (
        BLOCK_FRAMEWORKS
        + """
import contextlib, importlib, io, json
import torch

import lightning_nvcomp
import lightning_nvcomp.dcp
cli = importlib.import_module("lightning_nvcomp.cli")

path = sys.argv[1]
state = {"w": torch.randn(64, 32), "ids": torch.arange(100), "step": 7}
lightning_nvcomp.save(state, path, codec="zstd")
back = lightning_nvcomp.load(path)
plain = torch.load(path, weights_only=True)
with contextlib.redirect_stdout(io.StringIO()):
    verified = cli.main(["verify", path])
result = {
    "equal": all(torch.equal(back[k], state[k]) and torch.equal(plain[k], state[k]) for k in ("w", "ids")),
    "step": back["step"],
    "verify": verified,
    "modules": framework_modules(),
    "attempts": list(ATTEMPTS),
}

errors = {}
for statement in [
    "from lightning_nvcomp import NvcompCheckpointIO",
    "lightning_nvcomp.NvcompSavings",
    "lightning_nvcomp.NvcompFSDPStrategy",
    "import lightning_nvcomp.integrations.lightning.checkpoint_io",
    "import lightning_nvcomp.integrations.accelerate.attach",
]:
    try:
        exec(statement)
    except ImportError as err:
        errors[statement] = [type(err).__name__, str(err)]
    else:
        errors[statement] = None
result["errors"] = errors
result["modules_after"] = framework_modules()
print(json.dumps(result))
"""
    )
    proc = python_child(code, str(tmp_path / "small.pt"), check=True)
    result = child_json(proc)
    assert result["equal"] and result["step"] == 7 and result["verify"] == 0
    # the core neither imported a framework nor even tried to
    assert result["modules"] == [] and result["attempts"] == []
    errors = result["errors"]
    lightning_hint = 'pip install "lightning-nvcomp[lightning]"'
    accelerate_hint = 'pip install "lightning-nvcomp[accelerate]"'
    assert errors["from lightning_nvcomp import NvcompCheckpointIO"][1].startswith(
        f"NvcompCheckpointIO needs Lightning: {lightning_hint}"
    )
    assert errors["lightning_nvcomp.NvcompSavings"][1].startswith(f"NvcompSavings needs Lightning: {lightning_hint}")
    assert errors["lightning_nvcomp.NvcompFSDPStrategy"][1].startswith(
        f"NvcompFSDPStrategy needs Lightning: {lightning_hint}"
    )
    assert lightning_hint in errors["import lightning_nvcomp.integrations.lightning.checkpoint_io"][1]
    assert f"needs Accelerate: {accelerate_hint}" in errors["import lightning_nvcomp.integrations.accelerate.attach"][1]
    assert all(kind == "MissingExtraError" for kind, _ in errors.values())
    # a failed integration import leaves no framework module behind
    assert result["modules_after"] == []


def test_lazy_attributes_with_the_frameworks_installed() -> None:
    pytest.importorskip("lightning")
    from lightning_nvcomp.integrations.lightning import checkpoint_io as integration
    from lightning_nvcomp.integrations.lightning import sharded as lightning_sharded

    assert lightning_nvcomp.NvcompCheckpointIO is integration.NvcompCheckpointIO
    assert lightning_nvcomp.NvcompSavings is integration.NvcompSavings
    assert lightning_nvcomp.NvcompFSDPStrategy is lightning_sharded.NvcompFSDPStrategy
    assert lightning_nvcomp.NvcompModelParallelStrategy is lightning_sharded.NvcompModelParallelStrategy
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        lightning_nvcomp.NoSuchThing  # noqa: B018


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_pyproject_core_needs_no_framework() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert core == {"torch", "zstandard", "crc32c", "numpy", "tqdm"}
    assert not core & {"lightning", "pytorch-lightning", "lightning-fabric", "accelerate"}
    extras = project["optional-dependencies"]
    assert {_name(r) for r in extras["lightning"]} == {"lightning"}
    assert {_name(r) for r in extras["accelerate"]} == {"accelerate"}
    assert {_name(r) for r in extras["cu12"]} == {"nvidia-nvcomp-cu12"}
    assert {_name(r) for r in extras["cu13"]} == {"nvidia-nvcomp-cu13"}
    assert {_name(r) for r in extras["remote"]} == {"fsspec"}
    assert {_name(r) for r in extras["s3"]} == {"lightning-nvcomp", "s3fs"}
    # the test suite needs both frameworks, S3 (s3fs against a local moto server) and the docs site's tools
    assert "lightning-nvcomp[lightning,accelerate,s3,docs]" in extras["dev"]
    assert "moto" in {_name(r) for r in extras["dev"]}


def test_license_and_py_typed_are_shipped() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (REPO_ROOT / "lightning_nvcomp" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["lightning_nvcomp"]


# the release: scripts/release_check.sh and what it builds ------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """What one run of ``scripts/release_check.sh`` left: its output, the two files and the environment where the
    wheel is installed."""

    output: str
    wheel: Path
    sdist: Path
    env: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("release")
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "release_check.sh"), str(root / "dist")],
        env={**os.environ, "PYTHON": sys.executable, "RELEASE_ENV": str(root / "env")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    version = lightning_nvcomp.__version__
    names = sorted(p.name for p in (root / "dist").iterdir())
    # one wheel for every Python of this platform: the C module is built against the limited API
    assert len(names) == 2 and re.fullmatch(WHEEL.format(version=re.escape(version)), names[0]), names
    assert names[1] == f"lightning_nvcomp-{version}.tar.gz"
    return Release(
        proc.stdout + proc.stderr,
        root / "dist" / names[0],
        root / "dist" / names[1],
        root / "env",
    )


#: The C module a wheel holds built, where the sdist holds its source.
C_MODULE = "lightning_nvcomp/codec/_planes"


def _package_files(root: Path) -> set[str]:
    """Every source file of the package under ``root`` (``lightning_nvcomp/...``): what the sdist holds. Bytecode
    caches and built modules (an editable install builds the C module in the tree) are left out."""
    return {
        p.relative_to(root).as_posix()
        for p in (root / "lightning_nvcomp").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")
    }


def _wheel_files(root: Path) -> set[str]:
    """What the wheel holds of the package: its sources, the C module built in place of its source."""
    return (_package_files(root) - {f"{C_MODULE}.c"}) | {f"{C_MODULE}.abi3.so"}


def _metadata(wheel: Path) -> Metadata:
    """The wheel's METADATA, validated as PyPI validates it."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Metadata.from_email(archive.read(name), validate=True)


@pytest.mark.slow
def test_the_release_check_builds_checks_and_runs_the_release(release: Release) -> None:
    """Both files pass ``twine check --strict``, and the wheel's command, installed in a fresh environment, says
    this version."""
    for path in (release.wheel, release.sdist):
        # twine wraps a long line after "Checking"
        assert re.search(rf"Checking\s+\S*{re.escape(path.name)}: \S*PASSED", release.output), release.output
    assert f"lightning-nvcomp {lightning_nvcomp.__version__}: " in release.output.splitlines()[-1]


@pytest.mark.slow
def test_the_wheel_holds_the_package_its_license_and_nothing_else(release: Release) -> None:
    expected = _wheel_files(REPO_ROOT)
    assert {"lightning_nvcomp/py.typed", "lightning_nvcomp/cli/__init__.py"} <= expected
    with zipfile.ZipFile(release.wheel) as archive:
        names = set(archive.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    # no tests, benchmarks, examples, configs, scripts or docs: the package and its dist-info only
    assert {n for n in names if not n.startswith(f"{info}/")} == expected
    assert f"{info}/licenses/LICENSE" in names
    assert "lightning-nvcomp = lightning_nvcomp.cli:main" in entry_points
    assert "[lightning.pytorch.callbacks_factory]" in entry_points


@pytest.mark.slow
def test_the_wheels_metadata_is_what_pypi_shows(release: Release) -> None:
    """The version, license, links, classifiers (each one PyPI knows), keywords and extras of the built wheel."""
    meta = _metadata(release.wheel)
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert str(meta.version) == lightning_nvcomp.__version__
    assert meta.license_expression == "Apache-2.0"
    assert meta.description_content_type == "text/markdown"
    assert meta.description == (REPO_ROOT / "README.md").read_text()
    assert set(meta.provides_extra or ()) == set(project["optional-dependencies"])

    urls = meta.project_urls or {}
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues", "Source"}
    assert all(url.startswith("https://") for url in urls.values()), urls
    repository = urls["Homepage"]
    assert urls["Source"] == repository
    assert urls["Issues"] == f"{repository}/issues"
    assert urls["Changelog"] == f"{repository}/blob/main/CHANGELOG.md"

    classifiers = meta.classifiers or []
    assert not set(classifiers) - trove_classifiers.classifiers, set(classifiers) - trove_classifiers.classifiers
    for prefix in ("Development Status ::", "Intended Audience ::", "Topic ::", "Environment :: GPU :: NVIDIA CUDA"):
        assert any(c.startswith(prefix) for c in classifiers), prefix
    # the Python versions claimed: those requires-python allows, from its lowest on, this interpreter's among them
    pythons = sorted(
        int(c.rsplit(".", 1)[1]) for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert pythons == list(range(pythons[0], pythons[-1] + 1)) and sys.version_info.minor in pythons
    allowed = SpecifierSet(str(meta.requires_python))
    assert f"3.{pythons[0]}" in allowed and f"3.{pythons[0] - 1}" not in allowed
    # each CUDA major an nvCOMP extra installs for
    cuda = {extra.removeprefix("cu") for extra in project["optional-dependencies"] if re.fullmatch(r"cu\d+", extra)}
    assert {f"Environment :: GPU :: NVIDIA CUDA :: {major}" for major in cuda} <= set(classifiers)
    assert {"pytorch", "checkpoint", "compression", "nvcomp"} <= set(meta.keywords or ())


@pytest.mark.slow
def test_the_sdist_holds_what_a_source_build_and_a_reader_need(release: Release) -> None:
    with tarfile.open(release.sdist) as archive:
        top = f"lightning_nvcomp-{lightning_nvcomp.__version__}"
        assert all(n == top or n.startswith(f"{top}/") for n in archive.getnames())
        names = {n.removeprefix(f"{top}/") for n in archive.getnames()}
        assert archive.extractfile(f"{top}/CHANGELOG.md").read() == (REPO_ROOT / "CHANGELOG.md").read_bytes()
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "lightning_nvcomp/py.typed"} <= names
    assert _package_files(REPO_ROOT) <= names
    assert not {n for n in names if n.split("/")[0] in ("tests", "benchmarks", ".git", ".venv", "dist", "build")}


@pytest.mark.slow
def test_the_installed_wheel_runs_every_module_and_the_lightning_entry_point(release: Release) -> None:
    """In the fresh environment the release check made: every module of every subpackage imports from the wheel,
    Lightning finds the savings callback through its entry point, the byte planes' C module is the wheel's, and
    ``python -m lightning_nvcomp`` runs."""
    python = release.env / "bin" / "python"
    modules = sorted(
        n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for n in _package_files(REPO_ROOT)
        if n.endswith(".py") and not n.endswith("/__main__.py")  # that one runs the command line: below
    )
    check = f"""
import importlib, json, sys
from importlib.metadata import entry_points
import lightning_nvcomp
modules = {modules!r}
optional = {{}}
for name in modules:
    try:
        importlib.import_module(name)
    except ImportError as err:  # an optional extra's backend missing here says so; any other failure fails
        if type(err).__name__ != "MissingExtraError":
            raise
        optional[name] = str(err)
from lightning_nvcomp.codec import planes
factory = [e for e in entry_points(group="lightning.pytorch.callbacks_factory") if e.name == "lightning_nvcomp"]
print(json.dumps({{"file": lightning_nvcomp.__file__, "version": lightning_nvcomp.__version__,
                   "callbacks": [type(c).__name__ for c in factory[0].load()()], "optional": optional,
                  "native": planes._native and planes._native.__file__}}))
"""
    # outside the checkout, without PYTHONPATH: the wheel's package, not this tree's
    run = dict(capture_output=True, text=True, timeout=300, cwd=str(release.env), env={"PATH": os.environ["PATH"]})
    child = subprocess.run([str(python), "-I", "-c", check], **run)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(release.env.resolve()), result["file"]
    assert result["version"] == lightning_nvcomp.__version__
    assert result["callbacks"] == ["NvcompSavings"]
    assert result["native"] and Path(result["native"]).resolve().is_relative_to(release.env.resolve())
    # the frameworks of the dev extra are installed here: their integrations imported
    assert not any(".integrations." in name for name in result["optional"]), result["optional"]
    version = subprocess.run([str(python), "-I", "-m", "lightning_nvcomp", "--version"], **run)
    assert version.returncode == 0 and version.stdout.strip() == f"lightning-nvcomp {lightning_nvcomp.__version__}"


# what the README and the docs say about the release ------------------------------------------------------------

#: The Markdown files a user installs from: the README and the documentation site's pages.
USER_DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def test_install_lines_name_this_release_its_extras_and_its_repository() -> None:
    """Every extra a ``pip install`` of the package names exists, every wheel or sdist named is this version's,
    and every link to the repository is the one ``[project.urls]`` gives (no placeholder in its place)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    repository = project["urls"]["Homepage"]
    version = lightning_nvcomp.__version__
    installs = 0
    for path in USER_DOCS:
        text = path.read_text()
        name = path.relative_to(REPO_ROOT)
        for line in (line for line in text.splitlines() if "pip install" in line):
            for group in re.findall(r"(?:lightning-nvcomp|lightning_nvcomp-\S+?\.whl|(?<![\w/])\.)\[([^\]]+)\]", line):
                installs += 1
                assert {e.strip() for e in group.split(",")} <= extras, f"{name}: {line}"
        for built in re.findall(r"lightning_nvcomp-([0-9][^-\s]*?)(?:-cp310-abi3-\w+\.whl|\.tar\.gz)", text):
            assert built == version, f"{name} names lightning_nvcomp-{built}, the version is {version}"
        for link in re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", text):
            assert link.removesuffix(".git") == repository, f"{name}: {link}"
        assert "<repository URL>" not in text, name
    assert installs, "no install line with an extra in the README or the docs"


# the release notes ---------------------------------------------------------------------------------------------

CHANGELOG = REPO_ROOT / "CHANGELOG.md"
#: Keep a Changelog's kinds of change, in its order, then what a user of the previous release does.
KINDS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Migration from 0.2", "Migration from 0.1"]
#: Words of a work log, not of release notes: rounds and calls of benchmarks, issue numbers, measurements' files.
WORK_HISTORY = [
    r"\bround ?\d",
    r"\bcall ?\d",
    r"\bissues? ?\d",
    r"\bbenchmarks/results/",
    r"not yet explained",
    r"to be measured",
    r"\btests/\w+",
]


def _sections(text: str, level: str) -> list[tuple[str, str]]:
    """(heading, body) of each heading of ``level`` ("## ", "### ") in ``text``, in order."""
    parts = re.split(rf"^{level}(.*)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def test_the_changelog_is_release_notes_for_this_version() -> None:
    text = CHANGELOG.read_text()
    releases = _sections(text, "## ")
    assert all(len(notes.encode()) <= 25_000 for _, notes in releases), [len(notes.encode()) for _, notes in releases]
    (first, notes), (previous, _) = releases[0], releases[1]
    match = re.fullmatch(r"(\S+) \((\d{4}-\d{2}-\d{2})\)", first)
    assert match and match.group(1) == lightning_nvcomp.__version__, first
    datetime.date.fromisoformat(match.group(2))
    major_minor = ".".join(previous.split(" ")[0].split(".")[:2])
    assert previous.split(".")[:2] != first.split(".")[:2]
    kinds = [heading for heading, _ in _sections(notes, "### ")]
    assert kinds == [kind for kind in KINDS if kind in kinds] and f"Migration from {major_minor}" in kinds, kinds
    for pattern in WORK_HISTORY:
        assert not re.search(pattern, text, flags=re.I), (pattern, re.search(rf".*{pattern}.*", text, flags=re.I))
    assert not re.search(r"^\s*\|", text, flags=re.M), "a table: measurements belong in BENCHMARKS.md"
    # the site includes this file: a relative link would point nowhere there
    assert not re.findall(r"\]\((?!https://)[^)]*\)", text)


def _resolve(dotted: str) -> object:
    """The object a dotted name of the package names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_changelog_names_what_exists_and_every_moved_module() -> None:
    """Every ``lightning_nvcomp.`` name the 0.2.0 notes give exists (moved 0.1 modules through their deprecated
    path), and the migration notes name every 0.1 module path that moved."""
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    notes = next(body for heading, body in _sections(CHANGELOG.read_text(), "## ") if heading.startswith("0.2.0"))
    names = set(re.findall(r"\blightning_nvcomp(?:\.[A-Za-z_]\w*)+", " ".join(re.findall(r"`([^`]+)`", notes))))
    assert len(names) > 10, names
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in sorted(names):
            _resolve(name)
    migration = dict(_sections(notes, "### "))["Migration from 0.1"]
    for old in _moved.MOVED:
        assert f"`lightning_nvcomp.{old}`" in migration, old
