"""The interface every chunk coder implements: lists of byte chunks in, lists of byte chunks out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class ChunkEngine(ABC):
    """Compresses and decompresses independent byte chunks on one kind of device.

    Chunks are 1-D ``uint8`` tensors on the engine's device. ``data_type`` is the nvCOMP array-protocol type
    the coder may model the bytes as (``"|u1"``: plain bytes).
    """

    #: ``"cpu"`` or ``"cuda"``: where the chunks must live.
    device_type: str
    #: Codec names this engine can run.
    codecs: tuple[str, ...]

    @abstractmethod
    def encode(self, chunks: list[torch.Tensor], codec: str, data_type: str) -> list[torch.Tensor]:
        """Return the compressed form of each chunk (on the engine's device)."""

    @abstractmethod
    def decode(self, stored: list[torch.Tensor], out: list[torch.Tensor], codec: str, data_type: str) -> None:
        """Decompress each ``stored[i]`` into ``out[i]``, whose size is the exact decompressed size.

        Raises ValueError when a chunk does not decompress to exactly ``out[i].numel()`` bytes.
        """
