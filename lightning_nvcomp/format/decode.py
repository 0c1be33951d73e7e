"""The decoders ``torch.load`` calls: :func:`decode_tensor` and :func:`decode_storage` (see docs/FORMAT.md), every
argument validated (:mod:`.placement`) and every byte checked before a tensor is returned, within the bound of the load
they are part of (:class:`~lightning_nvcomp.format.load_context.LoadContext`). ``import lightning_nvcomp`` registers
both with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from lightning_nvcomp.codec import batch as batch_coding
from lightning_nvcomp.codec import engines, schema
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format import delta
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.load_context import LoadContext, TensorInfo, context_of
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.format.placement import (
    LAYOUT,
    Placed,
    Placement,
    blob_keys,
    check_record,
    fail,
    place,
    storage_check,
    tensor_check,
)

__all__ = ["Placement", "decode_storage", "decode_tensor", "decode_tensors", "storage_check", "tensor_check"]


def _state(context: LoadContext) -> LoadState:
    """The state of a load's context (every context a decoder runs in has one: see :func:`context_of`)."""
    if context.state is None:
        raise RuntimeError("lightning_nvcomp: a decoder ran in a block's settings, not in a load's context")
    return context.state


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


def _record_storages(
    blobs: list[torch.Tensor], rec: dict, name: str, context: LoadContext, keys: list[tuple]
) -> list[torch.Tensor]:
    """The record's storages as uint8 tensors on the blobs' device (``map_location``), each in its own memory;
    decoded once per load (copies of one record included), within the load's bound."""
    state = _state(context)
    target = context.device or (blobs[0].device if blobs else torch.device("cpu"))
    if context.keep_on_gpu and rec.get("device") == "cuda" and target.type == "cpu" and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    identity = rec["check"] if rec["format"] >= 2 else id(rec)
    key = (tuple(keys), identity, str(target))
    cached = state.cache.get(key)
    if cached is not None:
        return cached
    if "delta" in rec:  # its base is read as part of this load: it counts in the bound's base
        state.include(delta.base_stored_nbytes(rec))
    state.charge(blobs, rec["nbytes"], name)
    layout = rec[LAYOUT]
    try:
        undoing = delta.Undoing(rec, state.holder, state, target) if "delta" in rec else None
        if engines.work_device(layout, rec, target) == target:
            # Each storage gets its own memory, exactly its bytes, decoded straight into it: tensors are placed in it
            # by absolute offsets, and a tensor kept after the load (an optimizer keeps its state tensors) must not
            # hold the whole record alive.
            pieces = [torch.empty(n, dtype=torch.uint8, device=target) for _, n in rec["storages"]]
            after = undoing.by_segment(pieces) if undoing is not None else None
            records.decode_into(
                blobs, rec, [(start, p) for (start, _), p in zip(rec["storages"], pieces)], layout, after=after
            )
            if after is not None:
                undoing = None  # undone segment by segment, as each was decoded
        else:  # decoded on a GPU for a CPU load: one copy, straight into each storage's memory
            data = records.decode(blobs, rec, target, move=False, layout=layout)
            pieces = [data[start : start + n].to(target) for start, n in rec["storages"]]
        if undoing is not None:
            undoing.finish(pieces)
    except CheckpointError as err:
        raise type(err)(f"tensor {name!r}: {err}") from None
    state.cache[key] = pieces
    state.produced.update(p.untyped_storage()._cdata for p in pieces)
    context.decoded(rec["nbytes"])
    return pieces


def _undo(placed: Placed, data: torch.Tensor, state: LoadState) -> None:
    """Undo the delta of a DCP item's record (one storage, ``data`` decoded whole), naming the item on failure."""
    try:
        delta.undo(placed.rec, [data[start : start + n] for start, n in placed.rec["storages"]], state.holder, state)
    except CheckpointError as err:
        raise type(err)(f"tensor {placed.at.name!r}: {err}") from None


def _tensor(placed: Placed, storage: torch.Tensor) -> torch.Tensor:
    typed = storage.view(DTYPES[placed.rec["dtype"]])
    # as_strided counts from the start of the memory: a storage that is a view of a larger buffer adds its own offset
    at = placed.at
    tensor = typed.as_strided(at.size, at.stride, typed.storage_offset() + at.offset)
    if at.parameter:
        return torch.nn.Parameter(tensor, at.requires_grad)
    return tensor.requires_grad_() if at.requires_grad else tensor


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
    context = context_of(blobs)
    with _file_named(_state(context)):
        at = Placement(index, offset, size, stride, requires_grad, parameter, name)
        placed = place(blobs, rec, at, check, newer, _state(context))
        describing = context.describing
        if describing is not None:
            rec = placed.rec
            info = TensorInfo(name, rec["dtype"], placed.at.size, rec, sum(b.numel() for b in blobs))
            if not describing.decode:
                return info  # type: ignore[return-value]  # what stands for the tensor: decoded nothing
            describing.infos.append(info)
        return _tensor(placed, _record_storages(blobs, placed.rec, name, context, placed.keys)[placed.at.storage])


def decode_tensors(
    calls: list[tuple], device: torch.device, context: LoadContext, as_decoded: bool = False
) -> list[torch.Tensor]:
    """Run many :func:`decode_tensor` calls (their argument tuples) of one load at once, every argument validated
    as there: records of one layout decode together (:func:`~lightning_nvcomp.codec.batch.decode_batch`: one
    engine call per codec instead of one per record), on ``device`` where it is a GPU, and the tensors are returned
    on ``device``; with ``as_decoded``, a tensor bound for the CPU that a GPU decoded (gANS) stays there, for the
    caller to copy it into its destination in one copy. ``context``: the load's (its state set)."""
    state = _state(context)
    placed = []
    for args in calls:
        if len(args) < 9:
            raise CorruptCheckpointError(f"a decode_tensor call with {len(args)} arguments")
        check = args[9] if len(args) >= 10 else None  # format 1: no check
        placed.append(place(args[0], args[1], Placement(*args[2:9]), check, tuple(args[10:]), state))
    batches: dict[tuple, list[int]] = {}
    for i, p in enumerate(placed):
        layout = p.rec[LAYOUT]
        try:
            work = engines.work_device(layout, p.rec, device)
        except CheckpointError as err:
            raise type(err)(f"tensor {p.at.name!r}: {err}") from None
        batches.setdefault((layout, str(work)), []).append(i)
    decoded: dict[int, torch.Tensor] = {}
    for (layout, work), members in batches.items():
        for i in members:
            if "delta" in placed[i].rec:  # its base is read as part of this load: it counts in the bound's base
                state.include(delta.base_stored_nbytes(placed[i].rec))
            state.charge(placed[i].blobs, placed[i].rec["nbytes"], placed[i].at.name)
        batch = [(placed[i].blobs, placed[i].rec, layout) for i in members]
        try:
            outs = batch_coding.decode_batch(batch, torch.device(work))
        except CorruptCheckpointError as err:
            names = ", ".join(repr(placed[i].at.name) for i in members[:4])
            raise CorruptCheckpointError(f"tensors {names}{'...' if len(members) > 4 else ''}: {err}") from None
        for i, out in zip(members, outs):
            decoded[i] = out
            if "delta" in placed[i].rec:
                _undo(placed[i], out, state)
    tensors = []
    for i, p in enumerate(placed):
        start, nbytes = p.rec["storages"][p.at.storage]
        storage = decoded[i][start : start + nbytes]
        if storage.device != device and not as_decoded:
            storage = storage.to(device)
        elif storage.numel() != decoded[i].numel():
            storage = storage.clone()
        state.produced.add(storage.untyped_storage()._cdata)
        context.decoded(p.rec["nbytes"])
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
    context = context_of(blobs)
    with _file_named(_state(context)):
        return _decode_storage(blobs, rec, index, dtype, check, newer, context)


def _decode_storage(
    blobs: list[torch.Tensor], rec: dict, index: int, dtype: str | None, check: int, newer: tuple, context: LoadContext
) -> Any:
    where = f"storage {index!r} of a record"
    keys = blob_keys(blobs, where, _state(context))
    rec = check_record(rec, blobs, where, _state(context), keys)
    typed = _torch_dtype(dtype) if dtype is not None else None
    if dtype is not None and typed is None:
        raise fail(where, f"unknown dtype {dtype!r}")
    storages = rec["storages"]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(storages):
        raise fail(where, f"storage index {index!r} is out of range")
    if newer and rec["format"] <= schema.FORMAT_VERSION:
        raise fail(where, f"{len(newer)} arguments more than format {rec['format']} has")
    if rec["format"] < 2 or check != storage_check(rec, index, dtype):
        raise fail(where, "its description is damaged: check mismatch")
    if (
        context.describing is not None and not context.describing.decode
    ):  # a storage of the right size that holds no memory
        piece = torch.empty(storages[index][1], dtype=torch.uint8, device="meta")
    else:
        piece = _record_storages(blobs, rec, where, context, keys)[index]
    # As torch.load's storages: typed, and uint8 for storages saved untyped.
    return torch.storage.TypedStorage(wrap_storage=piece.untyped_storage(), dtype=typed or torch.uint8, _internal=True)


# Found by torch.load's pickle as `lightning_nvcomp.decode_tensor` / `.decode_storage`; allowed for weights_only=True.
decode_tensor.__module__ = decode_storage.__module__ = "lightning_nvcomp"


torch.serialization.add_safe_globals([decode_tensor, decode_storage])
