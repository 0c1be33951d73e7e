"""Tensors and states for the tests: bit-exact comparisons and the data they are made of.

Bit-exact means the same bytes: tensors are compared as integers of their element width, never as floats, so NaN
payloads, -0.0 and signalling bits count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from lightning_nvcomp.format import DTYPES
from lightning_nvcomp.saving.writer import CheckpointWriter

#: Integer dtype of each element size: viewing a tensor as one of these is a pure reinterpretation of its bits
#: (allowed for any strides, 0-d included), after which copies cannot touch NaN payloads or signalling bits.
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The logical elements of ``t`` (any strides, 0-d or empty) as a flat uint8 tensor, in row-major order.

    No arithmetic or float copy is involved: the tensor is first reinterpreted as integers of the same width
    (complex as pairs of floats), so every bit pattern, NaN payloads included, survives unchanged.
    """
    if t.is_conj() or t.is_neg():
        raise AssertionError("tensor_bytes needs a tensor without a lazy conj/neg bit")
    if t.is_complex():
        t = torch.view_as_real(t)
    ints = t.view(_BITS_DTYPE[t.dtype.itemsize])
    # a fresh buffer: .contiguous() keeps odd strides of size-1 and empty dims, which .view(uint8) refuses
    flat = torch.empty(ints.numel(), dtype=ints.dtype).copy_(ints.reshape(-1))
    return flat.view(torch.uint8)


def assert_bit_exact(a: torch.Tensor, b: torch.Tensor, *, check_type: bool = False) -> None:
    """Assert that ``a`` and ``b`` have the same dtype, shape and strides and bit-identical elements.

    With ``check_type``, also the same Python type (Parameter vs Tensor) and ``requires_grad``.
    """
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), (type(a), type(b))
    assert a.dtype == b.dtype, f"dtype {a.dtype} != {b.dtype}"
    assert tuple(a.shape) == tuple(b.shape), f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.stride() == b.stride(), f"stride {a.stride()} != {b.stride()}"
    assert a.layout == b.layout == torch.strided
    if check_type:
        assert type(a) is type(b), f"type {type(a).__name__} != {type(b).__name__}"
        assert a.requires_grad == b.requires_grad, f"requires_grad {a.requires_grad} != {b.requires_grad}"
    ba, bb = tensor_bytes(a.detach()), tensor_bytes(b.detach())
    if not torch.equal(ba, bb):
        diff = (ba != bb).nonzero()
        first = int(diff[0]) if diff.numel() else -1
        raise AssertionError(f"bytes differ: {diff.numel()} of {ba.numel()} bytes, first at byte {first}")


def assert_tree_bit_exact(a: object, b: object, path: str = "<root>", *, check_type: bool = True) -> None:
    """Recursively compare dicts / lists / tuples / tensors / plain values; tensors bit-exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b).__name__} instead of a tensor"
        try:
            assert_bit_exact(a, b, check_type=check_type)
        except AssertionError as err:
            raise AssertionError(f"{path}: {err}") from None
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{path}: {type(b).__name__} instead of a mapping"
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_tree_bit_exact(a[key], b[key], f"{path}.{key}", check_type=check_type)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(b).__name__} instead of {type(a).__name__}"
        assert len(a) == len(b), f"{path}: length {len(b)} != {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree_bit_exact(x, y, f"{path}.{i}", check_type=check_type)
    else:
        assert type(a) is type(b) and a == b, f"{path}: {b!r} != {a!r}"


def zeros_like_state(state: dict) -> dict:
    """A flat state of the same tensors, zeroed (a load target), and 0 for every plain value."""
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}


def assert_state_equal(loaded: dict, state: dict) -> None:
    """Every tensor of a flat ``state`` bit-exactly in ``loaded``, every plain value equal."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert_bit_exact(loaded[key], value)
        else:
            assert loaded[key] == value


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A contiguous tensor of ``dtype`` filled with uniformly random bytes (bool: 0/1 only).

    Random bytes hit every bit pattern a dtype has: NaNs with payloads, infinities, denormals, -0.0.
    """
    gen = torch.Generator().manual_seed(seed)
    numel = 1
    for n in shape:
        numel *= n
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen, dtype=torch.uint8).bool()
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def trained_like(numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Weights like a trained network's: normal(0, 0.02), cast to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(numel, generator=gen) * 0.02).to(dtype)


def special_floats(dtype: torch.dtype) -> torch.Tensor:
    """NaNs with payloads (both signs, quiet and signalling), +-inf, +-0.0, denormals, extremes for ``dtype``."""
    if dtype == torch.float32:
        bits = [
            0x7FC00001,
            0xFFC12345,
            0x7F800001,
            0xFF800003,
            0x7F800000,
            0xFF800000,
            0x80000000,
            0x00000000,
            0x00000001,
            0x807FFFFF,
            0x00400000,
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x3F800000,
        ]
        return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(dtype)
    if dtype == torch.float64:
        bits = [
            0x7FF8000000000001,
            0xFFF8DEADBEEF0001,
            0x7FF0000000000001,
            0x7FF0000000000000,
            0xFFF0000000000000,
            0x8000000000000000,
            0x0000000000000001,
            0x800FFFFFFFFFFFFF,
            0x3FF0000000000000,
        ]
        return torch.tensor([b - (1 << 64) if b >= 1 << 63 else b for b in bits], dtype=torch.int64).view(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        if dtype == torch.float16:
            bits = [0x7E01, 0xFE33, 0x7C01, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x83FF, 0x3C00]
        else:
            bits = [0x7FC1, 0xFFA5, 0x7F81, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F, 0x3F80]
        return torch.tensor([b - (1 << 16) if b >= 1 << 15 else b for b in bits], dtype=torch.int16).view(dtype)
    if dtype.itemsize == 1:  # float8 variants, bool, int8, uint8: every byte value
        return torch.arange(256, dtype=torch.uint8).view(dtype) if dtype != torch.bool else torch.tensor([0, 1]).bool()
    raise ValueError(dtype)


FLOAT_DTYPES_WITH_SPECIALS = [torch.float32, torch.float64, torch.float16, torch.bfloat16] + [
    d for n, d in DTYPES.items() if n.startswith("float8")
]


def save_as_training_goes_on(writer: CheckpointWriter, state_at: Callable[[int], dict], steps: range) -> None:
    """Save ``state_at(step)`` to ``step{step}.ckpt`` for each of ``steps`` through a ``CheckpointWriter`` as Lightning
    does (save, then commit), zeroing the live tensors as each save returns (training going on while a write runs
    behind it), then close the writer."""
    for step in steps:
        live = state_at(step)
        writer.save(live, f"step{step}.ckpt")
        writer.commit(step, f"step{step}.ckpt")
        for tensor in live.values():
            tensor.zero_()
    writer.close()
