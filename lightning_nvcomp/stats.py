"""What one save did (:class:`SaveStats`)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_nvcomp.policy import Prediction


@dataclass(frozen=True)
class SaveStats:
    """What one save did. ``prediction`` is the policy's forecast when the codec was chosen automatically."""

    path: str
    codec: str
    raw_nbytes: int
    file_nbytes: int
    encode_s: float
    write_s: float
    prediction: Prediction | None = None

    @property
    def seconds(self) -> float:
        return self.encode_s + self.write_s

    @property
    def ratio(self) -> float:
        return self.raw_nbytes / self.file_nbytes if self.file_nbytes else 1.0
