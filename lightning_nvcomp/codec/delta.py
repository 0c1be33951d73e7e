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
    if data.device.type == "cpu":  # numpy: ~3x faster than torch on the CPU for these
        kind = _NUMPY_INTEGER[step]
        arrays = [t.numpy().view(kind) for t in (data, base, out)]
        op: Callable = np.bitwise_xor if transform == "xor" else (np.add if inverse else np.subtract)
        op(arrays[0], arrays[1], out=arrays[2])
        return
    kind_t = _INTEGER[step] if transform == "sub" else torch.uint8  # XOR's bytes as they are: no views to launch
    tensors = [t.view(kind_t) if t.dtype != kind_t else t for t in (data, base, out)]
    # integer arithmetic wraps on the GPU as on the CPU
    gpu_op: Callable = torch.bitwise_xor if transform == "xor" else (torch.add if inverse else torch.sub)
    gpu_op(tensors[0], tensors[1], out=tensors[2])


def choose(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    itemsize: int,
    coded_nbytes: Callable[[list[torch.Tensor]], list[int]],
) -> list[str | None]:
    """For each (data, base) pair, the transform that codes a window of ``data`` (:data:`SAMPLE_NBYTES` from its
    middle) smallest against the same window of ``base``, or None where the data alone codes smaller than with every
    transform. ``coded_nbytes`` gives the sizes a list of buffers codes to: the windows of all pairs are transformed
    and coded together, one call per candidate (on a GPU, one nvCOMP call instead of hundreds)."""
    windows, base_windows = [], []
    for data, base in pairs:
        n = data.numel()
        # whole 128 bytes: each plane of a window of 8-byte numbers is a 16-byte multiple, as nvCOMP's chunks must be
        length = max(128, min(n, SAMPLE_NBYTES) // 128 * 128)
        start = (n - length) // 2 // 128 * 128
        windows.append(data[start : start + length])
        base_windows.append(base[start : start + length])
    if not windows:
        return []
    sizes: dict[str | None, list[int]] = {None: coded_nbytes(windows)}
    lengths = [window.numel() for window in windows]
    joined, base_joined = torch.cat(windows), torch.cat(base_windows)
    for transform in TRANSFORMS:
        out = torch.empty_like(joined)
        apply(transform, joined, base_joined, itemsize, out)  # all windows at once: whole numbers each
        sizes[transform] = coded_nbytes(list(out.split(lengths)))
    return [min(sizes, key=lambda t: (sizes[t][i], t is not None)) for i in range(len(windows))]
