"""Lightning integration: a ``CheckpointIO`` that writes compressed checkpoints, and the callback that logs savings.

``NvcompCheckpointIO`` derives from ``lightning.fabric``'s ``CheckpointIO`` and is registered as a virtual subclass
of ``lightning_fabric``'s, so the same object plugs into ``lightning.pytorch`` and ``pytorch_lightning`` Trainers
and Fabric. The savings callback is installed in every Trainer through Lightning's ``callbacks_factory`` entry
points (see pyproject.toml) and stays idle unless the Trainer's checkpoint IO is ours.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_nvcomp import container, telemetry
from lightning_nvcomp.policy import CodecPolicy
from lightning_nvcomp.storage import Storage


class NvcompCheckpointIO(CheckpointIO):
    """Writes Lightning checkpoints compressed on the GPU with nvCOMP (or on the CPU with zstd), atomically.

    The files are ``torch.save`` zips: ``fit(ckpt_path=...)``, ``load_from_checkpoint``, LightningCLI
    ``--ckpt_path`` and plain ``torch.load`` all read them once ``lightning_nvcomp`` is imported.

    Args:
        codec: ``"auto"`` (measured fastest save, see :mod:`lightning_nvcomp.policy`), ``"ans"``, ``"zstd"`` or
            ``"none"``.
        async_save: if True, training waits only until the compressed snapshot is in host memory; the file is
            written on a background thread. A later save, ``remove_checkpoint`` and ``teardown`` wait for it, and a
            failed background write is raised there.
        staging_mb: GPU memory a save borrows is about three times this (records and segments are coded in
            pieces of this size); never a clone of the whole state.
        gpu_hour_usd: price of a GPU-hour, for the saved-dollars metric.
        probe_mb: size of the write-bandwidth probe run once per checkpoint directory (it sets the baseline that
            savings are measured against, and feeds ``auto``).
        interval_s: seconds between saves, used by ``auto`` in async mode.
    """

    def __init__(
        self,
        codec: str = "auto",
        async_save: bool = False,
        staging_mb: int = 256,
        gpu_hour_usd: float | None = None,
        probe_mb: int = 256,
        interval_s: float | None = None,
    ) -> None:
        if codec not in container.SAVE_CODECS:
            raise ValueError(f"codec must be one of {container.SAVE_CODECS}, not {codec!r}")
        if staging_mb <= 0 or probe_mb <= 0:
            raise ValueError(f"staging_mb ({staging_mb}) and probe_mb ({probe_mb}) must be positive")
        self.codec, self.async_save = codec, async_save
        self.staging_nbytes = staging_mb << 20
        self.policy = CodecPolicy("async" if async_save else "sync", interval_s, probe_mb << 20)
        self.storage = Storage()
        self.savings = telemetry.Savings(gpu_hour_usd)
        #: Metrics of finished saves waiting for the savings callback: (global step, metrics).
        self.pending_metrics: list[tuple[int, dict[str, float]]] = []
        self.logger_attached = False
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: tuple[str, Future] | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        self.wait()
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        step = int(checkpoint.get("global_step", 0))
        if not self.async_save:  # compression hides behind the write: segments are written as they are coded
            stats = container.save(checkpoint, path, self.codec, policy=self.policy, storage=self.storage,
                                   staging_nbytes=self.staging_nbytes)
            self._record(path, stats, stats.seconds, step)
            return
        begin = time.perf_counter()
        tensors = container._find_tensors(checkpoint)
        codec, prediction = container.resolve_codec(self.codec, tensors, directory, self.policy)
        snap = container.snapshot(checkpoint, codec, tensors, isolate=True, staging_nbytes=self.staging_nbytes)
        blocked = time.perf_counter() - begin
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-nvcomp-save")
        self._inflight = (path, self._executor.submit(self._write, snap, path, prediction, blocked, step))

    def _write(self, snap: container.Snapshot, path: str, prediction, blocked: float, step: int) -> None:
        stats = snap.write(path, self.storage, prediction)
        self.policy.observe_write(os.path.dirname(os.path.abspath(path)), stats.file_nbytes, stats.write_s)
        self._record(path, stats, blocked, step)

    def _record(self, path: str, stats: container.SaveStats, blocked: float, step: int) -> None:
        metrics = self.savings.add(stats, blocked, self.policy.write_gbps(os.path.dirname(os.path.abspath(path))))
        with self._lock:
            self.pending_metrics.append((step, metrics))
        rank_zero_info(telemetry.summary(path, stats, metrics))
        if not self.logger_attached and len(self.savings.history) == 1:
            rank_zero_warn(
                "lightning_nvcomp: no savings callback is attached to this run, so the savings metrics reach no "
                "logger (only this console). With a Trainer it is installed automatically when lightning-nvcomp is "
                "pip-installed; otherwise add lightning_nvcomp.NvcompSavings() to the callbacks."
            )

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        self.wait(os.fspath(path))
        return container.load(path, map_location=map_location or "cpu", weights_only=weights_only)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self.wait(os.fspath(path))
        if os.path.exists(path):
            os.remove(path)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def drain_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """Metrics of the saves finished since the last call (for the savings callback)."""
        with self._lock:
            drained, self.pending_metrics = self.pending_metrics, []
        return drained

    def wait(self, path: str | None = None) -> None:
        """Wait for the background save (only if it writes ``path``, when given); raise its failure here."""
        inflight = self._inflight
        if inflight is None or (path is not None and os.path.abspath(inflight[0]) != os.path.abspath(path)):
            return
        self._inflight = None
        try:
            inflight[1].result()
        except BaseException as err:
            raise RuntimeError(f"lightning_nvcomp: the background save of {inflight[0]} failed: {err}") from err


def _register_with_pytorch_lightning() -> None:
    try:
        from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as StandaloneCheckpointIO
    except ImportError:
        return
    StandaloneCheckpointIO.register(NvcompCheckpointIO)


_register_with_pytorch_lightning()


class SavingsLogging:
    """Logs the checkpoint savings of an :class:`NvcompCheckpointIO` to the Trainer's loggers (TensorBoard, W&B,
    CSV, MLflow...) at each checkpoint's global step. Idle when the Trainer uses another checkpoint IO."""

    def __init__(self) -> None:
        self.plugin: NvcompCheckpointIO | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        while not isinstance(io, NvcompCheckpointIO) and getattr(io, "checkpoint_io", None) is not None:
            io = io.checkpoint_io  # unwrap Lightning's wrapping IOs
        if isinstance(io, NvcompCheckpointIO):
            self.plugin = io
            io.logger_attached = True
            io.savings.world_size = trainer.world_size

    def _flush(self, trainer: Any) -> None:
        if self.plugin is None:
            return
        for step, metrics in self.plugin.drain_metrics():
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self._flush(trainer)

    def on_train_epoch_end(self, trainer: Any, *args: Any) -> None:
        self._flush(trainer)

    def on_validation_end(self, trainer: Any, *args: Any) -> None:
        self._flush(trainer)

    def on_fit_end(self, trainer: Any, *args: Any) -> None:
        if self.plugin is not None:
            self.plugin.wait()  # the last background save's metrics
        self._flush(trainer)


def _callback_class(base: type) -> type:
    return type("NvcompSavings", (SavingsLogging, base), {"__doc__": SavingsLogging.__doc__, "__module__": __name__})


from lightning.pytorch import Callback as _Callback  # noqa: E402

NvcompSavings = _callback_class(_Callback)


def lightning_callbacks() -> list:
    """Entry point ``lightning.pytorch.callbacks_factory``: the savings callback for every Trainer."""
    return [NvcompSavings()]


def pytorch_lightning_callbacks() -> list:
    """Entry point ``pytorch_lightning.callbacks_factory``."""
    from pytorch_lightning import Callback

    return [_callback_class(Callback)()]
