"""The interface every chunk coder implements: lists of byte chunks in, lists of byte chunks out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

#: A chunk of a buffer: (byte offset, byte length).
Span = tuple[int, int]


class ChunkEngine(ABC):
    """Compresses and decompresses independent byte chunks on one kind of device.

    Chunks are spans of one 1-D ``uint8`` buffer on the engine's device (nvCOMP takes such a buffer and an offset
    table in one call). ``data_type`` is the nvCOMP array-protocol type the coder may model the bytes as
    (``"|u1"``: plain bytes).
    """

    #: ``"cpu"`` or ``"cuda"``: where the buffers must live.
    device_type: str
    #: Codec names this engine can run.
    codecs: tuple[str, ...]

    @abstractmethod
    def encode(self, src: torch.Tensor, spans: list[Span], codec: str, data_type: str) -> list[torch.Tensor]:
        """Return the compressed form of each chunk ``src[offset : offset + length]`` (on the engine's device). Where
        coding would not make a chunk smaller, what comes back may be anything at least as long as the chunk (the
        chunk itself): callers store such a chunk raw."""

    @abstractmethod
    def decode(
        self, src: torch.Tensor, spans: list[Span], dst: torch.Tensor, dst_spans: list[Span], codec: str, data_type: str
    ) -> None:
        """Decompress each chunk ``spans[i]`` of ``src`` into ``dst_spans[i]`` of ``dst``, its exact decoded size.

        Raises ValueError when a chunk does not decompress to exactly its span's length.
        """
