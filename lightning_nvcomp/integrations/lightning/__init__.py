"""Lightning: :class:`~.checkpoint_io.NvcompCheckpointIO` (a ``CheckpointIO`` plugin) and its savings callback, and
the sharded strategies (:mod:`.sharded`). Importing it imports Lightning (the ``[lightning]`` extra)."""

from lightning_nvcomp.integrations.lightning.checkpoint_io import (
    NvcompCheckpointIO,
    NvcompSavings,
    gpu_state_nbytes,
    lightning_callbacks,
    pytorch_lightning_callbacks,
)
from lightning_nvcomp.integrations.lightning.sharded import NvcompFSDPStrategy, NvcompModelParallelStrategy

__all__ = [
    "NvcompCheckpointIO",
    "NvcompFSDPStrategy",
    "NvcompModelParallelStrategy",
    "NvcompSavings",
    "gpu_state_nbytes",
    "lightning_callbacks",
    "pytorch_lightning_callbacks",
]
