"""The checkpoint file: a valid ``torch.save`` zip in which tensors are stored as compressed records.

Each tensor in the saved object is pickled as a call ``decode_tensor(blobs, record, index, offset, size, stride,
requires_grad, parameter, name)``: ``blobs`` are ordinary uint8 tensors holding the compressed record (one per
segment), ``record`` the dict that
describes it (see :mod:`lightning_nvcomp.codec.record`, plus ``storages``: the ``[offset, nbytes]`` of each tensor
storage packed into the record). Small storages of one dtype and device share a record; views of one storage
share it like in ``torch.save``. So any ``torch.load`` - Lightning's, the user's, with ``weights_only=True`` once
:mod:`lightning_nvcomp` is imported, with ``map_location`` or ``mmap=True`` - returns the real tensors.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import io
import math
import os
import pickle
import threading
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Callable, NamedTuple

import torch

from lightning_nvcomp.archive import ArchiveWriter
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.checksum import Crc32
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.policy import CodecPolicy, Prediction
from lightning_nvcomp.storage import Storage, target_directory

#: Codec names :func:`save` accepts.
SAVE_CODECS = ("auto", "ans", "zstd", "none")
#: Storages below this size share records of up to _GROUP_NBYTES: few large records keep nvCOMP calls few.
_SMALL_NBYTES = 64 << 20
_GROUP_NBYTES = 256 << 20
_ALIGN = 64
_MAX_DIMS = 64


_DTYPE_NAMES = (
    "float64 float32 float16 bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu "
    "complex32 complex64 complex128 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool"
).split()
#: The dtypes this format stores, by name (those the installed torch knows).
DTYPES = {name: getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)}


class TensorInfo(NamedTuple):
    """What :func:`describe` returns in place of each compressed tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    record: dict
    stored_nbytes: int


#: While set, decode_tensor hands each tensor's description to this callable instead of decoding.
_describe: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar("describe", default=None)
#: While set, records saved from a GPU decode onto the current GPU (when there is one), whatever the blobs' device.
_keep_on_gpu: contextvars.ContextVar[bool] = contextvars.ContextVar("keep_on_gpu", default=False)
#: While set, called with the raw size of every record decoded (progress bars).
_progress: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("progress", default=None)
#: Key under which a record dict keeps its decoded storages while one load runs (torch.load's pickle memo hands
#: every tensor of a record the same dict, and drops it when the load ends). An object, so no pickle can forge it.
_STORAGES = object()


def _fail(name: object, message: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"tensor {name!r}: {message}")


def _int_tuple(value: object, name: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS:
        raise _fail(name, f"{what} {value!r} is not a short list of integers")
    if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 48 for v in value):
        raise _fail(name, f"{what} {value!r} holds a negative, huge or non-integer entry")
    if math.prod(value) >= 1 << 48:
        raise _fail(name, f"{what} {value!r} describes an absurd number of elements")
    return tuple(value)


def _decoded_storages(blobs: list[torch.Tensor], rec: dict, name: str) -> list[torch.Tensor]:
    """The record's storages as uint8 tensors on the blobs' device (``map_location``), each in its own memory."""
    cached = rec.get(_STORAGES)
    if cached is not None:
        return cached
    storages = rec.get("storages")
    nbytes = rec.get("nbytes")
    if not isinstance(storages, list) or any(
        not isinstance(s, list) or len(s) != 2 or any(not isinstance(v, int) or v < 0 for v in s) for s in storages
    ):
        raise _fail(name, "record storage table is malformed")
    if isinstance(nbytes, int) and any(off + n > nbytes for off, n in storages):
        raise _fail(name, f"a storage lies outside the record's {nbytes} bytes")
    target = blobs[0].device if blobs else torch.device("cpu")
    if _keep_on_gpu.get() and rec.get("device") == "cuda" and target.type == "cpu" and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    try:
        data = records.decode(blobs, rec, target, move=False)
    except CheckpointError as err:
        raise type(err)(f"tensor {name!r}: {err}") from None
    pieces = [data[start : start + n] for start, n in storages]
    if data.device != target:  # decoded on a GPU for a CPU load: one copy, straight into each storage's memory
        pieces = [piece.to(target) for piece in pieces]
    elif len(pieces) > 1:
        # Storages packed together get their own memory: a tensor kept after the load (an optimizer keeps its
        # state tensors) must not hold the whole record alive, nor be saved again with it.
        pieces = [piece.clone() for piece in pieces]
    rec[_STORAGES] = pieces
    report = _progress.get()
    if report is not None:
        report(rec["nbytes"])
    return pieces


def decode_tensor(
    blobs: list[torch.Tensor],
    rec: dict,
    index: int,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    parameter: bool,
    name: str,
) -> torch.Tensor:
    """Rebuild one tensor from a compressed record (called by ``torch.load``; import lightning_nvcomp first).

    Every argument is validated: this function is reachable from any pickle.
    """
    if not isinstance(name, str):
        raise CorruptCheckpointError(f"tensor name {name!r} is not a string")
    if not isinstance(blobs, list) or any(
        not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 for b in blobs
    ):
        raise _fail(name, "its compressed bytes are not a list of 1-D uint8 tensors")
    if not isinstance(rec, dict):
        raise _fail(name, "its record description is not a dict")
    dtype = DTYPES.get(rec["dtype"]) if isinstance(rec.get("dtype"), str) else None
    if dtype is None:
        raise _fail(name, f"unknown dtype {rec.get('dtype')!r}")
    size = _int_tuple(size, name, "shape")
    stride = _int_tuple(stride, name, "stride")
    if len(size) != len(stride) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise _fail(name, f"shape {size}, stride {stride} and offset {offset!r} do not fit together")
    if not isinstance(requires_grad, bool) or not isinstance(parameter, bool):
        raise _fail(name, "requires_grad or parameter is not a bool")
    storages = rec.get("storages")
    if not isinstance(index, int) or not isinstance(storages, list) or not 0 <= index < len(storages):
        raise _fail(name, f"storage index {index!r} is out of range")
    describe = _describe.get()
    if describe is not None:
        try:
            records.validate(rec, [b.numel() for b in blobs])
        except CheckpointError as err:
            raise _fail(name, str(err)) from None
        return describe(TensorInfo(name, rec["dtype"], size, rec, sum(b.numel() for b in blobs)))

    storage = _decoded_storages(blobs, rec, name)[index]
    start, nbytes = storages[index]
    itemsize = dtype.itemsize
    if nbytes % itemsize or start % itemsize:
        raise _fail(name, f"storage of {nbytes} bytes at {start} does not hold whole {dtype} elements")
    numel = nbytes // itemsize
    if all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= numel:
        raise _fail(name, f"shape {size} with stride {stride} at offset {offset} overruns its {numel} elements")
    if not all(size) and offset >= 1 << 48:  # an empty view reads nothing, but torch allows any offset for it
        raise _fail(name, f"offset {offset} is absurd")
    flat = storage.view(dtype)
    tensor = flat.as_strided(size, stride, offset)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad)
    return tensor.requires_grad_(requires_grad)


# Found by torch.load's pickle as `lightning_nvcomp.decode_tensor`; allowed for weights_only=True.
decode_tensor.__module__ = "lightning_nvcomp"
torch.serialization.add_safe_globals([decode_tensor])


def _eligible(obj: object) -> bool:
    return (
        type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.layout == torch.strided
        and obj.device.type in ("cpu", "cuda")
        and str(obj.dtype).removeprefix("torch.") in DTYPES
        and not obj.is_conj()
        and not obj.is_neg()
    )


class _NullSink:
    def write(self, data: bytes) -> int:
        return len(data)


def _find_tensors(obj: object) -> list[torch.Tensor]:
    """Every tensor ``torch.save`` would meet in ``obj``, in pickling order (a dry-run pickle)."""
    found: dict[int, torch.Tensor] = {}

    class Finder(pickle.Pickler):
        def persistent_id(self, item: object) -> object:
            return "storage" if isinstance(item, (torch.UntypedStorage, torch.storage.TypedStorage)) else None

        def reducer_override(self, item: object) -> object:
            if _eligible(item):
                found.setdefault(id(item), item)
                return int, ()
            return NotImplemented

    Finder(_NullSink(), protocol=2).dump(obj)
    return list(found.values())


def _tensor_names(obj: object) -> dict[int, str]:
    """Dotted key paths of the tensors reachable through dicts, lists and tuples (for messages and inspect)."""
    names: dict[int, str] = {}
    seen: set[int] = set()
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, torch.Tensor):
            names.setdefault(id(item), path or "<root>")
        elif isinstance(item, (Mapping, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            stack.extend((value, f"{path}.{key}" if path else str(key)) for key, value in pairs)
    return names


@dataclass
class _Record:
    device: torch.device
    dtype: torch.dtype
    storages: list[torch.UntypedStorage]
    nbytes: int = 0


def _plan(
    tensors: list[torch.Tensor], names: dict[int, str], group_nbytes: int | None = None
) -> tuple[list[_Record], dict[int, tuple[int, int]]]:
    """Group the tensors' storages into records. Returns the records and, per storage, (record, index)."""
    group_limit = group_nbytes or _GROUP_NBYTES
    small_limit = min(_SMALL_NBYTES, group_limit)
    dtypes: dict[int, tuple[torch.dtype, str]] = {}
    unique: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        storage = t.untyped_storage()
        name = names.get(id(t), "<unnamed>")
        seen = dtypes.setdefault(storage._cdata, (t.dtype, name))
        if seen[0] != t.dtype:
            raise CheckpointError(
                f"tensors {seen[1]!r} ({seen[0]}) and {name!r} ({t.dtype}) view the same storage as different types;"
                " torch.save refuses this too: save a copy of one of them"
            )
        unique.setdefault(storage._cdata, storage)
    plan: list[_Record] = []
    where: dict[int, tuple[int, int]] = {}
    open_groups: dict[tuple, int] = {}
    for key, storage in unique.items():
        dtype = dtypes[key][0]
        nbytes = storage.nbytes()
        group_key = (storage.device, dtype)
        if nbytes >= small_limit:
            plan.append(_Record(storage.device, dtype, [storage], nbytes))
            where[key] = (len(plan) - 1, 0)
            continue
        slot = open_groups.get(group_key)
        if slot is None or plan[slot].nbytes + nbytes > group_limit:
            plan.append(_Record(storage.device, dtype, []))
            slot = open_groups[group_key] = len(plan) - 1
        group = plan[slot]
        where[key] = (slot, len(group.storages))
        group.storages.append(storage)
        group.nbytes += -(-nbytes // _ALIGN) * _ALIGN
    return plan, where


def _storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


class _LayoutCache:
    """The byte layout last chosen for each record, by the memory it was coded from. A training run saves the same
    parameter and optimizer tensors again and again: choosing a layout (sampling entropy, trying gANS's typed model
    and checking it round-trips) costs ~4 ms per record on an H200, coding it ~1 ms. Every layout is lossless, so a
    stale entry (memory reused by other tensors) costs at most some ratio."""

    def __init__(self, size: int = 4096) -> None:
        self._layouts: OrderedDict[tuple, records.Layout] = OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def get(self, key: tuple) -> records.Layout | None:
        with self._lock:
            return self._layouts.get(key)

    def put(self, key: tuple, layout: records.Layout) -> None:
        with self._lock:
            self._layouts[key] = layout
            self._layouts.move_to_end(key)
            while len(self._layouts) > self._size:
                self._layouts.popitem(last=False)


_layouts = _LayoutCache()


def _encode_record(
    rec: _Record, codec: str, segment: int | None, on_blob: Callable[[torch.Tensor, Any], None]
) -> tuple[list[torch.Tensor], dict]:
    key = (codec, rec.dtype, segment, tuple((s.device, s.data_ptr(), s.nbytes()) for s in rec.storages))
    parts, table, pos = [], [], 0
    for storage in rec.storages:
        data = _storage_bytes(storage)
        table.append([pos, data.numel()])
        parts.append(data)
        pad = -data.numel() % _ALIGN if len(rec.storages) > 1 else 0
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=rec.device))
        pos += data.numel() + pad
    data = records.concatenate(parts)
    blobs, meta = records.encode(data, rec.dtype, codec, segment, on_blob, wait_checksums=False, layout=_layouts.get(key))
    _layouts.put(key, records.Layout.of(meta))
    meta["storages"] = table
    meta["device"] = rec.device.type  # where the tensors lived (load(keep_on_gpu=True) puts CUDA ones back there)
    return blobs, meta


@dataclass(frozen=True)
class SaveStats:
    """What one save did. ``prediction`` is the policy's forecast when the codec was chosen automatically."""

    path: str
    codec: str
    raw_nbytes: int
    file_nbytes: int
    encode_s: float
    write_s: float
    prediction: Prediction | None = None

    @property
    def seconds(self) -> float:
        return self.encode_s + self.write_s

    @property
    def ratio(self) -> float:
        return self.raw_nbytes / self.file_nbytes if self.file_nbytes else 1.0


def resolve_codec(
    codec: str, tensors: list[torch.Tensor], directory: str, policy: CodecPolicy | None = None
) -> tuple[str, Prediction | None]:
    """The codec a save uses. ``auto`` asks ``policy`` (default: this process's :func:`default_policy`), which
    measures the storage and the codecs and predicts the fastest save."""
    if codec not in SAVE_CODECS:
        raise ValueError(f"codec must be one of {SAVE_CODECS}, not {codec!r}")
    if codec != "auto":
        return codec, None
    chosen, _ = (policy or default_policy()).decide(tensors, directory)
    return chosen.codec, chosen


@functools.cache
def default_policy() -> CodecPolicy:
    """The policy ``codec="auto"`` uses when none is given: sync mode, measurements cached for the process."""
    return CodecPolicy()


class _StorageKey:
    """A storage already (or soon) written as ``data/<key>``: the archive pickler's persistent id for it."""

    __slots__ = ("key", "nbytes")

    def __init__(self, key: str, nbytes: int) -> None:
        self.key, self.nbytes = key, nbytes


class _StoredBlob:
    """Pickles as a CPU uint8 tensor whose bytes are the entry ``data/<key>``, without holding them: a compressed
    segment can be written and freed long before the pickle is."""

    __slots__ = ("storage",)

    def __init__(self, key: str, nbytes: int) -> None:
        self.storage = _StorageKey(key, nbytes)

    def __reduce__(self) -> tuple:
        n = self.storage.nbytes
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, (n,), (1,), False, OrderedDict())


class _ArchivePickler(pickle.Pickler):
    """torch.save's pickling: storages become persistent ids (``data/<key>`` entries), our tensors decode calls."""

    def __init__(self, file: io.BytesIO, reductions: dict[int, tuple], first_key: int) -> None:
        super().__init__(file, protocol=2)
        self.reductions = reductions
        self.storages: dict[str, torch.UntypedStorage] = {}  # found while pickling: written after the pickle
        self._keys: dict[int, str] = {}
        self._next = first_key

    def persistent_id(self, obj: object) -> tuple | None:
        if isinstance(obj, _StorageKey):
            return ("storage", torch.ByteStorage, obj.key, "cpu", obj.nbytes)
        if not (isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj)):
            return None
        if isinstance(obj, torch.storage.TypedStorage):
            storage, kind, numel = obj._untyped_storage, getattr(torch, obj._pickle_storage_type()), obj._size()
        else:
            storage, kind, numel = obj, torch.serialization.normalize_storage_type(type(obj)), obj.nbytes()
        if storage._cdata not in self._keys:
            self._keys[storage._cdata] = str(self._next)
            self._next += 1
        key = self._keys[storage._cdata]
        self.storages[key] = storage
        return ("storage", kind, key, torch.serialization.location_tag(storage), numel)

    def reducer_override(self, obj: object) -> object:
        return self.reductions.get(id(obj), NotImplemented)


def _value(crc: Crc32 | int) -> int:
    return crc.result() if isinstance(crc, Crc32) else crc


class Snapshot:
    """A checkpoint whose tensors are compressed into host memory (or already written), ready to be written by
    any thread. Tensors in the saved object are not read again."""

    def __init__(self, obj: object, codec: str, raw_nbytes: int, encode_s: float, reductions: dict[int, tuple],
                 pending: list[tuple[str, torch.Tensor, Any]], metas: list[dict]) -> None:
        self.obj, self.codec, self.raw_nbytes, self.encode_s = obj, codec, raw_nbytes, encode_s
        self._reductions, self._pending, self._metas = reductions, pending, metas
        self._blob_count = sum(len(meta["crc32"]) for meta in metas)

    def write_to(self, writer: ArchiveWriter) -> None:
        """Write the blobs not yet written, the pickle and the rest of the archive."""
        for key, blob, crc in self._pending:
            writer.add(f"data/{key}", blob.numpy(), _value(crc))
        self._pending = []
        for meta in self._metas:
            records.resolve_checksums(meta)
        buffer = io.BytesIO()
        pickler = _ArchivePickler(buffer, self._reductions, self._blob_count)
        pickler.dump(self.obj)
        for key, storage in pickler.storages.items():
            writer.add(f"data/{key}", _storage_bytes(storage).cpu().numpy())
        writer.add_torch_metadata()
        writer.add("data.pkl", buffer.getbuffer())
        writer.finish("data.pkl")

    def write(self, path: str | os.PathLike, storage: Storage | None = None, prediction: Prediction | None = None) -> SaveStats:
        """Write the file atomically and durably; return what the whole save did."""
        begin = time.perf_counter()
        size = (storage or Storage()).write(path, lambda f: self.write_to(ArchiveWriter(f)))
        return SaveStats(os.fspath(path), self.codec, self.raw_nbytes, size, self.encode_s,
                         time.perf_counter() - begin, prediction)


def _host_copies(tensors: list[torch.Tensor], isolate: bool) -> dict[int, tuple]:
    """Reductions that pickle each tensor as a plain CPU tensor: GPU storages copied to pinned host memory (fast,
    and safe from later GPU updates), CPU storages copied only when ``isolate``. Views keep sharing storage."""
    copies: dict[int, torch.UntypedStorage] = {}
    reductions = {}
    for t in tensors:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in copies:
            if storage.device.type == "cpu" and not isolate:
                copies[key] = storage
            else:
                host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=storage.device.type == "cuda")
                host.copy_(_storage_bytes(storage), non_blocking=True)
                copies[key] = host.untyped_storage()
        twin = torch.empty(0, dtype=t.dtype).set_(copies[key], t.storage_offset(), t.shape, t.stride())
        twin = torch.nn.Parameter(twin, t.requires_grad) if type(t) is torch.nn.Parameter else twin.requires_grad_(t.requires_grad)
        reductions[id(t)] = twin.__reduce_ex__(2)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return reductions


def snapshot(
    obj: object,
    codec: str,
    tensors: list[torch.Tensor] | None = None,
    isolate: bool = False,
    staging_nbytes: int | None = None,
    on_blob: Callable[[str, torch.Tensor, Any], None] | None = None,
) -> Snapshot:
    """Copy every tensor of ``obj`` into host memory, compressed with ``codec`` (``ans``, ``zstd``; ``none``: as is).

    Compressed blobs are always fresh copies. With ``isolate`` (saves written while training goes on) the rest of
    ``obj`` is copied too, and with ``none`` so are CPU tensors. ``staging_nbytes`` (a multiple of 512) bounds the records and segments coded at
    once, so a GPU save borrows about three times that much GPU memory (default: 256 MiB). With ``on_blob``, each
    compressed segment is handed to ``on_blob(key, blob, crc)`` as soon as it is in host memory (to be written as
    entry ``data/<key>``) instead of being kept in the snapshot.
    """
    begin = time.perf_counter()
    tensors = _find_tensors(obj) if tensors is None else tensors
    if isolate:
        # The file is written later: freeze the structure (dicts, counters, callback states) as it is now; the
        # tensors themselves are copied below, so the copy shares them.
        obj = copy.deepcopy(obj, memo={id(t): t for t in tensors})
    raw = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage()._cdata: t for t in tensors}.values())
    if codec == "none":
        return Snapshot(obj, codec, raw, time.perf_counter() - begin, _host_copies(tensors, isolate), [], [])
    pending: list[tuple[str, torch.Tensor, Any]] = []
    refs: list[_StoredBlob] = []

    def take(blob: torch.Tensor, crc: Any) -> None:
        key = str(len(refs))
        refs.append(_StoredBlob(key, blob.numel()))
        if on_blob is None:
            pending.append((key, blob, crc))
        else:
            on_blob(key, blob, crc)

    reductions: dict[int, tuple] = {}
    names = _tensor_names(obj)
    plan, where = _plan(tensors, names, staging_nbytes)
    encoded = []
    for rec in plan:
        first = len(refs)
        _, meta = _encode_record(rec, codec, staging_nbytes, take)
        encoded.append((refs[first:], meta))
    for t in tensors:
        slot, index = where[t.untyped_storage()._cdata]
        blobs, meta = encoded[slot]
        args = (blobs, meta, index, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.requires_grad,
                type(t) is torch.nn.Parameter, names.get(id(t), "<unnamed>"))
        reductions[id(t)] = (decode_tensor, args)
    return Snapshot(obj, codec, raw, time.perf_counter() - begin, reductions, pending, [m for _, m in encoded])


def _stream(f: BinaryIO, obj: object, codec: str, tensors: list[torch.Tensor], staging_nbytes: int | None) -> Snapshot:
    """Compress ``obj`` into the archive ``f``, each segment written (on a disk thread) while the next is coded."""
    writer = ArchiveWriter(f)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write") as disk:
        writes = []

        def write(key: str, blob: torch.Tensor, crc: Any) -> None:
            writes.append(disk.submit(lambda: writer.add(f"data/{key}", blob.numpy(), _value(crc))))

        snap = snapshot(obj, codec, tensors, staging_nbytes=staging_nbytes, on_blob=write)
        for done in writes:
            done.result()
    snap.write_to(writer)
    return snap


def save(
    obj: object,
    path: str | os.PathLike,
    codec: str = "auto",
    *,
    policy: CodecPolicy | None = None,
    storage: Storage | None = None,
    staging_nbytes: int | None = None,
) -> SaveStats:
    """Save ``obj`` like ``torch.save``, its tensors compressed losslessly, atomically and durably.

    Args:
        obj: anything ``torch.save`` accepts; plain dense tensors and parameters are compressed.
        path: the file to write. It appears complete or not at all; a previous file there survives failures.
        codec: ``"ans"`` (nvCOMP gANS on the GPU: fastest, needs a GPU to load), ``"zstd"`` (GPU or CPU, loads
            anywhere), ``"none"`` (a plain ``torch.save`` file), or ``"auto"``: the codec with the shortest
            predicted save, from this directory's measured write bandwidth and the codecs measured on this state
            (see :mod:`lightning_nvcomp.policy`; the first save to a file system probes it).
        policy: the :class:`~lightning_nvcomp.policy.CodecPolicy` behind ``"auto"`` (default: one per process).
        storage: how the file is written (default: durably through the OS).
        staging_nbytes: how much is coded at once (GPU scratch is about three times this; default 256 MiB).

    Compressed segments are written while the next ones are coded, so coding overlaps the write.
    """
    tensors = _find_tensors(obj)
    directory = target_directory(path)
    codec, prediction = resolve_codec(codec, tensors, directory, policy)
    begin = time.perf_counter()
    snaps: list[Snapshot] = []
    size = (storage or Storage()).write(path, lambda f: snaps.append(_stream(f, obj, codec, tensors, staging_nbytes)))
    seconds = time.perf_counter() - begin
    encode_s = snaps[0].encode_s
    stats = SaveStats(os.fspath(path), codec, snaps[0].raw_nbytes, size, encode_s, seconds - encode_s, prediction)
    (policy or default_policy()).observe_write(directory, stats.file_nbytes, seconds)
    return stats


def load(
    path: str | os.PathLike,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool = True,
    keep_on_gpu: bool = False,
) -> Any:
    """Load a checkpoint written by :func:`save` (or any ``torch.save`` file), bit-exactly.

    Tensors come back on the CPU unless ``map_location`` says otherwise; ``map_location="cuda"`` decodes on the
    GPU directly. With ``keep_on_gpu`` (and no ``map_location``), compressed tensors saved from a GPU come back on
    the current GPU when there is one, decoded there without a trip through host memory (what a resume wants: the
    optimizer adopts them as they are). ``mmap`` maps the file instead of reading it (as ``torch.load(mmap=True)``):
    compressed bytes go from the page cache straight to the decoder, 2-4x faster than reading them into new memory;
    tensors stored uncompressed then share the file's pages, copy-on-write. Errors name ``path`` and the tensor at
    fault.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    mmap = mmap and _is_zip(path)  # legacy (pre-zip) torch files cannot be mapped
    token = _keep_on_gpu.set(keep_on_gpu and map_location is None)
    try:
        return read(path, path, map_location, weights_only, mmap)
    finally:
        _keep_on_gpu.reset(token)


def read(source: str | BinaryIO, name: str, map_location: Any = None, weights_only: bool = True,
         mmap: bool = False) -> Any:
    """``torch.load`` of a file path or a seekable binary file, after checking the pickle's CRC-32 (torch.load does
    not); every failure becomes a :class:`CheckpointError` whose message starts with ``name``."""
    _check_pickle_crc(source, name)
    try:
        return torch.load(source, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except CheckpointError as err:
        raise type(err)(f"{name}: {err}") from None
    except pickle.UnpicklingError as err:
        if weights_only and "weights_only" in str(err).lower():
            raise CheckpointError(
                f"{name} holds objects that weights_only=True refuses (see below); if you trust the file, load it "
                f"with weights_only=False.\n{err}"
            ) from None
        raise CorruptCheckpointError(f"{name} cannot be read as a checkpoint (truncated or damaged?): {err}") from err
    except Exception as err:  # a damaged zip or pickle fails in many ways inside torch.load
        raise CorruptCheckpointError(
            f"{name} cannot be loaded ({type(err).__name__}: {err}); the file may be truncated or damaged"
        ) from err


def _is_zip(path: str) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except Exception:  # a damaged end record can make even this fail; read() then reports the damage
        return False


def _check_pickle_crc(source: str | BinaryIO, name: str) -> None:
    """Check the CRC-32 that the zip records for the pickle (shapes, strides, all non-tensor values). Legacy
    (non-zip) torch files have none to check. A file object is left at its start."""
    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as archive:
                for entry in archive.namelist():
                    if entry.endswith("/data.pkl"):
                        archive.read(entry)  # raises BadZipFile on a CRC mismatch
    except Exception as err:  # zipfile fails a damaged directory in many ways (BadZipFile, NotImplementedError...)
        raise CorruptCheckpointError(f"{name}: the checkpoint's structure is damaged ({err})") from None
    finally:
        if not isinstance(source, str):
            source.seek(0)


def describe(path: str | os.PathLike) -> Any:
    """Load ``path``'s structure with a :class:`TensorInfo` in place of each compressed tensor, decoding nothing."""
    token = _describe.set(lambda info: info)
    try:
        return load(path, map_location="cpu", mmap=True)
    finally:
        _describe.reset(token)


def report_progress(callback: Callable[[int], None] | None) -> contextvars.Token:
    """Have every record decoded in this context call ``callback(raw_nbytes)``; undo with ``_progress.reset``."""
    return _progress.set(callback)
