"""The storage writer, :class:`NvcompFileSystemWriter`: DCP's ``FileSystemWriter`` with each local shard stored
compressed (``write_data``), compressed already while ``dcp.async_save`` stages (``stage``, see
:mod:`~lightning_nvcomp.integrations.dcp.staging`), and a checked ``.metadata`` written atomically (``finish``), in a
local directory or at a URL (:mod:`~lightning_nvcomp.integrations.dcp.filesystem`)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystemWriter
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE, Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from lightning_nvcomp._compat import dcp as _compat
from lightning_nvcomp._process import PauseBetweenCalls, collector_paused, shared
from lightning_nvcomp.auto.policy import CodecPolicy
from lightning_nvcomp.auto.prediction import Prediction
from lightning_nvcomp.integrations.dcp.chain import ItemChain
from lightning_nvcomp.integrations.dcp.data_files import DataFiles
from lightning_nvcomp.integrations.dcp.filesystem import OnStorage
from lightning_nvcomp.integrations.dcp.metadata import METADATA, NvcompStorageInfo, _CheckedMetadata, new_checkpoint_id
from lightning_nvcomp.integrations.dcp.staging import (
    STAGE_DEVICES,
    StagedShard,
    Stager,
    local_tensors,
)
from lightning_nvcomp.integrations.dcp.stats import DcpCheckpointStats, gather
from lightning_nvcomp.options import Codec, DeltaOptions, SaveOptions, mb_of_nbytes
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.telemetry.stats import SaveStats

#: The :class:`~lightning_nvcomp.options.SaveOptions` fields the writer acts on.
WRITER_OPTIONS = ("codec", "staging_mb", "remote", "delta")
#: What ``stage_compress`` may be: which shards ``dcp.async_save``'s staging compresses (the rest are copied).
STAGE_COMPRESS = tuple(STAGE_DEVICES)
#: Data files this writer (or DCP's) may have left in a checkpoint directory.
_DATA_FILE = re.compile(r"^__\d+_\d+(\.[0-9a-f]+)?" + re.escape(DEFAULT_SUFFIX) + "$")


def new_policy() -> CodecPolicy:
    """A policy for the sharded saves of one run, which its run object keeps (a compressed strategy, an
    attachment) and gives every writer it makes: the storage is probed and the codecs calibrated once per run."""
    return CodecPolicy(mode="sync", collective=True, per_tensor=True)  # write_data codes item by item


def default_policy(mode: str) -> CodecPolicy:
    """The policy behind ``codec="auto"`` when none is given: one per process and mode, so that writers made one per
    save with no run object to keep a policy (``dcp.save(state, storage_writer=NvcompFileSystemWriter(path))``)
    probe the storage once. Both modes share one set of measurements: the storage is probed and the codecs
    calibrated once, whichever save comes first."""
    if mode == "sync":
        return shared("dcp-policy-sync", new_policy)
    return shared(f"dcp-policy-{mode}", lambda: default_policy("sync").in_mode(mode))


def _existing_dir(path: Path) -> str:
    for p in (path, *path.parents):
        if p.is_dir():
            return str(p)
    return "."


@dataclasses.dataclass
class DataFilePrefix:
    """A plan's ``storage_data``: the prefix of the rank's data file names (DCP's) and the save's checkpoint id."""

    prefix: str
    checkpoint_id: str


#: The checkpoint ids this process has written data files with (see :func:`_checkpoint_id`).
_WRITTEN_IDS: set[str] = set()


def _checkpoint_id(plan: SavePlan) -> str:
    """The checkpoint id of the save whose final plan this is: the one the coordinator drew, unless this process
    wrote with it already - DCP's plan caching (``DefaultSavePlanner(enable_plan_caching=True)``) hands every rank
    the final plan of an earlier save - and then one of this rank's own (each item records its file's id, so that
    binds as well)."""
    checkpoint_id = getattr(plan.storage_data, "checkpoint_id", None)
    if checkpoint_id is None or checkpoint_id in _WRITTEN_IDS:
        checkpoint_id = new_checkpoint_id()
    _WRITTEN_IDS.add(checkpoint_id)
    return checkpoint_id


def _check_arguments(stage_compress: str, thread_count: int, extensions: Sequence[Any] | None) -> None:
    """Refuse the writer's own arguments that cannot be honoured (ValueError naming them)."""
    if stage_compress not in STAGE_COMPRESS:
        raise ValueError(f"stage_compress must be one of {STAGE_COMPRESS}, not {stage_compress!r}")
    if type(thread_count) is not int or thread_count < 1:
        raise ValueError(f"thread_count (files written at once) must be a positive int, not {thread_count!r}")
    if extensions:
        raise ValueError("NvcompFileSystemWriter compresses shards itself; DCP stream extensions are not supported")


def _tally(infos: Sequence[Any]) -> tuple[int, int, int]:
    """``(items, raw bytes, stored bytes)`` of the tensor items this writer stored (byte items are stored as they are,
    with no codec)."""
    ours = [i for i in infos if isinstance(i, NvcompStorageInfo) and i.codec is not None]
    return len(ours), sum(i.raw_nbytes or 0 for i in ours), sum(i.length for i in ours)


class NvcompFileSystemWriter(OnStorage, FileSystemWriter):
    """DCP ``FileSystemWriter`` that stores every local shard compressed (see :mod:`lightning_nvcomp.integrations.dcp`).

    Args:
        path: the checkpoint directory: a local path (as ``FileSystemWriter``) or a URL (``s3://bucket/run/step-10``:
            each data file one upload, ``.metadata`` written last; see
            :mod:`~lightning_nvcomp.integrations.dcp.filesystem`).
        codec: ``"ans"`` (nvCOMP gANS; GPU only, needs a GPU to load), ``"zstd"`` (nvCOMP Zstd on CUDA shards, CPU
            zstd otherwise; loads anywhere), ``"none"`` (stored as is, still our metadata and stats), or
            ``"auto"`` (default: the codec with the shortest predicted save: all ranks probe the storage together,
            rank 0 decides, the choice is broadcast); a :class:`~lightning_nvcomp.options.Codec` or its name.
        options: a run's :class:`~lightning_nvcomp.options.SaveOptions`, of which the writer uses ``codec``,
            ``staging_mb``, ``remote`` and ``delta`` (another field set is refused); a keyword argument given beside it
            overrides its field.
        staging_mb: MiB coded at once per shard (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU;
            see :func:`lightning_nvcomp.format.snapshot`).
        remote: how a URL ``path`` is reached (:class:`~lightning_nvcomp.storage.remote.RemoteOptions`).
        delta: code each tensor item against the same item of this writer's keyframe save, where that is smaller
            (:class:`~lightning_nvcomp.DeltaOptions`; reuse the writer for a run's saves: see docs/guides/delta.md).
        chain: the delta chain to go on with, a run object's that makes a writer per save (default: the writer's own).
        policy: the :class:`CodecPolicy` behind ``"auto"`` (default: one per process and mode, with
            ``collective=True``).
        stage_compress: what ``dcp.async_save``'s staging compresses: ``"gpu"`` (CUDA shards, on the GPU; CPU shards
            are copied and compressed in the background), ``"all"`` (every shard at staging: least host memory,
            training waits for CPU compression), ``"none"`` (DCP's staging copies everything; compression runs in
            the background on the CPU).
        staging_nbytes: deprecated: ``staging_mb`` in bytes.
        process_group: the group ``"auto"`` broadcasts its decision in and :meth:`gather_stats` gathers over
            (default: the default group; must be the group DCP saves with).

    Other arguments are ``FileSystemWriter``'s; ``_extensions`` is refused (stream transforms would re-encode
    compressed bytes).

    Raises:
        ValueError: an unknown codec or ``stage_compress``, a ``staging_mb`` or ``thread_count`` that is not
            positive, a save option the writer does not use, stream extensions. CodecUnavailableError: the codec
            cannot run on this machine (``"ans"`` without a CUDA GPU and nvCOMP). Checked here, as
            :class:`~lightning_nvcomp.options.SaveOptions` checks every entry point's options, before anything is
            written.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        codec: Codec | str | None = None,
        *,
        options: SaveOptions | None = None,
        staging_mb: float | None = None,
        remote: RemoteOptions | None = None,
        delta: DeltaOptions | None = None,
        chain: ItemChain | None = None,
        policy: CodecPolicy | None = None,
        stage_compress: str = "gpu",
        staging_nbytes: int | None = None,
        process_group: dist.ProcessGroup | None = None,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int = 1,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Sequence[Any] | None = None,
    ) -> None:
        owner = type(self).__name__
        staging_mb = mb_of_nbytes(owner, "staging_nbytes", staging_nbytes, staging_mb)
        options = SaveOptions.merged(
            owner, options, uses=WRITER_OPTIONS, codec=codec, staging_mb=staging_mb, remote=remote, delta=delta
        )
        _check_arguments(stage_compress, thread_count, _extensions)
        super().__init__(
            path,
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=cache_staged_state_dict,
            overwrite=overwrite,
        )
        #: The :class:`~lightning_nvcomp.options.SaveOptions` this writer saves with.
        self.options = options
        self.remote = options.remote
        self._use_storage(path, self.remote)
        self.codec = options.codec
        self.policy = policy
        self.stage_compress = stage_compress
        self.staging_nbytes = options.staging_nbytes
        self.process_group = process_group
        #: The delta chain of this writer's saves (None: every item stored alone).
        self.chain = chain if chain is not None else ItemChain(options.delta) if options.delta is not None else None
        #: This rank's :class:`~lightning_nvcomp.telemetry.stats.SaveStats` of the last save (None before the first).
        self.stats: SaveStats | None = None
        #: On the coordinator after a save: ``{"raw_nbytes", "stored_nbytes", "items"}`` over all ranks.
        self.totals: dict[str, int] | None = None
        #: Device types (``"cuda"``, ``"cpu"``) of the tensor shards of this rank's last save, 0-d ones (an
        #: optimizer's ``step``) left out; for an async save, where they were staged from.
        self.shard_devices: frozenset[str] = frozenset()
        self._chosen: tuple[Codec, Prediction | None] | None = None  # decided while staging, used by the next write
        self._stage_s = 0.0
        self._staged: dict[int, StagedShard] = {}  # placeholder storage data_ptr -> shard compressed at staging
        self._planning = PauseBetweenCalls(self)  # the collector, from set_up_storage_writer to write_data's end

    # -- codec choice -------------------------------------------------------------------------------------------

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and getattr(self, "use_collectives", True)

    def write_gbps(self) -> float:
        """Write bandwidth of one writer to this checkpoint's storage, GB/s, measured once per run and file system
        with every rank writing at once (a collective the first time: every rank calls it)."""
        return (self.policy or default_policy("sync")).write_gbps(self._directory())

    def _directory(self) -> str:
        """The directory the storage is measured in: the checkpoint's URL, or its nearest existing local directory."""
        return str(self.path) if self.remote_path else _existing_dir(Path(self.path))

    def _agree_codec(self, tensors: list[torch.Tensor], mode: str) -> tuple[Codec, Prediction | None]:
        """The codec of this save, and for ``auto`` the prediction behind it: every rank probes the storage together,
        rank 0 decides, and its prediction is broadcast (every rank must call this at the same point)."""
        if self.codec is not Codec.AUTO:
            return self.codec, None
        policy = self.policy or default_policy(mode)
        directory = self._directory()
        distributed = self._distributed()
        rank = dist.get_rank(self.process_group) if distributed else 0
        policy.write_gbps(directory)  # collective the first time: all ranks write at once
        if rank == 0:  # the rank that decides learns the interval between saves
            policy.save_started()
        choice = [policy.decide(tensors, directory)[0] if rank == 0 else None]
        if distributed:
            # src is a global rank (group_src, the group's own rank 0, needs torch 2.6)
            src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
            dist.broadcast_object_list(choice, src=src, group=self.process_group)
        prediction = cast(Prediction, choice[0])
        return prediction.codec, prediction

    def _write_codec(self, plan: SavePlan, planner: SavePlanner) -> tuple[Codec, Prediction | None]:
        """The codec of a ``dcp.save`` (``dcp.async_save`` chose it while staging); ``auto`` decides on the plan's
        tensors, and a rank that cannot resolve them still takes part in the collective choice before failing."""
        if self.codec is not Codec.AUTO:
            return self.codec, None
        error: BaseException | None = None
        tensors: list[torch.Tensor] = []
        try:
            tensors = [
                cast(torch.Tensor, planner.resolve_data(item))
                for item in plan.items
                if item.type != WriteItemType.BYTE_IO
            ]
        except BaseException as err:
            error = err
        choice = self._agree_codec(tensors, "sync")
        if error is not None:
            raise error
        return choice

    # -- async staging ------------------------------------------------------------------------------------------

    def stage(self, state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
        """``dcp.async_save``'s staging: compress CUDA shards on the GPU (``stage_compress``), copy the rest. Training
        waits for it: the garbage collector is paused meanwhile (see :func:`~lightning_nvcomp._process.collector_paused`)."""
        begin = time.perf_counter()
        self._staged = {}
        with collector_paused():
            tensors = local_tensors(state_dict)
            self._chosen = self._agree_codec(tensors, "async")
            devices = STAGE_DEVICES[self.stage_compress]
            if _compat.STAGE_COPIES and not any(t.device.type in devices for t in tensors):
                staged = super().stage(state_dict)
            else:
                stager = Stager(self._chosen[0].value, devices)
                staged = stager.stage(state_dict)
                self._staged = stager.shards
        self._stage_s = time.perf_counter() - begin
        return staged

    # -- writing ------------------------------------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self._use_storage(checkpoint_id, self.remote)
        super().reset(checkpoint_id)
        self.totals = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """DCP calls this before it plans the save: the garbage collector is paused from here to the end of
        :meth:`write_data` (see :class:`~lightning_nvcomp._process.PauseBetweenCalls`)."""
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self._planning.begin()

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's file name prefixes, and this save's checkpoint id, drawn here on the coordinator (or on each rank
        for rank-local metadata, ``use_collectives=False``) and handed to every rank with its plan, so that all the
        data files of one ``.metadata`` carry the same id."""
        checkpoint_id = new_checkpoint_id()
        return [
            dataclasses.replace(plan, storage_data=DataFilePrefix(plan.storage_data.prefix, checkpoint_id))
            for plan in super().prepare_global_plan(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        with self._planning.through():  # the items of thousands would set off full collections too
            results = self._write_plan(plan, planner)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _write_plan(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        """Write the plan's items into data files and note this save's stats."""
        begin = time.perf_counter()
        staged, self._staged = self._staged, {}
        stage_s, self._stage_s = self._stage_s, 0.0
        chosen, self._chosen = self._chosen, None
        codec, prediction = chosen if chosen is not None else self._write_codec(plan, planner)
        directory = str(self.path) if self.remote_path else os.path.abspath(self.path)  # as the delta chain compares
        world_size = dist.get_world_size(self.process_group) if self._distributed() else 1
        files = DataFiles(
            self.fs,
            self.path,
            codec.value,  # the name the files record
            staged,
            self.staging_nbytes,
            fsync=self.sync_files and not self.remote_path,  # a remote file is durable once its upload completes
            checkpoint_id=_checkpoint_id(plan),
            thread_count=self.thread_count,
            single_file_per_rank=self.single_file_per_rank,
            bases=self.chain.bases(directory, world_size, self.storage) if self.chain is not None else None,
        )
        outcomes = files.write(plan, planner)
        results = [r for rs, _, _ in outcomes for r in rs]
        if self.chain is not None:
            self.chain.written(directory, world_size, plan.items, results)
        seconds = time.perf_counter() - begin
        encode_s = sum(e for _, e, _ in outcomes)
        self.shard_devices = frozenset().union(*(devices for _, _, devices in outcomes))
        items, raw_nbytes, stored_nbytes = _tally([r.storage_data for r in results])
        self.stats = SaveStats(
            path=str(self.path),
            codec=codec,
            raw_nbytes=raw_nbytes,
            file_nbytes=stored_nbytes,
            encode_s=encode_s,
            write_s=max(0.0, seconds - encode_s),  # coding overlaps the writes: SaveStats.seconds is the wall time
            prediction=prediction,
            stage_s=stage_s,
            items=items,
        )
        if self.codec is Codec.AUTO:
            (self.policy or default_policy("sync")).observe_write(self._directory(), stored_nbytes, seconds)
        return results

    @collector_paused()
    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write ``.metadata`` atomically, with its CRC-32 (see ``_checked_metadata``; the new checkpoint exists from
        that instant), then delete data files no longer referenced (an overwritten checkpoint's). The garbage
        collector is paused meanwhile: the metadata of thousands of items set off full collections."""
        infos = [r.storage_data for rs in results for r in rs]
        items, raw_nbytes, stored_nbytes = _tally(infos)
        self.totals = {"raw_nbytes": raw_nbytes, "stored_nbytes": stored_nbytes, "items": items}
        if not _compat.use_collectives(self) and self.rank is not None:
            super().finish(metadata, results)  # rank-local metadata files: DCP's own way
            return
        _compat.stamp_dcp_version(metadata)
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        checked = _CheckedMetadata(metadata)
        directory = os.fspath(self.path)
        self.storage.write(self.storage.join(directory, METADATA), lambda f: pickle.dump(checked, f))
        referenced = {i.relative_path for i in infos}
        for entry in self.storage.listdir(directory):
            if _DATA_FILE.match(entry) and entry not in referenced:
                try:
                    self.storage.remove(self.storage.join(directory, entry))
                except OSError:
                    pass

    # -- telemetry ----------------------------------------------------------------------------------------------

    def gather_stats(self) -> DcpCheckpointStats:
        """Every rank's stats of the last save, on every rank (a collective when distributed: all ranks call it,
        after the save has finished on all of them - for ``async_save``, after its future)."""
        mine = self.stats or SaveStats(str(self.path), self.codec, 0, 0, 0.0, 0.0)
        return gather(mine, self.process_group, self._distributed())
