"""Packaging: the core needs neither framework, the integrations name their extra, and the metadata says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lightning_nvcomp

from conftest import REPO_ROOT, child_json, python_child

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
    "import lightning_nvcomp.integrations.lightning",
    "import lightning_nvcomp.integrations.accelerate",
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
    assert lightning_hint in errors["import lightning_nvcomp.integrations.lightning"][1]
    assert f"needs Accelerate: {accelerate_hint}" in errors["import lightning_nvcomp.integrations.accelerate"][1]
    assert all(kind == "MissingExtraError" for kind, _ in errors.values())
    # a failed integration import leaves no framework module behind
    assert result["modules_after"] == []


def test_lazy_attributes_with_the_frameworks_installed() -> None:
    pytest.importorskip("lightning")
    from lightning_nvcomp.integrations import lightning as integration
    from lightning_nvcomp.integrations import lightning_sharded

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
    # the test suite needs both frameworks
    assert "lightning-nvcomp[lightning,accelerate]" in extras["dev"]


def test_license_and_py_typed_are_shipped() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (REPO_ROOT / "lightning_nvcomp" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["lightning_nvcomp"]
