"""The benchmarks' results and their report: the JSON a benchmark writes with ``--json`` (``benchmarks/common.py``),
BENCHMARKS.md and its plots drawn from those results by ``benchmarks/report.py`` (whose ``--check`` CI runs), and
``benchmarks/gpu_all.sh``, which runs them all and never fails as a whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lightning_nvcomp

from tests.helpers.paths import REPO_ROOT

BENCH = REPO_ROOT / "benchmarks"
PNG = b"\x89PNG\r\n\x1a\n"


def run(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})}
    )


def report(*args: str) -> subprocess.CompletedProcess:
    """``python benchmarks/report.py ARGS`` in the working directory (a checkout's skeleton)."""
    return run(sys.executable, "benchmarks/report.py", *args)


@pytest.fixture(scope="module")
def codec_result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The result of a real (tiny) run of the codec benchmark on this machine, written to a relative --json path."""
    work = tmp_path_factory.mktemp("codec")
    proc = run(
        sys.executable,
        str(BENCH / "codec_bench.py"),
        *("--device", "cpu", "--dim", "64", "--layers", "1", "--steps", "2", "--batch", "2", "--cpu-sample-mb", "1"),
        *("--json", "out/latest-cpu.json"),
        cwd=work,
        env={"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]), "BENCH_DIR": str(work)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (work / "out").iterdir()) == ["latest-cpu.json"]  # no partial file left
    return json.loads((work / "out" / "latest-cpu.json").read_text())


@pytest.fixture
def skeleton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout's skeleton (benchmarks/report.py, docs/) as the working directory."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    shutil.copy(BENCH / "report.py", tmp_path / "benchmarks")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def put(result: dict, benchmark: str, name: str) -> Path:
    path = Path("benchmarks", "results", benchmark, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path


def section(text: str, heading: str) -> str:
    """The Markdown under ``heading`` up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    after = text.split(heading + "\n", 1)[1]
    ends = [after.find("\n" + "#" * n + " ") for n in range(1, len(level) + 1)]
    ends = [e for e in ends if e >= 0]
    return after[: min(ends)] if ends else after


@pytest.mark.slow
def test_a_result_names_its_machine_versions_command_and_repetitions(codec_result: dict) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import report
    finally:
        sys.path.remove(str(BENCH))
    assert all(k in codec_result for k in report.REQUIRED)
    assert codec_result["schema"] == report.SCHEMA and codec_result["benchmark"] == "codec"
    # the command reruns it from the checkout's root, without the output option
    assert codec_result["command"] == (
        "python benchmarks/codec_bench.py --device cpu --dim 64 --layers 1 --steps 2 --batch 2 --cpu-sample-mb 1"
    )
    assert codec_result["hardware"]["accelerator"] == "CPU" and codec_result["hardware"]["cores"] == os.cpu_count()
    assert codec_result["versions"]["torch"] == torch.__version__
    assert codec_result["versions"]["lightning_nvcomp"] == lightning_nvcomp.__version__
    assert codec_result["repetitions"] >= 1 and codec_result["statistic"]
    assert [r["class"] for r in codec_result["rows"]] == ["bf16 w", "fp32 w", "adam m", "adam v"]
    assert all(r["bound"] > 1 and r["cpu_zstd_ratio"] > 1 for r in codec_result["rows"])
    assert all(r.get("ans_ratio") is None for r in codec_result["rows"])  # no GPU here: no GPU figures


def test_write_result_records_torchrun_strips_output_options_and_writes_strict_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "examples"))
    monkeypatch.syspath_prepend(str(BENCH))
    import report

    import common

    assert common.SCHEMA == report.SCHEMA
    monkeypatch.chdir(tmp_path)
    script = str(BENCH / "some_bench.py")
    monkeypatch.setattr(
        sys, "argv", [script, "--dim", "8", "--json", "r.json", "--out=o.md", "--dir", "/tmp/w", "--label", "a b"]
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    common.write_result(
        "r.json", "dcp", setup="s", repetitions=2, statistic="median of 2", rows=[{"save_s": float("nan"), "n": 1}]
    )

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    result = json.loads(Path("r.json").read_text(), parse_constant=refuse)
    assert result["command"] == "torchrun --nproc_per_node=2 benchmarks/some_bench.py --dim 8 --label 'a b'"
    assert result["rows"] == [{"save_s": None, "n": 1}]
    assert sorted(os.listdir()) == ["r.json"]


@pytest.mark.slow
def test_the_report_shows_each_result_with_its_rerun_command_and_check_accepts_it(
    skeleton: Path, codec_result: dict
) -> None:
    put(codec_result, "codec", "latest-cpu.json")
    done = report()
    assert done.returncode == 0, done.stderr
    text = Path("BENCHMARKS.md").read_text()
    hw = codec_result["hardware"]
    run_md = section(text, f"### CPU: {hw['cpu']}, {hw['cores']} cores")
    assert f"- rerun: `{codec_result['command']} --json benchmarks/results/codec/latest-cpu.json`" in run_md
    assert f"- date: {codec_result['date']}; repetitions: {codec_result['repetitions']}" in run_md
    assert f"torch {torch.__version__}" in run_md
    for row in codec_result["rows"]:
        assert f"| {row['class']} | {row['mb']:.1f} | {row['bound']:.3f} | {row['cpu_zstd_ratio']:.3f} |" in run_md
    assert "gANS" not in run_md.split("\n| tensor class |", 1)[1].split("\n\n")[0]  # a CPU run: no GPU columns
    for title in ("Lightning steady state", "DCP", "Many items through DCP", "Remote storage", "Accelerate FSDP"):
        assert section(text, f"## {title}").strip().endswith("(see `benchmarks/gpu_all.sh`).")
    plot = Path("benchmarks/results/plots/codec-cpu-ratio.png")
    assert plot.read_bytes().startswith(PNG) and f"]({plot.as_posix()})" in run_md
    done = report("--check")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_check_fails_on_a_hand_edit_a_missing_plot_and_files_that_are_not_the_latest_results(
    skeleton: Path, codec_result: dict
) -> None:
    put(codec_result, "codec", "latest-cpu.json")
    assert report().returncode == 0
    md = Path("BENCHMARKS.md")
    written = md.read_text()
    md.write_text(written.replace(f"{codec_result['rows'][0]['bound']:.3f}", "9.999", 1))
    done = report("--check")
    assert done.returncode == 1
    assert "BENCHMARKS.md is not what the results give" in done.stderr and "+| bf16 w" in done.stderr
    assert "Run `python benchmarks/report.py`" in done.stderr

    md.write_text(written)
    Path("benchmarks/results/plots/codec-cpu-ratio.png").unlink()
    done = report("--check")
    assert done.returncode == 1 and "plots missing: benchmarks/results/plots/codec-cpu-ratio.png" in done.stderr

    assert report().returncode == 0  # draws it again
    Path("benchmarks/results/round6").mkdir()
    Path("benchmarks/results/round6/steady_disk.md").write_text("old")
    put(codec_result, "codec", "older.json")
    done = report("--check")
    assert done.returncode == 1
    assert "benchmarks/results/codec/older.json, benchmarks/results/round6/steady_disk.md" in done.stderr


def test_a_result_that_cannot_be_read_is_named_with_what_to_do(skeleton: Path) -> None:
    bad = put({"schema": 1, "benchmark": "dcp"}, "dcp", "latest-gpu.json")
    for args in ((), ("--check",)):
        done = report(*args)
        assert done.returncode == 1
        assert (
            f"{skeleton / bad}: lacks date, command" in done.stderr and "rerun dcp_bench.py with --json" in done.stderr
        )
    bad.write_text('{"schema": 1, "benchm')
    done = report("--check")
    assert done.returncode == 1 and f"{skeleton / bad}: not a readable JSON result" in done.stderr
    assert not Path("BENCHMARKS.md").exists()


def committed_steady() -> dict:
    path = BENCH / "results" / "steady" / "latest-cpu.json"
    if not path.exists():
        pytest.skip("no committed CPU result of the steady-state benchmark")
    return json.loads(path.read_text())


def test_the_savings_picture_is_the_gpu_runs_and_a_cpu_picture_says_it_is_one(skeleton: Path) -> None:
    cpu = committed_steady()
    put(cpu, "steady", "latest-cpu.json")
    assert report().returncode == 0
    text = Path("BENCHMARKS.md").read_text()
    cpu_heading = f"### CPU: {cpu['hardware']['cpu']}, {cpu['hardware']['cores']} cores"
    assert "`docs/savings.png` (the README's picture) is this run's savings plot." in section(text, cpu_heading)
    assert Path("docs/savings.png").read_bytes().startswith(PNG)
    sys.path.insert(0, str(skeleton / "benchmarks"))
    try:
        import report as module
    finally:
        sys.path.remove(str(skeleton / "benchmarks"))
    assert module.title_of(cpu) == f"CPU run (no GPU): {cpu['hardware']['cpu']}, {cpu['hardware']['cores']} cores"

    gpu = {**cpu, "hardware": {**cpu["hardware"], "accelerator": "GPU", "device": "NVIDIA H100 80GB HBM3", "gpus": 1}}
    gpu["hardware"]["gpu_memory_gb"] = 85.0
    put(gpu, "steady", "latest-gpu.json")
    assert report().returncode == 0
    text = Path("BENCHMARKS.md").read_text()
    gpu_md = section(text, "### GPU: NVIDIA H100 80GB HBM3")
    assert "`docs/savings.png` (the README's picture) is this run's savings plot." in gpu_md
    assert "docs/savings.png" not in section(text, cpu_heading)
    assert text.index("### GPU: NVIDIA H100") < text.index(cpu_heading)  # GPU runs first
    assert module.title_of(gpu) == f"GPU run: NVIDIA H100 80GB HBM3, {cpu['hardware']['cores']} CPU cores"
    for name in ("steady-gpu-lost", "steady-gpu-savings", "steady-cpu-lost", "steady-cpu-savings"):
        assert Path(f"benchmarks/results/plots/{name}.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize(
    ("env", "why"), [({"PYTHON": "false"}, "exit 1"), ({"DEADLINE_S": "10"}, "not run: no time left")]
)
def test_gpu_all_reports_each_failed_part_and_never_fails_as_a_whole(tmp_path: Path, env: dict, why: str) -> None:
    done = run("bash", "benchmarks/gpu_all.sh", cwd=REPO_ROOT, env={"OUT": str(tmp_path), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-2]
    assert "done: none" in summary
    for part in ("codec", "steady", "dcp", "dcp_items", "remote"):  # no GPU here: the CPU variants
        assert f"{part} ({why}" in summary
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["logs.tgz"]  # no result; the logs in one file


def test_the_committed_results_are_what_benchmarks_md_shows() -> None:
    files = [p for p in (BENCH / "results").rglob("*") if p.is_file()]
    assert len(files) <= 60
    done = run(sys.executable, "benchmarks/report.py", "--check", cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
