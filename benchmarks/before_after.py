"""Before and after: this tree's codec and Lightning benchmarks (codec_bench.py, lightning_bench.py) run against two
package trees, before, after, before, after ... for N rounds in one run, each run a fresh process with
``PYTHONPATH=<tree>``. Writes every run's figures and, per figure, each tree's median (min-max) and the median of the
rounds' after/before ratios, as ``<out>/<name>.json`` and a Markdown table ``<out>/<name>.md``.

    python benchmarks/before_after.py --before ../main --after . --rounds 7 --name cpu --out /tmp/before-after \\
        --codec-args "--device cpu --dim 384 --layers 4 --steps 20 --batch 2" \\
        --lightning-args "--dim 384 --layers 4 --steps 20 --batch 2 --codec zstd --probe-mb 64 --repeat 3"

A tree is a folder holding ``lightning_nvcomp/``. Both trees run the same script text, this tree's. Where a tree has a
module the scripts import only under its name from before issue 33 (``MOVED``), that module is imported and also
registered under its new name: the code that tree's own benchmark scripts import. This script sets the benchmarks'
``--json``, ``--state-cache`` (one trained state for every run, made by the first) and ``--dir`` (lightning) and
``BENCH_DIR`` (codec) to a temporary folder (under ``--work-dir``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pathlib
import platform
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = {"codec": HERE / "codec_bench.py", "lightning": HERE / "lightning_bench.py"}
#: Modules the scripts import that issue 33 moved: the name now -> the name before.
MOVED = {
    "lightning_nvcomp._process": "lightning_nvcomp.resources",
    "lightning_nvcomp.auto.probe": "lightning_nvcomp.probe",
    "lightning_nvcomp.storage.local": "lightning_nvcomp.storage",
}
#: Names the scripts import from a module both trees have, which the tree before issue 33 held elsewhere:
#: (new module, name) -> old module.
MOVED_NAMES = {("lightning_nvcomp.format.contents", "leaves"): "lightning_nvcomp.tree"}
CHILD = "--run-script"  # argv[1] of the process that runs one benchmark on one tree


def has_module(tree: pathlib.Path, name: str) -> bool:
    path = tree.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def aliases_for(tree: pathlib.Path) -> dict[str, str]:
    """The modules of ``MOVED`` that ``tree`` has only under their old names (new name -> old name), and the names of
    ``MOVED_NAMES`` it holds in their old modules (``"module:name"`` -> old module)."""
    if not has_module(tree, "lightning_nvcomp"):
        raise SystemExit(f"{tree}: no lightning_nvcomp/ package there; give the folder that holds it")
    aliases = {}
    for new, old in MOVED.items():
        if not has_module(tree, new):
            if not has_module(tree, old):
                raise SystemExit(f"{tree}: has neither {new} nor {old}, which the benchmark scripts import")
            aliases[new] = old
    for (new, name), old in MOVED_NAMES.items():
        if has_module(tree, old):
            aliases[f"{new}:{name}"] = old
    return aliases


def run_script(tree: str, aliases: str, script: str, *args: str) -> None:
    """In a run's own process: run ``script`` as ``python script args`` would, on the package in ``tree``."""
    sys.path[0] = os.path.dirname(script)
    for new, old in json.loads(aliases).items():
        module, _, name = new.partition(":")
        if name:
            setattr(importlib.import_module(module), name, getattr(importlib.import_module(old), name))
        else:
            sys.modules[new] = importlib.import_module(old)
    import lightning_nvcomp

    origin = pathlib.Path(lightning_nvcomp.__file__).resolve()
    if not origin.is_relative_to(pathlib.Path(tree).resolve()):
        raise SystemExit(f"lightning_nvcomp came from {origin}, not from {tree}: an installed copy shadows the tree")
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def describe(tree: pathlib.Path) -> str:
    """The tree's commit (and whether its package has changes since), where the tree is a git checkout's root."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    if git("rev-parse", "--show-toplevel") != str(tree):
        return "not a git checkout's root"
    changed = git("status", "--porcelain", "--", "lightning_nvcomp")
    return f"commit {git('rev-parse', '--short', 'HEAD')}" + (", lightning_nvcomp/ changed since" if changed else "")


def run_once(tree: pathlib.Path, bench: str, args: list[str], work: pathlib.Path, timeout_s: float) -> dict:
    """One run of ``bench`` on ``tree`` in a fresh process: its figures, or its exit status and its output's end."""
    out = work / "figures.json"
    out.unlink(missing_ok=True)
    own = ["--json", str(out), "--state-cache", str(work / "state")]
    own += ["--dir", str(work / "lightning")] if bench == "lightning" else []
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", BENCH_DIR=str(work))
    command = [sys.executable, __file__, CHILD, str(tree), json.dumps(aliases_for(tree)), str(SCRIPTS[bench])]
    load, begin = os.getloadavg()[0], time.perf_counter()
    try:
        done = subprocess.run([*command, *args, *own], env=env, cwd=work, capture_output=True, timeout=timeout_s)
        status, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as timeout:
        status, output = f"killed after {timeout_s:.0f} s", (timeout.stdout or b"") + (timeout.stderr or b"")
    run = {"seconds": round(time.perf_counter() - begin, 1), "load_1min": load}
    if status == 0:
        return run | json.loads(out.read_text())
    return run | {"failed": status, "output_tail": output.decode(errors="replace")[-3000:]}


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per figure: each tree's values and median, and each round's after/before ratio and their median."""
    figures: dict[str, dict] = {}
    for run in runs:
        for name, value in run.get("figures", {}).items():
            figures.setdefault(name, {"before": {}, "after": {}})[run["tree"]][run["round"]] = value
    table = {}
    for name, by_tree in figures.items():
        before, after = by_tree["before"], by_tree["after"]
        ratios = [after[r] / before[r] for r in sorted(before.keys() & after.keys()) if before[r]]
        table[name] = {
            "before": sorted(before.values()),
            "after": sorted(after.values()),
            "ratios": sorted(ratios),
            "before_median": statistics.median(before.values()) if before else None,
            "after_median": statistics.median(after.values()) if after else None,
            "ratio_median": statistics.median(ratios) if ratios else None,
        }
    return table


def spread(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


def better(name: str) -> str:
    return "higher" if name.endswith(" GB/s") else "lower" if name.endswith(" s") else "same"


def markdown(report: dict) -> str:
    loads = [run["load_1min"] for bench in report["benchmarks"].values() for run in bench["runs"]]
    lines = [
        f"# Before/after benchmark: {report['name']}",
        "",
        f"- date: {report['date']}; machine: {report['machine']}; Python {report['python']}",
        f"- before: `{report['before']['tree']}` ({report['before']['describe']}); after: `{report['after']['tree']}` "
        f"({report['after']['describe']})",
        f"- {report['rounds']} rounds, in each round before then after, every run a fresh process; "
        + (
            f"before those, {report['warmup']} uncounted run(s) of each benchmark on the after tree"
            if report["warmup"]
            else "no warm-up"
        )
        + "; the first run trains the state, every later one loads it; load average (1 min) as runs began: "
        f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores",
        "- the same script text runs on both trees (this tree's benchmarks/)"
        + (
            "; the before tree has these modules the scripts import only under their old names, imported from there: "
            + ", ".join(f"`{new}` = `{old}`" for new, old in report["before"]["aliases"].items())
            if report["before"]["aliases"]
            else ""
        ),
        "- each figure: the median (min-max) of the rounds; after/before: the median (min-max) of each round's "
        "after/before ratio. GB/s: higher is better; s: lower is better; MB (file size): should not change",
        "- `torch.save`, `TorchCheckpointIO` and `AsyncCheckpointIO` run torch's and Lightning's code, the same for "
        "both trees: their after/before ratios show how far this machine's noise alone moves a ratio",
    ]
    if report["stopped"]:
        lines.append(f"- {report['stopped']}")
    for bench, result in report["benchmarks"].items():
        lines += ["", f"## {SCRIPTS[bench].name} `{shlex.join(result['args'])}`", ""]
        for side in ("before", "after"):
            info = next((run["info"] for run in result["runs"] if run["tree"] == side and "info" in run), None)
            if info:
                lines.append(
                    f"- {side}'s first run: " + "; ".join(f"{k}: {v}" for k, v in info.items() if k != "metrics")
                )
        for run in result["runs"]:
            if "failed" in run:
                lines.append(f"- FAILED: round {run['round']}, {run['tree']}: {run['failed']} (see the JSON)")
        lines += ["", "| figure | better | before | after | after/before |", "|---|---|---|---|---|"]
        for name, row in result["summary"].items():
            digits = 3 if name.endswith(" s") or name.endswith(" GB/s") else 2
            lines.append(
                f"| {name} | {better(name)} | {spread(row['before'], digits)} | {spread(row['after'], digits)} | "
                f"{spread(row['ratios'], 3)} |"
            )
    return "\n".join(lines) + "\n"


def write(report: dict, out: pathlib.Path, name: str) -> str:
    """Write ``report`` as ``<out>/<name>.json`` and ``.md`` (after each round: a run cut short keeps the rounds
    done); return the Markdown."""
    for result in report["benchmarks"].values():
        result["summary"] = summary(result["runs"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out / f"{name}.md").write_text(text)
    return text


def machine() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        model = names[0] if names else model
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--before", required=True, type=pathlib.Path, help="folder holding the before lightning_nvcomp/"
    )
    parser.add_argument("--after", required=True, type=pathlib.Path, help="folder holding the after lightning_nvcomp/")
    parser.add_argument("--rounds", type=int, default=5, help="most rounds counted")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs of each benchmark on the after tree")
    parser.add_argument("--budget-s", type=float, default=None, help="start no round that would end after this")
    parser.add_argument("--run-timeout-s", type=float, default=900, help="a run taking longer is killed, a failure")
    parser.add_argument("--codec-args", default=None, help="codec_bench.py's arguments (not given: not run)")
    parser.add_argument("--lightning-args", default=None, help="lightning_bench.py's arguments (not given: not run)")
    parser.add_argument("--name", default="before_after", help="the outputs' file name, without .json/.md")
    parser.add_argument("--out", default=".", help="folder for the outputs")
    parser.add_argument("--work-dir", default=None, help="where the temporary folder is made (the runs' disk)")
    args = parser.parse_args()
    benches = {b: shlex.split(a) for b, a in (("codec", args.codec_args), ("lightning", args.lightning_args)) if a}
    if not benches:
        parser.error("give --codec-args, --lightning-args or both")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    report = {
        "name": args.name,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "machine": machine(),
        "python": platform.python_version(),
        "warmup": args.warmup,
        **{
            side: {"tree": str(tree), "describe": describe(tree), "aliases": aliases_for(tree)}
            for side, tree in trees.items()
        },
        "benchmarks": {bench: {"args": bench_args, "runs": []} for bench, bench_args in benches.items()},
        "stopped": None,
        "rounds": 0,
    }
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="before-after-", dir=args.work_dir) as work:
        for bench, bench_args in [(b, a) for b, a in benches.items() for _ in range(args.warmup)]:
            warm = run_once(trees["after"], bench, bench_args, pathlib.Path(work), args.run_timeout_s)
            note = f", FAILED {warm['failed']}:\n{warm['output_tail']}" if "failed" in warm else ""
            print(f"warm-up {bench}: {warm['seconds']} s{note}", flush=True)
        rounds, longest = 0, 0.0
        while rounds < args.rounds:
            elapsed = time.perf_counter() - began
            if rounds and args.budget_s and elapsed + longest > args.budget_s:
                report["stopped"] = f"stopped after {rounds} of {args.rounds} rounds: another would pass --budget-s"
                break
            round_began = time.perf_counter()
            for bench, bench_args in benches.items():
                for side, tree in trees.items():
                    run = run_once(tree, bench, bench_args, pathlib.Path(work), args.run_timeout_s)
                    report["benchmarks"][bench]["runs"].append({"round": rounds, "tree": side} | run)
                    print(
                        f"round {rounds} {bench} {side}: {run['seconds']} s, load {run['load_1min']:.2f}"
                        + (f", FAILED {run['failed']}:\n{run['output_tail']}" if "failed" in run else ""),
                        flush=True,
                    )
            longest = max(longest, time.perf_counter() - round_began)
            rounds = report["rounds"] = rounds + 1
            write(report, pathlib.Path(args.out), args.name)
    print(write(report, pathlib.Path(args.out), args.name))
    failed = any("failed" in run for result in report["benchmarks"].values() for run in result["runs"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        run_script(*sys.argv[2:])
    else:
        main()
