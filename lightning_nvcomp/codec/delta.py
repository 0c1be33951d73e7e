"""Delta transforms: a record's bytes coded against the same record of an earlier checkpoint of the run (its base).

Between two saves of a training run most bits of a tensor stay where they were: the sign and exponent of weights and
of Adam's second moments, the high mantissa bits of slowly moving weights. ``xor`` (the bytes XOR the base's) turns
those bits into zeros; ``sub`` (each number minus the base's, as integers of its width, wrapping) turns small moves
into small numbers. Either is undone exactly with the base's bytes: ``undo(apply(x, b), b) == x`` for all bytes, so
a delta is as lossless as the coder behind it. Which one pays is measured on each record (:func:`choose`), never
assumed: Adam's first moments forget their past within tens of steps, and code smaller alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

#: The transforms a record may be stored with.
TRANSFORMS = ("xor", "sub")

#: Bytes of a record each candidate transform is coded on to choose one (a window from its middle).
SAMPLE_NBYTES = 64 << 10

_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_INTEGER = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def width(dtype: torch.dtype) -> int:
    """The bytes of one number of ``dtype`` that ``sub`` treats as an integer (a complex number: each of its floats)."""
    size = torch.empty(0, dtype=dtype).element_size()
    return size // 2 if dtype.is_complex else size


def apply(transform: str, data: torch.Tensor, base: torch.Tensor, itemsize: int, out: torch.Tensor) -> None:
    """Write ``transform`` of the 1-D uint8 ``data`` against ``base`` (the same size, on the same device) into
    ``out`` (which may be ``base``), ``itemsize`` bytes per number."""
    _run(transform, data, base, itemsize, out, inverse=False)


def undo(transform: str, data: torch.Tensor, base: torch.Tensor, itemsize: int) -> None:
    """Undo ``transform`` in place: ``data`` (as :func:`apply` wrote it) becomes the bytes it was made from."""
    _run(transform, data, base, itemsize, data, inverse=True)


def _run(
    transform: str, data: torch.Tensor, base: torch.Tensor, itemsize: int, out: torch.Tensor, inverse: bool
) -> None:
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown delta transform {transform!r}; expected one of {TRANSFORMS}")
    if data.numel() != base.numel() or data.numel() != out.numel():
        raise ValueError(f"a delta of {data.numel()} bytes against a base of {base.numel()}")
    # XOR is bytewise: any width does; 8 bytes at a time where the sizes allow it
    step = itemsize if transform == "sub" else (8 if data.numel() % 8 == 0 else 1)
    if data.numel() % step:
        raise ValueError(f"a delta of {data.numel()} bytes is not whole {step}-byte numbers")
    if data.device.type == "cpu":
        kind = _NUMPY_INTEGER[step]
        a, b, o = (t.numpy().view(kind) for t in (data, base, out))
        op: Callable = np.bitwise_xor if transform == "xor" else (np.add if inverse else np.subtract)
        op(a, b, out=o)
        return
    kind_t = _INTEGER[step]
    a, b, o = (t.view(kind_t) for t in (data, base, out))
    if transform == "xor":
        torch.bitwise_xor(a, b, out=o)
    elif inverse:  # integer arithmetic wraps on the GPU as on the CPU
        torch.add(a, b, out=o)
    else:
        torch.sub(a, b, out=o)


def choose(
    data: torch.Tensor, base: torch.Tensor, itemsize: int, coded_nbytes: Callable[[torch.Tensor], int]
) -> str | None:
    """The transform that codes a window of ``data`` smallest against ``base`` (``coded_nbytes``: the size a buffer
    codes to), or None where the record alone codes smaller than with every transform."""
    n = data.numel()
    length = min(n, SAMPLE_NBYTES) // 64 * 64
    if length == 0:
        return None
    start = (n - length) // 2 // 64 * 64
    window, base_window = data[start : start + length], base[start : start + length]
    sizes: dict[str | None, int] = {None: coded_nbytes(window)}
    scratch = torch.empty_like(window)
    for transform in TRANSFORMS:
        apply(transform, window, base_window, itemsize, scratch)
        sizes[transform] = coded_nbytes(scratch)
    return min(sizes, key=lambda t: (sizes[t], t is not None))
