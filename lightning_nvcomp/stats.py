"""What one save did (:class:`SaveStats`)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_nvcomp.policy import Prediction


def ratio(raw_nbytes: float, stored_nbytes: float) -> float:
    """Compression ratio, raw bytes / stored bytes (1.0 when nothing is stored)."""
    return raw_nbytes / stored_nbytes if stored_nbytes else 1.0


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
        return ratio(self.raw_nbytes, self.file_nbytes)
