"""Delta records in the file: a record's bytes coded against the same record of its base (:func:`encode_against`), and
the base's bytes fetched back to undo it (:func:`undo`); what a file offers as a base is :mod:`.bases`'.

A delta record names its base by file name (in its own directory), the base's zip ``serialization_id`` and the base
record whole (see docs/FORMAT.md, format 4). Decoding one opens the base, checks its id, reads that record's blobs and
decodes them (a base may be a delta itself: the chain is followed), all checked as any record is: a missing or
replaced base raises :class:`~lightning_nvcomp.errors.MissingBaseError` naming it, a damaged one
:class:`~lightning_nvcomp.errors.CorruptCheckpointError` naming it; never wrong bytes.
"""

from __future__ import annotations

import io
import logging
import mmap
import os
import struct
import threading
import zipfile
from typing import BinaryIO

import numpy as np
import torch

from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.codec import engines, layouts, schema
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.schema import _padded
from lightning_nvcomp.codec.segment import Parts
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, MissingBaseError
from lightning_nvcomp.format.bases import MAX_CHAIN, BaseFile, BaseRecord, candidates
from lightning_nvcomp.format.load_state import LoadState
from lightning_nvcomp.storage import storage_for
from lightning_nvcomp.storage.sized_reader import Window

log = logging.getLogger(__name__)


def delta_field(transforms_: list[str | None], itemsize: int, base: BaseFile, rec: BaseRecord) -> dict:
    """The ``delta`` field of a record whose storages are coded with ``transforms_`` (None: as they are) against
    ``rec`` of ``base`` (docs/FORMAT.md)."""
    named = {"file": base.ref, "id": base.id, "blobs": rec.blobs, "record": rec.record}
    if base.span is not None:
        named["range"] = list(base.span)
    return {"transforms": [t or "none" for t in transforms_], "itemsize": itemsize, "base": named}


def encode_against(
    storages: list[torch.Tensor],
    table: list[list[int]],
    dtype: torch.dtype,
    codec: str,
    base: BaseFile,
    rec: BaseRecord,
) -> tuple[Parts, dict] | None:
    """A record's bytes coded against ``rec`` of ``base``: its ``storages`` (1-D uint8, lying in it at ``table``'s
    offsets) each transformed the way that codes a sample of it smallest (or kept), as the parts to code and the
    record's ``delta`` field; None where every storage codes smaller alone. The base is decoded on the storages'
    device, a window of it at a time as the record's segments are coded (a base segment's worth of memory; a record
    of several storages, at most 256 MiB, whole)."""
    itemsize = transforms.width(dtype)
    measured = [i for i, (_, nbytes) in enumerate(table) if nbytes >= _CHOOSE_NBYTES]
    try:
        source = _Against(storages, table, itemsize, base, rec)
        samples = [source.sample(i) for i in measured]
    except CheckpointError as err:  # its chain is broken (a base pruned, replaced, damaged): this record stands alone
        log.warning("lightning_nvcomp: %s cannot be a base (%s): the record is stored alone", base.path, err)
        return None
    choices = transforms.choose(samples, itemsize, lambda windows: layouts.coded_nbytes(windows, dtype, codec))
    for i, transform in zip(measured, choices):
        source.transforms[i] = transform
    if not any(source.transforms):
        return None
    source.transform_whole()
    return source, delta_field(source.transforms, itemsize, base, rec)


class _Against(Parts):
    """A record's bytes transformed against its base record, made a range at a time as its segments are coded
    (:meth:`slice`), the base's range decoded for each; a record of several storages decodes its base whole, once."""

    def __init__(
        self, storages: list[torch.Tensor], table: list[list[int]], itemsize: int, base: BaseFile, rec: BaseRecord
    ) -> None:
        self.storages, self.table, self.itemsize, self.base, self.rec = storages, table, itemsize, base, rec
        self.nbytes = int(rec.record["nbytes"])
        self.transforms: list[str | None] = [None] * len(storages)
        self._cache: dict = {}
        self._whole = self._range(0, self.nbytes) if len(storages) > 1 else None

    @property
    def device(self) -> torch.device:
        return self.storages[0].device

    def _range(self, start: int, length: int) -> torch.Tensor:
        named = {**delta_field([], 1, self.base, self.rec)["base"], "file": os.path.basename(self.base.path)}
        # the base itself, where the chain found it: named by its own name, beside itself
        return _decoded_range(self.base.path, named, start, length, self.device, None, 0, self._cache)

    def sample(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Storage ``i`` and the base's bytes where it lies, around its middle (what :func:`transforms.choose` takes)."""
        start, nbytes = self.table[i]
        if self._whole is not None:
            return self.storages[i], self._whole[start : start + nbytes]
        at = max(0, nbytes // 2 - transforms.SAMPLE_NBYTES) // 128 * 128
        length = min(nbytes - at, 2 * transforms.SAMPLE_NBYTES)
        return self.storages[i][at : at + length], self._range(start + at, length)

    def transform_whole(self) -> None:
        """A record decoded whole: its transforms made in place, once (its slices are then views)."""
        if self._whole is not None:
            self._whole = self._transformed(self._whole, 0)

    def slice(self, start: int, length: int) -> list[torch.Tensor]:
        if self._whole is not None:
            return [self._whole[start : start + length]]
        return [self._transformed(self._range(start, length), start)]

    def _transformed(self, out: torch.Tensor, start: int) -> torch.Tensor:
        """``out``, the base's bytes at ``start``, made the record's transformed bytes in place."""
        length = out.numel()
        for data, (at, nbytes), transform in zip(self.storages, self.table, self.transforms):
            lo, hi = max(start, at), min(start + length, at + nbytes)
            if lo >= hi:
                continue
            window = out[lo - start : hi - start]
            if transform is None:
                window.copy_(data[lo - at : hi - at])
            else:
                transforms.apply(transform, data[lo - at : hi - at], window, self.itemsize, window)
        return out


#: Storages smaller than this are stored as they are in a delta record: choosing costs more than it gains.
_CHOOSE_NBYTES = 16 << 10


def undo(rec: dict, pieces: list[torch.Tensor], holder: str | None, state: LoadState) -> None:
    """Undo a delta record's transforms on its decoded ``pieces`` (its storages, in place): see :class:`Undoing`."""
    Undoing(rec, holder, state, pieces[0].device if pieces else torch.device("cpu")).finish(pieces)


class Undoing:
    """A delta record's transforms being undone with the bytes of its base record, decoded a base segment at a time
    on ``device``; on the CPU the first of them on a segment thread from the start, while the record's own bytes
    decode (a record of one segment, most of a state's, would otherwise decode its own and its base's bytes one after
    the other on one core).

    Args:
        rec: the delta record. holder: the path of the file that holds it (None: the load's file). state: the load's
            (the base is decoded within its bound, which :func:`base_stored_nbytes` widened; its ``bases`` keep the
            bases' opened files for the rest of the load).
    """

    def __init__(self, rec: dict, holder: str | None, state: LoadState, device: torch.device) -> None:
        base = rec["delta"]["base"]
        if holder is None and "range" in base:
            raise MissingBaseError(
                f"it is a DCP item coded against an item of {base['file'].rsplit('/', 1)[0]}, which only "
                "lightning_nvcomp's NvcompFileSystemReader finds (it knows the item's checkpoint directory)"
            )
        if base["record"].get("storages") != rec["storages"] or base["record"].get("nbytes") != rec["nbytes"]:
            raise CorruptCheckpointError(f"its base record in {base['file']} does not lie as the record does")
        self.rec, self.base, self.state, self.device = rec, base, state, device
        self.name = holder if holder is not None else state.name
        nbytes = rec["nbytes"]
        window = base["record"].get("segment")
        window = window if isinstance(window, int) and window > 0 and not isinstance(window, bool) else max(nbytes, 1)
        spans = [(start, min(window, nbytes - start)) for start in range(0, nbytes, window)]
        self.spans = [(start, length) for start, length in spans if _transformed_in(rec, start, length)]
        cpu = device.type == "cpu" and self.spans
        self._first = records.segment_pool().submit(self._decoded, self.spans[0]) if cpu else None

    def _decoded(self, span: tuple[int, int]) -> torch.Tensor:
        return _decoded_range(self.name, self.base, *span, self.device, self.state, 1, self.state.bases)

    def finish(self, pieces: list[torch.Tensor]) -> None:
        """Undo the transforms on the record's decoded ``pieces`` (its storages, in place)."""
        placed = [(at, piece) for (at, _), piece in zip(self.rec["storages"], pieces)]

        def one(span: tuple[int, int]) -> None:  # a base segment: its ranges of the storages are theirs alone
            _undo_range(self.rec, placed, span[0], self._decoded(span))

        rest = self.spans
        if self._first is not None:
            _undo_range(self.rec, placed, rest[0][0], self._first.result())
            rest = rest[1:]
        if self.device.type == "cpu" and len(rest) > 1:  # the base's segments on the segment threads, as the record's
            for _ in records.segment_pool().map(one, rest):
                pass
        else:
            for span in rest:
                one(span)


def _transformed_in(rec: dict, start: int, length: int) -> bool:
    """Whether a storage that a transform was applied to lies in bytes ``[start, start + length)`` of ``rec``."""
    return any(
        t != "none" and at < start + length and start < at + n
        for (at, n), t in zip(rec["storages"], rec["delta"]["transforms"])
    )


def _undo_range(
    rec: dict, pieces: list[tuple[int, torch.Tensor]], start: int, base_bytes: torch.Tensor, clip: bool = False
) -> None:
    """Undo ``rec``'s transforms where its storages meet the base's bytes ``base_bytes``, which lie at ``start`` in
    the record. ``pieces``: for each storage, where its bytes are: a tensor and the record offset it starts at (its
    storage's own memory; with ``clip``, a range of the record that the storage is cut to)."""
    end = start + base_bytes.numel()
    for (at, piece), (storage_at, nbytes), transform in zip(pieces, rec["storages"], rec["delta"]["transforms"]):
        lo, hi = max(start, at), min(end, at + piece.numel())
        if clip:
            lo, hi = max(lo, storage_at), min(hi, storage_at + nbytes)
        if transform != "none" and lo < hi:
            part = piece[lo - at : hi - at]
            transforms.undo(transform, part, base_bytes[lo - start : hi - start], rec["delta"]["itemsize"])


def base_stored_nbytes(rec: dict) -> int:
    """The stored bytes of a delta record's base record (what its load reads from the base)."""
    return _stored_nbytes(rec["delta"]["base"]["record"])


def _stored_nbytes(rec: dict) -> int:
    sizes = rec.get("sizes")
    return sum(_padded(n) for n in sizes if isinstance(n, int)) if isinstance(sizes, list) else 0


def _decoded_range(
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
    ``device`` from the segments they lie in, checked: the file's id is the base's, the segments' CRCs and the
    record's fields are the record's, and a base of its own is followed."""
    ident, keys, rec = base["id"], base["blobs"], base["record"]
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
    try:
        layout = schema.validate(rec, [opened.size(key) for key in keys])
        if not 0 <= start <= start + length <= rec["nbytes"] or start % layout.planes or length % layout.planes:
            raise CorruptCheckpointError(f"bytes {start}..{start + length} are not whole numbers of its record")
        out = torch.empty(length, dtype=torch.uint8, device=engines.work_device(layout, rec, device))
        stand_ins = [torch.empty(opened.size(key), dtype=torch.uint8, device="meta") for key in keys]
        for s, (at, n) in enumerate(schema._segments(rec["nbytes"], rec["segment"])):
            lo, hi = max(at, start), min(at + n, start + length)
            if lo >= hi:
                continue
            blobs = [*stand_ins[:s], opened.blob(keys[s]), *stand_ins[s + 1 :]]  # one segment's bytes at a time
            if state is not None:
                state.charge([blobs[s]], hi - lo, path)
            records.decode_into(blobs, rec, [(lo, out[lo - start : hi - start])], layout, parallel=False)
            opened.drop(blobs[s])
        out = out.to(device)
        if "delta" in rec:  # a base of its own: undone on this range too
            _undo_own_base(rec, out, start, opened.path, device, state, depth, cache)
    except MissingBaseError:
        raise
    except CheckpointError as err:
        message = str(err)
        raise type(err)(message if message.startswith(path) else f"its base {path}: {message}") from None
    return out


def _undo_own_base(
    rec: dict,
    out: torch.Tensor,
    start: int,
    holder: str,
    device: torch.device,
    state: LoadState | None,
    depth: int,
    cache: dict,
) -> None:
    """Undo the delta of base record ``rec`` (of the file ``holder``) on its decoded bytes ``out``, at ``start``."""
    inner = rec["delta"]["base"]
    if inner["record"].get("storages") != rec.get("storages") or inner["record"].get("nbytes") != rec["nbytes"]:
        raise CorruptCheckpointError(f"its base record in {inner['file']} does not lie as the record does")
    if state is not None:
        state.include(_stored_nbytes(inner["record"]))
    base_bytes = _decoded_range(holder, inner, start, out.numel(), device, state, depth + 1, cache)
    _undo_range(rec, [(start, out)] * len(rec["storages"]), start, base_bytes, clip=True)


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
