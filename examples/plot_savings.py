"""Plot the checkpoint savings that ``NvcompCheckpointIO`` logged to TensorBoard (the ``nvcomp/`` scalars).

    python examples/plot_savings.py runs/demo_cpu/version_0 [more log dirs...] [-o savings.png]

A directory without event files of its own stands for every directory below it that has some (one series each).
Three panels: the run's total time saved and the compression ratio against the step, and per checkpoint how long
training was blocked next to the baseline (an uncompressed synchronous save at the measured write bandwidth).
Needs matplotlib (an example dependency, not one of the package's).
"""

from __future__ import annotations

import argparse
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

CODECS = {0: "none", 1: "zstd", 2: "ans"}
Run = dict[str, dict[int, float]]  # metric name (without "nvcomp/") -> step -> value


def event_dirs(path: str) -> list[str]:
    """``path`` if it holds event files, else every directory below it that does."""
    if glob.glob(os.path.join(path, "events.out.tfevents.*")):
        return [path]
    found = {os.path.dirname(f) for f in glob.glob(os.path.join(path, "**", "events.out.tfevents.*"), recursive=True)}
    return sorted(found)


def read_run(path: str) -> Run:
    """The ``nvcomp/`` scalars of one log directory (every event file in it, in order)."""
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag.removeprefix("nvcomp/"): {e.step: e.value for e in events.Scalars(tag)}
        for tag in events.Tags()["scalars"]
        if tag.startswith("nvcomp/")
    }


def label(path: str, run: Run) -> str:
    """``path`` and the run in numbers: codec, checkpoints, bytes, time (and dollars) saved."""
    codecs = "/".join(sorted({CODECS.get(int(c), "?") for c in run["codec_id"].values()}))
    last = max(run["saved_s_total"])
    raw, stored = sum(run["raw_gb"].values()), sum(run["stored_gb"].values())
    unit, scale = ("GB", 1) if raw >= 1 else ("MB", 1e3)
    text = (
        f"{path}: {codecs}, {len(run['ratio'])} checkpoints, {raw * scale:.1f} -> {stored * scale:.1f} {unit} "
        f"({raw / stored:.3f}x), saved {run['saved_s_total'][last]:.3g} s"
    )
    if "saved_usd_total" in run:
        usd = run["saved_usd_total"][last]
        text += f" = {'-' * (usd < 0)}${abs(usd):.3g}"
    return text


def plot(runs: dict[str, Run], output: str) -> None:
    """Draw the three panels for ``runs`` (label -> metrics) into ``output``."""
    fig, (total, ratio, blocked) = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    steps = sorted({s for run in runs.values() for s in run["blocked_s"]})
    width = 0.8 / (2 * len(runs))
    for i, (name, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        s = sorted(run["saved_s_total"])
        total.plot(s, [run["saved_s_total"][k] for k in s], "o-", color=color, label=name)
        ratio.plot(s, [run["ratio"][k] for k in s], "o-", color=color, label=name)
        x = np.array([steps.index(k) for k in s]) + (2 * i + 0.5) * width - 0.4
        blocked.bar(x, [run["baseline_s"][k] for k in s], width, color=color, alpha=0.35)
        blocked.bar(x + width, [run["blocked_s"][k] for k in s], width, color=color)
    total.axhline(0, color="grey", lw=0.8)
    total.set(title="time saved so far (nvcomp/saved_s_total)", xlabel="step", ylabel="seconds")
    ratio.set(title="compression ratio (nvcomp/ratio)", xlabel="step", ylabel="raw bytes / file bytes")
    ratio.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter(useOffset=False))
    blocked.set(title="each checkpoint: blocked_s vs baseline_s", xlabel="checkpoint at step", ylabel="seconds")
    blocked.set_xticks(range(len(steps)), [str(k) for k in steps])
    if len(runs) > 1:
        fig.legend(*total.get_legend_handles_labels(), loc="outside lower center", fontsize="small")
    else:
        fig.suptitle(next(iter(runs)))
    shade = colors[0] if len(runs) == 1 else "grey"
    blocked.legend(
        [Patch(color=shade, alpha=0.35), Patch(color=shade)],
        ["torch.save, same durability (baseline)", "training blocked"],
        fontsize="small",
    )
    for ax in (total, ratio, blocked):
        ax.grid(alpha=0.3)
    fig.savefig(output, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdirs", nargs="+", help="TensorBoard log directories")
    parser.add_argument("-o", "--output", default="savings.png", help="PNG to write (default: savings.png)")
    args = parser.parse_args()
    missing = [root for root in args.logdirs if not os.path.isdir(root)]
    if missing:
        parser.error(
            f"no such directory: {', '.join(missing)} (give a run's log directory, e.g. runs/demo_cpu/version_0, "
            "or one above several)"
        )
    runs = {}
    for root in args.logdirs:
        for path in event_dirs(root):
            run = read_run(path)
            if run:
                runs[label(path, run)] = run
    runs = dict(sorted(runs.items(), key=lambda item: min(item[1]["ratio"])))  # in order of their first step
    if not runs:
        raise SystemExit(
            f"no nvcomp/ metrics under {', '.join(args.logdirs)}: were checkpoints saved with "
            "NvcompCheckpointIO, with the NvcompSavings callback attached?"
        )
    if os.path.dirname(args.output):
        os.makedirs(os.path.dirname(args.output), exist_ok=True)
    plot(runs, args.output)
    print(f"wrote {args.output} ({len(runs)} run{'s' * (len(runs) > 1)})")


if __name__ == "__main__":
    main()
