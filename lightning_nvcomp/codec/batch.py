"""Many records at once: :func:`encode_batch` codes many small buffers of one dtype together and
:func:`decode_batch` decodes many records of one layout together, each still a record of its own (as
:mod:`.record` codes one): one plane split, one engine call per codec and, on a GPU, one copy each way instead of one
per record. What the items of a DCP checkpoint are coded and read with."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec import checksum as checksums
from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.checksum import Crc32, crc32_batch
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.engines import codes_on_gpu, default_segment, engine_for, engine_on
from lightning_nvcomp.codec.layouts import choose_layout, raw_layout
from lightning_nvcomp.codec.record import CHECKSUM, Coding, Segment, to_host
from lightning_nvcomp.codec.schema import _CHUNK_ALIGN, Layout, _padded, _segments, checksum_field
from lightning_nvcomp.codec.segment import _raw_sizes, concatenate, pack
from lightning_nvcomp.errors import CorruptCheckpointError

#: Every buffer's planes (encode) and every record's bytes (decode) start at a multiple of this many bytes.
_BATCH_ALIGN = 64
#: Each coding thread's plane buffer on the CPU, kept from batch to batch (at most a batch's bytes, padded): fresh
#: memory pays its page faults at every batch, 0.04-0.09 s of a 0.85 s ``dcp.save`` of 238 MB on a 2-core VM (round 11).
#: Nothing outlives :func:`_coded` in it: chunks kept raw are copied out by :func:`_pack`.
_scratch = threading.local()


def encode_batch(
    datas: list[torch.Tensor], dtype: torch.dtype, codec: str, layout: Layout | None = None
) -> list[tuple[Coding, list[Segment]]]:
    """Code many small buffers of one dtype on one device together, each as a record of its own: one layout, one
    plane split, one engine call per codec, and on a GPU one device-to-host copy and one wait for all of them.

    Each buffer's segments (none for an empty one, else one) and record are exactly what :class:`Encoder` gives it
    with this layout and the default segment size, which every buffer must fit in. Returns each buffer's coding
    and segments.
    """
    if not datas:
        return []
    engine = engine_for(codec, datas[0].device)
    on_gpu = codes_on_gpu(engine, datas[0].device)
    segment = default_segment(on_gpu)
    work = "cuda" if on_gpu else "cpu"
    datas = [d if d.device.type == work else d.to(work) for d in datas]
    if any(d.numel() > segment for d in datas):
        raise ValueError(f"encode_batch codes buffers of at most {segment} bytes; use Encoder for larger ones")
    width = byte_planes.plane_width(dtype)
    if any(d.numel() % width for d in datas):
        raise ValueError(f"buffers of {dtype} must be whole numbers of {width}-byte values")
    layout = layout or (raw_layout() if engine is None else choose_layout(engine, _sample(datas), dtype, codec))
    # Each buffer padded to whole 64-byte plane columns: its chunks start aligned, as nvCOMP requires.
    columns = [-(-d.numel() // (_BATCH_ALIGN * width)) * _BATCH_ALIGN * width // layout.planes for d in datas]
    if sum(columns) == 0:
        return [(Coding(dtype, 0, layout, segment), []) for _ in datas]
    codings = [Coding(dtype, d.numel(), layout, segment) for d in datas]
    if layout.planes == 1 and set(layout.codecs) == {"raw"}:  # stored as they are: one copy, no plane buffer
        sizes = [_raw_sizes(d.numel(), layout.chunk) for d in datas]
        nonempty = [d for d in datas if d.numel()]
        packed = pack(nonempty)
        if packed is nonempty[0]:  # one buffer needing no padding: the blob must not be the tensor's own memory
            packed = packed.clone()
    else:
        packed, sizes = _coded(datas, columns, layout, engine, work)
    ready: torch.cuda.Event | None = None
    if on_gpu:  # the copy runs on a stream of its own, beside the coding of the next batch
        copier = shared(f"d2h-stream-{packed.device}", lambda: torch.cuda.Stream(packed.device))
        copier.wait_stream(torch.cuda.current_stream(packed.device))
        with torch.cuda.stream(copier):
            host = to_host(packed)
            ready = torch.cuda.Event()
            ready.record(copier)
        packed.record_stream(copier)  # its memory is not reused before the copy has read it
    else:
        host = packed
    blobs, at = [], 0
    for item_sizes in sizes:
        nbytes = sum(_padded(n) for n in item_sizes)
        blobs.append(host[at : at + nbytes])
        at += nbytes
    nonempty = [b for b, n in zip(blobs, sizes) if n]
    crcs, entry_crcs = iter(crc32_batch(nonempty, ready, CHECKSUM)), iter(crc32_batch(nonempty, ready))
    segments = [[Segment(b, n, next(crcs), next(entry_crcs))] if n else [] for b, n in zip(blobs, sizes)]
    return list(zip(codings, segments))


def _coded(
    datas: list[torch.Tensor], columns: list[int], layout: Layout, engine: ChunkEngine | None, work: str
) -> tuple[torch.Tensor, list[list[int]]]:
    """The buffers' byte planes side by side (buffer i's from ``columns[:i]`` on), coded with ``layout``: their
    chunks packed into one buffer on ``work``, and each buffer's chunk sizes."""
    planes = _planes(datas, columns, layout.planes, layout.rotate, work)
    flat, pitch = byte_planes.flatten(planes)
    # Buffer i's plane k is row k of the batch's planes, from its column on: its chunks are those Encoder cuts from
    # its own planes, at these offsets. A chunk is an (offset, length) of `flat` until coded smaller.
    items: list[list[list[tuple[int, int]]]] = []
    column = 0
    for d, n_columns in zip(datas, columns):
        n = d.numel() // layout.planes
        items.append(
            [
                [(k * pitch + column + j, min(layout.chunk, n - j)) for j in range(0, n, layout.chunk)]
                for k in range(layout.planes)
            ]
        )
        column += n_columns
    pieces: list[list[list[torch.Tensor | tuple[int, int]]]] = [[list(plane) for plane in item] for item in items]
    for coded_with in sorted(set(layout.codecs) - {"raw"}):
        ks = [k for k in range(layout.planes) if layout.codecs[k] == coded_with]
        assert engine is not None, "a layout with coded planes needs an engine"
        coded = iter(
            engine.encode(flat, [c for item in items for k in ks for c in item[k]], coded_with, layout.data_type)
        )
        for item, stored in zip(items, pieces):
            for k in ks:
                stored[k] = [c if c.numel() < n else (o, n) for (o, n), c in zip(item[k], coded)]
    chunks = [[piece for plane in stored for piece in plane] for stored in pieces]
    # One packed buffer (on a GPU, copied to pinned host memory by the caller): each buffer's blob is its range of it.
    packed = _pack(flat, [piece for c in chunks for piece in c])
    return packed, [[c[1] if isinstance(c, tuple) else c.numel() for c in item] for item in chunks]


def _sample(datas: list[torch.Tensor]) -> torch.Tensor:
    """What the batch's layout is chosen on: every k-th buffer, evenly across the batch, about 8 MiB in all (the
    layout samples it further)."""
    step = max(1, sum(d.numel() for d in datas) // (8 << 20))
    return concatenate(datas[::step])


def _planes(datas: list[torch.Tensor], columns: list[int], width: int, rotated: bool, work: str) -> torch.Tensor:
    """The ``[width, n]`` byte planes of the buffers side by side (``rotated`` as :func:`byte_planes.split` takes it),
    buffer i's from its column on (``columns[i]`` plane columns each; the columns past its own bytes are left
    uninitialised: no chunk covers them)."""
    total = sum(columns)
    if work == "cpu":  # each buffer split straight into its columns (no concatenation)
        kept = getattr(_scratch, "planes", None)
        if kept is None or kept.size < width * total:
            kept = _scratch.planes = np.empty(width * total, dtype=np.uint8)
        out = kept[: width * total].reshape(width, total)
        column = 0
        for d, n in zip(datas, columns):
            if d.numel():
                byte_planes.split_into(d.numpy(), out[:, column : column + d.numel() // width], rotated)
            column += n
        return torch.from_numpy(out)
    # On a GPU, one concatenation and one transposing copy: fewer calls than a copy per buffer (what staging waits
    # for is the calls, not the bytes).
    pads = [n * width - d.numel() for d, n in zip(datas, columns)]
    zeros = torch.zeros(max(pads), dtype=torch.uint8, device=work)
    data = concatenate([part for d, pad in zip(datas, pads) for part in ((d, zeros[:pad]) if pad else (d,))])
    return byte_planes.split(data, width, rotated)


def _joined(pieces: list[torch.Tensor | tuple[int, int]]) -> list[torch.Tensor | tuple[int, int]]:
    """``pieces`` with each run of ``(offset, length)`` ranges that follow each other in their buffer, none but the
    last needing padding, as one range: packed, they are the same bytes (one copy instead of one per chunk)."""
    joined: list[torch.Tensor | tuple[int, int]] = []
    for p in pieces:
        last = joined[-1] if joined else None
        if isinstance(p, tuple) and isinstance(last, tuple) and sum(last) == p[0] and last[1] % _CHUNK_ALIGN == 0:
            joined[-1] = (last[0], last[1] + p[1])
        else:
            joined.append(p)
    return joined


def _pack(flat: torch.Tensor, pieces: list[torch.Tensor | tuple[int, int]]) -> torch.Tensor:
    """:func:`~lightning_nvcomp.codec.segment.pack` of chunks given as coded tensors or ``(offset, length)`` ranges
    of ``flat`` (kept raw); on the CPU, copied with numpy into one buffer (no tensor per chunk)."""
    pieces = _joined(pieces)
    if flat.device.type != "cpu":
        return pack([flat[p[0] : p[0] + p[1]] if isinstance(p, tuple) else p for p in pieces])
    sizes = [p[1] if isinstance(p, tuple) else p.numel() for p in pieces]
    out = np.zeros(sum(_padded(n) for n in sizes), dtype=np.uint8)
    source, at = flat.numpy(), 0
    for piece, n in zip(pieces, sizes):
        out[at : at + n] = source[piece[0] : piece[0] + n] if isinstance(piece, tuple) else piece.numpy()
        at += _padded(n)
    return torch.from_numpy(out)


def decode_batch(records: list[tuple[list[torch.Tensor], dict, Layout]], work: torch.device) -> list[torch.Tensor]:
    """Decode many validated records of one layout on ``work`` together (what :func:`work_device` gave each):
    every segment CRC-32 checked first, then one engine call per codec over all their chunks. Returns each record's
    raw bytes (1-D uint8 on ``work``). CorruptCheckpointError names the record's index in ``records``."""
    if not records:
        return []
    layout = records[0][2]
    stored, starts = _one_buffer(_checked_blobs(records), work)
    # The records' bytes side by side in one buffer (each from a 64-byte offset); with byte planes, every segment's
    # planes side by side in a second one, each from a 64-byte column, joined into the first after decoding.
    sizes = [_aligned(meta["nbytes"]) for _, meta, _ in records]
    whole = torch.empty(sum(sizes), dtype=torch.uint8, device=work)
    bases = [0, *itertools.accumulate(sizes)][:-1]
    outs = [whole[base : base + meta["nbytes"]] for base, (_, meta, _) in zip(bases, records)]
    placed, column = [], 0
    for r, (_, meta, _) in enumerate(records):
        for start, length in _segments(meta["nbytes"], meta["segment"]):
            placed.append((r, start, length, column))
            column += _aligned(length // layout.planes)
    if column == 0:  # nothing but empty records
        return outs
    plane_out = byte_planes.empty(layout.planes, column, work) if layout.planes > 1 else whole.view(1, -1)
    flat, pitch = byte_planes.flatten(plane_out) if layout.planes > 1 else (whole, 0)
    groups: dict[str, tuple[list, list]] = {}
    raw_run: list[int] = []  # [src, dst, length] of raw chunks contiguous in both buffers
    chunk_sizes = iter([n for _, meta, _ in records for n in meta["sizes"]])
    for (r, start, length, col), pos in zip(placed, starts):
        n = length // layout.planes
        for k in range(layout.planes):
            for j in range(0, n, layout.chunk):
                raw, size = min(layout.chunk, n - j), next(chunk_sizes)
                dst = k * pitch + col + j if layout.planes > 1 else bases[r] + start + j
                if size != raw:
                    src_spans, dst_spans = groups.setdefault(layout.codecs[k], ([], []))
                    src_spans.append((pos, size))
                    dst_spans.append((dst, raw))
                elif raw_run and raw_run[0] + raw_run[2] == pos and raw_run[1] + raw_run[2] == dst:
                    raw_run[2] += raw
                else:
                    if raw_run:
                        _copy_run(flat, stored, raw_run)
                    raw_run = [pos, dst, raw]
                pos += _padded(size)
    if raw_run:
        _copy_run(flat, stored, raw_run)
    engine = engine_on(work)
    for codec, (src_spans, dst_spans) in groups.items():
        try:
            engine.decode(stored, src_spans, flat, dst_spans, codec, layout.data_type)
        except ValueError as err:
            raise CorruptCheckpointError(f"a segment of records 0..{len(records) - 1} does not decode: {err}") from None
    if layout.planes > 1:
        for r, start, length, col in placed:
            columns = list(plane_out[:, col : col + length // layout.planes])
            byte_planes.join(columns, outs[r][start : start + length], layout.rotate)
    return outs


def _checked_blobs(records: list[tuple[list[torch.Tensor], dict, Layout]]) -> list[torch.Tensor]:
    """Every segment's blob of ``records`` in host memory, in order, once its CRC matches its record's (small
    blobs' CRCs in one task, each large one in pieces on all the CRC threads). The records are of one layout, so of one
    format and checksum. CorruptCheckpointError names the record's index and the segment."""
    algorithm = checksum_field(records[0][1])
    segments = [(r, s, b.cpu()) for r, (blobs, _, _) in enumerate(records) for s, b in enumerate(blobs)]
    large = {
        i: Crc32(b, algorithm=algorithm) for i, (_, _, b) in enumerate(segments) if b.numel() > checksums.PIECE_NBYTES
    }
    small = iter(crc32_batch([b for i, (_, _, b) in enumerate(segments) if i not in large], algorithm=algorithm))
    for i, (r, s, _) in enumerate(segments):
        got = large[i] if i in large else next(small)
        if checksums.value(got) != records[r][1][algorithm][s]:
            raise CorruptCheckpointError(f"record {r}: checksum mismatch in segment {s}: the file is damaged")
    return [b for _, _, b in segments]


def _aligned(n: int) -> int:
    return -(-n // _BATCH_ALIGN) * _BATCH_ALIGN


def _copy_run(dst: torch.Tensor, src: torch.Tensor, run: list[int]) -> None:
    start, to, n = run
    dst[to : to + n].copy_(src[start : start + n])


def _one_buffer(blobs: list[torch.Tensor], work: torch.device) -> tuple[torch.Tensor, list[int]]:
    """One buffer on ``work`` holding every blob, and where each starts in it. When the blobs are views of one CPU
    buffer (a window of a file), on the CPU that buffer itself (no copy), for a GPU one copy of the span they cover
    (asynchronous from pinned memory) and their concatenation there, in which every blob starts at a multiple of 16
    bytes as nvCOMP wants its chunks (a window places them anywhere); else their concatenation, copied to ``work``."""
    if not blobs:
        return torch.empty(0, dtype=torch.uint8, device=work), []
    storage = blobs[0].untyped_storage()
    if blobs[0].device.type == "cpu" and all(b.untyped_storage().data_ptr() == storage.data_ptr() for b in blobs):
        starts = [int(b.storage_offset()) for b in blobs]
        low, high = min(starts), max(s + b.numel() for s, b in zip(starts, blobs))
        base = torch.empty(0, dtype=torch.uint8).set_(storage, low, (high - low,), (1,))
        if work.type == "cpu":
            return base, [s - low for s in starts]
        span = base.to(work, non_blocking=base.is_pinned())
        blobs = [span[s - low : s - low + b.numel()] for s, b in zip(starts, blobs)]
    starts = [0, *itertools.accumulate(int(b.numel()) for b in blobs)][:-1]
    return concatenate(blobs).to(work), starts
