"""A delta's base read back (:func:`decoded_range`): the base file opened where its chain finds it (itself, or a
hidden copy beside it or beside the file that needs it, see :func:`~lightning_nvcomp.format.bases.candidates`), its id
checked, a range of its record decoded from the segments it lies in and checked as any record is, its own base
followed; and a record's transforms undone with those bytes (:func:`undo_range`). A missing or replaced base raises
:class:`~lightning_nvcomp.errors.MissingBaseError`, a damaged one :class:`~lightning_nvcomp.errors.CorruptCheckpointError`,
each naming it."""

from __future__ import annotations

import bisect
import io
import mmap
import struct
import threading
import zipfile
from typing import BinaryIO

import numpy as np
import torch

from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.codec import engines, schema
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.schema import _padded
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, MissingBaseError
from lightning_nvcomp.format.bases import MAX_CHAIN, candidates
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.storage import storage_for
from lightning_nvcomp.storage.sized_reader import Window


def undo_range(
    rec: dict, pieces: list[tuple[int, torch.Tensor]], start: int, base_bytes: torch.Tensor, clip: bool = False
) -> None:
    """Undo ``rec``'s transforms where its storages meet the base's bytes ``base_bytes``, which lie at ``start`` in
    the record. ``pieces``: for each storage, where its bytes are: a tensor and the record offset it starts at (its
    storage's own memory; with ``clip``, a range of the record that the storage is cut to)."""
    end = start + base_bytes.numel()
    storages, transforms_ = rec["storages"], rec["delta"]["transforms"]
    # the storages lie in order (schema.validate): only those from the first that ends past ``start`` can meet it
    first = bisect.bisect_right(storages, start, key=lambda s: s[0] + s[1])
    for j in range(first, len(storages)):
        (at, piece), (storage_at, nbytes), transform = pieces[j], storages[j], transforms_[j]
        if storage_at >= end:
            break
        lo, hi = max(start, at), min(end, at + piece.numel())
        if clip:
            lo, hi = max(lo, storage_at), min(hi, storage_at + nbytes)
        if transform != "none" and lo < hi:
            part = piece[lo - at : hi - at]
            transforms.undo(transform, part, base_bytes[lo - start : hi - start], rec["delta"]["itemsize"])


def stored_nbytes(rec: dict) -> int:
    sizes = rec.get("sizes")
    return sum(_padded(n) for n in sizes if isinstance(n, int)) if isinstance(sizes, list) else 0


def decoded_range(
    holder: str,
    base: dict,
    start: int,
    length: int,
    device: torch.device,
    state: LoadState | None,
    depth: int,
    cache: dict,
) -> torch.Tensor:
    """Bytes ``[start, start + length)`` of the base record that the file ``holder`` names in ``base`` (a delta's
    ``base`` field: the file, its id, the record's blobs and dict, the archive's range in the file), decoded on
    ``device``: see :func:`decoded_windows`."""
    return decoded_windows(holder, base, [(start, length)], device, state, depth, cache)[0]


def decoded_windows(
    holder: str,
    base: dict,
    spans: list[tuple[int, int]],
    device: torch.device,
    state: LoadState | None,
    depth: int,
    cache: dict,
    into: list[tuple[torch.Tensor, tuple[str, int]]] | None = None,
) -> list[torch.Tensor]:
    """Bytes ``[start, start + length)`` of the base record for each of ``spans`` (apart from each other), as for
    :func:`decoded_range`: each segment they lie in decoded once, and only their bytes joined, checked: the file's id
    is the base's, the segments' CRCs and the record's fields are the record's, and a base of its own is followed.
    ``into``: for each span, a delta's bytes on the CPU that a transform (and its itemsize) made against these; they
    are undone there as the base's bytes are joined (a base with no base of its own), and returned."""
    keys, rec = base["blobs"], base["record"]
    opened, path = _base_file(holder, base, depth, cache)
    try:
        layout = opened.layout(rec, keys)
        for start, length in spans:
            if not 0 <= start <= start + length <= rec["nbytes"] or start % layout.planes or length % layout.planes:
                raise CorruptCheckpointError(f"bytes {start}..{start + length} are not whole numbers of its record")
        work = engines.work_device(layout, rec, device)
        if into is not None and (work != device or "delta" in rec):
            raise ValueError("a base is undone into a delta's bytes on the CPU, and only a base with none of its own")
        outs = [t for t, _ in into] if into else [torch.empty(n, dtype=torch.uint8, device=work) for _, n in spans]
        undoing = [undo for _, undo in into] if into else [None] * len(spans)
        stand_ins = [torch.empty(opened.size(key), dtype=torch.uint8, device="meta") for key in keys]
        for s, (at, n) in enumerate(schema._segments(rec["nbytes"], rec["segment"])):
            meeting = [
                ((max(at, start), out[max(at, start) - start : min(at + n, start + length) - start]), undo)
                for (start, length), out, undo in zip(spans, outs, undoing)
                if max(at, start) < min(at + n, start + length)
            ]
            if not meeting:
                continue
            blobs = [*stand_ins[:s], opened.blob(keys[s]), *stand_ins[s + 1 :]]  # one segment's bytes at a time
            if state is not None:
                state.charge([blobs[s]], sum(t.numel() for (_, t), _ in meeting), path)
            targets = [target for target, _ in meeting]
            records.decode_into(blobs, rec, targets, layout, parallel=False, undoing=[u for _, u in meeting])
            opened.drop(blobs[s])
        outs = [out.to(device) for out in outs]
        if "delta" in rec:  # a base of its own: undone on these bytes too
            _undo_own_base(rec, spans, outs, opened.path, device, state, depth, cache)
    except MissingBaseError:
        raise
    except CheckpointError as err:
        message = str(err)
        raise type(err)(message if message.startswith(path) else f"its base {path}: {message}") from None
    return outs


def _base_file(holder: str, base: dict, depth: int, cache: dict) -> tuple[_Opened, str]:
    """The base file that ``holder`` names in ``base``, opened once per load or save (``cache``), its id checked, and
    where it was looked for first (how errors name it)."""
    ident = base["id"]
    span = tuple(base["range"]) if "range" in base else None
    places = candidates(holder, base["file"], ident, storage_for(holder))
    path = places[0]
    if depth > MAX_CHAIN:
        raise CorruptCheckpointError(f"its chain of bases is longer than {MAX_CHAIN} at {path}")
    opened = cache.get((path, ident, span))
    if opened is None:
        opened = cache[(path, ident, span)] = _opened(places, ident, span)
    if opened.id != ident:
        raise MissingBaseError(
            f"its base {path} was replaced by another file (serialization id {opened.id}, not {ident}): the delta "
            "cannot be decoded without the file it was saved against"
        )
    return opened, path


def _undo_own_base(
    rec: dict,
    spans: list[tuple[int, int]],
    outs: list[torch.Tensor],
    holder: str,
    device: torch.device,
    state: LoadState | None,
    depth: int,
    cache: dict,
) -> None:
    """Undo the delta of base record ``rec`` (of the file ``holder``) on its decoded bytes ``outs``, at ``spans``."""
    inner = rec["delta"]["base"]
    if inner["record"].get("storages") != rec.get("storages") or inner["record"].get("nbytes") != rec["nbytes"]:
        raise CorruptCheckpointError(f"its base record in {inner['file']} does not lie as the record does")
    if state is not None:
        state.include(stored_nbytes(inner["record"]))
    base_outs = decoded_windows(holder, inner, spans, device, state, depth + 1, cache)
    for (start, _), out, base_bytes in zip(spans, outs, base_outs):
        undo_range(rec, [(start, out)] * len(rec["storages"]), start, base_bytes, clip=True)


def _opened(places: list[str], ident: str, span: tuple[int, int] | None) -> _Opened:
    """The base of id ``ident`` (the archive at ``span`` in its file, if given) at the first of ``places``
    (:func:`~lightning_nvcomp.format.bases.candidates`) that holds it; the first that exists where none does (its id
    then names what replaced it)."""
    storage = storage_for(places[0])
    found = None
    for place in places:
        if not storage.exists(place):
            continue
        opened = _Opened(place, span)
        if opened.id == ident:
            return opened
        found = found or opened
    if found is None:
        raise MissingBaseError(
            f"its base {places[0]} is missing: a delta cannot be decoded without the checkpoint it was saved against "
            "(restore that file, or load a checkpoint that does not need it)"
        )
    return found


class _Opened:
    """A base file opened for a load or a save (``span``: the archive at that ``(offset, length)`` in it, a DCP
    item): its id and its entries' places."""

    def __init__(self, path: str, span: tuple[int, int] | None = None) -> None:
        storage = storage_for(path)
        self.path = path
        try:
            self.file: BinaryIO = storage.open_read(path)
        except FileNotFoundError:
            raise MissingBaseError(
                f"its base {path} is missing: a delta cannot be decoded without the checkpoint it was saved against "
                "(restore that file, or load a checkpoint that does not need it)"
            ) from None
        self._lock = threading.Lock()
        self._layouts: dict[int, tuple[dict, list[str], schema.Layout]] = {}
        self._start, self._end = span[0] if span else 0, span[0] + span[1] if span else None
        try:
            archive = zipfile.ZipFile(self.file if span is None else Window(self.file, *span, path))
            names = archive.namelist()
            top = names[0].split("/")[0] if names else ""
            self.id = archive.read(f"{top}/.data/serialization_id").decode("ascii")
            self.entries = {
                info.filename.removeprefix(f"{top}/data/"): info
                for info in archive.infolist()
                if info.filename.startswith(f"{top}/data/")
            }
        except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, ValueError, EOFError, struct.error) as err:
            raise CorruptCheckpointError(f"its base {path} is not a readable checkpoint ({err})") from None
        # A local file is mapped copy-on-write: blobs are read where they lie, without a copy (writable for torch)
        self._map: mmap.mmap | None = None
        self._pages: np.ndarray | None = None
        try:
            self._map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_COPY)
            self._pages = np.frombuffer(self._map, dtype=np.uint8)
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            pass

    def layout(self, rec: dict, keys: list[str]) -> schema.Layout:
        """The layout of record ``rec`` over this file's entries ``keys``, validated once (a record is read a segment
        at a time: its validation would otherwise repeat for each)."""
        found = self._layouts.get(id(rec))
        if found is not None and found[0] is rec and found[1] == keys:
            return found[2]
        layout = schema.validate(rec, [self.size(key) for key in keys])
        self._layouts[id(rec)] = (rec, list(keys), layout)  # the record held: its id is not another's
        return layout

    def size(self, key: str) -> int:
        """The size of entry ``data/<key>`` (0 for none: the record's validation then fails)."""
        info = self.entries.get(key)
        return info.file_size if info is not None else 0

    def blob(self, key: str) -> torch.Tensor:
        """Entry ``data/<key>``'s bytes (stored, as every entry of ours), which the record's CRCs then check: where
        they lie in a local file's pages (copy-on-write), else read into memory of their own."""
        info = self.entries.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            raise CorruptCheckpointError(f"it holds no stored entry data/{key}")
        with self._lock:  # one position for all the threads that code a record's segments
            self.file.seek(self._start + info.header_offset)
            header = self.file.read(30)
            if len(header) != 30 or header[:4] != b"PK\x03\x04":
                raise CorruptCheckpointError(f"entry data/{key} has no local header")
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            start = self._start + info.header_offset + 30 + name_len + extra_len
            if self._end is not None and start + info.file_size > self._end:
                raise CorruptCheckpointError(f"entry data/{key} lies beyond its archive")
            if self._pages is not None:
                if start + info.file_size > self._pages.size:
                    raise CorruptCheckpointError(f"entry data/{key} is truncated")
                return torch.from_numpy(self._pages[start : start + info.file_size])
            out = torch.empty(info.file_size, dtype=torch.uint8)
            self.file.seek(start)
            if _read_into(self.file, memoryview(out.numpy())) != info.file_size:
                raise CorruptCheckpointError(f"entry data/{key} is truncated")
        return out

    def drop(self, blob: torch.Tensor) -> None:
        """``blob`` (from :meth:`blob`) is decoded: its pages leave this process's memory (the page cache keeps them),
        so that a base read a segment at a time holds one segment's worth."""
        if self._map is None or blob.numel() == 0:
            return
        offset = blob.data_ptr() - self._pages.ctypes.data  # type: ignore[union-attr]
        first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (offset + blob.numel()) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)


def _read_into(f: BinaryIO, view: memoryview) -> int:
    """Fill ``view`` from ``f``'s position on: the bytes read (fewer at the file's end)."""
    at = 0
    while at < len(view):
        n = f.readinto(view[at:]) if hasattr(f, "readinto") else None
        if n is None:
            chunk = f.read(len(view) - at)
            view[at : at + len(chunk)] = chunk
            n = len(chunk)
        if not n:
            break
        at += n
    return at
