"""Records: a buffer of numbers compressed into one blob, plus the small dict that says how to decode it.

The layout, whole:

* The record's ``nbytes`` raw bytes are cut into segments of ``segment`` bytes (the last may be shorter).
* Each segment is split into ``planes`` byte planes (see :mod:`.planes`; 1 plane = the bytes as they are).
* Each plane is cut into chunks of ``chunk`` bytes (the last may be shorter).
* Each chunk is stored coded with its plane's codec ``codecs[k]`` (``"ans"``, ``"zstd"`` or ``"raw"``), or raw
  when coding would not make it smaller. ``data_type`` is the type nvCOMP's gANS modelled (``"|u1"``: bytes).
* ``sizes`` lists the stored size of every chunk: segment by segment, plane by plane, chunk by chunk. A stored
  size equal to the chunk's raw size means the chunk is stored raw. The blob is all stored chunks in order, each
  followed by zero bytes up to a multiple of 16 (nvCOMP reads chunks at 16-byte aligned addresses).
* ``crc32[s]`` is the CRC-32 of segment ``s``'s stored bytes, checked before anything is decoded.

Every field is validated against the blob before a byte is decoded: the dict may come from a hostile file.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import torch

from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.cpu import CpuZstdEngine
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.gpu import NvcompEngine, gpu_available, nvcomp_version
from lightning_nvcomp.errors import CodecUnavailableError, CorruptCheckpointError

FORMAT_VERSION = 1
#: Codecs a save can ask for. ``"raw"`` stores bytes as they are (still checksummed).
CODECS = ("ans", "zstd", "raw")
SEGMENT_NBYTES = 64 << 20
#: Uncompressed chunk size per (codec, device type): small enough for GPU parallelism and nvCOMP's limits.
CHUNK_NBYTES = {("ans", "cuda"): 1 << 20, ("zstd", "cuda"): 256 << 10, ("zstd", "cpu"): 1 << 20, ("raw", "cpu"): 1 << 20}
#: gANS data types worth trying on whole numbers instead of byte planes (``<f2`` is never used: lossy on bf16).
_TYPED_ANS = {torch.float32: "<f4", torch.float8_e4m3fn: "|f1"}
_DATA_TYPES = ("|u1", "<f4", "|f1")
_TYPED_SAMPLE_NBYTES = 8 << 20
_MAX_NBYTES = 1 << 48
_CHUNK_ALIGN = 16


def _padded(n: int) -> int:
    return -(-n // _CHUNK_ALIGN) * _CHUNK_ALIGN


def _pack(pieces: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate stored chunks, each padded with zeros to a multiple of 16 bytes (on their device)."""
    if not pieces:
        return torch.empty(0, dtype=torch.uint8)
    device = pieces[0].device
    pads = {n: torch.zeros(n, dtype=torch.uint8, device=device) for n in {_padded(p.numel()) - p.numel() for p in pieces}}
    return torch.cat([part for p in pieces for part in (p, pads[_padded(p.numel()) - p.numel()])])


def _unpack(stored: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The chunks of a packed buffer, by their stored sizes (the inverse of :func:`_pack`)."""
    pieces, pos = [], 0
    for n in sizes:
        pieces.append(stored[pos : pos + n])
        pos += _padded(n)
    return pieces


@dataclass(frozen=True)
class _Layout:
    planes: int
    codecs: tuple[str, ...]
    data_type: str
    chunk: int


def engine_for(codec: str, device: torch.device) -> ChunkEngine | None:
    """The engine that codes ``codec`` for data on ``device`` (None for ``"raw"``).

    Raises CodecUnavailableError for gANS without a GPU and nvCOMP.
    """
    if codec == "raw":
        return None
    if codec == "ans":
        if not gpu_available():
            raise CodecUnavailableError(
                "gANS needs a CUDA GPU and nvCOMP (pip install 'lightning-nvcomp[cu12]'); it has no CPU coder"
            )
        return _nvcomp_engine()
    if codec == "zstd":
        return _nvcomp_engine() if device.type == "cuda" and gpu_available() else _cpu_engine()
    raise ValueError(f"unknown codec {codec!r}; expected one of {CODECS}")


@functools.cache
def _cpu_engine() -> ChunkEngine:
    return CpuZstdEngine()


@functools.cache
def _nvcomp_engine() -> ChunkEngine:
    return NvcompEngine()


def _segments(nbytes: int, segment: int) -> list[tuple[int, int]]:
    return [(start, min(segment, nbytes - start)) for start in range(0, nbytes, segment)]


def _encode_segment(engine: ChunkEngine | None, seg: torch.Tensor, layout: _Layout) -> list[torch.Tensor]:
    plane_data = byte_planes.split(seg, layout.planes)
    per_plane = [list(plane_data[k].split(layout.chunk)) for k in range(layout.planes)]
    stored = [list(chunks) for chunks in per_plane]
    for codec in sorted(set(layout.codecs) - {"raw"}):
        ks = [k for k in range(layout.planes) if layout.codecs[k] == codec]
        coded = engine.encode([c for k in ks for c in per_plane[k]], codec, layout.data_type)
        pos = 0
        for k in ks:
            for j, raw in enumerate(per_plane[k]):
                if coded[pos].numel() < raw.numel():
                    stored[k][j] = coded[pos]
                pos += 1
    return [piece for plane in stored for piece in plane]


def _choose_layout(engine: ChunkEngine | None, data: torch.Tensor, dtype: torch.dtype, codec: str) -> _Layout:
    if engine is None:
        return _Layout(1, ("raw",), "|u1", CHUNK_NBYTES[("raw", "cpu")])
    chunk = CHUNK_NBYTES[(codec, engine.device_type)]
    width = byte_planes.plane_width(dtype)
    if data.numel() % width:
        width = 1
    bits = byte_planes.entropy_bits(data, width)
    layout = _Layout(width, tuple(codec if b < byte_planes.RAW_ENTROPY_BITS else "raw" for b in bits), "|u1", chunk)
    typed = _TYPED_ANS.get(dtype) if codec == "ans" else None
    if typed is None or data.numel() < 4096:
        return layout
    # Pick gANS's typed model over byte planes only where it is smaller on a sample AND round-trips bit-exactly.
    start = (data.numel() // 2 - _TYPED_SAMPLE_NBYTES // 2) // 64 * 64
    sample = data[max(0, start) : max(0, start) + _TYPED_SAMPLE_NBYTES]
    typed_layout = _Layout(1, ("ans",), typed, chunk)
    typed_pieces = _encode_segment(engine, sample, typed_layout)
    planes_size = sum(p.numel() for p in _encode_segment(engine, sample, layout))
    if sum(p.numel() for p in typed_pieces) >= planes_size:
        return layout
    check = torch.empty_like(sample)
    packed = _pack(typed_pieces)
    _decode_segment(engine, packed, [p.numel() for p in typed_pieces], check, typed_layout)
    return typed_layout if torch.equal(check, sample) else layout


def encode(data: torch.Tensor, dtype: torch.dtype, codec: str) -> tuple[torch.Tensor, dict]:
    """Compress ``data`` (1-D contiguous uint8: the bytes of numbers of ``dtype``) with ``codec``.

    Returns the blob (a CPU uint8 tensor) and the record dict describing it.
    """
    engine = engine_for(codec, data.device)
    if engine is not None and data.device.type != engine.device_type:
        data = data.to("cuda" if engine.device_type == "cuda" else "cpu")
    layout = _choose_layout(engine, data, dtype, codec)
    blobs, sizes, crcs = [], [], []
    for start, length in _segments(data.numel(), SEGMENT_NBYTES):
        pieces = _encode_segment(engine, data[start : start + length], layout)
        host = _pack(pieces).cpu()
        blobs.append(host)
        sizes.extend(p.numel() for p in pieces)
        crcs.append(zlib.crc32(host.numpy()))
    blob = torch.cat(blobs) if blobs else torch.empty(0, dtype=torch.uint8)
    meta = {
        "format": FORMAT_VERSION,
        "dtype": str(dtype).removeprefix("torch."),
        "nbytes": data.numel(),
        "planes": layout.planes,
        "data_type": layout.data_type,
        "codecs": list(layout.codecs),
        "chunk": layout.chunk,
        "segment": SEGMENT_NBYTES,
        "sizes": sizes,
        "crc32": crcs,
        "nvcomp": nvcomp_version() if "ans" in layout.codecs else None,
    }
    return blob, meta


def _chunk_lengths(length: int, layout: _Layout) -> list[int]:
    per_plane = length // layout.planes
    full, rest = divmod(per_plane, layout.chunk)
    return [layout.chunk] * full + ([rest] if rest else [])


def _decode_segment(
    engine: ChunkEngine | None, stored: torch.Tensor, sizes: list[int], out: torch.Tensor, layout: _Layout
) -> None:
    plane_out = (
        out.view(1, -1) if layout.planes == 1 else byte_planes.empty(layout.planes, out.numel() // layout.planes, out.device)
    )
    pieces = _unpack(stored, sizes)
    targets = [t for k in range(layout.planes) for t in plane_out[k].split(layout.chunk)]
    groups: dict[str, tuple[list, list]] = {}
    per_plane = len(targets) // layout.planes
    for i, (piece, target) in enumerate(zip(pieces, targets)):
        if piece.numel() == target.numel():
            target.copy_(piece)
        else:
            src, dst = groups.setdefault(layout.codecs[i // per_plane], ([], []))
            src.append(piece)
            dst.append(target)
    for codec, (src, dst) in groups.items():
        engine.decode(src, dst, codec, layout.data_type)
    if layout.planes > 1:
        byte_planes.join(plane_out, out)


def validate(meta: object, blob_nbytes: int) -> _Layout:
    """Check every field of a record dict against the blob's size; raise CorruptCheckpointError if any is off."""
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"record description is a {type(meta).__name__}, not a dict")
    version = meta.get("format")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"record format {version} is newer than this lightning_nvcomp reads ({FORMAT_VERSION}): upgrade it"
        )
    if version != FORMAT_VERSION:
        raise CorruptCheckpointError(f"unknown record format {version!r}")

    def field(name: str, kind: type) -> object:
        value = meta.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorruptCheckpointError(f"record field {name!r} is {value!r}, expected a {kind.__name__}")
        return value

    nbytes, planes, chunk, segment = (field(n, int) for n in ("nbytes", "planes", "chunk", "segment"))
    codecs, sizes, crcs = (field(n, list) for n in ("codecs", "sizes", "crc32"))
    data_type = field("data_type", str)
    if not 0 <= nbytes < _MAX_NBYTES:
        raise CorruptCheckpointError(f"record size {nbytes} is out of range")
    if planes not in (1, 2, 4, 8) or nbytes % planes:
        raise CorruptCheckpointError(f"record has {planes} planes for {nbytes} bytes")
    if not (0 < chunk <= 1 << 30 and chunk % 64 == 0 and 0 < segment <= 1 << 31 and segment % (64 * planes) == 0):
        raise CorruptCheckpointError(f"record chunk {chunk} / segment {segment} sizes are invalid")
    if len(codecs) != planes or any(c not in CODECS for c in codecs):
        raise CorruptCheckpointError(f"record codecs {codecs!r} do not fit {planes} planes")
    if data_type not in _DATA_TYPES or (data_type != "|u1" and (planes != 1 or codecs != ["ans"])):
        raise CorruptCheckpointError(f"record data type {data_type!r} is invalid here")
    layout = _Layout(planes, tuple(codecs), data_type, chunk)
    segments = _segments(nbytes, segment)
    per_segment = [len(_chunk_lengths(length, layout)) * planes for _, length in segments]
    if len(sizes) != sum(per_segment) or len(crcs) != len(segments):
        raise CorruptCheckpointError(
            f"record lists {len(sizes)} chunks and {len(crcs)} checksums; its sizes imply {sum(per_segment)} and "
            f"{len(segments)}"
        )
    pos = 0
    for _, length in segments:
        lengths = _chunk_lengths(length, layout)
        for k in range(planes):
            for raw in lengths:
                size = sizes[pos]
                pos += 1
                if not isinstance(size, int) or not 0 < size <= raw or (codecs[k] == "raw" and size != raw):
                    raise CorruptCheckpointError(f"record chunk {pos - 1} has stored size {size!r} for {raw} bytes")
    if sum(_padded(n) for n in sizes) != blob_nbytes:
        raise CorruptCheckpointError(f"record chunks add up to {sum(sizes)} bytes but the blob holds {blob_nbytes}")
    if any(not isinstance(c, int) or not 0 <= c < 1 << 32 for c in crcs):
        raise CorruptCheckpointError("record checksums are not 32-bit integers")
    return layout


def decode(blob: torch.Tensor, meta: dict, device: torch.device | str = "cpu") -> torch.Tensor:
    """Return the record's raw bytes (1-D uint8) on ``device``, after checking every field and checksum."""
    if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8 or blob.dim() != 1:
        raise CorruptCheckpointError("record blob is not a 1-D uint8 tensor")
    layout = validate(meta, blob.numel())
    device = torch.device(device)
    coded = set(layout.codecs) - {"raw"}
    if "ans" in coded:
        if not gpu_available():
            writer = meta.get("nvcomp")
            raise CodecUnavailableError(
                f"data compressed with gANS (nvCOMP {writer}) needs a CUDA GPU and nvCOMP to decode; gANS has no "
                "CPU decoder. Load it on a GPU machine, or convert it there once: "
                "lightning-nvcomp convert IN OUT --codec zstd"
            )
        work = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    elif coded and device.type == "cuda" and gpu_available():
        work = device
    else:
        work = torch.device("cpu")
    engine = engine_for(next(iter(coded)), work) if coded else None
    if "ans" in coded and "zstd" in coded:
        engine = _nvcomp_engine()

    host = blob.cpu()
    out = torch.empty(layout_nbytes := meta["nbytes"], dtype=torch.uint8, device=work)
    pos = offset = 0
    for (start, length), crc in zip(_segments(layout_nbytes, meta["segment"]), meta["crc32"]):
        count = len(_chunk_lengths(length, layout)) * layout.planes
        sizes = meta["sizes"][pos : pos + count]
        end = offset + sum(_padded(n) for n in sizes)
        if zlib.crc32(host[offset:end].numpy()) != crc:
            raise CorruptCheckpointError(f"checksum mismatch in segment at byte {start}: the file is damaged")
        stored = (blob if blob.device == work else host)[offset:end].to(work)
        try:
            _decode_segment(engine, stored, sizes, out[start : start + length], layout)
        except ValueError as err:
            raise CorruptCheckpointError(f"segment at byte {start} does not decode: {err}") from None
        pos, offset = pos + count, end
    return out.to(device)
