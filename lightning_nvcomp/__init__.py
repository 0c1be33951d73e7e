"""lightning_nvcomp: lossless GPU checkpoint compression for PyTorch (nvCOMP gANS / Zstd, CPU zstd fallback).

``import lightning_nvcomp`` registers the decoder with ``torch.load`` (also for ``weights_only=True``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from lightning_nvcomp.errors import CheckpointError, CodecUnavailableError, CorruptCheckpointError, DecodeLimitError
from lightning_nvcomp.format import decode_storage, decode_tensor, load
from lightning_nvcomp.integrations._require import MissingExtraError
from lightning_nvcomp.saving import save
from lightning_nvcomp.stats import SaveStats

if TYPE_CHECKING:  # for type checkers; at run time these come from __getattr__ below
    from lightning_nvcomp.integrations.lightning import NvcompCheckpointIO, NvcompSavings
    from lightning_nvcomp.integrations.lightning_sharded import NvcompFSDPStrategy, NvcompModelParallelStrategy

__version__ = "0.1.0"


#: Lazy attributes: the integration module each comes from. Those modules import their framework (the
#: ``[lightning]`` extra), which the core never does, so they load only when one of these names is asked for.
_INTEGRATIONS = {
    "NvcompCheckpointIO": "lightning",
    "NvcompSavings": "lightning",
    "NvcompFSDPStrategy": "lightning_sharded",
    "NvcompModelParallelStrategy": "lightning_sharded",
}


def __getattr__(name: str) -> Any:
    module = _INTEGRATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_nvcomp' has no attribute {name!r}")
    try:
        integration = importlib.import_module(f"lightning_nvcomp.integrations.{module}")
    except MissingExtraError as err:
        # the same error, naming the attribute that was asked for
        cause = err.__cause__
        raise MissingExtraError(err.extra, name, cause) from cause
    return getattr(integration, name)


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
