"""How a run saves: :class:`SaveOptions`, the one options object every entry point takes (the Lightning plugin and
sharded strategies, ``attach``, the DCP writer, ``save``), and its choices: :class:`Codec` (what each codec is, where
it encodes and decodes, whether it can run here) and :class:`Durability`."""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning_nvcomp.codec.gpu import gpu_available, gpu_missing
from lightning_nvcomp.errors import CodecUnavailableError
from lightning_nvcomp.storage.remote.options import RemoteOptions


class _ChoiceType(enum.EnumMeta):
    """Finds a member by its value too: ``Codec["zstd"]`` is ``Codec.ZSTD``. Config parsers (jsonargparse, so
    LightningCLI's YAML) look an enum's members up by name, where configs write the values."""

    def __getitem__(cls, name: str) -> Any:
        try:
            return super().__getitem__(name)
        except KeyError:
            try:
                return cls(name)
            except ValueError:
                raise KeyError(name) from None


class _Choice(str, enum.Enum, metaclass=_ChoiceType):
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


@dataclass(frozen=True)
class DeltaOptions:
    """Delta checkpoints: each save stored as its difference from its chain's keyframe (the chain's first checkpoint,
    stored alone), where that codes smaller (per tensor, measured on each save); a new chain every ``keyframe_every``
    saves. Loading a delta reads its keyframe too; pruning keeps every file a kept checkpoint needs (see
    docs/guides/delta.md).

    Args:
        keyframe_every: a chain's length: a checkpoint is stored alone at least this often (2 or more).

    Raises:
        ValueError: ``keyframe_every`` that is not an integer of 2 or more.
    """

    keyframe_every: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.keyframe_every, bool) or not isinstance(self.keyframe_every, int) or self.keyframe_every < 2:
            raise ValueError(f"keyframe_every must be an integer of 2 or more, not {self.keyframe_every!r}")


MiB = 1 << 20
#: Coding works in pieces whose size is a multiple of this (see :class:`~lightning_nvcomp.codec.record.Encoder`).
_STAGING_ALIGN = 512


@dataclass(frozen=True)
class SaveOptions:
    """How a run saves its checkpoints: the one options object of every entry point (:class:`NvcompCheckpointIO`,
    :func:`~lightning_nvcomp.accelerate.attach`, :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`,
    :class:`NvcompFSDPStrategy` and :class:`NvcompModelParallelStrategy`, :func:`~lightning_nvcomp.save`). Each takes
    it as ``options=`` and its fields, under the same names and in the same units, as keyword arguments; a keyword
    given beside ``options=`` overrides that field (:meth:`merged`). Sizes are in MiB, times in seconds, prices in
    USD, as a YAML config writes them; :attr:`staging_nbytes`, :attr:`probe_nbytes` and :attr:`host_buffer_nbytes`
    are the same sizes in bytes.

    Not every entry point acts on every field: the DCP writer uses ``codec``, ``staging_mb`` and ``remote``; the
    sharded strategies ``codec``, ``staging_mb`` and ``gpu_hour_usd``; ``save`` ``codec`` and ``staging_mb``. One of
    them given another field set differently from its default refuses it (ValueError naming the field), rather than
    ignoring it.

    Args:
        codec: a :class:`Codec` or its name (``"auto"``, ``"ans"``, ``"zstd"``, ``"none"``).
        async_save: write on a background thread; training waits only until the compressed snapshot is in host
            memory. A later save, a removal and the end of the run wait for it; a failed write is raised there.
        staging_mb: how much is coded at once, in MiB (a multiple of 512 bytes); a GPU save borrows about three times
            this much GPU memory, never a clone of the whole state. None (the default): the coder's own, 256 MiB on
            a GPU; on the CPU, pieces of 16 MiB coded in parallel (see :mod:`lightning_nvcomp.codec.engines`).
        probe_mb: largest size of the write-bandwidth probe run once per file system, in MiB (it sets the baseline
            savings are measured against, and feeds ``auto``; never more than the first checkpoint or a quarter of the
            free space, see :mod:`lightning_nvcomp.auto.probe`).
        interval_s: seconds between saves, for ``auto`` in async mode (None: measured from the saves).
        gpu_hour_usd: price of a GPU-hour in USD, for the saved-dollars metric (None: no dollar metric).
        remote: how checkpoints at URLs (``s3://...``) are reached and uploaded (None: the backend's own
            configuration and environment, as :class:`~lightning_nvcomp.storage.remote.RemoteOptions` defaults).
        durable: when a checkpoint is on stable storage (:class:`Durability` or its name; default ``background``).
        host_buffer_mb: async saves: most MiB of compressed snapshots held in host memory while earlier ones are
            written; a save that would exceed it waits for the oldest writes (and says so: storage slower than the
            save interval). None: two checkpoints, the one being written and the new one.
        delta: store each checkpoint as a delta against an earlier one of the run where that codes smaller
            (:class:`DeltaOptions`); None (the default): every checkpoint stands alone.

    Raises:
        ValueError: an unknown codec or durability, a size that is not a positive number of MiB (``staging_mb``: not a
            multiple of 512 bytes), an ``interval_s`` that is not positive, a negative ``gpu_hour_usd``.
        TypeError: ``async_save`` that is not a bool, ``remote`` that is not a RemoteOptions, ``delta`` that is not a
            DeltaOptions.
        CodecUnavailableError: the codec cannot run here (``ans`` without a CUDA GPU and nvCOMP): checked now, not at
            the first checkpoint hours later.
    """

    codec: Codec = Codec.AUTO
    async_save: bool = False
    staging_mb: float | None = None
    probe_mb: float = 256
    interval_s: float | None = None
    gpu_hour_usd: float | None = None
    remote: RemoteOptions | None = None
    durable: Durability = Durability.BACKGROUND
    host_buffer_mb: float | None = None
    delta: DeltaOptions | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec.parse(self.codec))
        object.__setattr__(self, "durable", Durability.parse(self.durable))
        if type(self.async_save) is not bool:
            raise TypeError(f"async_save must be True or False, not {self.async_save!r}")
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions, not {self.remote!r}")
        if self.delta is not None and not isinstance(self.delta, DeltaOptions):
            raise TypeError(f"delta must be a DeltaOptions, not {self.delta!r}")
        _check_number("staging_mb", self.staging_mb, "a positive number of MiB", optional=True)
        _check_number("probe_mb", self.probe_mb, "a positive number of MiB")
        _check_number("host_buffer_mb", self.host_buffer_mb, "a positive number of MiB", optional=True)
        _check_number("interval_s", self.interval_s, "a positive number of seconds", optional=True)
        _check_number("gpu_hour_usd", self.gpu_hour_usd, "a price in USD, 0 or more", optional=True, zero=True)
        nbytes = 0 if self.staging_mb is None else self.staging_mb * MiB
        if nbytes % _STAGING_ALIGN:
            raise ValueError(
                f"staging_mb must be a multiple of {_STAGING_ALIGN} bytes ({_STAGING_ALIGN / MiB:g} MiB), not "
                f"{self.staging_mb!r} ({nbytes:g} bytes)"
            )
        self.codec.require_available()

    @property
    def staging_nbytes(self) -> int | None:
        """:attr:`staging_mb` in bytes (None: the coder's default)."""
        return None if self.staging_mb is None else int(self.staging_mb * MiB)

    @property
    def probe_nbytes(self) -> int:
        """:attr:`probe_mb` in bytes."""
        return int(self.probe_mb * MiB)

    @property
    def host_buffer_nbytes(self) -> int | None:
        """:attr:`host_buffer_mb` in bytes (None: the default, two checkpoints)."""
        return None if self.host_buffer_mb is None else int(self.host_buffer_mb * MiB)

    @classmethod
    def of(cls, **fields: Any) -> SaveOptions:
        """Deprecated since 0.2, removed in 0.4: ``SaveOptions(...)`` takes the same MiB keywords."""
        warnings.warn(
            "SaveOptions.of(...) is deprecated: SaveOptions(...) takes the same keywords",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls(**fields)

    @classmethod
    def merged(
        cls, owner: str, options: SaveOptions | None = None, uses: Collection[str] | None = None, **given: Any
    ) -> SaveOptions:
        """The options of one entry point: ``options`` (default: the defaults), with each keyword argument in
        ``given`` that is not None put over the field of that name.

        Args:
            owner: the entry point, as errors name it.
            options: what ``options=`` gave.
            uses: the fields ``owner`` acts on (default: all); another field set differently from its default is
                refused, never ignored.
            **given: the entry point's keyword arguments, by field name (None: not given).

        Raises:
            ValueError, TypeError, CodecUnavailableError: as :class:`SaveOptions`; ValueError also for a field
                that ``owner`` does not use, TypeError for ``options`` that is not a SaveOptions.
        """
        if options is not None and not isinstance(options, SaveOptions):
            raise TypeError(f"{owner}: options must be a SaveOptions, not {options!r}")
        changes = {name: value for name, value in given.items() if value is not None}
        merged = dataclasses.replace(options, **changes) if options is not None else cls(**changes)
        if uses is not None:
            unused = [
                f.name for f in dataclasses.fields(cls) if f.name not in uses and getattr(merged, f.name) != f.default
            ]
            if unused:
                raise ValueError(
                    f"{owner} does not use {', '.join(unused)} (only {', '.join(uses)}): leave "
                    f"{'it' if len(unused) == 1 else 'them'} at the default"
                )
        return merged


def mb_of_nbytes(owner: str, name: str, nbytes: int | None, mb: float | None) -> float | None:
    """``mb``, or the MiB of a size given in bytes under the deprecated name ``name`` (``staging_nbytes``, now
    ``staging_mb`` like every size of the options), with a DeprecationWarning pointing at the caller's caller.

    Raises:
        ValueError: both are given.
    """
    if nbytes is None:
        return mb
    new = name.replace("_nbytes", "_mb")
    if mb is not None:
        raise ValueError(f"{owner}: give {new} only ({name} is its deprecated spelling, in bytes)")
    warnings.warn(
        f"{owner}({name}=...) is deprecated and will be removed in the next release: give {new}={nbytes / MiB:g} "
        f"(MiB), as every entry point takes it",
        DeprecationWarning,
        stacklevel=3,
    )
    return nbytes / MiB


def _check_number(name: str, value: object, what: str, optional: bool = False, zero: bool = False) -> None:
    """Raise ValueError (naming option ``name`` and ``what`` it must be) unless ``value`` is a finite number above 0
    (0 too if ``zero``; None too if ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if value > 0 or (zero and value == 0):
            return
    raise ValueError(f"{name} must be {what}, not {value!r}")
