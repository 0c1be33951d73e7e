"""The data files of one rank's DCP save: :class:`DataFiles` writes a plan's items into ``.distcp`` files, byte
items as they are and each tensor item as its own compressed archive (coded in batches on the GPU or CPU threads,
written on a disk thread while the next batch is coded; tiny items' archives built on a thread of their own and
written last), ``thread_count`` files at once."""

from __future__ import annotations

import io
import itertools
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import torch
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from lightning_nvcomp._compat import dcp as _compat
from lightning_nvcomp.errors import CheckpointError
from lightning_nvcomp.format import items as tensor_items
from lightning_nvcomp.format.bases import BaseFile
from lightning_nvcomp.format.item_batches import RAW_NBYTES, CodedTensor, code_deltas, code_tensors, storable
from lightning_nvcomp.format.sink import DiskThread
from lightning_nvcomp.format.writer import Snapshot, snapshot
from lightning_nvcomp.format.zip import ArchiveWriter
from lightning_nvcomp.integrations.dcp.metadata import NvcompStorageInfo, data_file_header
from lightning_nvcomp.integrations.dcp.staging import ENCODE_LOCK, StagedShard, compact
from lightning_nvcomp.saving.single_file import flush_stream

#: A file's write results, the seconds spent coding its items, and its tensor shards' device types.
Outcome = tuple[list[WriteResult], float, frozenset[str]]


@dataclass
class DataFiles:
    """How one save's data files are written.

    Args:
        fs: the writer's file system (``create_stream``, ``concat_path``).
        path: the checkpoint directory.
        codec: the codec of every tensor item (decided for this save).
        staged: shards ``dcp.async_save`` compressed while staging, by their placeholder's storage address.
        staging_nbytes: GPU scratch bound of an item stored through ``torch.save``'s pickling.
        fsync: flush each local file to the disk once written.
        checkpoint_id: this save's checkpoint id: in every file's name (``__<rank>_<n>.<id>.distcp``: no save
            reuses a name another one wrote, so an overwritten checkpoint keeps its files until the new ``.metadata``
            replaces its own, and no reader of one checkpoint opens another's file), in the file's header
            (:func:`~lightning_nvcomp.integrations.dcp.metadata.data_file_header`) and in every item's storage info.
        thread_count: files written at once.
        single_file_per_rank: one file per thread (else one per item), as ``FileSystemWriter``.
        bases: each tensor item's base, an item of an earlier save it is coded against where that codes smaller
            (:class:`~lightning_nvcomp.integrations.dcp.chain.ItemChain`); None: every item alone.
    """

    fs: Any
    path: Any
    codec: str
    staged: dict[int, StagedShard]
    staging_nbytes: int | None
    fsync: bool
    checkpoint_id: str
    thread_count: int = 1
    single_file_per_rank: bool = True
    bases: Callable[[WriteItem], BaseFile | None] | None = None

    def write(self, plan: SavePlan, planner: SavePlanner) -> list[Outcome]:
        """Write the plan's items into data files, ``thread_count`` files at once; each file's outcome."""
        names = (f"{plan.storage_data.prefix}{n}.{self.checkpoint_id}{DEFAULT_SUFFIX}" for n in itertools.count())
        buckets = (
            _compat.split_by_size_and_type(self.thread_count, plan.items)
            if self.single_file_per_rank
            else [[item] for item in plan.items]
        )
        jobs: queue.Queue = queue.Queue()
        for bucket in buckets:
            jobs.put((next(names), bucket))
        outcomes: list[Outcome] = []
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while True:
                    try:
                        name, items = jobs.get_nowait()
                    except queue.Empty:
                        return
                    outcomes.append(self._write_file(name, items, planner))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=worker, name=f"lnv-dcp-{i}") for i in range(1, self.thread_count)]
        for t in threads:  # the collector is paused (the writer's write_data)
            t.start()
        worker()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return outcomes

    def _staged_shard(self, item: WriteItem, data: torch.Tensor) -> CodedTensor | None:
        """The shard ``dcp.async_save`` compressed while staging for this item, if it is one."""
        if not self.staged or not data.numel():
            return None
        shard = self.staged.get(data.untyped_storage().data_ptr())
        if shard is None:
            return None
        held = shard.placeholder
        if (
            data.shape != held.shape
            or data.dtype != held.dtype
            or data.stride() != held.stride()
            or data.storage_offset()
        ):
            raise CheckpointError(
                f"item {item.index.fqn!r}: the planner asks for a view {tuple(data.shape)} of a shard compressed "
                f"while staging {tuple(held.shape)}; save with stage_compress='none'"
            )
        return shard.coded

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> Outcome:
        """Write one data file: byte items as they are, then the tensor items, coded in batches
        (:func:`~lightning_nvcomp.format.item_batches.code_tensors`) and each written as its own archive on a
        :class:`~lightning_nvcomp.format.sink.DiskThread` while the next batch is coded, the tiny ones (under
        :data:`~lightning_nvcomp.format.item_batches.RAW_NBYTES`) last. Returns the write results, the seconds spent
        coding and the tensor shards' device types."""
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "wb") as stream:
            file = _DataFile(stream, name, self.codec, self.checkpoint_id)
            results = file.write_bytes([i for i in items if i.type == WriteItemType.BYTE_IO], planner)
            begin = time.perf_counter()
            tensor_items = [i for i in items if i.type != WriteItemType.BYTE_IO]
            ready, to_code, devices = self._resolve(tensor_items, planner)
            # The disk thread writes the items in the order they are coded, but for the tiny ones: their archives are
            # Python work (a record, a pickle and zip entries each, 22 us apiece on a 2-core VM), built on a thread
            # of their own while the disk thread writes the larger items, and written after them.
            with (
                DiskThread() as disk,
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="lnv-dcp-archive") as archiver,
            ):
                writes = [disk.put(file.write, ready)]
                built = []
                with ENCODE_LOCK:
                    to_code = self._code_deltas(to_code, lambda pairs: writes.append(disk.put(file.write, pairs)))
                    # streamed: a large CPU tensor's segments are written as they are coded (dcp.save holds the
                    # tensors unchanged until write_data returns)
                    for batch in code_tensors([(i.index.fqn, d) for i, d in to_code], self.codec, streamed=True):
                        pairs = [(to_code[index][0], coded) for index, coded in batch]
                        if all(coded.raw_nbytes < RAW_NBYTES for _, coded in pairs):
                            built.append(archiver.submit(file.build, pairs))
                        else:
                            writes.append(disk.put(file.write, pairs))
                encode_s = time.perf_counter() - begin
                writes.extend(disk.put(file.append, b) for b in built)
                results.extend(r for w in writes for r in w.result())
            if self.fsync:
                flush_stream(stream)
        return results, encode_s, frozenset(devices)

    def _code_deltas(
        self, to_code: list[tuple[WriteItem, torch.Tensor]], write: Callable[[list[tuple[WriteItem, Stored]]], None]
    ) -> list[tuple[WriteItem, torch.Tensor]]:
        """Code as deltas the items that have a base and code smaller against it, ``write`` each batch; the others."""
        if self.bases is None:
            return to_code
        rest, against = [], []
        for item, data in to_code:
            base = self.bases(item)
            if base is None:
                rest.append((item, data))
            else:
                against.append((item, data, base))
        for coded, alone in code_deltas([(item.index.fqn, data, base) for item, data, base in against], self.codec):
            if coded:
                write([(against[i][0], result) for i, result in coded])
            rest.extend(against[i][:2] for i in alone)
        return rest

    def _resolve(
        self, items: list[WriteItem], planner: SavePlanner
    ) -> tuple[list[tuple[WriteItem, Stored]], list[tuple[WriteItem, torch.Tensor]], set[str]]:
        """The tensor items' data: those stored already (compressed while staging, or through ``torch.save``'s
        pickling), those to code, and the device types of their shards (0-d ones left out)."""
        ready: list[tuple[WriteItem, Stored]] = []
        to_code: list[tuple[WriteItem, torch.Tensor]] = []
        devices: set[str] = set()
        for item in items:
            data = cast(torch.Tensor, planner.resolve_data(item))
            if data.requires_grad:  # a tensor object less per item where none does
                data = data.detach()
            coded = self._staged_shard(item, data)
            if data.dim():
                devices.add(coded.device if coded is not None else data.device.type)
            if coded is not None:
                ready.append((item, coded))
            elif storable(data):
                to_code.append((item, data))
            else:  # what the coder does not store whole (subclasses...): through torch.save's pickling
                data = compact(data.cpu())
                ready.append((item, snapshot(data, self.codec, staging_nbytes=self.staging_nbytes)))
        return ready, to_code, devices


#: A tensor item as written: coded as a record of its own, or a snapshot of it (through ``torch.save``'s pickling).
Stored = CodedTensor | Snapshot
#: An archive written: its item, its length, the item's raw bytes and the directory of its base (a delta's).
_Written = tuple[WriteItem, int, int, str | None]


class _DataFile:
    """One data file being written, from its header on: its items placed one after another, each tensor item as its
    own archive (:func:`~lightning_nvcomp.format.items.write_tensor`).

    Args:
        stream: the file. name: its name. codec: the codec of its tensor items. checkpoint_id: the save's.
    """

    def __init__(self, stream: Any, name: str, codec: str, checkpoint_id: str) -> None:
        self.stream, self.name, self.codec, self.checkpoint_id = stream, name, codec, checkpoint_id
        header = data_file_header(checkpoint_id, name)
        stream.write(header)
        # Offsets are counted here, not asked of the stream: a local file's tell() is a system call, one per item.
        self.position = len(header)
        self.serialization_id = str(secrets.randbits(128)).zfill(40)  # the file's items share torch.save's records

    def write_bytes(self, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        """Write byte items as they are; their write results."""
        results = []
        for item in items:
            payload = cast(io.BytesIO, planner.resolve_data(item)).getbuffer()
            self.stream.write(payload)
            info = NvcompStorageInfo(self.name, self.position, payload.nbytes, checkpoint_id=self.checkpoint_id)
            results.append(WriteResult(item.index, payload.nbytes, info))
            self.position += payload.nbytes
        return results

    def write(self, batch: Sequence[tuple[WriteItem, Stored]]) -> list[WriteResult]:
        """Write a batch of tensor items (on the disk thread); their write results."""
        out = _Coalesced(self.stream)
        written = []
        for item, stored in batch:
            if isinstance(stored, CodedTensor):  # its bytes are the batch's: unchanged until out.flush()
                written.append(self._archive(out, item, stored))
            else:
                out.flush()
                archive = ArchiveWriter(cast(BinaryIO, self.stream))
                stored.write_to(archive)
                written.append((item, archive.nbytes, stored.raw_nbytes, None))
        out.flush()
        return self._place(written)

    def build(self, batch: list[tuple[WriteItem, CodedTensor]]) -> tuple[_Pieces, list[_Written]]:
        """Tiny items' archives, built in memory (their bytes are the batch's) for :meth:`append`."""
        pieces = _Pieces()
        return pieces, [self._archive(pieces, item, coded) for item, coded in batch]

    def append(self, built: Future[tuple[_Pieces, list[_Written]]]) -> list[WriteResult]:
        """Write archives :meth:`build` built (on the disk thread); their write results."""
        pieces, written = built.result()
        out = _Coalesced(self.stream)
        for piece in pieces:
            out.write(piece)
        out.flush()
        return self._place(written)

    def _archive(self, out: _Coalesced | _Pieces, item: WriteItem, coded: CodedTensor) -> _Written:
        """Write ``coded`` as its item's archive to ``out``."""
        writer = ArchiveWriter(cast(BinaryIO, out))
        tensor_items.write_tensor(writer, coded, self.serialization_id)
        base = coded.fields["delta"]["base"]["file"].rsplit("/", 1)[0] if "delta" in coded.fields else None
        return item, writer.nbytes, coded.raw_nbytes, base

    def _place(self, written: list[_Written]) -> list[WriteResult]:
        """The write results of archives written from the position on."""
        done = []
        for item, length, raw_nbytes, base in written:
            info = NvcompStorageInfo(
                self.name,
                self.position,
                length,
                codec=self.codec,
                raw_nbytes=raw_nbytes,
                checkpoint_id=self.checkpoint_id,
                base=base,
            )
            done.append(WriteResult(item.index, length, info))
            self.position += length
        return done


class _Pieces(list):
    """A file object that keeps what is written to it, in order (it must stay unchanged until written out)."""

    def write(self, data: bytes | memoryview) -> int:
        self.append(data)
        return len(data)


class _Coalesced:
    """Writes to ``stream`` in few calls: runs of small writes (an item's zip records, a tiny item's bytes) are
    joined into one write of up to :attr:`RUN_NBYTES`, a large one goes as it is. :meth:`flush` writes the rest.
    What is written must stay unchanged until then."""

    SMALL_NBYTES = 64 << 10
    RUN_NBYTES = 1 << 20

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._run: list[memoryview] = []
        self._run_nbytes = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        if view.nbytes >= self.SMALL_NBYTES:
            self.flush()
            self._stream.write(view)
        else:
            self._run.append(view)
            self._run_nbytes += view.nbytes
            if self._run_nbytes >= self.RUN_NBYTES:
                self.flush()
        return view.nbytes

    def flush(self) -> None:
        if self._run:
            self._stream.write(b"".join(self._run))
            self._run, self._run_nbytes = [], 0
