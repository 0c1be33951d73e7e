"""The storage reader, :class:`NvcompFileSystemReader`: DCP's ``FileSystemReader`` that checks ``.metadata``'s CRC,
every item's storage info before opening its file and every decoded tensor against the metadata, and decodes
compressed items on the target shard's device."""

from __future__ import annotations

import io
import os
import zipfile
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from lightning_nvcomp import format as fileformat
from lightning_nvcomp._compat import dcp as _compat
from lightning_nvcomp._compat.dcp import StorageInfo
from lightning_nvcomp._process import PauseBetweenCalls, collector_paused
from lightning_nvcomp.codec.gpu import gpu_available, gpu_missing
from lightning_nvcomp.errors import CodecUnavailableError, CorruptCheckpointError
from lightning_nvcomp.format.items import read_tensors
from lightning_nvcomp.integrations.dcp.filesystem import OnStorage
from lightning_nvcomp.integrations.dcp.metadata import (
    DATA_FILE_HEADER_MAX,
    ITEM_CODECS,
    METADATA,
    NvcompStorageInfo,
    _load_metadata,
    check_storage_info,
    data_file_header,
    header_fields,
)
from lightning_nvcomp.integrations.dcp.read_windows import Filler, to_host, windows
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.storage.sized_reader import Window


class NvcompFileSystemReader(OnStorage, FileSystemReader):
    """DCP ``FileSystemReader`` for checkpoints of :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter` (and plain
    DCP ones).

    Compressed items are decoded on the target shard's device (nvCOMP on a GPU, CPU zstd otherwise) after their
    record fields, segment CRCs and pickle CRC are checked; ``.metadata`` is read under ``weights_only`` rules and its
    CRC checked (files of earlier versions, without one, still load); every item's storage info is validated before
    its file is opened (a file inside the checkpoint directory, an ``(offset, length)`` within it, a known codec),
    every data file's header against the checkpoint id its items record, and every decoded tensor's dtype and shape
    against the metadata; plain ``torch.save`` items have their zip CRCs checked; one decode bound covers the load,
    from the bytes its items occupy. Errors name the file and the item; damage raises
    :class:`~lightning_nvcomp.errors.CorruptCheckpointError`. DCP's default ``FileSystemReader`` reads these
    checkpoints too (on the CPU), see :mod:`lightning_nvcomp.integrations.dcp`.

    Args:
        path: the checkpoint directory: a local path or a URL (``s3://bucket/run/step-10``: data files read by
            parallel ranged requests; torch's ``FsspecReader`` reads such checkpoints too).
        remote: how a URL ``path`` is reached (:class:`~lightning_nvcomp.storage.remote.RemoteOptions`).
    """

    def __init__(
        self, path: str | os.PathLike, _extension_registry: Any = None, *, remote: RemoteOptions | None = None
    ) -> None:
        super().__init__(*_compat.reader_init_args(path, _extension_registry))
        self.remote = remote
        self._use_storage(path, remote)
        self._metadata: Metadata | None = None
        self._planning = PauseBetweenCalls(self)  # the collector, from set_up_storage_reader to read_data's end

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self._use_storage(checkpoint_id, self.remote)
        super().reset(checkpoint_id)
        self._metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = _compat.metadata_path(self, kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        with collector_paused():  # the metadata of thousands of items would set off full collections
            metadata = _load_metadata(data, str(path))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """DCP calls this before it plans the load: the garbage collector is paused from here to the end of
        :meth:`read_data` (see :class:`~lightning_nvcomp._process.PauseBetweenCalls`)."""
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata
        self._planning.begin()

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with self._planning.through():  # thousands of decoded items would set off full collections too
            self._read_plan(plan, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_plan(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        """Read the plan's items, file by file, each checked before it is placed."""
        per_file: dict[str, list[tuple[ReadItem, StorageInfo]]] = {}
        for req in plan.items:
            info = self.storage_data.get(req.storage_index)
            if not isinstance(info, StorageInfo):
                raise CorruptCheckpointError(
                    f"{METADATA}: item {req.storage_index.fqn!r} has no valid storage record "
                    f"({type(info).__name__}); the checkpoint metadata is damaged"
                )
            check_storage_info(info, f"item {req.storage_index.fqn!r}")
            per_file.setdefault(info.relative_path, []).append((req, info))
        # One decode bound for the whole load, as for one file (fileformat.LoadState: 16 x its bytes + 256 MiB), from
        # the bytes stored: items that point into the same bytes do not raise it.
        budget = fileformat.LoadState(str(self.path), file_nbytes=_stored_nbytes(per_file))
        for relative_path, reqs in per_file.items():
            self._read_file(relative_path, reqs, planner, budget)

    def _read_file(
        self,
        relative_path: str,
        reqs: list[tuple[ReadItem, StorageInfo]],
        planner: LoadPlanner,
        budget: fileformat.LoadState,
    ) -> None:
        """Read the items ``reqs`` asks of one data file: plain DCP items one by one, ours in windows, decoded in
        batches per target device."""
        path = self.fs.concat_path(self.path, relative_path)
        budget.holder = str(path)  # a delta item names its base from its data file's directory
        with self.fs.create_stream(path, "rb") as stream:
            _check_data_file(stream, relative_path, reqs)
            size = _stream_size(stream)
            coded: list[tuple[ReadItem, NvcompStorageInfo]] = []
            targets: dict[int, torch.Tensor] = {}  # id(req) -> where it goes
            for req, info in reqs:
                where = f"{relative_path}: item {req.storage_index.fqn!r}"
                if info.offset + info.length > size:
                    raise CorruptCheckpointError(
                        f"{where} lies at bytes {info.offset}..{info.offset + info.length} but the file has "
                        f"{size} bytes: the data file is truncated or the metadata is damaged"
                    )
                if isinstance(info, NvcompStorageInfo) and info.codec is not None:
                    _check_codec(info, where)
                    coded.append((req, info))
                    targets[id(req)] = planner.resolve_tensor(req).detach()
                else:
                    self._read_one(stream, req, info, planner, where, budget)
            devices = {t.device for t in targets.values()}
            with Filler(planner) as filler:
                for window, data in windows(stream, coded, devices):
                    wheres = [f"{relative_path}: item {req.storage_index.fqn!r}" for req, _ in window]
                    base = window[0][1].offset
                    parts = [
                        (data[i.offset - base : i.offset - base + i.length], w) for (_, i), w in zip(window, wheres)
                    ]
                    for device in devices:  # one batch per target device
                        mine = [k for k, (req, _) in enumerate(window) if targets[id(req)].device == device]
                        decoded = (
                            read_tensors([parts[k] for k in mine], device, budget, as_decoded=True) if mine else []
                        )
                        tensors, copied = to_host(decoded) if device.type == "cpu" else (decoded, [])
                        fills = []
                        for k, tensor in zip(mine, tensors):
                            _check_raw_nbytes(tensor, window[k][1], wheres[k])
                            req = window[k][0]
                            fills.append(
                                (req, targets[id(req)], self._placed(req, tensor, targets[id(req)], wheres[k]))
                            )
                        if device.type == "cpu":
                            filler.add(fills, copied, decoded)
                        else:
                            for req, target, part in fills:
                                target.copy_(part)
                                planner.commit_tensor(req, target)

    def _read_one(
        self,
        stream: Any,
        req: ReadItem,
        info: StorageInfo,
        planner: LoadPlanner,
        where: str,
        budget: fileformat.LoadState,
    ) -> None:
        """Read an item stored by plain DCP (a byte item, or a tensor as ``torch.save`` wrote it)."""
        view = Window(stream, info.offset, info.length, where)
        descriptors = _compat.transform_descriptors(info)
        source: Any = view
        if descriptors:
            source = io.BytesIO(_compat.load_transformed(self, req, descriptors, view).read(-1))
        if req.type == LoadItemType.BYTE_IO:
            data = source.read(-1) if descriptors else _read_exactly(view, info.length, where)
            if data[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(data)):  # else a custom planner's bytes
                fileformat.check_zip(io.BytesIO(data), where)
            _check_torch_zip(data, where)  # the planner's torch.load would fail it with a bare RuntimeError
            planner.load_bytes(req, io.BytesIO(data))
            return
        # As DCP's reader, torch.load reads the item from the file itself (one copy); every CRC-32 is checked, the
        # tensor's over the bytes loaded (format.read). The caller has checked that the file holds the whole item.
        tensor = fileformat.read(source, where, map_location="cpu", context=fileformat.new_load(state=budget))
        if not isinstance(tensor, torch.Tensor):
            raise CorruptCheckpointError(f"{where}: holds a {type(tensor).__name__}, not a tensor")
        self._commit(req, tensor, planner.resolve_tensor(req).detach(), planner, where)

    def _commit(
        self, req: ReadItem, tensor: torch.Tensor, target: torch.Tensor, planner: LoadPlanner, where: str
    ) -> None:
        """Copy the part of the stored chunk ``req`` asks for into ``target`` (see :meth:`_placed`)."""
        target.copy_(self._placed(req, tensor, target, where))
        planner.commit_tensor(req, target)

    def _placed(self, req: ReadItem, tensor: torch.Tensor, target: torch.Tensor, where: str) -> torch.Tensor:
        """The part of the stored chunk ``tensor`` that ``req`` asks for, the chunk checked against the metadata and
        the part against ``target``."""
        self._check_tensor(req, tensor, where)
        tensor = _compat.narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        if target.size() != tensor.size():
            raise CorruptCheckpointError(
                f"{where} has shape {tuple(tensor.shape)} where the plan expects {tuple(target.shape)}"
            )
        return tensor

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


def _stored_nbytes(per_file: dict[str, list[tuple[ReadItem, StorageInfo]]]) -> int:
    """The bytes the items occupy in their data files, each byte counted once however many items point at it."""
    total = 0
    for reqs in per_file.values():
        end = 0
        for start, stop in sorted((i.offset, i.offset + i.length) for _, i in reqs):
            total += max(0, stop - max(start, end))
            end = max(end, stop)
    return total


def _check_data_file(stream: Any, relative_path: str, reqs: list[tuple[ReadItem, StorageInfo]]) -> None:
    """The data file is the one the checkpoint metadata names for these items: it starts with the header of the
    checkpoint id they record and of its own name (items written before checkpoint ids existed record none: their
    file is not checked)."""
    ids = {getattr(info, "checkpoint_id", None) for _, info in reqs}
    if ids == {None}:
        return
    where = f"{relative_path}: item {reqs[0][0].storage_index.fqn!r}"
    if len(ids) > 1:
        raise CorruptCheckpointError(
            f"{where}: the items of this data file record different checkpoint ids "
            f"({', '.join(sorted(map(str, ids)))}); the checkpoint metadata is damaged"
        )
    expected = str(ids.pop())
    header = data_file_header(expected, relative_path)
    stream.seek(0)
    first = stream.read(max(len(header), DATA_FILE_HEADER_MAX))
    if first.startswith(header):
        return
    found = header_fields(first)
    if found is None:
        raise CorruptCheckpointError(
            f"{where}: the checkpoint metadata records checkpoint id {expected}, but this data file carries none: it "
            "is not the file this checkpoint's save wrote (replaced or damaged); the checkpoint cannot be loaded "
            "safely"
        )
    found_id, found_name = found
    raise CorruptCheckpointError(
        f"{where}: this data file was written by the save of checkpoint {found_id} as {found_name!r}, but the "
        f"checkpoint metadata is of checkpoint {expected}: another save's file (another step's, or another rank's) "
        "replaced it; the checkpoint cannot be loaded safely"
    )


def _find_chunk(md: TensorStorageMetadata, index: Any) -> Any:
    chunks = md.chunks
    hint = index.index
    if type(hint) is int and 0 <= hint < len(chunks) and chunks[hint].offsets == index.offset:
        return chunks[hint]
    return next((c for c in chunks if c.offsets == index.offset), None)


def _check_torch_zip(data: bytes, where: str) -> None:
    """Open a ``torch.save`` zip with torch's own reader (miniz), which refuses some damage ``zipfile`` ignores (the
    end record's disk numbers, say): a damaged byte item fails here as damage, naming it."""
    if data[:4] != b"PK\x03\x04":
        return
    reader = _compat.torch_zip_reader()
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


def _read_exactly(view: io.RawIOBase, length: int, where: str) -> bytes:
    data = view.read(length)
    if len(data) != length:
        raise CorruptCheckpointError(f"{where}: the file ends {length - len(data)} bytes early")
    return data


def _check_codec(info: NvcompStorageInfo, where: str) -> None:
    """The item's codec is one this version knows, and can run here."""
    if info.codec not in ITEM_CODECS:
        raise CorruptCheckpointError(f"{where}: unknown codec {info.codec!r} in the checkpoint metadata")
    if info.codec == "ans" and not gpu_available():
        raise CodecUnavailableError(
            f"{where} was compressed with gANS, which needs a CUDA GPU and nvCOMP to decode (no CPU decoder); on this "
            f"machine {gpu_missing()}. Load it on a GPU machine, or save with codec='zstd' to load anywhere"
        )


def _check_raw_nbytes(tensor: torch.Tensor, info: NvcompStorageInfo, where: str) -> None:
    if info.raw_nbytes is not None and tensor.numel() * tensor.element_size() != info.raw_nbytes:
        raise CorruptCheckpointError(
            f"{where} decodes to {tensor.numel() * tensor.element_size()} bytes where the checkpoint metadata records "
            f"{info.raw_nbytes}: the item is damaged"
        )
