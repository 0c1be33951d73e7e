"""CPU chunk engine: standard zstd frames through the ``zstandard`` package, chunks coded on parallel threads.

Every frame carries its content size, so frames written here decode on the GPU with nvCOMP's RAW Zstd and
frames nvCOMP writes decode here.

A chunk is coded as literals alone (zstd's Huffman coder with no matches, through ``ZSTD_compressSequences`` given no
sequences), in blocks of the size that codes its first :data:`_PROBE_NBYTES` smaller (:data:`BLOCK_NBYTES`), or with
zstd's match finder where that codes those first bytes 10% smaller still (runs, repeated rows); the smaller frame is
kept, and the frames are standard either way. On a float's exponent plane matches cost more than they find (2.37
against 2.30 bits per byte on trained weights). A chunk whose sampled order-0 entropy reaches
:data:`~lightning_nvcomp.codec.planes.RAW_ENTROPY_BITS` is not coded at all: it stays raw.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zstandard
from zstandard import backend_cffi

from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.engine import ChunkEngine, Span

#: zstd settings for CPU encoding. Byte planes have almost no repeats to find: a tiny match finder (64-entry hash
#: table, matches of 7+ bytes) leaves the work to the entropy coder, and on exponent planes it both compresses
#: better than level 1 (2.94x vs 2.71x) and runs ~2.8x faster. The frames are standard zstd frames.
ZSTD_PARAMETERS = dict(
    window_log=20, hash_log=6, chain_log=6, search_log=1, min_match=7, target_length=0, write_content_size=True
)


#: Chunks are coded on the threads in runs of at least this many bytes (a calling thread codes fewer itself): a
#: hand-off costs as much as coding ~50 KB.
_TASK_NBYTES = 256 << 10


def _groups(lengths: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of consecutive chunks of at least :data:`_TASK_NBYTES` each (the last may be less)."""
    groups, start, nbytes = [], 0, 0
    for i, n in enumerate(lengths):
        nbytes += n
        if nbytes >= _TASK_NBYTES:
            groups.append((start, i + 1))
            start, nbytes = i + 1, 0
    if start < len(lengths) or not groups:
        groups.append((start, len(lengths)))
    return groups


def cpu_threads() -> int:
    """Threads used for CPU coding: ``LIGHTNING_NVCOMP_THREADS`` or the cores this process may run on."""
    configured = os.environ.get("LIGHTNING_NVCOMP_THREADS")
    if configured:
        return max(1, int(configured))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: The literals-only frames' largest blocks, one tried against the other on each chunk's first bytes: each block has
#: a Huffman table of its own, and blocks of 16 KiB follow a plane's statistics closely (exponent bits per byte on a
#: trained GPT against zstd's 128 KiB: 2.94 against 3.07 for Adam's second moments), where 64 KiB ones pay less for
#: their tables (bf16 weights).
BLOCK_NBYTES = (16 << 10, 64 << 10)
#: The bytes of a chunk both coders try first, to tell whether matches pay on it.
_PROBE_NBYTES = 64 << 10


def _compress_bound(nbytes: int) -> int:
    """zstd's ``ZSTD_COMPRESSBOUND`` (zstd.h): the largest frame ``nbytes`` code to. Computed here, not called: every
    call into zstd through cffi lets the GIL go, and beside a thread running Python each costs up to a switch interval
    to take it back."""
    return nbytes + (nbytes >> 8) + (((128 << 10) - nbytes) >> 11 if nbytes < 128 << 10 else 0)


def _zstd_error(result: int) -> str:
    """zstd's name for the error code ``result``."""
    lib, ffi = backend_cffi.lib, backend_cffi.ffi
    return ffi.string(lib.ZSTD_getErrorName(result)).decode()


class _LiteralCoder:
    """zstd frames of literals alone: each block's bytes Huffman-coded (or stored), no matches searched. One per
    thread: a zstd context is not thread-safe."""

    def __init__(self, block_nbytes: int) -> None:
        lib, ffi = backend_cffi.lib, backend_cffi.ffi
        self._cctx = ffi.gc(lib.ZSTD_createCCtx(), lib.ZSTD_freeCCtx)
        if not self._cctx:
            raise MemoryError("zstd could not allocate a compression context")
        settings = (
            (lib.ZSTD_c_contentSizeFlag, 1),
            (lib.ZSTD_c_checksumFlag, 0),
            (lib.ZSTD_c_maxBlockSize, block_nbytes),
        )
        for parameter, value in settings:
            self._check(lib.ZSTD_CCtx_setParameter(self._cctx, parameter, value))
        self._no_sequences = ffi.new("ZSTD_Sequence[1]")

    @staticmethod
    def _check(result: int) -> None:
        if backend_cffi.lib.ZSTD_isError(result):
            raise RuntimeError(f"zstd: {_zstd_error(result)}")

    def compress(self, chunk: np.ndarray) -> torch.Tensor:
        lib, ffi = backend_cffi.lib, backend_cffi.ffi
        capacity = _compress_bound(chunk.size)
        out = bytearray(capacity)
        n = lib.ZSTD_compressSequences(
            self._cctx, ffi.from_buffer(out), capacity, self._no_sequences, 0, ffi.from_buffer(chunk), chunk.size
        )
        if n > capacity:  # zstd's error codes are the largest size_t values: no size fits (one C call fewer a chunk)
            raise RuntimeError(f"zstd: {_zstd_error(n)}")
        return torch.frombuffer(out, dtype=torch.uint8)[:n]


class _FrameDecoder:
    """zstd frames decoded straight into their destination (``zstandard``'s ``decompress`` returns new bytes, which
    cost an allocation and a copy). One per thread, as contexts are."""

    def __init__(self) -> None:
        lib, ffi = backend_cffi.lib, backend_cffi.ffi
        self._dctx = ffi.gc(lib.ZSTD_createDCtx(), lib.ZSTD_freeDCtx)
        if not self._dctx:
            raise MemoryError("zstd could not allocate a decompression context")

    def decode_into(self, frame: np.ndarray, out: np.ndarray) -> None:
        """Decode the frame into ``out``, which its content must fill exactly (bytes after the frame are ignored)."""
        lib, ffi = backend_cffi.lib, backend_cffi.ffi
        source = ffi.from_buffer(frame)
        declared = lib.ZSTD_getFrameContentSize(source, frame.size)
        if declared != out.size:  # checked before decoding: a crafted frame must not make us allocate its claim
            raise ValueError(f"zstd frame declares {_content_size(declared)} bytes, expected {out.size}")
        n = lib.ZSTD_decompressDCtx(
            self._dctx, ffi.from_buffer(out, require_writable=True), out.size, source, frame.size
        )
        if n == out.size:
            return
        if lib.ZSTD_isError(n):
            raise ValueError(f"zstd frame does not decode: {_zstd_error(n)}")
        raise ValueError(f"zstd frame decodes to {n} bytes, expected {out.size}")


def _content_size(declared: int) -> str:
    """A frame's content size as zstd reports it: a number, or one of its two error values."""
    lib = backend_cffi.lib
    return {lib.ZSTD_CONTENTSIZE_UNKNOWN: "no", lib.ZSTD_CONTENTSIZE_ERROR: "an unreadable"}.get(
        declared, str(declared)
    )


class CpuZstdEngine(ChunkEngine):
    """zstd on the CPU; ``zstandard`` releases the GIL, so a thread pool scales with cores."""

    device_type = "cpu"
    codecs = ("zstd",)

    def __init__(self, threads: int | None = None) -> None:
        self._parameters = zstandard.ZstdCompressionParameters(strategy=zstandard.STRATEGY_FAST, **ZSTD_PARAMETERS)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads or cpu_threads(), thread_name_prefix="lnv-zstd")

    def _compressor(self) -> zstandard.ZstdCompressor:
        if not hasattr(self._local, "cctx"):  # zstd contexts are not thread-safe: one per thread
            self._local.cctx = zstandard.ZstdCompressor(compression_params=self._parameters)
            self._local.literals = [_LiteralCoder(n) for n in BLOCK_NBYTES]
            self._local.dctx = _FrameDecoder()
        return self._local.cctx

    def _decompressor(self) -> _FrameDecoder:
        self._compressor()
        return self._local.dctx

    def _literal_coders(self) -> list[_LiteralCoder]:
        self._compressor()
        return self._local.literals

    def _encode_one(self, chunk: np.ndarray) -> torch.Tensor:
        """The chunk's smallest frame, by what its first bytes tell; the chunk itself (stays raw) where it is not worth
        coding."""
        if byte_planes.sampled_entropy_bits(chunk) >= byte_planes.RAW_ENTROPY_BITS:
            return torch.from_numpy(chunk)
        probe = chunk[:_PROBE_NBYTES]
        # a probe no larger than the smallest block is one block either way: both coders write the same frame
        coders = self._literal_coders()[: 1 if probe.size <= BLOCK_NBYTES[0] else None]
        frames = [(c, c.compress(probe)) for c in coders]
        coder, probe_frame = min(frames, key=lambda pair: pair[1].numel())
        probed = probe_frame.numel()
        whole = probe.size == chunk.size  # a small chunk is its probe
        literals = probe_frame if whole else coder.compress(chunk)
        if literals.numel() >= chunk.size:
            return literals
        matched = self._compressor().compress(memoryview(probe))
        if len(matched) >= 0.9 * probed:
            return literals  # matches pay only where they code the first bytes 10% smaller than literals do
        if not whole:
            matched = self._compressor().compress(memoryview(chunk))
        if literals.numel() <= len(matched):
            return literals
        return torch.frombuffer(bytearray(matched), dtype=torch.uint8)

    def encode(self, src: torch.Tensor, spans: list[Span], codec: str, data_type: str) -> list[torch.Tensor]:
        if codec != "zstd":
            raise ValueError(f"the CPU engine runs zstd only, not {codec!r}")
        data = src.numpy()
        groups = _groups([n for _, n in spans])
        if len(groups) == 1:  # a few small chunks: threads would cost more than coding them here
            return [self._encode_one(data[o : o + n]) for o, n in spans]
        coded = self._pool.map(lambda g: [self._encode_one(data[o : o + n]) for o, n in spans[g[0] : g[1]]], groups)
        return [frame for group in coded for frame in group]

    def _decode_one(self, pair: tuple[np.ndarray, np.ndarray]) -> None:
        self._decompressor().decode_into(*pair)

    def _decode_run(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for pair in pairs:
            self._decode_one(pair)

    def decode(
        self, src: torch.Tensor, spans: list[Span], dst: torch.Tensor, dst_spans: list[Span], codec: str, data_type: str
    ) -> None:
        if codec != "zstd":
            raise ValueError(f"the CPU engine runs zstd only, not {codec!r}")
        frames, outs = src.numpy(), dst.numpy()
        pairs = [(frames[o : o + n], outs[d : d + m]) for (o, n), (d, m) in zip(spans, dst_spans)]
        groups = _groups([m for _, m in dst_spans])
        if len(groups) == 1:
            self._decode_run(pairs)
            return
        for _ in self._pool.map(lambda g: self._decode_run(pairs[g[0] : g[1]]), groups):
            pass
