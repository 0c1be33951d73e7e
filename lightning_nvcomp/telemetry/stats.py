"""What one save did (:class:`SaveStats`)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.options import Codec


def ratio(raw_nbytes: float, stored_nbytes: float) -> float:
    """Compression ratio, raw bytes / stored bytes (1.0 when nothing is stored)."""
    return raw_nbytes / stored_nbytes if stored_nbytes else 1.0


@dataclass(frozen=True)
class SaveStats:
    """What one save did: one file, or one rank's part of a sharded (DCP) checkpoint.

    Args:
        path: the file written (a DCP checkpoint's directory).
        codec: the codec used (:class:`~lightning_nvcomp.options.Codec` ``ANS``, ``ZSTD`` or ``NONE``).
        raw_nbytes: the bytes of the tensors saved.
        file_nbytes: the bytes stored.
        encode_s: time spent coding (it overlaps the write: compressed segments are written as they are ready).
        write_s: the rest of the save's wall time (the writes not hidden behind coding, fsync and rename).
        prediction: the policy's forecast when the codec was chosen automatically.
        stage_s: time ``dcp.async_save``'s staging blocked training before the write (0 for other saves).
        items: how many items the save stored (DCP write items; 0 where not counted).
        durable_s: seconds from the save's start until the file was on stable storage (None: the page cache
            decides, durability ``os``).
    """

    path: str
    codec: Codec
    raw_nbytes: int
    file_nbytes: int
    encode_s: float
    write_s: float
    prediction: Prediction | None = None
    stage_s: float = 0.0
    items: int = 0
    durable_s: float | None = None

    @property
    def seconds(self) -> float:
        """The save's wall time: staging, coding and writing."""
        return self.stage_s + self.encode_s + self.write_s

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.file_nbytes)
