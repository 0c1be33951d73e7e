"""Lightning's sharded checkpoints, compressed: ``FSDPStrategy(state_dict_type="sharded")`` and
``ModelParallelStrategy`` (distributed checkpoints) through :mod:`lightning_nvcomp.dcp`.

Why a strategy subclass: these strategies never call the CheckpointIO for sharded saves, and they give
torch.distributed.checkpoint no storage writer: they call ``dcp.save(state, checkpoint_id=path)`` in one
module-level helper, ``_distributed_checkpoint_save``. The subclasses are those strategies with one change: while
their ``save_checkpoint`` runs, that helper writes through :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`.
That is visible in the Trainer's configuration and scoped to one strategy instance, where a global patch of
Lightning would not be, and everything else (the state-dict layout, the ``meta.pt`` file, every rank's plan) stays
Lightning's. Loading needs no change (DCP's default reader decodes these files wherever lightning_nvcomp is
installed), but the compressed strategies' ``load_checkpoint`` reads the sharded state through the compressed
reader, which decodes in bulk.

The state stays on the GPU. Lightning collects a sharded state with CPU offload (``ShardedStateDictConfig(
offload_to_cpu=True)`` for FSDP, ``StateDictOptions(cpu_offload=True)`` for ModelParallel), so its writer gets host
copies of every shard. For their sharded saves the compressed strategies collect the same state with the offload
off (``lightning_module_state_dict`` and ``optimizer_state``): the writer codes the shards where they live and only
compressed bytes reach host memory. "Full" saves, and FSDP with ``cpu_offload`` (parameters already on the CPU), keep
Lightning's collection. The cost is GPU memory while the save runs: nothing with ModelParallelStrategy (FSDP2 hands
out the sharded parameters and optimizer tensors themselves), but FSDP1 (``FSDPStrategy``) builds a copy of each
rank's shard of the weights and of the optimizer state, which now stays on the GPU until the save ends instead of
moving to host memory tensor by tensor; ``state_on_gpu=False`` gives Lightning's offload back.
"""

from __future__ import annotations

import abc
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from lightning_nvcomp._compat.dcp import filesystem_classes_as
from lightning_nvcomp._compat.lightning import (
    DISTRIBUTED_LOAD,
    DISTRIBUTED_SAVE,
    distributed_checkpoint_helper_as,
    fsdp_saves_sharded,
    model_parallel_saves_distributed,
)
from lightning_nvcomp.errors import MissingExtraError
from lightning_nvcomp.integrations.lightning.config import one_line_errors
from lightning_nvcomp.options import Codec, DeltaOptions, SaveOptions
from lightning_nvcomp.storage import storage_for

try:
    import lightning.fabric.strategies.model_parallel as model_parallel_loader
    import lightning.pytorch.strategies.fsdp as fsdp_strategy
    import lightning.pytorch.strategies.model_parallel as model_parallel_strategy
    from lightning.fabric.utilities.rank_zero import rank_zero_info
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
except ImportError as err:
    raise MissingExtraError("lightning", "NvcompFSDPStrategy and NvcompModelParallelStrategy", err) from err

from lightning_nvcomp.integrations.dcp import DcpCheckpointStats, NvcompFileSystemReader, NvcompFileSystemWriter
from lightning_nvcomp.integrations.dcp.chain import ItemChain
from lightning_nvcomp.integrations.dcp.writer import new_policy
from lightning_nvcomp.telemetry import savings as telemetry
from lightning_nvcomp.telemetry.stats import SaveStats

#: The :class:`~lightning_nvcomp.options.SaveOptions` fields the compressed strategies act on (their sharded saves are
#: synchronous ``dcp.save`` calls to local directories).
STRATEGY_OPTIONS = ("codec", "staging_mb", "gpu_hour_usd", "delta")


@dataclass(frozen=True)
class CollectedState:
    """How the state of a sharded save reached the writer.

    Attributes:
        offloaded: whether any of it was collected Lightning's way, with CPU offload (None: the strategy's state
            collection was not called for this save).
        devices: the device types (``"cuda"``, ``"cpu"``) of the tensors handed to the writer (a ShardedTensor's:
            its local shards'), 0-d ones left out (an optimizer's ``step``, which PyTorch keeps on the CPU).
    """

    offloaded: bool | None
    devices: frozenset[str]


def rank_metrics(stats: DcpCheckpointStats) -> dict[str, float]:
    """Each rank's share of a distributed checkpoint, under ``nvcomp/rank<r>/`` (``stats.ranks[r]`` is rank r's)."""
    metrics = {}
    for rank, r in enumerate(stats.ranks):
        prefix = f"{telemetry.PREFIX}rank{rank}/"
        metrics.update(
            {
                prefix + "raw_gb": r.raw_nbytes / 1e9,
                prefix + "stored_gb": r.file_nbytes / 1e9,
                prefix + "ratio": r.ratio,
                prefix + "encode_s": r.encode_s,
                prefix + "write_s": r.write_s,
            }
        )
    return metrics


class CompressedShardedSaves(abc.ABC):
    """What the compressed strategies add to Lightning's: the codec, the savings, and the metrics for
    :class:`~lightning_nvcomp.NvcompSavings` (the same names as :class:`~lightning_nvcomp.NvcompCheckpointIO`'s,
    for the whole checkpoint, plus each rank's bytes and times under ``nvcomp/rank<r>/``).

    The savings baseline is the slowest rank's raw bytes over the per-writer bandwidth measured with all ranks
    writing at once: when an uncompressed sharded save would have finished.
    """

    _saver_module: ModuleType  # the Lightning module whose `_distributed_checkpoint_save` the strategy calls
    _loader_module: ModuleType  # and whose `_distributed_checkpoint_load` its load_checkpoint calls

    def __init__(
        self,
        *args: Any,
        codec: Codec | str | None = None,
        staging_mb: float | None = None,
        gpu_hour_usd: float | None = None,
        delta: DeltaOptions | None = None,
        options: SaveOptions | None = None,
        state_on_gpu: bool = True,
        **kwargs: Any,
    ) -> None:
        # The same options object as the checkpoint IO's: an unknown codec, or one this machine cannot run, fails
        # here, before the strategy is built and anything is written.
        options = SaveOptions.merged(
            type(self).__name__,
            options,
            uses=STRATEGY_OPTIONS,
            codec=codec,
            staging_mb=staging_mb,
            gpu_hour_usd=gpu_hour_usd,
            delta=delta,
        )
        super().__init__(*args, **kwargs)
        self.options = options
        #: The delta chain of this rank's sharded saves (None: every item alone).
        self.chain = ItemChain(options.delta) if options.delta is not None else None
        self.policy = new_policy()  # this strategy's saves: the storage probed, the codecs calibrated once
        self.state_on_gpu = state_on_gpu
        self.savings = telemetry.Savings(self.options.gpu_hour_usd)
        self.logger_attached = False
        self.console: Callable[[str], None] | None = None  # the savings callback's, as NvcompCheckpointIO's
        self.last_stats: DcpCheckpointStats | None = None
        #: How the last sharded save's state reached the writer (None before the first).
        self.last_state: CollectedState | None = None
        self._metrics: list[tuple[int, dict[str, float]]] = []
        self._offloaded: list[bool] = []  # one per state collection since the last save: with CPU offload?
        #: Sharded state reads made through the compressed reader by :meth:`load_checkpoint` so far.
        self.sharded_loads = 0

    # -- the state, collected where it lives ------------------------------------------------------------------

    # Each strategy below says how it saves and collects its state (a subclass missing one cannot be made).

    @abc.abstractmethod
    def _saves_sharded(self) -> bool:
        """Whether this strategy's saves are sharded ones (through DCP, so through the compressed writer)."""

    def _params_offloaded(self) -> bool:
        """Whether the parameters live on the CPU anyway (FSDP's ``cpu_offload``)."""
        return False

    @abc.abstractmethod
    def _module_state_on_device(self) -> dict[str, Any]:
        """The model's sharded state, collected where it lives (no CPU offload)."""

    @abc.abstractmethod
    def _optimizer_state_on_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's sharded state, collected where it lives (no CPU offload)."""

    def _collect_on_device(self) -> bool:
        on_device = self.state_on_gpu and self._saves_sharded() and not self._params_offloaded()
        self._offloaded.append(not on_device)
        return on_device

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The model's state: for a sharded save (``state_on_gpu``), collected without CPU offload."""
        if self._collect_on_device():
            return self._module_state_on_device()
        return super().lightning_module_state_dict()  # type: ignore[misc]

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state: for a sharded save (``state_on_gpu``), collected without CPU offload."""
        if self._collect_on_device():
            unwrapped = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
            return self._optimizer_state_on_device(unwrapped)
        return super().optimizer_state(optimizer)  # type: ignore[misc]

    # -- the save ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        writers: list[NvcompFileSystemWriter] = []
        offloaded, self._offloaded = self._offloaded, []

        def compressed_save(converted_state: dict[str, Any], path: Path) -> None:
            o = self.options
            writer = NvcompFileSystemWriter(
                path, o.codec, staging_mb=o.staging_mb, policy=self.policy, chain=self.chain
            )
            writers.append(writer)
            dcp.save(converted_state, storage_writer=writers[-1])
            self.last_state = CollectedState(any(offloaded) if offloaded else None, writers[-1].shard_devices)

        step = int(checkpoint.get("global_step", 0))
        begin = time.perf_counter()
        with distributed_checkpoint_helper_as(self._saver_module, DISTRIBUTED_SAVE, compressed_save):
            super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]
        if writers:  # a sharded save (a "full" one went through the CheckpointIO)
            self._record(writers[0], time.perf_counter() - begin, step, os.fspath(filepath))

    def remove_checkpoint(self, filepath: Any) -> None:
        """Lightning's pruning (top-k): with deltas, a checkpoint directory is deleted only once no checkpoint beside
        it needs it (read from their ``.metadata``), by this call or a later one."""
        if self.chain is None or not self.is_global_zero:  # type: ignore[attr-defined]
            super().remove_checkpoint(filepath)  # type: ignore[misc]
            return
        storage = storage_for(os.path.abspath(filepath))
        for path in self.chain.removable(os.path.abspath(filepath), storage):
            super().remove_checkpoint(path)  # type: ignore[misc]

    # -- the load -----------------------------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Lightning's load, with the sharded state read through
        :class:`~lightning_nvcomp.dcp.NvcompFileSystemReader` (bulk decoding, on the GPU for CUDA targets; it
        reads uncompressed checkpoints too). :attr:`sharded_loads` counts the sharded reads it made."""

        def reader(path: str | os.PathLike, **kwargs: Any) -> NvcompFileSystemReader:
            self.sharded_loads += 1
            return NvcompFileSystemReader(path, **kwargs)

        def compressed_load(state: dict[str, Any], path: Path) -> None:
            dcp.load(state, storage_reader=reader(path))

        with (
            distributed_checkpoint_helper_as(self._loader_module, DISTRIBUTED_LOAD, compressed_load),
            filesystem_classes_as(reader=reader),  # FSDP1's optimizer state: FSDPStrategy makes this reader itself
        ):
            return super().load_checkpoint(checkpoint_path, *args, **kwargs)  # type: ignore[misc]

    def _record(self, writer: NvcompFileSystemWriter, blocked_s: float, step: int, path: str) -> None:
        stats = self.last_stats = writer.gather_stats()  # collectives: every rank saves, so every rank is here
        per_writer_gbps = writer.write_gbps()
        slowest_raw = max(r.raw_nbytes for r in stats.ranks)
        whole = SaveStats(
            path,
            stats.codec,
            stats.raw_nbytes,
            stats.stored_nbytes,
            max(r.encode_s for r in stats.ranks),
            max(r.write_s for r in stats.ranks),
            prediction=stats.ranks[0].prediction,  # auto: rank 0 decides for every rank (one rank's share)
        )
        # As one writer at the aggregate rate: the slowest rank's raw bytes take raw / gbps at the per-writer rate.
        aggregate_gbps = per_writer_gbps * stats.raw_nbytes / slowest_raw if slowest_raw else per_writer_gbps
        metrics = self.savings.add(whole, blocked_s, whole.raw_nbytes / (aggregate_gbps * 1e9))
        metrics.update(rank_metrics(stats))
        self._metrics.append((step, metrics))
        (self.console or rank_zero_info)(f"{telemetry.summary(path, whole, metrics)} ({len(stats.ranks)} ranks)")

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) of the sharded saves since the last call."""
        drained, self._metrics = self._metrics, []
        return drained

    def wait(self) -> None:
        """Saves are synchronous: nothing to wait for (the savings callback calls this before it reads metrics)."""
        return None


one_line_errors(CompressedShardedSaves)  # for both strategies below: made by a LightningCLI config


class NvcompFSDPStrategy(CompressedShardedSaves, FSDPStrategy):
    """``FSDPStrategy`` whose sharded checkpoints (``state_dict_type="sharded"``) are compressed per rank on the GPU.

    Args:
        codec: ``"auto"`` (default), ``"ans"``, ``"zstd"`` or ``"none"``, a :class:`~lightning_nvcomp.options.Codec`
            or its name (see :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`).
        staging_mb: MiB coded at once per shard (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU).
        gpu_hour_usd: price of a GPU-hour in USD, for the saved-dollars metric.
        delta: each rank's items coded against the same items of its keyframe save where that is smaller
            (:class:`~lightning_nvcomp.DeltaOptions`, see docs/guides/delta.md); pruning keeps the checkpoints that
            kept ones need.
        options: the :class:`~lightning_nvcomp.options.SaveOptions` every entry point takes, of which the strategy
            uses ``codec``, ``staging_mb``, ``gpu_hour_usd`` and ``delta`` (another field set is refused); a keyword argument
            given beside it overrides its field.
        state_on_gpu: collect the sharded state without CPU offload, so shards are coded on the GPU (FSDP keeps its
            copy of the rank's weights and optimizer state on the GPU until the save ends); False: Lightning's
            offload. Ignored with ``cpu_offload`` and for ``state_dict_type="full"``.
        *args: ``FSDPStrategy``'s positional arguments.
        **kwargs: ``FSDPStrategy``'s keyword arguments.

    Raises:
        ValueError, CodecUnavailableError: as :class:`~lightning_nvcomp.options.SaveOptions` (an unknown codec, a size
            that is not a positive number of MiB, a codec this machine cannot run, a field the strategy does not use),
            before the strategy is built.
    """

    _saver_module = _loader_module = fsdp_strategy

    def _saves_sharded(self) -> bool:
        return fsdp_saves_sharded(self)

    def _params_offloaded(self) -> bool:
        return bool(self.cpu_offload.offload_params)

    @contextlib.contextmanager
    def _sharded_on_device(self) -> Iterator[None]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import StateDictType
        from torch.distributed.fsdp.api import ShardedOptimStateDictConfig, ShardedStateDictConfig

        assert self.model is not None
        with FSDP.state_dict_type(
            self.model,
            StateDictType.SHARDED_STATE_DICT,
            ShardedStateDictConfig(offload_to_cpu=False),
            ShardedOptimStateDictConfig(offload_to_cpu=False),
        ):
            yield

    def _module_state_on_device(self) -> dict[str, Any]:
        assert self.model is not None
        with self._sharded_on_device():
            return self.model.state_dict()

    def _optimizer_state_on_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        assert self.model is not None
        with self._sharded_on_device():
            return FSDP.optim_state_dict(self.model, optimizer)


_ON_DEVICE = StateDictOptions(full_state_dict=False, cpu_offload=False)


class NvcompModelParallelStrategy(CompressedShardedSaves, ModelParallelStrategy):
    """``ModelParallelStrategy`` whose distributed checkpoints are compressed per rank on the GPU.

    Args:
        codec: ``"auto"`` (default), ``"ans"``, ``"zstd"`` or ``"none"``, a :class:`~lightning_nvcomp.options.Codec`
            or its name (see :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter`).
        staging_mb: MiB coded at once per shard (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU).
        gpu_hour_usd: price of a GPU-hour in USD, for the saved-dollars metric.
        delta: each rank's items coded against the same items of its keyframe save where that is smaller
            (:class:`~lightning_nvcomp.DeltaOptions`, see docs/guides/delta.md); pruning keeps the checkpoints that
            kept ones need.
        options: the :class:`~lightning_nvcomp.options.SaveOptions` every entry point takes, of which the strategy
            uses ``codec``, ``staging_mb``, ``gpu_hour_usd`` and ``delta`` (another field set is refused); a keyword argument
            given beside it overrides its field.
        state_on_gpu: collect the distributed state without CPU offload, so shards are coded on the GPU (no extra
            GPU memory: the writer gets the sharded tensors themselves); False: Lightning's offload. Ignored with
            ``save_distributed_checkpoint=False``.
        *args: ``ModelParallelStrategy``'s positional arguments.
        **kwargs: ``ModelParallelStrategy``'s keyword arguments.

    Raises:
        ValueError, CodecUnavailableError: as :class:`~lightning_nvcomp.options.SaveOptions` (an unknown codec, a size
            that is not a positive number of MiB, a codec this machine cannot run, a field the strategy does not use),
            before the strategy is built.
    """

    _saver_module = model_parallel_strategy
    _loader_module = model_parallel_loader

    def _saves_sharded(self) -> bool:
        return model_parallel_saves_distributed(self)

    def _module_state_on_device(self) -> dict[str, Any]:
        assert self.model is not None
        return get_model_state_dict(self.model, options=_ON_DEVICE)

    def _optimizer_state_on_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        assert self.model is not None
        return get_optimizer_state_dict(self.model, optimizer, options=_ON_DEVICE)
