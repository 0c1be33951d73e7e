"""lightning_nvcomp: lossless GPU checkpoint compression for PyTorch (nvCOMP gANS / Zstd, CPU zstd fallback).

``import lightning_nvcomp`` registers the decoder with ``torch.load`` (also for ``weights_only=True``).
"""

from lightning_nvcomp.container import SaveStats, decode_storage, decode_tensor, load, save
from lightning_nvcomp.errors import CheckpointError, CodecUnavailableError, CorruptCheckpointError, DecodeLimitError

__version__ = "0.1.0"


def __getattr__(name: str):
    # The Lightning integration imports lightning: load it only when asked for.
    if name in ("NvcompCheckpointIO", "NvcompSavings"):
        from lightning_nvcomp.integrations import lightning as integration

        return getattr(integration, name)
    if name in ("NvcompFSDPStrategy", "NvcompModelParallelStrategy"):
        from lightning_nvcomp.integrations import lightning_sharded

        return getattr(lightning_sharded, name)
    raise AttributeError(f"module 'lightning_nvcomp' has no attribute {name!r}")


__all__ = [
    "CheckpointError",
    "CodecUnavailableError",
    "CorruptCheckpointError",
    "DecodeLimitError",
    "NvcompCheckpointIO",
    "NvcompFSDPStrategy",
    "NvcompModelParallelStrategy",
    "NvcompSavings",
    "SaveStats",
    "decode_storage",
    "decode_tensor",
    "load",
    "save",
]
