"""Lightning's sharded checkpoints, compressed: ``FSDPStrategy(state_dict_type="sharded")`` and
``ModelParallelStrategy`` (distributed checkpoints) through :mod:`lightning_nvcomp.dcp`.

Why a strategy subclass: these strategies never call the CheckpointIO for sharded saves, and they give
torch.distributed.checkpoint no storage writer: they call ``dcp.save(state, checkpoint_id=path)`` in one
module-level helper, ``_distributed_checkpoint_save``. The subclasses are those strategies with one change: while
their ``save_checkpoint`` runs, that helper writes through :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`.
That is visible in the Trainer's configuration and scoped to one strategy instance, where a global patch of
Lightning would not be, and everything else (the state-dict layout, the ``meta.pt`` file, every rank's plan) stays
Lightning's. Loading needs no change: DCP's default reader decodes these files wherever lightning_nvcomp is
installed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.distributed.checkpoint as dcp

from lightning_nvcomp.integrations._lightning_compat import distributed_checkpoint_save_as
from lightning_nvcomp.integrations._require import MissingExtraError
from lightning_nvcomp.options import SaveOptions

try:
    import lightning.pytorch.strategies.fsdp as fsdp_strategy
    import lightning.pytorch.strategies.model_parallel as model_parallel_strategy
    from lightning.fabric.utilities.rank_zero import rank_zero_info
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
except ImportError as err:
    raise MissingExtraError("lightning", "NvcompFSDPStrategy and NvcompModelParallelStrategy", err) from err

from lightning_nvcomp import telemetry
from lightning_nvcomp.dcp import DcpCheckpointStats, NvcompFileSystemWriter
from lightning_nvcomp.stats import SaveStats

_SWAP = threading.Lock()


def rank_metrics(stats: DcpCheckpointStats) -> dict[str, float]:
    """Each rank's share of a distributed checkpoint, under ``nvcomp/rank<r>/`` (``stats.ranks[r]`` is rank r's)."""
    metrics = {}
    for rank, r in enumerate(stats.ranks):
        prefix = f"{telemetry.PREFIX}rank{rank}/"
        metrics.update(
            {
                prefix + "raw_gb": r.raw_nbytes / 1e9,
                prefix + "stored_gb": r.file_nbytes / 1e9,
                prefix + "ratio": r.ratio,
                prefix + "encode_s": r.encode_s,
                prefix + "write_s": r.write_s,
            }
        )
    return metrics


class CompressedShardedSaves:
    """What the compressed strategies add to Lightning's: the codec, the savings, and the metrics for
    :class:`~lightning_nvcomp.NvcompSavings` (the same names as :class:`~lightning_nvcomp.NvcompCheckpointIO`'s,
    for the whole checkpoint, plus each rank's bytes and times under ``nvcomp/rank<r>/``).

    The savings baseline is the slowest rank's raw bytes over the per-writer bandwidth measured with all ranks
    writing at once: when an uncompressed sharded save would have finished.
    """

    _saver_module: ModuleType  # the Lightning module whose `_distributed_checkpoint_save` the strategy calls

    def __init__(self, *args: Any, codec: str = "auto", gpu_hour_usd: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The same options object as the checkpoint IO's (an unknown or unavailable codec fails here, at once).
        self.options = SaveOptions.of(codec, gpu_hour_usd=gpu_hour_usd)
        self.savings = telemetry.Savings(self.options.gpu_hour_usd)
        self.logger_attached = False
        self.last_stats: DcpCheckpointStats | None = None
        self._metrics: list[tuple[int, dict[str, float]]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        writers: list[NvcompFileSystemWriter] = []

        def compressed_save(converted_state: dict[str, Any], path: Path) -> None:
            writers.append(NvcompFileSystemWriter(path, options=self.options))
            dcp.save(converted_state, storage_writer=writers[-1])

        step = int(checkpoint.get("global_step", 0))
        begin = time.perf_counter()
        with _SWAP, distributed_checkpoint_save_as(self._saver_module, compressed_save):
            super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]
        if writers:  # a sharded save (a "full" one went through the CheckpointIO)
            self._record(writers[0], time.perf_counter() - begin, step, os.fspath(filepath))

    def _record(self, writer: NvcompFileSystemWriter, blocked_s: float, step: int, path: str) -> None:
        stats = self.last_stats = writer.gather_stats()  # collectives: every rank saves, so every rank is here
        per_writer_gbps = writer.write_gbps()
        slowest_raw = max(r.raw_nbytes for r in stats.ranks)
        whole = SaveStats(
            path,
            stats.codec,
            stats.raw_nbytes,
            stats.stored_nbytes,
            max(r.encode_s for r in stats.ranks),
            max(r.write_s for r in stats.ranks),
        )
        # As one writer at the aggregate rate: the slowest rank's raw bytes take raw / gbps at the per-writer rate.
        aggregate_gbps = per_writer_gbps * stats.raw_nbytes / slowest_raw if slowest_raw else per_writer_gbps
        metrics = self.savings.add(whole, blocked_s, aggregate_gbps)
        metrics.update(rank_metrics(stats))
        self._metrics.append((step, metrics))
        rank_zero_info(f"{telemetry.summary(path, whole, metrics)} ({len(stats.ranks)} ranks)")

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) of the sharded saves since the last call."""
        drained, self._metrics = self._metrics, []
        return drained

    def wait(self) -> None:
        """Saves are synchronous: nothing to wait for."""


class NvcompFSDPStrategy(CompressedShardedSaves, FSDPStrategy):
    """``FSDPStrategy`` whose sharded checkpoints (``state_dict_type="sharded"``) are compressed per rank on the GPU.

    Args:
        codec: ``"auto"``, ``"ans"``, ``"zstd"`` or ``"none"`` (see :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`).
        gpu_hour_usd: price of a GPU-hour, for the saved-dollars metric.
        *args, **kwargs: ``FSDPStrategy``'s.
    """

    _saver_module = fsdp_strategy


class NvcompModelParallelStrategy(CompressedShardedSaves, ModelParallelStrategy):
    """``ModelParallelStrategy`` whose distributed checkpoints are compressed per rank on the GPU.

    Args:
        codec: ``"auto"``, ``"ans"``, ``"zstd"`` or ``"none"`` (see :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`).
        gpu_hour_usd: price of a GPU-hour, for the saved-dollars metric.
        *args, **kwargs: ``ModelParallelStrategy``'s.
    """

    _saver_module = model_parallel_strategy
