"""Tensors stored one archive each, as every item of a DCP checkpoint is: each tensor's bytes are a record of their
own, coded in batches with tensors of its kind (:func:`code_tensors`: one layout, one engine call and one wait per
batch instead of per tensor), and written as a complete ``torch.save`` zip whose pickle is one ``decode_tensor``
call (:func:`write_tensor`), which any ``torch.load`` reads once ``lightning_nvcomp`` is imported."""

from __future__ import annotations

import functools
import io
import pickle
import struct
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from lightning_nvcomp.codec import batch as batch_coding
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.cpu import cpu_threads
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.decode import Placement, _keep_on_gpu, decode_tensor, decode_tensors, tensor_check
from lightning_nvcomp.format.load_state import LoadState, _load
from lightning_nvcomp.format.reader import read
from lightning_nvcomp.format.writer import _LayoutCache, _StorageKey, _StoredBlob
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.resources import shared

#: Raw bytes coded per batch, by the tensors' device type (and so the scratch and pinned host memory one batch
#: borrows: on a GPU about 3.5x this at the peak, with the previous batch's copy in flight). On a GPU what a batch
#: costs is its calls, not its bytes: 128 MiB staged a 3 GB state in 0.15-0.18 s against 0.19-0.25 s at 64 MiB
#: (benchmarks/results/round8), with 0.48 GB of extra GPU memory.
BATCH_NBYTES = {"cpu": 64 << 20, "cuda": 128 << 20}
#: Tensors smaller than this are stored raw (checksummed, not coded): a codec call per byte plane costs them more
#: time than the few bytes it could save (LayerNorm and bias vectors, optimizer steps).
RAW_NBYTES = 4 << 10
#: Most CPU batches coded at once (each holds its planes and packed bytes, about twice :data:`BATCH_NBYTES`,
#: meanwhile); one per four cores (a batch's zstd runs on all of them): on a machine of fewer than eight cores,
#: batches are coded one after another (on two cores, coding them ahead competed with the writer thread and the
#: zstd threads and made the save slower).
BATCHES_AHEAD = 4


@dataclass
class CodedTensor:
    """One tensor coded as a record of its own: what :func:`write_tensor` writes. ``name`` is the tensor's
    name in messages (a DCP item's fully qualified name)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    coding: records.Coding
    segments: list[records.Segment]

    @property
    def raw_nbytes(self) -> int:
        return self.coding.nbytes


def storable(t: torch.Tensor) -> bool:
    """Whether :func:`code_tensors` stores ``t``: a dense tensor of a dtype the format names, on the CPU or a GPU."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type in ("cpu", "cuda")
        and t.dtype in DTYPES.values()
        and not t.is_conj()
        and not t.is_neg()
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _kind(name: str, t: torch.Tensor) -> tuple:
    """Tensors coded in one batch share a layout: same device and dtype, and the same last name part (``weight``,
    ``exp_avg_sq``...), whose values are alike; tiny ones (under :data:`RAW_NBYTES`) apart, stored raw."""
    return (t.device, t.dtype, name.rsplit(".", 1)[-1], t.numel() * t.element_size() < RAW_NBYTES)


def code_tensors(tensors: list[tuple[str, torch.Tensor]], codec: str) -> Iterator[list[tuple[int, CodedTensor]]]:
    """Code each ``(name, tensor)`` of ``tensors`` (each :func:`storable`) with ``codec`` (``ans``, ``zstd``;
    ``none`` stores raw, checksummed), yielding each batch as it is done, as ``(index, coded)`` pairs: tensors of
    one kind in batches of up to :data:`BATCH_NBYTES` for their device, a tensor larger than a segment alone (in several
    segments). The tensors are read when their batch is coded, not after. Batches of CPU tensors are coded on
    CPU threads, up to :data:`BATCHES_AHEAD` at a time, and yielded in order; GPU batches one after another (they
    queue on the GPU)."""
    coder = "raw" if codec == "none" else codec
    batches: dict[tuple, list[int]] = {}
    for index, (name, t) in enumerate(tensors):
        batches.setdefault(_kind(name, t), []).append(index)
    jobs = [
        (device, functools.partial(_code_batch, tensors, batch, "raw" if tiny else coder))
        for (device, _, _, tiny), indices in batches.items()
        for batch in _cut(indices, tensors, records.segment_nbytes(device, "raw" if tiny else coder), device)
    ]
    ahead = min(BATCHES_AHEAD, cpu_threads() // 4)
    pool = shared("items-pool", lambda: ThreadPoolExecutor(BATCHES_AHEAD, thread_name_prefix="lnv-items"))
    pending: deque[Future[list[tuple[int, CodedTensor]]]] = deque()
    for device, job in jobs:
        if device.type != "cpu" or ahead < 2:
            while pending:
                yield pending.popleft().result()
            yield job()
            continue
        if len(pending) >= ahead:
            yield pending.popleft().result()
        pending.append(pool.submit(job))
    while pending:
        yield pending.popleft().result()


def _code_batch(tensors: list[tuple[str, torch.Tensor]], batch: list[int], coder: str) -> list[tuple[int, CodedTensor]]:
    """Code the tensors ``batch`` indexes (one kind, see :func:`_cut`) together with ``coder``."""
    datas = [_bytes(tensors[i][1]) for i in batch]
    dtype, device = tensors[batch[0]][1].dtype, datas[0].device
    layouts = shared("layouts", _LayoutCache)
    key = (coder, dtype, "batch", tuple((d.device, d.data_ptr(), d.numel()) for d in datas))
    if datas[0].numel() > records.segment_nbytes(device, coder):  # alone in its batch
        encoder = records.Encoder(datas[0], dtype, coder, layout=layouts.get(key))
        coded = [(encoder.coding, list(encoder))]
    else:
        coded = batch_coding.encode_batch(datas, dtype, coder, layouts.get(key))
    if coded:
        layouts.put(key, coded[0][0].layout)
    return [
        (i, CodedTensor(tensors[i][0], tensors[i][1].dtype, tuple(tensors[i][1].shape), device.type, *c))
        for i, c in zip(batch, coded)
    ]


def _cut(
    indices: list[int], tensors: list[tuple[str, torch.Tensor]], segment: int, device: torch.device
) -> Iterator[list[int]]:
    """Consecutive runs of ``indices`` of at most :data:`BATCH_NBYTES` (for ``device``); a tensor larger than
    ``segment`` alone."""
    limit = BATCH_NBYTES.get(device.type, BATCH_NBYTES["cpu"])
    run: list[int] = []
    nbytes = 0
    for i in indices:
        t = tensors[i][1]
        size = t.numel() * t.element_size()
        if size > segment:
            yield [i]
            continue
        if run and nbytes + size > limit:
            yield run
            run, nbytes = [], 0
        run.append(i)
        nbytes += size
    if run:
        yield run


def write_tensor(writer: ArchiveWriter, coded: CodedTensor, serialization_id: str | None = None) -> None:
    """Write ``coded`` as a whole archive: torch.save's small records, its segments (``data/0``...), then a pickle
    that is one call of :func:`~lightning_nvcomp.format.decode.decode_tensor` rebuilding the contiguous tensor.
    ``serialization_id``: as for :meth:`~lightning_nvcomp.format.zip.ArchiveWriter.add_torch_metadata` (one per data
    file makes those records the same bytes for all its items)."""
    writer.add_torch_metadata(serialization_id)
    blobs = []
    for k, segment in enumerate(coded.segments):
        writer.add(f"data/{k}", memoryview(segment.blob.numpy()), segment.checksum())
        blobs.append(_StoredBlob(str(k), segment.blob.numel()))
    sizes = [n for segment in coded.segments for n in segment.sizes]
    meta = records.describe(
        coded.coding,
        sizes,
        [segment.crc for segment in coded.segments],
        storages=[[0, coded.raw_nbytes]],
        device=coded.device,
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
#: Its end: the arguments since the mark as a tuple, the call, the end of the pickle.
_CALL_END = b"tR."


def _pickled_call(blobs: list[_StoredBlob], args: tuple) -> bytes:
    """torch.save's pickle (protocol 2) of the call ``decode_tensor(blobs, *args)``, assembled from pickles of its
    arguments: the blobs through :class:`_ItemPickler` (their persistent ids), the others, plain values, through
    ``pickle.dumps``, whose C pickler runs no Python hook per object (a record holds about sixty). Each argument's
    pickle, its protocol header and stop opcode cut off, pushes that argument; the memo slots it sets are only read
    within it."""
    parts = [_CALL_START, _pickled_blobs(tuple((b.storage.key, b.storage.nbytes) for b in blobs))]
    parts.extend(pickle.dumps(arg, 2)[2:-1] for arg in args)
    parts.append(_CALL_END)
    return b"".join(parts)


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


def read_tensor(data: torch.Tensor, name: str, device: torch.device, state: LoadState) -> torch.Tensor:
    """Read one tensor item: ``data`` (1-D uint8 CPU) is a whole archive. An archive as :func:`write_tensor` writes it
    is parsed here (its offsets checked, its pickle's CRC-32 checked, its one ``decode_tensor`` call run, which
    checks the record, its segments and the placement): no ``torch.load`` and ``zipfile`` per item. Anything else,
    and every failure, goes through :func:`~lightning_nvcomp.format.reader.read`, which names what is wrong.
    CUDA ``device``: records saved from a GPU decode there. ``state``: the load's bound and records, shared by the
    items of one load."""
    load_token, gpu_token = _load.set(state), _keep_on_gpu.set(device.type == "cuda")
    try:
        tensor = _unpickle(data, decode_tensor)
    except CheckpointError as err:  # damage found by the decoder: name the item
        raise type(err)(err.args[0] if str(err).startswith(name) else f"{name}: {err}") from None
    except _MALFORMED:
        tensor = None
    finally:
        _keep_on_gpu.reset(gpu_token)
        _load.reset(load_token)
    if tensor is None:
        location = device if device.type == "cuda" else torch.device("cpu")
        tensor = read(io.BytesIO(memoryview(data.numpy())), name, map_location=location, state=state)
    if not isinstance(tensor, torch.Tensor):
        raise CorruptCheckpointError(f"{name}: holds a {type(tensor).__name__}, not a tensor")
    return tensor


def read_tensors(items: list[tuple[torch.Tensor, str]], device: torch.device, state: LoadState) -> list[torch.Tensor]:
    """Read many tensor items (each ``(archive bytes, name)``, as for :func:`read_tensor`) at once: their
    ``decode_tensor`` calls are made together (:func:`~lightning_nvcomp.format.decode.decode_tensors`: records of
    one layout decode in one engine call), returned on ``device``. Items of another shape, and a batch that fails,
    are read one by one, so that an error names the item."""
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
        decoded = decode_tensors([calls[i].args for i in ours], device, state)  # type: ignore[union-attr]
        tensors.update(zip(ours, decoded))
    except CheckpointError:
        pass  # read one by one below: the item at fault raises, named
    return [
        tensors[i] if i in tensors else read_tensor(data, name, device, state).to(device)
        for i, (data, name) in enumerate(items)
    ]
