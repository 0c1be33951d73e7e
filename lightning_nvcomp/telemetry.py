"""Savings telemetry: what each checkpoint cost, what an uncompressed synchronous save would have cost, and the
running total in seconds, GPU-hours and dollars. Shared by the Lightning and Accelerate integrations.

Metric names (all under :data:`PREFIX`): ``raw_gb``, ``stored_gb``, ``ratio``, ``codec_id`` (0 none, 1 zstd, 2 ans),
``blocked_s`` (training waited), ``write_s``, ``baseline_s`` (raw bytes / measured storage bandwidth: an
uncompressed synchronous save), ``predicted_blocked_s`` (auto only), ``saved_s`` (= baseline - blocked), and the
run's totals ``saved_s_total``, ``saved_gpu_hours_total`` (x world size) and ``saved_usd_total`` (x price).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_nvcomp.options import Codec
from lightning_nvcomp.stats import SaveStats

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

    def add(self, stats: SaveStats, blocked_s: float, write_gbps: float) -> dict[str, float]:
        """Record one save; return its metrics (prefixed) including the running totals."""
        baseline_s = stats.raw_nbytes / (write_gbps * 1e9)
        saved_s = baseline_s - blocked_s
        self.saved_s_total += saved_s
        metrics = {
            "raw_gb": stats.raw_nbytes / 1e9,
            "stored_gb": stats.file_nbytes / 1e9,
            "ratio": stats.ratio,
            "codec_id": float(Codec(stats.codec).telemetry_id),
            "blocked_s": blocked_s,
            "write_s": stats.write_s,
            "baseline_s": baseline_s,
            "saved_s": saved_s,
            "saved_s_total": self.saved_s_total,
            "saved_gpu_hours_total": self.saved_s_total * self.world_size / 3600,
        }
        if stats.prediction is not None:
            metrics["predicted_blocked_s"] = stats.prediction.blocked_s
        if self.gpu_hour_usd is not None:
            metrics["saved_usd_total"] = metrics["saved_gpu_hours_total"] * self.gpu_hour_usd
        prefixed = {PREFIX + k: v for k, v in metrics.items()}
        self.history.append(prefixed)
        return prefixed


def summary(path: str, stats: SaveStats, metrics: dict[str, float]) -> str:
    """The one-line console summary of a save."""
    m = {k.removeprefix(PREFIX): v for k, v in metrics.items()}
    return (
        f"lightning_nvcomp: {path}: {stats.codec} {m['raw_gb']:.2f} -> {m['stored_gb']:.2f} GB ({m['ratio']:.3f}x), "
        f"training blocked {m['blocked_s']:.2f} s (uncompressed sync save: {m['baseline_s']:.2f} s), "
        f"saved {m['saved_s_total']:.1f} s so far"
    )
