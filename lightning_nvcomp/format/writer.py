"""Writing a checkpoint file: the records planned from an object's storages, coded into segments (a
:class:`Snapshot`), and the archive with the pickle that calls the decoders."""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple

import torch

from lightning_nvcomp._compat.torch import rebuild_with_state, tensor_state
from lightning_nvcomp._process import shared
from lightning_nvcomp.codec import pinned, schema
from lightning_nvcomp.codec import record as records
from lightning_nvcomp.codec.checksum import Checksum
from lightning_nvcomp.errors import CheckpointError
from lightning_nvcomp.format.bases import BaseFile, BaseRecord
from lightning_nvcomp.format.contents import Contents, _storage_of, _tensor_names, find_contents
from lightning_nvcomp.format.decode import Placement, decode_storage, decode_tensor, storage_check, tensor_check
from lightning_nvcomp.format.delta import encode_against
from lightning_nvcomp.format.plan import ALIGN, Record
from lightning_nvcomp.format.plan import plan as plan_records
from lightning_nvcomp.format.sink import MemorySink, SegmentSink
from lightning_nvcomp.format.zip import ArchiveWriter


def _storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


class _LayoutCache:
    """The byte layout last chosen for each record, by the memory it was coded from. A training run saves the same
    parameter and optimizer tensors again and again: choosing a layout (sampling entropy, trying gANS's typed model
    and checking it round-trips) costs ~4 ms per record on an H200, coding it ~1 ms. Every layout is lossless, so a
    stale entry (memory reused by other tensors) costs at most some ratio."""

    def __init__(self, size: int = 4096) -> None:
        self._layouts: OrderedDict[tuple, schema.Layout] = OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def get(self, key: tuple) -> schema.Layout | None:
        with self._lock:
            return self._layouts.get(key)

    def put(self, key: tuple, layout: schema.Layout) -> None:
        with self._lock:
            self._layouts[key] = layout
            self._layouts.move_to_end(key)
            while len(self._layouts) > self._size:
                self._layouts.popitem(last=False)


def _encoder(
    rec: Record, codec: str, segment: int | None, base: tuple[BaseFile, BaseRecord] | None = None
) -> tuple[records.Encoder, list[list[int]], dict]:
    """The coder of one record (its storages concatenated, each aligned), where each storage lies in it, and the
    fields its dict adds (a ``delta`` where ``base`` is given and a transform against that record pays)."""
    parts, table, storages, pos = [], [], [], 0
    for storage in rec.storages:
        data = _storage_bytes(storage)
        table.append([pos, data.numel()])
        parts.append(data)
        storages.append(data)
        pad = -data.numel() % ALIGN if len(rec.storages) > 1 else 0
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=rec.device))
        pos += data.numel() + pad
    coder = "raw" if codec == "none" else codec
    delta = _delta_encoder(storages, table, rec.dtype, coder, segment, base)
    if delta is not None:
        return delta[0], table, delta[1]
    key = (codec, rec.dtype, segment, tuple((s.device, s.data_ptr(), s.nbytes()) for s in rec.storages))
    layouts = shared("layouts", _LayoutCache)
    encoder = records.Encoder(parts, rec.dtype, coder, segment, layouts.get(key))
    layouts.put(key, encoder.coding.layout)
    return encoder, table, {}


def _delta_encoder(
    storages: list[torch.Tensor],
    table: list[list[int]],
    dtype: torch.dtype,
    coder: str,
    segment: int | None,
    base: tuple[BaseFile, BaseRecord] | None,
) -> tuple[records.Encoder, dict] | None:
    """The coder of a record's ``storages`` (lying at ``table``'s offsets) against ``base``'s record and the fields
    its dict adds, or None where the record is stored alone (no base, or a delta does not pay)."""
    if base is None or coder == "raw" or not storages or not base[1].fits(dtype, table):
        return None
    against = encode_against(storages, table, dtype, coder, *base)
    if against is None:
        return None
    transformed, delta = against
    return records.Encoder(transformed, dtype, coder, segment), {"delta": delta}


class _CodedRecord(NamedTuple):
    """One record as coded: what its dict is made from once every checksum is in (:meth:`Snapshot.write_to`)."""

    coding: records.Coding
    sizes: list[int]  # every chunk's stored size
    crcs: list[Checksum]  # every segment's CRC-32 (computing on CPU threads while the next segments are coded)
    blobs: list[_StoredBlob]
    storages: list[list[int]]  # (offset, nbytes) of each storage in the record
    device: str  # where the tensors lived (load(keep_on_gpu=True) puts CUDA ones back there)
    fields: dict  # more fields of its dict (a delta's)

    def record(self) -> dict:
        return records.describe(
            self.coding, self.sizes, self.crcs, storages=self.storages, device=self.device, **self.fields
        )


class _StorageKey:
    """A storage already (or soon) written as ``data/<key>``: the archive pickler's persistent id for it."""

    __slots__ = ("key", "nbytes")

    def __init__(self, key: str, nbytes: int) -> None:
        self.key, self.nbytes = key, nbytes


class _StoredBlob:
    """Pickles as a CPU uint8 tensor whose bytes are the entry ``data/<key>``, without holding them: a compressed
    segment can be written and freed long before the pickle is."""

    __slots__ = ("storage",)

    def __init__(self, key: str, nbytes: int) -> None:
        self.storage = _StorageKey(key, nbytes)

    def __reduce__(self) -> tuple:
        n = self.storage.nbytes
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, (n,), (1,), False, OrderedDict())


class _ArchivePickler(pickle.Pickler):
    """torch.save's pickling, where every tensor is a call of our decoders: dense tensors of :func:`decode_tensor`
    (``reductions``, by tensor id), every other storage of :func:`decode_storage` (``storage_reductions``, by
    ``_cdata``); the blobs are persistent ids of ``data/<key>`` entries, as torch.save stores storages."""

    def __init__(self, file: io.BytesIO, reductions: dict[int, tuple], storage_reductions: dict[int, Callable]) -> None:
        super().__init__(file, protocol=2)
        self.reductions, self.storage_reductions = reductions, storage_reductions

    def persistent_id(self, obj: object) -> tuple | None:
        if isinstance(obj, _StorageKey):
            return ("storage", torch.ByteStorage, obj.key, "cpu", obj.nbytes)
        return None

    def reducer_override(self, obj: object) -> Any:
        reduction = self.reductions.get(id(obj))
        if reduction is not None:
            return reduction
        untyped, dtype = _storage_of(obj)
        if untyped is None:
            return NotImplemented
        make = self.storage_reductions.get(untyped._cdata)
        if make is None:
            raise CheckpointError(f"a {type(obj).__name__} appeared in the object after its snapshot was taken")
        return make(dtype)


class Snapshot:
    """A checkpoint whose tensors are coded (their segments in host memory, or already written), ready to be
    written by any thread: :meth:`write_to`. Tensors in the saved object are not read again."""

    def __init__(
        self,
        obj: object,
        codec: str,
        raw_nbytes: int,
        encode_s: float,
        placements: dict[int, tuple[torch.Tensor, int, Placement, object]],
        storages: dict[int, tuple[int, int]],
        coded: list[_CodedRecord],
        kept: MemorySink | None,
    ) -> None:
        self.obj, self.codec, self.raw_nbytes, self.encode_s = obj, codec, raw_nbytes, encode_s
        self._placements, self._storages, self._coded, self._kept = placements, storages, coded, kept
        #: Of ``encode_s``, the seconds spent coding while the file was written (:meth:`coded_against`).
        self.recode_s = 0.0

    @property
    def held_nbytes(self) -> int:
        """The bytes of coded segments this snapshot holds in host memory until it is written."""
        return self._kept.nbytes if self._kept is not None else 0

    def coded_against(self, base: BaseFile, sink: SegmentSink) -> Snapshot:
        """This snapshot (held in host memory) with each record coded again against the same record of ``base`` where
        a delta pays, else as it was, into ``sink``: an async save's delta, made on the writer thread from the held
        segments (decoded where their tensors were), so that training waits for a standalone save's coding only.
        Each record's held segments are let go once it is done."""
        if self._kept is None:
            raise RuntimeError("only a snapshot held in host memory can be coded again")
        begin = time.perf_counter()
        held = self._kept.take()
        coded: list[_CodedRecord] = []
        with pinned.pool().pinning_nothing(), _coding_stream(t for t, *_ in self._placements.values()):
            for i, done in enumerate(self._coded):
                segments = [held.pop(blob.storage.key) for blob in done.blobs]
                coded.append(_coded_again(done, segments, self.codec, base, i, sink, coded))
        seconds = time.perf_counter() - begin
        again = Snapshot(
            self.obj,
            self.codec,
            self.raw_nbytes,
            self.encode_s + seconds,
            self._placements,
            self._storages,
            coded,
            None,
        )
        again.recode_s = seconds
        return again

    def write_to(self, writer: ArchiveWriter) -> None:
        """Write the segments kept in memory (if any), the pickle and the rest of the archive."""
        if self._kept is not None:
            self._kept.write_to(writer)
        encoded = [(c.blobs, c.record()) for c in self._coded]  # every checksum is in: each record is sealed
        reductions: dict[int, tuple] = {}
        for tensor_id, (_, slot, placement, attributes) in self._placements.items():
            blobs, meta = encoded[slot]
            args = (blobs, meta, *placement, tensor_check(meta, *placement))
            if attributes:  # as torch.save stores a tensor with Python attributes: set on the decoded tensor
                kind = torch.nn.Parameter if placement.parameter else torch.Tensor
                reductions[tensor_id] = (rebuild_with_state, (decode_tensor, kind, args, attributes))
            else:
                reductions[tensor_id] = (decode_tensor, args)

        def storage_reduction(slot: int, index: int) -> Callable[[str | None], tuple]:
            blobs, meta = encoded[slot]
            return lambda dtype: (decode_storage, (blobs, meta, index, dtype, storage_check(meta, index, dtype)))

        storage_reductions = {key: storage_reduction(*where) for key, where in self._storages.items()}
        buffer = io.BytesIO()
        _ArchivePickler(buffer, reductions, storage_reductions).dump(self.obj)
        writer.add_torch_metadata()
        writer.add("data.pkl", buffer.getbuffer())
        writer.finish("data.pkl")


def _code_records(
    plan: list[Record], codec: str, staging_nbytes: int | None, sink: SegmentSink, base: BaseFile | None
) -> list[_CodedRecord]:
    """Code the planned records in order, each segment put into ``sink`` (keyed ``0``, ``1``... in that order) as
    soon as it is in host memory; the records keep the segments' descriptions, not their bytes. Record ``i`` is
    coded against ``base``'s record ``i`` where they hold storages of one type and size (a run's next save)."""
    coded: list[_CodedRecord] = []
    for i, rec in enumerate(plan):
        against = (base, base.records[i]) if base is not None and i < len(base.records) else None
        encoder, table, fields = _encoder(rec, codec, staging_nbytes, against)
        coded.append(_sunk(encoder.coding, encoder, table, rec.device.type, fields, sink, coded))
    return coded


def _sunk(
    coding: records.Coding,
    segments: Iterable[records.Segment],
    table: list[list[int]],
    device: str,
    fields: dict,
    sink: SegmentSink,
    before: list[_CodedRecord],
) -> _CodedRecord:
    """A record coded as ``coding`` whose ``segments`` are put into ``sink`` as they come, keyed on from the segments
    of the records ``before`` it."""
    count = sum(len(c.blobs) for c in before)
    coded_record = _CodedRecord(coding, [], [], [], table, device, fields)
    for segment in segments:
        key = str(count)
        count += 1
        sink.put(key, segment)
        coded_record.sizes.extend(segment.sizes)
        coded_record.crcs.append(segment.crc)
        coded_record.blobs.append(_StoredBlob(key, segment.blob.numel()))
    return coded_record


def _coded_again(
    done: _CodedRecord,
    segments: list[records.Segment],
    codec: str,
    base: BaseFile,
    i: int,
    sink: SegmentSink,
    before: list[_CodedRecord],
) -> _CodedRecord:
    """Record ``i`` as held (``done``, its ``segments``) coded against record ``i`` of ``base`` into ``sink`` where a
    delta pays, else put there as it was coded."""
    against = (base, base.records[i]) if i < len(base.records) else None
    delta = None
    if against is not None and against[1].fits(done.coding.dtype, done.storages):
        data = records.decode([s.blob for s in segments], done.record(), _device(done.device))
        storages = [data[at : at + n] for at, n in done.storages]
        coder = "raw" if codec == "none" else codec
        delta = _delta_encoder(storages, done.storages, done.coding.dtype, coder, done.coding.segment, against)
    if delta is None:
        return _sunk(done.coding, segments, done.storages, done.device, done.fields, sink, before)
    return _sunk(delta[0].coding, delta[0], done.storages, done.device, delta[1], sink, before)


@contextlib.contextmanager
def _coding_stream(tensors: Iterable[torch.Tensor]) -> Iterator[None]:
    """On the GPU of ``tensors`` (if any: the writer thread's current device is not the rank's), a CUDA stream of its
    own (``recode-stream-<device>``) where their held records are coded again behind training: on the default stream
    their kernels would queue among training's, and each of their waits would wait for training's work too."""
    device = next((t.device for t in tensors if t.is_cuda), None)
    if device is None:
        yield
        return
    stream = shared(f"recode-stream-{device}", lambda: torch.cuda.Stream(device))
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


def _device(name: str) -> torch.device:
    """Where a held record whose tensors were on ``name`` decodes: their GPU where there is one."""
    return torch.device("cuda" if name == "cuda" and torch.cuda.is_available() else "cpu")


def snapshot(
    obj: object,
    codec: str,
    contents: Contents | None = None,
    isolate: bool = False,
    staging_nbytes: int | None = None,
    sink: SegmentSink | None = None,
    base: BaseFile | None = None,
) -> Snapshot:
    """Code every tensor of ``obj`` with ``codec`` (``ans``, ``zstd``; ``none``: stored raw, still checksummed),
    each coded segment put into ``sink`` as soon as it is in host memory.

    Args:
        obj: what to save.
        codec: the codec of every record.
        contents: what :func:`find_contents` found in ``obj`` (found here unless given).
        isolate: copy the rest of ``obj`` too (saves written while training goes on).
        staging_nbytes: a multiple of 512 bounding the records and segments coded at once, so a GPU save borrows
            about three times that much GPU memory (default: the coder's own, see :mod:`lightning_nvcomp.codec.engines`).
        sink: where the segments go (:mod:`.sink`); by default the snapshot keeps them in host memory (fresh copies)
            and writes them with the rest.
        base: an earlier checkpoint of the run, in the same directory: records are coded against it (:mod:`.delta`).
    """
    begin = time.perf_counter()
    contents = contents if contents is not None else find_contents(obj)
    memo: dict[int, object] = {id(t): t for t in contents.kept}
    if isolate:
        # The file is written later: freeze the structure (dicts, counters, callback states) as it is now; the
        # tensors and storages themselves are copied below, so the copy shares them.
        obj = copy.deepcopy(obj, memo=memo)
    names = _tensor_names(obj)
    plan, where = plan_records(contents.tensors, names, staging_nbytes, contents.storages)
    kept = MemorySink() if sink is None else None
    into = sink or kept
    assert into is not None
    held = pinned.pool().holding(sum(r.nbytes for r in plan if r.device.type == "cuda")) if kept is not None else None
    with held or contextlib.nullcontext():  # kept until written: pinned ahead while the first records are coded
        coded = _code_records(plan, codec, staging_nbytes, into, base)
    placements = {}
    for t in contents.tensors:
        slot, index = where[t.untyped_storage()._cdata]
        attributes = tensor_state(t)
        # By id, the tensor held: a tensor made while pickling (a sparse tensor's indices) must not take the id of
        # one made while its contents were found, and so its record, however late the snapshot is written.
        placements[id(t)] = (
            t,
            slot,
            Placement(
                index,
                int(t.storage_offset()),
                tuple(t.shape),
                tuple(t.stride()),
                t.requires_grad,
                type(t) is torch.nn.Parameter,
                names.get(id(t), "<unnamed>"),
            ),
            copy.deepcopy(attributes, memo) if isolate and attributes else attributes,
        )
    # Every planned storage: other tensors reach them too (the parts of a sparse tensor are made while pickling).
    return Snapshot(obj, codec, contents.nbytes, time.perf_counter() - begin, placements, where, coded, kept)
