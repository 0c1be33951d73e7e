"""The save codecs, named once: what each is, where it encodes and decodes, and whether it can run here."""

from __future__ import annotations

import enum

from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.errors import CodecUnavailableError


class Codec(str, enum.Enum):
    """How a save codes tensors. The values are the names configs, files and the command line use.

    ``ANS``: nvCOMP gANS on the GPU (fastest; decodes on a GPU only). ``ZSTD``: nvCOMP Zstd on CUDA state, zstd on
    the CPU otherwise; the frames decode anywhere. ``NONE``: stored as is, checksummed. ``AUTO``: the codec with the
    shortest predicted save (:mod:`lightning_nvcomp.policy`).
    """

    AUTO = "auto"
    ANS = "ans"
    ZSTD = "zstd"
    NONE = "none"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | Codec) -> Codec:
        """The codec called ``value``; ValueError naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"codec must be one of {[c.value for c in cls]}, not {value!r}") from None

    @property
    def needs_gpu(self) -> bool:
        """Whether saving (and loading) with this codec needs a CUDA GPU and nvCOMP."""
        return self is Codec.ANS

    @property
    def telemetry_id(self) -> int:
        """The number ``nvcomp/codec_id`` logs: 0 none, 1 zstd, 2 ans."""
        return {Codec.NONE: 0, Codec.ZSTD: 1, Codec.ANS: 2}[self]

    def require_available(self, where: str = "") -> None:
        """Raise CodecUnavailableError (naming ``where``) if this codec cannot run on this machine."""
        if self.needs_gpu and not gpu_available():
            prefix = f"{where}: " if where else ""
            raise CodecUnavailableError(
                f"{prefix}codec='ans' (nvCOMP gANS) needs a CUDA GPU and nvCOMP (pip install "
                "'lightning-nvcomp[cu12]'); it has no CPU coder: use codec='zstd' (loads anywhere) or 'auto'"
            )


#: The codecs a save chooses between (``auto`` picks one of them).
CONCRETE_CODECS = (Codec.ANS, Codec.ZSTD, Codec.NONE)
