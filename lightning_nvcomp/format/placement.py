"""Every argument of a decoder call validated before anything is decoded (:func:`place`): this module's checks are
what stands between a pickle, which anyone may have written, and the tensors a load returns."""

from __future__ import annotations

import copy
import math
import operator
import zlib
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

import torch

from lightning_nvcomp._compat.torch import tensor_version
from lightning_nvcomp.codec import schema
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError
from lightning_nvcomp.format.contents import DTYPES
from lightning_nvcomp.format.load_state import LoadState

_MAX_DIMS = 64


def blob_key(b: torch.Tensor) -> tuple:
    return (b.untyped_storage()._cdata, b.storage_offset(), b.numel())


def fail(name: object, message: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"tensor {name!r}: {message}")


def _int_tuple(value: object, name: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS:
        raise fail(name, f"{what} {value!r} is not a short list of integers")
    if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 48 for v in value):
        raise fail(name, f"{what} {value!r} holds a negative, huge or non-integer entry")
    if math.prod(value) >= 1 << 48:
        raise fail(name, f"{what} {value!r} describes an absurd number of elements")
    return tuple(value)


def check_blobs(blobs: object, name: object) -> None:
    if not isinstance(blobs, list) or any(
        not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 for b in blobs
    ):
        raise fail(name, "its compressed bytes are not a list of 1-D uint8 tensors")


def blob_keys(blobs: list[torch.Tensor], name: object, state: LoadState) -> list[tuple]:
    """Check ``blobs`` (:func:`check_blobs`) and return their keys (:func:`blob_key`). Every tensor of a record gets
    the same list (pickle's memo): a list met before in this load that holds the same plain tensors, none changed
    since (a pickle's only way to change a tensor, ``set_``, counts in its version), is not walked again."""
    cached = state.blob_lists.get(id(blobs))
    if (
        cached is not None
        and cached[0] is blobs
        and len(blobs) == len(cached[1])
        and all(map(operator.is_, blobs, cached[1]))
        and cached[2] == [tensor_version(b) for b in blobs]
    ):
        return cached[3]
    check_blobs(blobs, name)
    keys = [blob_key(b) for b in blobs]
    if all(type(b) is torch.Tensor for b in blobs):  # a subclass may change without set_
        state.blob_lists[id(blobs)] = (blobs, tuple(blobs), [tensor_version(b) for b in blobs], keys)
    return keys


#: Key under which a validated record copy keeps its layout (an object: no pickle can hold it).
LAYOUT = object()


def check_record(rec: object, blobs: list[torch.Tensor], name: object, state: LoadState, keys: list[tuple]) -> dict:
    """Validate a record dict against its blobs (every field; format 2: its own check) and return a copy of it that
    nothing else holds. Validated once per load: every tensor of a record gets the same dict (pickle's memo), and a
    pickle that changes the dict after its first use changes nothing (the copy is what decodes)."""
    cached = state.records.get(id(rec))
    if cached is not None and cached[0] is rec and cached[1] == keys:
        return cached[2]
    if not isinstance(rec, dict):
        raise fail(name, "its record description is not a dict")
    try:
        layout = schema.validate(rec, [b.numel() for b in blobs])
    except CheckpointError as err:  # damage, or a newer format: the same kind of error, the tensor named
        raise type(err)(f"tensor {name!r}: {err}") from None
    storages = rec.get("storages")
    if not isinstance(storages, list) or any(
        not isinstance(s, list) or len(s) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in s)
        for s in storages
    ):
        raise fail(name, "record storage table is malformed")
    if any(off + n > rec["nbytes"] for off, n in storages):
        raise fail(name, f"a storage lies outside the record's {rec['nbytes']} bytes")
    if not isinstance(rec.get("dtype"), str) or rec["dtype"] not in DTYPES:
        raise fail(name, f"unknown dtype {rec.get('dtype')!r}")
    valid: dict[Any, Any] = {k: _copied(v) for k, v in rec.items() if isinstance(k, str)}
    valid[LAYOUT] = layout
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


def tensor_check(
    rec: dict, index: int, offset: int, size: tuple, stride: tuple, requires_grad: bool, parameter: bool, name: str
) -> int:
    """The ``check`` argument of :func:`decode_tensor`: a CRC-32 over the tensor's record and placement, the
    :func:`~lightning_nvcomp.codec.schema.canonical_crc` of ``[rec["check"], index, offset, size, stride,
    requires_grad, parameter, name]``. Every load computes it for every tensor: the JSON is written out here (half
    the encoder's time), for what :func:`place` lets through (integers that are not bools where integers go, bools
    where bools go, a string); a value of another type falls back to the encoder."""
    try:
        text = (
            f"[{int.__repr__(rec['check'])},{int.__repr__(index)},{int.__repr__(offset)},"
            f"[{','.join(map(int.__repr__, size))}],[{','.join(map(int.__repr__, stride))}],"
            f"{_JSON_BOOLS[requires_grad]},{_JSON_BOOLS[parameter]},{encode_basestring_ascii(name)}]"
        )
    except (TypeError, KeyError):
        return schema.canonical_crc(
            [rec["check"], index, offset, list(size), list(stride), requires_grad, parameter, name]
        )
    return zlib.crc32(text.encode())


_JSON_BOOLS = {True: "true", False: "false"}


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


class Placed(NamedTuple):
    """A validated :func:`decode_tensor` call: its record (the validated copy), blob keys and placement."""

    blobs: list[torch.Tensor]
    rec: dict
    keys: list[tuple]
    at: Placement


def place(
    blobs: list[torch.Tensor], rec: dict, at: Placement, check: int | None, newer: tuple, state: LoadState
) -> Placed:
    """Validate every argument of a :func:`decode_tensor` call (``at``: its placement arguments, as given); raise
    CorruptCheckpointError naming the tensor."""
    index, offset, size, stride, requires_grad, parameter, name = at
    if not isinstance(name, str):
        raise CorruptCheckpointError(f"tensor name {name!r} is not a string")
    keys = blob_keys(blobs, name, state)
    rec = check_record(rec, blobs, name, state, keys)
    size = _int_tuple(size, name, "shape")
    stride = _int_tuple(stride, name, "stride")
    if len(size) != len(stride) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise fail(name, f"shape {size}, stride {stride} and offset {offset!r} do not fit together")
    if not isinstance(requires_grad, bool) or not isinstance(parameter, bool):
        raise fail(name, "requires_grad or parameter is not a bool")
    storages = rec["storages"]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(storages):
        raise fail(name, f"storage index {index!r} is out of range")
    if newer and rec["format"] <= schema.FORMAT_VERSION:
        raise fail(name, f"{len(newer)} arguments more than format {rec['format']} has")
    if rec["format"] >= 2:
        if check != tensor_check(rec, index, offset, size, stride, requires_grad, parameter, name):
            raise fail(name, "its placement (record, index, offset, shape, stride, flags) is damaged: check mismatch")
    elif check is not None:
        raise fail(name, "a format-1 record with a check argument")
    dtype = DTYPES[rec["dtype"]]
    start, nbytes = storages[index]
    itemsize = dtype.itemsize
    if nbytes % itemsize or start % itemsize:
        raise fail(name, f"storage of {nbytes} bytes at {start} does not hold whole {dtype} elements")
    numel = nbytes // itemsize
    if all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= numel:
        raise fail(name, f"shape {size} with stride {stride} at offset {offset} overruns its {numel} elements")
    if not all(size) and offset >= 1 << 48:  # an empty view reads nothing, but torch allows any offset for it
        raise fail(name, f"offset {offset} is absurd")
    return Placed(blobs, rec, keys, Placement(index, offset, size, stride, requires_grad, parameter, name))
