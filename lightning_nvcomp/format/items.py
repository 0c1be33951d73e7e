"""Tensors stored one archive each, as every item of a DCP checkpoint is: a tensor coded as a record of its own
(:mod:`.item_batches`) is written as a complete ``torch.save`` zip whose pickle is one ``decode_tensor`` call
(:func:`write_tensor`), which any ``torch.load`` reads once ``lightning_nvcomp`` is imported, and read back
(:func:`read_tensor`, :func:`read_tensors`)."""

from __future__ import annotations

import functools
import io
import pickle
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from lightning_nvcomp.codec import record as records
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format.decode import Placement, decode_tensor, decode_tensors, tensor_check
from lightning_nvcomp.format.item_batches import CodedTensor
from lightning_nvcomp.format.load_context import LoadContext, loading, new_load
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.format.reader import read
from lightning_nvcomp.format.writer import _StorageKey, _StoredBlob
from lightning_nvcomp.format.zip import ArchiveWriter


def write_tensor(writer: ArchiveWriter, coded: CodedTensor, serialization_id: str | None = None) -> None:
    """Write ``coded`` as a whole archive: torch.save's small records, its segments (``data/0``...), then a pickle
    that is one call of :func:`~lightning_nvcomp.format.decode.decode_tensor` rebuilding the contiguous tensor.
    ``serialization_id``: as for :meth:`~lightning_nvcomp.format.zip.ArchiveWriter.add_torch_metadata` (one per data
    file makes those records the same bytes for all its items)."""
    writer.add_torch_metadata(serialization_id)
    blobs, sizes, crcs = [], [], []
    for k, segment in enumerate(coded.segments):  # each written as it comes (a streamed tensor's as it is coded)
        writer.add(f"data/{k}", memoryview(segment.blob.numpy()), segment.checksum())
        blobs.append(_StoredBlob(str(k), segment.blob.numel()))
        sizes.extend(segment.sizes)
        crcs.append(segment.crc)
    meta = records.describe(
        coded.coding, sizes, crcs, storages=[[0, coded.raw_nbytes]], device=coded.device, **coded.fields
    )
    placement = Placement(0, 0, coded.shape, _contiguous_stride(coded.shape), False, False, coded.name)
    writer.add("data.pkl", _pickled_call(blobs, (meta, *placement, tensor_check(meta, *placement))))
    writer.finish("data.pkl")


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return tuple(reversed(stride))


#: The start of the pickle of a ``decode_tensor(...)`` call (protocol 2, as torch.save): the function, then a mark.
_CALL_START = b"\x80\x02clightning_nvcomp\ndecode_tensor\n("


def _pickled_call(blobs: list[_StoredBlob], args: tuple) -> bytes:
    """torch.save's pickle (protocol 2) of the call ``decode_tensor(blobs, *args)``, assembled from two pickles: the
    blobs' through :class:`_ItemPickler` (their persistent ids), and the other arguments', plain values, through
    ``pickle.dumps``, whose C pickler runs no Python hook per object (a record holds about sixty). ``args`` (nine:
    the record, the placement, the check) is a tuple of more than three items, so it pickles as a mark, the items, a
    tuple opcode and its memo slot: that pickle, its protocol header, mark and stop opcode cut off, pushes the
    arguments after the blobs and closes the call's argument tuple, which the call opcode then applies the function
    to. The memo slots each pickle sets are only read within it."""
    pickled = pickle.dumps(args, 2)
    blob_ids = _pickled_blobs(tuple((b.storage.key, b.storage.nbytes) for b in blobs))
    return b"".join((_CALL_START, blob_ids, pickled[3:-1], b"R."))


@functools.lru_cache(maxsize=4096)
def _pickled_blobs(blobs: tuple[tuple[str, int], ...]) -> bytes:
    """The pickle of a list of :class:`_StoredBlob` (each ``(key, nbytes)``), header and stop cut off: the same for
    every item whose segments have the sizes of another's (tiny tensors stored raw all do)."""
    buffer = io.BytesIO()
    _ItemPickler(buffer).dump([_StoredBlob(key, nbytes) for key, nbytes in blobs])
    return buffer.getvalue()[2:-1]


class _ItemPickler(pickle.Pickler):
    """torch.save's pickling of an item's blobs: persistent ids of ``data/<key>`` entries, as torch.save stores
    storages."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=2)

    def persistent_id(self, obj: object) -> tuple | None:
        if type(obj) is _StorageKey:
            return ("storage", torch.ByteStorage, obj.key, "cpu", obj.nbytes)
        return None


class _NotOurs(Exception):
    """The bytes are not an archive as :func:`write_tensor` writes one: read them the general way."""


def _entries(data: memoryview) -> dict[str, tuple[int, int, int]]:
    """The entries of an archive as :class:`ArchiveWriter` writes it (zip64, stored, no comment): name -> (start,
    size, CRC-32), every offset checked against the archive's size. Raises :class:`_NotOurs` for anything else."""
    n = len(data)
    if n < 98 or bytes(data[n - 22 : n - 18]) != b"PK\x05\x06" or bytes(data[n - 42 : n - 38]) != b"PK\x06\x07":
        raise _NotOurs
    (end64,) = struct.unpack_from("<Q", data, n - 34)
    if end64 > n - 98 or bytes(data[end64 : end64 + 4]) != b"PK\x06\x06":
        raise _NotOurs
    count, _, cd_size, cd_start = struct.unpack_from("<QQQQ", data, end64 + 24)
    if cd_start + cd_size > end64 or count > 1 << 20:
        raise _NotOurs
    entries: dict[str, tuple[int, int, int]] = {}
    pos = cd_start
    for _ in range(count):
        if pos + 46 > cd_start + cd_size or bytes(data[pos : pos + 4]) != b"PK\x01\x02":
            raise _NotOurs
        (crc,) = struct.unpack_from("<I", data, pos + 16)
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, pos + 28)
        name = bytes(data[pos + 46 : pos + 46 + name_len])
        extra = pos + 46 + name_len
        if extra_len != 28 or comment_len or struct.unpack_from("<HH", data, extra) != (1, 24):
            raise _NotOurs
        size, _, header = struct.unpack_from("<QQQ", data, extra + 4)
        if header + 30 > cd_start or bytes(data[header : header + 4]) != b"PK\x03\x04":
            raise _NotOurs
        local_name, local_extra = struct.unpack_from("<HH", data, header + 26)
        start = header + 30 + local_name + local_extra
        if bytes(data[header + 30 : header + 30 + local_name]) != name or start + size > cd_start:
            raise _NotOurs
        entries[name.decode("utf-8", "replace")] = (start, size, crc)
        pos = extra + extra_len
    return entries


class _Blob:
    """A storage entry of the archive, as the pickle's persistent id names it."""

    __slots__ = ("data",)

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data


def _rebuild_blob(storage: object, offset: object, size: object, stride: object, *rest: object) -> torch.Tensor:
    """What ``torch._utils._rebuild_tensor_v2`` does for a blob: the whole entry as a 1-D uint8 tensor (a view of the
    file's bytes)."""
    if not isinstance(storage, _Blob) or offset != 0 or size != (storage.data.numel(),) or stride != (1,):
        raise _NotOurs
    return storage.data


class _ItemUnpickler(pickle.Unpickler):
    """Unpickles a tensor item's ``data.pkl``: one :func:`decode_tensor` call and the blobs it takes; any other
    global is not ours (the general reader handles it, and ``weights_only`` rules there)."""

    _GLOBALS: dict[tuple[str, str], object] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_blob,
        ("collections", "OrderedDict"): OrderedDict,
        ("torch", "ByteStorage"): _Blob,
    }

    def __init__(
        self, pickled: bytes, blob: Callable[[str, int], torch.Tensor], decoder: Callable[..., Any] = decode_tensor
    ) -> None:
        super().__init__(io.BytesIO(pickled))
        self._blob, self._decoder = blob, decoder

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("lightning_nvcomp", "decode_tensor"):
            return self._decoder
        found = self._GLOBALS.get((module, name))
        if found is None:
            raise _NotOurs
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] is _Blob):
            raise _NotOurs
        _, _, key, location, nbytes = pid
        if location != "cpu" or not isinstance(key, str) or not isinstance(nbytes, int):
            raise _NotOurs
        return _Blob(self._blob(key, nbytes))


def _unpickle(data: torch.Tensor, decoder: Callable[..., Any]) -> Any:
    """Unpickle an archive as :func:`write_tensor` writes it, its ``decode_tensor`` call made to ``decoder``: its
    offsets and its pickle's CRC-32 checked, its blobs views of ``data``. Raises :class:`_NotOurs` (or what a
    malformed pickle raises) for anything else."""
    view = memoryview(data.numpy())
    entries = _entries(view)
    pickles = [k for k in entries if k.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise _NotOurs
    start, size, crc = entries[pickles[0]]
    pickled = bytes(view[start : start + size])
    if zlib.crc32(pickled) != crc:
        raise _NotOurs
    prefix = pickles[0][: -len("data.pkl")]

    def blob(key: str, nbytes: int) -> torch.Tensor:
        found = entries.get(f"{prefix}data/{key}")
        if found is None or found[1] != nbytes:
            raise _NotOurs
        return data[found[0] : found[0] + nbytes]

    return _ItemUnpickler(pickled, blob, decoder).load()


#: What a malformed archive or pickle raises while :func:`_unpickle` reads it.
_MALFORMED = (_NotOurs, pickle.UnpicklingError, struct.error, EOFError, ValueError, TypeError, IndexError)


class _Call:
    """A ``decode_tensor`` call read from an item's pickle, made later with the others of its window."""

    __slots__ = ("args",)

    def __init__(self, *args: object) -> None:
        self.args = args


def _item_load(device: torch.device, state: LoadState) -> LoadContext:
    """The context of the items of one load read onto ``device``: ``state`` shared by them all, records saved from a
    GPU decoded there for a CUDA ``device``."""
    return new_load(state=state, keep_on_gpu=device.type == "cuda")


def read_tensor(data: torch.Tensor, name: str, device: torch.device, state: LoadState) -> torch.Tensor:
    """Read one tensor item: ``data`` (1-D uint8 CPU) is a whole archive. An archive as :func:`write_tensor` writes it
    is parsed here (its offsets checked, its pickle's CRC-32 checked, its one ``decode_tensor`` call run, which
    checks the record, its segments and the placement): no ``torch.load`` and ``zipfile`` per item. Anything else,
    and every failure, goes through :func:`~lightning_nvcomp.format.reader.read`, which names what is wrong.
    CUDA ``device``: records saved from a GPU decode there. ``state``: the load's bound and records, shared by the
    items of one load."""
    context = _item_load(device, state)
    try:
        with loading(context):
            tensor = _unpickle(data, decode_tensor)
    except CheckpointError as err:  # damage found by the decoder: name the item
        raise type(err)(err.args[0] if str(err).startswith(name) else f"{name}: {err}") from None
    except _MALFORMED:
        tensor = None
    if tensor is None:
        location = device if device.type == "cuda" else torch.device("cpu")
        tensor = read(io.BytesIO(memoryview(data.numpy())), name, map_location=location, context=context)
    if not isinstance(tensor, torch.Tensor):
        raise CorruptCheckpointError(f"{name}: holds a {type(tensor).__name__}, not a tensor")
    return tensor


def read_tensors(
    items: list[tuple[torch.Tensor, str]], device: torch.device, state: LoadState, as_decoded: bool = False
) -> list[torch.Tensor]:
    """Read many tensor items (each ``(archive bytes, name)``, as for :func:`read_tensor`) at once: their
    ``decode_tensor`` calls are made together (:func:`~lightning_nvcomp.format.decode.decode_tensors`: records of
    one layout decode in one engine call), returned on ``device`` (with ``as_decoded``: those bound for the CPU that
    a GPU decoded, on that GPU). Items of another shape, and a batch that fails, are read one by one, so that an
    error names the item."""
    calls: list[_Call | None] = []
    for data, _ in items:
        try:
            found = _unpickle(data, _Call)
        except _MALFORMED:
            found = None
        calls.append(found if isinstance(found, _Call) else None)
    ours = [i for i, call in enumerate(calls) if call is not None]
    tensors: dict[int, torch.Tensor] = {}
    try:
        args = [calls[i].args for i in ours]  # type: ignore[union-attr]
        decoded = decode_tensors(args, device, _item_load(device, state), as_decoded)
        tensors.update(zip(ours, decoded))
    except CheckpointError:
        pass  # read one by one below: the item at fault raises, named
    return [
        tensors[i] if i in tensors else read_tensor(data, name, device, state).to(device)
        for i, (data, name) in enumerate(items)
    ]
