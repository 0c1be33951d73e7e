"""benchmarks/recode_bench.py: a real run on a tiny GPT from a fresh working directory with a relative --json path;
its JSON holds each write's times beside each kind of main-thread work, and benchmarks/report.py renders them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.report import rendered_section, run_benchmark

ARGS = ("--dim", "32", "--layers", "1", "--batch", "2", "--steps", "2", "--apart", "2", "--repeat", "2")
ARGS += ("--switch-interval", "0.002")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("recode")
    run_benchmark("recode_bench.py", *ARGS, "--json", "out/latest-cpu.json", cwd=work)
    assert sorted(p.name for p in work.iterdir()) == ["out"]  # its checkpoints are gone
    return json.loads((work / "out" / "latest-cpu.json").read_text())


def test_a_run_times_each_write_beside_each_kind_of_work(result: dict) -> None:
    assert result["benchmark"] == "recode"
    assert result["command"] == "python benchmarks/recode_bench.py " + " ".join(ARGS)  # no --json
    cases = [(r["save"], r["beside"]) for r in result["rows"]]
    assert cases == [(s, b) for s in ("standalone", "delta") for b in ("nothing", "training", "python")]
    for row in result["rows"]:
        assert len(row["write_s"]) == result["repetitions"] == 2 and all(t > 0 for t in row["write_s"]), row
        assert row["file_mb"] > 0 and row["bit_exact"] is True
    assert result["switch_interval_s"] == 0.002 and result["state_mb"] > 0  # the one asked for, not Python's 5 ms


def test_the_report_renders_the_run(result: dict, tmp_path: Path) -> None:
    section = rendered_section(result, "Async writes beside training", tmp_path)
    delta = next(r for r in result["rows"] if r["save"] == "delta" and r["beside"] == "python")
    alone = next(r for r in result["rows"] if r["save"] == "delta" and r["beside"] == "nothing")
    median = sorted(delta["write_s"])[0] / 2 + sorted(delta["write_s"])[1] / 2
    slower = median / (sum(alone["write_s"]) / 2)
    assert f"| delta | python | {median:.3f} | {slower:.1f} | {delta['file_mb']:.1f} | yes |" in section
