"""One segment's chunks: its byte planes cut into chunks, each coded by an engine or kept raw (:func:`encode_segment`),
packed into the segment's blob (:func:`pack`), and decoded back into where its bytes go (:func:`decode_segment`). The
record around the segments is :mod:`.record`'s; the layout and its validation, :mod:`.schema`'s."""

from __future__ import annotations

import bisect
import itertools

import numpy as np
import torch

from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.codec import planes as byte_planes
from lightning_nvcomp.codec.engine import ChunkEngine
from lightning_nvcomp.codec.schema import _CHUNK_ALIGN, Layout, _padded


def pack(pieces: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate stored chunks, each padded with zeros to a multiple of 16 bytes (on their device)."""
    if not pieces:
        return torch.empty(0, dtype=torch.uint8)
    device = pieces[0].device
    zeros = torch.zeros(_CHUNK_ALIGN, dtype=torch.uint8, device=device)
    parts = []
    for p in pieces:
        parts.append(p)
        if p.numel() % _CHUNK_ALIGN:
            parts.append(zeros[: _padded(p.numel()) - p.numel()])
    return concatenate(parts)


def concatenate(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` of 1-D uint8 tensors on one device; on the CPU, parts of 4 KiB and more through numpy (its
    copies of large parts run up to a few times faster; for many small parts a numpy view each costs more)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].device.type == "cpu" and sum(part.numel() for part in parts) >= len(parts) << 12:
        return torch.from_numpy(np.concatenate([part.numpy() for part in parts]))
    return torch.cat(parts)


def plane_spans(width: int, n: int, pitch: int, chunk: int) -> list[list[tuple[int, int]]]:
    """The (offset, length) of every chunk of every plane in a flattened plane buffer."""
    return [[(k * pitch + j, min(chunk, n - j)) for j in range(0, n, chunk)] for k in range(width)]


def encode_segment(
    engine: ChunkEngine | None, seg: torch.Tensor | list[torch.Tensor], layout: Layout
) -> list[torch.Tensor]:
    """Code one segment (a tensor, or its consecutive parts: :meth:`Parts.slice`) with ``layout``: its stored chunks
    (on its device), plane by plane, each coded or raw where coding would not make it smaller (what a blob holds,
    :func:`pack` ed)."""
    plane_data = byte_planes.split(seg, layout.planes, layout.rotate)
    flat, pitch = byte_planes.flatten(plane_data)
    spans = plane_spans(layout.planes, plane_data.shape[1], pitch, layout.chunk)
    stored = [[flat[o : o + n] for o, n in plane] for plane in spans]
    for codec in sorted(set(layout.codecs) - {"raw"}):
        ks = [k for k in range(layout.planes) if layout.codecs[k] == codec]
        assert engine is not None, "a layout with coded planes needs an engine"
        coded = iter(engine.encode(flat, [span for k in ks for span in spans[k]], codec, layout.data_type))
        for k in ks:
            stored[k] = [c if c.numel() < raw.numel() else raw for raw, c in zip(stored[k], coded)]
    return [piece for plane in stored for piece in plane]


class Parts:
    """A buffer given as consecutive 1-D uint8 tensors (a record's storages and the zeros between them), read a
    segment at a time without joining them first.

    Args:
        parts: the tensors, in order, on one device.
    """

    def __init__(self, parts: list[torch.Tensor]) -> None:
        self.parts = [part for part in parts if part.numel()]
        self.starts = [0, *itertools.accumulate(part.numel() for part in self.parts)]
        self.nbytes = self.starts[-1]

    @property
    def device(self) -> torch.device:
        """Where the parts are (the CPU for none)."""
        return self.parts[0].device if self.parts else torch.device("cpu")

    @property
    def one_tensor(self) -> bool:
        """Whether the bytes are one tensor's (a layout is then chosen on a sample of them; a record of several
        tensors' bytes is coded with the plane layout of its dtype, sampling nothing)."""
        return len(self.parts) == 1

    def slice(self, start: int, length: int) -> list[torch.Tensor]:
        """Views of the parts that hold bytes ``[start, start + length)``, in order."""
        pieces, i = [], max(0, bisect.bisect_right(self.starts, start) - 1)
        while length > 0 and i < len(self.parts):
            offset = start - self.starts[i]
            n = min(length, self.parts[i].numel() - offset)
            pieces.append(self.parts[i][offset : offset + n])
            start, length, i = start + n, length - n, i + 1
        return pieces


def _raw_sizes(length: int, chunk: int) -> list[int]:
    """The chunk sizes of a segment stored raw."""
    return [min(chunk, length - j) for j in range(0, length, chunk)]


def stored_as_is(sizes: list[int], nbytes: int, layout: Layout) -> bool:
    """Whether a segment of ``nbytes`` whose chunks are stored in ``sizes`` holds its bytes as they are: byte b of the
    segment is byte b of its blob."""
    return layout.planes == 1 and all(size == raw for size, raw in zip(sizes, _raw_sizes(nbytes, layout.chunk)))


#: Where decoded bytes go: (byte offset, a 1-D uint8 tensor that receives that many bytes from there on).
Targets = list[tuple[int, torch.Tensor]]


def decode_segment(
    engine: ChunkEngine | None,
    stored: torch.Tensor,
    sizes: list[int],
    outs: Targets,
    nbytes: int,
    layout: Layout,
    undoing: list[tuple[str, int] | None] | None = None,
) -> None:
    """Decode one segment's blob ``stored`` (its chunks' stored ``sizes``, validated; ``nbytes`` decoded bytes) into
    ``outs``: pieces of the segment, each at its offset in it (the storages of a record's tensors, say), which the
    plane join writes straight into. Offsets and lengths are multiples of the layout's plane count. ``undoing``: for
    each of ``outs``, None, or a delta transform and its itemsize that the piece's bytes were made with against these
    (undone into it: see :func:`~lightning_nvcomp.codec.planes.join`)."""
    w, n = layout.planes, nbytes // layout.planes
    undoing = undoing or [None] * len(outs)
    # one target that is the whole segment, its bytes stored as decoded: decoded straight into it
    single = len(outs) == 1 and outs[0][0] == 0 and outs[0][1].numel() == nbytes and undoing[0] is None
    whole = outs[0][1] if single else None
    if w == 1:
        if whole is None and stored_as_is(sizes, n, layout):
            row = stored  # bytes stored as they are: byte b of the segment is byte b of its blob
        else:
            row = whole if whole is not None else torch.empty(n, dtype=torch.uint8, device=stored.device)
            _decoded_rows(engine, stored, sizes, n, layout, row, None if whole is not None else _columns(outs, layout))
        if whole is None:
            for (offset, out), undo in zip(outs, undoing):
                decoded = row[offset : offset + out.numel()]
                if undo is None:
                    out.copy_(decoded)
                else:
                    transforms.undo(undo[0], out, decoded, undo[1])
        return
    rows = _decoded_rows(
        engine, stored, sizes, n, layout, columns=None if whole is not None else _columns(outs, layout)
    )
    for (offset, out), undo in zip(outs, undoing):
        first, end = offset // w, (offset + out.numel()) // w
        for start in range(first, end, JOIN_COLUMNS):  # a slice at a time: the rotation's scratch stays small
            part = [row[start : min(end, start + JOIN_COLUMNS)] for row in rows]
            at = (start - first) * w
            byte_planes.join(part, out[at : at + part[0].numel() * w], layout.rotate, undo)


#: Plane columns unrotated and joined at a time: on a GPU a rotated join's scratch is two rows of them (32 MiB), and
#: each slice costs a dozen kernel launches, each of which lets the GIL go (4 slices a 256 MiB fp32 segment); segments
#: coded on a CPU are smaller than one slice.
JOIN_COLUMNS = 16 << 20


def _columns(outs: Targets, layout: Layout) -> list[tuple[int, int]]:
    """The plane columns ``[start, end)`` that ``outs`` (pieces of a segment) lie in, as few ranges as meet the same
    chunks: ranges less than a chunk apart are one (no chunk lies between them)."""
    merged: list[tuple[int, int]] = []
    for offset, out in sorted(outs, key=lambda target: target[0]):
        lo, hi = offset // layout.planes, (offset + out.numel()) // layout.planes
        if merged and lo - merged[-1][1] < layout.chunk:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _decoded_rows(
    engine: ChunkEngine | None,
    stored: torch.Tensor,
    sizes: list[int],
    n: int,
    layout: Layout,
    into: torch.Tensor | None = None,
    columns: list[tuple[int, int]] | None = None,
) -> list[torch.Tensor]:
    """Every plane of a segment as a row of ``n`` bytes: a plane stored raw whole is read where it lies in ``stored``
    (its raw chunks follow each other there), the others are decoded into fresh rows (into ``into`` for a single
    plane). ``columns``: only the chunks that meet these ``[start, end)`` columns are decoded (a delta's base, where
    its storages kept as they are need none of it); the rest of the rows is left as it was."""
    w = layout.planes
    lengths = _raw_sizes(n, layout.chunk)
    per_plane = len(lengths)
    starts = [sum(_padded(size) for size in sizes[: k * per_plane]) for k in range(w)]
    raw = [w > 1 and sizes[k * per_plane : (k + 1) * per_plane] == lengths for k in range(w)]
    decoded = [k for k in range(w) if not raw[k]]
    buffer = into.view(1, -1) if into is not None else byte_planes.empty(len(decoded), n, stored.device)
    flat, pitch = byte_planes.flatten(buffer) if decoded else (buffer.view(-1), 0)
    rows = [stored[starts[k] : starts[k] + n] for k in range(w)]
    groups: dict[str, tuple[list, list]] = {}
    raw_run: list[int] = []  # [src, dst, length] of a run of raw chunks contiguous in both buffers
    for r, k in enumerate(decoded):
        rows[k] = buffer[r]
        pos = starts[k]
        for j, length in enumerate(lengths):
            size, dst = sizes[k * per_plane + j], r * pitch + j * layout.chunk
            if columns is not None and not any(
                lo < j * layout.chunk + length and j * layout.chunk < hi for lo, hi in columns
            ):
                pos += _padded(size)
                continue
            if size == length:
                if raw_run and raw_run[0] + raw_run[2] == pos and raw_run[1] + raw_run[2] == dst:
                    raw_run[2] += length
                else:
                    if raw_run:
                        flat[raw_run[1] : raw_run[1] + raw_run[2]].copy_(stored[raw_run[0] : raw_run[0] + raw_run[2]])
                    raw_run = [pos, dst, length]
            else:
                src_spans, out_spans = groups.setdefault(layout.codecs[k], ([], []))
                src_spans.append((pos, size))
                out_spans.append((dst, length))
            pos += _padded(size)
    if raw_run:
        flat[raw_run[1] : raw_run[1] + raw_run[2]].copy_(stored[raw_run[0] : raw_run[0] + raw_run[2]])
    for codec, (src_spans, out_spans) in groups.items():
        assert engine is not None, "a record with coded chunks needs an engine"
        engine.decode(stored, src_spans, flat, out_spans, codec, layout.data_type)
    return rows
