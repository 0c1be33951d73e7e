"""A DCP (``torch.distributed.checkpoint``) checkpoint directory as the commands see it: its items, with the rank and
data file of each, from its ``.metadata`` (:func:`survey`, which decodes nothing), and every item read, decoded and
checked by :class:`~lightning_nvcomp.dcp.NvcompFileSystemReader` (:func:`verify`), which DCP's storage-reader
protocol drives here as ``dcp.load`` drives it, a data file at a time, into tensors made for the purpose: every check
of the reader (the ``.metadata`` CRC, each item's storage record, CRCs, dtype and shape against the metadata) applies.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from tqdm import tqdm

from lightning_nvcomp import format as fileformat
from lightning_nvcomp._compat.dcp import StorageInfo
from lightning_nvcomp.cli.common import EXIT_OK, explain
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, RefusedObjectsError
from lightning_nvcomp.integrations.dcp import NvcompFileSystemReader
from lightning_nvcomp.integrations.dcp.metadata import METADATA, check_storage_info
from lightning_nvcomp.storage import storage_for
from lightning_nvcomp.telemetry.stats import ratio

#: The rank in the name DCP gives a data file (``__<rank>_<n>.distcp``, ``__<rank>_<n>.<id>.distcp``).
_RANK = re.compile(r"^__(\d+)_")
#: At most these raw bytes of items are decoded at once (the reader makes every target of a request first).
BATCH_NBYTES = 256 << 20


@dataclass(frozen=True)
class Item:
    """One item of a DCP checkpoint (a tensor's chunk, or a pickled value) and how it is stored.

    Attributes:
        index: its key in the checkpoint's metadata.
        name: its name, with the part of the tensor it holds when the tensor is split into chunks.
        dtype: the tensor's dtype; None for a pickled value (a byte item).
        shape: the chunk's shape (``()`` for a pickled value).
        file: the data file it is stored in, relative to the checkpoint directory.
        codec: ``ans``, ``zstd`` or ``none``; ``torch`` where ``torch.save`` stored it (plain DCP, byte items).
    """

    index: MetadataIndex
    name: str
    dtype: torch.dtype | None
    shape: tuple[int, ...]
    file: str
    codec: str
    raw_nbytes: int
    stored_nbytes: int

    @property
    def rank(self) -> int | None:
        """The rank that wrote it, from its data file's name (None where the name does not say)."""
        found = _RANK.match(self.file)
        return int(found.group(1)) if found else None

    @property
    def ratio(self) -> float:
        return ratio(self.raw_nbytes, self.stored_nbytes)


@dataclass(frozen=True)
class DcpSurvey:
    """What the ``.metadata`` of the DCP checkpoint at ``path`` says about its items."""

    path: str
    reader: NvcompFileSystemReader
    metadata: Metadata
    items: list[Item]

    def files(self, only: str | None = None) -> dict[str, list[Item]]:
        """The items of each data file (of the data file ``only``), by file name.

        Raises:
            CheckpointError: the ``.metadata`` names no data file ``only`` (not damage: the file belongs to no
                checkpoint there, and cannot be read without one).
        """
        found: dict[str, list[Item]] = {}
        for item in sorted(self.items, key=lambda i: i.file):
            found.setdefault(item.file, []).append(item)
        if only is None:
            return found
        if only not in found:
            raise CheckpointError(
                f"{only} is not one of the data files the {METADATA} of the DCP checkpoint {self.path} names "
                f"({', '.join(found) or 'none'}): it belongs to no checkpoint there (left by an interrupted save?) and "
                f"cannot be read without one; nothing shows it is damaged. Give the checkpoint instead: {self.path}"
            )
        return {only: found[only]}


def survey(path: str) -> DcpSurvey:
    """Read the ``.metadata`` of the DCP checkpoint at ``path`` (CRC checked, as every load does) and each item's
    storage record (checked as the reader checks it before opening a file); decode nothing."""
    reader = NvcompFileSystemReader(path)
    metadata = reader.read_metadata()
    items = []
    for index, info in metadata.storage_data.items():
        where = f"item {index.fqn!r}"
        if not isinstance(info, StorageInfo):
            raise CorruptCheckpointError(f"{path}: {where} has no valid storage record; the {METADATA} is damaged")
        check_storage_info(info, where)
        md = metadata.state_dict_metadata.get(index.fqn)
        if isinstance(md, TensorStorageMetadata):
            chunk = next((c for c in md.chunks if tuple(c.offsets) == tuple(index.offset or ())), None)
            if chunk is None:
                raise CorruptCheckpointError(f"{path}: {where} is not a chunk its {METADATA} records: damaged")
            shape, dtype = tuple(chunk.sizes), md.properties.dtype
            raw = math.prod(shape) * dtype.itemsize
            name = index.fqn
            if len(md.chunks) > 1:
                name += f"[{', '.join(f'{o}:{o + n}' for o, n in zip(chunk.offsets, chunk.sizes))}]"
        elif isinstance(md, BytesStorageMetadata):
            shape, dtype, raw, name = (), None, info.length, index.fqn
        else:
            raise CorruptCheckpointError(f"{path}: {where} has no state dict record; the {METADATA} is damaged")
        codec = getattr(info, "codec", None) or "torch"
        items.append(Item(index, name, dtype, shape, info.relative_path, codec, raw, info.length))
    return DcpSurvey(path, reader, metadata, items)


@dataclass(frozen=True)
class FileCheck:
    """What :func:`verify` found in one data file: its exit status (0 intact) and the error's message, and the byte
    items not loaded (intact: their zip CRCs are checked; they hold objects ``weights_only`` loads refuse)."""

    file: str
    items: list[Item]
    status: int
    message: str = ""
    not_loaded: list[str] = field(default_factory=list)


def verify(surveyed: DcpSurvey, quiet: bool, only: str | None = None) -> list[FileCheck]:
    """Read, decode and check every item of the surveyed checkpoint (of its data file ``only``, if given), a data
    file at a time, with a progress bar on stderr over the raw bytes. A data file that fails does not stop the
    others."""
    files = surveyed.files(only)
    total = sum(item.raw_nbytes for items in files.values() for item in items)
    storage = storage_for(surveyed.path)
    checks = []
    disable = True if quiet or not total else None  # None: tqdm disables itself when stderr is not a TTY
    with tqdm(total=total, unit="B", unit_scale=True, desc="decoding", leave=False, disable=disable) as bar:
        for name, items in files.items():
            checker = _Checker(items, bar.update)
            try:
                for batch in _batches(items):
                    _load(surveyed, batch, checker)
            except Exception as err:
                explained = explain(err, storage.join(surveyed.path, name))
                if explained is None:
                    raise
                status, message = explained
                if not message.startswith(surveyed.path):  # the reader names the data file within the checkpoint
                    message = f"{surveyed.path}: {message}"
                checks.append(FileCheck(name, items, status, message))
                continue
            checks.append(FileCheck(name, items, EXIT_OK, not_loaded=checker.not_loaded))
    return checks


def _batches(items: list[Item]) -> Iterator[list[Item]]:
    """``items`` in runs of at most :data:`BATCH_NBYTES` raw bytes (an item larger than that alone)."""
    batch: list[Item] = []
    nbytes = 0
    for item in items:
        if batch and nbytes + item.raw_nbytes > BATCH_NBYTES:
            yield batch
            batch, nbytes = [], 0
        batch.append(item)
        nbytes += item.raw_nbytes
    if batch:
        yield batch


def _read_item(item: Item) -> ReadItem:
    """The request for the whole of ``item`` (as DCP's planners make it)."""
    if item.dtype is None:
        nothing = torch.Size([0])
        return ReadItem(LoadItemType.BYTE_IO, item.index, nothing, item.index, nothing, nothing)
    zeros = torch.Size([0] * len(item.shape))
    return ReadItem(LoadItemType.TENSOR, item.index, zeros, item.index, zeros, torch.Size(item.shape))


def _load(surveyed: DcpSurvey, items: list[Item], checker: _Checker) -> None:
    """Load ``items`` through the surveyed checkpoint's reader, its methods called as ``dcp.load`` calls them."""
    reader = surveyed.reader
    reader.set_up_storage_reader(surveyed.metadata, True)
    plan = reader.prepare_local_plan(LoadPlan([_read_item(item) for item in items]))
    (plan,) = reader.prepare_global_plan([plan])
    reader.read_data(plan, checker).wait()


class _Checker(LoadPlanner):
    """The planner the reader fills while :func:`verify` runs: each tensor item into a new tensor of its chunk's
    dtype and shape (dropped once filled), each byte item loaded as ``torch.load(weights_only=True)`` loads it."""

    def __init__(self, items: list[Item], progress: Callable[[int], object]) -> None:
        self._items = {item.index: item for item in items}
        self._progress = progress
        self.not_loaded: list[str] = []

    def set_up_planner(self, *args: object, **kwargs: object) -> None:
        pass

    def create_local_plan(self) -> LoadPlan:
        return LoadPlan([_read_item(item) for item in self._items.values()])

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        item = self._items[read_item.storage_index]
        try:
            fileformat.read(value, f"{item.file}: item {item.name!r}", map_location="cpu")
        except RefusedObjectsError:  # intact (the reader checked its zip CRCs), but not plain values
            self.not_loaded.append(item.name)
        self._progress(item.raw_nbytes)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        item = self._items[read_item.storage_index]
        return torch.empty(item.shape, dtype=item.dtype)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self._progress(self._items[read_item.storage_index].raw_nbytes)
