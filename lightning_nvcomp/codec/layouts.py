"""Which layout codes a buffer smallest: byte planes by dtype (:func:`plane_layout`), and for gANS the chunk size
and typed model a sample prefers (:func:`choose_layout`); and the sizes samples code to (:func:`coded_nbytes`), which
such choices compare."""

from __future__ import annotations

import dataclasses

import torch

from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.engines import codes_on_gpu, engine_for
from lightning_nvcomp.codec.schema import Layout
from lightning_nvcomp.codec.segment import concatenate, decode_segment, encode_segment, pack

#: Uncompressed chunk size per (codec, device type), measured best on an H200 (benchmarks/codec_bench.py), within nvCOMP's
#: limits (gANS <= 16 MiB); typed gANS (``<f4``) runs fastest on larger chunks.
CHUNK_NBYTES = {("ans", "cuda"): 1 << 20, ("zstd", "cuda"): 64 << 10, ("zstd", "cpu"): 1 << 20, ("raw", "cpu"): 1 << 20}
TYPED_ANS_CHUNK_NBYTES = 4 << 20
#: gANS's smaller chunk, tried on a sample of each record against the default (H100, a trained GPT: Adam's second
#: moments code 0.4% smaller in 256 KiB chunks, its bf16 weights 0.3% larger).
ANS_SMALL_CHUNK_NBYTES = 256 << 10
#: gANS data types worth trying on whole numbers instead of byte planes (``<f2`` is never used: lossy on bf16).
_TYPED_ANS = {torch.float32: "<f4", torch.float8_e4m3fn: "|f1"}


def raw_layout() -> Layout:
    """The layout of bytes stored as they are (codec ``"raw"``, or no engine)."""
    return Layout(1, ("raw",), "|u1", CHUNK_NBYTES[("raw", "cpu")])


def plane_layout(engine: ChunkEngine | None, nbytes: int, dtype: torch.dtype, codec: str) -> Layout:
    """The byte-plane layout of ``nbytes`` of ``dtype`` coded with ``codec`` by ``engine`` (raw without one): planes by
    ``dtype`` (a float's top two rotated), every plane coded, chunk by chunk (the engine keeps a chunk raw where coding
    does not make it smaller)."""
    if engine is None:
        return raw_layout()
    width = byte_planes.plane_width(dtype)
    if nbytes % width:
        width = 1
    chunk = CHUNK_NBYTES[(codec, engine.device_type)]
    return Layout(width, (codec,) * width, "|u1", chunk, width > 1 and byte_planes.rotates(dtype))


def choose_layout(engine: ChunkEngine | None, data: torch.Tensor, dtype: torch.dtype, codec: str) -> Layout:
    """The layout that codes ``data`` smallest: byte planes by ``dtype`` (a float's top two rotated), every plane
    coded (each chunk is kept raw where coding does not make it smaller: the engine decides per chunk); for gANS, the
    chunk size that codes a sample smaller, and its typed model where it is smaller still and round-trips."""
    layout = plane_layout(engine, data.numel(), dtype, codec)
    if engine is None or codec != "ans" or data.numel() < 4096:
        return layout
    sample = _spread_sample(data)
    # gANS models each chunk on its own: smaller chunks follow a plane's statistics closer (Adam's second moments),
    # larger ones pay less for their tables (weights); the sample tells which.
    sizes = {
        candidate: sum(p.numel() for p in encode_segment(engine, sample, candidate))
        for candidate in {layout, dataclasses.replace(layout, chunk=ANS_SMALL_CHUNK_NBYTES)}
    }
    layout = min(sizes, key=lambda candidate: (sizes[candidate], -candidate.chunk))
    typed = _TYPED_ANS.get(dtype)
    if typed is None:
        return layout
    # Pick gANS's typed model over byte planes only where it is smaller on a sample AND round-trips bit-exactly.
    typed_layout = Layout(1, ("ans",), typed, TYPED_ANS_CHUNK_NBYTES)
    typed_pieces = encode_segment(engine, sample, typed_layout)
    if sum(p.numel() for p in typed_pieces) >= sizes[layout]:
        return layout
    check = torch.empty_like(sample)
    packed = pack(typed_pieces)
    decode_segment(engine, packed, [p.numel() for p in typed_pieces], [(0, check)], check.numel(), typed_layout)
    return typed_layout if torch.equal(check, sample) else layout


#: Windows a layout's sample is taken from, spread over the data. One 8 MiB window from the middle chose 1 MiB gANS
#: chunks for a trained GPT's Adam moments, which code 0.05% (first) and 0.44% (second) smaller in 256 KiB ones;
#: 4 windows of 2 MiB chose 256 KiB for its bf16 weights, 0.25% larger (H100, GPT 768x12): four of 4 MiB choose
#: the best of 1 MiB, 256 KiB, 128 KiB, 64 KiB and 32 KiB for every class.
_SAMPLE_WINDOWS = 4


#: Bytes of each window: several of the largest chunk per plane, so that the chunk sizes compare as they code.
_WINDOW_NBYTES = 4 << 20


def _spread_sample(data: torch.Tensor) -> torch.Tensor:
    """:data:`_SAMPLE_WINDOWS` windows of :data:`_WINDOW_NBYTES` spread evenly over ``data`` (all of it when it is
    smaller), each at a multiple of 64 bytes."""
    window = _WINDOW_NBYTES
    if data.numel() <= window * _SAMPLE_WINDOWS:
        return data
    gap = (data.numel() - window) // (_SAMPLE_WINDOWS - 1) // 64 * 64
    return concatenate([data[i * gap : i * gap + window] for i in range(_SAMPLE_WINDOWS)])


def coded_nbytes(windows: list[torch.Tensor], dtype: torch.dtype, codec: str) -> list[int]:
    """The bytes each of ``windows`` (samples of records, whole numbers of ``dtype``, each at most a chunk per plane,
    on one device) codes to with ``codec`` in its plane layout, all coded in one engine call: what a choice between
    ways of coding them compares."""
    device = windows[0].device
    engine = engine_for(codec, device)
    if engine is None:
        return [w.numel() for w in windows]
    layout = plane_layout(engine, 0, dtype, codec)
    flat, widths = byte_planes.split_many(windows, layout.planes, layout.rotate)
    if codes_on_gpu(engine, device) and device.type == "cpu":
        flat = flat.to(torch.device("cuda", torch.cuda.current_device()))
    spans, at = [], 0
    for window, width in zip(windows, widths):
        n = window.numel() // width
        spans.append([(at + k * n, n) for k in range(width)])
        at += window.numel()
    coded = iter(engine.encode(flat, [span for window in spans for span in window], codec, layout.data_type))
    return [sum(min(next(coded).numel(), n) for _, n in window) for window in spans]
