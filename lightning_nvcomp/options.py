"""The save codecs, named once: what each is, where it encodes and decodes, and whether it can run here."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from lightning_nvcomp.codec.gpu import gpu_available, gpu_missing
from lightning_nvcomp.errors import CodecUnavailableError
from lightning_nvcomp.storage.remote.options import RemoteOptions


class _Choice(str, enum.Enum):
    """An option's values, as configs, files and the command line spell them; a subclass names its option with a
    class keyword (``class Codec(_Choice, option="codec")``)."""

    #: The name of the option these are the values of (what errors call it).
    option: str

    def __init_subclass__(cls, option: str = "", **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.option = option

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls: type[_C], value: str | _C) -> _C:
        """The value called ``value``; ValueError naming the option and its choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{cls.option} must be one of {[c.value for c in cls]}, not {value!r}") from None


_C = TypeVar("_C", bound=_Choice)


class Codec(_Choice, option="codec"):
    """How a save codes tensors. The values are the names configs, files and the command line use.

    ``ANS``: nvCOMP gANS on the GPU (fastest; decodes on a GPU only). ``ZSTD``: nvCOMP Zstd on CUDA state, zstd on
    the CPU otherwise; the frames decode anywhere. ``NONE``: stored as is, checksummed. ``AUTO``: the codec with the
    shortest predicted save (:mod:`lightning_nvcomp.auto.policy`).
    """

    AUTO = "auto"
    ANS = "ans"
    ZSTD = "zstd"
    NONE = "none"

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
                f"{prefix}codec='ans' (nvCOMP gANS) needs a CUDA GPU and nvCOMP; on this machine {gpu_missing()}. "
                "gANS has no CPU coder: use codec='zstd' (loads anywhere) or 'auto'"
            )


class Durability(_Choice, option="durable"):
    """When a checkpoint is on stable storage (survives a power loss or a kernel crash), not only in the page cache.

    Whatever is chosen, when a sync save returns its file is under its final name, complete, for any process to
    read; an async save's file appears when its background write is done.

    ``BACKGROUND`` (the default): training does not wait for it. A sync save writes the file (at page-cache speed)
    and renames it into place; the writer thread flushes it to the disk behind training. A file that replaces one
    of the same name (``last.ckpt``) is flushed before its rename, in the save, so a file is replaced only by a
    durable one; an older checkpoint is pruned only once every newer save is durable: one durable checkpoint always
    exists. ``SYNC``: durable when the save returns (a sync save waits for the flush; an async save's background
    write flushes before it is done). ``OS``: as ``torch.save`` and Lightning's ``TorchCheckpointIO``: written and
    renamed, never flushed; the page cache decides when the bytes reach the disk, and a crash can lose the newest
    checkpoints. Remote storage (``s3://``...) is durable when an upload completes, whatever is chosen.
    """

    BACKGROUND = "background"
    SYNC = "sync"
    OS = "os"


#: The codecs a save chooses between (``auto`` picks one of them).
CONCRETE_CODECS = (Codec.ANS, Codec.ZSTD, Codec.NONE)


MiB = 1 << 20


@dataclass(frozen=True)
class SaveOptions:
    """How a run saves its checkpoints: the one options object the Lightning plugin, the Accelerate hook and the
    writer behind them share (their keyword arguments build it). Sizes are in bytes.

    Args:
        codec: a :class:`Codec` or its name.
        async_save: write on a background thread; training waits only for the compressed snapshot.
        staging_nbytes: coding granularity; a GPU save borrows about three times this much GPU memory.
        probe_nbytes: largest size of the one-off write-bandwidth probe per file system (the savings baseline and
            ``auto``; bounded by the checkpoint and the free space, see :mod:`lightning_nvcomp.auto.probe`).
        interval_s: seconds between saves, for ``auto`` in async mode.
        gpu_hour_usd: price of a GPU-hour, for the saved-dollars metric.
        remote: how checkpoints at URLs (``s3://...``) are reached and uploaded (default
            :class:`~lightning_nvcomp.storage.remote.RemoteOptions`: the backend's own configuration and environment).
        durable: when a checkpoint is on stable storage (:class:`Durability`; default ``background``).
        host_buffer_nbytes: most bytes of async snapshots held in host memory while earlier ones are written (the
            compressed bytes); a save that would exceed it waits for the oldest writes (and says so: storage slower
            than the save interval). Default (None): two checkpoints, the one being written and the new one.

    Raises:
        ValueError: an unknown codec or a size that is not positive. CodecUnavailableError: the codec cannot run
        here (checked now, not at the first checkpoint hours later).
    """

    codec: Codec = Codec.AUTO
    async_save: bool = False
    staging_nbytes: int = 256 * MiB
    probe_nbytes: int = 256 * MiB
    interval_s: float | None = None
    gpu_hour_usd: float | None = None
    remote: RemoteOptions | None = None
    durable: Durability = Durability.BACKGROUND
    host_buffer_nbytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec.parse(self.codec))
        object.__setattr__(self, "durable", Durability.parse(self.durable))
        if self.host_buffer_nbytes is not None and self.host_buffer_nbytes <= 0:
            raise ValueError(f"host_buffer_nbytes ({self.host_buffer_nbytes}) must be positive")
        if self.staging_nbytes <= 0 or self.probe_nbytes <= 0:
            raise ValueError(
                f"the staging ({self.staging_nbytes} bytes) and probe ({self.probe_nbytes} bytes) sizes must be positive"
            )
        self.codec.require_available()

    @classmethod
    def of(
        cls,
        codec: str | Codec = Codec.AUTO,
        async_save: bool = False,
        staging_mb: int = 256,
        probe_mb: int = 256,
        interval_s: float | None = None,
        gpu_hour_usd: float | None = None,
        remote: RemoteOptions | None = None,
        durable: str | Durability = Durability.BACKGROUND,
        host_buffer_mb: int | None = None,
    ) -> SaveOptions:
        """From the integrations' keyword arguments, whose sizes are in MiB (``staging_mb``, ``probe_mb``,
        ``host_buffer_mb``)."""
        if staging_mb <= 0 or probe_mb <= 0 or (host_buffer_mb is not None and host_buffer_mb <= 0):
            raise ValueError(
                f"staging_mb ({staging_mb}), probe_mb ({probe_mb}) and host_buffer_mb ({host_buffer_mb}) must be positive"
            )
        return cls(
            Codec.parse(codec),
            async_save,
            staging_mb * MiB,
            probe_mb * MiB,
            interval_s,
            gpu_hour_usd,
            remote,
            Durability.parse(durable),
            None if host_buffer_mb is None else host_buffer_mb * MiB,
        )
