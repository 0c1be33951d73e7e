"""Packaging: the core needs neither framework, the integrations name their extra, and the metadata says so."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import lightning_nvcomp

from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import child_json, python_child

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

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
    assert core == {"torch", "zstandard", "numpy", "tqdm"}
    assert not core & {"lightning", "pytorch-lightning", "lightning-fabric", "accelerate"}
    extras = project["optional-dependencies"]
    assert {_name(r) for r in extras["lightning"]} == {"lightning"}
    assert {_name(r) for r in extras["accelerate"]} == {"accelerate"}
    assert {_name(r) for r in extras["cu12"]} == {"nvidia-nvcomp-cu12"}
    assert {_name(r) for r in extras["cu13"]} == {"nvidia-nvcomp-cu13"}
    assert {_name(r) for r in extras["remote"]} == {"fsspec"}
    assert {_name(r) for r in extras["s3"]} == {"lightning-nvcomp", "s3fs"}
    # the test suite needs both frameworks, and S3 (s3fs against a local moto server)
    assert "lightning-nvcomp[lightning,accelerate,s3]" in extras["dev"]
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


# the built wheel -----------------------------------------------------------------------------------------------

#: What ``python -m build`` needs of the working tree: the project's metadata, its readme and license, the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "lightning_nvcomp")


def _package_files(root: Path) -> set[str]:
    """Every file of the package under ``root`` (``lightning_nvcomp/...``), bytecode caches left out."""
    return {
        p.relative_to(root).as_posix()
        for p in (root / "lightning_nvcomp").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.mark.slow
def test_built_wheel_installs_and_runs(tmp_path: Path) -> None:
    """``python -m build`` (sdist, then the wheel from the sdist, as a user or a release builds it) makes a wheel
    that holds every module and data file of the package, installs into a fresh environment and runs there: the
    ``lightning-nvcomp`` command, the modules of every subpackage and the Lightning entry points."""
    import shutil
    import subprocess
    import sys
    import sysconfig
    import zipfile

    source = tmp_path / "src"  # a copy: building in the working tree would leave build/ there (and reuse it)
    for name in BUILD_INPUTS:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("lightning_nvcomp-*-py3-none-any.whl")
    (sdist,) = dist.glob("lightning_nvcomp-*.tar.gz")

    expected = _package_files(source)
    assert {"lightning_nvcomp/py.typed", "lightning_nvcomp/cli/__init__.py"} <= expected
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    assert {n for n in names if n.startswith("lightning_nvcomp/")} == expected
    assert f"{info}/licenses/LICENSE" in names
    assert "lightning-nvcomp = lightning_nvcomp.cli:main" in entry_points
    assert "[lightning.pytorch.callbacks_factory]" in entry_points
    for extra in ("lightning", "accelerate", "cu12", "cu13", "dev"):
        assert f"Provides-Extra: {extra}" in metadata, extra
    import tarfile

    with tarfile.open(sdist) as archive:
        in_sdist = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "LICENSE"} | expected <= in_sdist

    # A fresh environment without pip; the wheel installed with --no-deps by this interpreter's pip, and this
    # environment's packages (torch, Lightning...) reachable after its own through a .pth path (not the editable
    # install's finder: the directories a .pth names are added without their own .pth files).
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    run = dict(capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    help_ = subprocess.run([str(env / "bin" / "lightning-nvcomp"), "--help"], **run)
    assert help_.returncode == 0, help_.stderr[-3000:]
    assert "usage: lightning-nvcomp" in help_.stdout
    for command in ("inspect", "verify", "convert", "estimate", "bench"):
        assert command in help_.stdout
    modules = sorted(
        n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for n in expected
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
factory = [e for e in entry_points(group="lightning.pytorch.callbacks_factory") if e.name == "lightning_nvcomp"]
print(json.dumps({{"file": lightning_nvcomp.__file__, "version": lightning_nvcomp.__version__,
                   "callbacks": [type(c).__name__ for c in factory[0].load()()], "optional": optional}}))
"""
    child = subprocess.run([str(python), "-I", "-c", check], **run)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(env.resolve()), result["file"]  # the wheel, not the repo
    assert result["version"] == lightning_nvcomp.__version__
    assert result["callbacks"] == ["NvcompSavings"]
    # the frameworks of the dev extra are installed here: their integrations imported
    assert not any(".integrations." in name for name in result["optional"]), result["optional"]
    version = subprocess.run([str(python), "-I", "-m", "lightning_nvcomp", "--version"], **run)
    assert version.returncode == 0 and version.stdout.strip() == f"lightning-nvcomp {lightning_nvcomp.__version__}"


def test_readme_installs_from_source_until_a_release() -> None:
    """No release is on a package index yet: every ``pip install`` the README's Quickstart shows installs a path, a
    built wheel or a ``git+`` URL, never a bare ``lightning-nvcomp[...]`` that no index serves (or one of what comes
    first from an index: torch, ``build``)."""
    readme = (REPO_ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", quickstart, flags=re.S))
    installs = re.findall(r"pip install ([^\n#]+)", commands)
    assert len(installs) >= 4, installs
    for spec in installs:
        spec = spec.split("&&")[0].strip().strip('"')
        if spec.split()[0] in ("torch", "build"):
            continue
        assert spec.startswith((".", "lightning_nvcomp-")) or " @ git+" in spec, spec
    assert "python -m build" in quickstart
