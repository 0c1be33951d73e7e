"""The decoders ``torch.load`` calls: :func:`decode_tensor` and :func:`decode_storage` (see docs/FORMAT.md), every
argument validated and every byte checked before a tensor is returned, within the load's bound
(:mod:`.load_state`). ``import lightning_nvcomp`` registers both with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

from lightning_nvcomp.codec import batch as batch_coding
from lightning_nvcomp.codec import engines, schema
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.load_state import LoadState, _load_state

_MAX_DIMS = 64


class TensorInfo(NamedTuple):
    """What :func:`describe` returns in place of each compressed tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    record: dict
    stored_nbytes: int

    # A tensor with Python attributes is pickled as torch's ``_rebuild_from_type_v2(decode_tensor, type, args,
    # attributes)``, which calls these on what decode_tensor returned: its description stands for it as it is.
    def as_subclass(self, cls: type) -> TensorInfo:
        return self

    def __setstate__(self, state: object) -> None:
        pass


@dataclass
class Describing:
    """What :func:`~lightning_nvcomp.format.reader.describe` asks of the decoders while it loads a file: decode
    nothing (a :class:`TensorInfo` stands for each compressed tensor, an empty meta storage for each other storage), or
    (``decode``) decode as a load does and note each compressed tensor's TensorInfo in ``infos``."""

    decode: bool = False
    infos: list[TensorInfo] = field(default_factory=list)


#: While set, the decoders describe (see :class:`Describing`).
_describe: contextvars.ContextVar[Describing | None] = contextvars.ContextVar("describe", default=None)


#: While set, records saved from a GPU decode onto the current GPU (when there is one), whatever the blobs' device.
_keep_on_gpu: contextvars.ContextVar[bool] = contextvars.ContextVar("keep_on_gpu", default=False)


#: While set, called with the raw size of every record decoded (progress bars).
_progress: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("progress", default=None)


def _blob_key(b: torch.Tensor) -> tuple:
    return (b.untyped_storage()._cdata, b.storage_offset(), b.numel())


def _fail(name: object, message: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"tensor {name!r}: {message}")


@contextlib.contextmanager
def _file_named(state: LoadState) -> Iterator[None]:
    """Errors of a decoder name the file of its load (``torch.load`` calls the decoders knowing no path)."""
    try:
        yield
    except CheckpointError as err:
        message = str(err)
        if not state.name or message.startswith(state.name):
            raise
        raise type(err)(f"{state.name}: {message}") from None


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
        layout = schema.validate(rec, [b.numel() for b in blobs])
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
    valid: dict[Any, Any] = {k: _copied(v) for k, v in rec.items() if isinstance(k, str)}
    valid[_LAYOUT] = layout
    state.records[id(rec)] = (rec, keys, valid)
    return valid


def _copied(value: object) -> object:
    """A copy of a validated record field that nothing else holds (lists copied all the way down)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, float, str)):
        return value
    return copy.deepcopy(value)


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
    state.charge(blobs, rec["nbytes"], name)
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
    return schema.canonical_crc([rec["check"], index, offset, list(size), list(stride), requires_grad, parameter, name])


def storage_check(rec: dict, index: int, dtype: str | None) -> int:
    """The ``check`` argument of :func:`decode_storage`."""
    return schema.canonical_crc([rec["check"], index, dtype])


class Placement(NamedTuple):
    """Where one tensor lies in its record: :func:`decode_tensor`'s arguments after the record, before the check."""

    storage: int  # the storage's index in the record
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool
    parameter: bool
    name: str


class _Placed(NamedTuple):
    """A validated :func:`decode_tensor` call: its record (the validated copy), blob keys and placement."""

    blobs: list[torch.Tensor]
    rec: dict
    keys: list[tuple]
    at: Placement


def _place(
    blobs: list[torch.Tensor], rec: dict, at: Placement, check: int | None, newer: tuple, state: LoadState
) -> _Placed:
    """Validate every argument of a :func:`decode_tensor` call (``at``: its placement arguments, as given); raise
    CorruptCheckpointError naming the tensor."""
    index, offset, size, stride, requires_grad, parameter, name = at
    if not isinstance(name, str):
        raise CorruptCheckpointError(f"tensor name {name!r} is not a string")
    _check_blobs(blobs, name)
    keys = [_blob_key(b) for b in blobs]
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
    if newer and rec["format"] <= schema.FORMAT_VERSION:
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
    return _Placed(blobs, rec, keys, Placement(index, offset, size, stride, requires_grad, parameter, name))


def _tensor(placed: _Placed, storage: torch.Tensor) -> torch.Tensor:
    typed = storage.view(DTYPES[placed.rec["dtype"]])
    # as_strided counts from the start of the memory: a storage that is a view of a larger buffer adds its own offset
    at = placed.at
    tensor = typed.as_strided(at.size, at.stride, typed.storage_offset() + at.offset)
    if at.parameter:
        return torch.nn.Parameter(tensor, at.requires_grad)
    return tensor.requires_grad_(at.requires_grad)


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
    state = _load_state(blobs)
    with _file_named(state):
        placed = _place(
            blobs, rec, Placement(index, offset, size, stride, requires_grad, parameter, name), check, newer, state
        )
        describing = _describe.get()
        if describing is not None:
            rec = placed.rec
            info = TensorInfo(name, rec["dtype"], placed.at.size, rec, sum(b.numel() for b in blobs))
            if not describing.decode:
                return info  # type: ignore[return-value]  # what stands for the tensor: decoded nothing
            describing.infos.append(info)
        return _tensor(placed, _record_storages(blobs, placed.rec, name, state, placed.keys)[placed.at.storage])


def decode_tensors(
    calls: list[tuple], device: torch.device, state: LoadState, as_decoded: bool = False
) -> list[torch.Tensor]:
    """Run many :func:`decode_tensor` calls (their argument tuples) of one load at once, every argument validated
    as there: records of one layout decode together (:func:`~lightning_nvcomp.codec.batch.decode_batch`: one
    engine call per codec instead of one per record), on ``device`` where it is a GPU, and the tensors are returned
    on ``device``; with ``as_decoded``, a tensor bound for the CPU that a GPU decoded (gANS) stays there, for the
    caller to copy it into its destination in one copy."""
    placed = []
    for args in calls:
        if len(args) < 9:
            raise CorruptCheckpointError(f"a decode_tensor call with {len(args)} arguments")
        check = args[9] if len(args) >= 10 else None  # format 1: no check
        placed.append(_place(args[0], args[1], Placement(*args[2:9]), check, tuple(args[10:]), state))
    batches: dict[tuple, list[int]] = {}
    for i, p in enumerate(placed):
        layout = p.rec[_LAYOUT]
        try:
            work = engines.work_device(layout, p.rec, device)
        except CheckpointError as err:
            raise type(err)(f"tensor {p.at.name!r}: {err}") from None
        batches.setdefault((layout, str(work)), []).append(i)
    decoded: dict[int, torch.Tensor] = {}
    for (layout, work), members in batches.items():
        for i in members:
            state.charge(placed[i].blobs, placed[i].rec["nbytes"], placed[i].at.name)
        batch = [(placed[i].blobs, placed[i].rec, layout) for i in members]
        try:
            outs = batch_coding.decode_batch(batch, torch.device(work))
        except CorruptCheckpointError as err:
            names = ", ".join(repr(placed[i].at.name) for i in members[:4])
            raise CorruptCheckpointError(f"tensors {names}{'...' if len(members) > 4 else ''}: {err}") from None
        for i, out in zip(members, outs):
            decoded[i] = out
    tensors = []
    for i, p in enumerate(placed):
        start, nbytes = p.rec["storages"][p.at.storage]
        storage = decoded[i][start : start + nbytes]
        if storage.device != device and not as_decoded:
            storage = storage.to(device)
        elif storage.numel() != decoded[i].numel():
            storage = storage.clone()
        state.produced.add(storage.untyped_storage()._cdata)
        report = _progress.get()
        if report is not None:
            report(p.rec["nbytes"])
        tensors.append(_tensor(p, storage))
    return tensors


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
    state = _load_state(blobs)
    with _file_named(state):
        return _decode_storage(blobs, rec, index, dtype, check, newer, state)


def _decode_storage(
    blobs: list[torch.Tensor], rec: dict, index: int, dtype: str | None, check: int, newer: tuple, state: LoadState
) -> Any:
    where = f"storage {index!r} of a record"
    _check_blobs(blobs, where)
    keys = [_blob_key(b) for b in blobs]
    rec = _check_record(rec, blobs, where, state, keys)
    typed = _torch_dtype(dtype) if dtype is not None else None
    if dtype is not None and typed is None:
        raise _fail(where, f"unknown dtype {dtype!r}")
    storages = rec["storages"]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(storages):
        raise _fail(where, f"storage index {index!r} is out of range")
    if newer and rec["format"] <= schema.FORMAT_VERSION:
        raise _fail(where, f"{len(newer)} arguments more than format {rec['format']} has")
    if rec["format"] < 2 or check != storage_check(rec, index, dtype):
        raise _fail(where, "its description is damaged: check mismatch")
    describing = _describe.get()
    if describing is not None and not describing.decode:  # a storage of the right size that holds no memory
        piece = torch.empty(storages[index][1], dtype=torch.uint8, device="meta")
    else:
        piece = _record_storages(blobs, rec, where, state, keys)[index]
    # As torch.load's storages: typed, and uint8 for storages saved untyped.
    return torch.storage.TypedStorage(wrap_storage=piece.untyped_storage(), dtype=typed or torch.uint8, _internal=True)


# Found by torch.load's pickle as `lightning_nvcomp.decode_tensor` / `.decode_storage`; allowed for weights_only=True.
decode_tensor.__module__ = decode_storage.__module__ = "lightning_nvcomp"


torch.serialization.add_safe_globals([decode_tensor, decode_storage])


@contextlib.contextmanager
def decode_progress(callback: Callable[[int], None]) -> Iterator[None]:
    """Within this block, every record decoded calls ``callback(raw_nbytes)`` (progress bars)."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)
