"""Read after write (issue 32, part A): when a save that is not async returns, its file is under its final name,
complete, for any process, whatever the durability; one durable checkpoint always exists; loads through our IO wait
for their file.

Real files, other processes, a real Trainer, real Accelerate, and the loggers' real local back-ends: W&B in offline
mode and MLflow with a local file store, both uploading every checkpoint (``log_model="all"``) right after its save.
The disk is made slow to flush where a test needs the flush to be still running: every ``os.fsync`` on the
checkpoint writer thread waits for the test to release it (the real fsync runs then).
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_nvcomp import NvcompCheckpointIO
from lightning_nvcomp.integrations.accelerate.attach import attach
from lightning_nvcomp.storage import ThrottledStorage

from tests.helpers import accelerate_runs as R
from tests.helpers.lightning_models import TinyData, TinyModule, quiet_trainer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.states import assert_tree_bit_exact
from tests.helpers.wandb_run import wandb_records
from tests.safety.test_paths import hold_writer_thread_fsyncs


def state(seed: int, n: int = 4096) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=gen), "global_step": seed}


def read_in_another_process(path: str, cwd: Path) -> int:
    """The ``global_step`` that a fresh interpreter, started in ``cwd``, reads from ``path`` with ``torch.load``."""
    code = "import sys, torch, lightning_nvcomp; print(torch.load(sys.argv[1], weights_only=True)['global_step'])"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, path], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip())


@pytest.mark.parametrize("durable", ["background", "sync", "os"])
def test_a_save_is_readable_by_any_process_when_it_returns(tmp_path, monkeypatch, durable):
    monkeypatch.chdir(tmp_path)
    io = NvcompCheckpointIO(codec="zstd", probe_mb=4, durable=durable)
    io.save_checkpoint(state(1), "out/first.ckpt")  # the one-off probe and baseline here, before the disk is held
    io.wait()
    release = hold_writer_thread_fsyncs(monkeypatch)
    try:
        io.save_checkpoint(state(2), "out/final.ckpt")
        assert read_in_another_process("out/final.ckpt", tmp_path) == 2  # today (background): FileNotFoundError
        shutil.copy("out/final.ckpt", "copy.ckpt")
        assert_tree_bit_exact(torch.load("copy.ckpt", weights_only=True), state(2))
        assert bool(io.writer.pending()) == (durable == "background")  # its flush is still held on the writer thread
    finally:
        release.set()
    io.teardown()
    metrics = io.savings.history[-1]
    if durable == "os":
        assert "nvcomp/durable_s" not in metrics  # never known durable
    elif durable == "background":  # measured: until the held flush was done, well after the save returned
        assert metrics["nvcomp/durable_s"] > metrics["nvcomp/blocked_s"]
    else:
        assert 0 < metrics["nvcomp/durable_s"] <= metrics["nvcomp/blocked_s"]


class Events:
    """Records, in order, each ``os.fsync`` (the file's name then) and ``os.replace`` (its target) with the thread
    that made it; the real calls run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, str, str]] = []
        fsync, replace = os.fsync, os.replace

        def on_fsync(fd: int) -> None:
            fsync(fd)
            self.seen.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), _thread()))

        def on_replace(src, dst, *args, **kwargs) -> None:
            replace(src, dst, *args, **kwargs)
            self.seen.append(("replace", os.path.basename(os.fsdecode(dst)), _thread()))

        monkeypatch.setattr(os, "fsync", on_fsync)
        monkeypatch.setattr(os, "replace", on_replace)

    def index(self, kind: str, name: str, start: int = 0) -> int:
        return next(i for i, (k, n, _) in enumerate(self.seen) if i >= start and k == kind and n == name)


def _thread() -> str:
    return "writer" if threading.current_thread().name.startswith("lightning-nvcomp-write") else "caller"


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="the spy names files through /proc")
def test_a_replacement_is_in_place_at_once_and_was_durable_before_its_rename(tmp_path, monkeypatch):
    """``background`` durability, ``last.ckpt`` saved twice: the new name is renamed into place at once and flushed
    behind; the replacement waits for that flush, then is flushed before its rename, so that the name holds one
    durable file or the other at every moment."""
    path = tmp_path / "last.ckpt"
    io = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    io.save_checkpoint(state(0), tmp_path / "probe.ckpt")
    io.wait()
    release = hold_writer_thread_fsyncs(monkeypatch)
    events = Events(monkeypatch)
    io.save_checkpoint(state(1), path)
    assert_tree_bit_exact(torch.load(path, weights_only=True), state(1))  # in place, its flush held
    second = threading.Thread(target=io.save_checkpoint, args=(state(2), path))
    second.start()
    time.sleep(0.3)  # the replacement now waits for the first file's flush
    release.set()
    second.join(60)
    assert_tree_bit_exact(torch.load(path, weights_only=True), state(2))  # today: state 1, the old file
    io.teardown()

    first_rename = events.index("replace", "last.ckpt")
    first_flush = events.index("fsync", "last.ckpt")
    assert first_rename < first_flush and events.seen[first_flush][2] == "writer"  # a new name: flushed behind
    second_rename = events.index("replace", "last.ckpt", first_rename + 1)
    flushed_first = [i for i, (k, n, t) in enumerate(events.seen) if k == "fsync" and n.startswith(".last.ckpt.lnv-")]
    assert flushed_first and flushed_first[-1] < second_rename  # the replacement was on the disk before its rename
    assert events.seen[flushed_first[-1]][2] == "caller"  # ... flushed in the save (its directory: behind)
    assert first_flush < second_rename  # ... and the file it replaced had been flushed too


def test_trainer_save_checkpoint_is_readable_when_it_returns(tmp_path, monkeypatch):
    """``trainer.save_checkpoint("out/final.ckpt")`` with the defaults (sync save, ``background`` durability), then
    what users do next: ``torch.load``, a copy, another process."""
    monkeypatch.chdir(tmp_path)
    io = NvcompCheckpointIO(codec="zstd", probe_mb=4)
    trainer = quiet_trainer(".", plugins=[io], max_epochs=1)
    module = TinyModule()
    trainer.fit(module, datamodule=TinyData())
    release = hold_writer_thread_fsyncs(monkeypatch)
    try:
        trainer.save_checkpoint("out/final.ckpt")
        loaded = torch.load("out/final.ckpt", weights_only=True)  # today: FileNotFoundError
        assert_tree_bit_exact(loaded["state_dict"], module.state_dict())
        shutil.copy("out/final.ckpt", "copy.ckpt")
        assert read_in_another_process("copy.ckpt", tmp_path) == loaded["global_step"] > 0
    finally:
        release.set()
    io.teardown()


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_accelerate_save_state_files_are_readable_and_load_state_waits(tmp_path, monkeypatch, async_save):
    """A sync ``save_state``: every file is readable when it returns (another rank reads them next); an async one's
    ``load_state`` waits for its files."""
    monkeypatch.chdir(tmp_path)
    run = R.build(seed=0)
    R.train(run, 2)
    attachment = attach(run.accelerator, codec="zstd", probe_mb=4, async_save=async_save)
    attachment.writer.storage = ThrottledStorage(4e6)  # the async write takes a while
    expected = {k: R.tree_digest(v) for k, v in R.states(run).items()}
    release = hold_writer_thread_fsyncs(monkeypatch)
    try:
        run.accelerator.save_state("ck")
        if not async_save:  # today: the files appear only once flushed
            for name in ("pytorch_model.bin", "optimizer.bin", "custom_checkpoint_0.pkl"):
                torch.load(Path("ck") / name, weights_only=True)
    finally:
        release.set()
    R.train(run, 2)
    run.accelerator.load_state("ck")
    assert {k: R.tree_digest(v) for k, v in R.states(run).items()} == expected
    attachment.detach()


def test_the_plugin_load_waits_for_its_async_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    io = NvcompCheckpointIO(codec="none", probe_mb=4, async_save=True)
    io.writer.storage = ThrottledStorage(4e6)  # ~1 MB: the background write takes ~0.25 s
    io.save_checkpoint(state(7, 1 << 18), "model.ckpt")
    assert_tree_bit_exact(io.load_checkpoint(Path("model.ckpt")), state(7, 1 << 18))
    io.teardown()


# -- loggers that upload each checkpoint right after its save -------------------------------------------------------


EXPECTED_UPLOADS = [
    ("epoch=0-step=4.ckpt", 4),
    ("last.ckpt", 4),
    ("epoch=1-step=8.ckpt", 8),
    ("last.ckpt", 8),
    ("epoch=2-step=12.ckpt", 12),
    ("last.ckpt", 12),
]


def fit_with_logger(root: Path, logger) -> Path:
    """A 3-epoch fit with the default plugin, saving every epoch and ``last.ckpt`` (a replacement each time)."""
    every_epoch = ModelCheckpoint(dirpath=root / "ckpts", filename="{epoch}-{step}", save_top_k=-1, save_last=True)
    trainer = quiet_trainer(
        root,
        plugins=[NvcompCheckpointIO(codec="zstd", probe_mb=4)],
        logger=logger,
        callbacks=[every_epoch],
        max_epochs=3,
    )
    trainer.fit(TinyModule(), datamodule=TinyData())
    return root / "ckpts"


def test_wandb_offline_logs_every_checkpoint_as_saved(tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    for key, value in dict(
        WANDB_MODE="offline",  # WandbLogger(offline=True) refuses log_model: offline mode through the environment
        WANDB_DIR=str(tmp_path),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),  # where artifact files are staged
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
    ).items():
        monkeypatch.setenv(key, value)
    logger = WandbLogger(save_dir=str(tmp_path), project="nvcomp-test", log_model="all")
    try:
        fit_with_logger(tmp_path, logger)
    finally:
        logger.experiment.finish()
        wandb.teardown()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    uploads = []
    for artifact in wandb_records(Path(run_file), "artifact"):
        (entry,) = artifact.manifest.contents
        staged = Path(entry.local_path)  # W&B's copy of the file, taken when the logger added it
        assert base64.b64encode(hashlib.md5(staged.read_bytes()).digest()).decode() == entry.digest
        name = json.loads(artifact.metadata)["original_filename"]
        uploads.append((name, torch.load(staged, weights_only=True)["global_step"]))
    assert uploads == EXPECTED_UPLOADS  # today: the newest checkpoints missing, last.ckpt uploaded stale


def test_mlflow_file_store_logs_every_checkpoint_as_saved(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    monkeypatch.chdir(tmp_path)
    logger = MLFlowLogger(tracking_uri="file:./mlruns", log_model="all")
    ckpts = fit_with_logger(tmp_path, logger)
    artifacts = Path("mlruns") / logger.experiment_id / logger.run_id / "artifacts"
    uploaded = {p.name: p for p in artifacts.glob("*/*.ckpt")}
    saved = {p.name: p for p in ckpts.glob("*.ckpt")}
    assert sorted(uploaded) == sorted(saved) == sorted({name for name, _ in EXPECTED_UPLOADS})  # today: fewer
    for name, path in saved.items():
        assert uploaded[name].read_bytes() == path.read_bytes(), name  # today: last.ckpt of an earlier epoch
