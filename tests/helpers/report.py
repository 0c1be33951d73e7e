"""A benchmark's test's two steps: the benchmark run for real (:func:`run_benchmark`) and ``benchmarks/report.py`` run
on its result in a checkout's skeleton (:func:`rendered_section`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO_ROOT


def run_benchmark(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python benchmarks/SCRIPT ARGS`` run in ``cwd`` with the checkout importable; asserts that it succeeded."""
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def rendered_section(result: dict, title: str, folder: Path) -> str:
    """The section ``title`` of the BENCHMARKS.md that ``benchmarks/report.py`` writes in ``folder`` (a fresh skeleton:
    the script, ``docs/``, and ``result`` as its benchmark's only CPU run); asserts that the report and its ``--check``
    both succeed there."""
    results = folder / "benchmarks" / "results" / result["benchmark"]
    results.mkdir(parents=True)
    (folder / "docs").mkdir()
    shutil.copy(REPO_ROOT / "benchmarks" / "report.py", folder / "benchmarks")
    (results / "latest-cpu.json").write_text(json.dumps(result))
    for args in ((), ("--check",)):
        done = subprocess.run(
            [sys.executable, "benchmarks/report.py", *args], capture_output=True, text=True, cwd=folder
        )
        assert done.returncode == 0, done.stderr
    return (folder / "BENCHMARKS.md").read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
