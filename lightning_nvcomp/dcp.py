"""torch.distributed.checkpoint (DCP) storage that compresses every rank's local shards with the codec core.

Use it wherever DCP takes a storage writer::

    import torch.distributed.checkpoint as dcp
    from lightning_nvcomp.dcp import NvcompFileSystemWriter, NvcompFileSystemReader

    dcp.save(state, storage_writer=NvcompFileSystemWriter(path, codec="auto"))
    dcp.async_save(state, storage_writer=NvcompFileSystemWriter(path, codec="zstd")).result()
    dcp.load(state, storage_reader=NvcompFileSystemReader(path))   # or plain dcp.load(state, checkpoint_id=path)

Which hook, and why. DCP's ``StreamTransformExtension`` (``FileSystemWriter(_extensions=...)``) was the first
candidate and is not used: an extension only wraps the byte stream of ``torch.save(cpu_tensor)`` - it never sees the
tensor, its dtype or its device - so it cannot cut byte planes by dtype (the source of most of the gain on trained
weights), and it runs after DCP has already copied every GPU shard to host memory, so it cannot compress on the GPU.
Instead :class:`NvcompFileSystemWriter` subclasses ``FileSystemWriter`` and replaces two methods:

* ``write_data``: each local shard the plan assigns to this rank (``planner.resolve_data``) is compressed on its own
  device (nvCOMP on CUDA tensors, CPU zstd otherwise) with :func:`lightning_nvcomp.format.snapshot`, and only
  the compressed bytes reach host memory and the ``__<rank>_<n>.distcp`` files, while the next shard is coded.
* ``stage`` (``dcp.async_save``): CUDA shards are compressed on the GPU *while staging*, so training waits for the
  GPU coder and a small device-to-host copy instead of a full-size one, and host memory holds compressed bytes;
  CPU shards are copied (cheap) and compressed in the background thread. ``stage_compress`` changes this. With
  ``codec="none"`` CUDA shards are copied to pinned host memory (what ``"auto"`` predicts for it), not by DCP's
  default staging, which copies to pageable memory at a fraction of the speed.

The file layout and metadata are DCP's own: one ``.metadata`` (written atomically), ``__<rank>_<n>.distcp`` data
files in which each item is stored at ``(offset, length)`` as a self-contained ``torch.save`` zip. For compressed
items that zip is the package's container format (:mod:`lightning_nvcomp.format`, docs/FORMAT.md): its blobs are the record's
compressed segments and its pickle rebuilds the tensor through ``lightning_nvcomp.decode_tensor``, which validates
every record field (:func:`lightning_nvcomp.codec.schema.validate`) and every segment CRC-32 before decoding a byte.
Each item's ``storage_data`` is a :class:`NvcompStorageInfo` (DCP's ``_StorageInfo`` plus ``codec`` and
``raw_nbytes``): readers know how each item was stored, and unpickling ``.metadata`` imports this module, which
registers the decoder with ``torch.load(weights_only=True)``. So:

* DCP's **default** ``FileSystemReader`` (``dcp.load(state, checkpoint_id=path)``, Lightning's FSDP sharded load,
  Accelerate's FSDP load, ``dcp_to_torch_save``) decodes these checkpoints natively, bit-exactly, wherever
  ``lightning_nvcomp`` is installed (gANS items need a GPU; CPU zstd reads the zstd ones anywhere). Where it is not
  installed, reading ``.metadata`` fails with ``No module named 'lightning_nvcomp'``: never garbage tensors.
  (DCP's own ``stream.zstd`` extension format was therefore not needed for compatibility.)
* :class:`NvcompFileSystemReader` adds GPU decoding (items decode on the target shard's GPU), a check of each
  item's pickle CRC, and error messages that name the file and the item.

Overwriting a checkpoint directory in place (Lightning's ``last.ckpt``) is crash-safe: a data file name already in
the directory is never reused (the new file gets a ``.<save id>`` infix), the new ``.metadata`` replaces the old one
atomically once every rank has written, and only then are data files no longer referenced deleted. A save that
fails on any rank, or a rank killed mid-save, leaves the previous checkpoint loadable (its partial data files are
referenced by nothing and are deleted by the next successful save).

Damage and hostile metadata. DCP pickles ``Metadata`` with no checksum, so a flipped byte in an item's
``(offset, length)`` or a chunk's offsets/sizes could load wrong data without an error. :class:`NvcompFileSystemWriter`
therefore writes ``.metadata`` as a pickle of one small object that unpickles through :func:`_checked_metadata`
``(payload, crc, version)``: ``payload`` is DCP's own pickle of the ``Metadata``, ``crc`` its CRC-32, checked before
the payload is unpickled (:class:`~lightning_nvcomp.errors.CorruptCheckpointError` naming ``.metadata`` when it
fails). DCP's default ``FileSystemReader`` does a plain ``pickle.load`` of ``.metadata`` (``read_metadata`` in
``torch/distributed/checkpoint/filesystem.py``, torch 2.13), so it gets the verified ``Metadata`` transparently;
``.metadata`` files of earlier versions (a plain pickled ``Metadata``) still load with either reader. (Rank-local
metadata files, ``use_collectives=False``, stay DCP's own.) :class:`NvcompFileSystemReader` also checks, for every
item it reads and before opening any file: its ``relative_path`` names a file inside the checkpoint directory (no
absolute path, no ``..``), ``offset``/``length`` are non-negative ints within the data file's size, the codec is
known; after decoding, the tensor's dtype and shape must be those the metadata records for the chunk. Items stored
as plain ``torch.save`` zips (byte items such as ``step``, and tensors of plain DCP checkpoints) have every zip
CRC-32 checked before ``torch.load`` (DCP's reader checks none: a flipped byte there can change a non-tensor value
silently). Every error names the data file and the item.

Remote paths (``s3://``, ``gs://``...) are refused at construction with a ``ValueError`` naming them: DCP's
``FileSystem`` would otherwise write them into a local directory named ``s3:`` (remote storage comes later).

Telemetry: after a save, ``writer.stats`` (:class:`DcpSaveStats`) holds this rank's raw and stored bytes and times;
``writer.gather_stats()`` (a collective: every rank calls it) returns the whole checkpoint's :class:`DcpCheckpointStats`;
the coordinator also has ``writer.totals`` (raw/stored bytes of all ranks, from the metadata, no collective).

``codec="auto"`` measures the storage with every rank writing at once (:class:`~lightning_nvcomp.policy.CodecPolicy`
with ``collective=True``), decides on rank 0 and broadcasts the choice, so all ranks store the same codec.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import io
import os
import pickle
import queue
import re
import threading
import time
import zipfile
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import IO, Any, BinaryIO, cast

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    DEFAULT_SUFFIX,
    FileSystemReader,
    FileSystemWriter,
    _split_by_size_and_type,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE, Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.errors import CheckpointError, CodecUnavailableError, CorruptCheckpointError
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.options import CONCRETE_CODECS, Codec
from lightning_nvcomp.policy import CodecPolicy
from lightning_nvcomp.resources import shared
from lightning_nvcomp.stats import ratio
from lightning_nvcomp.storage import atomic_write, check_local

__all__ = [
    "DcpCheckpointStats",
    "DcpSaveStats",
    "NvcompFileSystemReader",
    "NvcompFileSystemWriter",
    "NvcompStorageInfo",
]

#: What ``stage_compress`` may be: which shards ``dcp.async_save``'s staging compresses (the rest are copied).
STAGE_COMPRESS = ("gpu", "all", "none")
_METADATA = ".metadata"
#: One shard is coded at a time per process (writer threads share the GPU coder; files are still written in parallel).
_ENCODE_LOCK = threading.Lock()
#: Data files this writer (or DCP's) may have left in a checkpoint directory.
_DATA_FILE = re.compile(r"^__\d+_\d+(\.[0-9a-f]+)?" + re.escape(DEFAULT_SUFFIX) + "$")
#: The version of the checked ``.metadata`` format (see :func:`_checked_metadata`).
_METADATA_FORMAT = 1
#: Codecs an item's storage info may name (``None``: a plain ``torch.save`` item).
_ITEM_CODECS = tuple(c.value for c in CONCRETE_CODECS)
#: Offsets and lengths beyond this are refused before any arithmetic or allocation (no file is that large).
_MAX_FILE_OFFSET = 1 << 62
#: The name ``_checked_metadata`` reports: the path while our reader reads it, else ``.metadata``.
_metadata_name: contextvars.ContextVar[str] = contextvars.ContextVar("lnv_dcp_metadata", default=_METADATA)


def _refuse_remote(path: Any, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` for a URL (``s3://...``): DCP's ``FileSystem`` would write it into a local
    directory (see :func:`lightning_nvcomp.storage.check_local`)."""
    if isinstance(path, (str, os.PathLike)):
        try:
            check_local(path)
        except ValueError as err:
            raise ValueError(f"{what}: {err}") from None


# -- checked .metadata ------------------------------------------------------------------------------------------


class _CheckedMetadata:
    """What ``.metadata`` holds: DCP's pickle of the ``Metadata`` and its CRC-32. Unpickling it (any reader's
    ``pickle.load``) calls :func:`_checked_metadata`, which returns the verified ``Metadata`` itself."""

    __slots__ = ("crc", "payload")

    def __init__(self, metadata: Metadata) -> None:
        self.payload = pickle.dumps(metadata)
        self.crc = zlib.crc32(self.payload)

    def __reduce__(self) -> tuple:
        return (_checked_metadata, (self.payload, self.crc, _METADATA_FORMAT))


def _checked_metadata(payload: bytes, crc: int, version: int = _METADATA_FORMAT) -> Metadata:
    """Unpickle a checkpoint's ``Metadata`` after checking its CRC-32 (called by ``pickle.load`` of ``.metadata``).

    Raises:
        CorruptCheckpointError: the CRC does not match (the checkpoint metadata is damaged), or the fields are not
            what the writer stores.
        CheckpointError: a format version this code does not know, or an intact payload that cannot be unpickled
            here (a module missing, say).
    """
    where = _metadata_name.get()
    if type(version) is not int or version != _METADATA_FORMAT:
        raise CheckpointError(
            f"{where}: the checkpoint metadata has format version {version!r}, unknown to this lightning_nvcomp "
            f"(it reads version {_METADATA_FORMAT}): written by a newer version, or damaged"
        )
    if not isinstance(payload, bytes) or type(crc) is not int:
        raise CorruptCheckpointError(f"{where}: the checkpoint metadata is damaged (its checked record is malformed)")
    actual = zlib.crc32(payload)
    if actual != crc:
        raise CorruptCheckpointError(
            f"{where}: the checkpoint metadata is damaged (CRC-32 {actual:#010x}, recorded {crc:#010x}); the "
            "checkpoint cannot be loaded safely"
        )
    try:
        metadata = pickle.loads(payload)
    except (MemoryError, CheckpointError):
        raise
    except Exception as err:  # intact bytes (the CRC matched): not damage
        raise CheckpointError(
            f"{where}: the checkpoint metadata is intact but cannot be unpickled here ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def _load_metadata(data: bytes, name: str) -> Metadata:
    """The ``Metadata`` of a ``.metadata`` file's bytes: the checked format (CRC verified) or a plain pickle (files
    of earlier versions, DCP's own). Errors name ``name``; damage raises :class:`CorruptCheckpointError`."""
    # The checked wrapper names lightning_nvcomp.dcp._checked_metadata in its first bytes (DCP's pickle names
    # torch.distributed.checkpoint.metadata.Metadata there); damage may have changed one of the two names.
    checked = b"_checked_metadata" in data[:64] or b"lightning_nvcomp.dcp" in data[:64]
    token = _metadata_name.set(name)
    try:
        metadata = pickle.loads(data)
    except (MemoryError, CheckpointError):
        raise
    except (ImportError, AttributeError) as err:
        if checked:  # the checked wrapper names nothing but _checked_metadata: a different name is damage
            raise CorruptCheckpointError(
                f"{name}: the checkpoint metadata is damaged ({type(err).__name__}: {err})"
            ) from err
        raise CheckpointError(
            f"{name}: the checkpoint metadata needs something this environment lacks ({type(err).__name__}: {err}); "
            "a module is missing, or the file is damaged"
        ) from err
    except Exception as err:  # a truncated or damaged pickle fails in many ways
        raise CorruptCheckpointError(
            f"{name}: the checkpoint metadata is damaged or truncated ({type(err).__name__}: {err})"
        ) from err
    finally:
        _metadata_name.reset(token)
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{name}: holds a {type(metadata).__name__}, not DCP checkpoint metadata")
    if not isinstance(getattr(metadata, "storage_data", None), dict) or not isinstance(
        getattr(metadata, "state_dict_metadata", None), dict
    ):
        raise CorruptCheckpointError(f"{name}: the checkpoint metadata is damaged (no storage or state dict records)")
    return metadata


@dataclass
class NvcompStorageInfo(_StorageInfo):
    """DCP's per-item storage record plus how the item was stored: ``codec`` (``ans``, ``zstd`` or ``none``) and
    the shard's raw size. The item's bytes are a ``torch.save`` zip (the container format when compressed)."""

    codec: str | None = None
    raw_nbytes: int | None = None


@dataclass(frozen=True)
class DcpSaveStats:
    """What one rank did in one DCP save.

    ``stage_s``: time ``dcp.async_save`` blocked this rank in staging (GPU compression and host copies; 0 for
    ``dcp.save``). ``encode_s``: time spent compressing in ``write_data`` (overlapped with writing). ``write_s``:
    wall time of ``write_data`` (compression and file writes, fsync included)."""

    rank: int
    codec: str
    items: int
    raw_nbytes: int
    stored_nbytes: int
    stage_s: float
    encode_s: float
    write_s: float

    @property
    def seconds(self) -> float:
        return self.stage_s + self.write_s

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.stored_nbytes)


@dataclass(frozen=True)
class DcpCheckpointStats:
    """One DCP save over all ranks: totals, and each rank's :class:`DcpSaveStats` (index = rank)."""

    ranks: tuple[DcpSaveStats, ...]

    @property
    def codec(self) -> str:
        return self.ranks[0].codec if self.ranks else "none"

    @property
    def raw_nbytes(self) -> int:
        return sum(r.raw_nbytes for r in self.ranks)

    @property
    def stored_nbytes(self) -> int:
        return sum(r.stored_nbytes for r in self.ranks)

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.stored_nbytes)

    @property
    def seconds(self) -> float:
        """The slowest rank's time: what the checkpoint cost."""
        return max((r.seconds for r in self.ranks), default=0.0)

    def metrics(self, prefix: str = "nvcomp/dcp_") -> dict[str, float]:
        """Flat numbers for a logger."""
        return {
            f"{prefix}raw_bytes": float(self.raw_nbytes),
            f"{prefix}stored_bytes": float(self.stored_nbytes),
            f"{prefix}ratio": self.ratio,
            f"{prefix}seconds": self.seconds,
            f"{prefix}stage_s": max((r.stage_s for r in self.ranks), default=0.0),
        }


def default_policy(mode: str) -> CodecPolicy:
    """The policy behind ``codec="auto"`` when none is given: one per process and mode, so the storage is probed
    once per run (Lightning and Accelerate create a new writer for every save). Both modes share one set of
    measurements: the storage is probed and the codecs calibrated once, whichever save comes first."""
    if mode == "sync":  # write_data codes item by item
        return shared("dcp-policy-sync", lambda: CodecPolicy(mode="sync", collective=True, per_tensor=True))
    return shared(f"dcp-policy-{mode}", lambda: default_policy("sync").in_mode(mode))


def _existing_dir(path: Path) -> str:
    for p in (path, *path.parents):
        if p.is_dir():
            return str(p)
    return "."


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor whose storage holds exactly its elements (what gets stored), as DCP's writer does."""
    t = t.detach()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


class _StagedShard:
    """A shard compressed while staging, stored in place of the copy that DCP's staging would have made."""

    __slots__ = ("placeholder", "raw_nbytes", "snap")

    def __init__(self, snap: fileformat.Snapshot, placeholder: torch.Tensor, raw_nbytes: int) -> None:
        # The placeholder is kept alive with the entry: its address identifies it and cannot be reused meanwhile.
        self.snap, self.placeholder, self.raw_nbytes = snap, placeholder, raw_nbytes


class NvcompFileSystemWriter(FileSystemWriter):
    """DCP ``FileSystemWriter`` that stores every local shard compressed (see the module docstring).

    Args:
        path: the checkpoint directory (as ``FileSystemWriter``).
        codec: ``"ans"`` (nvCOMP gANS; GPU only, needs a GPU to load), ``"zstd"`` (nvCOMP Zstd on CUDA shards, CPU
            zstd otherwise; loads anywhere), ``"none"`` (stored as is, still our metadata and stats), or
            ``"auto"`` (the codec with the shortest predicted save: all ranks probe the storage together, rank 0
            decides, the choice is broadcast).
        policy: the :class:`CodecPolicy` behind ``"auto"`` (default: one per process and mode, with
            ``collective=True``).
        stage_compress: what ``dcp.async_save``'s staging compresses: ``"gpu"`` (CUDA shards, on the GPU; CPU shards
            are copied and compressed in the background), ``"all"`` (every shard at staging: least host memory,
            training waits for CPU compression), ``"none"`` (DCP's staging copies everything; compression runs in
            the background on the CPU).
        staging_nbytes: GPU scratch bound per shard coding (see :func:`lightning_nvcomp.format.snapshot`).
        process_group: the group ``"auto"`` broadcasts its decision in and :meth:`gather_stats` gathers over
            (default: the default group; must be the group DCP saves with).
        Other arguments are ``FileSystemWriter``'s; ``_extensions`` is refused (stream transforms would
        re-encode compressed bytes).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        codec: str = "auto",
        *,
        policy: CodecPolicy | None = None,
        stage_compress: str = "gpu",
        staging_nbytes: int | None = None,
        process_group: dist.ProcessGroup | None = None,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int = 1,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Sequence[Any] | None = None,
    ) -> None:
        codec = Codec.parse(codec).value
        if stage_compress not in STAGE_COMPRESS:
            raise ValueError(f"stage_compress must be one of {STAGE_COMPRESS}, not {stage_compress!r}")
        if _extensions:
            raise ValueError("NvcompFileSystemWriter compresses shards itself; DCP stream extensions are not supported")
        _refuse_remote(path, "NvcompFileSystemWriter")
        super().__init__(
            path,
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=cache_staged_state_dict,
            overwrite=overwrite,
        )
        self.codec = codec
        self.policy = policy
        self.stage_compress = stage_compress
        self.staging_nbytes = staging_nbytes
        self.process_group = process_group
        #: This rank's :class:`DcpSaveStats` of the last save (None before the first).
        self.stats: DcpSaveStats | None = None
        #: On the coordinator after a save: ``{"raw_nbytes", "stored_nbytes", "items"}`` over all ranks.
        self.totals: dict[str, int] | None = None
        self._chosen: str | None = None  # the codec decided while staging (async_save), used by the next write
        self._stage_s = 0.0
        self._staged: dict[int, _StagedShard] = {}  # placeholder storage data_ptr -> shard compressed at staging

    # -- codec choice -------------------------------------------------------------------------------------------

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and getattr(self, "use_collectives", True)

    def write_gbps(self) -> float:
        """Write bandwidth of one writer to this checkpoint's storage, GB/s, measured once per run and file system
        with every rank writing at once (a collective the first time: every rank calls it)."""
        return (self.policy or default_policy("sync")).write_gbps(_existing_dir(Path(self.path)))

    def _agree_codec(self, tensors: list[torch.Tensor], mode: str) -> str:
        """The codec of this save. ``auto``: every rank probes the storage together, rank 0 decides, and the
        decision is broadcast (every rank must call this at the same point)."""
        if self.codec != "auto":
            return self.codec
        policy = self.policy or default_policy(mode)
        directory = _existing_dir(Path(self.path))
        distributed = self._distributed()
        rank = dist.get_rank(self.process_group) if distributed else 0
        policy.write_gbps(directory)  # collective the first time: all ranks write at once
        choice = [policy.decide(tensors, directory)[0].codec if rank == 0 else None]
        if distributed:
            dist.broadcast_object_list(choice, group_src=0, group=self.process_group)
        return cast(str, choice[0])

    # -- async staging ------------------------------------------------------------------------------------------

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        """``dcp.async_save``'s staging: compress CUDA shards on the GPU (``stage_compress``), copy the rest."""
        begin = time.perf_counter()
        self._staged = {}
        tensors = _local_tensors(state_dict)
        self._chosen = codec = self._agree_codec(tensors, "async")
        devices = {"gpu": ("cuda",), "all": ("cuda", "cpu"), "none": ()}[self.stage_compress]
        if not any(t.device.type in devices for t in tensors):
            staged = super().stage(state_dict)
        else:
            from torch.distributed._state_dict_utils import _iterate_state_dict

            staged = _iterate_state_dict(
                state_dict,
                functools.partial(self._stage_sharded, codec=codec, devices=devices),
                functools.partial(self._stage_dtensor, codec=codec, devices=devices),
                lambda t, *_: self._stage_tensor(t, codec, devices),
                type_check=False,
            )
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        self._stage_s = time.perf_counter() - begin
        return staged

    def _stage_tensor(self, t: torch.Tensor, codec: str, devices: tuple[str, ...]) -> torch.Tensor:
        t = t.detach()
        if t.device.type not in devices or t.numel() == 0 or t.dim() == 0 or t.dtype not in fileformat.DTYPES.values():
            return t.to("cpu", copy=True)
        src = _compact(t)
        with _ENCODE_LOCK:
            # isolate: the file is written while training goes on (with "none", CPU shards must be copied too)
            snap = fileformat.snapshot(src, codec, [src], isolate=True, staging_nbytes=self.staging_nbytes)
        # Never written to: a placeholder with the shard's shape for the planner (torch.empty touches no memory).
        placeholder = torch.empty(t.shape, dtype=t.dtype)
        self._staged[placeholder.untyped_storage().data_ptr()] = _StagedShard(
            snap, placeholder, t.numel() * t.element_size()
        )
        return placeholder

    def _stage_dtensor(self, d: Any, pg: Any, device: Any, companion: Any, *, codec: str, devices: tuple) -> Any:
        from torch.distributed.tensor import DTensor

        if d.dim() == 0:
            return d.to("cpu")
        local = self._stage_tensor(d._local_tensor, codec, devices)
        return DTensor(local, d._spec, requires_grad=False)

    def _stage_sharded(self, st: Any, pg: Any, device: Any, companion: Any, *, codec: str, devices: tuple) -> Any:
        import copy

        from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

        if not st.local_shards():
            return st
        cpu = torch.device("cpu")
        shards = []
        for shard in st.local_shards():
            meta = copy.deepcopy(shard.metadata)
            if meta.placement is not None:
                meta.placement._device = cpu
            shards.append(Shard(self._stage_tensor(shard.tensor, codec, devices), meta))
        st_meta = copy.deepcopy(st.metadata())
        for meta in st_meta.shards_metadata:
            if meta.placement is not None:
                meta.placement._device = cpu
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, sharded_tensor_metadata=st_meta, process_group=st._process_group, init_rrefs=st._init_rrefs
        )

    # -- writing ------------------------------------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            _refuse_remote(checkpoint_id, "NvcompFileSystemWriter")
        super().reset(checkpoint_id)
        self.totals = None

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        begin = time.perf_counter()
        staged, self._staged = self._staged, {}
        stage_s, self._stage_s = self._stage_s, 0.0
        codec, self._chosen = self._chosen, None
        if codec is None and self.codec != "auto":
            codec = self.codec
        if codec is None:
            error: BaseException | None = None
            tensors: list[torch.Tensor] = []
            try:
                tensors = [
                    cast(torch.Tensor, planner.resolve_data(item))
                    for item in plan.items
                    if item.type != WriteItemType.BYTE_IO
                ]
            except BaseException as err:  # still take part in the collective choice, then fail
                error = err
            codec = self._agree_codec(tensors, "sync")
            if error is not None:
                raise error
            del tensors
        prefix = plan.storage_data.prefix
        directory = Path(self.path)
        names = iter(range(1 << 30))

        def file_name() -> str:
            n = next(names)
            name = f"{prefix}{n}{DEFAULT_SUFFIX}"
            if (directory / name).exists():  # never overwrite a file a previous checkpoint may still use
                name = f"{prefix}{n}.{self.save_id.replace('-', '')[:12]}{DEFAULT_SUFFIX}"
            return name

        buckets = (
            _split_by_size_and_type(self.thread_count, plan.items)
            if self.single_file_per_rank
            else [[item] for item in plan.items]
        )
        jobs: queue.Queue = queue.Queue()
        for bucket in buckets:
            jobs.put((file_name(), bucket))
        outcomes: list[tuple[list[WriteResult], float]] = []
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while True:
                    try:
                        name, items = jobs.get_nowait()
                    except queue.Empty:
                        return
                    outcomes.append(self._write_file(name, items, planner, codec, staged))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=worker, name=f"lnv-dcp-{i}") for i in range(1, self.thread_count)]
        for t in threads:
            t.start()
        worker()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        results = [r for rs, _ in outcomes for r in rs]
        infos = [r.storage_data for r in results if isinstance(r.storage_data, NvcompStorageInfo)]
        seconds = time.perf_counter() - begin
        rank = self.rank if self.rank is not None else 0
        self.stats = DcpSaveStats(
            rank=rank,
            codec=codec,
            items=len(infos),
            raw_nbytes=sum(i.raw_nbytes or 0 for i in infos),
            stored_nbytes=sum(i.length for i in infos),
            stage_s=stage_s,
            encode_s=sum(e for _, e in outcomes),
            write_s=seconds,
        )
        if self.codec == "auto":
            (self.policy or default_policy("sync")).observe_write(
                _existing_dir(directory), self.stats.stored_nbytes, seconds
            )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _encode_item(
        self, item: WriteItem, planner: SavePlanner, codec: str, staged: dict[int, _StagedShard]
    ) -> tuple[fileformat.Snapshot, int, str]:
        """Compress one tensor item: returns its snapshot, raw size and codec. Uses the shard compressed while
        staging when there is one."""
        data = cast(torch.Tensor, planner.resolve_data(item)).detach()
        shard = staged.get(data.untyped_storage().data_ptr()) if data.numel() else None
        if shard is not None:
            held = shard.placeholder
            if (
                data.shape != held.shape
                or data.dtype != held.dtype
                or data.stride() != held.stride()
                or data.storage_offset()
            ):
                raise CheckpointError(
                    f"item {item.index.fqn!r}: the planner asks for a view {tuple(data.shape)} of a shard compressed "
                    f"while staging {tuple(held.shape)}; save with stage_compress='none'"
                )
            return shard.snap, shard.raw_nbytes, codec
        if data.device.type not in ("cpu", "cuda") or data.dtype not in fileformat.DTYPES.values():
            data = data.cpu()
        data = _compact(data)
        with _ENCODE_LOCK:
            snap = fileformat.snapshot(data, codec, [data], staging_nbytes=self.staging_nbytes)
        return snap, data.numel() * data.element_size(), codec

    def _write_file(
        self, name: str, items: list[WriteItem], planner: SavePlanner, codec: str, staged: dict[int, _StagedShard]
    ) -> tuple[list[WriteResult], float]:
        """Write one data file: byte items as they are, then each tensor item compressed (the next item is coded
        while this one is written). Returns the write results and the seconds spent coding."""
        results: list[WriteResult] = []
        encode_s = 0.0
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "wb") as stream:
            for item in (i for i in items if i.type == WriteItemType.BYTE_IO):
                data = cast(io.BytesIO, planner.resolve_data(item))
                offset = stream.tell()
                stream.write(data.getbuffer())
                length = stream.tell() - offset
                results.append(WriteResult(item.index, length, _StorageInfo(name, offset, length)))

            def write(item: WriteItem, snap: fileformat.Snapshot, raw: int, used: str) -> WriteResult:
                offset = stream.tell()
                snap.write_to(ArchiveWriter(cast(BinaryIO, stream)))
                length = stream.tell() - offset
                return WriteResult(item.index, length, NvcompStorageInfo(name, offset, length, None, used, raw))

            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lnv-dcp-write") as disk:
                pending = None
                for item in (i for i in items if i.type != WriteItemType.BYTE_IO):
                    begin = time.perf_counter()
                    snap, raw, used = self._encode_item(item, planner, codec, staged)
                    encode_s += time.perf_counter() - begin
                    if pending is not None:
                        results.append(pending.result())
                    pending = disk.submit(write, item, snap, raw, used)
                if pending is not None:
                    results.append(pending.result())
            if self.sync_files:
                stream.flush()
                os.fsync(stream.fileno())
        return results, encode_s

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write ``.metadata`` atomically, with its CRC-32 (see :func:`_checked_metadata`; the new checkpoint exists
        from that instant), then delete data files no longer referenced (an overwritten checkpoint's)."""
        infos = [r.storage_data for rs in results for r in rs]
        ours = [i for i in infos if isinstance(i, NvcompStorageInfo)]
        self.totals = {
            "raw_nbytes": sum(i.raw_nbytes or 0 for i in ours),
            "stored_nbytes": sum(i.length for i in ours),
            "items": len(ours),
        }
        if not self.use_collectives and self.rank is not None:
            super().finish(metadata, results)  # rank-local metadata files: DCP's own way
            return
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        checked = _CheckedMetadata(metadata)
        atomic_write(Path(self.path) / _METADATA, lambda f: pickle.dump(checked, f))
        referenced = {i.relative_path for i in infos}
        for entry in os.listdir(self.path):
            if _DATA_FILE.match(entry) and entry not in referenced:
                try:
                    os.unlink(os.path.join(self.path, entry))
                except OSError:
                    pass

    # -- telemetry ----------------------------------------------------------------------------------------------

    def gather_stats(self) -> DcpCheckpointStats:
        """Every rank's stats of the last save, on every rank (a collective when distributed: all ranks call it,
        after the save has finished on all of them - for ``async_save``, after its future)."""
        mine = self.stats or DcpSaveStats(self.rank or 0, self.codec, 0, 0, 0, 0.0, 0.0, 0.0)
        if not self._distributed():
            return DcpCheckpointStats((mine,))
        gathered: list[Any] = [None] * dist.get_world_size(self.process_group)
        dist.all_gather_object(gathered, dataclasses.asdict(mine), group=self.process_group)
        return DcpCheckpointStats(tuple(DcpSaveStats(**g) for g in gathered))


def _local_tensors(state_dict: STATE_DICT_TYPE) -> list[torch.Tensor]:
    """The local tensors of a state dict: plain tensors, DTensor local shards, ShardedTensor local shards."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    found: list[torch.Tensor] = []

    def visit(obj: Any) -> None:
        if isinstance(obj, DTensor):
            found.append(obj._local_tensor)
        elif isinstance(obj, ShardedTensor):
            found.extend(s.tensor for s in obj.local_shards())
        elif isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                visit(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v)

    visit(state_dict)
    return [t.detach() for t in found if t.numel() and t.dtype in fileformat.DTYPES.values()]


class NvcompFileSystemReader(FileSystemReader):
    """DCP ``FileSystemReader`` for checkpoints of :class:`NvcompFileSystemWriter` (and plain DCP ones).

    Compressed items are decoded on the target shard's device (nvCOMP on a GPU, CPU zstd otherwise) after their
    record fields, segment CRCs and pickle CRC are checked; ``.metadata``'s CRC is checked (files of earlier
    versions, without one, still load); every item's storage info is validated before its file is opened (a file
    inside the checkpoint directory, an ``(offset, length)`` within it, a known codec) and every decoded tensor's
    dtype and shape against the metadata; plain ``torch.save`` items have their zip CRCs checked. Errors name the
    file and the item; damage raises :class:`~lightning_nvcomp.errors.CorruptCheckpointError`. DCP's default
    ``FileSystemReader`` reads these checkpoints too (on the CPU), see the module docstring.
    """

    def __init__(self, path: str | os.PathLike, _extension_registry: Any = None) -> None:
        _refuse_remote(path, "NvcompFileSystemReader")
        super().__init__(path, _extension_registry)
        self._metadata: Metadata | None = None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            _refuse_remote(checkpoint_id, "NvcompFileSystemReader")
        super().reset(checkpoint_id)
        self._metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        metadata = _load_metadata(data, str(path))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[tuple[ReadItem, _StorageInfo]]] = {}
        for req in plan.items:
            info = self.storage_data.get(req.storage_index)
            if not isinstance(info, _StorageInfo):
                raise CorruptCheckpointError(
                    f"{_METADATA}: item {req.storage_index.fqn!r} has no valid storage record "
                    f"({type(info).__name__}); the checkpoint metadata is damaged"
                )
            _check_storage_info(info, f"item {req.storage_index.fqn!r}")
            per_file.setdefault(info.relative_path, []).append((req, info))
        # One decode bound for the whole load, as for one file: 16 x the bytes read + 256 MiB (fileformat.LoadState).
        budget = fileformat.LoadState(
            str(self.path), file_nbytes=sum(i.length for rs in per_file.values() for _, i in rs)
        )
        for relative_path, reqs in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            with self.fs.create_stream(path, "rb") as stream:
                size = _stream_size(stream)
                for req, info in reqs:
                    where = f"{relative_path}: item {req.storage_index.fqn!r}"
                    if info.offset + info.length > size:
                        raise CorruptCheckpointError(
                            f"{where} lies at bytes {info.offset}..{info.offset + info.length} but the file has "
                            f"{size} bytes: the data file is truncated or the metadata is damaged"
                        )
                    self._read_one(stream, req, info, planner, where, budget)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_one(
        self,
        stream: Any,
        req: ReadItem,
        info: _StorageInfo,
        planner: LoadPlanner,
        where: str,
        budget: fileformat.LoadState,
    ) -> None:
        view = self._slice_file(stream, info)
        if isinstance(info, NvcompStorageInfo) and info.codec is not None:
            target = planner.resolve_tensor(req).detach()
            self._commit(req, _read_item(view, info, target.device, where, budget), target, planner, where)
            return
        source = self.transforms.transform_load_stream(req, info.transform_descriptors or (), view)
        data = source.read(-1) if info.transform_descriptors else _read_exactly(view, info.length, where)
        if req.type == LoadItemType.BYTE_IO:
            if data[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(data)):  # else a custom planner's bytes
                fileformat.check_zip(io.BytesIO(data), where)
            _check_torch_zip(data, where)  # the planner's torch.load would fail it with a bare RuntimeError
            planner.load_bytes(req, io.BytesIO(data))
            return
        tensor = fileformat.read(io.BytesIO(data), where, map_location="cpu", state=budget)  # every CRC checked
        if not isinstance(tensor, torch.Tensor):
            raise CorruptCheckpointError(f"{where}: holds a {type(tensor).__name__}, not a tensor")
        self._commit(req, tensor, planner.resolve_tensor(req).detach(), planner, where)

    def _commit(
        self, req: ReadItem, tensor: torch.Tensor, target: torch.Tensor, planner: LoadPlanner, where: str
    ) -> None:
        """Check the stored chunk against the metadata and the plan, copy the requested part into ``target``."""
        self._check_tensor(req, tensor, where)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        if target.size() != tensor.size():
            raise CorruptCheckpointError(
                f"{where} has shape {tuple(tensor.shape)} where the plan expects {tuple(target.shape)}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    def _check_tensor(self, req: ReadItem, tensor: torch.Tensor, where: str) -> None:
        """The stored tensor is the chunk the metadata describes: its dtype and its shape (``copy_`` into the target
        would otherwise convert a wrong dtype silently)."""
        md = self._metadata.state_dict_metadata.get(req.storage_index.fqn) if self._metadata is not None else None
        if not isinstance(md, TensorStorageMetadata):
            return
        chunk = _find_chunk(md, req.storage_index)
        expected_dtype = md.properties.dtype
        if tensor.dtype != expected_dtype or (chunk is not None and tuple(tensor.shape) != tuple(chunk.sizes)):
            shape = tuple(chunk.sizes) if chunk is not None else "?"
            raise CorruptCheckpointError(
                f"{where} holds {tensor.dtype} {tuple(tensor.shape)} where the checkpoint metadata records "
                f"{expected_dtype} {shape}: the item is damaged"
            )


def _find_chunk(md: TensorStorageMetadata, index: Any) -> Any:
    chunks = md.chunks
    hint = index.index
    if type(hint) is int and 0 <= hint < len(chunks) and chunks[hint].offsets == index.offset:
        return chunks[hint]
    return next((c for c in chunks if c.offsets == index.offset), None)


def _check_storage_info(info: _StorageInfo, where: str) -> None:
    """Refuse an item whose storage info cannot be honest: a data file outside the checkpoint directory, offsets or
    lengths that are not non-negative ints of a plausible size, an unknown codec (before any file is opened)."""
    rel = info.relative_path
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise CorruptCheckpointError(f"{where}: its data file name {rel!r} is not a file name (damaged metadata)")
    parts = re.split(r"[\\/]", rel)
    if os.path.isabs(rel) or rel[0] in "/\\" or ".." in parts or PureWindowsPath(rel).drive:
        raise CorruptCheckpointError(
            f"{where}: its data file {rel!r} lies outside the checkpoint directory; refused (damaged or hostile "
            "metadata)"
        )
    for field in ("offset", "length"):
        value = getattr(info, field, None)
        if type(value) is not int or not 0 <= value < _MAX_FILE_OFFSET:
            raise CorruptCheckpointError(f"{rel}: {where} has {field} {value!r}; the checkpoint metadata is damaged")
    if isinstance(info, NvcompStorageInfo):
        if info.codec is not None and info.codec not in _ITEM_CODECS:
            raise CorruptCheckpointError(f"{rel}: {where}: unknown codec {info.codec!r} in the checkpoint metadata")
        if info.codec is not None and info.transform_descriptors:
            raise CorruptCheckpointError(
                f"{rel}: {where}: stream transforms {info.transform_descriptors!r} on a compressed item "
                "(the writer never applies any); the checkpoint metadata is damaged"
            )
        raw = info.raw_nbytes
        if raw is not None and (type(raw) is not int or not 0 <= raw < _MAX_FILE_OFFSET):
            raise CorruptCheckpointError(f"{rel}: {where} has raw size {raw!r}; the checkpoint metadata is damaged")


def _check_torch_zip(data: bytes, where: str) -> None:
    """Open a ``torch.save`` zip with torch's own reader (miniz), which refuses some damage ``zipfile`` ignores (the
    end record's disk numbers, say): a damaged byte item fails here as damage, naming it."""
    if data[:4] != b"PK\x03\x04":
        return
    reader = getattr(torch._C, "PyTorchFileReader", None)
    if reader is None:
        return
    try:
        reader(io.BytesIO(data))
    except RuntimeError as err:
        raise CorruptCheckpointError(f"{where}: the stored bytes are damaged ({str(err).split('. ')[0]})") from None


def _stream_size(stream: Any) -> int:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        here = stream.tell()
        size = stream.seek(0, os.SEEK_END)
        stream.seek(here)
        return size


def _read_exactly(view: IO[bytes], length: int, where: str) -> bytes:
    data = view.read(length)
    if len(data) != length:
        raise CorruptCheckpointError(f"{where}: the file ends {length - len(data)} bytes early")
    return data


def _read_item(
    view: IO[bytes], info: NvcompStorageInfo, device: torch.device, where: str, budget: fileformat.LoadState
) -> torch.Tensor:
    """Decode one stored item (a torch.save zip, compressed records inside) onto ``device`` (GPU if it is one)."""
    if info.codec not in _ITEM_CODECS:
        raise CorruptCheckpointError(f"{where}: unknown codec {info.codec!r} in the checkpoint metadata")
    if info.codec == "ans" and not gpu_available():
        raise CodecUnavailableError(
            f"{where} was compressed with gANS, which needs a CUDA GPU and nvCOMP to decode (no CPU decoder); load "
            "it on a GPU machine, or save with codec='zstd' to load anywhere"
        )
    data = io.BytesIO(_read_exactly(view, info.length, where))
    location = device if device.type == "cuda" and gpu_available() else torch.device("cpu")
    tensor = fileformat.read(data, where, map_location=location, state=budget)
    if not isinstance(tensor, torch.Tensor):
        raise CorruptCheckpointError(f"{where}: holds a {type(tensor).__name__}, not a tensor")
    if info.raw_nbytes is not None and tensor.numel() * tensor.element_size() != info.raw_nbytes:
        raise CorruptCheckpointError(
            f"{where} decodes to {tensor.numel() * tensor.element_size()} bytes where the checkpoint metadata records "
            f"{info.raw_nbytes}: the item is damaged"
        )
    return tensor
