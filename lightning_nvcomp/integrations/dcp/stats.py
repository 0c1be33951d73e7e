"""What one DCP save did: each rank's :class:`~lightning_nvcomp.telemetry.stats.SaveStats` (the stats of every save of the
package) and, over all ranks, :class:`DcpCheckpointStats`; :func:`gather` collects them from every rank."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.options import Codec
from lightning_nvcomp.telemetry.stats import SaveStats, ratio


@dataclass(frozen=True)
class DcpCheckpointStats:
    """One DCP save over all ranks: totals, and each rank's :class:`~lightning_nvcomp.telemetry.stats.SaveStats` (index = rank;
    ``file_nbytes`` is the bytes that rank stored, ``seconds`` its ``stage_s + encode_s + write_s``)."""

    ranks: tuple[SaveStats, ...]

    @property
    def codec(self) -> Codec:
        return self.ranks[0].codec if self.ranks else Codec.NONE

    @property
    def raw_nbytes(self) -> int:
        return sum(r.raw_nbytes for r in self.ranks)

    @property
    def stored_nbytes(self) -> int:
        return sum(r.file_nbytes for r in self.ranks)

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.stored_nbytes)

    @property
    def seconds(self) -> float:
        """The slowest rank's time: what the checkpoint cost."""
        return max((r.seconds for r in self.ranks), default=0.0)

    def metrics(self, prefix: str = "nvcomp/dcp_") -> dict[str, float]:
        """Flat numbers for a logger."""
        return {
            f"{prefix}raw_bytes": float(self.raw_nbytes),
            f"{prefix}stored_bytes": float(self.stored_nbytes),
            f"{prefix}ratio": self.ratio,
            f"{prefix}seconds": self.seconds,
            f"{prefix}stage_s": max((r.stage_s for r in self.ranks), default=0.0),
        }


def _from_dict(fields: dict[str, Any]) -> SaveStats:
    """The :class:`SaveStats` of ``dataclasses.asdict`` (which turned its prediction into a dict too)."""
    prediction = fields.get("prediction")
    if isinstance(prediction, dict):
        fields = {**fields, "prediction": Prediction.from_dict(prediction)}
    return SaveStats(**fields)


def gather(mine: SaveStats, group: dist.ProcessGroup | None, distributed: bool) -> DcpCheckpointStats:
    """Every rank's stats, on every rank (a collective over ``group`` when ``distributed``: all ranks call it)."""
    if not distributed:
        return DcpCheckpointStats((mine,))
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, dataclasses.asdict(mine), group=group)
    return DcpCheckpointStats(tuple(_from_dict(g) for g in gathered))
