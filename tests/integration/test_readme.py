"""The README as a user meets it: its Python examples run as written, and its install section's claims hold.

Every ```` ```python ```` block of README.md runs in a fresh interpreter whose working directory is a fresh empty
directory (:mod:`doc_blocks`), so a block that crashes fails here. What "as written" allows, all of it documented in
``tests/helpers/doc_blocks.py`` and in the README's *Development* section:

* without a CUDA GPU and nvCOMP, ``map_location="cuda"`` -> ``map_location="cpu"`` and ``codec="ans"`` ->
  ``codec="zstd"`` (``doc_blocks.SUBSTITUTIONS``);
* the names a block takes from the reader's own program (``state``, ``model``, ``data``, ...) come from a small,
  real prelude (``doc_blocks.prelude``), and only those: a block imports what it uses;
* a block preceded by ``<!-- not run: why -->`` is skipped, saying why; no other block is.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from lightning_nvcomp.codec.gpu import gpu_available

from tests.helpers import doc_blocks
from tests.helpers.paths import REPO_ROOT

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

README = REPO_ROOT / "README.md"
PYTHON_BLOCKS = doc_blocks.blocks(README, "python")


def _failure(block: doc_blocks.Block, proc) -> str:
    return f"{block} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_readme_python_block_runs(block: doc_blocks.Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked in the README as not run: {block.not_run}")
    proc = doc_blocks.run(block, tmp_path, gpu=gpu_available())
    assert proc.returncode == 0, _failure(block, proc)


def test_the_readme_has_examples_and_says_how_they_run() -> None:
    assert len(PYTHON_BLOCKS) >= 5
    assert sum(b.not_run is None for b in PYTHON_BLOCKS) >= 4  # most of them run
    assert all(b.not_run for b in PYTHON_BLOCKS if b.not_run is not None), "a marker without a reason"
    development = " ".join(README.read_text().split("\n## Development", 1)[1].split())
    for old, new in doc_blocks.SUBSTITUTIONS:
        assert f"`{old}` becomes `{new}`" in development, (old, new)
    assert "<!-- not run: why -->" in development


# the runner itself ------------------------------------------------------------------------------------------------


def _markdown(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_runner_fails_a_crashing_block_naming_its_line(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """\
        # A doc

        ```python
        x = 1
        raise RuntimeError("the example is wrong")
        ```
        """,
    )
    (block,) = doc_blocks.blocks(doc, "python")
    assert (block.line, block.not_run) == (3, None)
    work = tmp_path / "work"
    work.mkdir()
    proc = doc_blocks.run(block, work, gpu=False)
    assert proc.returncode != 0
    assert f'File "{doc}", line 5' in proc.stderr and "RuntimeError: the example is wrong" in proc.stderr


def test_the_runner_runs_in_the_working_directory_with_only_the_names_a_block_uses(tmp_path: Path) -> None:
    # A block sees the prelude's names it mentions and nothing else: not torch, which it must import itself, nor
    # lightning_nvcomp's decoder registration (torch.load of one of our files fails before `import lightning_nvcomp`)
    doc = _markdown(
        tmp_path,
        """\
        ```python
        names = sorted(n for n in globals() if not n.startswith("__"))
        import json, os, sys
        print(json.dumps({"cwd": os.getcwd(), "names": names, "ours": "lightning_nvcomp" in sys.modules,
                          "state": sorted(state)}))
        ```

        ```python
        torch.zeros(1)
        ```
        """,
    )
    first, second = doc_blocks.blocks(doc, "python")
    work = tmp_path / "work"
    work.mkdir()
    proc = doc_blocks.run(first, work, gpu=False)
    assert proc.returncode == 0, _failure(first, proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(got.pop("cwd")).resolve() == work.resolve()
    assert got == {"names": ["state"], "ours": False, "state": ["model", "optimizer", "step"]}
    proc = doc_blocks.run(second, work, gpu=False)
    assert proc.returncode != 0 and "NameError: name 'torch' is not defined" in proc.stderr


def test_the_runner_substitutes_gpu_only_text_without_a_gpu_and_skips_marked_blocks_only(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """\
        <!-- not run: needs eight nodes -->

        ```python
        launch_everything()
        ```

        ```python
        print('map_location="cuda"', 'codec="ans"')
        ```

        ```bash
        echo not python
        ```
        """,
    )
    marked, plain = doc_blocks.blocks(doc, "python")
    assert marked.not_run == "needs eight nodes" and plain.not_run is None
    assert [b.language for b in doc_blocks.blocks(doc)] == ["python", "python", "bash"]
    work = tmp_path / "work"
    work.mkdir()
    substituted = doc_blocks.run(plain, work, gpu=False)
    assert substituted.stdout.strip() == 'map_location="cpu" codec="zstd"', substituted.stderr
    as_written = doc_blocks.run(plain, work, gpu=True)
    assert as_written.stdout.strip() == 'map_location="cuda" codec="ans"', as_written.stderr


# the install section ----------------------------------------------------------------------------------------------


def _install_section() -> str:
    text = README.read_text()
    assert "\n### Install\n" in text, "the README has no Install section"
    return text.split("\n### Install\n", 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[str]:
    return [
        line.split("  #", 1)[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)
        for line in block.splitlines()
    ]


def test_every_extra_the_install_section_names_exists() -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    section = _install_section()
    named = {e.strip() for group in re.findall(r"\[([a-z0-9_,-]+)\]", section) for e in group.split(",")}
    assert {"lightning", "accelerate", "cu12", "cu13"} <= named, named
    assert named <= set(extras), named - set(extras)


def test_the_install_section_matches_the_nvcomp_extra_to_torchs_cuda() -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    section = _install_section()
    assert 'python -c "import torch; print(torch.version.cuda)"' in _commands(section)
    for major in ("12", "13"):
        assert f"`[cu{major}]` for CUDA {major}.x" in section
        assert any(f"nvidia-nvcomp-cu{major}" in requirement for requirement in extras[f"cu{major}"])
        assert any(c.startswith(f'pip install ".[cu{major},') for c in _commands(section)), major
    assert "`lightning-nvcomp env`" in section


def test_the_install_section_has_a_cpu_only_recipe_and_a_build_that_works() -> None:
    commands = _commands(_install_section())
    cpu_torch = commands.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    first_package = next(i for i, c in enumerate(commands) if c.startswith("pip install ."))
    assert cpu_torch < first_package, commands
    # `build` is no part of pip: wherever the README builds, it installs build first
    for text in (_install_section(), README.read_text()):
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            if "python -m build" in block:
                assert block.index("pip install build") < block.index("python -m build"), block
