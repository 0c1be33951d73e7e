"""The documentation site as a reader meets it: every code example runs, the site builds with every link and anchor
checked, and the guides that list the package's commands, metrics and errors list all of them.

* Every ```` ```python ```` block of ``docs/**/*.md`` (and of ``BENCHMARKS.md``) runs in a fresh interpreter whose
  working directory is a fresh empty directory, as the README's do (:mod:`tests.helpers.doc_blocks`: the GPU-only
  substitutions, the prelude of names a reader already has, ``<!-- not run: why -->`` markers); one test per block,
  named by its file and line.
* ``mkdocs build --strict`` (``mkdocs.yml``): a page missing from the nav, a broken link or anchor, or a docstring
  the API reference cannot render fails it.
* ``docs/guides/cli.md`` names every command and option of ``lightning-nvcomp``, ``docs/guides/metrics.md`` every
  metric a save logs, ``docs/guides/reliability.md`` every error the package raises.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lightning_nvcomp.errors
from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.cli import build_parser, main
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.integrations.dcp.stats import DcpCheckpointStats
from lightning_nvcomp.integrations.lightning.sharded import rank_metrics
from lightning_nvcomp.options import Codec
from lightning_nvcomp.storage.remote import errors as remote_errors
from lightning_nvcomp.telemetry.savings import Savings
from lightning_nvcomp.telemetry.stats import SaveStats

from tests.helpers import doc_blocks
from tests.helpers.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [p for p in [REPO_ROOT / "BENCHMARKS.md"] if p.exists()]
PYTHON_BLOCKS = [block for page in PAGES for block in doc_blocks.blocks(page, "python")]


def _name(block: doc_blocks.Block) -> str:
    return f"{block.path.relative_to(REPO_ROOT)}:{block.line}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=_name)
def test_docs_python_block_runs(block: doc_blocks.Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked in {_name(block)} as not run: {block.not_run}")
    proc = doc_blocks.run(block, tmp_path, gpu=gpu_available())
    assert proc.returncode == 0, (
        f"{_name(block)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    )


def test_the_guides_have_examples_that_run_and_markers_that_say_why() -> None:
    guides = {block.path.name for block in PYTHON_BLOCKS if block.not_run is None}
    assert {"codec-and-durability.md", "metrics.md", "reliability.md"} <= guides, guides
    assert all(block.not_run for block in PYTHON_BLOCKS if block.not_run is not None), "a marker without a reason"


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = _mkdocs_build(REPO_ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-6000:]
    for page in ("index.html", "guides/cli/index.html", "reference/lightning_nvcomp/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    reference = (tmp_path / "site" / "reference" / "lightning_nvcomp" / "index.html").read_text()
    assert "max_decoded_nbytes" in reference  # load's docstring, rendered
    assert ":class:" not in reference  # the docstrings' Sphinx roles became links (scripts/griffe_roles.py)


def test_a_page_showing_a_root_file_keeps_its_links_working(tmp_path: Path) -> None:
    # BENCHMARKS.md and CHANGELOG.md link relative to the repository root; shown on docs/benchmarks.md and
    # docs/changelog.md (scripts/mkdocs_hooks.py), each kind of link still leads where it did
    for path, text in {
        "docs/index.md": "# Home\n",
        "docs/benchmarks.md": '--8<-- "BENCHMARKS.md"\n',
        "benchmarks/codec_bench.py": "print()\n",
        "tests/README.md": "# Tests\n",
        "BENCHMARKS.md": "# Benchmarks\n\n![ratio](benchmarks/results/plots/ratio.png)\n\n[the script](benchmarks/"
        "codec_bench.py), [home](docs/index.md#home), [the tests](tests/README.md), [the results](benchmarks/"
        "results/), [this](#benchmarks).\n",
        "mkdocs.yml": f"site_name: t\nrepo_url: https://example.org/r\nnav: [index.md, benchmarks.md]\n"
        f"validation: {{anchors: warn}}\nhooks: [{REPO_ROOT / 'scripts' / 'mkdocs_hooks.py'}]\n",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    plot = tmp_path / "benchmarks" / "results" / "plots" / "ratio.png"
    plot.parent.mkdir(parents=True)
    plot.write_bytes(bytes(range(256)))
    proc = _mkdocs_build(tmp_path, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-6000:]
    page = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    for link in (
        'src="results/plots/ratio.png"',  # a plot, copied into the site
        'href="codec_bench.py"',  # a script, copied too
        'href="../#home"',  # a page of the site
        'href="https://example.org/r/blob/main/tests/README.md"',  # Markdown outside docs/: the repository's page
        'href="https://example.org/r/tree/main/benchmarks/results"',  # a folder: the repository's page
        'href="#benchmarks"',
    ):
        assert link in page, link
    assert (tmp_path / "site" / "benchmarks" / "results" / "plots" / "ratio.png").read_bytes() == plot.read_bytes()

    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\n[gone](benchmarks/results/gone.json)\n")
    proc = _mkdocs_build(tmp_path, tmp_path / "site")
    assert proc.returncode != 0 and "benchmarks/results/gone.json" in proc.stderr, proc.stderr[-3000:]


def test_the_home_page_states_the_readmes_measured_figure() -> None:
    # one figure, stated in two places: the home page repeats the README's, word for word
    marker = "<!-- the measured figure, as README.md states it"
    home = (DOCS / "index.md").read_text()
    assert marker in home
    figure = " ".join(home.split(marker, 1)[1].split("-->", 1)[1].strip().split("\n\n", 1)[0].split())
    assert "**" in figure and figure in " ".join((REPO_ROOT / "README.md").read_text().split()), figure


# the command line's guides: their commands run, and estimate's outputs are what it prints ------------------------

#: The guides whose ```bash blocks hold only ``lightning-nvcomp`` commands, each run in the directory where the
#: guide's Python blocks ran; a command exits 0 unless its comment says ``# exit N``.
CLI_GUIDES = ["cli.md", "estimate.md"]
#: The guides where a ```text block right after a one-command ```bash block is that command's whole output, exactly
#: (``estimate`` is arithmetic; the other commands print timings).
EXACT_OUTPUT = ["estimate.md"]


def _command(line: str) -> tuple[list[str], int]:
    """A guide's command line as argv for ``python -m lightning_nvcomp``, and the exit status it expects."""
    command, _, comment = line.partition("  #")
    argv = shlex.split(command)
    assert argv[0] == "lightning-nvcomp", f"not a lightning-nvcomp command: {line}"
    expected = re.search(r"\bexit (\d)\b", comment)
    return argv[1:], int(expected.group(1)) if expected else 0


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """Run the command line in this process (in the working directory): its exit status, stdout and stderr. The
    commands leave torch on one thread (``lightning_nvcomp.cli.common.serial_torch``): put back here."""
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as stopped:  # argparse's
        status = int(stopped.code or 0)
    finally:
        torch.set_num_threads(threads)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", CLI_GUIDES)
def test_the_command_line_guides_commands_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = DOCS / "guides" / name
    monkeypatch.chdir(tmp_path)
    for block in doc_blocks.blocks(page, "python"):
        proc = doc_blocks.run(block, tmp_path, gpu=gpu_available())
        assert proc.returncode == 0, f"{_name(block)}: {proc.stderr[-4000:]}"
    found = doc_blocks.blocks(page)
    commands = 0
    for i, block in enumerate(found):
        if block.language != "bash":
            continue
        lines = [line for line in block.code.splitlines() if line.strip()]
        for line in lines:
            argv, expected = _command(line)
            status, out, err = _cli(argv)
            assert status == expected, f"{_name(block)}: {line} exited {status}\n{out[-2000:]}\n{err[-4000:]}"
            commands += 1
        after = found[i + 1] if i + 1 < len(found) else None
        if name in EXACT_OUTPUT and after is not None and after.language == "text" and len(lines) == 1:
            between = page.read_text().splitlines()[block.line + len(block.code.splitlines()) + 1 : after.line - 1]
            if not any(line.strip() for line in between):  # the text block follows the command directly
                assert out == after.code, f"{_name(after)} is not what `{lines[0]}` prints:\n{out}"
    assert commands >= 3, name


# the guides that list what the package has ---------------------------------------------------------------------


def _guide(name: str) -> str:
    return (DOCS / "guides" / name).read_text()


def test_the_cli_guide_names_every_command_and_option() -> None:
    guide = _guide("cli.md")
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for command, parser in subparsers.choices.items():
        if f"## `{command}`" not in guide:
            missing.append(f"a section for {command}")
        for action in parser._actions:
            missing += [f"{command} {o}" for o in action.option_strings if o not in ("-h", "--help") and o not in guide]
            missing += [f"{command} {c}" for c in action.choices or () if f"`{c}`" not in guide]
    assert not missing, missing
    for status in ("0", "1", "2"):
        assert f"| {status} |" in guide, f"exit status {status}"


def _metric_names() -> set[str]:
    """Every metric name a save logs: the savings of a save that ``auto`` chose, with every optional metric present
    (durable, slowdown measured, a price), a sharded save's per-rank metrics, and a DCP save's totals."""
    chosen = Prediction(Codec.ZSTD, 1.2, 0.1, 0.2, 0.2, alternatives=(Prediction(Codec.NONE, 1.0, 0.0, 0.3, 0.3),))
    stats = SaveStats("x.ckpt", Codec.ZSTD, 1000, 800, 0.1, 0.2, prediction=chosen, durable_s=0.3)
    names = set(Savings(gpu_hour_usd=2.0).add(stats, blocked_s=0.3, baseline_s=0.5, slowdown=0.1, behind_s=1.0))
    dcp = DcpCheckpointStats((stats, dataclasses.replace(stats, path="y")))
    names |= set(rank_metrics(dcp)) | set(dcp.metrics())
    # one name per family, as the guide writes it
    return {
        n.replace("rank0/", "rank<r>/").replace("predicted_zstd_", "predicted_<codec>_")
        for n in names
        if "rank1/" not in n and "predicted_none_" not in n
    }


def test_the_metrics_guide_explains_every_metric() -> None:
    guide = _guide("metrics.md")
    names = _metric_names()
    assert len(names) > 20, names
    assert not [n for n in sorted(names) if f"`{n}`" not in guide]


def test_the_reliability_guide_explains_every_error() -> None:
    guide = _guide("reliability.md")
    errors = [
        cls.__name__
        for module in (lightning_nvcomp.errors, remote_errors)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module.__name__
    ]
    assert len(errors) >= 12, errors
    assert not [e for e in errors if f"### `{e}`" not in guide]
