"""Checksums of large buffers, computed on CPU threads in pieces: CRC-32C (records from format 3: the CPU's own
instruction, ~14 GB/s on one core) and zlib's CRC-32 (the zip format's, and records before format 3, ~3.8 GB/s).

A buffer is cut into :data:`PIECE_NBYTES` pieces, each piece's CRC is computed on a thread (both release the GIL),
and the pieces' CRCs are combined as zlib's ``crc32_combine`` does (neither library exposes it).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import crc32c
import numpy as np
import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec.cpu import cpu_threads

PIECE_NBYTES = 8 << 20
#: :func:`crc32_batch` computes the CRC-32s of host blobs no larger than this in the calling thread.
INLINE_NBYTES = 5 << 10
#: The checksums by name: the function (bytes, running value) and the bit-reflected polynomial.
ALGORITHMS: dict[str, tuple[Callable[..., int], int]] = {
    "crc32": (zlib.crc32, 0xEDB88320),
    "crc32c": (crc32c.crc32c, 0x82F63B78),
}
_ONE = 1 << 31  # the polynomial 1 (x^0), bit-reflected


def _multmodp(a: int, b: int, poly: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial ``poly`` (bit-reflected, as in zlib)."""
    product, bit = 0, _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return product


@functools.cache
def _x_pow_8n(n: int, poly: int) -> int:
    """x^(8n) modulo the CRC polynomial: the operator that appends n zero bytes to a CRC."""
    result, square = _ONE, 1 << 23  # square starts at x^8 (one byte)
    while n:
        if n & 1:
            result = _multmodp(square, result, poly)
        square = _multmodp(square, square, poly)
        n >>= 1
    return result


def combine(crc1: int, crc2: int, len2: int, algorithm: str = "crc32") -> int:
    """The CRC of A + B from crc1 = CRC(A), crc2 = CRC(B) and len2 = len(B)."""
    poly = ALGORITHMS[algorithm][1]
    return _multmodp(_x_pow_8n(len2, poly), crc1, poly) ^ crc2


def _pool() -> ThreadPoolExecutor:
    return shared("crc-pool", lambda: ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="lnv-crc"))


def submit(function: Callable[..., int], *args: object) -> Future:
    """``function(*args)`` (a copy and checksum, say) on the CRC threads."""
    return _pool().submit(function, *args)


def _piece(data: np.ndarray, ready: torch.cuda.Event | None, algorithm: str) -> int:
    if ready is not None:  # a device-to-host copy into `data` must have landed first
        ready.synchronize()
    return ALGORITHMS[algorithm][0](memoryview(data))


class Crc32:
    """The CRC of a 1-D uint8 CPU tensor (or array), computed in the background; :meth:`result` waits for it.

    Args:
        data: the bytes; they must not change until the result is in.
        ready: a CUDA event recorded after the copy that fills ``data`` (the pieces wait for it).
        algorithm: a name in :data:`ALGORITHMS`.
    """

    def __init__(
        self, data: torch.Tensor | np.ndarray, ready: torch.cuda.Event | None = None, algorithm: str = "crc32"
    ) -> None:
        array = data if isinstance(data, np.ndarray) else data.numpy()
        self._algorithm = algorithm
        self._pieces: list[tuple[Future, int]] = [
            (
                _pool().submit(_piece, array[i : i + PIECE_NBYTES], ready, algorithm),
                min(PIECE_NBYTES, array.size - i),
            )
            for i in range(0, array.size, PIECE_NBYTES)
        ]

    def result(self) -> int:
        crc = 0
        for future, nbytes in self._pieces:
            crc = combine(crc, future.result(), nbytes, self._algorithm)
        return crc


class BatchCrc32:
    """One of the CRCs :func:`crc32_batch` computes together; :meth:`result` waits for them."""

    __slots__ = ("_future", "_index")

    def __init__(self, future: Future, index: int) -> None:
        self._future, self._index = future, index

    def result(self) -> int:
        return self._future.result()[self._index]


#: A CRC-32 as a number, or still being computed.
Checksum = Crc32 | BatchCrc32 | int


def value(crc: Checksum) -> int:
    """A CRC-32 that may still be computing, as a number (waits for it)."""
    return crc if isinstance(crc, int) else crc.result()


def crc32_batch(
    blobs: list[torch.Tensor], ready: torch.cuda.Event | None = None, algorithm: str = "crc32"
) -> list[Checksum]:
    """The CRCs of many small 1-D uint8 CPU tensors, computed in a few tasks on the CRC threads, each over runs
    of about :data:`PIECE_NBYTES` (one hand-off per run instead of one per blob, and the runs in parallel); blobs
    all of at most :data:`INLINE_NBYTES` in host memory, here. ``ready`` and ``algorithm``: as for :class:`Crc32`."""
    function = ALGORITHMS[algorithm][0]

    def run(part: list[torch.Tensor]) -> list[int]:
        if ready is not None:
            ready.synchronize()
        return [function(memoryview(blob.numpy())) for blob in part]

    if ready is None and all(blob.numel() <= INLINE_NBYTES for blob in blobs):
        # Small blobs in host memory: here and now. The CRC holds the GIL on buffers this small, so a thread would run
        # them no sooner, only contend with this one for the GIL.
        return [function(memoryview(blob.numpy())) for blob in blobs]
    out: list[Checksum] = []
    start, nbytes = 0, 0
    for end, blob in enumerate(blobs, 1):
        nbytes += blob.numel()
        if nbytes >= PIECE_NBYTES or end == len(blobs):
            future = _pool().submit(run, blobs[start:end])
            out.extend(BatchCrc32(future, i) for i in range(end - start))
            start, nbytes = end, 0
    return out


#: Bytes :func:`copy_checked` copies and then checksums at a time: they are still in the core's cache for the CRC.
COPY_WINDOW_NBYTES = 256 << 10


def copy_checked(stored: torch.Tensor, pieces: list[tuple[int, torch.Tensor]], algorithm: str) -> int:
    """Copy ``pieces`` (offsets in the 1-D uint8 CPU tensor ``stored`` and the CPU tensors that receive their bytes)
    out of ``stored`` and return the CRC of all of ``stored``, each window checksummed right after it is copied: the
    bytes are read from memory once, where a CRC first and a copy after read them twice (bytes stored as they are).
    With no pieces: the CRC alone, computed in this thread."""
    function = ALGORITHMS[algorithm][0]
    src = stored.numpy()
    crc, done = 0, 0  # the CRC of src[:done]
    for offset, out in sorted(pieces, key=lambda piece: piece[0]):
        dst = out.numpy()
        for start in range(offset, offset + dst.size, COPY_WINDOW_NBYTES):
            end = min(start + COPY_WINDOW_NBYTES, offset + dst.size)
            dst[start - offset : end - offset] = src[start:end]
            if end > done:  # pieces that overlap are checksummed once
                crc, done = function(memoryview(src[done:end]), crc), end
    return function(memoryview(src[done:]), crc)


def crc32(data: torch.Tensor | np.ndarray, algorithm: str = "crc32") -> int:
    """The CRC of a 1-D uint8 CPU tensor (or array: a read-only buffer's, say), its pieces computed in parallel
    (a small one right here)."""
    array = data if isinstance(data, np.ndarray) else data.numpy()
    if array.size <= PIECE_NBYTES:
        return ALGORITHMS[algorithm][0](memoryview(array))
    return Crc32(array, algorithm=algorithm).result()
