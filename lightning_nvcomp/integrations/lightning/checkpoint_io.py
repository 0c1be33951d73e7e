"""Lightning integration: a ``CheckpointIO`` that writes compressed checkpoints, and the callback that logs savings.

``NvcompCheckpointIO`` derives from ``lightning.fabric``'s ``CheckpointIO`` and is registered as a virtual subclass
of ``lightning_fabric``'s, so the same object plugs into ``lightning.pytorch`` and ``pytorch_lightning`` Trainers
and Fabric. The savings callback is installed in every Trainer through Lightning's ``callbacks_factory`` entry
points (see pyproject.toml) and stays idle unless the Trainer's checkpoint IO is ours.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from lightning_nvcomp.errors import MissingExtraError

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
    from lightning.pytorch import Callback as _Callback
    from tqdm import tqdm
except ImportError as err:
    raise MissingExtraError("lightning", "NvcompCheckpointIO and NvcompSavings", err) from err

import torch

from lightning_nvcomp import format as fileformat
from lightning_nvcomp.codec import pinned
from lightning_nvcomp.integrations.dcp.staging import local_tensors_named
from lightning_nvcomp.integrations.lightning.config import one_line_errors
from lightning_nvcomp.options import Codec, DeltaOptions, Durability, SaveOptions
from lightning_nvcomp.saving.writer import CheckpointWriter
from lightning_nvcomp.storage import storage_for
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.telemetry import savings as telemetry


class NvcompCheckpointIO(CheckpointIO):
    """Writes Lightning checkpoints compressed on the GPU with nvCOMP (or on the CPU with zstd), atomically.

    The files are ``torch.save`` zips: ``fit(ckpt_path=...)``, ``load_from_checkpoint``, LightningCLI
    ``--ckpt_path`` and plain ``torch.load`` all read them once ``lightning_nvcomp`` is imported.

    Args:
        codec: ``"auto"`` (default: the measured fastest save, see :mod:`lightning_nvcomp.auto.policy`), ``"ans"``,
            ``"zstd"`` or ``"none"`` (a :class:`~lightning_nvcomp.options.Codec` or its name).
        async_save: if True, training waits only until the compressed snapshot is in host memory; the file is
            written on a background thread. A later save, ``remove_checkpoint`` and ``teardown`` wait for it, and a
            failed background write is raised there.
        staging_mb: MiB coded at once (default: 256 on a GPU, 16 MiB pieces in parallel on the CPU); the GPU memory
            a save borrows is about three times this, never a clone of the whole state.
        gpu_hour_usd: price of a GPU-hour in USD, for the saved-dollars metric.
        probe_mb: largest size in MiB of the write-bandwidth probe run once per file system (default 256; it sets the
            baseline that savings are measured against, and feeds ``auto``).
        interval_s: seconds between saves, used by ``auto`` in async mode.
        remote: how checkpoints at URLs are reached (:class:`~lightning_nvcomp.storage.remote.RemoteOptions`: fsspec
            storage options, upload part size, parallelism); default: the backend's own configuration and
            environment, as Lightning's ``get_filesystem`` uses.
        durable: when a checkpoint is on stable storage (:class:`~lightning_nvcomp.options.Durability`):
            ``"background"`` (default: flushed behind training, a file that replaces one of the same name before
            its rename; top-k pruning deletes an older checkpoint only once every newer save is durable), ``"sync"``
            (before the save returns; for async saves, before the background write is done) or ``"os"`` (never
            flushed, as ``TorchCheckpointIO``). With each, a sync save's file is in place, readable by any process
            (a logger that uploads it, a copy), when ``save_checkpoint`` returns.
        host_buffer_mb: async saves: most MiB of compressed snapshots held in host memory while earlier ones are
            written (default: two checkpoints); a save past it waits, with a warning.
        delta: store each checkpoint as a delta against an earlier one where that codes smaller
            (:class:`~lightning_nvcomp.options.DeltaOptions`; default: none). ``remove_checkpoint`` (top-k pruning)
            keeps every file a kept checkpoint needs, and deletes it once none does.
        options: all of the above in one :class:`~lightning_nvcomp.options.SaveOptions` (a config's
            ``init_args: {options: {codec: zstd}}``); a keyword argument given beside it overrides its field.

    Raises: as :class:`~lightning_nvcomp.options.SaveOptions`, at once: ValueError for an unknown codec or a size that
    is not a positive number of MiB, CodecUnavailableError for a codec that cannot run here (``ans`` without a GPU and
    nvCOMP). Made by a LightningCLI config (jsonargparse), the same error ends the command with one line on stderr,
    exit status 2 (see :mod:`.config`). Each save's summary line is written above the progress bar when one is shown
    (the savings callback sets where it goes).

    ``load_checkpoint`` (a Trainer's resume) puts compressed tensors saved from a GPU back on this process's GPU,
    decoded there, where the model and optimizer adopt them; pass ``map_location`` to choose otherwise.

    Remote storage: a URL path (``Trainer(default_root_dir="s3://bucket/run")``, a
    ``ModelCheckpoint(dirpath="gs://...")``, ``ckpt_path="s3://..."``) is written, read and removed through fsspec
    (see :mod:`lightning_nvcomp.storage.remote` for each backend's durability: on S3 a checkpoint is a multipart upload
    that becomes the object only once complete). A URL whose fsspec implementation is missing is refused naming the
    extra to install, when ``fit`` sets up (the savings callback checks the Trainer's checkpoint directories),
    before anything is written.
    """

    def __init__(
        self,
        codec: Codec | str | None = None,
        async_save: bool | None = None,
        staging_mb: float | None = None,
        gpu_hour_usd: float | None = None,
        probe_mb: float | None = None,
        interval_s: float | None = None,
        remote: RemoteOptions | None = None,
        durable: Durability | str | None = None,
        host_buffer_mb: float | None = None,
        delta: DeltaOptions | None = None,
        *,
        options: SaveOptions | None = None,
    ) -> None:
        options = SaveOptions.merged(
            type(self).__name__,
            options,
            codec=codec,
            async_save=async_save,
            staging_mb=staging_mb,
            gpu_hour_usd=gpu_hour_usd,
            probe_mb=probe_mb,
            interval_s=interval_s,
            remote=remote,
            durable=durable,
            host_buffer_mb=host_buffer_mb,
            delta=delta,
        )
        self.writer = CheckpointWriter(options, report=self._report)
        self.logger_attached = False
        #: Where each save's summary line goes (the savings callback sets it: around the progress bar); None:
        #: Lightning's rank-zero info log.
        self.console: Callable[[str], None] | None = None

    @property
    def savings(self) -> telemetry.Savings:
        return self.writer.savings

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options (give it remote=RemoteOptions(...))")
        self.writer.raise_failures()  # a background failure surfaces here, at the next save
        self.writer.save(checkpoint, path)
        self.writer.commit(int(checkpoint.get("global_step", 0)), os.fspath(path))

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        self.writer.wait(os.fspath(path))
        # Lightning passes no map_location: GPU-saved state comes back decoded on this process's GPU, where the
        # model and optimizer take it without another copy (TorchCheckpointIO would return it on the CPU).
        # weights_only=None is Lightning's "torch's default", which is True since torch 2.6.
        safe = True if weights_only is None else weights_only
        storage = self.writer.storage_for(path)
        return fileformat.load(path, map_location=map_location, weights_only=safe, keep_on_gpu=True, storage=storage)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self.writer.discard(path)  # after the saves still being written, and only if they succeed

    def teardown(self) -> None:
        self.writer.close()

    def wait(self) -> None:
        """Wait for the background save, if any; raise its failure here."""
        self.writer.wait()

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """Metrics of the saves finished since the last call (for the savings callback)."""
        return self.writer.drain_metrics()

    def _report(self, line: str) -> None:
        (self.console or rank_zero_info)(line)
        if not self.logger_attached and len(self.savings.history) == 1:
            rank_zero_warn(
                "lightning_nvcomp: no savings callback is attached to this run, so the savings metrics reach no "
                "logger (only this console). With a Trainer it is installed automatically when lightning-nvcomp is "
                "pip-installed; otherwise add lightning_nvcomp.NvcompSavings() to the callbacks."
            )


def _register_with_pytorch_lightning() -> None:
    try:
        from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as StandaloneCheckpointIO
    except ImportError:
        return
    StandaloneCheckpointIO.register(NvcompCheckpointIO)


_register_with_pytorch_lightning()
one_line_errors(NvcompCheckpointIO)


def gpu_state_nbytes(module: Any, optimizers: list[Any], device_type: str = "cuda") -> int:
    """Bytes of this rank's tensors on ``device_type`` that a checkpoint of ``module`` and ``optimizers`` holds: the
    parameters and buffers (each once, as the module lists them) and the optimizer state (a DTensor's local shard)."""
    tree = {
        "params": list(module.parameters()),
        "buffers": list(module.buffers()),
        "optim": [o.state for o in optimizers],
    }
    return sum(t.numel() * t.element_size() for _, t in local_tensors_named(tree) if t.device.type == device_type)


class SavingsLogging:
    """Logs the checkpoint savings of an :class:`NvcompCheckpointIO` (and of a compressed sharded strategy,
    :class:`~lightning_nvcomp.NvcompFSDPStrategy` or :class:`~lightning_nvcomp.NvcompModelParallelStrategy`) to
    the Trainer's loggers (TensorBoard, W&B, CSV, MLflow...) at each checkpoint's global step. Idle when the Trainer
    uses neither.

    At setup it also resolves the storage of every directory where the Trainer's checkpoints go with our checkpoint
    IO (``default_root_dir``, the first logger's ``save_dir``, a ``ModelCheckpoint``'s ``dirpath``), so that a URL
    whose fsspec implementation is missing (or a ``pathlib`` path made from a URL) fails naming it before anything
    is written. After the first training batch (the optimizer state exists by then) it starts pinning, on a thread
    of its own, the host memory the first save will copy the GPU state's coded bytes into (for async saves as much
    as that state's bytes, for streamed sync saves two slabs; within
    :class:`~lightning_nvcomp.codec.pinned.PinnedPool`'s limit), so the first save does not wait for it. At the fit's
    last step (``max_steps``) or the last batch of its last epoch (``max_epochs``), before the checkpoints of that
    point are saved, it tells ``auto`` that the run ends after them (:attr:`~lightning_nvcomp.auto.policy.CodecPolicy.run_ending`):
    the fit waits for their writes. And at the fit's start it tells ``auto`` to count the interval to the first save
    from there (:meth:`~lightning_nvcomp.auto.policy.CodecPolicy.run_started`), and gives the checkpoint IO the
    Trainer's optimizers, whose steps it times while writes run behind training
    (:class:`~lightning_nvcomp.auto.steps.StepTimer`: a hook on each, removed by the IO's ``teardown``)."""

    def __init__(self) -> None:
        self.sources: list[Any] = []
        self._pinned_ahead = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from lightning_nvcomp.integrations.lightning.sharded import CompressedShardedSaves

        io = trainer.strategy.checkpoint_io
        while not isinstance(io, NvcompCheckpointIO) and getattr(io, "checkpoint_io", None) is not None:
            io = io.checkpoint_io  # unwrap Lightning's wrapping IOs
        self.sources = [
            s for s in (io, trainer.strategy) if isinstance(s, (NvcompCheckpointIO, CompressedShardedSaves))
        ]
        if self.sources:
            remote = io.writer.options.remote if isinstance(io, NvcompCheckpointIO) else None
            for directory in _checkpoint_dirs(trainer):
                storage_for(directory, remote)
        for source in self.sources:
            source.logger_attached = True
            source.console = _console(trainer)
            source.savings.world_size = trainer.world_size
        self._policies_ending(False)

    def _policies_ending(self, ending: bool) -> None:
        for source in self.sources:
            if isinstance(source, NvcompCheckpointIO):  # sharded saves are synchronous: they wait for their writes
                source.writer.policy.run_ending = ending

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        for source in self.sources:
            if isinstance(source, NvcompCheckpointIO):
                source.writer.policy.run_started()
                source.writer.steps.watch(trainer.optimizers)  # hooks until the IO's teardown

    def _flush(self, trainer: Any) -> None:
        for source in self.sources:
            for step, metrics in source.drain_metrics():
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=step)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if not self._pinned_ahead:
            self._pinned_ahead = True
            if self.sources and torch.cuda.is_available():
                self._pin_ahead(trainer)
        self._flush(trainer)
        self._policies_ending(_fit_ends_here(trainer))

    def _pin_ahead(self, trainer: Any) -> None:
        """Start pinning what the first save will copy into: an async save holds its whole coded snapshot in the
        pool (as much as the GPU state, at most); a sync save (and a sharded one) streams, so two slabs."""
        state = gpu_state_nbytes(trainer.lightning_module, trainer.optimizers)
        held = any(isinstance(s, NvcompCheckpointIO) and s.writer.options.async_save for s in self.sources)
        pinned.pool().reserve(state if held else min(state, 2 * pinned.SLAB_NBYTES))

    def on_train_epoch_end(self, trainer: Any, *args: Any) -> None:
        self._flush(trainer)
        self._policies_ending(_fit_ends_here(trainer))

    def on_validation_end(self, trainer: Any, *args: Any) -> None:
        self._flush(trainer)
        self._policies_ending(_fit_ends_here(trainer))

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        self._policies_ending(True)  # ModelCheckpoint's save_last may still save, after this

    def on_fit_end(self, trainer: Any, *args: Any) -> None:
        for source in self.sources:
            source.wait()  # the last background save's metrics
        self._flush(trainer)


def _fit_ends_here(trainer: Any) -> bool:
    """Whether the fit ends after the checkpoints saved at this point: its last optimizer step, or the last batch of
    its last epoch (Lightning's checkpoint callbacks run after ours, so they save after this is known)."""
    if trainer.sanity_checking:
        return False
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return True
    last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
    return last_epoch and bool(trainer.is_last_batch)


def _console(trainer: Any) -> Callable[[str], None]:
    """Where a save's summary line goes during ``fit``: with a progress bar shown, written around it as
    ``LightningModule.print`` does (``tqdm.write`` clears tqdm's bars, writes the line on a line of its own and draws
    them again, also from the async writer thread and after the bar closed; Rich's live display takes stdout too),
    else Lightning's rank-zero info log."""

    def show(line: str) -> None:
        bar = trainer.progress_bar_callback
        if bar is not None and bar.is_enabled and trainer.is_global_zero:
            tqdm.write(line)
        else:
            rank_zero_info(line)

    return show


def _checkpoint_dirs(trainer: Any) -> list[Any]:
    """Where the Trainer's ``ModelCheckpoint`` callbacks will save, as ``ModelCheckpoint.setup`` resolves it (the
    callback's ``dirpath``, else under the first logger's ``save_dir``, else under ``default_root_dir``), without
    asking a logger for its version (which may list the remote directory)."""
    dirs = []
    for callback in getattr(trainer, "checkpoint_callbacks", []):
        try:
            dirpath = getattr(callback, "dirpath", None)
            if dirpath is None:
                loggers = trainer.loggers
                dirpath = (loggers[0].save_dir if loggers else None) or trainer.default_root_dir
        except Exception:  # a logger that cannot say: save_checkpoint still checks each path
            continue
        if dirpath is not None:
            dirs.append(dirpath)
    return dirs


def _callback_class(base: type) -> type:
    return type("NvcompSavings", (SavingsLogging, base), {"__doc__": SavingsLogging.__doc__, "__module__": __name__})


NvcompSavings = _callback_class(_Callback)


def lightning_callbacks() -> list:
    """Entry point ``lightning.pytorch.callbacks_factory``: the savings callback for every Trainer."""
    return [NvcompSavings()]


def pytorch_lightning_callbacks() -> list:
    """Entry point ``pytorch_lightning.callbacks_factory``."""
    from pytorch_lightning import Callback

    return [_callback_class(Callback)()]
