"""Records: a buffer of numbers compressed into blobs, plus the small dict that says how to decode them.

The layout, whole:

* The record's ``nbytes`` raw bytes are cut into segments of ``segment`` bytes (the last may be shorter).
* Each segment is split into ``planes`` byte planes (see :mod:`.planes`; 1 plane = the bytes as they are).
* Each plane is cut into chunks of ``chunk`` bytes (the last may be shorter).
* Each chunk is stored coded with its plane's codec ``codecs[k]`` (``"ans"``, ``"zstd"`` or ``"raw"``), or raw
  when coding would not make it smaller. ``data_type`` is the type nvCOMP's gANS modelled (``"|u1"``: bytes).
* ``sizes`` lists the stored size of every chunk: segment by segment, plane by plane, chunk by chunk. A stored
  size equal to the chunk's raw size means the chunk is stored raw. Segment ``s`` is stored as blob ``s``: its
  stored chunks in order, each followed by zero bytes up to a multiple of 16 (nvCOMP reads 16-byte aligned chunks).
* ``crc32[s]`` is the CRC-32 of blob ``s``, checked before anything is decoded.
* ``check`` (format 2) is the CRC-32 of every other field, in the canonical form :func:`record_check` gives: a
  damaged field is caught before it is used, by any loader. Format 1 records (v0.1) have none.

Every field is validated against the blobs before a byte is decoded: the dict may come from a hostile file.
"""

from __future__ import annotations

import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
import torch

from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.checksum import Crc32, crc32
from lightning_nvcomp.codec.cpu import CpuZstdEngine, cpu_threads
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.gpu import NvcompEngine, gpu_available, nvcomp_version
from lightning_nvcomp.errors import CodecUnavailableError, CorruptCheckpointError, UnsupportedFormatError
from lightning_nvcomp.resources import shared

T = TypeVar("T")

FORMAT_VERSION = 2
#: Record formats this version reads: 1 (v0.1, no ``check``) and 2.
READ_FORMATS = (1, 2)
#: Codecs a save can ask for. ``"raw"`` stores bytes as they are (still checksummed).
CODECS = ("ans", "zstd", "raw")
#: Default segment size: the bytes coded by one engine call (nvCOMP calls have a fixed cost, up to ~20 ms for Zstd)
#: and the GPU scratch a save borrows (planes + compressed output, about 2x this).
SEGMENT_NBYTES = 256 << 20
#: On the CPU, segments are coded in parallel on threads: smaller ones keep every core busy.
CPU_SEGMENT_NBYTES = 16 << 20
#: Uncompressed chunk size per (codec, device type), measured best on an H200 (benchmarks/results), within nvCOMP's
#: limits (gANS <= 16 MiB); typed gANS (``<f4``) runs fastest on larger chunks.
CHUNK_NBYTES = {("ans", "cuda"): 1 << 20, ("zstd", "cuda"): 64 << 10, ("zstd", "cpu"): 1 << 20, ("raw", "cpu"): 1 << 20}
TYPED_ANS_CHUNK_NBYTES = 4 << 20
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
    zeros = torch.zeros(_CHUNK_ALIGN, dtype=torch.uint8, device=device)
    return concatenate([part for p in pieces for part in (p, zeros[: _padded(p.numel()) - p.numel()])])


def concatenate(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` of 1-D uint8 tensors on one device, through numpy on the CPU (~30x faster there)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].device.type == "cpu":
        return torch.from_numpy(np.concatenate([part.numpy() for part in parts]))
    return torch.cat(parts)


@dataclass(frozen=True)
class Layout:
    """How a record is coded: byte planes, each plane's codec, gANS's data type and the chunk size."""

    planes: int
    codecs: tuple[str, ...]
    data_type: str
    chunk: int

    @classmethod
    def of(cls, meta: dict) -> Layout:
        """The layout a record dict (from :func:`encode`) was coded with."""
        return cls(meta["planes"], tuple(meta["codecs"]), meta["data_type"], meta["chunk"])


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


def _cpu_engine() -> ChunkEngine:
    return shared("cpu-zstd-engine", CpuZstdEngine)


def _nvcomp_engine() -> ChunkEngine:
    return shared("nvcomp-engine", NvcompEngine)


def _segments(nbytes: int, segment: int) -> list[tuple[int, int]]:
    return [(start, min(segment, nbytes - start)) for start in range(0, nbytes, segment)]


def _plane_spans(width: int, n: int, pitch: int, chunk: int) -> list[list[tuple[int, int]]]:
    """The (offset, length) of every chunk of every plane in a flattened plane buffer."""
    return [[(k * pitch + j, min(chunk, n - j)) for j in range(0, n, chunk)] for k in range(width)]


def _encode_segment(engine: ChunkEngine | None, seg: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    plane_data = byte_planes.split(seg, layout.planes)
    flat, pitch = byte_planes.flatten(plane_data)
    spans = _plane_spans(layout.planes, plane_data.shape[1], pitch, layout.chunk)
    stored = [[flat[o : o + n] for o, n in plane] for plane in spans]
    for codec in sorted(set(layout.codecs) - {"raw"}):
        ks = [k for k in range(layout.planes) if layout.codecs[k] == codec]
        assert engine is not None, "a layout with coded planes needs an engine"
        coded = iter(engine.encode(flat, [span for k in ks for span in spans[k]], codec, layout.data_type))
        for k in ks:
            stored[k] = [c if c.numel() < raw.numel() else raw for raw, c in zip(stored[k], coded)]
    return [piece for plane in stored for piece in plane]


def _choose_layout(engine: ChunkEngine | None, data: torch.Tensor, dtype: torch.dtype, codec: str) -> Layout:
    if engine is None:
        return Layout(1, ("raw",), "|u1", CHUNK_NBYTES[("raw", "cpu")])
    chunk = CHUNK_NBYTES[(codec, engine.device_type)]
    width = byte_planes.plane_width(dtype)
    if data.numel() % width:
        width = 1
    bits = byte_planes.entropy_bits(data, width)
    layout = Layout(width, tuple(codec if b < byte_planes.RAW_ENTROPY_BITS else "raw" for b in bits), "|u1", chunk)
    typed = _TYPED_ANS.get(dtype) if codec == "ans" else None
    if typed is None or data.numel() < 4096:
        return layout
    # Pick gANS's typed model over byte planes only where it is smaller on a sample AND round-trips bit-exactly.
    start = (data.numel() // 2 - _TYPED_SAMPLE_NBYTES // 2) // 64 * 64
    sample = data[max(0, start) : max(0, start) + _TYPED_SAMPLE_NBYTES]
    typed_layout = Layout(1, ("ans",), typed, TYPED_ANS_CHUNK_NBYTES)
    typed_pieces = _encode_segment(engine, sample, typed_layout)
    planes_size = sum(p.numel() for p in _encode_segment(engine, sample, layout))
    if sum(p.numel() for p in typed_pieces) >= planes_size:
        return layout
    check = torch.empty_like(sample)
    packed = _pack(typed_pieces)
    _decode_segment(engine, packed, [p.numel() for p in typed_pieces], check, typed_layout)
    return typed_layout if torch.equal(check, sample) else layout


def canonical_crc(value: object) -> int:
    """CRC-32 of the canonical JSON form of ``value`` (ints, strings, bools, None, lists): what checks cover.

    Raises CorruptCheckpointError for values that have none (a hostile record may hold anything)."""
    try:
        return zlib.crc32(json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as err:
        raise CorruptCheckpointError(f"a record field holds a value no checkpoint holds ({err})") from None


#: Record fields that ``check`` covers as packed integers rather than as JSON (they hold one entry per chunk).
_PACKED_FIELDS = ("sizes", "crc32")


def record_check(meta: dict) -> int:
    """The ``check`` of a record dict: the CRC-32 of the canonical JSON of every string-keyed field but ``check``,
    ``sizes`` and ``crc32``, continued over ``sizes`` then ``crc32`` as little-endian 64-bit integers.

    Raises CorruptCheckpointError for fields no record holds."""
    fields = {k: v for k, v in meta.items() if isinstance(k, str) and k != "check" and k not in _PACKED_FIELDS}
    crc = canonical_crc(fields)
    for name in _PACKED_FIELDS:
        values = meta.get(name)
        try:
            packed = np.asarray(values if isinstance(values, list) else [], dtype="<i8").tobytes()
        except (TypeError, ValueError, OverflowError) as err:
            raise CorruptCheckpointError(f"record field {name!r} is not a list of integers ({err})") from None
        crc = zlib.crc32(packed, crc)
    return crc


def seal(meta: dict) -> dict:
    """Resolve the checksums :func:`encode` may leave pending and set ``check``: the record is final after this."""
    resolve_checksums(meta)
    meta["check"] = record_check(meta)
    return meta


def _to_host(packed: torch.Tensor) -> torch.Tensor:
    if packed.device.type == "cpu":
        return packed
    # Pinned memory: device-to-host copies run at full bus speed and without first-touch page faults.
    host = torch.empty(packed.numel(), dtype=torch.uint8, pin_memory=True)
    return host.copy_(packed, non_blocking=True)


def _segment_pool() -> ThreadPoolExecutor:
    # Separate from the chunk pool the CPU engine uses inside each segment, so the two never wait on each other.
    return shared(
        "segment-pool", lambda: ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="lnv-segment")
    )


def encode(
    data: torch.Tensor,
    dtype: torch.dtype,
    codec: str,
    segment: int | None = None,
    on_blob: Callable[[torch.Tensor, Crc32 | int], None] | None = None,
    wait_checksums: bool = True,
    layout: Layout | None = None,
) -> tuple[list[torch.Tensor], dict]:
    """Compress ``data`` (1-D contiguous uint8: the bytes of numbers of ``dtype``) with ``codec``.

    ``segment`` (a multiple of 512; default :data:`SEGMENT_NBYTES` on the GPU, at most :data:`CPU_SEGMENT_NBYTES`
    on the CPU) bounds the bytes coded per engine call and so the scratch memory. Returns one CPU uint8 blob per
    segment (pinned when coded on the GPU) and the record dict. With ``on_blob``, each blob is handed over as soon
    as it is in host memory, with its CRC-32 (a :class:`Crc32` still being computed), and not returned: so it can be
    written while the next segments are coded. The record is sealed (:func:`seal`); with ``wait_checksums=False``,
    ``meta["crc32"]`` may hold such pending checksums instead (so training need not wait for them): :func:`seal`
    it before storing it, also after adding fields.
    ``layout`` skips choosing one (sampling the data): any layout codes any data of this size losslessly.
    """
    engine = engine_for(codec, data.device)
    on_gpu = engine.device_type == "cuda" if engine is not None else data.device.type == "cuda"
    segment = segment or (SEGMENT_NBYTES if on_gpu else min(SEGMENT_NBYTES, CPU_SEGMENT_NBYTES))
    if segment <= 0 or segment % 512:
        raise ValueError(f"segment size {segment} must be a positive multiple of 512 bytes")
    data = data.to("cuda" if on_gpu else "cpu")
    layout = layout or _choose_layout(engine, data, dtype, codec)
    if on_gpu:
        results: list[tuple[torch.Tensor | None, list[int], Crc32 | int]] = []
        for start, length in _segments(data.numel(), segment):
            if engine is None:  # stored raw: one copy to pinned host memory, no coding
                blob, pieces = _raw_blob(data[start : start + length]), _raw_chunks(length, layout.chunk)
            else:
                pieces = _encode_segment(engine, data[start : start + length], layout)
                blob = _to_host(_pack(pieces))
            ready = torch.cuda.Event()
            ready.record()
            crc = Crc32(blob, ready)  # on CPU threads, while the GPU codes the next segment
            if on_blob is not None:
                on_blob(blob, crc)
            results.append((None if on_blob else blob, [p.numel() for p in pieces], crc))
    else:
        results = []
        for blob, sizes, cpu_crc in _segment_pool().map(
            lambda span: _encode_cpu_segment(engine, data, span, layout), _segments(data.numel(), segment)
        ):
            if on_blob is not None:
                on_blob(blob, cpu_crc)
            results.append((None if on_blob else blob, sizes, cpu_crc))
    meta = {
        "format": FORMAT_VERSION,
        "dtype": str(dtype).removeprefix("torch."),
        "nbytes": data.numel(),
        "planes": layout.planes,
        "data_type": layout.data_type,
        "codecs": list(layout.codecs),
        "chunk": layout.chunk,
        "segment": segment,
        "sizes": [n for _, sizes, _ in results for n in sizes],
        "crc32": [crc for _, _, crc in results],
        "nvcomp": nvcomp_version() if "ans" in layout.codecs else None,
    }
    if wait_checksums:
        seal(meta)
    return [blob for blob, _, _ in results if blob is not None], meta


def _raw_chunks(length: int, chunk: int) -> list[torch.Tensor]:
    """Stand-ins with the sizes of a raw segment's chunks (only their sizes are used)."""
    return [torch.empty(min(chunk, length - j), dtype=torch.uint8, device="meta") for j in range(0, length, chunk)]


def _raw_blob(seg: torch.Tensor) -> torch.Tensor:
    """A segment stored raw, as its blob: the bytes, then zeros up to a multiple of 16 (raw chunks are multiples
    of 16 but the last), in fresh host memory (pinned for a GPU segment)."""
    n = seg.numel()
    blob = torch.empty(_padded(n), dtype=torch.uint8, pin_memory=seg.device.type == "cuda")
    blob[n:] = 0
    if seg.device.type == "cpu":
        blob[:n].numpy()[:] = seg.numpy()
    else:
        blob[:n].copy_(seg, non_blocking=True)
    return blob


def _encode_cpu_segment(
    engine: ChunkEngine | None, data: torch.Tensor, span: tuple[int, int], layout: Layout
) -> tuple[torch.Tensor, list[int], int]:
    seg = data[span[0] : span[0] + span[1]]
    if engine is None:
        blob, sizes = _raw_blob(seg), [p.numel() for p in _raw_chunks(seg.numel(), layout.chunk)]
    else:
        pieces = _encode_segment(engine, seg, layout)
        blob, sizes = _pack(pieces), [p.numel() for p in pieces]
    return blob, sizes, crc32(blob)


def resolve_checksums(meta: dict) -> dict:
    """Replace the checksum futures :func:`encode` may leave in ``meta`` by their values (waiting for them)."""
    meta["crc32"] = [crc.result() if isinstance(crc, Crc32) else crc for crc in meta["crc32"]]
    return meta


def _chunk_lengths(length: int, layout: Layout) -> list[int]:
    per_plane = length // layout.planes
    full, rest = divmod(per_plane, layout.chunk)
    return [layout.chunk] * full + ([rest] if rest else [])


def _decode_segment(
    engine: ChunkEngine | None, stored: torch.Tensor, sizes: list[int], out: torch.Tensor, layout: Layout
) -> None:
    n = out.numel() // layout.planes
    plane_out = out.view(1, -1) if layout.planes == 1 else byte_planes.empty(layout.planes, n, out.device)
    flat, pitch = byte_planes.flatten(plane_out)
    dst_spans = [span for plane in _plane_spans(layout.planes, n, pitch, layout.chunk) for span in plane]
    per_plane = len(dst_spans) // layout.planes
    groups: dict[str, tuple[list, list]] = {}
    raw_run: list[int] = []  # [src, dst, length] of a run of raw chunks contiguous in both buffers
    pos = 0
    for i, (size, (dst, length)) in enumerate(zip(sizes, dst_spans)):
        if size == length:
            if raw_run and raw_run[0] + raw_run[2] == pos and raw_run[1] + raw_run[2] == dst:
                raw_run[2] += length
            else:
                if raw_run:
                    flat[raw_run[1] : raw_run[1] + raw_run[2]].copy_(stored[raw_run[0] : raw_run[0] + raw_run[2]])
                raw_run = [pos, dst, length]
        else:
            src_spans, out_spans = groups.setdefault(layout.codecs[i // per_plane], ([], []))
            src_spans.append((pos, size))
            out_spans.append((dst, length))
        pos += _padded(size)
    if raw_run:
        flat[raw_run[1] : raw_run[1] + raw_run[2]].copy_(stored[raw_run[0] : raw_run[0] + raw_run[2]])
    for codec, (src_spans, out_spans) in groups.items():
        assert engine is not None, "a record with coded chunks needs an engine"
        engine.decode(stored, src_spans, flat, out_spans, codec, layout.data_type)
    if layout.planes > 1:
        byte_planes.join(plane_out, out)


def _field(meta: dict, name: str, kind: type[T]) -> T:
    value = meta.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorruptCheckpointError(f"record field {name!r} is {value!r}, expected a {kind.__name__}")
    return value


def validate(meta: object, blob_sizes: list[int]) -> Layout:
    """Check every field of a record dict against its blobs' sizes; raise CorruptCheckpointError if any is off."""
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"record description is a {type(meta).__name__}, not a dict")
    version = meta.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"record format {version} is newer than this lightning_nvcomp reads ({FORMAT_VERSION}): upgrade it"
        )
    if version not in READ_FORMATS or isinstance(version, bool):
        raise CorruptCheckpointError(f"unknown record format {version!r}")
    if version >= 2 and meta.get("check") != record_check(meta):
        raise CorruptCheckpointError("the record's description is damaged (its check does not match its fields)")

    nbytes, planes, chunk, segment = (_field(meta, n, int) for n in ("nbytes", "planes", "chunk", "segment"))
    codecs, sizes, crcs = (_field(meta, n, list) for n in ("codecs", "sizes", "crc32"))
    data_type = _field(meta, "data_type", str)
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
    layout = Layout(planes, tuple(codecs), data_type, chunk)
    segments = _segments(nbytes, segment)
    per_segment = [len(_chunk_lengths(length, layout)) * planes for _, length in segments]
    if len(sizes) != sum(per_segment) or len(crcs) != len(segments) or len(blob_sizes) != len(segments):
        raise CorruptCheckpointError(
            f"record lists {len(sizes)} chunks, {len(crcs)} checksums and {len(blob_sizes)} blobs; its sizes imply "
            f"{sum(per_segment)} chunks in {len(segments)} segments"
        )
    pos = 0
    for s, (_, length) in enumerate(segments):
        lengths = _chunk_lengths(length, layout)
        stored = 0
        for k in range(planes):
            for raw in lengths:
                size = sizes[pos]
                pos += 1
                if (
                    not isinstance(size, int)
                    or isinstance(size, bool)
                    or not 0 < size <= raw
                    or (codecs[k] == "raw" and size != raw)
                ):
                    raise CorruptCheckpointError(f"record chunk {pos - 1} has stored size {size!r} for {raw} bytes")
                stored += _padded(size)
        if stored != blob_sizes[s]:
            raise CorruptCheckpointError(
                f"segment {s}'s chunks add up to {stored} bytes but its blob holds {blob_sizes[s]}"
            )
    if any(not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < 1 << 32 for c in crcs):
        raise CorruptCheckpointError("record checksums are not 32-bit integers")
    return layout


def decode(
    blobs: list[torch.Tensor],
    meta: dict,
    device: torch.device | str = "cpu",
    move: bool = True,
    layout: Layout | None = None,
) -> torch.Tensor:
    """Return the record's raw bytes (1-D uint8) on ``device``, after checking every field and checksum.

    With ``move=False``, bytes decoded on a GPU for a CPU ``device`` (gANS has no CPU decoder) stay on the GPU, for
    the caller to copy wherever they belong. ``layout``: what :func:`validate` returned for exactly these ``blobs``
    and ``meta``, when the caller validated them already."""
    if not isinstance(blobs, list) or any(
        not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 for b in blobs
    ):
        raise CorruptCheckpointError("record blobs are not a list of 1-D uint8 tensors")
    layout = layout or validate(meta, [b.numel() for b in blobs])
    device = torch.device(device)
    coded = set(layout.codecs) - {"raw"}
    if "ans" in coded:
        if not gpu_available():
            raise CodecUnavailableError(
                f"data compressed with gANS (nvCOMP {meta.get('nvcomp')}) needs a CUDA GPU and nvCOMP to decode; gANS "
                "has no CPU decoder. Load it on a GPU machine, or convert it there once: "
                "lightning-nvcomp convert IN OUT --codec zstd"
            )
        work = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    elif coded and device.type == "cuda" and gpu_available():
        work = device
    else:
        work = torch.device("cpu")
    engine = (_nvcomp_engine() if work.type == "cuda" else _cpu_engine()) if coded else None

    hosts = [b.cpu() for b in blobs]
    for s, (got, want) in enumerate(zip([Crc32(h) for h in hosts], meta["crc32"])):
        if got.result() != want:
            raise CorruptCheckpointError(f"checksum mismatch in segment {s} of the record: the file is damaged")
    out = torch.empty(meta["nbytes"], dtype=torch.uint8, device=work)
    jobs, pos = [], 0
    for s, (start, length) in enumerate(_segments(meta["nbytes"], meta["segment"])):
        count = len(_chunk_lengths(length, layout)) * layout.planes
        jobs.append(
            (
                s,
                blobs[s] if blobs[s].device == work else hosts[s],
                meta["sizes"][pos : pos + count],
                out[start : start + length],
            )
        )
        pos += count

    def run(job: tuple) -> None:
        s, stored, sizes, target = job
        try:
            _decode_segment(engine, stored.to(work), sizes, target, layout)
        except ValueError as err:
            raise CorruptCheckpointError(f"segment {s} of the record does not decode: {err}") from None

    if work.type == "cuda":
        for job in jobs:
            run(job)
    else:
        for _ in _segment_pool().map(run, jobs):
            pass
    if work.type == "cuda" and device.type == "cpu":
        if not move:
            return out
        host = _to_host(out)  # pinned: no first-touch page faults, and the copy back to a GPU model is fast
        torch.cuda.current_stream(work).synchronize()
        return host
    return out.to(device)
