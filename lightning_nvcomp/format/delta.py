"""Delta records in the file: a record's bytes coded against the same record of its base (:func:`encode_against`), and
undone with the base's bytes on load (:class:`Undoing`); what a file offers as a base is :mod:`.bases`', how its
bytes are read back :mod:`.base_reads`'.

A delta record names its base by file name (in its own directory), the base's zip ``serialization_id`` and the base
record whole (see docs/FORMAT.md, format 4). Decoding one opens the base, checks its id, reads that record's blobs and
decodes them (a base may be a delta itself: the chain is followed), all checked as any record is: a missing or
replaced base raises :class:`~lightning_nvcomp.errors.MissingBaseError` naming it, a damaged one
:class:`~lightning_nvcomp.errors.CorruptCheckpointError` naming it; never wrong bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from lightning_nvcomp.codec import delta as transforms
from lightning_nvcomp.codec import engines, layouts
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.segment import Parts
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, MissingBaseError
from lightning_nvcomp.format.base_reads import decoded_range, decoded_windows, stored_nbytes, undo_range
from lightning_nvcomp.format.bases import BaseFile, BaseRecord
from lightning_nvcomp.format.load_state import LoadState

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
    device, a base segment at a time: once for the samples (only their windows joined), and again as the record's
    segments are coded (a record of one segment: once, kept)."""
    itemsize = transforms.width(dtype)
    measured = [i for i, (_, nbytes) in enumerate(table) if nbytes >= _CHOOSE_NBYTES]
    try:
        source = _Against(storages, table, itemsize, base, rec)
        samples = source.samples(measured)
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


def _beside(base: BaseFile, rec: BaseRecord | None = None) -> dict:
    """The ``base`` field that names ``rec`` of ``base`` (its one record by default) where the chain found the file:
    by its own name, from beside itself."""
    return {**delta_field([], 1, base, rec or base.records[0])["base"], "file": os.path.basename(base.path)}


def transformed_against(
    items: list[tuple[torch.Tensor, BaseFile]], dtype: torch.dtype, codec: str
) -> list[tuple[torch.Tensor, dict] | None]:
    """Each buffer of ``items`` (1-D uint8, numbers of ``dtype``, a record of its own: a DCP item) transformed against
    the one record of its base, in memory of its own, with the record's ``delta`` field; None where it codes smaller
    alone, or its base's chain is broken. The bases are decoded whole on the buffers' device (the caller bounds how
    many bytes at once) and the transforms chosen on all of them together: one engine call per candidate."""
    itemsize = transforms.width(dtype)
    decoded: list[torch.Tensor | None] = []
    for data, base in items:
        try:
            decoded.append(decoded_range(base.path, _beside(base), 0, data.numel(), data.device, None, 0, {}))
        except CheckpointError as err:  # its chain is broken (a base pruned, replaced, damaged): it stands alone
            log.warning("lightning_nvcomp: %s cannot be a base (%s): the item is stored alone", base.path, err)
            decoded.append(None)
    pairs = [(data, found) for (data, _), found in zip(items, decoded) if found is not None]
    choices = iter(transforms.choose(pairs, itemsize, lambda windows: layouts.coded_nbytes(windows, dtype, codec)))
    out: list[tuple[torch.Tensor, dict] | None] = []
    for (data, base), found in zip(items, decoded):
        transform = next(choices) if found is not None else None
        if found is None or transform is None:
            out.append(None)
            continue
        transforms.apply(transform, data, found, itemsize, found)
        out.append((found, delta_field([transform], itemsize, base, base.records[0])))
    return out


class _Against(Parts):
    """A record's bytes transformed against its base record, made a range at a time as its segments are coded
    (:meth:`slice`), the base's range decoded for each (a record of one base segment: decoded once, kept)."""

    def __init__(
        self, storages: list[torch.Tensor], table: list[list[int]], itemsize: int, base: BaseFile, rec: BaseRecord
    ) -> None:
        self.storages, self.table, self.itemsize, self.base, self.rec = storages, table, itemsize, base, rec
        self.nbytes = int(rec.record["nbytes"])
        self.transforms: list[str | None] = [None] * len(storages)
        self._cache: dict = {}
        self._whole: torch.Tensor | None = None
        self._named = _beside(base, rec)

    @property
    def device(self) -> torch.device:
        return self.storages[0].device

    @property
    def one_tensor(self) -> bool:
        return len(self.storages) == 1

    def _range(self, start: int, length: int) -> torch.Tensor:
        return decoded_range(self.base.path, self._named, start, length, self.device, None, 0, self._cache)

    def samples(self, measured: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each storage ``measured``, a window around its middle and the base's bytes there (what
        :func:`transforms.choose` takes), the base's segments decoded once each (a record of one: kept)."""
        windows = []
        for i in measured:
            start, nbytes = self.table[i]
            at = max(0, nbytes // 2 - transforms.SAMPLE_NBYTES) // 128 * 128
            windows.append((start + at, min(nbytes - at, 2 * transforms.SAMPLE_NBYTES)))
        if len(base_spans(self.rec.record)) == 1:  # decoded once, for the samples, the layout's and the coding
            self._whole = self._range(0, self.nbytes)
            bases = [self._whole[lo : lo + n] for lo, n in windows]
        else:
            bases = self._base_windows(windows)
        return [
            (self.storages[i][lo - self.table[i][0] :][:n], base) for i, (lo, n), base in zip(measured, windows, bases)
        ]

    def _base_windows(self, windows: list[tuple[int, int]]) -> list[torch.Tensor]:
        """The base's bytes of each of ``windows`` (in order); on a GPU through :func:`gathered_windows`, each run of
        them within a segment's length decoded as one range: there each window decoded and joined alone costs a dozen
        kernel launches, each of which lets the GIL go (an async save's writer thread then waits to take it back
        while the training loop runs Python)."""
        if self.device.type == "cpu" or not windows:
            return decoded_windows(self.base.path, self._named, windows, self.device, None, 0, self._cache)
        return gathered_windows(self._range, windows, base_spans(self.rec.record)[0][1])

    def transform_whole(self) -> None:
        """A record of one base segment, kept: its transforms made in place, once (its slices are then views)."""
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


def gathered_windows(
    decoded: Callable[[int, int], torch.Tensor], windows: list[tuple[int, int]], span_nbytes: int
) -> list[torch.Tensor]:
    """The bytes of each of ``windows`` (``(start, length)``, in order, apart) of a buffer whose range ``decoded(start,
    length)`` gives: each run of windows within ``span_nbytes`` decoded as one range and gathered out of it in one
    copy (the range is let go), the windows views of that copy."""
    runs: list[list[tuple[int, int]]] = []
    for lo, n in windows:
        if runs and lo + n - runs[-1][0][0] <= span_nbytes:
            runs[-1].append((lo, n))
        else:
            runs.append([(lo, n)])
    out: list[torch.Tensor] = []
    for run in runs:
        first = run[0][0]
        hull = decoded(first, run[-1][0] + run[-1][1] - first)
        out += torch.cat([hull[lo - first : lo - first + n] for lo, n in run]).split([n for _, n in run])
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
    the other on one core). Where the record's segments are its base's, each is undone on the thread that decoded it,
    right after (:meth:`by_segment`: no wait between decoding the record and undoing it); else once the record is
    decoded (:meth:`finish`).

    Args:
        rec: the delta record. holder: the path of the file that holds it (None: the load's file). state: the load's
            (the base is decoded within its bound, which :func:`base_stored_nbytes` widened; its ``bases`` keep the
            bases' opened files for the rest of the load). device: where the record's storages are.
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
        self.spans = [span for span in base_spans(base["record"]) if self._windows(span)]
        # On the CPU a base with none of its own that decodes there is decoded into the record's storages, each
        # transform undone as its bytes are joined (one pass over them, no copy of the base); else each base segment's
        # bytes are decoded (gANS on a GPU), then undone, the first of them on a segment thread from the start.
        codecs = base["record"].get("codecs")
        decodes_here = isinstance(codecs, list) and not engines.decodes_on_gpu_only(codecs)
        self._into = device.type == "cpu" and "delta" not in base["record"] and decodes_here
        prefetch = device.type == "cpu" and self.spans and not self._into
        self._first = records.segment_pool().submit(self._decoded, self.spans[0]) if prefetch else None

    def _windows(self, span: tuple[int, int]) -> list[tuple[int, int, int, str]]:
        """``(storage index, start, length, transform)`` of each transformed storage's bytes in ``span`` (a storage
        kept as it is needs none of its base's bytes)."""
        windows = []
        for j, ((at, nbytes), transform) in enumerate(zip(self.rec["storages"], self.rec["delta"]["transforms"])):
            lo, hi = max(at, span[0]), min(at + nbytes, span[0] + span[1])
            if transform != "none" and lo < hi:
                windows.append((j, lo, hi - lo, transform))
        return windows

    def _decoded(self, span: tuple[int, int]) -> list[tuple[int, torch.Tensor]]:
        """The base's bytes where a transformed storage lies in ``span``, each window at its offset."""
        windows = [(lo, n) for _, lo, n, _ in self._windows(span)]
        if not windows:
            return []
        if self.device.type != "cpu":  # on a GPU a join costs its calls, not its bytes: the span at once
            windows = [(windows[0][0], windows[-1][0] + windows[-1][1] - windows[0][0])]
        found = decoded_windows(self.name, self.base, windows, self.device, self.state, 1, self.state.bases)
        return [(start, base_bytes) for (start, _), base_bytes in zip(windows, found)]

    def _undone_into(self, placed: list[tuple[int, torch.Tensor]], span: tuple[int, int]) -> None:
        """Undo the transforms in ``span`` (a base segment) on the storages' bytes there, the base's decoded into them."""
        windows = self._windows(span)
        if not windows:
            return
        itemsize = self.rec["delta"]["itemsize"]
        into = [(placed[j][1][lo - placed[j][0] :][:n], (transform, itemsize)) for j, lo, n, transform in windows]
        spans = [(lo, n) for _, lo, n, _ in windows]
        decoded_windows(self.name, self.base, spans, self.device, self.state, 1, self.state.bases, into=into)

    def _placed(self, pieces: list[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
        """Each storage's decoded bytes and where it starts in the record."""
        return [(at, piece) for (at, _), piece in zip(self.rec["storages"], pieces)]

    def _undo(self, placed: list[tuple[int, torch.Tensor]], windows: list[tuple[int, torch.Tensor]]) -> None:
        for start, base_bytes in windows:
            undo_range(self.rec, placed, start, base_bytes)

    def by_segment(self, pieces: list[torch.Tensor]) -> Callable[[int, int], None] | None:
        """What undoes the record a segment at a time as ``records.decode_into(..., after=)`` decodes it on the CPU into
        ``pieces`` (its storages), or None where its segments are not its base's (then :meth:`finish` it)."""
        if self.device.type != "cpu" or self.rec.get("segment") != self.base["record"].get("segment"):
            return None
        placed = self._placed(pieces)
        first = self.spans[0][0] if self.spans else None

        def undo_segment(start: int, length: int) -> None:
            if self._into:
                self._undone_into(placed, (start, length))
                return
            ready = self._first is not None and start == first
            self._undo(placed, self._first.result() if ready else self._decoded((start, length)))  # type: ignore[union-attr]

        return undo_segment

    def finish(self, pieces: list[torch.Tensor]) -> None:
        """Undo the transforms on the record's decoded ``pieces`` (its storages, in place)."""
        placed = self._placed(pieces)

        def one(span: tuple[int, int]) -> None:  # a base segment: its ranges of the storages are theirs alone
            if self._into:
                self._undone_into(placed, span)
            else:
                self._undo(placed, self._decoded(span))

        rest = self.spans
        if self._first is not None:
            self._undo(placed, self._first.result())
            rest = rest[1:]
        if self.device.type == "cpu" and len(rest) > 1:  # the base's segments on the segment threads, as the record's
            for _ in records.segment_pool().map(one, rest):
                pass
        else:
            for span in rest:
                one(span)


def base_spans(rec: dict) -> list[tuple[int, int]]:
    """``(start, length)`` of each segment of the base record ``rec`` (validated when decoded: a malformed ``segment``
    stands for one)."""
    nbytes = rec.get("nbytes")
    nbytes = nbytes if type(nbytes) is int and nbytes > 0 else 0
    window = rec.get("segment")
    window = window if type(window) is int and window > 0 else max(nbytes, 1)
    return [(start, min(window, nbytes - start)) for start in range(0, nbytes, window)]


def base_stored_nbytes(rec: dict) -> int:
    """The stored bytes of a delta record's base record (what its load reads from the base)."""
    return stored_nbytes(rec["delta"]["base"]["record"])
