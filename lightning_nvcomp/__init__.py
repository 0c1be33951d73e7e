"""lightning_nvcomp: lossless GPU checkpoint compression for PyTorch (nvCOMP gANS / Zstd, CPU zstd fallback).

``import lightning_nvcomp`` registers the decoder with ``torch.load`` (also for ``weights_only=True``).
"""

from lightning_nvcomp.container import SaveStats, decode_tensor, load, save
from lightning_nvcomp.errors import CheckpointError, CodecUnavailableError, CorruptCheckpointError

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CodecUnavailableError",
    "CorruptCheckpointError",
    "SaveStats",
    "decode_tensor",
    "load",
    "save",
]
