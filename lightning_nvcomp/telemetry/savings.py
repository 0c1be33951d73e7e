"""Savings telemetry: what each checkpoint cost, what the framework's own uncompressed save would have cost, and the
running total in seconds, GPU-hours and dollars. Shared by the Lightning and Accelerate integrations.

Metric names (all under :data:`PREFIX`): ``raw_gb``, ``stored_gb``, ``ratio``, ``codec_id`` (0 none, 1 zstd, 2 ans),
``blocked_s`` (training waited; ``waited_s`` of it for earlier saves still being written: storage slower than the
saves), ``write_s``, ``durable_s`` (from the save's start until the checkpoint was on stable storage, its slowest
file; absent with durability ``os``), ``baseline_s`` (an uncompressed ``torch.save`` of the checkpoint with the same
durability: its fixed costs timed once, plus its bytes over the write bandwidth; see :mod:`lightning_nvcomp.telemetry.baseline`), ``probe_s`` (0 but on a save that
probed: the one-off bandwidth probe, the baseline's timing and ``auto``'s codec calibration, which training waited for
besides ``blocked_s``),
``predicted_blocked_s`` (auto only), ``slowdown`` (how much longer training steps took while writes ran behind them
than while none did, measured on the run's optimizer steps: :mod:`lightning_nvcomp.auto.steps`; absent until measured),
``slowed_s`` (what that cost while this checkpoint's writes ran behind training), ``lost_s`` (= blocked + slowed: the
training time the checkpoint cost), ``saved_s`` (= baseline - lost), and the run's totals ``saved_s_total``,
``saved_gpu_hours_total`` (x world size) and ``saved_usd_total`` (x price).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_nvcomp.auto.prediction import Prediction, format_seconds, slowed_seconds
from lightning_nvcomp.options import Codec
from lightning_nvcomp.telemetry.stats import SaveStats

PREFIX = "nvcomp/"


@dataclass
class Savings:
    """Accumulates per-save metrics for one run.

    Args:
        gpu_hour_usd: price of one GPU-hour, for the dollar figure (None: no dollar metric).
        world_size: GPUs idle during a save (all of them in data-parallel training).
    """

    gpu_hour_usd: float | None = None
    world_size: int = 1
    saved_s_total: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)

    def add(
        self,
        stats: SaveStats,
        blocked_s: float,
        baseline_s: float,
        waited_s: float = 0.0,
        probe_s: float = 0.0,
        slowdown: float | None = None,
        behind_s: float = 0.0,
    ) -> dict[str, float]:
        """Record one save that blocked training ``blocked_s`` (``waited_s`` of it for earlier writes) where the
        baseline save would have taken ``baseline_s``, after a one-off probe of ``probe_s``, and whose writes then
        ran ``behind_s`` behind training, which ran ``slowdown`` slower meanwhile (None: not measured); return its
        metrics (prefixed) including the running totals."""
        slowed_s = slowed_seconds(slowdown or 0.0, behind_s)
        lost_s = blocked_s + slowed_s
        saved_s = baseline_s - lost_s
        self.saved_s_total += saved_s
        metrics = {
            "raw_gb": stats.raw_nbytes / 1e9,
            "stored_gb": stats.file_nbytes / 1e9,
            "ratio": stats.ratio,
            "codec_id": float(Codec(stats.codec).telemetry_id),
            "blocked_s": blocked_s,
            "waited_s": waited_s,
            "probe_s": probe_s,
            "write_s": stats.write_s,
            "slowed_s": slowed_s,
            "lost_s": lost_s,
            "baseline_s": baseline_s,
            "saved_s": saved_s,
            "saved_s_total": self.saved_s_total,
            "saved_gpu_hours_total": self.saved_s_total * self.world_size / 3600,
        }
        if stats.durable_s is not None:
            metrics["durable_s"] = stats.durable_s
        if slowdown is not None:
            metrics["slowdown"] = slowdown
        if stats.prediction is not None:  # auto: what it predicted for the codec it chose, and for the others
            metrics["predicted_blocked_s"] = stats.prediction.blocked_s
            for p in (stats.prediction, *stats.prediction.alternatives):
                metrics[f"predicted_{p.codec}_blocked_s"] = p.blocked_s
        if self.gpu_hour_usd is not None:
            metrics["saved_usd_total"] = metrics["saved_gpu_hours_total"] * self.gpu_hour_usd
        prefixed = {PREFIX + k: v for k, v in metrics.items()}
        self.history.append(prefixed)
        return prefixed


def _sizes(raw_nbytes: int, stored_nbytes: int) -> str:
    """``812 -> 700 B``, ``4.12 -> 3.80 kB``, ``12.35 -> 10.02 MB``, ``1.20 -> 0.95 GB``: both in the unit of the larger
    (decimal units, as the ``_gb`` metrics)."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if raw_nbytes >= scale:
            return f"{raw_nbytes / scale:.2f} -> {stored_nbytes / scale:.2f} {unit}"
    return f"{raw_nbytes} -> {stored_nbytes} B"


def summary(path: str, stats: SaveStats, metrics: dict[str, float]) -> str:
    """The one-line console summary of a save: sizes in B, kB, MB, GB or TB, times in s or ms."""
    m = {k.removeprefix(PREFIX): v for k, v in metrics.items()}
    return (
        f"lightning_nvcomp: {path}: {stats.codec} {_sizes(stats.raw_nbytes, stats.file_nbytes)} ({m['ratio']:.3f}x), "
        f"training blocked {format_seconds(m['blocked_s'])} (torch.save: {format_seconds(m['baseline_s'])})"
        + (
            f", slowed {m['slowdown'] * 100:.1f}% while written behind it ({format_seconds(m['slowed_s'])})"
            if "slowdown" in m
            else ""
        )
        + f", saved {format_seconds(m['saved_s_total'])} so far"
        + (f"; {_why(stats.prediction)}" if stats.prediction is not None else "")
        + (
            f"; the one-off storage probe and calibration took {format_seconds(m['probe_s'])}"
            if m.get("probe_s")
            else ""
        )
    )


def _why(chosen: Prediction) -> str:
    """``auto chose ans: predicted 0.85 s lost (zstd 0.87 s, none 1.10 s): a tie with zstd (within 42.5 ms of the
    least), won by the smaller file (1.320x; zstd 1.280x)``."""
    others = ", ".join(f"{p.codec} {format_seconds(p.blocked_s)}" for p in chosen.alternatives)
    return (
        f"auto chose {chosen.codec}: predicted {format_seconds(chosen.blocked_s)} lost"
        + (f" ({others})" if others else "")
        + (f": {chosen.reason}" if chosen.reason else "")
    )
