"""The checkpoint file: a valid ``torch.save`` zip in which tensors are stored as compressed records.

Each tensor in the saved object is pickled as a call ``decode_tensor(blobs, record, index, offset, size, stride,
requires_grad, parameter, name, check)`` and every other storage as ``decode_storage(blobs, record, index, dtype,
check)`` (the whole format: docs/FORMAT.md): ``blobs`` are ordinary uint8 tensors holding the compressed record
(one per segment), ``record`` the dict that describes it (see :mod:`lightning_nvcomp.codec.record`, plus
``storages``: the ``[offset, nbytes]`` of each tensor storage packed into the record). Small storages of one dtype and device share a record; views of one storage
share it like in ``torch.save``. So any ``torch.load`` - Lightning's, the user's, with ``weights_only=True`` once
:mod:`lightning_nvcomp` is imported, with ``map_location`` or ``mmap=True`` - returns the real tensors.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import io
import math
import os
import pickle
import struct
import threading
import time
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, NamedTuple, TypeGuard

import torch

from lightning_nvcomp import _torch_compat
from lightning_nvcomp.archive import ArchiveWriter
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.checksum import Crc32
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, DecodeLimitError
from lightning_nvcomp.options import Codec
from lightning_nvcomp.policy import CodecPolicy, Prediction
from lightning_nvcomp.resources import shared
from lightning_nvcomp.storage import Storage, check_local, target_directory

#: Codec names :func:`save` accepts.
SAVE_CODECS = tuple(c.value for c in Codec)
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

#: Default bound on what one load decodes: this multiple of the file's size plus :data:`DECODE_ALLOWANCE` bytes.
#: Real checkpoints compress 1.2-1.6x; only constant data (zeros) compresses more, and the allowance covers some.
DECODE_MULTIPLE = 16
DECODE_ALLOWANCE = 256 << 20
#: Environment variable that sets the bound in bytes for every load of the process (``unlimited``: none).
DECODE_LIMIT_ENV = "LIGHTNING_NVCOMP_MAX_DECODED_BYTES"


def _env_limit() -> int | None | bool:
    """The bound set by :data:`DECODE_LIMIT_ENV`: bytes, None for unlimited, False when it is not set."""
    value = os.environ.get(DECODE_LIMIT_ENV, "").strip()
    if not value:
        return False
    if value.lower() in ("unlimited", "none", "inf"):
        return None
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(f"{DECODE_LIMIT_ENV}={value!r} is not a number of bytes or 'unlimited'") from None


class LoadState:
    """What one load has decoded: the bound on decoded bytes, decoded records (copies of one record decode once)
    and the storages handed out (every other storage in the result came from the file as it is).

    Args:
        name: how errors name the file.
        limit: the most bytes this load may decode (None: unlimited). With ``file_nbytes`` unknown (a plain
            ``torch.load``), the compressed bytes seen so far stand in for the file's size.
        file_nbytes: the size of the file being loaded, when known.
    """

    def __init__(self, name: str = "", limit: int | None | bool = False, file_nbytes: int | None = None) -> None:
        self.name, self.file_nbytes = name, file_nbytes
        env = _env_limit()
        self.limit = limit if limit is not False else env
        self.decoded = self.compressed = 0
        self.cache: dict[tuple, list[torch.Tensor]] = {}
        self.records: dict[int, tuple[dict, list, dict]] = {}  # id -> (the dict, its blobs' keys, validated copy)
        self.produced: set[int] = set()
        self._seen: set[tuple] = set()

    def bound(self) -> int | None:
        if self.limit is not False:
            return self.limit
        base = self.file_nbytes if self.file_nbytes is not None else self.compressed
        return DECODE_MULTIPLE * base + DECODE_ALLOWANCE

    def charge(self, blobs: list[torch.Tensor], keys: list[tuple], nbytes: int, name: str) -> None:
        """Count a record about to be decoded; raise DecodeLimitError if the load would exceed its bound."""
        for b, key in zip(blobs, keys):
            if key not in self._seen:
                self._seen.add(key)
                self.compressed += b.numel()
        bound = self.bound()
        if bound is not None and self.decoded + nbytes > bound:
            rule = (
                f"{self.limit} bytes"
                if self.limit is not False
                else f"{DECODE_MULTIPLE} x the file's {self.file_nbytes if self.file_nbytes is not None else self.compressed}"
                f" bytes + {DECODE_ALLOWANCE >> 20} MiB"
            )
            raise DecodeLimitError(
                f"{self.name + ': ' if self.name else ''}tensor {name!r}: decoding it would bring this load to "
                f"{self.decoded + nbytes} bytes, over its limit of {bound} ({rule}), which guards against "
                "decompression bombs. If you trust the file, raise the limit: lightning_nvcomp.load(..., "
                f"max_decoded_nbytes=N) or the environment variable {DECODE_LIMIT_ENV}=N (bytes, or 'unlimited')"
            )
        self.decoded += nbytes


#: The state of the load running in this context (our loaders set it; see :func:`_load_state`).
_load: contextvars.ContextVar[LoadState | None] = contextvars.ContextVar("load", default=None)
#: States of plain torch.load calls, by their unpickler (freed with it, when the load ends).
_torch_loads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Without a known load (torch changed), records are cached by their first blob, and bounded one by one: by the
#: blob's id, dropped when the blob is (tensors compare elementwise, so they cannot be weak dictionary keys).
_orphans: dict[int, LoadState] = {}


def _load_state(blobs: list[torch.Tensor]) -> LoadState:
    state = _load.get()
    if state is not None:
        return state
    unpickler = _torch_compat.current_torch_load()
    if unpickler is not None:
        try:
            return _torch_loads.setdefault(unpickler, LoadState())
        except TypeError:  # not weak-referenceable: treat as unknown
            pass
    if not blobs:
        return LoadState()
    key = id(blobs[0])
    if key not in _orphans:
        _orphans[key] = LoadState()
        weakref.finalize(blobs[0], _orphans.pop, key, None)
    return _orphans[key]


def _blob_key(b: torch.Tensor) -> tuple:
    return (b.untyped_storage()._cdata, b.storage_offset(), b.numel())


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


def _check_blobs(blobs: object, name: object) -> None:
    if not isinstance(blobs, list) or any(
        not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 for b in blobs
    ):
        raise _fail(name, "its compressed bytes are not a list of 1-D uint8 tensors")


#: Key under which a validated record copy keeps its layout (an object: no pickle can hold it).
_LAYOUT = object()


def _check_record(rec: object, blobs: list[torch.Tensor], name: object, state: LoadState, keys: list[tuple]) -> dict:
    """Validate a record dict against its blobs (every field; format 2: its own check) and return a copy of it that
    nothing else holds. Validated once per load: every tensor of a record gets the same dict (pickle's memo), and a
    pickle that changes the dict after its first use changes nothing (the copy is what decodes)."""
    cached = state.records.get(id(rec))
    if cached is not None and cached[0] is rec and cached[1] == keys:
        return cached[2]
    if not isinstance(rec, dict):
        raise _fail(name, "its record description is not a dict")
    try:
        layout = records.validate(rec, [b.numel() for b in blobs])
    except CheckpointError as err:  # damage, or a newer format: the same kind of error, the tensor named
        raise type(err)(f"tensor {name!r}: {err}") from None
    storages = rec.get("storages")
    if not isinstance(storages, list) or any(
        not isinstance(s, list) or len(s) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in s)
        for s in storages
    ):
        raise _fail(name, "record storage table is malformed")
    if any(off + n > rec["nbytes"] for off, n in storages):
        raise _fail(name, f"a storage lies outside the record's {rec['nbytes']} bytes")
    if not isinstance(rec.get("dtype"), str) or rec["dtype"] not in DTYPES:
        raise _fail(name, f"unknown dtype {rec.get('dtype')!r}")
    valid: dict[Any, Any] = copy.deepcopy({k: v for k, v in rec.items() if isinstance(k, str)})
    valid[_LAYOUT] = layout
    state.records[id(rec)] = (rec, keys, valid)
    return valid


def _record_storages(
    blobs: list[torch.Tensor], rec: dict, name: str, state: LoadState, keys: list[tuple]
) -> list[torch.Tensor]:
    """The record's storages as uint8 tensors on the blobs' device (``map_location``), each in its own memory;
    decoded once per load (copies of one record included), within the load's bound."""
    target = blobs[0].device if blobs else torch.device("cpu")
    if _keep_on_gpu.get() and rec.get("device") == "cuda" and target.type == "cpu" and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    identity = rec["check"] if rec["format"] >= 2 else id(rec)
    key = (tuple(keys), identity, str(target))
    cached = state.cache.get(key)
    if cached is not None:
        return cached
    state.charge(blobs, keys, rec["nbytes"], name)
    try:
        data = records.decode(blobs, rec, target, move=False, layout=rec[_LAYOUT])
    except CheckpointError as err:
        raise type(err)(f"tensor {name!r}: {err}") from None
    pieces = [data[start : start + n] for start, n in rec["storages"]]
    if data.device != target:  # decoded on a GPU for a CPU load: one copy, straight into each storage's memory
        pieces = [piece.to(target) for piece in pieces]
    elif len(pieces) > 1 or (pieces and pieces[0].numel() != data.numel()):
        # Each storage gets its own memory, exactly its bytes: tensors are placed in it by absolute offsets, and a
        # tensor kept after the load (an optimizer keeps its state tensors) must not hold the whole record alive.
        pieces = [piece.clone() for piece in pieces]
    state.cache[key] = pieces
    state.produced.update(p.untyped_storage()._cdata for p in pieces)
    report = _progress.get()
    if report is not None:
        report(rec["nbytes"])
    return pieces


def tensor_check(
    rec: dict, index: int, offset: int, size: tuple, stride: tuple, requires_grad: bool, parameter: bool, name: str
) -> int:
    """The ``check`` argument of :func:`decode_tensor`: a CRC-32 over the tensor's record and placement."""
    return records.canonical_crc(
        [rec["check"], index, offset, list(size), list(stride), requires_grad, parameter, name]
    )


def storage_check(rec: dict, index: int, dtype: str | None) -> int:
    """The ``check`` argument of :func:`decode_storage`."""
    return records.canonical_crc([rec["check"], index, dtype])


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
    check: int | None = None,
    *newer: object,
) -> torch.Tensor:
    """Rebuild one tensor from a compressed record (called by ``torch.load``; import lightning_nvcomp first).

    Every argument is validated: this function is reachable from any pickle. ``check`` (format 2 records) is the
    CRC-32 of the record's ``check`` and every other argument (:func:`tensor_check`): a damaged placement fails here,
    under any loader. Format 1 records (v0.1) are called without it. Arguments a newer format may add (``newer``)
    are accepted so that its record's version is what the error names (upgrade), not the call.
    """
    if not isinstance(name, str):
        raise CorruptCheckpointError(f"tensor name {name!r} is not a string")
    _check_blobs(blobs, name)
    state, keys = _load_state(blobs), [_blob_key(b) for b in blobs]
    rec = _check_record(rec, blobs, name, state, keys)
    size = _int_tuple(size, name, "shape")
    stride = _int_tuple(stride, name, "stride")
    if len(size) != len(stride) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise _fail(name, f"shape {size}, stride {stride} and offset {offset!r} do not fit together")
    if not isinstance(requires_grad, bool) or not isinstance(parameter, bool):
        raise _fail(name, "requires_grad or parameter is not a bool")
    storages = rec["storages"]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(storages):
        raise _fail(name, f"storage index {index!r} is out of range")
    if newer and rec["format"] <= records.FORMAT_VERSION:
        raise _fail(name, f"{len(newer)} arguments more than format {rec['format']} has")
    if rec["format"] >= 2:
        if check != tensor_check(rec, index, offset, size, stride, requires_grad, parameter, name):
            raise _fail(name, "its placement (record, index, offset, shape, stride, flags) is damaged: check mismatch")
    elif check is not None:
        raise _fail(name, "a format-1 record with a check argument")
    dtype = DTYPES[rec["dtype"]]
    start, nbytes = storages[index]
    itemsize = dtype.itemsize
    if nbytes % itemsize or start % itemsize:
        raise _fail(name, f"storage of {nbytes} bytes at {start} does not hold whole {dtype} elements")
    numel = nbytes // itemsize
    if all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= numel:
        raise _fail(name, f"shape {size} with stride {stride} at offset {offset} overruns its {numel} elements")
    if not all(size) and offset >= 1 << 48:  # an empty view reads nothing, but torch allows any offset for it
        raise _fail(name, f"offset {offset} is absurd")
    describe = _describe.get()
    if describe is not None:
        return describe(TensorInfo(name, rec["dtype"], size, rec, sum(b.numel() for b in blobs)))
    storage = _record_storages(blobs, rec, name, state, keys)[index]
    tensor = storage.view(dtype).as_strided(size, stride, offset)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad)
    return tensor.requires_grad_(requires_grad)


def _torch_dtype(name: object) -> torch.dtype | None:
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    return value if isinstance(value, torch.dtype) else None


def decode_storage(
    blobs: list[torch.Tensor], rec: dict, index: int, dtype: str | None, check: int, *newer: object
) -> Any:
    """Rebuild one storage from a record: how tensors that are not stored through :func:`decode_tensor` (conj or
    neg views, subclasses, sparse tensors, dtypes the record format does not name) get their bytes, checked.

    Returns a ``TypedStorage`` of ``dtype`` (uint8 when ``dtype`` is None: a storage saved untyped), as
    ``torch.load``'s persistent storages are; torch's own rebuild functions place the tensors in it.
    """
    where = f"storage {index!r} of a record"
    _check_blobs(blobs, where)
    state, keys = _load_state(blobs), [_blob_key(b) for b in blobs]
    rec = _check_record(rec, blobs, where, state, keys)
    typed = _torch_dtype(dtype) if dtype is not None else None
    if dtype is not None and typed is None:
        raise _fail(where, f"unknown dtype {dtype!r}")
    storages = rec["storages"]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(storages):
        raise _fail(where, f"storage index {index!r} is out of range")
    if newer and rec["format"] <= records.FORMAT_VERSION:
        raise _fail(where, f"{len(newer)} arguments more than format {rec['format']} has")
    if rec["format"] < 2 or check != storage_check(rec, index, dtype):
        raise _fail(where, "its description is damaged: check mismatch")
    if _describe.get() is not None:  # describe decodes nothing: a storage of the right size that holds no memory
        piece = torch.empty(storages[index][1], dtype=torch.uint8, device="meta")
    else:
        piece = _record_storages(blobs, rec, where, state, keys)[index]
    # As torch.load's storages: typed, and uint8 for storages saved untyped.
    return torch.storage.TypedStorage(wrap_storage=piece.untyped_storage(), dtype=typed or torch.uint8, _internal=True)


# Found by torch.load's pickle as `lightning_nvcomp.decode_tensor` / `.decode_storage`; allowed for weights_only=True.
decode_tensor.__module__ = decode_storage.__module__ = "lightning_nvcomp"
torch.serialization.add_safe_globals([decode_tensor, decode_storage])


def _eligible(obj: object) -> TypeGuard[torch.Tensor]:
    return (
        isinstance(obj, torch.Tensor)
        and type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.layout == torch.strided
        and obj.device.type in ("cpu", "cuda")
        and str(obj.dtype).removeprefix("torch.") in DTYPES
        and not obj.is_conj()
        and not obj.is_neg()
    )


class _NullSink:
    def write(self, data: bytes) -> int:
        return len(data)


@dataclass
class Contents:
    """What ``torch.save`` would store of an object, found by a dry-run pickle.

    ``tensors``: the dense tensors stored through :func:`decode_tensor`, in pickling order. ``storages``: the storages
    of every other tensor (conj/neg views, subclasses, sparse parts, dtypes the format does not name) and storages
    saved as such, by ``_cdata``: ``(storage, dtype name or None for an untyped storage)``; they are stored through
    :func:`decode_storage`. ``kept``: every object the save must not copy (it holds or is what was found).
    """

    tensors: list[torch.Tensor]
    storages: dict[int, tuple[torch.UntypedStorage, str | None]]
    kept: list[object]


def _storage_of(obj: object) -> tuple[torch.UntypedStorage | None, str | None]:
    """A storage object's untyped storage and dtype name (None for an untyped one); (None, None) for anything else."""
    if isinstance(obj, torch.storage.TypedStorage):
        return obj._untyped_storage, str(obj.dtype).removeprefix("torch.")
    if isinstance(obj, torch.UntypedStorage):
        return obj, None
    return None, None


class _ContentsFinder(pickle.Pickler):
    """A dry-run pickle that notes the tensors and storages torch.save would meet (a module-level class: a local one
    would keep what it found alive in a reference cycle until the next garbage collection)."""

    def __init__(self) -> None:
        super().__init__(_NullSink(), protocol=2)
        self.tensors: dict[int, torch.Tensor] = {}
        self.storages: dict[int, tuple[torch.UntypedStorage, str | None]] = {}
        self.kept: dict[int, object] = {}

    def persistent_id(self, item: object) -> object:
        untyped, dtype = _storage_of(item)
        if untyped is None:
            return None
        seen = self.storages.setdefault(untyped._cdata, (untyped, dtype))
        if dtype is not None and seen[1] is None:
            self.storages[untyped._cdata] = (untyped, dtype)
        elif dtype is not None and seen[1] != dtype:
            raise CheckpointError(
                f"two tensors view one storage as {seen[1]} and {dtype}; torch.save refuses this too: save a copy "
                "of one of them"
            )
        return "storage"

    def reducer_override(self, item: object) -> Any:
        if _eligible(item):
            self.tensors.setdefault(id(item), item)
            return int, ()
        if isinstance(item, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)):
            self.kept.setdefault(id(item), item)
        return NotImplemented


def find_contents(obj: object) -> Contents:
    """The tensors and storages ``torch.save`` would meet in ``obj``."""
    finder = _ContentsFinder()
    finder.dump(obj)
    tensors = list(finder.tensors.values())
    return Contents(tensors, finder.storages, [*tensors, *finder.kept.values()])


def _find_tensors(obj: object) -> list[torch.Tensor]:
    """Every tensor stored through :func:`decode_tensor` in ``obj``, in pickling order (see :func:`find_contents`)."""
    return find_contents(obj).tensors


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
    tensors: list[torch.Tensor],
    names: dict[int, str],
    group_nbytes: int | None = None,
    extra: dict[int, tuple[torch.UntypedStorage, str | None]] | None = None,
) -> tuple[list[_Record], dict[int, tuple[int, int]]]:
    """Group the storages of ``tensors`` and the ``extra`` storages (see :class:`Contents`) into records. Returns the
    records and, per storage, (record, index)."""
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
    for key, (storage, dtype_name) in (extra or {}).items():
        if storage.device.type not in ("cpu", "cuda"):
            raise CheckpointError(f"a storage on {storage.device} cannot be saved: move it to the CPU or a GPU first")
        if key in dtypes:
            if dtype_name is not None and str(dtypes[key][0]).removeprefix("torch.") != dtype_name:
                raise CheckpointError(
                    f"tensor {dtypes[key][1]!r} ({dtypes[key][0]}) and another tensor ({dtype_name}) view the same "
                    "storage as different types; torch.save refuses this too: save a copy of one of them"
                )
            continue
        dtypes[key] = (DTYPES.get(dtype_name or "uint8", torch.uint8), "<storage>")
        unique[key] = storage
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
    coder = "raw" if codec == "none" else codec
    layouts = shared("layouts", _LayoutCache)
    blobs, meta = records.encode(
        data, rec.dtype, coder, segment, on_blob, wait_checksums=False, layout=layouts.get(key)
    )
    layouts.put(key, records.Layout.of(meta))
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
    if Codec.parse(codec) is not Codec.AUTO:
        return Codec.parse(codec).value, None
    chosen, _ = (policy or default_policy()).decide(tensors, directory)
    return chosen.codec, chosen


def default_policy() -> CodecPolicy:
    """The policy ``codec="auto"`` uses when none is given: sync mode, measurements cached for the process."""
    return shared("policy", CodecPolicy)


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
    """torch.save's pickling, where every tensor is a call of our decoders: dense tensors of :func:`decode_tensor`
    (``reductions``, by tensor id), every other storage of :func:`decode_storage` (``storage_reductions``, by
    ``_cdata``); the blobs are persistent ids of ``data/<key>`` entries, as torch.save stores storages."""

    def __init__(self, file: io.BytesIO, reductions: dict[int, tuple], storage_reductions: dict[int, Callable]) -> None:
        super().__init__(file, protocol=2)
        self.reductions, self.storage_reductions = reductions, storage_reductions

    def persistent_id(self, obj: object) -> tuple | None:
        if isinstance(obj, _StorageKey):
            return ("storage", torch.ByteStorage, obj.key, "cpu", obj.nbytes)
        return None

    def reducer_override(self, obj: object) -> Any:
        reduction = self.reductions.get(id(obj))
        if reduction is not None:
            return reduction
        untyped, dtype = _storage_of(obj)
        if untyped is None:
            return NotImplemented
        make = self.storage_reductions.get(untyped._cdata)
        if make is None:
            raise CheckpointError(f"a {type(obj).__name__} appeared in the object after its snapshot was taken")
        return make(dtype)


def _value(crc: Crc32 | int) -> int:
    return crc.result() if isinstance(crc, Crc32) else crc


class _Placement(NamedTuple):
    """Where one tensor lies in its record: :func:`decode_tensor`'s arguments but the record's own."""

    slot: int
    storage: int  # the storage's index in the record
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool
    parameter: bool
    name: str


class Snapshot:
    """A checkpoint whose tensors are compressed into host memory (or already written), ready to be written by
    any thread. Tensors in the saved object are not read again."""

    def __init__(
        self,
        obj: object,
        codec: str,
        raw_nbytes: int,
        encode_s: float,
        placements: dict[int, _Placement],
        storages: dict[int, tuple[int, int]],
        encoded: list[tuple[list[_StoredBlob], dict]],
        pending: list[tuple[str, torch.Tensor, Any]],
    ) -> None:
        self.obj, self.codec, self.raw_nbytes, self.encode_s = obj, codec, raw_nbytes, encode_s
        self._placements, self._storages, self._encoded, self._pending = placements, storages, encoded, pending

    def write_to(self, writer: ArchiveWriter) -> None:
        """Write the blobs not yet written, the pickle and the rest of the archive."""
        for key, blob, crc in self._pending:
            writer.add(f"data/{key}", memoryview(blob.numpy()), _value(crc))
        self._pending = []
        for _, meta in self._encoded:
            records.seal(meta)  # every checksum known: the record's own check covers them
        reductions: dict[int, tuple] = {}
        for tensor_id, p in self._placements.items():
            blobs, meta = self._encoded[p.slot]
            check = tensor_check(meta, p.storage, p.offset, p.size, p.stride, p.requires_grad, p.parameter, p.name)
            reductions[tensor_id] = (decode_tensor, (blobs, meta, *p[1:], check))

        def storage_reduction(slot: int, index: int) -> Callable[[str | None], tuple]:
            blobs, meta = self._encoded[slot]
            return lambda dtype: (decode_storage, (blobs, meta, index, dtype, storage_check(meta, index, dtype)))

        storage_reductions = {key: storage_reduction(*where) for key, where in self._storages.items()}
        buffer = io.BytesIO()
        _ArchivePickler(buffer, reductions, storage_reductions).dump(self.obj)
        writer.add_torch_metadata()
        writer.add("data.pkl", buffer.getbuffer())
        writer.finish("data.pkl")

    def write(
        self, path: str | os.PathLike, storage: Storage | None = None, prediction: Prediction | None = None
    ) -> SaveStats:
        """Write the file atomically and durably; return what the whole save did."""
        begin = time.perf_counter()
        size = (storage or Storage()).write(path, lambda f: self.write_to(ArchiveWriter(f)))
        return SaveStats(
            os.fspath(path), self.codec, self.raw_nbytes, size, self.encode_s, time.perf_counter() - begin, prediction
        )


def snapshot(
    obj: object,
    codec: str,
    tensors: list[torch.Tensor] | Contents | None = None,
    isolate: bool = False,
    staging_nbytes: int | None = None,
    on_blob: Callable[[str, torch.Tensor, Any], None] | None = None,
) -> Snapshot:
    """Copy every tensor of ``obj`` into host memory, compressed with ``codec`` (``ans``, ``zstd``; ``none``: stored
    raw, still checksummed).

    Blobs are always fresh copies. ``tensors``: what :func:`find_contents` found in ``obj`` (found here unless
    given). With ``isolate`` (saves written while training goes
    on) the rest of ``obj`` is copied too. ``staging_nbytes`` (a multiple of 512) bounds the records and segments
    coded at once, so a GPU save borrows about three times that much GPU memory (default: 256 MiB). With ``on_blob``,
    each compressed segment is handed to ``on_blob(key, blob, crc)`` as soon as it is in host memory (to be written
    as entry ``data/<key>``) instead of being kept in the snapshot.
    """
    begin = time.perf_counter()
    if tensors is None:
        tensors = find_contents(obj)
    contents = tensors if isinstance(tensors, Contents) else find_contents(obj)
    if isolate:
        # The file is written later: freeze the structure (dicts, counters, callback states) as it is now; the
        # tensors and storages themselves are copied below, so the copy shares them.
        obj = copy.deepcopy(obj, memo={id(t): t for t in contents.kept})
    names = _tensor_names(obj)
    plan, where = _plan(contents.tensors, names, staging_nbytes, contents.storages)
    raw = sum(s.nbytes() for rec in plan for s in rec.storages)
    pending: list[tuple[str, torch.Tensor, Any]] = []
    refs: list[_StoredBlob] = []

    def take(blob: torch.Tensor, crc: Any) -> None:
        key = str(len(refs))
        refs.append(_StoredBlob(key, blob.numel()))
        if on_blob is None:
            pending.append((key, blob, crc))
        else:
            on_blob(key, blob, crc)

    encoded = []
    for rec in plan:
        first = len(refs)
        _, meta = _encode_record(rec, codec, staging_nbytes, take)
        encoded.append((refs[first:], meta))
    placements = {}
    for t in contents.tensors:
        slot, index = where[t.untyped_storage()._cdata]
        placements[id(t)] = _Placement(
            slot,
            index,
            int(t.storage_offset()),
            tuple(t.shape),
            tuple(t.stride()),
            t.requires_grad,
            type(t) is torch.nn.Parameter,
            names.get(id(t), "<unnamed>"),
        )
    # Every planned storage: other tensors reach them too (the parts of a sparse tensor are made while pickling).
    return Snapshot(obj, codec, raw, time.perf_counter() - begin, placements, where, encoded, pending)


def _stream(
    f: BinaryIO, obj: object, codec: str, tensors: list[torch.Tensor] | Contents, staging_nbytes: int | None
) -> Snapshot:
    """Compress ``obj`` into the archive ``f``, each segment written (on a disk thread) while the next is coded."""
    writer = ArchiveWriter(f)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-write") as disk:
        writes = []

        def write(key: str, blob: torch.Tensor, crc: Any) -> None:
            writes.append(disk.submit(lambda: writer.add(f"data/{key}", memoryview(blob.numpy()), _value(crc))))

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
    """Save ``obj`` like ``torch.save``, its tensors compressed losslessly and checksummed, atomically and durably.

    Args:
        obj: anything ``torch.save`` accepts; plain dense tensors and parameters are compressed, every other
            storage is stored checksummed too.
        path: the file to write (a local path; a symlink is written through). It appears complete or not at all; a
            previous file there survives failures and keeps its permissions.
        codec: ``"ans"`` (nvCOMP gANS on the GPU: fastest, needs a GPU to load), ``"zstd"`` (GPU or CPU, loads
            anywhere), ``"none"`` (stored as is, with checksums), or ``"auto"``: the codec with the shortest
            predicted save, from this directory's measured write bandwidth and the codecs measured on this state
            (see :mod:`lightning_nvcomp.policy`; the first save to a file system probes it).
        policy: the :class:`~lightning_nvcomp.policy.CodecPolicy` behind ``"auto"`` (default: one per process).
        storage: how the file is written (default: durably through the OS).
        staging_nbytes: how much is coded at once (GPU scratch is about three times this; default 256 MiB).

    Compressed segments are written while the next ones are coded, so coding overlaps the write.
    """
    check_local(path)
    contents = find_contents(obj)
    directory = target_directory(path)
    codec, prediction = resolve_codec(codec, contents.tensors, directory, policy)
    begin = time.perf_counter()
    snaps: list[Snapshot] = []
    size = (storage or Storage()).write(path, lambda f: snaps.append(_stream(f, obj, codec, contents, staging_nbytes)))
    seconds = time.perf_counter() - begin
    encode_s = snaps[0].encode_s
    stats = SaveStats(os.fspath(path), codec, snaps[0].raw_nbytes, size, encode_s, seconds - encode_s, prediction)
    (policy or default_policy()).observe_write(directory, stats.file_nbytes, seconds)
    return stats


def load(
    path: str | os.PathLike,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    keep_on_gpu: bool = False,
    max_decoded_nbytes: int | None | bool = False,
) -> Any:
    """Load a checkpoint written by :func:`save` (or any ``torch.save`` file), bit-exactly and verified.

    The file is opened once: the load reads the file that was at ``path`` when it began, whatever replaces it
    meanwhile. Every tensor is checked before it is returned (our records by their CRC-32s and checks, the storages
    of a plain ``torch.save`` file by the zip's CRC-32s), and so is the pickle. Returned tensors are in memory of
    their own, never pages of the file, unless ``mmap=True``: then tensors stored by plain ``torch.save`` share the
    file's pages, copy-on-write, as with ``torch.load(mmap=True)``. Compressed bytes go from the page cache to the
    decoder either way.

    Args:
        path: the checkpoint (a local path).
        map_location: as ``torch.load``'s; ``"cuda"`` decodes on the GPU directly. Default: the CPU.
        weights_only: as ``torch.load``'s.
        mmap: True maps plain tensors from the file (see above); None or False: they are copied.
        keep_on_gpu: with no ``map_location``, compressed tensors saved from a GPU come back on the current GPU
            when there is one, decoded there (what a resume wants: the optimizer adopts them as they are).
        max_decoded_nbytes: the most bytes the load may decode (None: unlimited). Default: 16 x the file's size +
            256 MiB, or the environment variable ``LIGHTNING_NVCOMP_MAX_DECODED_BYTES``; a guard against
            decompression bombs (:class:`DecodeLimitError`).

    Raises:
        CorruptCheckpointError: the file is damaged (the message names it and the tensor at fault).
        CodecUnavailableError: a codec it needs cannot run here (gANS without a GPU).
        CheckpointError: anything else about the file (not a checkpoint, refused by ``weights_only``, too large
            to decode). Errors of the machine (memory, devices, threads) pass through, the file named.
    """
    check_local(path)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a directory, not a checkpoint file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    token = _keep_on_gpu.set(keep_on_gpu and map_location is None)
    try:
        with open(path, "rb") as f:
            return read(f, path, map_location, weights_only, mmap, max_decoded_nbytes)
    finally:
        _keep_on_gpu.reset(token)


#: The start of a legacy (pre-zip) torch file: protocol 2, then the pickled magic number 0x1950a86a20f9469cfc6c.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_TORCH_ZIP_ERRORS = ("PytorchStreamReader", "inline_container")
_OUR_DECODERS = (b"lightning_nvcomp\ndecode_tensor\n", b"lightning_nvcomp\ndecode_storage\n")


def _fd_path(f: BinaryIO) -> str | None:
    """A path that opens the very file ``f`` has open (Linux), for torch.load(mmap=True), which wants a path."""
    try:
        fd_path = f"/proc/self/fd/{f.fileno()}"
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return fd_path if os.path.exists(fd_path) else None


def read(
    source: BinaryIO,
    name: str,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    max_decoded_nbytes: int | None | bool = False,
    state: LoadState | None = None,
) -> Any:
    """``torch.load`` of a seekable binary file, verified: the zip's structure and the CRC-32 of every small entry
    (the pickle among them) first, every record's checks while decoding, and the zip CRC-32s of the storages of a
    plain ``torch.save`` file after. Every failure is named after ``name``; :class:`CorruptCheckpointError` means
    damage and nothing else. See :func:`load` for the arguments; ``state``: a :class:`LoadState` shared by several
    files read as one load (the items of a DCP checkpoint: one decode bound for all of them)."""
    source.seek(0, os.SEEK_END)
    file_nbytes = source.tell()
    source.seek(0)
    pickle_bytes = _check_structure(source, name, file_nbytes)
    ours = pickle_bytes is not None and any(d in pickle_bytes for d in _OUR_DECODERS)
    state = state or LoadState(name, max_decoded_nbytes, file_nbytes)
    # Map the file only where no returned tensor can share its pages: ours decode into new memory.
    fd_path = _fd_path(source) if pickle_bytes is not None and (mmap or (mmap is None and ours)) else None
    token = _load.set(state)
    try:
        obj = torch.load(
            fd_path or source, map_location=map_location, weights_only=weights_only, mmap=fd_path is not None
        )
        foreign = _describe.get() is None and _foreign_storages(obj, state.produced)
        if foreign and pickle_bytes is not None:
            _check_data_crcs(source, name)
            if fd_path is not None and not mmap:  # a file of ours with plain storages in it: load them copied
                source.seek(0)
                obj = torch.load(source, map_location=map_location, weights_only=weights_only)
        return obj
    except CheckpointError as err:
        raise type(err)(err.args[0] if str(err).startswith(name) else f"{name}: {err}") from None
    except pickle.UnpicklingError as err:
        if pickle_bytes is None:  # a legacy file: its pickle has no checksum to tell damage from refusal
            raise CorruptCheckpointError(
                f"{name} cannot be read as a checkpoint (truncated or damaged?): {err}"
            ) from err
        raise CheckpointError(
            f"{name} holds objects that weights_only=True does not load (its pickle is intact: this is not damage). "
            f"Allow them with torch.serialization.add_safe_globals, or, only for a file you trust, load it with "
            f"weights_only=False.\n{err}"
        ) from None
    except RuntimeError as err:
        # torch's zip reader (inline_container.cc) parses the directory itself, and fails damage we let through.
        if any(mark in str(err) for mark in _TORCH_ZIP_ERRORS) or pickle_bytes is None:
            raise CorruptCheckpointError(f"{name} cannot be loaded ({err}); the file is damaged") from err
        raise _named(err, name) from err
    except Exception as err:
        if pickle_bytes is None and not isinstance(err, (MemoryError, OSError)):
            raise CorruptCheckpointError(
                f"{name} cannot be loaded ({type(err).__name__}: {err}); the legacy file may be truncated or damaged"
            ) from err
        raise _named(err, name) from err
    finally:
        _load.reset(token)


def _named(err: BaseException, name: str) -> BaseException:
    """``err`` with ``name`` in its message (same type), for errors of the machine rather than of the file."""
    try:
        named = type(err)(f"{name}: {err}")
    except Exception:
        return err
    return named


def _check_structure(f: BinaryIO, name: str, file_nbytes: int) -> bytes | None:
    """Check the zip's directory, every entry's local header and the CRC-32 of every small entry (the pickle, the
    byte order...); return the pickle's bytes. A legacy (non-zip) torch file has no checksums: None. ``f`` is left
    at its start."""
    try:
        head = f.read(len(_LEGACY_MAGIC))
        f.seek(0)
        if not zipfile.is_zipfile(f):
            if head == _LEGACY_MAGIC:
                return None
            what = "empty" if file_nbytes == 0 else f"{file_nbytes} bytes"
            raise CorruptCheckpointError(
                f"{name} is not a checkpoint ({what}, neither a torch.save zip nor a legacy torch file): truncated "
                "or damaged, or another kind of file"
            )
        pickle_bytes = None
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
            top = infos[0].filename.split("/", 1)[0] if infos else ""
            for info in infos:
                if info.filename.split("/", 1)[0] != top or not 0 <= info.header_offset < file_nbytes:
                    raise CorruptCheckpointError(f"{name}: the zip directory entry {info.filename!r} is damaged")
                f.seek(info.header_offset)
                header = f.read(30 + len(info.orig_filename.encode()))
                if header[:4] != b"PK\x03\x04" or header[30:] != info.orig_filename.encode():
                    raise CorruptCheckpointError(f"{name}: the header of entry {info.filename!r} is damaged")
                if "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                    continue  # storages: checked by their records, or after the load (plain torch.save files)
                data = archive.read(info)  # raises BadZipFile on a CRC mismatch
                if info.filename.endswith("/data.pkl"):
                    pickle_bytes = data
        if pickle_bytes is None:
            raise CorruptCheckpointError(f"{name}: the checkpoint has no pickle (data.pkl): damaged")
        return pickle_bytes
    except CorruptCheckpointError:
        raise
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        EOFError,
        ValueError,
        struct.error,
        UnicodeDecodeError,
        KeyError,
        RuntimeError,
        OSError,
    ) as err:  # zipfile's ways to fail damage
        raise CorruptCheckpointError(
            f"{name}: the checkpoint's structure is damaged ({type(err).__name__}: {err})"
        ) from None
    finally:
        f.seek(0)


def _check_data_crcs(f: BinaryIO, name: str) -> None:
    """Check the zip CRC-32 of every storage entry (a plain ``torch.save`` file's tensors have no other check)."""
    try:
        with zipfile.ZipFile(f) as archive:
            for info in archive.infolist():
                with archive.open(info) as entry:
                    while entry.read(16 << 20):
                        pass
    except (zipfile.BadZipFile, EOFError, ValueError, struct.error) as err:
        raise CorruptCheckpointError(
            f"{name}: a tensor's stored bytes are damaged ({type(err).__name__}: {err})"
        ) from None
    finally:
        f.seek(0)


def _foreign_storages(obj: object, produced: set[int]) -> bool:
    """Whether ``obj`` holds a storage our decoders did not make (one torch.load took from the file as it is)."""
    contents = find_contents(obj)
    keys = [t.untyped_storage()._cdata for t in contents.tensors] + list(contents.storages)
    return any(key not in produced for key in keys)


def describe(path: str | os.PathLike) -> Any:
    """Load ``path``'s structure with a :class:`TensorInfo` in place of each compressed tensor, decoding nothing."""
    token = _describe.set(lambda info: info)
    try:
        return load(path, map_location="cpu", mmap=True)
    finally:
        _describe.reset(token)


@contextlib.contextmanager
def decode_progress(callback: Callable[[int], None]) -> Iterator[None]:
    """Within this block, every record decoded calls ``callback(raw_nbytes)`` (progress bars)."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)
