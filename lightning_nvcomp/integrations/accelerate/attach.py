"""Accelerate integration: ``accelerator.save_state`` writes the model, the optimizer, the scheduler and the
registered objects compressed; ``load_state`` reads them back (the files are ``torch.save`` zips).

Why it hooks where it does: Accelerate's save-state pre-hooks see only the model weights, and the optimizer - the
largest part - never passes through a hook. Every file ``save_state`` writes with ``torch.save``, though, goes
through one function, ``accelerate.checkpointing.save`` (see ``lightning_nvcomp._compat.accelerate``). While an attached Accelerator
runs ``save_state``, that name points to the shared :class:`~lightning_nvcomp.saving.writer.CheckpointWriter`; everything else (file names that
``load_state`` parses, automatic checkpoint naming, ``total_limit`` pruning, RNG states) stays Accelerate's own.
``load_state`` reads through ``accelerate.checkpointing.load`` likewise, with ``mmap=True``.
The model is written as ``pytorch_model.bin`` (``safe_serialization=False``), the name ``load_state`` falls back to.

Remote storage: ``save_state("s3://bucket/run/step-10")`` and ``load_state`` of a URL. Accelerate works on local
paths (``os.makedirs``, ``torch.save`` of its RNG states), so the attachment gives it a local scratch directory
standing for the URL: every file written through ``checkpointing.save`` (and every FSDP DCP directory) goes straight
to the URL, compressed (:class:`~lightning_nvcomp.saving.writer.CheckpointWriter`, an S3 multipart upload per file), and
what Accelerate writes itself (``random_states_N.pkl``, a scaler's, a stateful dataloader's) is uploaded from the
scratch directory after ``save_state`` returns, each file in one put; the scratch directory is then removed.
``load_state`` of a URL reads every file through ``checkpointing.load`` from the URL (parallel ranged reads), with
empty stand-ins in the scratch directory for Accelerate's existence checks. Automatic checkpoint naming into a URL
project directory (which lists and prunes the directory itself) is refused with a ValueError naming it, before
anything is created: pass ``save_state`` the URL.

FSDP with ``state_dict_type="SHARDED_STATE_DICT"``: the model and optimizer never reach ``checkpointing.save``;
Accelerate's FSDP functions write them with ``torch.distributed.checkpoint`` and a ``FileSystemWriter`` they make
themselves (directories ``pytorch_model_fsdp_<i>`` and ``optimizer_<i>``). While the attached ``save_state`` runs,
that writer is :class:`~lightning_nvcomp.dcp.NvcompFileSystemWriter` with the attachment's options, and while
``load_state`` runs, the reader is :class:`~lightning_nvcomp.dcp.NvcompFileSystemReader` (see
``lightning_nvcomp._compat.accelerate``); DCP's default reader reads the files too. Every rank writes its shards, synchronously
(``dcp.save``, also with ``async_save=True``). Accelerate's plugin collects that state with CPU offload by default
(``FullyShardedDataParallelPlugin.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)`` and the same in
``optim_state_dict_config``; FSDP2 takes its ``StateDictOptions(cpu_offload=...)`` from the former): for the
attached save the two configs are copies with ``offload_to_cpu=False``, so shards are coded on the GPU and only
compressed bytes reach host memory (``state_on_gpu=False`` keeps the plugin's; so does a plugin that offloads the
parameters). FSDP2 needs no extra GPU memory for that; FSDP1 keeps its copy of each rank's shard of the weights and
optimizer state on the GPU until the part is written. Loading keeps the plugin's settings. Those parts are not in
the savings metrics yet; ``Attachment.last_sharded`` has their stats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from lightning_nvcomp.errors import MissingExtraError

try:
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    from lightning_nvcomp._compat.accelerate import checkpoint_io_as, folders_save_state_deletes, optimizers_of
except ImportError as err:
    raise MissingExtraError("accelerate", "lightning_nvcomp.integrations.accelerate.attach (attach)", err) from err

from lightning_nvcomp._process import swapped
from lightning_nvcomp.integrations.dcp import DcpCheckpointStats, NvcompFileSystemReader, NvcompFileSystemWriter
from lightning_nvcomp.integrations.dcp.writer import new_policy
from lightning_nvcomp.options import Codec, DeltaOptions, Durability, SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter
from lightning_nvcomp.storage import is_url
from lightning_nvcomp.storage.remote.options import RemoteOptions


@dataclasses.dataclass(frozen=True)
class ShardedPart:
    """One DCP directory of an FSDP ``save_state`` (a model's or an optimizer's).

    Attributes:
        stats: the whole directory's figures, every rank's (``stats.ranks[r]``).
        devices: where the shards this rank handed the writer lived (see
            :attr:`~lightning_nvcomp.dcp.NvcompFileSystemWriter.shard_devices`).
    """

    stats: DcpCheckpointStats
    devices: frozenset[str]


class Attachment:
    """Compression attached to one ``Accelerator`` (made by :func:`attach`); :meth:`detach` undoes it."""

    def __init__(self, accelerator: Accelerator, writer: CheckpointWriter, state_on_gpu: bool = True) -> None:
        if isinstance(getattr(accelerator.save_state, "__self__", None), Attachment):
            raise ValueError("this Accelerator already has lightning_nvcomp attached: detach() it first")
        self.accelerator, self.writer, self.state_on_gpu = accelerator, writer, state_on_gpu
        self.dcp_policy = new_policy()  # FSDP sharded parts: the storage probed, the codecs calibrated once
        #: The DCP parts of the last FSDP sharded ``save_state``, by directory name (``pytorch_model_fsdp_0``,
        #: ``optimizer_0``); empty for other saves.
        self.last_sharded: dict[str, ShardedPart] = {}
        #: The DCP directories the last ``load_state`` read through ``NvcompFileSystemReader`` (FSDP sharded parts).
        self.last_sharded_loads: tuple[str, ...] = ()
        writer.savings.world_size = accelerator.num_processes
        self._save_state, self._load_state = accelerator.save_state, accelerator.load_state
        self._log = accelerator.log
        #: The step of the last ``accelerator.log(..., step=N)``: a save's metrics are logged at it, beside the run's
        #: losses (None before the first: at ``save_iteration``).
        self.logged_step: int | None = None
        accelerator.save_state = self.save_state
        accelerator.load_state = self.load_state
        accelerator.log = self.log

    def save_state(self, output_dir: str | None = None, safe_serialization: bool = True, **kwargs: Any) -> str:
        """``Accelerator.save_state``, compressed (``safe_serialization`` is ignored: the files are torch zips; FSDP
        sharded parts are compressed DCP directories). ``output_dir`` may be a URL (``s3://...``, see the module
        docstring); automatic naming into a URL project directory is refused (ValueError naming it) before anything
        is created."""
        self._check_naming(output_dir)
        self.writer.steps.watch(optimizers_of(self.accelerator))  # their steps timed until detach
        if self._prunes():  # Accelerate deletes older checkpoints now: they stay until the newer are durable
            self.wait()
            doomed, kept = folders_save_state_deletes(self.accelerator)
            if self.writer.chain is not None and doomed and self.accelerator.is_main_process:
                self.writer.chain.rescue(doomed, kept, self.writer.storage)  # what kept deltas need leaves them
        else:
            self.writer.raise_failures()
            self.flush()
        # the metrics go where the run's own values are: at the step of its last log call
        step = self.accelerator.save_iteration if self.logged_step is None else self.logged_step
        parts: list[NvcompFileSystemWriter] = []
        with self._standing_in(output_dir, upload=True) as (local_dir, at):

            def shard_writer(path: str | os.PathLike, **writer_kwargs: Any) -> NvcompFileSystemWriter:
                o = self.writer.options  # those the DCP writer acts on: its saves are synchronous
                parts.append(
                    NvcompFileSystemWriter(
                        at(path),
                        o.codec,
                        staging_mb=o.staging_mb,
                        remote=o.remote,
                        policy=self.dcp_policy,
                        **writer_kwargs,
                    )
                )
                return parts[-1]

            def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
                self._save(obj, at(f), save_on_each_node)

            with checkpoint_io_as(save=save, dcp_writer=shard_writer), self._sharded_state_on_gpu():
                location = self._save_state(local_dir, safe_serialization=False, **kwargs)
            location = at(location)
        # gather_stats is a collective: every rank made the same parts, in the same order
        self.last_sharded = {
            os.path.basename(os.fspath(p.path)): ShardedPart(p.gather_stats(), p.shard_devices) for p in parts
        }
        self.writer.commit(step, str(location))
        if not self.writer.options.async_save:
            self.flush()
        return location

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> Any:
        """``Accelerator.load_state``, after any background write has finished. Local files are memory-mapped
        (``torch.load(mmap=True)``): compressed bytes go from the page cache straight to the decoder; files at a URL
        are read by parallel ranged requests; FSDP sharded parts are read by
        :class:`~lightning_nvcomp.dcp.NvcompFileSystemReader`."""
        self._check_naming(input_dir)
        self.wait()
        reads: list[str] = []
        remote = self.writer.options.remote
        with self._standing_in(input_dir, upload=False) as (local_dir, at):

            def shard_reader(path: str | os.PathLike, **reader_kwargs: Any) -> NvcompFileSystemReader:
                reads.append(os.path.basename(os.fspath(path)))
                return NvcompFileSystemReader(at(path), remote=remote, **reader_kwargs)

            def load(original: Callable[..., Any]) -> Callable[..., Any]:
                def load_from(f: Any, map_location: Any = None, **load_kwargs: Any) -> Any:
                    target = at(f)
                    if not is_url(target):
                        return original(f, map_location=map_location, mmap=True, **load_kwargs)
                    with self.writer.storage_for(target).open_read(target) as stream:
                        return original(stream, map_location=map_location, **load_kwargs)

                return load_from

            try:
                with checkpoint_io_as(load=load, dcp_reader=shard_reader):
                    return self._load_state(local_dir, **kwargs)
            finally:
                self.last_sharded_loads = tuple(reads)

    @contextlib.contextmanager
    def _standing_in(self, directory: str | None, upload: bool) -> Iterator[tuple[str | None, Callable[[Any], Any]]]:
        """``(the directory to give Accelerate, the map from its paths to where they really are)``: ``directory``
        and the identity for a local one (or None); for a URL, a local scratch directory and the map of its paths
        to the URL. ``upload``: a save's scratch files are uploaded when the block ends without error; a load's
        scratch directory gets an empty stand-in for every entry at the URL (Accelerate checks some files exist)."""
        if directory is None or not is_url(directory):
            yield directory, _same
            return
        url = str(directory).rstrip("/")
        storage = self.writer.storage_for(url)
        scratch = tempfile.mkdtemp(prefix="lightning-nvcomp-accelerate-")

        def at(path: Any) -> Any:
            relative = os.path.relpath(os.fspath(path), scratch)
            if relative == ".":
                return url
            return path if relative.startswith("..") else f"{url}/{relative.replace(os.sep, '/')}"

        try:
            if not upload:
                for name in storage.listdir(url):
                    stand_in = os.path.join(scratch, name)
                    if storage.isdir(storage.join(url, name)):
                        os.makedirs(stand_in, exist_ok=True)
                    else:
                        open(stand_in, "wb").close()
            yield scratch, at
            if upload:
                for root, _, names in os.walk(scratch):
                    for name in names:
                        local = os.path.join(root, name)
                        with open(local, "rb") as source:
                            storage.write(at(local), functools.partial(shutil.copyfileobj, source))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @contextlib.contextmanager
    def _sharded_state_on_gpu(self) -> Iterator[None]:
        """Within the block, an FSDP sharded plugin's state-dict configs do not offload to the CPU (see the module
        docstring); the plugin's own objects are put back after (:func:`~lightning_nvcomp._process.swapped`)."""
        plugin = self._sharded_plugin() if self.state_on_gpu else None
        if plugin is None or _params_offloaded(plugin):
            yield
            return
        names = ("state_dict_config", "optim_state_dict_config")
        on_gpu = {name: _on_gpu for name in names if getattr(plugin, name) is not None}
        with swapped(plugin, wrapped=on_gpu):
            yield

    def _sharded_plugin(self) -> Any:
        """The Accelerator's FSDP plugin if it saves sharded state dicts, else None."""
        from torch.distributed.fsdp import StateDictType

        if self.accelerator.distributed_type != DistributedType.FSDP:
            return None
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        return plugin if getattr(plugin, "state_dict_type", None) == StateDictType.SHARDED_STATE_DICT else None

    def _check_naming(self, directory: Any) -> None:
        """Refuse a URL project directory where Accelerate uses it instead of ``directory`` (no directory given, or
        automatic checkpoint naming): Accelerate lists, creates and prunes that directory itself, locally."""
        config = getattr(self.accelerator, "project_configuration", None)
        automatic = bool(getattr(config, "automatic_checkpoint_naming", False))
        if directory is None or automatic:
            project_dir = getattr(self.accelerator, "project_dir", None) or getattr(config, "project_dir", None)
            if project_dir is not None and is_url(project_dir):
                raise ValueError(
                    f"lightning_nvcomp: Accelerate's automatic checkpoint naming cannot use the URL project directory "
                    f"{project_dir} (Accelerate lists and prunes it as a local directory); nothing was written. Pass "
                    "save_state / load_state the checkpoint's URL instead"
                )

    def _save(self, obj: Any, f: Any, save_on_each_node: bool = False) -> None:
        # Same rule as accelerate.utils.save: one writer per job, or one per node.
        state = PartialState()
        if state.is_local_main_process if save_on_each_node else state.is_main_process:
            self.writer.save(obj, f)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """``Accelerator.log``, remembering ``step`` (when given): the savings metrics of the next save are logged at
        it, beside the run's losses."""
        if step is not None:
            self.logged_step = step
        self._log(values, step=step, log_kwargs=log_kwargs)

    def _prunes(self) -> bool:
        """Whether ``save_state`` deletes older checkpoints (automatic naming with a ``total_limit``)."""
        config = self.accelerator.project_configuration
        return bool(config.automatic_checkpoint_naming and config.total_limit is not None)

    def flush(self) -> None:
        """Send the metrics of finished saves to the Accelerator's trackers (main process only), each at the step
        the run's last ``accelerator.log`` gave before its ``save_state`` (``save_iteration`` if none gave one)."""
        for step, metrics in self.writer.drain_metrics():
            if self.accelerator.is_main_process:
                self._log(metrics, step=step)

    def wait(self) -> None:
        """Wait for background writes (raising a failed one's error) and log their metrics."""
        self.writer.wait()
        self.flush()

    def detach(self) -> None:
        """Finish pending writes and give the Accelerator its own ``save_state`` / ``load_state`` back."""
        try:
            self.wait()
        finally:
            self.writer.close()
            self.accelerator.__dict__.pop("save_state", None)
            self.accelerator.__dict__.pop("load_state", None)
            self.accelerator.__dict__.pop("log", None)


def _same(path: Any) -> Any:
    return path


def _on_gpu(config: Any) -> Any:
    """A copy of an FSDP state-dict config that does not offload to the CPU."""
    return dataclasses.replace(config, offload_to_cpu=False)


def _params_offloaded(plugin: Any) -> bool:
    """Whether an FSDP plugin keeps the parameters on the CPU (FSDP1 ``CPUOffload(offload_params=True)``, FSDP2
    ``CPUOffloadPolicy``): the state is on the CPU anyway."""
    offload = plugin.cpu_offload
    if getattr(offload, "offload_params", False):
        return True
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy
    except ImportError:  # torch < 2.6 has no FSDP2 (Accelerate needs 2.6 for it)
        return False
    return isinstance(offload, CPUOffloadPolicy)


def attach(
    accelerator: Accelerator,
    codec: Codec | str | None = None,
    async_save: bool | None = None,
    gpu_hour_usd: float | None = None,
    staging_mb: float | None = None,
    probe_mb: float | None = None,
    interval_s: float | None = None,
    state_on_gpu: bool = True,
    remote: RemoteOptions | None = None,
    durable: Durability | str | None = None,
    host_buffer_mb: float | None = None,
    delta: DeltaOptions | None = None,
    *,
    options: SaveOptions | None = None,
) -> Attachment:
    """Make ``accelerator.save_state`` write compressed checkpoints and log the savings to its trackers.

    Args:
        accelerator: the Accelerator to attach to.
        codec: ``"auto"`` (default), ``"ans"``, ``"zstd"`` or ``"none"`` (a :class:`~lightning_nvcomp.options.Codec`
            or its name; see :func:`lightning_nvcomp.save`).
        async_save: write in the background; ``save_state`` returns once the snapshot is in host memory. The next
            ``save_state``, ``load_state``, :meth:`Attachment.wait` and :meth:`Attachment.detach` wait for it.
        gpu_hour_usd: price of a GPU-hour in USD, for the saved-dollars metric.
        staging_mb: MiB coded at once (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU); a save
            borrows about three times this much GPU memory.
        probe_mb: largest size in MiB of the one-off write-bandwidth probe per file system (default 256).
        interval_s: seconds between saves, for ``auto`` in async mode.
        state_on_gpu: FSDP sharded state dicts only: collect them without CPU offload for the save, so shards are
            coded on the GPU (see the module docstring); False: as the plugin says.
        remote: how checkpoints at URLs are reached (:class:`~lightning_nvcomp.storage.remote.RemoteOptions`).
        durable: when a checkpoint is on stable storage: ``"background"`` (default), ``"sync"`` or ``"os"`` (see
            :class:`~lightning_nvcomp.options.Durability`). Accelerate prunes old checkpoints itself (automatic
            naming with ``total_limit``): then each ``save_state`` first waits until the earlier ones are durable.
        host_buffer_mb: async saves: most MiB of compressed snapshots held in host memory (default: two checkpoints).
        delta: files as deltas of their namesakes in their keyframe's folder (:class:`~lightning_nvcomp.DeltaOptions`).
        options: the save options above in one :class:`~lightning_nvcomp.options.SaveOptions`; a keyword argument
            given beside it overrides its field.

    Returns: the :class:`Attachment`; ``detach()`` restores the Accelerator.

    Raises:
        ValueError, CodecUnavailableError: as :class:`~lightning_nvcomp.options.SaveOptions`, before anything is attached.
    """
    options = SaveOptions.merged(
        "attach",
        options,
        codec=codec,
        async_save=async_save,
        gpu_hour_usd=gpu_hour_usd,
        staging_mb=staging_mb,
        probe_mb=probe_mb,
        interval_s=interval_s,
        remote=remote,
        durable=durable,
        host_buffer_mb=host_buffer_mb,
        delta=delta,
    )
    return Attachment(accelerator, CheckpointWriter(options), state_on_gpu)
