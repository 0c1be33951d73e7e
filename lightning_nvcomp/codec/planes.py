"""Byte planes: the layout of little-endian numbers that a stateless entropy coder compresses best.

A buffer of ``n`` numbers of ``w`` bytes each becomes ``w`` planes of ``n`` bytes; plane ``k`` holds byte ``k``
of every number (plane 0 is the lowest byte). In trained float weights and Adam moments the top planes (sign
and exponent) carry 2-3 bits of entropy per byte while the mantissa planes are noise, so coding planes apart
approaches the order-0 bound that coding the raw bytes cannot reach.

A float's exponent straddles its top two bytes (sign, 7 exponent bits | 1 exponent bit, 7 mantissa bits):
:func:`rotate` turns the top 16 bits of every number left by one bit, so that the top plane is the exponent whole and
the sign sits at the bottom of the plane below; that plane then codes 0.5-1.5% smaller in whole checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch

from lightning_nvcomp.codec import delta as transforms

_native: ModuleType | None
try:
    import lightning_nvcomp.codec._planes as _native  # the C passes (_planes.c)
except ImportError:  # built where no C compiler was: numpy's passes, about 5x slower (16 MB of fp32 planes)
    _native = None

#: Bytes per plane group for each dtype: the size of its scalar (a complex number is two floats).
_PLANE_WIDTH = {
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.float32: 4,
    torch.float64: 8,
    torch.complex32: 2,
    torch.complex64: 4,
    torch.complex128: 8,
    torch.int16: 2,
    torch.int32: 4,
    torch.int64: 8,
    torch.uint16: 2,
    torch.uint32: 4,
    torch.uint64: 8,
}

#: Chunks whose sampled order-0 entropy reaches this many bits per byte are stored raw without trying a coder: noise
#: (a sample of 16 KiB of it reads 7.989). A float's top mantissa plane (7.95) is tried: its small tensors code.
RAW_ENTROPY_BITS = 7.98

_SAMPLE_NBYTES = 16 << 10
_SAMPLE_RUNS = 64


def plane_width(dtype: torch.dtype) -> int:
    """Number of byte planes a buffer of ``dtype`` is split into (1 means: code the bytes as they are)."""
    return _PLANE_WIDTH.get(dtype, 1)


#: Each plane starts at a multiple of this many bytes (nvCOMP wants 16-byte aligned chunks on the GPU).
PLANE_ALIGN = 64


def empty(width: int, n: int, device: torch.device) -> torch.Tensor:
    """An uninitialised ``[width, n]`` uint8 plane buffer whose rows are contiguous and start aligned."""
    if device.type == "cpu":
        return torch.empty(width, n, dtype=torch.uint8)
    pitch = -(-n // PLANE_ALIGN) * PLANE_ALIGN
    return torch.empty(width, pitch, dtype=torch.uint8, device=device)[:, :n]


def flatten(planes: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A 1-D view over all rows of a ``[width, n]`` plane buffer, and the distance between row starts."""
    width, n = planes.shape
    pitch = planes.stride(0) if width > 1 else n
    return planes.as_strided(((width - 1) * pitch + n,), (1,), planes.storage_offset()), pitch


def split(data: torch.Tensor | Sequence[torch.Tensor], width: int, rotated: bool = False) -> torch.Tensor:
    """Return the ``[width, n]`` planes of the 1-D uint8 buffer ``data`` (``width * n`` bytes), or of the buffer that
    consecutive parts of whole numbers form (on the CPU: each split straight into its columns, none joined); with
    ``rotated``, :func:`rotate` d."""
    if not isinstance(data, torch.Tensor):
        if len(data) == 1 or width == 1 or data[0].device.type != "cpu":
            return split(data[0] if len(data) == 1 else torch.cat(list(data)), width, rotated)
        columns = np.empty((width, sum(part.numel() for part in data) // width), dtype=np.uint8)
        at = 0
        for part in data:
            split_into(part.numpy(), columns[:, at : at + part.numel() // width], rotated)
            at += part.numel() // width
        return torch.from_numpy(columns)
    if width == 1:
        return data.view(1, -1)
    if data.device.type == "cpu":
        columns = np.empty((width, data.numel() // width), dtype=np.uint8)
        split_into(data.numpy(), columns, rotated)
        return torch.from_numpy(columns)
    out = empty(width, data.numel() // width, data.device)
    out.copy_(data.view(-1, width).t())
    if rotated:
        rotate(out)
    return out


def split_many(windows: Sequence[torch.Tensor], width: int, rotated: bool = False) -> tuple[torch.Tensor, list[int]]:
    """The planes of each of ``windows`` (1-D uint8, on one device), one window after the other in one buffer: its
    :func:`split` rows, flattened, ``width`` of them (1 where its bytes are not whole numbers); and each one's width.
    On a GPU consecutive windows of one length are split together: there a kernel launch costs more than a window's
    bytes, and each lets the GIL go (which a thread running Python beside may then hold for a switch interval)."""
    widths = [width if window.numel() % width == 0 else 1 for window in windows]
    device = windows[0].device
    out = torch.empty(sum(window.numel() for window in windows), dtype=torch.uint8, device=device)
    if device.type != "cpu":
        _split_runs(windows, widths, rotated, out)
        return out, widths
    flat, at = out.numpy(), 0
    for window, w in zip(windows, widths):
        n = window.numel()
        split_into(window.numpy(), flat[at : at + n].reshape(w, n // w), rotated and w > 1)
        at += n
    return out, widths


def _split_runs(windows: Sequence[torch.Tensor], widths: list[int], rotated: bool, out: torch.Tensor) -> None:
    """:func:`split_many` with torch's ops (a GPU's way): each run of consecutive windows of one length in one copy."""
    first, at = 0, 0
    while first < len(windows):
        n, w = windows[first].numel(), widths[first]
        end = first + 1
        while end < len(windows) and windows[end].numel() == n:
            end += 1
        run = torch.stack(list(windows[first:end])) if end - first > 1 else windows[first].view(1, n)
        rows = out[at : at + (end - first) * n].view(end - first, w, n // w)
        rows.copy_(run.view(end - first, n // w, w).transpose(1, 2))
        if rotated and w > 1:
            _rotate(rows[:, -1], rows[:, -2])
        at, first = at + (end - first) * n, end


def split_into(data: np.ndarray, rows: np.ndarray, rotated: bool = False) -> None:
    """:func:`split` on the CPU into given rows: the 1-D uint8 array ``data`` into the ``[width, n]`` array ``rows``
    (each row contiguous; rows a column slice of a wider buffer, say)."""
    width, n = rows.shape
    if data.size != width * n:
        raise ValueError(f"{data.size} bytes do not split into {width} rows of {n}")
    if _native is not None and width > 1 and n and data.flags.c_contiguous and rows.strides[1] == 1:
        _native.split(_address(data), n, rotated, *(_address(rows) + k * rows.strides[0] for k in range(width)))
        return
    rows[:] = data.reshape(-1, width).T
    if rotated:
        _rotate(rows[-1], rows[-2])


def join(
    planes: Sequence[torch.Tensor], out: torch.Tensor, rotated: bool = False, undoing: tuple[str, int] | None = None
) -> None:
    """Interleave ``width`` planes of ``n`` bytes (the rows of a ``[width, n]`` buffer, or any 1-D uint8 tensors)
    back into the 1-D uint8 buffer ``out``: the inverse of :func:`split`; with ``rotated``, of :func:`rotate` too
    (the planes are left as they are). ``undoing``: a transform of :mod:`~lightning_nvcomp.codec.delta` and its
    itemsize: ``out`` holds bytes that transform made against the joined numbers, and becomes the bytes it was made
    from (one pass instead of a join and an undo)."""
    width, n = len(planes), planes[0].numel()
    if out.numel() != width * n or any(p.numel() != n for p in planes):
        raise ValueError(f"{width} planes of {n} bytes do not join into {out.numel()} bytes")
    if undoing is not None:
        transform, itemsize = undoing
        op = _JOIN_OPS.get(transform) if transform == "xor" or itemsize == width else None
        native = _native is not None and width in (2, 4, 8) and op is not None
        if not (native and all(t.device.type == "cpu" and t.is_contiguous() for t in (out, *planes))):
            joined = torch.empty_like(out)
            join(planes, joined, rotated)
            transforms.undo(transform, out, joined, itemsize)
        elif n:
            _native.join(out.data_ptr(), n, rotated, op, *(p.data_ptr() for p in planes))  # type: ignore[union-attr]
        return
    tensors = [out, *planes]
    if _native is not None and width > 1 and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        if n:
            _native.join(out.data_ptr(), n, rotated, 0, *(p.data_ptr() for p in planes))
    elif rotated and out.device.type == "cpu" and width % 2 == 0:
        _join_pairs([plane.numpy() for plane in planes], out.numpy())
    elif rotated:
        top = empty(2, planes[0].numel(), out.device)
        unrotate(planes[-1], planes[-2], top[0], top[1])
        join([*planes[:-2], top[1], top[0]], out)
    elif width == 1:
        out.copy_(planes[0])
    elif out.device.type == "cpu":
        rows = out.numpy().reshape(-1, width)
        for k in range(width):  # column by column: ~3x faster than one transposed assignment
            rows[:, k] = planes[k].numpy()
    else:
        columns = out.view(-1, width)
        for k in range(width):
            columns[:, k].copy_(planes[k])


#: The C join's op that undoes each transform (``_planes.c``: 1 XOR, 2 the wrapping sum).
_JOIN_OPS = {"xor": 1, "sub": 2}


#: Columns :func:`_join_pairs` works on at a time: its scratch stays in the core's cache.
_PAIR_COLUMNS = 64 << 10


def _join_pairs(rows: list[np.ndarray], out: np.ndarray) -> None:
    """:func:`join` of rotated planes on the CPU, an even number of rows: each pair of rows is combined into 16-bit
    numbers, written as one column of ``out`` (numpy writes a strided column of bytes at half the speed of one of
    16-bit numbers), the top pair rotated back on the way (1.6x faster than unrotating, then joining)."""
    width, n = len(rows), rows[0].size
    columns = out.view(np.uint16).reshape(-1, width // 2)
    pair, carry = np.empty(min(n, _PAIR_COLUMNS), np.uint16), np.empty(min(n, _PAIR_COLUMNS), np.uint16)
    for start in range(0, n, _PAIR_COLUMNS):
        end = min(n, start + _PAIR_COLUMNS)
        a, b = pair[: end - start], carry[: end - start]
        for k in range(0, width, 2):
            np.copyto(a, rows[k + 1][start:end])
            a <<= 8
            np.copyto(b, rows[k][start:end])
            a |= b
            if k == width - 2:
                np.left_shift(a, 15, out=b)
                a >>= 1
                a |= b
            columns[start:end, k // 2] = a


def rotates(dtype: torch.dtype) -> bool:
    """Whether buffers of ``dtype`` are coded with their top two planes rotated: floating point numbers (and complex
    ones, pairs of floats) of two bytes and more."""
    return plane_width(dtype) >= 2 and (dtype.is_floating_point or dtype.is_complex)


def rotate(planes: torch.Tensor) -> None:
    """Rotate the 16-bit numbers that the top two rows of a ``[width, n]`` plane buffer form (row ``width - 1`` their
    high byte) left by one bit, in place (:func:`join` with ``rotated`` undoes it)."""
    _rotate(*_arrays(planes[-1], planes[-2]))


def _rotate(high: np.ndarray | torch.Tensor, low: np.ndarray | torch.Tensor) -> None:
    carry = high >> 7
    high <<= 1
    high |= low >> 7
    low <<= 1
    low |= carry


def unrotate(high: torch.Tensor, low: torch.Tensor, out_high: torch.Tensor, out_low: torch.Tensor) -> None:
    """Rotate the 16-bit numbers that the rows ``high`` and ``low`` form right by one bit, into ``out_high`` and
    ``out_low``: what :func:`rotate` did, undone (how :func:`join` does it on a GPU)."""
    high_in, low_in, high_out, low_out = _arrays(high, low, out_high, out_low)
    carry_high, carry_low = high_in << 7, low_in << 7
    if isinstance(high_out, np.ndarray):
        np.right_shift(high_in, 1, out=high_out)
        np.right_shift(low_in, 1, out=low_out)
    else:
        torch.bitwise_right_shift(high_in, 1, out=high_out)
        torch.bitwise_right_shift(low_in, 1, out=low_out)
    high_out |= carry_low
    low_out |= carry_high


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _arrays(*rows: torch.Tensor) -> list:
    """The rows as numpy arrays on the CPU (numpy shifts bytes ~4x faster than torch there), as they are on a GPU."""
    return [row.numpy() for row in rows] if rows[0].device.type == "cpu" else list(rows)


def sampled_entropy_bits(chunk: np.ndarray) -> float:
    """Order-0 entropy in bits per byte of a 1-D uint8 array, estimated on :data:`_SAMPLE_RUNS` runs of bytes spread
    evenly over it (:data:`_SAMPLE_NBYTES` in all; runs, not every k-th byte: a plane's bytes repeat with the rows of
    its tensor; many short runs, so that a chunk of noise but for a stretch that codes is coded: on MiniLM's
    fp32 weights 4 runs lost 0.55% of the ratio, 64 nothing)."""
    if chunk.size > _SAMPLE_NBYTES:
        run, gap = _SAMPLE_NBYTES // _SAMPLE_RUNS, chunk.size // _SAMPLE_RUNS
        chunk = np.concatenate([chunk[i * gap : i * gap + run] for i in range(_SAMPLE_RUNS)])
    if chunk.size == 0:
        return 0.0
    counts = np.bincount(chunk, minlength=256)
    p = counts[counts > 0] / chunk.size
    return float(-(p * np.log2(p)).sum())
